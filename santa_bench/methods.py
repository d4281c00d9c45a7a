"""The method registry: every attention method, one entry each, used by every runner.

An entry carries its name, family, parameters (defaults and validation), the exact
PyTorch reference, an optional fast path (``prepare``: a Triton kernel or a dense
baseline, set up outside the timed region), availability with a reason, and its byte
model. Method specs on the command line read
``name`` or ``name:key=value,key=value`` (e.g. ``santa-prop:S=128,tile=64``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

import santa_kernels as sk
from santa_bench import baselines, kernel_adapters
from santa_kernels.reads import ReadCounts
from santa_kernels.santapp import santapp as _santapp_reference

FAMILIES = ("dense", "baseline", "santa", "santapp", "bernoulli", "oracle")


class MethodError(ValueError):
    """An unknown method, parameter or invalid parameter value."""


@dataclass(frozen=True)
class Param:
    """One method parameter: default, type, and the values it accepts."""

    name: str
    default: Any
    kind: type
    help: str
    choices: tuple[Any, ...] | None = None
    minimum: int | None = None
    # left out of a case at its default: a parameter added after results were stored
    # keeps those cases' config hashes (the resume key) unchanged
    omit_default: bool = False

    def validate(self, value: Any, method: str) -> Any:
        """Returns ``value`` converted to the parameter's type, or raises MethodError."""
        try:
            converted = self.kind(value) if not isinstance(value, self.kind) else value
        except (TypeError, ValueError):
            raise MethodError(
                f"{method}: parameter {self.name} expects {self.kind.__name__}, got {value!r}"
            ) from None
        if self.kind is int and isinstance(value, float) and value != int(value):
            raise MethodError(f"{method}: parameter {self.name} must be an integer, got {value!r}")
        if self.choices is not None and converted not in self.choices:
            raise MethodError(
                f"{method}: parameter {self.name} must be one of {list(self.choices)}, "
                f"got {value!r}"
            )
        if self.minimum is not None and converted < self.minimum:
            raise MethodError(
                f"{method}: parameter {self.name} must be >= {self.minimum}, got {value!r}"
            )
        return converted


def _always() -> tuple[bool, str]:
    return True, ""


