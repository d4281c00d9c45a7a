"""S²ANTA-sys samples of the tokens off a top-``k`` set, for top-k + S²ANTA
(docs/algorithms.md section 10.4), in two launches split like ``triton_topk``'s score
pass, one of which walks the scores:

1. **Rest masses** (``sums="stats"``, the default): per split and query head the rest
   ``R = Σ p_i`` over the split's tokens off the top set (``p_i = e^{s_i − lse}``) with no
   pass over the scores: the score pass's stats give the split's whole mass
   ``l e^{m − lse}``, less the top tokens' own (the ``k`` listed ones that fall in the
   split, read by index): ``R = e^{m − lse} max(l − Σ_top e^{s_t − m}, 0)``, 0 where the
   top set holds every token of the split. ``sums="pass"`` sums the rest over every
   token instead (a walk over the scores; a token is in the set by the select's
   threshold test). Either's split-0 program clears the sample slots.
2. **Systematic samples**: with ``M = Σ R`` and one uniform ``u`` per head (Philox, the
   same in every split), sample ``m`` sits at ``(u + m) M / S`` on the running sum of the
   rest; split ``j`` owns the samples between its earlier splits' ``R`` and its own end
   (the same sums in every program, so the splits' ranges tile ``0 .. S − 1``). It walks
   its tokens' running sum ``C`` (from the earlier splits' ``R``): token ``i`` takes the
   samples ``m`` with ``C_{i−1} ≤ (u + m) M / S < C_i``, kept inside the split's range
   (ends taken as a running max, so that no slot is taken twice or skipped between two
   tokens), written at the head's slots ``m`` with log-weight ``log(M / S) + lse − s_i``,
   so that ``w_i e^{s_i} = M Z / S``. Slots of the range past the walk's end (its sum
   short of ``R`` by rounding) go to the split's last token of the rest. A head whose
   rest holds no mass keeps no sample (token ``-1``, log-weight ``-inf``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from santa_kernels.triton_topk import TopKSelect, _lse_of, _order_key
from santa_kernels.validate import InputError, check_positive_int

REST_BLOCK = 256  # tokens a step of the walks over the scores
REST_SUMS = "stats"  # RestSampler's default: the rest masses from the stats ("pass": a walk)
SUMS = ("stats", "pass")
TOP_BLOCK = 512  # listed top tokens a step of the rest masses from the stats
FIXED = tl.constexpr(2.0**40)  # the top tokens' sum in units of 2^-40 of the split's max term
NUM_WARPS = 4


@triton.jit
def _rest_probs(s_rows, mass_row, tok, inside, n, lse, mask_g, thr, last_tie,
                HAS_TOP: tl.constexpr):
    """``[BLOCK_G, BLOCK]`` probabilities of tokens ``tok`` off the top set (0 on it,
    past the length or outside the split) and their scores."""
    ok = inside & (tok < n)
    # the scores' load does not wait for the mass (a token of the set is read, then
    # dropped): one memory round trip a block, not two
    s = tl.load(s_rows + tok[None, :], mask=mask_g[:, None] & ok[None, :],
                other=float("-inf"))
    if HAS_TOP:
        key = _order_key(tl.load(mass_row + tok, mask=ok, other=0.0))
        chosen = (key > thr) | ((key == thr) & (tok <= last_tie))
        s = tl.where(chosen[None, :], float("-inf"), s)
    return tl.exp(s - lse[:, None]), s


@triton.jit
def _clear_slots(rows_ptr, lw_ptr, b, kv_head, heads, offs_g, mask_g, stride_rb, stride_rh,
                 stride_wb, stride_wh, K: tl.constexpr, S: tl.constexpr,
                 BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr):
    """Token ``-1`` and log-weight ``-inf`` in every sample slot of the group's heads."""
    for m0 in range(0, S, BLOCK_S):
        m = m0 + tl.arange(0, BLOCK_S)
        col = K + offs_g[:, None] * S + m[None, :]
        ok = mask_g[:, None] & (m < S)[None, :]
        tl.store(rows_ptr + b * stride_rb + kv_head * stride_rh + col,
                 tl.full([BLOCK_G, BLOCK_S], -1, tl.int32), mask=ok)
        tl.store(lw_ptr + b * stride_wb + heads[:, None] * stride_wh + col,
                 tl.full([BLOCK_G, BLOCK_S], float("-inf"), tl.float32), mask=ok)


