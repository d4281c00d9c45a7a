"""What several method families share: parameters, the references' wrapper and the
kernel adapters' helpers (stash dtypes, the adapter signature)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import santa_kernels as sk
from santa_bench.baselines import Prepared
from santa_bench.methods._core import Param

# Every kernel adapter: ``prepare(q, kv, *, seed, **params) -> Prepared`` (the dense
# baselines' :class:`~santa_bench.baselines.Prepared`). All setup (workspaces, plans,
# compilation, a trial call) happens there, outside the timed callable. Sampled kernels
# also attach ``reads()``, one untimed call that returns the method's
# :class:`~santa_kernels.reads.ReadCounts` for the byte model.
PrepareFn = Callable[..., Prepared]
STASH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

S = Param("S", 128, int, "samples per (sequence, query head)", minimum=1)
TILE = Param("tile", 64, int, "split-KV tile size BN (tokens)", minimum=1)
DEFAULT_TILE = TILE.default
MIN_CTX = Param("min_ctx", 0, int, "contexts shorter than this run dense", minimum=0)
ALLOC = Param(
    "alloc",
    "systematic",
    str,
    "prop tile budgets: global systematic (unbiased) or the "
    "released code's largest remainder (biased)",
    choices=("systematic", "largest-remainder"),
)
STASH = Param(
    "stash",
    "fp16",
    str,
    "Triton kernel: dtype of the stashed local logits s_i - m_t "
    "(fp32 is exact; fp16 halves the stash traffic, rounding logits by <= 2^-11 relative)",
    choices=("fp32", "fp16", "bf16"),
)

# knobs of the fast kernels that the reference does not have
KERNEL_ONLY_PARAMS = ("stash",)


def value_reference(value: str) -> Callable[..., sk.AttentionOutput]:
    """The PyTorch reference ``santa_kernels.attention(value=value)``, kernel-only knobs
    dropped."""

    def run(q: torch.Tensor, kv: sk.KVCache, **params: Any) -> sk.AttentionOutput:
        params = {k: v for k, v in params.items() if k not in KERNEL_ONLY_PARAMS}
        return sk.attention(q, kv, value=value, **params)

    run.__doc__ = f"Reference with value stage {value!r}."
    return run


def dense_reference(q: torch.Tensor, kv: sk.KVCache, **_params: Any) -> sk.AttentionOutput:
    """Exact softmax attention, whatever the parameters (the dense baselines' reference)."""
    return sk.attention(q, kv, value="dense")
