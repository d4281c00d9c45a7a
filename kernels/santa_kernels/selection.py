"""Selection methods users compare against (docs/algorithms.md section 10): exact PyTorch
references of oracle top-k, Quest, vAttention and top-k + S²ANTA.

Each one picks rows of the cache (deterministically, or partly at random) and attends over
them; the output is ``out = Σ_i weights_i v_i`` as for every method of the suite. Scores
are ``s_i = τ q·k_i``. Accumulation in ``compute_dtype`` (float64 in the tests); random
numbers come from the caller's CPU generator in an order that depends on shapes only.

- :func:`oracle_topk`: the exact top-``k`` tokens by score (per query head, or per KV
  head by the group's summed probabilities), softmax renormalised over them.
- :func:`quest`: Quest's pages (Tang et al., 2024): per-page, per-channel min/max of the
  keys bound every score of a page from above; the pages with the largest bounds (the
  last page always) are attended exactly.
- :func:`vattention`: vAttention (Desai et al., 2025): sink, window and top-``k`` tokens
  exact; the rest estimated from a uniform sample whose size a CLT bound picks so that
  the estimate is within ``epsilon`` with probability ``1 - delta``.
- :func:`topk_santa`: the exact top-``k`` tokens plus S²ANTA systematic samples of the
  rest's softmax, weighted by the rest's mass: unbiased for the full attention.
- :func:`indexed_reference`: attention over listed rows with log-weights, the reference
  of the Triton kernel ``santa_kernels.triton_indexed`` that the fast paths share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from santa_kernels import values as value_stages
from santa_kernels.kv import KVCache
from santa_kernels.reads import ReadCounts
from santa_kernels.reference import AttentionOutput, make_generator
from santa_kernels.scores import _expand_group, exact_scores
from santa_kernels.validate import (
    InputError,
    check_positive_int,
    check_query,
    check_scale,
)

SHARED = ("group", "head")
VATTENTION_MODES = ("denominator", "output")
COMPUTE_DTYPES = (torch.float32, torch.float64)


# ------------------------------------------------------------------ shared pieces
@dataclass(frozen=True)
class _Scored:
    """One decode step's exact scores and the padded cache they came from."""

    scores: torch.Tensor  # [B, Hq, N], -inf past each length
    keys: torch.Tensor  # [B, N, Hkv, d]
    values: torch.Tensor  # [B, N, Hkv, d]
    valid: torch.Tensor  # [B, N]
    group: int
    tau: float


def _scored(q: torch.Tensor, kv: KVCache, scale: float | None,
            compute_dtype: torch.dtype) -> _Scored:
    if not isinstance(kv, KVCache):
        raise InputError(f"kv: expected a santa_kernels.KVCache, got {type(kv).__name__}")
    if compute_dtype not in COMPUTE_DTYPES:
        raise InputError(f"compute_dtype: expected float32 or float64, got {compute_dtype}")
    group = check_query(q, kv.batch, kv.num_kv_heads, kv.head_dim)
    tau = check_scale(scale, kv.head_dim)
    keys, values, valid = kv.padded(compute_dtype)
    scores, _ = exact_scores(q.to(compute_dtype), keys, valid, tau, group)
    return _Scored(scores, keys, values, valid, group, tau)


def _check_shared(shared: str) -> None:
    if shared not in SHARED:
        raise InputError(f"shared: expected one of {SHARED}, got {shared!r}")