@triton.jit
def _rest_stats_kernel(
    s_ptr, m_ptr, l_ptr, lengths_ptr, rest_ptr, rows_ptr, lw_ptr, capacity, num_splits,
    tokens_per_split, stride_sb, stride_sh, stride_rb, stride_rh, stride_wb, stride_wh,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    SPLITS_PAD: tl.constexpr, K: tl.constexpr, S: tl.constexpr, BLOCK_S: tl.constexpr,
    TOP: tl.constexpr, HAS_TOP: tl.constexpr,
):
    """Per split and head, the rest's mass from the score pass's stats less the listed
    top tokens of the split (``TOP`` of the list a step)."""
    split = tl.program_id(0)
    pid = tl.program_id(1)  # b * Hkv + g
    b = pid // NUM_KV_HEADS
    kv_head = pid % NUM_KV_HEADS
    offs_g = tl.arange(0, BLOCK_G)
    mask_g = offs_g < GROUP
    heads = kv_head * GROUP + offs_g
    rows = b * (NUM_KV_HEADS * GROUP) + heads
    n = tl.load(lengths_ptr + b).to(tl.int32)
    lse = tl.where(mask_g, _lse_of(m_ptr, l_ptr, rows, mask_g, num_splits, SPLITS_PAD), 0.0)
    at = rows * num_splits + split
    m = tl.load(m_ptr + at, mask=mask_g, other=float("-inf"))
    whole = tl.load(l_ptr + at, mask=mask_g, other=0.0)  # Σ e^{s − m} over the split
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    lo = split * tokens_per_split
    hi = tl.minimum(lo + tokens_per_split, capacity)
    valid = tl.maximum(tl.minimum(hi, n) - lo, 0)  # the split's tokens within the length
    # the top tokens' Σ e^{s − m} (each in [0, 1]) in fixed point: an exact sum, the same
    # whatever order the select listed them in
    own = tl.zeros([BLOCK_G], tl.int64)
    taken = 0
    if HAS_TOP:
        top_row = rows_ptr + b * stride_rb + kv_head * stride_rh
        s_rows = s_ptr + b.to(tl.int64) * stride_sb + heads[:, None] * stride_sh
        for j0 in range(0, K, TOP):
            j = j0 + tl.arange(0, TOP)
            tok = tl.load(top_row + j, mask=j < K, other=-1)
            mine = (tok >= lo) & (tok < hi)  # a -1 (no token) is below every split
            s = tl.load(s_rows + tok[None, :], mask=mask_g[:, None] & mine[None, :],
                        other=float("-inf"))
            own += tl.sum((tl.exp(s - m_safe[:, None]) * FIXED).to(tl.int64), axis=1)
            taken += tl.sum(mine.to(tl.int32), axis=0)
    rest = tl.exp(m_safe - lse) * tl.maximum(whole - own.to(tl.float32) / FIXED, 0.0)
    rest = tl.where((m > float("-inf")) & (taken < valid), rest, 0.0)
    tl.store(rest_ptr + at, rest, mask=mask_g)
    if split == 0:  # clear the heads' sample slots (a slot no token takes stays empty)
        _clear_slots(rows_ptr, lw_ptr, b, kv_head, heads, offs_g, mask_g, stride_rb,
                     stride_rh, stride_wb, stride_wh, K, S, BLOCK_G, BLOCK_S)


