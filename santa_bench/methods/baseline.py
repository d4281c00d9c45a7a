"""Family ``baseline``: the dense (exact) kernels the sampled ones are timed against:
PyTorch SDPA backends, FlashInfer, flash-attn and the suite's Triton split-KV, one method
each of :data:`santa_bench.baselines.BASELINES` that has a timed kernel (the registry also
holds the end-to-end decode backends; :func:`register_baseline` adds one of one's own).

Reference: exact attention. Kernel: the baseline itself. End-to-end decode runs them as
dense backends (``--dense-backends``), not through ``e2e_backend``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from santa_bench import baselines
from santa_bench.baselines import BASELINES, Prepared
from santa_bench.devices import resolve_device
from santa_bench.methods._common import PrepareFn, dense_reference
from santa_bench.methods._core import Method, Param, PlotStyle, register
from santa_kernels.kv import KVCache

# Cool hues for exact attention.
COLOURS = {
    "sdpa-cudnn": "#1f3b73",
    "sdpa-flash": "#3a7bd5",
    "sdpa-math": "#9db4d6",
    "flashinfer-tc": "#138d90",
    "flashinfer-cuda": "#72c7cf",
    "flashinfer-fa3": "#0b5d5f",
    "flash-attn": "#5b6c8f",
    "triton-splitkv": "#555555",
}


# ------------------------------------------------------------------ kernel adapter
def baseline_prepare(name: str) -> PrepareFn:
    """Returns the adapter of the dense baseline ``name`` (seed ignored: it is exact)."""

    def prepare(q: torch.Tensor, kv: KVCache, *, seed: int = 0, **params: Any) -> Prepared:
        return BASELINES[name].prepare(q, kv, **params)

    return prepare


# ------------------------------------------------------------------ the methods
def _baseline(entry: baselines.Baseline) -> Method:
    params = tuple(
        Param(name, default, int, f"{entry.name} parameter {name}", minimum=0)
        for name, default in entry.params.items()
    )
    ours = entry.name == "triton-splitkv"

    def available() -> tuple[bool, str]:
        return entry.available(resolve_device("auto"))

    return Method(
        entry.name,
        "baseline",
        entry.description,
        params,
        reference=dense_reference,
        prepare=baseline_prepare(entry.name),
        kernel_kind="triton" if ours else "baseline",
        availability=available,
        kernel_availability=available,
        plot=PlotStyle(colour=COLOURS.get(entry.name)),
    )


@register
def vendor_baselines() -> tuple[Method, ...]:
    return tuple(_baseline(entry) for entry in BASELINES.values() if entry.timed)


def register_baseline(entry: baselines.Baseline) -> baselines.Baseline:
    """Registers a dense baseline of one's own (a plugin's): in the baseline registry,
    so that `santa-bench e2e` decodes with it (``decode``), and, where it has a timed
    kernel (``target``), as a method of the baseline family, so that `santa-bench
    kernel` times it and `santa-bench list` shows it."""
    baselines.register_baseline(entry)
    if entry.timed:
        register(lambda: replace(_baseline(entry), module=entry.target.partition(":")[0]))
    return entry
