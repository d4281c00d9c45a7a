"""The registry's types: parameters, methods, the registry, the decorator, spec parsing.

The methods themselves live one family per module beside this one
(:mod:`santa_bench.methods.dense`, ``.santa``, ``.santapp``, ``.bernoulli``,
``.baseline``); each registers its entries with :func:`register` when the package is
imported. See ``docs/adding-a-method.md``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

import santa_kernels as sk
from santa_bench.registration import registering
from santa_kernels.reads import ReadCounts

FAMILIES = ("dense", "baseline", "santa", "santapp", "bernoulli", "oracle", "lsh")


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
    # an open interval (low, high) the value must lie in (e.g. a probability)
    within: tuple[float, float] | None = None
    # left out of a case at its default (at ``absent`` where that is set): a parameter added
    # after results were stored keeps those cases' config hashes (the resume key) unchanged
    omit_default: bool = False
    # what a stored row without this parameter measured, where that differs from today's
    # default (rows stored before the default changed); None: the default itself
    absent: Any = None

    @property
    def omitted(self) -> Any:
        """The value an ``omit_default`` parameter leaves out of a case: what a stored case
        without it measured (``absent``, where the default changed since, else the default),
        so that no stored case changes its hash and no new case takes an old one's."""
        return self.default if self.absent is None else self.absent

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
        if self.within is not None and not self.within[0] < converted < self.within[1]:
            low, high = self.within
            raise MethodError(
                f"{method}: parameter {self.name} must be in ({low:g}, {high:g}), got {value!r}"
            )
        return converted


def _always() -> tuple[bool, str]:
    return True, ""


@dataclass(frozen=True)
class PlotStyle:
    """How `santa-bench plot` draws a method. ``colour``: its fixed colour (None: a stable
    shade of its family's hue); ``marker`` / ``linestyle``: None = its family's."""

    colour: str | None = None
    marker: str | None = None
    linestyle: str | None = None


@dataclass(frozen=True)
class Promise:
    """What a method guarantees of each (sequence, query head) output: the relative error
    of ``quantity`` (``"output"``: the output vector, L2; ``"denominator"``: the softmax
    denominator the method estimates, its reference's ``lse``) is at most ``epsilon`` with
    probability at least ``1 - delta``. `santa-bench accuracy fidelity` checks it."""

    epsilon: float
    delta: float
    quantity: str = "output"


# A decode backend factory: (method, resolved params, softmax scale, seed) -> backend
# (a santa_bench.decode.base.DecodeAttention), built for end-to-end decoding on a GPU.
E2EBackend = Callable[["Method", dict[str, Any], float, int], Any]


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
    # stash_of(resolved params) -> the stash's dtype name ("fp32", "fp16", "bf16") of a
    # call with those params, None where it keeps none; None here: ``has_stash`` decides,
    # at the params' ``stash`` (fp32 when absent)
    stash_of: Callable[[dict[str, Any]], str | None] | None = None
    deterministic: bool = False  # draws no random numbers (an oracle or a fixed selection)
    tags: tuple[str, ...] = field(default_factory=tuple)
    # the module that registered the method (set by :func:`register`)
    module: str = ""
    # end-to-end decode on a GPU: builds the method's kernel backend; None = no kernel
    # (a GPU run of the reference is skipped). CPU decode runs the reference.
    e2e_backend: E2EBackend | None = None
    # reference decode of a method that indexes the prompt once after the prefill
    # (SANTA++'s teams): prefill_index(kv, params, seed) -> index, then
    # indexed_reference(q, kv, index, params, scale=, seed=) -> AttentionOutput
    prefill_index: Callable[..., Any] | None = None
    indexed_reference: Callable[..., sk.AttentionOutput] | None = None
    # reference decode of a method whose randomness lives in its index alone (the indexed
    # reference draws no numbers): joins the sequences' indexes, so that one call per
    # layer and step serves the batch: stack_indexes([index, ...]) -> index
    stack_indexes: Callable[[list[Any]], Any] | None = None
    plot: PlotStyle = PlotStyle()
    # parameters the method no longer takes, (name, why) pairs: rows stored before may
    # still carry them; a spec naming one fails with the reason and what to drop
    retired: tuple[tuple[str, str], ...] = ()
    # promise(resolved params) -> Promise, for a method that guarantees its error
    # (vattention); None = no guarantee
    promise: Callable[[dict[str, Any]], Promise] | None = None

    @property
    def has_e2e_kernel(self) -> bool:
        """True where end-to-end decode has a Triton backend for the method."""
        return self.e2e_backend is not None

    def resolve_params(self, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """Returns every parameter with defaults filled and ``overrides`` validated."""
        overrides = dict(overrides or {})
        retired = dict(self.retired)
        gone = [name for name in overrides if name in retired]
        if gone:
            drop = ", ".join(f"{name}={overrides[name]}" for name in gone)
            raise MethodError(f"{self.name} {retired[gone[0]]}; drop {drop}")
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
                if not (known[name].omit_default and value == known[name].omitted)}

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
        stash_dtype = self.stash_dtype(params or {})
        if stash_dtype is None:
            return reads.kv_bytes(element_size)
        per_score = 4 if stash_dtype == "fp32" else 2
        return reads.kv_bytes(element_size) + 2 * per_score * num_heads * int(reads.context.sum())

    def stash_dtype(self, params: dict[str, Any]) -> str | None:
        """The logit stash's dtype name of a call with ``params``; None: it keeps none."""
        if self.stash_of is not None:
            return self.stash_of(params)
        return params.get("stash", "fp32") if self.has_stash else None


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


REGISTRY = Registry()  # filled by the family modules, imported by the package


def register(
    target: Callable[[], Method | Iterable[Method]] | None = None,
    *,
    registry: Registry | None = None,
) -> Any:
    """Decorator: calls the decorated function, which returns a :class:`Method` (or several),
    and registers the result in ``registry`` (default: the global :data:`REGISTRY`), with
    ``module`` set to the decorated function's module. Returns the function unchanged, so
    the same builder can register into another registry (``register(registry=r)(build)``).

    ``@register`` or ``@register(registry=my_registry)``.
    """

    return registering(Method, REGISTRY, MethodError, target, registry)


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

    A ``key=value`` item without a method name belongs to the method before it. A value
    ``a|b`` sweeps: ``santapp:M=32|64,team_size=16|32`` is four pairs, one for each
    combination (the spec's keys in order, the last varying fastest).
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
    return [expanded for method, overrides in parsed for expanded in _sweep(method, overrides)]


def _sweep(method: Method, overrides: dict[str, Any]) -> list[tuple[Method, dict[str, Any]]]:
    """One (method, overrides) pair per combination of the ``a|b`` values in ``overrides``."""
    axes = []
    for key, value in overrides.items():
        texts = value.split("|") if isinstance(value, str) and "|" in value else None
        if texts is not None and not all(t.strip() for t in texts):
            raise MethodError(f"{method.name}: {key}={value!r} has an empty alternative")
        axes.append([_coerce(t.strip()) for t in texts] if texts is not None else [value])
    return [(method, dict(zip(overrides, combo, strict=True)))
            for combo in itertools.product(*axes)]
