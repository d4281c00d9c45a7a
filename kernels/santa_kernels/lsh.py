"""Exact PyTorch reference of MagicPIG: keys sampled by SimHash collisions, importance-weighted.

docs/algorithms.md section 11. A :class:`LSHIndex` hashes every key of a cache's middle
span (after the first ``sink`` tokens, before the last ``window``) with SimHash: ``L``
tables of ``K`` random hyperplanes each, one set of hyperplanes for all heads, a key's code
in a table being its ``K`` sign bits. The keys are centred first (the mean key of the
span, per sequence and KV head, is subtracted), which leaves the softmax unchanged and
spreads the keys' angles. At decode, the query is hashed with the same hyperplanes; a
hashed key is *sampled* when its code equals the query's in at least ``min_hits`` of the
``L`` tables. Over the random hyperplanes this happens with the probability
:func:`collision_probability` of the angle between the query and the centred key, so the
weighted sums over sampled keys

    num = sum_{i sampled} e^{s_i - m} v_i / P_i,    den = sum_{i sampled} e^{s_i - m} / P_i

are unbiased for the sums over all hashed keys; the sink and window tokens (and tokens
added after the index was built, i.e. decode tokens) are added exactly, and the output is
the self-normalised ratio ``num / den`` (zero where nothing is read, which needs
``sink = window = 0``).

Decisions where MagicPIG's code differs or is silent:

- the weights are exactly ``1 / P_i`` (the released CPU kernel adds ``1e-4`` to ``P_i``
  inside the log, a small bias); ``P_i`` is clamped at the smallest positive number of the
  compute dtype only so that an event of smaller probability cannot divide by zero;
- the hyperplanes are Gaussian, drawn from a seed on the CPU and shared by every head
  (MagicPIG's code also shares them across layers); :func:`magicpig` draws one set per
  call, a decode run one set per sequence (:func:`stack_lsh_indexes` then lets one call
  serve sequences indexed one by one);
- reads: K and V rows of the sampled keys and the exact set (union over the GQA group);
  the hash codes are counted apart, ``ceil(K L / 8)`` bytes per hashed key and KV head
  (``index_bytes``), as if stored as packed bits and scanned whole: an upper bound of the
  lookup's traffic, since MagicPIG's bucket lookup reads only the matching buckets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from santa_kernels.kv import KVCache
from santa_kernels.reads import ReadCounts
from santa_kernels.reference import COMPUTE_DTYPES, AttentionOutput
from santa_kernels.validate import InputError, check_positive_int, check_query, check_scale

CENTERS = ("mean", "none")
MAX_BITS = 31  # bits per table: a code is an int16 (K <= 15) or int32
HASH_CHUNK = 8192  # keys hashed at a time (bounds the [chunk, Hkv, K L] projections)
MATCH_ELEMENTS = 1 << 28  # code comparisons held at once ([B, Hq, chunk, L] booleans)
TAIL_TERMS = 24  # binomial tail terms summed where they shrink fast (ratio <= 1/4)
TAIL_CHUNK = 1 << 19  # probabilities computed at a time (~100 MB of float64 terms)
INDEX_ELEMENT_BYTES = 2  # index_read_fraction is against a 16-bit (bf16/fp16) cache


# ------------------------------------------------------------------ probabilities
def collision_probability(
    cos: torch.Tensor, K: int, L: int, min_hits: int
) -> torch.Tensor:
    """Returns P[a key collides with the query in >= ``min_hits`` of ``L`` tables] (float64).

    SimHash with Gaussian hyperplanes: one bit agrees with probability ``1 - theta / pi``
    (``theta = arccos(cos)``, the angle between query and key), a table's ``K`` bits all
    agree with ``rho = (1 - theta / pi) ** K``, and the count of agreeing tables is
    Binomial(``L``, ``rho``).
    """
    theta = torch.arccos(cos.double().clamp(-1.0, 1.0))
    rho = (1.0 - theta / math.pi).clamp(0.0, 1.0) ** K
    return binomial_tail(rho, L, min_hits)


def binomial_tail(rho: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Returns ``P[X >= m]`` for ``X ~ Binomial(n, rho)`` elementwise, in float64.

    Where the tail's terms shrink fast (each at most a quarter of the one before) it is
    their sum, which keeps its relative precision when it is tiny; elsewhere it is one
    minus the ``m`` terms below ``m``, which then is not small.
    """
    if not 1 <= m <= n:
        raise InputError(f"min_hits: expected 1..{n} (the table count L), got {m}")
    flat = rho.double().reshape(-1)
    out = torch.empty_like(flat)
    for start in range(0, flat.numel(), TAIL_CHUNK):
        part = flat[start : start + TAIL_CHUNK]
        out[start : start + TAIL_CHUNK] = _tail(part, n, m)
    return out.reshape(rho.shape)