@triton.jit
def _rest_sum_kernel(
    s_ptr, m_ptr, l_ptr, lengths_ptr, mass_ptr, thr_key_ptr, thr_tok_ptr, rest_ptr,
    rows_ptr, lw_ptr, capacity, num_splits, tokens_per_split, stride_sb, stride_sh,
    stride_rb, stride_rh, stride_wb, stride_wh,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    SPLITS_PAD: tl.constexpr, K: tl.constexpr, S: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK: tl.constexpr, HAS_TOP: tl.constexpr,
):
    """Per split and head, the rest's mass summed over the split's tokens (``sums="pass"``)."""
    split = tl.program_id(0)
    pid = tl.program_id(1)  # b * Hkv + g
    b = pid // NUM_KV_HEADS
    kv_head = pid % NUM_KV_HEADS
    offs_g = tl.arange(0, BLOCK_G)
    mask_g = offs_g < GROUP
    heads = kv_head * GROUP + offs_g
    rows = b * (NUM_KV_HEADS * GROUP) + heads
    n = tl.load(lengths_ptr + b).to(tl.int32)
    lse = tl.where(mask_g, _lse_of(m_ptr, l_ptr, rows, mask_g, num_splits, SPLITS_PAD), 0.0)
    thr = tl.load(thr_key_ptr + pid).to(tl.uint32, bitcast=True)
    last_tie = tl.load(thr_tok_ptr + pid)
    s_rows = s_ptr + b.to(tl.int64) * stride_sb + heads[:, None] * stride_sh
    mass_row = mass_ptr + pid.to(tl.int64) * capacity
    lo = split * tokens_per_split
    hi = tl.minimum(lo + tokens_per_split, capacity)
    offs = tl.arange(0, BLOCK)
    total = tl.zeros([BLOCK_G], tl.float32)
    for t0 in range(lo, hi, BLOCK):
        tok = t0 + offs
        p, _ = _rest_probs(s_rows, mass_row, tok, tok < hi, n, lse, mask_g, thr, last_tie,
                           HAS_TOP)
        total += tl.sum(p, axis=1)
    tl.store(rest_ptr + rows * num_splits + split, total, mask=mask_g)
    if split == 0:  # clear the heads' sample slots (a slot no token takes stays empty)
        _clear_slots(rows_ptr, lw_ptr, b, kv_head, heads, offs_g, mask_g, stride_rb,
                     stride_rh, stride_wb, stride_wh, K, S, BLOCK_G, BLOCK_S)


