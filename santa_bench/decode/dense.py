"""Dense (exact) decode backends.

``sdpa`` (torch SDPA over the whole static cache with a length mask, the GQA group as
query rows: what a plain PyTorch decoder does), ``triton-splitkv`` (the suite's
FlashDecoding), ``flashinfer-tc`` / ``flashinfer-cuda`` / ``flashinfer-fa3`` (paged
decode, ``plan()`` before each step, as serving engines do; fa3: FlashInfer's
FlashAttention-3 kernel, Hopper only) and ``flash-attn`` (``flash_attn_with_kvcache``).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from santa_bench import baselines
from santa_bench.baselines import Unsupported
from santa_bench.decode.base import DecodeAttention
from santa_bench.e2e.cache import StaticKVCache

# the dense backends are the baselines with a decode backend (santa_bench.baselines'
# registry, which also lists the kernels `santa-bench kernel` times): their names here
# are the registry's, as of import (a plugin's come later: see baselines.decode_names)
DENSE_BACKENDS = tuple(baselines.decode_names())
GPU_AUTO_DENSE = DENSE_BACKENDS
CPU_AUTO_DENSE = ("sdpa",)


class SdpaDecode(DecodeAttention):
    """torch SDPA over the whole cache capacity with a ``[B, 1, 1, N]`` length mask.

    GQA without expanding K/V: the ``G`` query heads of a KV head are ``G`` query rows.
    A paged cache is gathered to ``[B, N, Hkv, d]`` on every call (SDPA reads no pages).
    """

    name = "sdpa"

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def setup(self, cache: StaticKVCache, q: torch.Tensor) -> None:
        super().setup(cache, q)
        self.positions = torch.arange(cache.capacity, device=cache.device)

    def __call__(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        cache = self.cache
        batch, hq, d = q.shape
        hkv = cache.num_kv_heads
        view = cache.contiguous_view(layer)
        k, v = view if view is not None else cache.gather(layer, cache.capacity)
        valid = self.positions[None, :] < cache.lengths[:, None]
        out = F.scaled_dot_product_attention(
            q.view(batch, hkv, hq // hkv, d),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=valid[:, None, None, :],
            scale=self.scale,
        )
        return out.reshape(batch, hq, d)


class TritonSplitKVDecode(DecodeAttention):
    """``santa_kernels.triton_splitkv.splitkv_decode`` (reads each sequence's length)."""

    name = "triton-splitkv"

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def setup(self, cache: StaticKVCache, q: torch.Tensor) -> None:
        super().setup(cache, q)
        try:
            module = importlib.import_module("santa_kernels.triton_splitkv")
        except Exception as exc:
            raise Unsupported(f"triton-splitkv: not importable: {exc}") from exc
        ok, how = module.splitkv_available()
        if not ok or (how == "cuda" and q.device.type != "cuda"):
            raise Unsupported(f"triton-splitkv: {how if not ok else 'runs on CUDA tensors'}")
        self.decode = module.splitkv_decode
        self.workspace = module.SplitKVWorkspace.for_inputs(q, cache.layers[0])
        self.out = torch.empty_like(q)

    def __call__(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        return self.decode(q, self.cache.layers[layer], scale=self.scale, out=self.out,
                           workspace=self.workspace, pdl_chain=self.pdl_chain)


class FlashInferDecode(DecodeAttention):
    """FlashInfer ``BatchDecodeWithPagedKVCacheWrapper`` in CUDA-graph mode.

    The wrapper owns fixed page-index buffers; :meth:`before_step` calls ``plan()`` with
    host tensors (the lengths the step attends to), which copies into them, and the
    captured ``run`` reads them. A contiguous cache is viewed as pages of 16 rows
    (no copy).
    """

    def __init__(self, scale: float, use_tensor_cores: bool, backend: str = "auto") -> None:
        self.scale = scale
        self.backend = backend
        self.use_tensor_cores = use_tensor_cores or backend == "fa3"
        self.name = ("flashinfer-fa3" if backend == "fa3"
                     else "flashinfer-tc" if use_tensor_cores else "flashinfer-cuda")

    def setup(self, cache: StaticKVCache, q: torch.Tensor) -> None:
        super().setup(cache, q)
        from santa_bench.baselines import flashinfer as fi

        ok, why = fi.gpu_available(self.name, q.device, self.backend)
        if not ok:
            raise Unsupported(why)
        if q.dtype not in (torch.float16, torch.bfloat16) or cache.dtype != q.dtype:
            raise Unsupported(f"{self.name}: needs fp16/bf16 q and K/V of one dtype")
        batch, hq, d = q.shape
        if cache.layout == "paged":
            assert cache.page_table is not None
            self.page_size = cache.page_size
            table = cache.page_table
            self.k_pages, self.v_pages = cache.k, cache.v
        else:
            self.page_size = 16
            per_seq = cache.capacity // self.page_size
            table = torch.arange(batch * per_seq, dtype=torch.int32).view(batch, per_seq)
            shape = (batch * per_seq, self.page_size, cache.num_kv_heads, cache.head_dim)
            self.k_pages = [k.view(shape) for k in cache.k]
            self.v_pages = [v.view(shape) for v in cache.v]
        self.table = table.cpu()
        device = q.device
        self.indptr = torch.zeros(batch + 1, dtype=torch.int32, device=device)
        self.indices = torch.zeros(self.table.numel(), dtype=torch.int32, device=device)
        self.last_page_len = torch.zeros(batch, dtype=torch.int32, device=device)
        try:
            self.wrapper = fi.flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                fi.workspace(device), "NHD", use_cuda_graph=True,
                use_tensor_cores=self.use_tensor_cores, backend=self.backend,
                paged_kv_indptr_buffer=self.indptr, paged_kv_indices_buffer=self.indices,
                paged_kv_last_page_len_buffer=self.last_page_len,
            )
        except Exception as exc:
            raise Unsupported(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        self.shape = (hq, cache.num_kv_heads, d, q.dtype)
        self.out = torch.empty_like(q)

    def before_step(self, lengths: Sequence[int]) -> None:
        lengths_t = torch.tensor(list(lengths), dtype=torch.int64)
        pages = (lengths_t + self.page_size - 1) // self.page_size
        indptr = torch.zeros(len(lengths) + 1, dtype=torch.int32)
        indptr[1:] = torch.cumsum(pages, 0).to(torch.int32)
        used = torch.arange(self.table.shape[1])[None, :] < pages[:, None]
        indices = self.table[used].to(torch.int32)
        last = (lengths_t - (pages - 1) * self.page_size).to(torch.int32)
        hq, hkv, d, dtype = self.shape
        self.wrapper.plan(indptr, indices, last, hq, hkv, d, self.page_size,
                          pos_encoding_mode="NONE", q_data_type=dtype, kv_data_type=dtype,
                          sm_scale=self.scale)

    def __call__(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        return self.wrapper.run(q, (self.k_pages[layer], self.v_pages[layer]), out=self.out)


class FlashAttnDecode(DecodeAttention):
    """``flash_attn_with_kvcache`` with ``cache_seqlens`` = the cache's device lengths."""

    name = "flash-attn"

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def setup(self, cache: StaticKVCache, q: torch.Tensor) -> None:
        super().setup(cache, q)
        from santa_bench.baselines import flash_attn as fa

        if not fa.HAS_FLASH_ATTN:
            raise Unsupported(f"flash-attn: {fa.REASON}")
        if q.device.type != "cuda":
            raise Unsupported("flash-attn: needs CUDA")
        if cache.layout == "paged" and cache.page_size % fa.FA2_PAGE_MULTIPLE:
            raise Unsupported(f"flash-attn: pages must be a multiple of "
                              f"{fa.FA2_PAGE_MULTIPLE} rows, got {cache.page_size}")
        self.attend = fa.flash_attn_with_kvcache

    def __call__(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        cache = self.cache
        out = self.attend(q[:, None], cache.k[layer], cache.v[layer],
                          cache_seqlens=cache.lengths, block_table=cache.page_table,
                          softmax_scale=self.scale, causal=False, num_splits=0)
        return out[:, 0]


def dense_backend(name: str, scale: float) -> DecodeAttention:
    """Returns the dense backend ``name``: the decode backend of that baseline of
    :data:`santa_bench.baselines.BASELINES`."""
    entry = baselines.BASELINES.get(name)
    if entry is None or entry.decode is None:
        known = ", ".join(baselines.decode_names())
        raise ValueError(f"unknown dense backend {name!r}; known: {known}")
    return entry.decode_backend(scale)

