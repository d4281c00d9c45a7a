"""Deprecated: the kernel adapters live with their methods in :mod:`santa_bench.methods`
(``.santa``, ``.santapp``, ``.bernoulli``, ``.baseline``; shared helpers in
``._common``). This module re-exports them for older imports."""

from __future__ import annotations

from santa_bench.methods._common import STASH_DTYPES, PrepareFn
from santa_bench.methods.baseline import baseline_prepare
from santa_bench.methods.bernoulli import bernoulli_prepare
from santa_bench.methods.santa import santa_kernel_available, santa_prepare
from santa_bench.methods.santapp import (
    merge_atomic_of,
    santapp_kernel_available,
    santapp_prepare,
)

__all__ = [
    "STASH_DTYPES",
    "PrepareFn",
    "baseline_prepare",
    "bernoulli_prepare",
    "merge_atomic_of",
    "santa_kernel_available",
    "santa_prepare",
    "santapp_kernel_available",
    "santapp_prepare",
]