@triton.jit
def _systematic_kernel(
    s_ptr, m_ptr, l_ptr, lengths_ptr, mass_ptr, thr_key_ptr, thr_tok_ptr, rest_ptr,
    rows_ptr, lw_ptr, rng_ptr, seed, capacity, num_splits, tokens_per_split,
    stride_sb, stride_sh, stride_rb, stride_rh, stride_wb, stride_wh,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    SPLITS_PAD: tl.constexpr, K: tl.constexpr, S: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK: tl.constexpr, HAS_TOP: tl.constexpr,
):
    split = tl.program_id(0)
    pid = tl.program_id(1)  # b * Hkv + g
    b = pid // NUM_KV_HEADS
    kv_head = pid % NUM_KV_HEADS
    offs_g = tl.arange(0, BLOCK_G)
    mask_g = offs_g < GROUP
    heads = kv_head * GROUP + offs_g
    rows = b * (NUM_KV_HEADS * GROUP) + heads
    n = tl.load(lengths_ptr + b).to(tl.int32)
    lse = tl.where(mask_g, _lse_of(m_ptr, l_ptr, rows, mask_g, num_splits, SPLITS_PAD), 0.0)
    thr = tl.load(thr_key_ptr + pid).to(tl.uint32, bitcast=True)
    last_tie = tl.load(thr_tok_ptr + pid)
    # M, the rest before this split and through it, from the rest masses: every program
    # sums them alike, so a split's end is bitwise the next one's start
    offs_s = tl.arange(0, SPLITS_PAD)
    r = tl.load(rest_ptr + rows[:, None] * num_splits + offs_s[None, :],
                mask=mask_g[:, None] & (offs_s < num_splits)[None, :], other=0.0)
    mass_total = _sum_before(r, offs_s, num_splits)
    run = _sum_before(r, offs_s, split)
    live = mask_g & (mass_total > 0)
    per_sample = tl.where(live, S / tl.where(live, mass_total, 1.0), 0.0)  # S / M
    u = tl.rand(seed, (tl.load(rng_ptr) << 32) + rows.to(tl.int64))
    # the split's samples: [first, last)
    first = _slots_below(run, mass_total, per_sample, u, S)
    last = _slots_below(_sum_before(r, offs_s, split + 1), mass_total, per_sample, u, S)
    log_w0 = tl.log(tl.where(live, mass_total, 1.0) / S) + lse  # log(M / S) + lse
    s_rows = s_ptr + b.to(tl.int64) * stride_sb + heads[:, None] * stride_sh
    mass_row = mass_ptr + pid.to(tl.int64) * capacity
    row_list = rows_ptr + b * stride_rb + kv_head * stride_rh + K + offs_g[:, None] * S
    lw_list = lw_ptr + b * stride_wb + heads[:, None] * stride_wh + K + offs_g[:, None] * S
    lo = split * tokens_per_split
    hi = tl.minimum(lo + tokens_per_split, capacity)
    offs = tl.arange(0, BLOCK)
    taken = first  # [BLOCK_G] the slots the split's tokens took so far end here
    last_tok = tl.full([BLOCK_G], -1, tl.int32)  # the split's last token of the rest
    for t0 in range(lo, hi, BLOCK):
        tok = t0 + offs
        p, s = _rest_probs(s_rows, mass_row, tok, tok < hi, n, lse, mask_g, thr, last_tie,
                           HAS_TOP)
        c = run[:, None] + tl.cumsum(p, axis=1)
        rest = live[:, None] & (p > 0)
        # a token's samples end at N(C_i) = #{m: (u + m) M / S < C_i}, kept in the
        # split's range, and start where the rest's earlier tokens' end (a running max,
        # so a rounding of C between two tokens neither repeats nor skips a slot)
        end = _samples_below(c, per_sample[:, None], u[:, None], S)
        end = tl.minimum(tl.maximum(end, first[:, None]), last[:, None])
        none = tl.full([BLOCK_G, BLOCK], -1, tl.int32)
        start, end = tl.associative_scan((none, tl.where(rest, end, none)), 1, _max_before)
        start = tl.maximum(start, taken[:, None])
        end = tl.maximum(end, taken[:, None])
        count = end - start
        log_w = log_w0[:, None] - s
        tok2 = tl.broadcast_to(tok[None, :], [BLOCK_G, BLOCK])
        for extra in range(0, tl.max(tl.max(count, axis=1), axis=0)):
            take = count > extra
            tl.store(row_list + start + extra, tok2, mask=take)
            tl.store(lw_list + start + extra, log_w, mask=take)
        taken = tl.max(end, axis=1)
        last_tok = tl.maximum(last_tok, tl.max(tl.where(rest, tok2, -1), axis=1))
        run = tl.maximum(run, tl.max(c, axis=1))
    # the range's slots past the walk's end (its running sum short of the split's mass by
    # rounding) go to the split's last token of the rest
    spare = tl.where(last_tok >= 0, last - taken, 0)
    if tl.max(spare, axis=0) > 0:
        s_last = tl.load(s_ptr + b.to(tl.int64) * stride_sb + heads * stride_sh
                         + tl.maximum(last_tok, 0), mask=spare > 0, other=0.0)
        for m0 in range(0, S, BLOCK_S):
            m = m0 + tl.arange(0, BLOCK_S)
            fill = ((m[None, :] >= taken[:, None]) & (m[None, :] < last[:, None])
                    & (spare > 0)[:, None])
            tl.store(row_list + m[None, :],
                     tl.broadcast_to(last_tok[:, None], [BLOCK_G, BLOCK_S]), mask=fill)
            tl.store(lw_list + m[None, :],
                     tl.broadcast_to((log_w0 - s_last)[:, None], [BLOCK_G, BLOCK_S]),
                     mask=fill)


@triton.jit
def _sum_before(r, offs_s, upto):
    """``[BLOCK_G]``: the rest masses ``r [BLOCK_G, SPLITS_PAD]`` of the splits below
    ``upto`` (one reduction, so equal inputs sum to bitwise equal results)."""
    return tl.sum(tl.where((offs_s < upto)[None, :], r, 0.0), axis=1)


