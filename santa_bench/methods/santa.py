"""Family ``santa``: SANTA and S2ANTA, value rows sampled from the softmax
(``santa-iid``, ``-strat``, ``-sys``, ``-flash``, ``-prop``).

Reference: ``santa_kernels.attention(value=...)``. Kernel: ``santa_kernels.triton_santa``
(santa-flash also its two-pass and compact variants). End-to-end decode:
:class:`santa_bench.e2e.attention.TritonSampledDecode`.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from santa_bench.baselines import Prepared, Unsupported, trial_run
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

PASSES = Param(
    "passes",
    1,
    int,
    "santa-flash Triton kernel: 1 = one fused pass; 2 = a counts pass, then a gather pass "
    "(the same samples: triton_santa_flash2)",
    choices=(1, 2),
    omit_default=True,
)
GATHER = Param(
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
PAIRS = Param(
    "pairs",
    "auto",
    str,
    "santa-flash one-pass compact kernel (gather=compact): draw the tiles in pairs, one "
    "exchange between warps for two tiles (the same samples). auto = where the group "
    "allows; on; off = one tile a draw",
    choices=("auto", "on", "off"),
    omit_default=True,
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
        passes: int | None = None,
        gather: str | None = None,
        pairs: str | None = None,
    ) -> Prepared:
        if min_ctx:
            raise Unsupported("the Triton kernels do not implement min_ctx; use the reference")
        module = _triton_santa()
        flash = function == "santa_flash"
        if passes not in (None, 1, 2) or (passes == 2 and not flash):
            raise InputError(f"passes: 1 or 2, and 2 only for santa-flash; got {passes!r}")
        if gather not in (None, "masked") and not flash:
            raise InputError(f"gather={gather}: an option of santa-flash")
        if gather == "inline" and passes != 2:
            raise InputError("gather=inline: an option of the two-pass kernel (passes=2)")
        # one pass with compact, lagged V gathers (triton_santa_flash_compact)
        one_pass_compact = flash and passes != 2 and gather == "compact"
        if pairs not in (None, "auto", "on", "off"):
            raise InputError(f"pairs: auto, on or off, got {pairs!r}")
        if pairs not in (None, "auto") and not one_pass_compact:
            raise InputError("pairs: an option of the one-pass compact santa-flash "
                             "(santa-flash:gather=compact)")
        draw_tiles = {"on": 2, "off": 1}.get(pairs or "auto")
        if stash is not None and stash not in STASH_DTYPES:
            raise InputError(f"stash: expected one of {sorted(STASH_DTYPES)}, got {stash!r}")
        stash_dtype = STASH_DTYPES[stash or "fp32"]
        kernel = getattr(module, function)
        if passes == 2:  # the same draw in two kernels (a counts pass, a gather pass)
            two_pass = importlib.import_module("santa_kernels.triton_santa_flash2")
            kernel = two_pass.santa_flash_two_pass
            workspace = two_pass.two_pass_workspace(q, kv, S, tile, seed=seed)
        elif one_pass_compact:
            compact = importlib.import_module("santa_kernels.triton_santa_flash_compact")
            kernel = compact.santa_flash_compact
            workspace = compact.compact_workspace(q, kv, S, tile, seed=seed,
                                                  draw_tiles=draw_tiles)
        else:
            workspace = module.SantaWorkspace.for_inputs(q, kv, S, tile, seed=seed,
                                                         store_counts=flash,
                                                         stash_dtype=stash_dtype)
        kwargs: dict[str, Any] = {"tile": tile, "scale": scale, "workspace": workspace}
        if passes == 2 and gather is not None:
            kwargs["gather"] = gather
        if draw_tiles is not None:
            kwargs["draw_tiles"] = draw_tiles
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
        return prepared

    prepare.__doc__ = f"Prepares the Triton kernel {function} (see triton_santa)."
    return prepare


# ------------------------------------------------------------------ end-to-end decode
def e2e_backend(function: str) -> E2EBackend:
    """The end-to-end decode backend of ``santa_kernels.triton_santa.<function>``."""

    def build(method: Method, params: dict[str, Any], scale: float, seed: int):
        from santa_bench.e2e.attention import TritonSampledDecode

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
            (S, TILE, PASSES, GATHER, PAIRS, MIN_CTX),
            "flash",
            "santa_flash",
            "#ff7f0e",
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