def _log_terms(rho: torch.Tensor, n: int, j: torch.Tensor) -> torch.Tensor:
    """``log C(n, j) + j log rho + (n - j) log(1 - rho)``: ``[len(rho), len(j)]``."""
    log_choose = (
        math.lgamma(n + 1) - torch.lgamma(j + 1.0) - torch.lgamma(n - j + 1.0)
    )
    r = rho[:, None]
    return (log_choose + torch.special.xlogy(j, r)
            + torch.special.xlog1py((n - j).to(r.dtype), -r))


def _tail(rho: torch.Tensor, n: int, m: int) -> torch.Tensor:
    device = rho.device
    below = torch.arange(m, dtype=torch.float64, device=device)
    complement = 1.0 - torch.logsumexp(_log_terms(rho, n, below), dim=1).exp()
    top = min(n, m + TAIL_TERMS - 1)
    upper = torch.arange(m, top + 1, dtype=torch.float64, device=device)
    direct = torch.logsumexp(_log_terms(rho, n, upper), dim=1).exp()
    # ratio of consecutive terms (j -> j + 1) is at most (n - m) rho / ((m + 1) (1 - rho))
    fast = (n - m) * rho <= 0.25 * (m + 1) * (1.0 - rho)
    return torch.where(fast, direct, complement.clamp(0.0, 1.0))


# ------------------------------------------------------------------ hashing
def simhash_planes(
    d: int, K: int, L: int, seed: int, *, dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor:
    """Returns ``[d, L * K]`` Gaussian hyperplanes (table ``l`` = columns ``l K .. l K + K - 1``)
    drawn from ``seed`` on the CPU."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    planes = torch.randn(d, L * K, generator=gen, dtype=torch.float64)
    return planes.to(device=device, dtype=dtype)


def simhash_codes(x: torch.Tensor, planes: torch.Tensor, K: int, L: int) -> torch.Tensor:
    """Returns the ``[..., L]`` SimHash codes of vectors ``x [..., d]``: per table, bit ``j``
    set where ``x`` lies on the positive side of the table's ``j``-th hyperplane.

    ``planes``: ``[d, L K]`` for every vector, or ``[B, d, L K]`` with ``x [B, ..., d]``
    (hyperplanes of their own per sequence)."""
    if planes.dim() == 2:
        projected = x @ planes
    else:
        flat = x.reshape(x.shape[0], -1, x.shape[-1])
        projected = torch.bmm(flat, planes).reshape(*x.shape[:-1], planes.shape[-1])
    bits = (projected > 0).reshape(*x.shape[:-1], L, K)
    weights = 2 ** torch.arange(K, device=x.device, dtype=torch.int32)
    codes = (bits.to(torch.int32) * weights).sum(dim=-1, dtype=torch.int32)
    return codes.to(torch.int16 if K <= 15 else torch.int32)


# ------------------------------------------------------------------ index
@dataclass(frozen=True)
class LSHIndex:
    """SimHash tables of one cache's keys, built once (after the prefill, or per call).

    ``codes [B, Hkv, Nidx, L]``: the codes of the centred keys (rows outside a sequence's
    hashed span are zero and unused); ``span_end [B]``: the hashed span of sequence ``b``
    is ``[sink, span_end[b])``, everything else is exact; ``center [B, Hkv, d]``: the mean
    key subtracted before hashing (zeros for ``center="none"``); ``planes [B, d, L K]``:
    each sequence's hyperplanes (drawn from ``seeds[b]``; one draw serves every head).
    """

    K: int
    L: int
    sink: int
    window: int
    seeds: tuple[int, ...]
    planes: torch.Tensor
    center: torch.Tensor
    codes: torch.Tensor
    span_end: torch.Tensor

    @property
    def code_bytes(self) -> int:
        """Bytes of one key's codes in one KV head, stored as packed bits."""
        return math.ceil(self.K * self.L / 8)


def _check_count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"{name}: expected an integer >= 0, got {value!r}")
    return value


