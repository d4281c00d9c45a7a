"""Shared fixtures: small decode problems with fixed seeds."""

from __future__ import annotations

import torch

import santa_kernels as sk


def decode_problem(
    *,
    batch: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    n: int = 200,
    d: int = 8,
    q_scale: float = 1.0,
    seed: int = 0,
    lengths: list[int] | None = None,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, sk.KVCache]:
    """Returns ``(q, kv)`` with Gaussian entries; larger ``q_scale`` peaks the softmax."""
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(batch, heads, d, generator=gen, dtype=torch.float64) * q_scale).to(dtype)
    k = torch.randn(batch, n, kv_heads, d, generator=gen, dtype=torch.float64).to(dtype)
    v = torch.randn(batch, n, kv_heads, d, generator=gen, dtype=torch.float64).to(dtype)
    lens = None if lengths is None else torch.tensor(lengths)
    return q, sk.KVCache.contiguous(k, v, lens)