@triton.jit
def _max_before(a_before, a_max, b_before, b_max):
    """Combine of a scan whose result is (max of the earlier entries, max through)."""
    return tl.maximum(a_max, b_before), tl.maximum(a_max, b_max)


@triton.jit
def _samples_below(x, per_sample, u, S: tl.constexpr):
    """int32: samples ``m`` with ``(u + m) M / S < x`` (``per_sample = S / M``)."""
    t = tl.minimum(tl.maximum(x * per_sample - u, 0.0), S * 1.0)
    whole = t.to(tl.int32)
    return tl.where(whole.to(tl.float32) < t, whole + 1, whole)


@triton.jit
def _slots_below(x, mass_total, per_sample, u, S: tl.constexpr):
    """``[BLOCK_G]`` samples below ``x`` on the rest's running sum: all ``S`` from ``M``
    on (so the last split with mass ends at ``S`` whatever ``M · S / M`` rounds to)."""
    return tl.where(x >= mass_total, S, _samples_below(x, per_sample, u, S))


class RestSampler:
    """The two launches of the rest's systematic samples over a :class:`TopKSelect`'s
    stash (``k`` its top set's size, 0 for none; ``S`` samples per query head)."""

    def __init__(self, top: TopKSelect, k: int, S: int, *, block: int = REST_BLOCK,
                 sums: str = REST_SUMS) -> None:
        """``block``: tokens a step of the walks (``REST_BLOCK`` by default); ``sums``:
        the rest masses from the score pass's stats (``"stats"``) or from a walk over
        the scores (``"pass"``; ``REST_SUMS`` by default)."""
        check_positive_int(block, "block")
        if sums not in SUMS:
            raise InputError(f"sums: expected one of {', '.join(SUMS)}, got {sums!r}")
        self.top, self.k, self.S, self.block, self.sums = top, k, S, block, sums
        self.rest = torch.empty(top.batch * top.num_q_heads * top.splits, dtype=torch.float32,
                                device=top.scores.device)

    def run(self, kv, rows: torch.Tensor, log_weights: torch.Tensor, rng: torch.Tensor,
            seed: int) -> None:
        """Writes each head's samples into ``rows [B, Hkv, k + G S]`` (head ``j``'s at
        ``k + j S``; the top set's ``k`` first, read when ``sums="stats"``) and their
        log-weights into ``log_weights [B, Hq, k + G S]``."""
        top = self.top
        common = dict(
            NUM_KV_HEADS=top.num_kv_heads, GROUP=top.group,
            BLOCK_G=triton.next_power_of_2(top.group),
            SPLITS_PAD=max(2, triton.next_power_of_2(top.splits)), K=self.k, S=self.S,
            BLOCK_S=min(128, triton.next_power_of_2(self.S)), HAS_TOP=self.k > 0,
            num_warps=NUM_WARPS,
        )  # fmt: skip
        grid = (top.splits, top.batch * top.num_kv_heads)
        strides = (top.scores.stride(0), top.scores.stride(1), rows.stride(0), rows.stride(1),
                   log_weights.stride(0), log_weights.stride(1))
        # split like the score pass (its stats' splits), whatever the select's span
        span = top.tiles_per_split * top.block_n
        if self.sums == "stats":
            _rest_stats_kernel[grid](
                top.scores, top.stat_m, top.stat_l, kv.lengths, self.rest, rows, log_weights,
                top.capacity, top.splits, span, *strides,
                TOP=min(TOP_BLOCK, triton.next_power_of_2(max(self.k, 1))), **common,
            )  # fmt: skip
        head = (top.scores, top.stat_m, top.stat_l, kv.lengths, top.mass, top.thr_key,
                top.thr_tok, self.rest, rows, log_weights)
        if self.sums == "pass":
            _rest_sum_kernel[grid](
                *head, top.capacity, top.splits, span, *strides, BLOCK=self.block, **common,
            )  # fmt: skip
        _systematic_kernel[grid](
            *head, rng, seed, top.capacity, top.splits, span, *strides, BLOCK=self.block,
            **common,
        )  # fmt: skip
