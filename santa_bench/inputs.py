"""Decode-step inputs: a query per head and a KV cache, contiguous or paged."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import santa_kernels as sk

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class DecodeShape:
    """One decode step's attention shape (default: Llama-3.1-8B)."""

    batch: int = 1
    ctx: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128

    def __post_init__(self) -> None:
        for name in ("batch", "ctx", "heads", "kv_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")
        if self.heads % self.kv_heads:
            raise ValueError(
                f"heads: {self.heads} query heads is not a multiple of {self.kv_heads} KV heads"
            )


def parse_dtype(name: str) -> torch.dtype:
    """Returns the torch dtype for ``bf16``/``fp16``/``fp32``."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype: expected one of {list(DTYPES)}, got {name!r}") from None


def make_decode_inputs(
    shape: DecodeShape,
    *,
    dtype: torch.dtype = torch.bfloat16,
    layout: str = "contiguous",
    page_size: int = 16,
    q_scale: float = 3.0,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> tuple[torch.Tensor, sk.KVCache]:
    """Returns ``(q [B, Hq, d], kv)`` with Gaussian Q/K/V, Q scaled by ``q_scale``.

    ``q_scale = 3`` follows the seed benchmarks (random Q scaled x3), which makes the
    softmax peaked enough for sampling to matter. The paged cache shuffles its pages.
    """
    if layout not in ("contiguous", "paged"):
        raise ValueError(f"layout: expected 'contiguous' or 'paged', got {layout!r}")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    b, n, hq, hkv, d = shape.batch, shape.ctx, shape.heads, shape.kv_heads, shape.head_dim
    q = (torch.randn(b, hq, d, generator=gen) * q_scale).to(device=device, dtype=dtype)
    k = torch.randn(b, n, hkv, d, generator=gen).to(device=device, dtype=dtype)
    v = torch.randn(b, n, hkv, d, generator=gen).to(device=device, dtype=dtype)
    kv = sk.KVCache.contiguous(k, v)
    if layout == "paged":
        kv = kv.to_paged(page_size, generator=gen)
    return q, kv