@dataclass(frozen=True)
class Method:
    """One attention method of the registry."""

    name: str
    family: str
    description: str
    params: tuple[Param, ...] = ()
    reference: Callable[..., sk.AttentionOutput] | None = None
    prepare: Callable[..., Any] | None = None  # fast path: prepare(q, kv, *, seed, **params)
    kernel_kind: str = "reference"  # what `prepare` runs: "triton" or "baseline"
    availability: Callable[[], tuple[bool, str]] = _always
    kernel_availability: Callable[[], tuple[bool, str]] = _always
    has_stash: bool = False  # the kernel writes and re-reads a per-(head, token) logit stash
    tags: tuple[str, ...] = field(default_factory=tuple)

    def resolve_params(self, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """Returns every parameter with defaults filled and ``overrides`` validated."""
        overrides = dict(overrides or {})
        known = {p.name: p for p in self.params}
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            raise MethodError(
                f"{self.name}: unknown parameter(s) {unknown}; accepted: {sorted(known) or 'none'}"
            )
        resolved = {
            name: p.validate(overrides[name], self.name) if name in overrides else p.default
            for name, p in known.items()
        }
        return {name: value for name, value in resolved.items()
                if not (known[name].omit_default and value == known[name].default)}

    def available(self) -> tuple[bool, str]:
        """Returns ``(True, "")`` or ``(False, reason)`` for this machine."""
        try:
            return self.availability()
        except Exception as exc:  # an optional dependency failing to probe
            return False, f"availability check failed: {exc}"

    def kernel_available(self) -> tuple[bool, str]:
        """Returns whether the fast path (``prepare``) can run here, with the reason if not."""
        if self.prepare is None:
            return False, f"{self.name}: no fast kernel (reference only)"
        try:
            return self.kernel_availability()
        except Exception as exc:
            return False, f"kernel availability check failed: {exc}"

    def run_reference(
        self, q: torch.Tensor, kv: sk.KVCache, params: dict[str, Any], **kw: Any
    ) -> sk.AttentionOutput:
        """Runs the exact PyTorch reference with resolved ``params``."""
        if self.reference is None:
            raise MethodError(f"{self.name}: has no PyTorch reference")
        return self.reference(q, kv, **params, **kw)

    def bytes_read(
        self, reads: ReadCounts, element_size: int, num_heads: int, params: dict | None = None
    ) -> int:
        """Byte model: K/V bytes the method reads plus its logit-stash traffic (written
        once, read back once; at the ``stash`` dtype, fp32 for the reference)."""
        if not self.has_stash:
            return reads.kv_bytes(element_size)
        stash_dtype = (params or {}).get("stash", "fp32")
        per_score = 4 if stash_dtype == "fp32" else 2
        return reads.kv_bytes(element_size) + 2 * per_score * num_heads * int(reads.context.sum())


# --------------------------------------------------------------- parameters
_S = Param("S", 128, int, "samples per (sequence, query head)", minimum=1)
_TILE = Param("tile", 64, int, "split-KV tile size BN (tokens)", minimum=1)
DEFAULT_TILE = _TILE.default
_MIN_CTX = Param("min_ctx", 0, int, "contexts shorter than this run dense", minimum=0)
_ALLOC = Param(
    "alloc",
    "systematic",
    str,
    "prop tile budgets: global systematic (unbiased) or the "
    "released code's largest remainder (biased)",
    choices=("systematic", "largest-remainder"),
)
_STASH = Param(
    "stash",
    "fp16",
    str,
    "Triton kernel: dtype of the stashed local logits s_i - m_t "
    "(fp32 is exact; fp16 halves the stash traffic, rounding logits by <= 2^-11 relative)",
    choices=("fp32", "fp16", "bf16"),
)
# Bernoulli's kernel composes with the SANTA kernels (their stash); added after Bernoulli
# results were stored, so left out of a case at its default (the stored hashes hold)
_BERNOULLI_STASH = Param("stash", "fp16", str, _STASH.help, choices=_STASH.choices,
                         omit_default=True)
_PASSES = Param(
    "passes",
    1,
    int,
    "santa-flash Triton kernel: 1 = one fused pass; 2 = a counts pass, then a gather pass "
    "(the same samples: triton_santa_flash2)",
    choices=(1, 2),
    omit_default=True,
)
_GATHER = Param(
    "gather",
    "masked",
    str,
    "santa-flash Triton kernel: how V is read. masked = each tile's V block with the "
    "unsampled rows masked off; compact = one pass (passes=1): the sampled rows only, "
    "loaded a tile late (triton_santa_flash_compact); two passes: pass 1 lists the "
    "sampled rows, pass 2 reads only those; inline (passes=2) = the same lists, gathered "
    "by the count program",
    choices=("masked", "compact", "inline"),
    omit_default=True,
)
_PAIRS = Param(
    "pairs",
    "auto",
    str,
    "santa-flash one-pass compact kernel (gather=compact): draw the tiles in pairs, one "
    "exchange between warps for two tiles (the same samples). auto = where the group "
    "allows; on; off = one tile a draw",
    choices=("auto", "on", "off"),
    omit_default=True,
)
_DRAWS = Param("draws", 4, int, "ternary query draws B averaged per head", minimum=1)
_GROUPING = Param(
    "grouping",
    "per-head",
    str,
    "feature mask per query head or once per GQA group (mean group query)",
    choices=("per-head", "mean-group-query"),
)
_VALUE = Param(
    "value_stage",
    "dense",
    str,
    "value stage composed with the Bernoulli scores",
    choices=("dense", "iid", "strat", "sys", "flash", "prop"),
)


# knobs of the fast kernels that the reference does not have
KERNEL_ONLY_PARAMS = ("stash", "passes", "gather", "pairs")


def _reference(value: str) -> Callable[..., sk.AttentionOutput]:
    def run(q: torch.Tensor, kv: sk.KVCache, **params: Any) -> sk.AttentionOutput:
        params = {k: v for k, v in params.items() if k not in KERNEL_ONLY_PARAMS}
        return sk.attention(q, kv, value=value, **params)

    run.__doc__ = f"Reference with value stage {value!r}."
    return run


def _bernoulli_reference(q: torch.Tensor, kv: sk.KVCache, **params: Any) -> sk.AttentionOutput:
    # `value_stage` (not `value`, a result column) picks the value stage
    value = params.pop("value_stage", "dense")
    if value == "dense":
        params = {k: v for k, v in params.items() if k not in ("S", "tile", "alloc")}
    params = {k: v for k, v in params.items() if k not in KERNEL_ONLY_PARAMS}
    return sk.attention(q, kv, score="bernoulli", value=value, **params)


def _santa(
    name: str,
    description: str,
    params: tuple[Param, ...],
    value: str,
    function: str,
    stash: bool = False,
) -> Method:
    return Method(
        name,
        "santa",
        description,
        params,
        reference=_reference(value),
        prepare=kernel_adapters.santa_prepare(function),
        kernel_kind="triton",
        kernel_availability=kernel_adapters.santa_kernel_available,
        has_stash=stash,
    )


def _dense_reference(q: torch.Tensor, kv: sk.KVCache, **_params: Any) -> sk.AttentionOutput:
    return sk.attention(q, kv, value="dense")


def _baseline(entry: baselines.Baseline) -> Method:
    params = tuple(
        Param(name, default, int, f"{entry.name} parameter {name}", minimum=0)
        for name, default in entry.params.items()
    )
    ours = entry.name == "triton-splitkv"

    def available() -> tuple[bool, str]:
        return entry.available("cuda" if torch.cuda.is_available() else "cpu")

    return Method(
        entry.name,
        "baseline",
        entry.description,
        params,
        reference=_dense_reference,
        prepare=kernel_adapters.baseline_prepare(entry.name),
        kernel_kind="triton" if ours else "baseline",
        availability=available,
        kernel_availability=available,
    )


def _builtin_methods() -> list[Method]:
    return [
        Method(
            "dense",
            "dense",
            "exact softmax(qK^T)V (the ground truth)",
            reference=_reference("dense"),
        ),
        _santa(
            "santa-iid",
            "SANTA: S i.i.d. value rows from the softmax",
            (_S, _STASH, _MIN_CTX),
            "iid",
            "santa_iid",
            stash=True,
        ),
        _santa(
            "santa-strat",
            "S2ANTA-strat: one sample per CDF stratum",
            (_S, _STASH, _MIN_CTX),
            "strat",
            "santa_strat",
            stash=True,
        ),
        _santa(
            "santa-sys",
            "S2ANTA-sys: systematic sampling over the global CDF",
            (_S, _STASH, _MIN_CTX),
            "sys",
            "santa_sys",
            stash=True,
        ),
        _santa(
            "santa-flash",
            "S2ANTA-flash: equal tile budgets, mass-weighted merge",
            (_S, _TILE, _PASSES, _GATHER, _PAIRS, _MIN_CTX),
            "flash",
            "santa_flash",
        ),
        _santa(
            "santa-prop",
            "S2ANTA-prop: tile budgets by mass, global systematic (or largest remainder)",
            (_S, _TILE, _ALLOC, _STASH, _MIN_CTX),
            "prop",
            "santa_prop",
            stash=True,
        ),
        Method(
            "bernoulli",
            "bernoulli",
            "Bernoulli qK^T: ternary queries read a subset of K features; any value stage",
            (_DRAWS, _GROUPING, _VALUE, _S, _TILE, _ALLOC, _MIN_CTX, _BERNOULLI_STASH),
            reference=_bernoulli_reference,
            prepare=kernel_adapters.bernoulli_prepare,
            kernel_kind="triton",
            # its query kernel runs wherever the SANTA kernels it composes with do
            kernel_availability=kernel_adapters.santa_kernel_available,
        ),
        Method(
            "santapp",
            "santapp",
            "SANTA++: M teams sampled through representative keys, exact inside, HT ratio",
            (
                Param("M", 32, int, "teams selected per query head", minimum=1),
                Param("team_size", 16, int, "tokens per team (P; k-means: per parent)", minimum=1),
                Param("leaders", 4, int, "k-means: leaders (teams) per parent (R)", minimum=1),
                Param("policy", "contiguous", str, "team index", choices=("contiguous", "kmeans")),
                Param(
                    "scheme",
                    "gumbel-topk",
                    str,
                    "team selection, without or with replacement",
                    choices=("gumbel-topk", "multinomial"),
                ),
                Param("representative", "leader", str, "team key", choices=("leader", "mean")),
                Param("mix", 0.0, float, "defensive mixing with the uniform, in [0, 1)"),
                Param("sink", 0, int, "first tokens attended exactly", minimum=0),
                Param("window", 0, int, "recent tokens attended exactly", minimum=0),
                Param(
                    "reps",
                    "model",
                    str,
                    "representatives stored in the cache dtype, or as int8 codes with a "
                    "per-team scale (half the scoring bytes; phi from the rounded keys, "
                    "still unbiased)",
                    choices=("model", "int8"),
                    omit_default=True,
                ),
                Param(
                    "merge",
                    "auto",
                    str,
                    "kernel only: atomic = the attend programs add their partials into "
                    "per-head sums and the group's last one divides (the sums' order, so "
                    "the output's last bits, vary between GPU runs); kernel = a merge "
                    "kernel (bitwise reproducible); auto = atomic up to 16 (sequence, KV "
                    "head) groups, where it measured faster",
                    choices=("auto", "atomic", "kernel"),
                    omit_default=True,
                ),
            ),
            reference=_santapp_reference,
            prepare=kernel_adapters.santapp_prepare,  # gumbel-topk, mix=0 (else skipped)
            kernel_kind="triton",
            kernel_availability=kernel_adapters.santapp_kernel_available,
        ),
        *(_baseline(entry) for entry in baselines.BASELINES.values()),
    ]


class Registry:
    """Name -> Method, in registration order."""

    def __init__(self, methods: Iterable[Method] = ()) -> None:
        self._methods: dict[str, Method] = {}
        for method in methods:
            self.register(method)

    def register(self, method: Method) -> None:
        if method.family not in FAMILIES:
            raise MethodError(f"{method.name}: unknown family {method.family!r}")
        if method.name in self._methods:
            raise MethodError(f"method {method.name!r} registered twice")
        self._methods[method.name] = method

    def get(self, name: str) -> Method:
        try:
            return self._methods[name]
        except KeyError:
            raise MethodError(
                f"unknown method {name!r}; known: {', '.join(self._methods)}"
            ) from None

    def __iter__(self):
        return iter(self._methods.values())

    def names(self) -> list[str]:
        return list(self._methods)


REGISTRY = Registry(_builtin_methods())


@dataclass(frozen=True)
class MethodSpec:
    """A method with resolved parameters, as named on the command line."""

    method: Method
    params: dict[str, Any]

    @property
    def name(self) -> str:
        return self.method.name

    def label(self) -> str:
        """Returns ``name`` plus the parameters that differ from the defaults."""
        defaults = {p.name: p.default for p in self.method.params}
        changed = [f"{k}={v}" for k, v in self.params.items() if defaults.get(k) != v]
        return self.name + (":" + ",".join(changed) if changed else "")


def _coerce(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_method_specs(
    text: str, registry: Registry = REGISTRY
) -> list[tuple[Method, dict[str, Any]]]:
    """Parses ``"dense,santa-prop:S=128,tile=32,santa-flash"`` into (method, overrides) pairs.

    A ``key=value`` item without a method name belongs to the method before it.
    """
    parsed: list[tuple[Method, dict[str, Any]]] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, colon, rest = item.partition(":")
        if not colon and "=" in item:
            if not parsed:
                raise MethodError(f"parameter {item!r} given before any method name")
            key, _, value = item.partition("=")
            parsed[-1][1][key.strip()] = _coerce(value.strip())
            continue
        overrides: dict[str, Any] = {}
        if colon:
            for assignment in rest.split(";") if ";" in rest else [rest]:
                key, eq, value = assignment.partition("=")
                if not eq:
                    raise MethodError(f"{name}: expected key=value after ':', got {assignment!r}")
                overrides[key.strip()] = _coerce(value.strip())
        parsed.append((registry.get(name.strip()), overrides))
    if not parsed:
        raise MethodError("no method named")
    return parsed
