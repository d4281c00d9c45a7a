"""Synthetic attention patterns for fidelity runs: where the softmax mass sits.

Every pattern returns ``(q [B, Hq, d], kv)`` with Gaussian K/V and a query shaped so
that the attention distribution has the named structure; the scale ``tau = 1/sqrt(d)``
is the default one.
"""

from __future__ import annotations

import torch

import santa_kernels as sk
from santa_bench.inputs import DecodeShape

PATTERNS: dict[str, str] = {
    "uniform": "q = 0: every key equally likely",
    "peaked": "random q scaled x3 (the seed benchmarks' inputs)",
    "needle": "one key aligned with q carries most of the mass",
    "multi-needle": "four keys aligned with q share most of the mass",
    "sink-heavy": "the first four tokens (attention sinks) carry most of the mass",
}
NEEDLE_SCORE = 8.0  # target logit of a needle (the bulk of the keys scores ~N(0, 1))


def _plant_needles(q: torch.Tensor, keys: torch.Tensor, positions: list[int], group: int) -> None:
    """Rewrites ``keys`` at ``positions``: along the group's mean query, scaled so the
    group's heads score them ``NEEDLE_SCORE`` on average (``tau = 1/sqrt(d)``)."""
    tau = q.shape[-1] ** -0.5
    for b in range(q.shape[0]):
        for g in range(keys.shape[2]):
            heads = q[b, g * group : (g + 1) * group]
            direction = heads.mean(0) / heads.mean(0).norm().clamp_min(1e-6)
            alignment = max(float((heads @ direction).mean()), 1e-3)
            keys[b, positions, g] = direction * (NEEDLE_SCORE / (tau * alignment))


def make_pattern(
    pattern: str,
    shape: DecodeShape,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> tuple[torch.Tensor, sk.KVCache]:
    """Returns ``(q, kv)`` whose attention follows ``pattern`` (see ``PATTERNS``)."""
    if pattern not in PATTERNS:
        raise ValueError(f"pattern: expected one of {list(PATTERNS)}, got {pattern!r}")
    gen = torch.Generator().manual_seed(seed)
    b, n, hq, hkv, d = shape.batch, shape.ctx, shape.heads, shape.kv_heads, shape.head_dim
    q = torch.randn(b, hq, d, generator=gen, dtype=torch.float64)
    keys = torch.randn(b, n, hkv, d, generator=gen, dtype=torch.float64)
    values = torch.randn(b, n, hkv, d, generator=gen, dtype=torch.float64)
    group = hq // hkv

    def place(positions: list[int]) -> None:
        _plant_needles(q, keys, positions, group)

    if pattern == "uniform":
        q.zero_()
    elif pattern == "peaked":
        q *= 3.0
    elif pattern == "needle":
        place([int(torch.randint(n, (1,), generator=gen))])
    elif pattern == "multi-needle":
        place(torch.randperm(n, generator=gen)[: min(4, n)].tolist())
    else:
        place(list(range(min(4, n))))
    kv = sk.KVCache.contiguous(
        keys.to(device=device, dtype=dtype), values.to(device=device, dtype=dtype)
    )
    return q.to(device=device, dtype=dtype), kv
