"""Family ``santa``: SANTA and S2ANTA, value rows sampled from the softmax
(``santa-iid``, ``-strat``, ``-sys``, ``-flash``, ``-prop``).

Reference: ``santa_kernels.attention(value=...)``. Kernel: ``santa_kernels.triton_santa``
(santa-flash: ``santa_kernels.triton_santa_flash``). End-to-end decode:
:class:`TritonSampledDecode` (this module).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from santa_bench.baselines import Prepared, Unsupported, trial_run
from santa_bench.decode.base import DecodeAttention
from santa_bench.e2e.cache import StaticKVCache
from santa_bench.methods._common import (
    ALLOC,
    MIN_CTX,
    STASH,
    STASH_DTYPES,
    TILE,
    PrepareFn,
    S,
    value_reference,
)
from santa_bench.methods._core import E2EBackend, Method, Param, PlotStyle, register
from santa_bench.timing import nbytes_of
from santa_kernels.kv import KVCache
from santa_kernels.validate import InputError

# santa-flash's options of the kernels it had before its one kernel (rows stored then
# carry them; a spec naming one fails)
FLASH_RETIRED = tuple(
    (name, "has one kernel now (one pass with compact V gathers)")
    for name in ("gather", "passes", "pairs")
)


# ------------------------------------------------------------------ kernel adapter
def _triton_santa():
    return importlib.import_module("santa_kernels.triton_santa")


def santa_kernel_available() -> tuple[bool, str]:
    """Returns whether the Triton SANTA kernels can run here, with the reason if not."""
    try:
        return _triton_santa().santa_triton_available()
    except Exception as exc:  # triton missing or broken
        return False, f"santa_kernels.triton_santa not importable: {exc}"


def santa_kernel(function: str, q: torch.Tensor, kv: KVCache, S: int, tile: int, *,
                 seed: int, stash_dtype: torch.dtype = torch.float32):
    """Returns ``(kernel, workspace)`` of the SANTA method whose Triton function is
    ``function`` (``santa_prop``, ..., ``santa_flash``): santa-flash runs
    ``triton_santa_flash.santa_flash`` on a workspace split by its own rule, the others
    ``triton_santa.<function>``. The kernel harness and end-to-end decode both take it."""
    if function == "santa_flash":
        flash = importlib.import_module("santa_kernels.triton_santa_flash")
        return flash.santa_flash, flash.flash_workspace(q, kv, S, tile, seed=seed)
    module = _triton_santa()
    workspace = module.SantaWorkspace.for_inputs(q, kv, S, tile, seed=seed,
                                                 stash_dtype=stash_dtype)
    return getattr(module, function), workspace


def kernel_function(kernel) -> str:
    """``triton_santa_flash.santa_flash``: a kernel function's module (without the
    package) and name, as kernel rows record it."""
    return f"{kernel.__module__.removeprefix('santa_kernels.')}.{kernel.__name__}"


def santa_prepare(function: str) -> PrepareFn:
    """Returns the adapter of ``santa_kernels.triton_santa.<function>``."""

    def prepare(
        q: torch.Tensor,
        kv: KVCache,
        *,
        seed: int = 0,
        S: int,
        tile: int = 64,
        alloc: str | None = None,
        min_ctx: int = 0,
        stash: str | None = None,
        scale: float | None = None,
    ) -> Prepared:
        if min_ctx:
            raise Unsupported("the Triton kernels do not implement min_ctx; use the reference")
        flash = function == "santa_flash"
        if stash is not None and stash not in STASH_DTYPES:
            raise InputError(f"stash: expected one of {sorted(STASH_DTYPES)}, got {stash!r}")
        stash_dtype = STASH_DTYPES[stash or "fp32"]
        kernel, workspace = santa_kernel(function, q, kv, S, tile, seed=seed,
                                         stash_dtype=stash_dtype)
        kwargs: dict[str, Any] = {"tile": tile, "scale": scale, "workspace": workspace}
        if not flash:  # santa-flash keeps no stash
            kwargs["stash_dtype"] = stash_dtype
        if alloc is not None:
            kwargs["alloc"] = alloc

        def run() -> torch.Tensor:
            return kernel(q, kv, S, **kwargs)[0]

        def reads():
            extra = {"return_counts": True} if flash else {}
            _, info = kernel(q, kv, S, **kwargs, **extra)
            return info.read_counts(kv.head_dim)

        def rebind(q: torch.Tensor, kv: KVCache) -> Prepared:  # the same workspace
            return Prepared(lambda: kernel(q, kv, S, **kwargs)[0], nbytes_of(q, kv),
                            prepared.notes, rebind=rebind)

        trial_run(run, q, function)
        prepared = Prepared(run, nbytes_of(q, kv), {"num_splits": workspace.num_splits},
                            rebind=rebind)
        prepared.reads = reads  # type: ignore[attr-defined]
        prepared.reset_rng = workspace.reset_rng  # type: ignore[attr-defined]
        # the kernel rows record the Triton function that ran
        prepared.kernel_function = kernel_function(kernel)  # type: ignore[attr-defined]
        return prepared

    prepare.__doc__ = f"Prepares the Triton kernel {function} (see triton_santa)."
    return prepare


# ------------------------------------------------------------------ end-to-end decode
def require_santa_kernels(params: dict[str, Any]) -> None:
    """Unsupported unless the Triton SANTA kernels run here and ``params`` ask nothing
    they lack (``min_ctx``)."""
    ok, why = santa_kernel_available()
    if not ok:
        raise Unsupported(why)
    if params.get("min_ctx"):
        raise Unsupported("the Triton kernels do not implement min_ctx")



class TritonSampledDecode(DecodeAttention):
    """A SANTA-family Triton kernel, the one the kernel harness times for the method
    (:func:`santa_bench.methods.santa.santa_kernel` of ``function``, by default the one
    named like the method: santa-prop -> santa_prop); one workspace serves every layer."""

    def __init__(self, method: Method, params: dict[str, Any], scale: float, seed: int,
                 function: str | None = None) -> None:
        self.method, self.params, self.scale, self.seed = method, dict(params), scale, seed
        self.function = function or method.name.replace("-", "_")
        self.name = "triton"

    def setup(self, cache: StaticKVCache, q: torch.Tensor) -> None:
        super().setup(cache, q)
        require_santa_kernels(self.params)
        self.S = int(self.params["S"])
        tile = int(self.params.get("tile", 64))
        self.kwargs: dict[str, Any] = {"tile": tile, "scale": self.scale}
        flash = self.function == "santa_flash"
        # the global-CDF samplers join the loop's PDL chain (flash has no entry wait)
        self.chains = not flash
        stash = STASH_DTYPES[self.params.get("stash", "fp32")]
        if not flash:
            self.kwargs["stash_dtype"] = stash
        if "alloc" in self.params:
            self.kwargs["alloc"] = self.params["alloc"]
        try:
            self.kernel, self.workspace = santa_kernel(self.function, q, cache.layers[0],
                                                       self.S, tile, seed=self.seed,
                                                       stash_dtype=stash)
        except ValueError as exc:
            raise Unsupported(f"{self.method.name}: {exc}") from exc
        self.kwargs["workspace"] = self.workspace
        # the kernel that runs, named as the kernel harness's rows name it
        self.kernel_function = kernel_function(self.kernel)

    def reset(self) -> None:
        self.workspace.reset_rng(0)

    def __call__(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        chain = {"pdl_chain": self.pdl_chain} if self.chains else {}
        return self.kernel(q, self.cache.layers[layer], self.S, **self.kwargs, **chain)[0]



def e2e_backend(function: str) -> E2EBackend:
    """The end-to-end decode backend of ``santa_kernels.triton_santa.<function>``."""

    def build(method: Method, params: dict[str, Any], scale: float, seed: int):
        return TritonSampledDecode(method, params, scale, seed, function=function)

    return build


# ------------------------------------------------------------------ the methods
def _santa(
    name: str,
    description: str,
    params: tuple[Param, ...],
    value: str,
    function: str,
    colour: str,
    stash: bool = False,
    retired: tuple[tuple[str, str], ...] = (),
) -> Method:
    return Method(
        name,
        "santa",
        description,
        params,
        reference=value_reference(value),
        prepare=santa_prepare(function),
        kernel_kind="triton",
        kernel_availability=santa_kernel_available,
        has_stash=stash,
        e2e_backend=e2e_backend(function),
        plot=PlotStyle(colour=colour),
        retired=retired,
    )


@register
def santa_methods() -> tuple[Method, ...]:
    return (
        _santa(
            "santa-iid",
            "SANTA: S i.i.d. value rows from the softmax",
            (S, STASH, MIN_CTX),
            "iid",
            "santa_iid",
            "#e8b10c",
            stash=True,
        ),
        _santa(
            "santa-strat",
            "S2ANTA-strat: one sample per CDF stratum",
            (S, STASH, MIN_CTX),
            "strat",
            "santa_strat",
            "#8c564b",
            stash=True,
        ),
        _santa(
            "santa-sys",
            "S2ANTA-sys: systematic sampling over the global CDF",
            (S, STASH, MIN_CTX),
            "sys",
            "santa_sys",
            "#e377c2",
            stash=True,
        ),
        _santa(
            "santa-flash",
            "S2ANTA-flash: equal tile budgets, mass-weighted merge",
            (S, TILE, MIN_CTX),
            "flash",
            "santa_flash",
            "#ff7f0e",
            retired=FLASH_RETIRED,
        ),
        _santa(
            "santa-prop",
            "S2ANTA-prop: tile budgets by mass, global systematic (or largest remainder)",
            (S, TILE, ALLOC, STASH, MIN_CTX),
            "prop",
            "santa_prop",
            "#d62728",
            stash=True,
        ),
    )
