"""Adapters that turn the fast kernels and the dense baselines into timed callables.

Every adapter has the signature ``prepare(q, kv, *, seed, **params) -> Prepared`` (the
dense baselines' :class:`~santa_bench.baselines.Prepared`): all setup (workspaces,
plans, compilation, a trial call) happens here, outside the timed callable. Sampled
kernels also attach ``reads()``, one untimed call that returns the method's
:class:`~santa_kernels.reads.ReadCounts` for the byte model.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

from santa_bench.baselines import BASELINES, Prepared, Unsupported
from santa_bench.timing import nbytes_of
from santa_kernels.kv import KVCache

PrepareFn = Callable[..., Prepared]
STASH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


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
    ) -> Prepared:
        if min_ctx:
            raise Unsupported("the Triton kernels do not implement min_ctx; use the reference")
        module = _triton_santa()
        flash = function == "santa_flash"
        workspace = module.SantaWorkspace.for_inputs(q, kv, S, tile, seed=seed, store_counts=flash)
        kernel = getattr(module, function)
        kwargs: dict[str, Any] = {"tile": tile, "scale": scale, "workspace": workspace}
        if alloc is not None:
            kwargs["alloc"] = alloc

        def run() -> torch.Tensor:
            return kernel(q, kv, S, **kwargs)[0]

        def reads():
            extra = {"return_counts": True} if flash else {}
            _, info = kernel(q, kv, S, **kwargs, **extra)
            return info.read_counts(kv.head_dim)

        try:
            run()
            if q.is_cuda:
                torch.cuda.synchronize(q.device)
        except Exception as exc:
            raise Unsupported(f"{function}: {type(exc).__name__}: {exc}") from exc
        prepared = Prepared(run, nbytes_of(q, kv), {"num_splits": workspace.num_splits})
        prepared.reads = reads  # type: ignore[attr-defined]
        prepared.reset_rng = workspace.reset_rng  # type: ignore[attr-defined]
        return prepared

    prepare.__doc__ = f"Prepares the Triton kernel {function} (see triton_santa)."
    return prepare


def baseline_prepare(name: str) -> PrepareFn:
    """Returns the adapter of the dense baseline ``name`` (seed ignored: it is exact)."""

    def prepare(q: torch.Tensor, kv: KVCache, *, seed: int = 0, **params: Any) -> Prepared:
        return BASELINES[name].prepare(q, kv, **params)

    return prepare
