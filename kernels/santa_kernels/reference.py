"""Exact PyTorch references of every SANTA-family method (docs/algorithms.md sections 1-5).

Slow and obviously right: every method is a score stage (exact or Bernoulli qK^T)
followed by a value stage (dense, iid, strat, sys, flash, prop) that yields weights on
V rows. Accumulation is in ``compute_dtype`` (float32 by default; float64 in tests).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from santa_kernels import scores as score_stages
from santa_kernels import values as value_stages
from santa_kernels.kv import KVCache
from santa_kernels.reads import ReadCounts
from santa_kernels.validate import (
    InputError,
    check_positive_int,
    check_query,
    check_scale,
)

VALUE_STAGES = ("dense", "iid", "strat", "sys", "flash", "prop")
SCORE_STAGES = ("exact", "bernoulli")
COMPUTE_DTYPES = (torch.float32, torch.float64)


@dataclass(frozen=True)
class AttentionOutput:
    """The attention output ``[B, Hq, d]`` (compute dtype) and what was read to get it."""

    out: torch.Tensor
    reads: ReadCounts
    weights: torch.Tensor  # [B, Hq, Nmax]: out = sum_i weights_i v_i
    # [B, Hq]: log of the method's estimate of the softmax denominator sum_i exp(s_i)
    # (s_i = scale q.k_i), where the method estimates one (vattention); None otherwise
    lse: torch.Tensor | None = field(default=None, kw_only=True)


def make_generator(seed: int | None, generator: torch.Generator | None) -> torch.Generator:
    """Returns ``generator`` or a CPU generator seeded with ``seed`` (0 when both are None)."""
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise InputError(
                f"generator: expected a torch.Generator, got {type(generator).__name__}"
            )
        return generator
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise InputError(f"seed: expected an integer, got {seed!r}")
    gen = torch.Generator(device="cpu")
    gen.manual_seed(0 if seed is None else seed)
    return gen


def attention(
    q: torch.Tensor,
    kv: KVCache,
    *,
    value: str = "dense",
    score: str = "exact",
    S: int | None = None,
    tile: int = 64,
    alloc: str = "systematic",
    draws: int = 4,
    grouping: str = "per-head",
    scale: float | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    min_ctx: int = 0,
    compute_dtype: torch.dtype = torch.float32,
) -> AttentionOutput:
    """Returns one decode step of attention for ``q [B, Hq, d]`` over ``kv``.

    ``value`` picks the value stage, ``score`` the score stage (``bernoulli`` uses
    ``draws`` ternary queries per head, or one mask per group with
    ``grouping="mean-group-query"``). Sampling stages need a budget ``S``; ``tile`` is
    the split-KV tile for ``flash``/``prop``; ``alloc`` the prop tile allocation.
    Sequences shorter than ``min_ctx`` are computed densely (exact scores and values).
    """
    if not isinstance(kv, KVCache):
        raise InputError(f"kv: expected a santa_kernels.KVCache, got {type(kv).__name__}")
    if value not in VALUE_STAGES:
        raise InputError(f"value: expected one of {VALUE_STAGES}, got {value!r}")
    if score not in SCORE_STAGES:
        raise InputError(f"score: expected one of {SCORE_STAGES}, got {score!r}")
    if compute_dtype not in COMPUTE_DTYPES:
        raise InputError(f"compute_dtype: expected float32 or float64, got {compute_dtype}")
    group = check_query(q, kv.batch, kv.num_kv_heads, kv.head_dim)
    tau = check_scale(scale, kv.head_dim)
    if value != "dense":
        if S is None:
            raise InputError(f"S: value stage {value!r} needs a sample budget S")
        check_positive_int(S, "S")
    if value in ("flash", "prop"):
        check_positive_int(tile, "tile")
    if isinstance(min_ctx, bool) or not isinstance(min_ctx, int) or min_ctx < 0:
        raise InputError(f"min_ctx: expected an integer >= 0, got {min_ctx!r}")
    gen = make_generator(seed, generator)

    keys, values, valid = kv.padded(compute_dtype)
    query = q.to(compute_dtype)
    exact, k_features = score_stages.exact_scores(query, keys, valid, tau, group)
    scores = exact
    if score == "bernoulli":
        scores, k_features = score_stages.bernoulli_scores(
            query, keys, valid, tau, group, draws, grouping, gen
        )
    if value == "dense":
        weights = value_stages.dense_weights(scores)
    elif value in ("iid", "strat", "sys"):
        stage = {
            "iid": value_stages.iid_weights,
            "strat": value_stages.strat_weights,
            "sys": value_stages.sys_weights,
        }[value]
        weights = stage(scores, S, gen)
    elif value == "flash":
        weights = value_stages.flash_weights(scores, S, gen, tile, kv.lengths)
    else:
        weights = value_stages.prop_weights(scores, S, gen, tile, alloc)

    lengths = kv.lengths
    if min_ctx:
        short = (lengths < min_ctx).to(weights.device)
        weights = torch.where(short[:, None, None], value_stages.dense_weights(exact), weights)
        full = lengths[:, None] * kv.head_dim
        k_features = torch.where(short[:, None].to(k_features.device), full, k_features)

    weights = weights.to(compute_dtype)
    out = torch.einsum("bhn,bhnd->bhd", weights, score_stages._expand_group(values, group))
    batch, hq, n = weights.shape
    v_read = (weights != 0).reshape(batch, hq // group, group, n).any(dim=2).sum(dim=-1)
    reads = ReadCounts(
        k_rows=lengths[:, None].expand(-1, kv.num_kv_heads).contiguous().cpu(),
        k_features=k_features.long().cpu(),
        v_rows=v_read.long().cpu(),
        context=lengths.cpu(),
        head_dim=kv.head_dim,
    )
    return AttentionOutput(out=out, reads=reads, weights=weights)


def dense_attention(q: torch.Tensor, kv: KVCache, **kw) -> AttentionOutput:
    """Exact attention (section 1)."""
    return attention(q, kv, value="dense", **kw)


def santa_iid(q: torch.Tensor, kv: KVCache, S: int, **kw) -> AttentionOutput:
    """SANTA, i.i.d. samples from the softmax (section 2)."""
    return attention(q, kv, value="iid", S=S, **kw)


def santa_strat(q: torch.Tensor, kv: KVCache, S: int, **kw) -> AttentionOutput:
    """S2ANTA-strat over the global CDF (section 3)."""
    return attention(q, kv, value="strat", S=S, **kw)


def santa_sys(q: torch.Tensor, kv: KVCache, S: int, **kw) -> AttentionOutput:
    """S2ANTA-sys over the global CDF (section 3)."""
    return attention(q, kv, value="sys", S=S, **kw)


def santa_flash(q: torch.Tensor, kv: KVCache, S: int, tile: int = 64, **kw) -> AttentionOutput:
    """Tiled S2ANTA-flash: equal tile budgets, mass-weighted merge (section 4)."""
    return attention(q, kv, value="flash", S=S, tile=tile, **kw)


def santa_prop(
    q: torch.Tensor, kv: KVCache, S: int, tile: int = 64, alloc: str = "systematic", **kw
) -> AttentionOutput:
    """Tiled S2ANTA-prop: budgets by tile mass, global systematic by default (section 4)."""
    return attention(q, kv, value="prop", S=S, tile=tile, alloc=alloc, **kw)