def _check_count(value: int, name: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return value


def _group_mass(scores: torch.Tensor, group: int) -> torch.Tensor:
    """``[B, Hkv, N]``: the softmax probabilities summed over each GQA group (float64)."""
    batch, hq, n = scores.shape
    probs = torch.softmax(scores.double(), dim=-1)
    return probs.reshape(batch, hq // group, group, n).sum(dim=2)


def _topk_mask(score: torch.Tensor, allowed: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean mask of the ``k`` largest entries of ``score`` among ``allowed`` (last dim)."""
    mask = torch.zeros_like(allowed)
    if k == 0:
        return mask
    ranked = score.double().masked_fill(~allowed, float("-inf"))
    top = ranked.topk(min(k, ranked.shape[-1]), dim=-1)
    mask.scatter_(-1, top.indices, top.values > float("-inf"))
    return mask & allowed


def group_topk_mask(scored: _Scored, k: int, shared: str,
                    allowed: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, Hq, N]``: the top-``k`` tokens of each head (``shared="head"``, by score) or of
    each KV head (``"group"``, by the group's summed probability), among ``allowed``
    (``[B, N]``, default: the valid tokens)."""
    allowed = scored.valid if allowed is None else allowed & scored.valid
    batch, hq, n = scored.scores.shape
    if shared == "head":
        return _topk_mask(scored.scores, allowed[:, None, :].expand(batch, hq, n), k)
    mass = _group_mass(scored.scores, scored.group)
    hkv = hq // scored.group
    chosen = _topk_mask(mass, allowed[:, None, :].expand(batch, hkv, n), k)
    return chosen.repeat_interleave(scored.group, dim=1)


def _output(scored: _Scored, kv: KVCache, weights: torch.Tensor, read_v: torch.Tensor,
            k_features: torch.Tensor, compute_dtype: torch.dtype,
            lse: torch.Tensor | None = None) -> AttentionOutput:
    """The attention output of ``weights`` on V rows; V reads are ``read_v`` ([B, Hq, N])
    unioned over each GQA group, K reads ``k_features`` ([B, Hkv] elements)."""
    weights = weights.to(compute_dtype)
    out = torch.einsum("bhn,bhnd->bhd", weights, _expand_group(scored.values, scored.group))
    batch, hq, n = weights.shape
    v_rows = read_v.reshape(batch, hq // scored.group, scored.group, n).any(dim=2).sum(-1)
    lengths = kv.lengths
    reads = ReadCounts(
        k_rows=lengths[:, None].expand(-1, kv.num_kv_heads).contiguous().cpu(),
        k_features=k_features.long().cpu(),
        v_rows=v_rows.long().cpu(),
        context=lengths.cpu(),
        head_dim=kv.head_dim,
    )
    return AttentionOutput(out=out, reads=reads, weights=weights, lse=lse)


def _all_k(kv: KVCache) -> torch.Tensor:
    """K elements read when every valid key is scored: ``[B, Hkv]``."""
    return (kv.lengths[:, None] * kv.head_dim).expand(-1, kv.num_kv_heads).contiguous()


def _restricted_softmax(scores: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """``softmax`` of ``scores`` over the ``chosen`` entries only (float64)."""
    return torch.softmax(scores.double().masked_fill(~chosen, float("-inf")), dim=-1)


# ------------------------------------------------------------------ oracle top-k
def oracle_topk(
    q: torch.Tensor,
    kv: KVCache,
    *,
    k: int,
    shared: str = "group",
    scale: float | None = None,
    compute_dtype: torch.dtype = torch.float32,
    **_: object,
) -> AttentionOutput:
    """Exact attention renormalised over the top-``k`` tokens (section 10.1).

    ``shared="group"``: one token set per KV head, the ``k`` largest summed probabilities
    of its ``G`` query heads (what a KV read can exploit); ``"head"``: each query head's
    own ``k`` largest scores. Reads every key (the selection needs every score) and the
    chosen value rows (their union over the group). ``k >= N`` is dense attention.
    """
    check_positive_int(k, "k")
    _check_shared(shared)
    scored = _scored(q, kv, scale, compute_dtype)
    chosen = group_topk_mask(scored, k, shared)
    weights = _restricted_softmax(scored.scores, chosen)
    return _output(scored, kv, weights, chosen, _all_k(kv), compute_dtype)


# ------------------------------------------------------------------ Quest
def quest_bounds(kv: KVCache, page: int, dtype: torch.dtype = torch.float64
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(kmin, kmax)``, ``[B, P, Hkv, d]`` with ``P = ceil(N / page)``: the
    per-channel minimum and maximum of each page's valid keys (0 for a page past a
    sequence's end)."""
    check_positive_int(page, "page")
    keys, _, valid = kv.padded(dtype)
    batch, n, hkv, d = keys.shape
    pages = -(-n // page)
    pad = pages * page - n
    keys = torch.nn.functional.pad(keys, (0, 0, 0, 0, 0, pad))
    valid = torch.nn.functional.pad(valid, (0, pad))
    keys = keys.reshape(batch, pages, page, hkv, d)
    inside = valid.reshape(batch, pages, page)[..., None, None]
    kmax = keys.masked_fill(~inside, float("-inf")).amax(dim=2)
    kmin = keys.masked_fill(~inside, float("inf")).amin(dim=2)
    used = inside.any(dim=2)
    zero = torch.zeros((), dtype=dtype)
    return torch.where(used, kmin, zero), torch.where(used, kmax, zero)


def quest_page_scores(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """``[B, Hq, P]``: Quest's upper bound ``τ Σ_j max(q_j max_j, q_j min_j)`` of every
    score of each page, written ``τ (q⁺·max + q⁻·min)`` (``q⁺ = max(q, 0)``,
    ``q⁻ = min(q, 0)``)."""
    batch, hq, d = q.shape
    hkv = kmin.shape[2]
    group = hq // hkv
    q = q.to(kmax.dtype).reshape(batch, hkv, group, d)
    upper = (torch.einsum("bhgd,bphd->bhgp", q.clamp_min(0), kmax)
             + torch.einsum("bhgd,bphd->bhgp", q.clamp_max(0), kmin))
    return scale * upper.reshape(batch, hq, -1)


def quest_page_choice(bound: torch.Tensor, lengths: torch.Tensor, page: int, pages: int,
                      group: int, shared: str) -> torch.Tensor:
    """``[B, Hq, P]`` boolean: each head's chosen pages. The last page of a sequence is
    always chosen; of the others, the ``pages - 1`` with the largest bounds (per KV head,
    the largest bound among the group's heads, with ``shared="group"``)."""
    batch, hq, p_max = bound.shape
    if shared == "group":
        bound = bound.reshape(batch, hq // group, group, p_max).amax(dim=2)
    used_pages = (lengths.to(bound.device) + page - 1) // page  # [B]
    index = torch.arange(p_max, device=bound.device)
    used = index[None, :] < used_pages[:, None]
    last = index[None, :] == used_pages[:, None] - 1
    ranked = bound.double().masked_fill(~used[:, None, :], float("-inf"))
    ranked = ranked.masked_fill(last[:, None, :], float("inf"))
    chosen = _topk_mask(ranked, used[:, None, :].expand_as(ranked), pages)
    if shared == "group":
        chosen = chosen.repeat_interleave(group, dim=1)
    return chosen


def quest(
    q: torch.Tensor,
    kv: KVCache,
    *,
    page: int = 16,
    pages: int = 64,
    shared: str = "group",
    scale: float | None = None,
    compute_dtype: torch.dtype = torch.float32,
    **_: object,
) -> AttentionOutput:
    """Quest (section 10.2): exact attention over ``pages`` pages of ``page`` tokens, the
    last page and the ``pages - 1`` others whose key bounds give the largest score bound.

    ``shared="group"``: one page set per KV head (its heads' largest bound);
    ``"head"``: per query head, as Quest on multi-head models. Reads the bounds
    (``2 x pages-in-use x d`` elements of K per KV head), the chosen pages' keys and values
    (their union over the group). All pages chosen is dense attention.
    """
    check_positive_int(page, "page")
    check_positive_int(pages, "pages")
    _check_shared(shared)
    scored = _scored(q, kv, scale, compute_dtype)
    kmin, kmax = quest_bounds(kv, page, compute_dtype)
    bound = quest_page_scores(q.to(compute_dtype), kmin, kmax, scored.tau)
    chosen_pages = quest_page_choice(bound, kv.lengths, page, pages, scored.group, shared)
    n = scored.scores.shape[-1]
    token_page = torch.arange(n, device=bound.device) // page
    chosen = chosen_pages[:, :, token_page] & scored.valid[:, None, :]
    weights = _restricted_softmax(scored.scores, chosen)
    batch, hq, _ = chosen.shape
    rows = chosen.reshape(batch, hq // scored.group, scored.group, n).any(dim=2).sum(-1)
    used_pages = (kv.lengths + page - 1) // page
    # the bounds as the fast path stores them: in the cache dtype (a page's max and min
    # are keys' values, so exactly)
    k_features = (2 * used_pages[:, None].to(rows.device) + rows) * kv.head_dim
    return _output(scored, kv, weights, chosen, k_features, compute_dtype)


# ------------------------------------------------------------------ vAttention
def normal_quantile(p: float) -> float:
    """Returns ``Φ⁻¹(p)``, the standard normal quantile."""
    if not 0.0 < p < 1.0:
        raise InputError(f"quantile: p must be in (0, 1), got {p}")
    return math.sqrt(2.0) * float(torch.erfinv(torch.tensor(2.0 * p - 1.0,
                                                            dtype=torch.float64)))


def vattention_budget(sigma: torch.Tensor, denominator: torch.Tensor, population: torch.Tensor,
                      epsilon: float, delta: float, scale: torch.Tensor | None = None
                      ) -> torch.Tensor:
    """The CLT sample size ``ceil((z n_s σ / (ε D s))²)`` with ``z = Φ⁻¹(1 − δ/2)``:
    ``n_s/b Σ`` of ``b`` uniform draws over ``n_s`` tokens then errs by more than
    ``ε D s`` with probability about ``δ`` (``s``: 1 for the denominator, the output's
    norm for the output). Infinite where the denominator is 0."""
    z = normal_quantile(1.0 - delta / 2.0)
    allowed = epsilon * denominator * (1.0 if scale is None else scale)
    ratio = z * population.to(sigma.dtype) * sigma / allowed.clamp_min(1e-300)
    return torch.ceil(ratio.square())


def _check_fraction(value: float, name: str, low_open: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{name}: expected a number, got {value!r}")
    if not (0.0 < value < 1.0 if low_open else 0.0 <= value <= 1.0):
        raise InputError(f"{name}: must be in (0, 1), got {value!r}")
    return float(value)


def vattention_ranges(lengths: torch.Tensor, sink: int, window: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lo, hi)`` per sequence: the sampled range ``[lo, hi)`` between the ``sink`` first
    and the ``window`` last tokens (empty when they cover the sequence)."""
    lo = lengths.clamp(max=sink)
    hi = torch.maximum(lengths - window, lo)
    return lo, hi


def vattention(
    q: torch.Tensor,
    kv: KVCache,
    *,
    sink: int = 128,
    window: int = 128,
    topk: int = 256,
    epsilon: float = 0.05,
    delta: float = 0.05,
    base_rate: float = 0.01,
    mode: str = "denominator",
    scale: float | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    compute_dtype: torch.dtype = torch.float32,
    **_: object,
) -> AttentionOutput:
    """vAttention (section 10.3): sink, window and top-``k`` tokens exact, the rest
    estimated from ``b`` uniform draws with a CLT-chosen ``b``.

    Per KV head (shared by its ``G`` query heads): the ``topk`` tokens of the middle range
    ``[sink, n − window)`` with the largest summed probabilities join the exact set;
    ``b₀ = max(2, ⌈base_rate · n_s⌉)`` uniform draws over the range (``n_s`` tokens; a
    draw on a top-k token counts 0) estimate each head's spread ``σ`` and denominator
    ``D``; each head needs ``b = ⌈(z n_s σ / (ε D))²⌉`` draws (``mode="denominator"``, the
    paper's relaxation) or ``⌈(z n_s σ_o / (ε D ‖o‖))²⌉`` (``mode="output"``: ``σ_o`` the
    spread of ``e^{s}(v − ô)``, which bounds the output's relative error), the group takes
    its largest, clamped to ``[b₀, n_s]``. A fresh set of ``b`` draws then enters numerator
    and denominator with weight ``n_s / b`` each (Hansen–Hurwitz, unbiased for both tail
    sums); ``b = n_s`` attends the range exactly instead. ``lse``: the log of the
    estimated denominator.
    """
    for name, value in (("sink", sink), ("window", window), ("topk", topk)):
        _check_count(value, name)
    epsilon = _check_fraction(epsilon, "epsilon")
    delta = _check_fraction(delta, "delta")
    base_rate = _check_fraction(base_rate, "base_rate", low_open=False)
    if mode not in VATTENTION_MODES:
        raise InputError(f"mode: expected one of {VATTENTION_MODES}, got {mode!r}")
    gen = make_generator(seed, generator)
    scored = _scored(q, kv, scale, compute_dtype)
    scores, group = scored.scores.double(), scored.group
    batch, hq, n = scores.shape
    hkv = hq // group
    lengths = kv.lengths.to(scores.device)
    lo, hi = vattention_ranges(lengths, sink, window)
    population = hi - lo  # n_s per sequence
    position = torch.arange(n, device=scores.device)
    in_range = (position[None, :] >= lo[:, None]) & (position[None, :] < hi[:, None])
    top = group_topk_mask(scored, topk, "group", allowed=in_range)  # [B, Hq, N]
    exact_set = (scored.valid & ~in_range)[:, None, :] | top

    shift = scores.amax(dim=-1, keepdim=True)  # finite: every sequence has >= 1 token
    expo = torch.exp(scores - shift).masked_fill(~scored.valid[:, None, :], 0.0)  # [B,Hq,N]
    tail = expo.masked_fill(~(in_range[:, None, :] & ~top), 0.0)  # e^{s} off the exact set
    exact_den = (expo * exact_set).sum(-1)  # [B, Hq]
    values = _expand_group(scored.values.double(), group)  # [B, Hq, N, d]

    # the base sample: b0 uniform draws over the range, per KV head
    base = torch.clamp(torch.ceil(base_rate * population.double()), min=2).long()  # [B]
    base_cap = int(base.max()) if batch else 2
    u0 = torch.rand((batch, hkv, base_cap), generator=gen, dtype=torch.float64)
    draws0 = _uniform_tokens(u0.to(scores.device), lo, population, n)  # [B, Hkv, cap]
    take0 = torch.arange(base_cap, device=scores.device)[None, :] < base[:, None]  # [B, cap]
    draws0_h = draws0.repeat_interleave(group, dim=1)  # [B, Hq, cap]
    y = tail.gather(-1, draws0_h)  # [B, Hq, cap]
    w0 = take0[:, None, :].double()
    count0 = base.double()[:, None]
    mean_y = (y * w0).sum(-1) / count0
    den_hat = exact_den + population.double()[:, None] * mean_y
    if mode == "denominator":
        var = ((y - mean_y[..., None]).square() * w0).sum(-1) / (count0 - 1)
        need = vattention_budget(var.sqrt(), den_hat, population[:, None], epsilon, delta)
    else:
        v0 = values.gather(2, draws0_h[..., None].expand(-1, -1, -1, values.shape[-1]))
        exact_num = torch.einsum("bhn,bhnd->bhd", expo * exact_set, values)
        num_hat = exact_num + population.double()[:, None, None] * (
            (y * w0)[..., None] * v0).sum(2) / count0[..., None]
        out_hat = num_hat / den_hat.clamp_min(1e-300)[..., None]
        spread = y[..., None] * (v0 - out_hat[:, :, None, :])  # [B, Hq, cap, d]
        centred = spread - (spread * w0[..., None]).sum(2, keepdim=True) / count0[..., None, None]
        var = ((centred.square() * w0[..., None]).sum(2) / (count0[..., None] - 1)).sum(-1)
        need = vattention_budget(var.sqrt(), den_hat, population[:, None], epsilon, delta,
                                 scale=out_hat.norm(dim=-1))
    budget = need.reshape(batch, hkv, group).amax(dim=-1)  # the group's largest
    budget = torch.minimum(torch.maximum(budget, base.double()[:, None]),
                           population.double()[:, None])  # [B, Hkv]
    budget = torch.where(population[:, None] > 0, budget, torch.zeros_like(budget)).long()

    # the estimate: b fresh uniform draws over the range, weight n_s / b each
    cap = int(budget.max()) if budget.numel() else 0
    u = torch.rand((batch, hkv, max(cap, 1)), generator=gen, dtype=torch.float64)
    draws = _uniform_tokens(u.to(scores.device), lo, population, n)  # [B, Hkv, cap]
    take = (torch.arange(draws.shape[-1], device=scores.device)[None, None, :]
            < budget[..., None])
    counts = torch.zeros(batch, hkv, n, dtype=torch.float64, device=scores.device)
    counts.scatter_add_(-1, draws, take.double())
    # a budget that reaches the range's size reads the range exactly (weight 1 each)
    whole = (budget >= population[:, None]) & (population[:, None] > 0)  # [B, Hkv]
    counts = torch.where(whole[..., None], in_range[:, None, :].double(), counts)
    per_draw = population.double()[:, None] / budget.clamp_min(1).double()  # [B, Hkv]
    tail_weight = (counts * per_draw[..., None]).repeat_interleave(group, dim=1)
    unnorm = expo * exact_set + tail * tail_weight  # [B, Hq, N]
    den = unnorm.sum(-1)
    weights = unnorm / den[..., None]
    read_v = exact_set | (counts > 0).repeat_interleave(group, dim=1)
    if mode == "output":  # the base sample's value rows were read too
        base_rows = torch.zeros(batch, hkv, n, dtype=torch.bool, device=scores.device)
        base_rows.scatter_(-1, draws0, take0[:, None, :].expand_as(draws0))
        read_v = read_v | (base_rows.repeat_interleave(group, dim=1) & scored.valid[:, None])
    lse = (shift[..., 0] + den.log()).to(compute_dtype)
    return _output(scored, kv, weights, read_v, _all_k(kv), compute_dtype, lse=lse)


def _uniform_tokens(u: torch.Tensor, lo: torch.Tensor, population: torch.Tensor,
                    n: int) -> torch.Tensor:
    """Tokens ``lo + ⌊u · n_s⌋`` (``u [B, H, R]`` in [0, 1)), at most ``n - 1`` (where
    ``n_s = 0``, a placeholder that the caller weighs by 0)."""
    width = population.double()[:, None, None]
    pick = torch.minimum(torch.floor(u * width), (width - 1).clamp_min(0))
    return (lo[:, None, None] + pick.long()).clamp(max=n - 1)


# ------------------------------------------------------------------ top-k + S²ANTA
def topk_santa(
    q: torch.Tensor,
    kv: KVCache,
    *,
    k: int = 64,
    S: int = 128,
    scale: float | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    compute_dtype: torch.dtype = torch.float32,
    **_: object,
) -> AttentionOutput:
    """Top-``k`` exact plus S²ANTA on the rest (section 10.4).

    Per KV head, the ``k`` tokens with the largest summed probabilities ``T`` are attended
    exactly; each query head draws ``S`` systematic samples from its softmax restricted to
    the rest, ``p_i / M`` with ``M = Σ_{i∉T} p_i``, and weighs each by ``M / S``:
    ``ô = Σ_{i∈T} p_i v_i + (M / S) Σ_m v_{i_m}``, unbiased for ``o``. Reads every key
    and the value rows of ``T`` and of the samples (their union over the group).
    """
    _check_count(k, "k")
    check_positive_int(S, "S")
    gen = make_generator(seed, generator)
    scored = _scored(q, kv, scale, compute_dtype)
    top = group_topk_mask(scored, k, "group")
    probs = torch.softmax(scored.scores.double(), dim=-1)
    rest_scores = scored.scores.double().masked_fill(top, float("-inf"))
    mass = probs.masked_fill(top, 0.0).sum(-1, keepdim=True)  # M per head
    # heads whose rest is empty sample from a placeholder and weigh it by M = 0
    empty = ~torch.isfinite(rest_scores).any(dim=-1, keepdim=True)
    rest_scores = torch.where(empty, torch.zeros_like(rest_scores), rest_scores)
    counts = value_stages.sys_weights(rest_scores, S, gen)  # c_i / S over the rest
    weights = probs * top + mass * counts
    read_v = top | (counts > 0) & ~empty
    return _output(scored, kv, weights, read_v, _all_k(kv), compute_dtype)


# ------------------------------------------------------------------ indexed attention
def indexed_reference(
    q: torch.Tensor,
    kv: KVCache,
    tokens: torch.Tensor,
    log_weights: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    compute_dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """``[B, Hq, d]``: per head, ``Σ_r w_r e^{s_r} v_r / Σ_r w_r e^{s_r}`` over the rows
    ``tokens [B, Hkv, R]`` (token positions; a negative entry or one past the sequence's
    length is no row; a token listed twice counts twice) with ``log w`` from
    ``log_weights`` (``[B, Hkv, R]`` shared by the group or ``[B, Hq, R]`` per head; 0
    when None). The Triton kernel ``santa_kernels.triton_indexed`` computes this."""
    group = check_query(q, kv.batch, kv.num_kv_heads, kv.head_dim)
    tau = check_scale(scale, kv.head_dim)
    keys, values, valid = kv.padded(compute_dtype)
    scores, _ = exact_scores(q.to(compute_dtype), keys, valid, tau, group)  # [B, Hq, N]
    _, hq, n = scores.shape
    tokens = tokens.long().to(scores.device)
    ok = (tokens >= 0) & (tokens < kv.lengths.to(scores.device)[:, None, None])
    safe = torch.where(ok, tokens, torch.zeros_like(tokens)).clamp(max=n - 1)
    per_head = safe.repeat_interleave(group, dim=1)  # [B, Hq, R]
    s = scores.gather(-1, per_head)
    if log_weights is not None:
        lw = log_weights.to(scores.device, compute_dtype)
        if lw.shape[1] != hq:
            lw = lw.repeat_interleave(group, dim=1)
        s = s + lw
    s = s.masked_fill(~ok.repeat_interleave(group, dim=1), float("-inf"))
    w = torch.softmax(s, dim=-1)
    v = _expand_group(values, group)  # [B, Hq, N, d]
    rows = v.gather(2, per_head[..., None].expand(-1, -1, -1, v.shape[-1]))
    return torch.einsum("bhr,bhrd->bhd", w, rows)