def check_lsh_params(K: int, L: int, min_hits: int, sink: int, window: int) -> None:
    """Raises InputError naming the first bad LSH parameter."""
    check_positive_int(K, "K")
    if K > MAX_BITS:
        raise InputError(f"K: at most {MAX_BITS} bits per table, got {K}")
    check_positive_int(L, "L")
    check_positive_int(min_hits, "min_hits")
    if min_hits > L:
        raise InputError(f"min_hits: expected 1..{L} (the table count L), got {min_hits}")
    _check_count(sink, "sink")
    _check_count(window, "window")


def build_lsh_index(
    kv: KVCache,
    *,
    K: int = 10,
    L: int = 150,
    sink: int = 4,
    window: int = 64,
    center: str = "mean",
    seed: int = 0,
    compute_dtype: torch.dtype = torch.float32,
) -> LSHIndex:
    """Hashes the keys of ``kv`` between the first ``sink`` and the last ``window`` tokens
    of each sequence into ``L`` SimHash tables of ``K`` bits (hyperplanes from ``seed``)."""
    if not isinstance(kv, KVCache):
        raise InputError(f"kv: expected a santa_kernels.KVCache, got {type(kv).__name__}")
    check_lsh_params(K, L, 1, sink, window)
    if center not in CENTERS:
        raise InputError(f"center: expected one of {CENTERS}, got {center!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InputError(f"seed: expected an integer, got {seed!r}")
    if compute_dtype not in COMPUTE_DTYPES:
        raise InputError(f"compute_dtype: expected float32 or float64, got {compute_dtype}")
    keys, _, _ = kv.padded(compute_dtype)  # [B, N, Hkv, d]
    batch, n, hkv, d = keys.shape
    positions = torch.arange(n, device=keys.device)
    span_end = (kv.lengths - window).clamp_min(sink).to(keys.device)
    hashed = (positions[None, :] >= sink) & (positions[None, :] < span_end[:, None])  # [B, N]
    if center == "mean":
        counts = hashed.sum(dim=1).clamp_min(1).to(compute_dtype)
        mean = torch.einsum("bn,bnhd->bhd", hashed.to(compute_dtype), keys)
        mean = mean / counts[:, None, None]
    else:
        mean = keys.new_zeros(batch, hkv, d)
    planes = simhash_planes(d, K, L, seed, dtype=compute_dtype, device=keys.device)
    planes = planes[None].expand(batch, -1, -1)  # one draw for the whole call
    code_dtype = torch.int16 if K <= 15 else torch.int32
    codes = torch.zeros(batch, hkv, n, L, dtype=code_dtype, device=keys.device)
    for start in range(0, n, HASH_CHUNK):
        part = keys[:, start : start + HASH_CHUNK] - mean[:, None]  # [B, c, Hkv, d]
        codes[:, :, start : start + HASH_CHUNK] = simhash_codes(part, planes, K, L).transpose(1, 2)
    codes = codes.masked_fill(~hashed[:, None, :, None], 0)
    return LSHIndex(K=K, L=L, sink=sink, window=window, seeds=(seed,) * batch,
                    planes=planes, center=mean, codes=codes, span_end=span_end)


def stack_lsh_indexes(indexes: list[LSHIndex]) -> LSHIndex:
    """Returns one index over the sequences of ``indexes`` (in order; codes padded to the
    longest), so that one :func:`lsh_attention` call serves caches indexed one by one."""
    if not indexes:
        raise InputError("indexes: expected at least one LSHIndex")
    first = indexes[0]
    shape = (first.K, first.L, first.sink, first.window)
    for index in indexes:
        if (index.K, index.L, index.sink, index.window) != shape:
            raise InputError("indexes: K, L, sink and window must agree to be stacked")
    n = max(index.codes.shape[2] for index in indexes)
    codes = torch.cat([torch.nn.functional.pad(index.codes, (0, 0, 0, n - index.codes.shape[2]))
                       for index in indexes])
    return LSHIndex(
        K=first.K, L=first.L, sink=first.sink, window=first.window,
        seeds=tuple(seed for index in indexes for seed in index.seeds),
        planes=torch.cat([index.planes for index in indexes]),
        center=torch.cat([index.center for index in indexes]),
        codes=codes,
        span_end=torch.cat([index.span_end for index in indexes]),
    )


# ------------------------------------------------------------------ attention
@dataclass(frozen=True)
class LSHOutput(AttentionOutput):
    """A MagicPIG decode step: ``out``, ``reads`` (sampled and exact rows, GQA union),
    ``weights [B, Hq, N]`` (normalised, ``out = sum w_i v_i``), the importance-weighted
    sums ``num [B, Hq, d]`` and ``den [B, Hq]`` relative to ``shift [B, Hq]`` (the largest
    score of all valid keys, read or not), ``inclusion [B, Hq, N]`` (``P_i`` for the
    sampled keys, 1 for exact ones, 0 for keys not read), ``sampled [B, Hq, N]`` (the keys
    read) and ``index_bytes [B, Hkv]`` (hash-code bytes scanned)."""

    num: torch.Tensor
    den: torch.Tensor
    shift: torch.Tensor
    inclusion: torch.Tensor
    sampled: torch.Tensor
    index_bytes: torch.Tensor

    @property
    def index_read_fraction(self) -> float:
        """Hash-code bytes over the dense K+V bytes of a 16-bit (bf16/fp16) cache."""
        dense = 2 * self.reads.dense_rows * self.reads.head_dim * INDEX_ELEMENT_BYTES
        return float(self.index_bytes.sum()) / dense

    @property
    def read_equivalent(self) -> float:
        """``kv_read_fraction`` plus ``index_read_fraction``."""
        return self.reads.kv_read_fraction + self.index_read_fraction


def _collision_counts(q_codes: torch.Tensor, codes: torch.Tensor, group: int) -> torch.Tensor:
    """Tables in which each key's code equals each query head's: ``[B, Hq, N]`` int32.

    ``q_codes [B, Hq, L]``, ``codes [B, Hkv, N, L]``."""
    batch, hkv, n, tables = codes.shape
    per_query = q_codes.reshape(batch, hkv, group, 1, tables)
    chunk = max(1, MATCH_ELEMENTS // max(1, batch * hkv * group * tables))
    counts = []
    for start in range(0, n, chunk):
        part = codes[:, :, None, start : start + chunk]  # [B, Hkv, 1, c, L]
        counts.append((part == per_query).sum(dim=-1, dtype=torch.int32))
    return torch.cat(counts, dim=-1).reshape(batch, hkv * group, n)


def lsh_attention(
    q: torch.Tensor,
    kv: KVCache,
    index: LSHIndex,
    *,
    min_hits: int = 2,
    scale: float | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> LSHOutput:
    """One decode step of MagicPIG attention for ``q [B, Hq, d]`` over ``kv`` with ``index``
    (built on this cache or a prefix of it: later tokens are exact)."""
    if not isinstance(kv, KVCache):
        raise InputError(f"kv: expected a santa_kernels.KVCache, got {type(kv).__name__}")
    if not isinstance(index, LSHIndex):
        raise InputError(f"index: expected an LSHIndex, got {type(index).__name__}")
    if compute_dtype not in COMPUTE_DTYPES:
        raise InputError(f"compute_dtype: expected float32 or float64, got {compute_dtype}")
    group = check_query(q, kv.batch, kv.num_kv_heads, kv.head_dim)
    check_lsh_params(index.K, index.L, min_hits, index.sink, index.window)
    tau = check_scale(scale, kv.head_dim)
    built = (*index.codes.shape[:2], index.planes.shape[1])
    if built != (kv.batch, kv.num_kv_heads, kv.head_dim):
        raise InputError(f"index: built for (B, Hkv, d) = {built}, the cache has "
                         f"{(kv.batch, kv.num_kv_heads, kv.head_dim)}")
    keys, values, valid = kv.padded(compute_dtype)  # [B, N, Hkv, d], [B, N]
    batch, n, hkv, d = keys.shape
    query = q.to(compute_dtype).reshape(batch, hkv, group, d)
    device = keys.device

    # scores of every key, and the cosine of each query with each centred key
    dots = torch.einsum("bkgd,bnkd->bkgn", query, keys)
    center = index.center.to(device, compute_dtype)  # [B, Hkv, d]
    centred = dots - torch.einsum("bkgd,bkd->bkg", query, center)[..., None]
    k_norm = (keys - center[:, None]).norm(dim=-1)  # [B, N, Hkv]
    q_norm = query.norm(dim=-1)  # [B, Hkv, G]
    denom = q_norm[..., None] * k_norm.permute(0, 2, 1)[:, :, None, :]
    cos = torch.where(denom > 0, centred / denom.clamp_min(torch.finfo(compute_dtype).tiny), 0.0)
    scores = (tau * dots).reshape(batch, hkv * group, n)
    cos = cos.reshape(batch, hkv * group, n)

    # which keys are hashed, sampled, exact
    n_idx = index.codes.shape[2]
    positions = torch.arange(n, device=device)
    span_end = index.span_end.to(device)
    hashed = (positions[None] >= index.sink) & (positions[None] < span_end[:, None]) & valid
    exact = valid & ~hashed  # [B, N]
    planes = index.planes.to(device, compute_dtype)
    q_codes = simhash_codes(q.to(compute_dtype), planes, index.K, index.L)  # [B, Hq, L]
    hits = _collision_counts(q_codes, index.codes[:, :, :n].to(device), group)  # [B, Hq, <=N]
    if n_idx < n:  # tokens past the index (decode tokens) are exact, never hashed
        hits = torch.nn.functional.pad(hits, (0, n - n_idx))
    sampled = (hits >= min_hits) & hashed[:, None]
    read = sampled | exact[:, None]

    # importance weights: exactly 1 for exact keys, 1 / P for sampled ones (P of those only)
    chosen = sampled.nonzero(as_tuple=True)
    prob = collision_probability(cos[chosen], index.K, index.L, min_hits)
    prob = prob.clamp_min(torch.finfo(compute_dtype).tiny).to(compute_dtype)
    inclusion = exact[:, None].to(compute_dtype).expand_as(scores).clone()
    inclusion[chosen] = prob
    log_p = torch.zeros_like(scores)
    log_p[chosen] = prob.log()
    shift = scores.masked_fill(~valid[:, None], float("-inf")).amax(dim=-1)  # [B, Hq]
    log_w = scores - shift[..., None] - log_p
    raw = torch.where(read, log_w.exp(), 0.0)  # [B, Hq, N]
    v = values.permute(0, 2, 1, 3)  # [B, Hkv, N, d]
    num = torch.einsum("bkgn,bknd->bkgd", raw.reshape(batch, hkv, group, n), v)
    num = num.reshape(batch, hkv * group, d)
    den = raw.sum(dim=-1)
    # nothing read (no sink, no window, no collision): the output is zero
    safe = torch.where(den > 0, den, 1.0)[..., None]
    out, weights = num / safe, raw / safe

    # one device-to-host copy: rows read per (sequence, KV head), then hashed keys
    rows_read = read.reshape(batch, hkv, group, n).any(dim=2).sum(dim=-1)  # [B, Hkv]
    counts = torch.cat([rows_read, hashed.sum(dim=1, keepdim=True)], dim=1).long().cpu()
    rows, hashed_count = counts[:, :hkv], counts[:, hkv]
    reads = ReadCounts(
        k_rows=rows,
        k_features=rows * d,
        v_rows=rows.clone(),
        context=kv.lengths.cpu(),
        head_dim=d,
    )
    index_bytes = (hashed_count[:, None] * index.code_bytes).expand(-1, hkv).contiguous()
    return LSHOutput(out=out, reads=reads, weights=weights, num=num, den=den, shift=shift,
                     inclusion=inclusion, sampled=read, index_bytes=index_bytes.long())


def magicpig(
    q: torch.Tensor,
    kv: KVCache,
    *,
    K: int = 10,
    L: int = 150,
    min_hits: int = 2,
    sink: int = 4,
    window: int = 64,
    center: str = "mean",
    scale: float | None = None,
    seed: int | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> LSHOutput:
    """MagicPIG decode attention with fresh hyperplanes from ``seed``: hashes the cache
    (:func:`build_lsh_index`), then attends (:func:`lsh_attention`)."""
    index = build_lsh_index(kv, K=K, L=L, sink=sink, window=window, center=center,
                            seed=0 if seed is None else seed, compute_dtype=compute_dtype)
    return lsh_attention(q, kv, index, min_hits=min_hits, scale=scale,
                         compute_dtype=compute_dtype)
