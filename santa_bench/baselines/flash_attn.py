"""FlashAttention's own ``flash_attn_with_kvcache`` (FA2), when the package is installed.

``num_splits=1`` is FlashAttention (no split over the context), ``0`` the FlashDecoding
heuristic, ``N > 1`` a fixed split. ``page_size=0`` (default) passes a contiguous
``[B, N, Hkv, d]`` cache with ``cache_seqlens``; a paged input is gathered to that
layout once, outside the timed region. ``page_size > 0`` passes pages and a
``block_table`` instead (FA2 needs a multiple of 256). The package usually has no
binary wheel for the target torch/CUDA, so this baseline is often unavailable.
"""

from __future__ import annotations

from typing import Any

import torch

from santa_bench.baselines import Prepared, Unsupported, check_half_precision_backend
from santa_bench.timing import nbytes_of
from santa_kernels.kv import KVCache
from santa_kernels.validate import check_scale

try:
    from flash_attn import flash_attn_with_kvcache

    HAS_FLASH_ATTN = True
    REASON = ""
except Exception as exc:  # not installed, or built for another torch
    flash_attn_with_kvcache = None
    HAS_FLASH_ATTN = False
    REASON = f"flash-attn not installed ({type(exc).__name__}: {exc})"

FA2_PAGE_MULTIPLE = 256


class FlashAttnKVCache:
    """``flash_attn_with_kvcache`` on a decode step (one query token per sequence)."""

    name = "flash-attn"

    def available(self, device: torch.device) -> tuple[bool, str]:
        """Returns whether flash-attn is importable and ``device`` is a CUDA GPU."""
        if not HAS_FLASH_ATTN:
            return False, f"{self.name}: {REASON}"
        if device.type != "cuda" or not torch.cuda.is_available():
            return False, f"{self.name}: needs CUDA"
        return True, ""

    def prepare(
        self,
        q: torch.Tensor,
        kv: KVCache,
        *,
        scale: float | None = None,
        num_splits: int = 0,
        page_size: int = 0,
    ) -> Prepared:
        """Returns the ``flash_attn_with_kvcache`` call; layout set up here."""
        check_half_precision_backend(self, self.name, q, kv)
        if num_splits < 0:
            raise ValueError(f"num_splits: must be >= 0, got {num_splits}")
        if page_size < 0 or (page_size and page_size % FA2_PAGE_MULTIPLE):
            raise Unsupported(
                f"{self.name}: page_size must be 0 (contiguous) or a multiple of "
                f"{FA2_PAGE_MULTIPLE}, got {page_size}"
            )
        tau = check_scale(scale, kv.head_dim)
        notes: dict[str, Any] = {"num_splits": num_splits, "page_size": page_size}
        block_table = None
        if page_size:
            if kv.layout != "paged" or kv.page_size != page_size:
                notes["kv_conversion"] = f"{kv.layout} -> paged({page_size}) (outside timing)"
                kv = kv.to_paged(page_size)
            k_cache, v_cache = kv.k, kv.v
            block_table = kv.page_table.to(torch.int32).contiguous()
        elif kv.layout == "contiguous":
            k_cache, v_cache = kv.k, kv.v
        else:
            notes["kv_conversion"] = "paged -> contiguous [B, N, Hkv, d] (outside timing)"
            k_cache, v_cache, _ = kv.padded()
        cache_seqlens = kv.lengths.to(torch.int32).contiguous()
        query = q.unsqueeze(1)  # [B, 1, Hq, d]
        attend = flash_attn_with_kvcache

        def run() -> torch.Tensor:
            out = attend(
                query,
                k_cache,
                v_cache,
                cache_seqlens=cache_seqlens,
                block_table=block_table,
                softmax_scale=tau,
                causal=False,
                num_splits=num_splits,
            )
            return out.squeeze(1)

        try:
            run()
            torch.cuda.synchronize(q.device)
        except Exception as exc:
            raise Unsupported(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        # a call reads each sequence's valid rows, not the cache's padding
        row_bytes = 2 * kv.num_kv_heads * kv.head_dim * kv.k.element_size()
        inputs_bytes = int(kv.lengths.sum()) * row_bytes + nbytes_of(q, cache_seqlens, block_table)
        return Prepared(run, inputs_bytes, notes)


FLASH_ATTN = FlashAttnKVCache()
