"""The memory an e2e run needs, estimated from shapes before anything is allocated.

Counted from what the runner allocates (``model.py``, ``cache.py``, ``loop.py``,
``attention.py``): the weights at the run's dtype; the static KV cache (``layers x 2 x
kv_heads x head_dim x capacity x batch`` elements, capacity = ctx + steps rounded up to
the cache's multiple); the RoPE tables; and the largest working set of the run, either
the dense prefill's (the prompt ids, the hidden states of the whole prompt, one chunk's
projections, MLP and fp32 norm temporaries, the causal mask SDPA widens to the dtype, a
paged cache's contiguous scratch) or a decode step's (logits, SDPA's length mask, a
paged gather, a CPU reference method's fp32 copies of one layer's K/V (padded, then
expanded to the query heads) and its scores,
SANTA++'s per-layer team index). Real weights add the fused QKV and gate/up copies made
while a checkpoint is converted. The available memory is the host's
(``psutil.virtual_memory().available``) on a CPU, the free device memory on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from santa_bench.e2e.configs import ModelConfig

GIB = 2**30
MARGIN = 2 * GIB  # kept free beyond the estimate (allocator slack, libraries, the store)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of one e2e group (one model, batch and ctx), by what holds them."""

    weights: int
    kv_cache: int
    working: int  # the largest transient set: the prefill's or a decode step's
    loading: int = 0  # real weights: fused copies while the checkpoint is converted

    @property
    def total(self) -> int:
        return self.weights + max(self.loading, self.kv_cache + self.working)

    def describe(self) -> str:
        """``~3.1 GiB (weights 2.3 GiB, KV cache 612 MiB, working 205 MiB)``."""
        parts = [("weights", self.weights), ("KV cache", self.kv_cache),
                 ("working", self.working)] + ([("loading", self.loading)] if self.loading else [])
        return f"~{size(self.total)} ({', '.join(f'{n} {size(b)}' for n, b in parts)})"


def size(nbytes: float) -> str:
    """``2.3 GiB``, or ``612 MiB`` under a GiB."""
    return f"{nbytes / GIB:.1f} GiB" if nbytes >= GIB else f"{nbytes / 2**20:.0f} MiB"


def cache_capacity(ctx: int, steps: int, layout: str = "contiguous", page_size: int = 16) -> int:
    """Rows per sequence the static cache allocates (``StaticKVCache.capacity``)."""
    from santa_bench.e2e.cache import CAPACITY_MULTIPLE, round_up

    capacity = round_up(ctx + steps, CAPACITY_MULTIPLE)
    return round_up(capacity, page_size) if layout == "paged" else capacity


def weight_bytes(config: ModelConfig, element_size: int) -> int:
    """Bytes of the decoder's weights (``Decoder.parameter_bytes``)."""
    return config.num_parameters() * element_size


def estimate(config: ModelConfig, case: dict[str, Any], element_size: int) -> MemoryEstimate:
    """Returns the memory one e2e case's group needs (see the module docstring)."""
    from santa_bench.e2e.cache import round_up
    from santa_bench.e2e.loop import MASK_ALIGN

    c, e = config, element_size
    batch, ctx, steps = int(case["batch"]), int(case["ctx"]), int(case["decode_steps"])
    layout = case.get("layout", "contiguous")
    capacity = cache_capacity(ctx, steps, layout, int(case.get("page_size") or 16))
    kv_row = c.num_kv_heads * c.head_dim  # elements of one token's K (or V) in one layer
    kv_cache = 2 * c.num_layers * batch * capacity * kv_row * e
    q_width, width = c.num_heads * c.head_dim, (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
    rope = 2 * capacity * c.head_dim * e + 4 * capacity * c.head_dim * 4  # tables + fp32 build

    # a decode step: logits, SDPA's length mask, a paged gather, a CPU reference's
    # working set, SANTA++'s per-layer index
    decode = 4 * batch * c.vocab + batch * capacity * (9 + e)
    if layout == "paged":
        decode += 2 * batch * capacity * kv_row * e
    if case.get("device", "cpu") != "cuda" and case.get("family", "dense") != "dense":
        # fp32 K and V, each expanded to the query heads in turn (and copied by einsum),
        # and [B, Hq, N] fp32 scores
        decode += batch * capacity * (2 * kv_row + 3 * q_width) * 4
        decode += 16 * batch * c.num_heads * capacity * 4
    if case.get("family") == "santapp":
        decode += c.num_layers * batch * capacity * kv_row * 2  # teams: a fraction of K
    working = decode
    if case.get("prefill", "dense") == "dense":
        chunk = min(int(case.get("prefill_chunk") or 1024), ctx)
        rows = batch * chunk
        padded = round_up(ctx, MASK_ALIGN)
        prefill = 8 * batch * ctx + batch * ctx * c.hidden * e  # prompt ids, hidden states
        prefill += rows * c.hidden * (e + 2 * 4)  # the chunk's rows, fp32 norm temporaries
        # QKV with RoPE's temporaries and the GQA rows / SDPA output, or the MLP
        prefill += rows * max(3 * width + 3 * q_width, 4 * c.intermediate + 4 * c.hidden) * e
        prefill += chunk * c.group * padded * (1 + e)  # causal mask, bool and widened
        if layout == "paged":
            prefill += 2 * batch * padded * kv_row * e  # the contiguous scratch
        working = max(working, prefill)
    loading = 0
    if case.get("weights") == "real":
        loading = c.num_layers * c.hidden * (width + 2 * c.intermediate) * e
    return MemoryEstimate(weight_bytes(c, e), kv_cache, working + rope, loading)


def available_bytes(device: str) -> int:
    """Bytes free for the run: the host's available memory, or the GPU's free memory."""
    if device == "cuda":
        import torch

        return int(torch.cuda.mem_get_info()[0])
    import psutil

    return int(psutil.virtual_memory().available)


def known_config(model: str, weights: str) -> ModelConfig | None:
    """The shape of ``model`` when it is known without loading or downloading anything:
    a named config, or the config.json of a local checkpoint folder."""
    from pathlib import Path

    from santa_bench.e2e.configs import from_hf_config, named_config

    config = named_config(model) if weights == "random" else None
    if config is None and Path(model).is_dir():
        try:
            from transformers import AutoConfig

            config = from_hf_config(AutoConfig.from_pretrained(model), model)
        except Exception:  # unreadable here: the runner checks once it has loaded it
            return None
    return config


def largest(cases: list[dict[str, Any]]) -> tuple[MemoryEstimate, dict[str, Any]] | None:
    """The largest estimate over ``cases`` with its case, or None when a shape is unknown."""
    from santa_bench.inputs import parse_dtype

    best: tuple[MemoryEstimate, dict[str, Any]] | None = None
    for case in cases:
        config = known_config(case["model"], case["weights"])
        if config is None:
            return None
        need = estimate(config, case, parse_dtype(case["dtype"]).itemsize)
        if best is None or need.total > best[0].total:
            best = (need, case)
    return best
