"""triton-topk: the score pass and the exact top-``k`` select of the selection methods
(docs/algorithms.md section 10), in four launches split alike over the tokens and no
torch op over the tokens.

1. **Score pass** (:meth:`TopKSelect.run_scores`): ``τ q·k`` of every cached token for
   every query head, written once (fp32 ``[B, Hq, capacity]``, ``-inf`` past each
   length), and per split of the tokens each head's running max and sum of exponentials
   (the stats), so the softmax's normaliser ``lse`` needs no second pass over the scores.
2. **Mass and histogram** (:meth:`TopKSelect.run_select`, split in spans of
   ``select_span`` tokens, by default the score pass's split): per
   (sequence, KV head) the group's summed probabilities ``Σ_h e^{s_h − lse_h}`` (written,
   fp32, ``-1`` on tokens not allowed) and a histogram of the top byte of their
   order-preserving key (the float's bits, sign flipped); per query head (``per_head``)
   the key is the score itself and nothing is written. Each program merges the score
   pass's per-split stats into ``lse``; the split-0 program writes ``lse [B, Hq]``.
3. **Second byte** (split alike): the histogram gives the top byte ``b1`` of the
   ``k``-th key; each split counts its allowed tokens above ``b1`` and histograms the
   second byte of those in ``b1`` (kept per split as counts at or above each value, and
   added to the row's).
4. **Writes** (split alike): with the top two bytes ``P`` of the ``k``-th key, each split
   writes its tokens above ``P`` after the earlier splits' ones (their counts from 3)
   and lists those under ``P`` (the candidates) after the earlier splits' candidates;
   the row's last program to finish (an arrival counter) takes two histograms of the
   candidates (the last two bytes: the exact key ``T``), writes those above ``T``, then
   those equal to ``T`` in token order until ``k`` are chosen, and ``-1`` fills the rest.
   A token is chosen exactly when ``key > T`` or ``key = T`` and ``token ≤ last tie``
   (both stored), which later kernels test without a list.

``TopKSelect(spread=False)`` (default ``SPREAD_SELECT``) runs 3 and 4 as the former
select instead: one program per (sequence, selecting head) walks every token (the same
tokens, threshold and last tie). ``TopKSelect(select_span=N)`` (default ``SELECT_SPAN``)
gives each program of launches 2 to 4 at most ``N`` tokens (a power of two, at least the
mass kernel's step; the score pass's span where that is shorter): more programs with fewer
serial steps each (the same tokens, threshold and last tie). The mass kernel still
merges the score pass's per-split stats.

Static shapes (the capacity, never the lengths), no host sync, graph capturable: the
histograms and the arrival counts are zeroed by the last program after use, so they start
each call at zero.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from santa_kernels.kv import KVCache
from santa_kernels.triton_indexed import SCORE_BLOCK_N, _row_offsets, _static_for
from santa_kernels.triton_splitkv import _mma, choose_num_splits, kv_capacity, num_sms
from santa_kernels.validate import InputError, check_positive_int

HIST_BINS = 256  # buckets of a level: one byte of the key (the histogram's cost grows with them)
SCORE_PROGRAMS_PER_SM = 4  # the score pass's programs per SM its split count aims for
# tokens a step of the mass kernel (256: 14 us slower at 32/8/128, 32k, B=8 on an H100;
# results/h100/2026-12-07-h100-kernels-floor-32k-three-shapes, profile-topk-launches.md)
MASS_BLOCK = 512
SELECT_BLOCK = 2048  # tokens a step of the select kernel (one program walks them all)
SPREAD_BLOCK = 1024  # tokens (or candidates) a step of the spread select's kernels
SPREAD_SELECT = True  # TopKSelect's default: split like the score pass (False: one program a row)
# TopKSelect's default select_span: at most this many tokens per program of the mass,
# second-byte and write kernels (None: the score pass's span, so the select is split like
# it; 2048: the select 69.1 -> 64.2 us at 32/8/128, 32k, B=8 on an H100, profile-topk.md of
# results/h100/2026-12-07-h100-kernels-floor-32k-every-method)
SELECT_SPAN = 2048
# TopKSelect's default l2_hints: the score pass loads K evict-first and stores the scores
# evict-last (L2), so the mass kernel's read of them may hit L2
SCORE_L2_HINTS = False
# TopKSelect's default finish_launch: the spread select's candidates resolved by the write
# kernel's last program a row (False) or by a launch of their own, one program a row (True)
FINISH_LAUNCH = False
NUM_WARPS = 4
SELECT_WARPS = 8


@triton.jit
def _order_key(x):
    """uint32 keys in the order of the fp32 values ``x`` (sign bit flipped, negatives
    inverted)."""
    u = x.to(tl.uint32, bitcast=True)
    return tl.where((u >> 31) == 1, ~u, u | 0x80000000)


@triton.jit
def _masked_histogram(bins, ok, NUM_BINS: tl.constexpr):
    """Histogram of ``bins`` where ``ok`` (``tl.histogram`` without its newer mask)."""
    h = tl.histogram(tl.where(ok, bins, 0), NUM_BINS)
    bad = tl.sum(tl.where(ok, 0, 1), axis=0)
    return h - tl.where(tl.arange(0, NUM_BINS) == 0, bad, 0)


@triton.jit
def _bucket_of(h, need, NUM_BINS: tl.constexpr):
    """The bucket holding the ``need``-th largest key of histogram ``h`` (0 when ``h``
    holds fewer) and the count of keys in higher buckets."""
    idx = tl.arange(0, NUM_BINS)
    at_least = tl.sum(h, axis=0) - tl.cumsum(h, axis=0) + h  # keys in buckets >= idx
    bucket = tl.max(tl.where(at_least >= need, idx, 0), axis=0)
    above = tl.sum(tl.where(idx > bucket, h, 0), axis=0)
    return bucket, above


@triton.jit
def _score_stats_kernel(
    q_ptr, k_ptr, lengths_ptr, page_table_ptr, s_ptr, m_ptr, l_ptr, rng_ptr, st_ptr,
    tau, capacity, tiles_per_split, num_splits,
    stride_qb, stride_qh, stride_kblk, stride_kn, stride_kh, stride_ptb, stride_sb, stride_sh,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr, DOT_PRECISION: tl.constexpr, WIDEN_BF16: tl.constexpr,
    BUMP: tl.constexpr, K_EVICTION: tl.constexpr, S_EVICTION: tl.constexpr,
    TOKEN_COPY: tl.constexpr, GROUP_PAD: tl.constexpr,
):
    split = tl.program_id(0)
    pid = tl.program_id(1)
    if BUMP:  # the caller's step counter advances here, not in a launch of its own
        first = (split == 0) & (pid == 0)
        tl.store(rng_ptr, tl.load(rng_ptr, mask=first, other=0) + 1, mask=first)
    b = pid // NUM_KV_HEADS
    kv_head = pid % NUM_KV_HEADS
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM)
    mask_h = offs_h < GROUP
    heads = kv_head * GROUP + offs_h
    seq_len = tl.load(lengths_ptr + b).to(tl.int32)
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_h[:, None], other=0.0).to(k_ptr.dtype.element_ty)
    if PAGED:
        k_base = k_ptr + kv_head * stride_kh
    else:
        k_base = k_ptr + b.to(tl.int64) * stride_kblk + kv_head * stride_kh
    page_row = page_table_ptr + b * stride_ptb
    s_rows = s_ptr + b.to(tl.int64) * stride_sb + heads[:, None] * stride_sh
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    lo = split * tiles_per_split * BLOCK_N
    hi = tl.minimum(lo + tiles_per_split * BLOCK_N, capacity)
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        ok = offs_n < seq_len
        row_off = _row_offsets(page_row, offs_n, ok, stride_kblk, stride_kn, PAGED, PAGE_SIZE)
        # with L2 hints K streams past ("evict_first") and the scores stay in L2 for the
        # mass kernel ("evict_last"); "" is the default policy
        k = tl.load(k_base + row_off[:, None] + offs_d[None, :], mask=ok[:, None], other=0.0,
                    eviction_policy=K_EVICTION)
        s = _mma(q, tl.trans(k), None, DOT_PRECISION, WIDEN_BF16) * tau
        s = tl.where(ok[None, :], s, float("-inf"))
        tl.store(s_rows + offs_n[None, :], s, mask=mask_h[:, None] & (offs_n < hi)[None, :],
                 eviction_policy=S_EVICTION)
        if TOKEN_COPY:  # the group's GROUP_PAD scores of a token side by side (-inf padded)
            tl.store(st_ptr + (pid.to(tl.int64) * capacity + offs_n[None, :]) * GROUP_PAD
                     + offs_h[:, None], tl.where(mask_h[:, None], s, float("-inf")),
                     mask=(offs_h < GROUP_PAD)[:, None] & (offs_n < hi)[None, :])
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        l_i = l_i * tl.exp(m_i - m_safe) + tl.sum(tl.exp(s - m_safe[:, None]), axis=1)
        m_i = m_new
    row = (b * (NUM_KV_HEADS * GROUP) + heads) * num_splits + split
    tl.store(m_ptr + row, m_i, mask=mask_h)
    tl.store(l_ptr + row, l_i, mask=mask_h)


@triton.jit
def _lse_of(m_ptr, l_ptr, rows, mask_h, num_splits, SPLITS_PAD: tl.constexpr):
    """``[BLOCK_G]`` log-sum-exp of the heads' scores from their per-split stats."""
    offs_s = tl.arange(0, SPLITS_PAD)
    at = rows[:, None] * num_splits + offs_s[None, :]
    ok = mask_h[:, None] & (offs_s < num_splits)[None, :]
    m = tl.load(m_ptr + at, mask=ok, other=float("-inf"))
    l_s = tl.load(l_ptr + at, mask=ok, other=0.0)
    top = tl.max(m, axis=1)
    top_safe = tl.where(top == float("-inf"), 0.0, top)
    total = tl.sum(l_s * tl.exp(m - top_safe[:, None]), axis=1)
    return top_safe + tl.log(tl.where(total > 0, total, 1.0))


@triton.jit
def _mass_hist_kernel(
    s_ptr, m_ptr, l_ptr, lengths_ptr, mass_ptr, lse_ptr, hist_ptr,
    capacity, num_splits, tokens_per_split, stride_sb, stride_sh,
    NUM_SEL: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    SPLITS_PAD: tl.constexpr, BLOCK: tl.constexpr, PER_HEAD: tl.constexpr,
    SINK: tl.constexpr, WINDOW: tl.constexpr, NUM_BINS: tl.constexpr,
):
    split = tl.program_id(0)
    pid = tl.program_id(1)  # b * NUM_SEL + selecting head
    b = pid // NUM_SEL
    sel = pid % NUM_SEL
    n = tl.load(lengths_ptr + b).to(tl.int32)
    t_lo = tl.minimum(n, SINK)
    t_hi = tl.maximum(n - WINDOW, t_lo)
    lo = split * tokens_per_split
    hi = tl.minimum(lo + tokens_per_split, capacity)
    offs = tl.arange(0, BLOCK)
    hist = tl.zeros([NUM_BINS], tl.int32)
    if PER_HEAD:
        s_row = s_ptr + b.to(tl.int64) * stride_sb + sel * stride_sh
        for t0 in range(lo, hi, BLOCK):
            tok = t0 + offs
            inside = tok < hi
            s = tl.load(s_row + tok, mask=inside, other=float("-inf"))
            ok = (tok >= t_lo) & (tok < t_hi)
            s = tl.where(ok, s, float("-inf"))
            hist += _masked_histogram((_order_key(s) >> 24).to(tl.int32), inside, NUM_BINS)
    else:
        offs_g = tl.arange(0, BLOCK_G)
        mask_g = offs_g < GROUP
        heads = sel * GROUP + offs_g
        rows = b * (NUM_SEL * GROUP) + heads
        lse = _lse_of(m_ptr, l_ptr, rows, mask_g, num_splits, SPLITS_PAD)
        if split == 0:
            tl.store(lse_ptr + rows, lse, mask=mask_g)
        lse = tl.where(mask_g, lse, 0.0)
        s_rows = s_ptr + b.to(tl.int64) * stride_sb + heads[:, None] * stride_sh
        mass_row = mass_ptr + pid.to(tl.int64) * capacity
        for t0 in range(lo, hi, BLOCK):
            tok = t0 + offs
            inside = tok < hi
            ok = (tok >= t_lo) & (tok < t_hi)
            s = tl.load(s_rows + tok[None, :], mask=mask_g[:, None] & (inside & ok)[None, :],
                        other=float("-inf"))
            mass = tl.sum(tl.exp(s - lse[:, None]), axis=0)
            mass = tl.where(ok, mass, -1.0)
            tl.store(mass_row + tok, mass, mask=inside)
            hist += _masked_histogram((_order_key(mass) >> 24).to(tl.int32), inside, NUM_BINS)
    bins = tl.arange(0, NUM_BINS)
    tl.atomic_add(hist_ptr + pid * NUM_BINS + bins, hist, mask=hist != 0)


@triton.jit
def _select_kernel(
    v_ptr, hist_ptr, lengths_ptr, cand_ptr, out_ptr, thr_key_ptr,
    thr_tok_ptr, capacity, stride_vb, stride_vh, stride_ob, stride_oh,
    K: tl.constexpr, NUM_SEL: tl.constexpr, GROUP: tl.constexpr, PER_HEAD: tl.constexpr,
    SINK: tl.constexpr, WINDOW: tl.constexpr, NUM_BINS: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)  # b * NUM_SEL + selecting head
    b = pid // NUM_SEL
    sel = pid % NUM_SEL
    n = tl.load(lengths_ptr + b).to(tl.int32)
    t_lo = tl.minimum(n, SINK)
    t_hi = tl.maximum(n - WINDOW, t_lo)
    v_row = v_ptr + b.to(tl.int64) * stride_vb + sel * stride_vh
    if PER_HEAD:  # head h of KV head g writes its own segment of g's row list
        out_row = out_ptr + b * stride_ob + (sel // GROUP) * stride_oh + (sel % GROUP) * K
    else:
        out_row = out_ptr + b * stride_ob + sel * stride_oh
    cand_row = cand_ptr + pid.to(tl.int64) * capacity
    bins = tl.arange(0, NUM_BINS)
    hist_at = hist_ptr + pid * NUM_BINS + bins
    h1 = tl.load(hist_at)
    tl.debug_barrier()
    tl.store(hist_at, tl.zeros([NUM_BINS], tl.int32))  # zero for the next call
    b1, above = _bucket_of(h1, K, NUM_BINS)
    need = K - above
    offs = tl.arange(0, BLOCK)
    # tokens of higher buckets are chosen; the bucket's own are the candidates
    written = 0
    n_cand = 0
    for t0 in range(0, capacity, BLOCK):
        tok = t0 + offs
        ok = (tok >= t_lo) & (tok < t_hi)
        top = (_order_key(tl.load(v_row + tok, mask=ok, other=0.0)) >> 24).to(tl.int32)
        take = ok & (top > b1)
        cand = ok & (top == b1)
        take_i = take.to(tl.int32)
        cand_i = cand.to(tl.int32)
        tl.store(out_row + written + tl.cumsum(take_i, axis=0) - 1, tok, mask=take)
        tl.store(cand_row + n_cand + tl.cumsum(cand_i, axis=0) - 1, tok, mask=cand)
        written += tl.sum(take_i, axis=0)
        n_cand += tl.sum(cand_i, axis=0)
    tl.debug_barrier()  # the candidates are visible to the passes below
    # the next three bytes of the k-th key, each from a histogram of the candidates
    # that share the bytes found so far
    thr = b1.to(tl.uint32)
    for level in tl.static_range(3):
        h = tl.zeros([NUM_BINS], tl.int32)
        for c0 in range(0, n_cand, BLOCK):
            at = c0 + offs
            ok = at < n_cand
            tok = tl.load(cand_row + at, mask=ok, other=0)
            key = _order_key(tl.load(v_row + tok, mask=ok, other=0.0))
            ok = ok & ((key >> (24 - 8 * level)) == thr)
            h += _masked_histogram(((key >> (16 - 8 * level)) & 255).to(tl.int32), ok,
                                   NUM_BINS)
        byte, above = _bucket_of(h, need, NUM_BINS)
        need -= above
        thr = (thr << 8) | byte.to(tl.uint32)
    # need: ties at the threshold still to take, in token order
    ties = 0
    last_tie = -1
    for c0 in range(0, n_cand, BLOCK):
        at = c0 + offs
        ok = at < n_cand
        tok = tl.load(cand_row + at, mask=ok, other=0)
        key = _order_key(tl.load(v_row + tok, mask=ok, other=0.0))
        tie = ok & (key == thr)
        tie_i = tie.to(tl.int32)
        tie = tie & (ties + tl.cumsum(tie_i, axis=0) <= need)
        take = (ok & (key > thr)) | tie
        take_i = take.to(tl.int32)
        tl.store(out_row + written + tl.cumsum(take_i, axis=0) - 1, tok, mask=take)
        written += tl.sum(take_i, axis=0)
        ties += tl.sum(tie_i, axis=0)
        last_tie = tl.maximum(last_tie, tl.max(tl.where(tie, tok, -1), axis=0))
    for j0 in range(0, K, BLOCK):
        j = j0 + offs
        tl.store(out_row + j, tl.full([BLOCK], -1, tl.int32), mask=(j >= written) & (j < K))
    tl.store(thr_key_ptr + pid, thr.to(tl.int32, bitcast=True))
    tl.store(thr_tok_ptr + pid, last_tie)


@triton.jit
def _allowed_range(lengths_ptr, b, SINK: tl.constexpr, WINDOW: tl.constexpr):
    """``[t_lo, t_hi)``: the tokens of sequence ``b`` a select may take."""
    n = tl.load(lengths_ptr + b).to(tl.int32)
    t_lo = tl.minimum(n, SINK)
    return t_lo, tl.maximum(n - WINDOW, t_lo)


@triton.jit
def _second_byte_kernel(
    v_ptr, hist_ptr, hist2_ptr, lengths_ptr, above_ptr, cum_ptr,
    capacity, num_splits, tokens_per_split, stride_vb, stride_vh,
    K: tl.constexpr, NUM_SEL: tl.constexpr, SINK: tl.constexpr, WINDOW: tl.constexpr,
    NUM_BINS: tl.constexpr, BLOCK: tl.constexpr,
):
    """Per split of a row: the allowed tokens above the ``K``-th key's top byte ``b1``
    (counted), and a histogram of the second byte of those in ``b1`` (kept per split as
    counts at or above each byte, and added to the row's)."""
    split = tl.program_id(0)
    pid = tl.program_id(1)  # b * NUM_SEL + selecting head
    b = pid // NUM_SEL
    sel = pid % NUM_SEL
    t_lo, t_hi = _allowed_range(lengths_ptr, b, SINK, WINDOW)
    v_row = v_ptr + b.to(tl.int64) * stride_vb + sel * stride_vh
    bins = tl.arange(0, NUM_BINS)
    b1, _ = _bucket_of(tl.load(hist_ptr + pid * NUM_BINS + bins), K, NUM_BINS)
    lo = split * tokens_per_split
    hi = tl.minimum(lo + tokens_per_split, capacity)
    offs = tl.arange(0, BLOCK)
    greater = 0
    h = tl.zeros([NUM_BINS], tl.int32)
    for t0 in range(lo, hi, BLOCK):
        tok = t0 + offs
        ok = (tok < hi) & (tok >= t_lo) & (tok < t_hi)
        key = _order_key(tl.load(v_row + tok, mask=ok, other=0.0))
        top = (key >> 24).to(tl.int32)
        greater += tl.sum((ok & (top > b1)).to(tl.int32), axis=0)
        h += _masked_histogram(((key >> 16) & 255).to(tl.int32), ok & (top == b1), NUM_BINS)
    row = pid * num_splits + split
    tl.store(above_ptr + row, greater)
    tl.store(cum_ptr + row * NUM_BINS + bins, tl.sum(h, axis=0) - tl.cumsum(h, axis=0) + h)
    tl.atomic_add(hist2_ptr + pid * NUM_BINS + bins, h, mask=h != 0)


@triton.jit
def _spread_write_kernel(
    v_ptr, hist_ptr, hist2_ptr, lengths_ptr, above_ptr, cum_ptr, cand_ptr, arrive_ptr,
    out_ptr, thr_key_ptr, thr_tok_ptr, capacity, num_splits, tokens_per_split,
    stride_vb, stride_vh, stride_ob, stride_oh,
    K: tl.constexpr, NUM_SEL: tl.constexpr, GROUP: tl.constexpr, PER_HEAD: tl.constexpr,
    SINK: tl.constexpr, WINDOW: tl.constexpr, NUM_BINS: tl.constexpr,
    SPLITS_PAD: tl.constexpr, BLOCK: tl.constexpr, FINISH_HERE: tl.constexpr,
):
    """Per split of a row, with the top two bytes ``P`` of the ``K``-th key: writes the
    allowed tokens whose key is above ``P`` (at the count of earlier splits' ones) and
    lists those under ``P`` (the candidates, in token order across the splits); with
    ``FINISH_HERE`` the row's last program to finish resolves the candidates
    (:func:`_finish_row`), else :func:`_spread_finish_kernel` does, launched after."""
    split = tl.program_id(0)
    pid = tl.program_id(1)  # b * NUM_SEL + selecting head
    b = pid // NUM_SEL
    t_lo, t_hi = _allowed_range(lengths_ptr, b, SINK, WINDOW)
    v_row, out_row, cand_row = _spread_rows(v_ptr, out_ptr, cand_ptr, pid, capacity,
                                            stride_vb, stride_vh, stride_ob, stride_oh,
                                            K, NUM_SEL, GROUP, PER_HEAD)
    prefix, need, b2 = _spread_prefix(hist_ptr, hist2_ptr, pid, K, NUM_BINS)
    # the earlier splits' tokens above P and under it, from their counts
    written, n_cand = _split_counts(above_ptr, cum_ptr, pid, num_splits, b2, split,
                                    NUM_BINS, SPLITS_PAD)
    lo = split * tokens_per_split
    hi = tl.minimum(lo + tokens_per_split, capacity)
    offs = tl.arange(0, BLOCK)
    for t0 in range(lo, hi, BLOCK):
        tok = t0 + offs
        ok = (tok < hi) & (tok >= t_lo) & (tok < t_hi)
        high = _order_key(tl.load(v_row + tok, mask=ok, other=0.0)) >> 16
        take = ok & (high > prefix)
        cand = ok & (high == prefix)
        take_i = take.to(tl.int32)
        cand_i = cand.to(tl.int32)
        tl.store(out_row + written + tl.cumsum(take_i, axis=0) - 1, tok, mask=take)
        tl.store(cand_row + n_cand + tl.cumsum(cand_i, axis=0) - 1, tok, mask=cand)
        written += tl.sum(take_i, axis=0)
        n_cand += tl.sum(cand_i, axis=0)
    if FINISH_HERE:
        # the semaphore pattern of Quest's fused select: every thread's stores, a CTA
        # barrier, one thread's release; its acquire (then the barrier that shares its
        # result) orders the last program's loads after every program's stores of the row
        tl.debug_barrier()
        arrived = tl.atomic_add(arrive_ptr + pid, 1, sem="acq_rel")
        if arrived == num_splits - 1:  # every split of the row has written its part
            _finish_spread_row(v_row, cand_row, out_row, hist_ptr, hist2_ptr, above_ptr,
                               cum_ptr, thr_key_ptr, thr_tok_ptr, pid, num_splits, prefix,
                               need, b2, K, NUM_BINS, SPLITS_PAD, BLOCK)
            tl.store(arrive_ptr + pid, 0)  # zero for the next call


@triton.jit
def _spread_finish_kernel(
    v_ptr, hist_ptr, hist2_ptr, above_ptr, cum_ptr, cand_ptr, out_ptr, thr_key_ptr,
    thr_tok_ptr, capacity, num_splits, stride_vb, stride_vh, stride_ob, stride_oh,
    K: tl.constexpr, NUM_SEL: tl.constexpr, GROUP: tl.constexpr, PER_HEAD: tl.constexpr,
    NUM_BINS: tl.constexpr, SPLITS_PAD: tl.constexpr, BLOCK: tl.constexpr,
):
    """A row's candidates resolved after every split has written (a program a row: the
    write kernel's tail, in a launch of its own)."""
    pid = tl.program_id(0)  # b * NUM_SEL + selecting head
    v_row, out_row, cand_row = _spread_rows(v_ptr, out_ptr, cand_ptr, pid, capacity,
                                            stride_vb, stride_vh, stride_ob, stride_oh,
                                            K, NUM_SEL, GROUP, PER_HEAD)
    prefix, need, b2 = _spread_prefix(hist_ptr, hist2_ptr, pid, K, NUM_BINS)
    _finish_spread_row(v_row, cand_row, out_row, hist_ptr, hist2_ptr, above_ptr, cum_ptr,
                       thr_key_ptr, thr_tok_ptr, pid, num_splits, prefix, need, b2, K,
                       NUM_BINS, SPLITS_PAD, BLOCK)


@triton.jit
def _spread_rows(v_ptr, out_ptr, cand_ptr, pid, capacity, stride_vb, stride_vh, stride_ob,
                 stride_oh, K: tl.constexpr, NUM_SEL: tl.constexpr, GROUP: tl.constexpr,
                 PER_HEAD: tl.constexpr):
    """Row ``pid``'s values, its list of chosen tokens and its candidates."""
    b = pid // NUM_SEL
    sel = pid % NUM_SEL
    v_row = v_ptr + b.to(tl.int64) * stride_vb + sel * stride_vh
    if PER_HEAD:  # head h of KV head g writes its own segment of g's row list
        out_row = out_ptr + b * stride_ob + (sel // GROUP) * stride_oh + (sel % GROUP) * K
    else:
        out_row = out_ptr + b * stride_ob + sel * stride_oh
    return v_row, out_row, cand_ptr + pid.to(tl.int64) * capacity


@triton.jit
def _spread_prefix(hist_ptr, hist2_ptr, pid, K: tl.constexpr, NUM_BINS: tl.constexpr):
    """The top two bytes ``P`` of row ``pid``'s ``K``-th key, the keys under ``P`` still
    to take, and ``P``'s second byte."""
    bins = tl.arange(0, NUM_BINS)
    b1, above = _bucket_of(tl.load(hist_ptr + pid * NUM_BINS + bins), K, NUM_BINS)
    b2, above2 = _bucket_of(tl.load(hist2_ptr + pid * NUM_BINS + bins), K - above, NUM_BINS)
    prefix = (b1.to(tl.uint32) << 8) | b2.to(tl.uint32)
    return prefix, K - above - above2, b2


@triton.jit
def _split_counts(above_ptr, cum_ptr, pid, num_splits, b2, upto, NUM_BINS: tl.constexpr,
                  SPLITS_PAD: tl.constexpr):
    """The tokens above ``P`` and under it of row ``pid``'s splits before ``upto``."""
    offs_s = tl.arange(0, SPLITS_PAD)
    row_s = pid * num_splits + offs_s
    earlier = offs_s < upto
    # (the scalar test as a tensor: the interpreter's & of the two breaks masks)
    has_past = (offs_s * 0 + b2 + 1) < NUM_BINS
    at_b2 = tl.load(cum_ptr + row_s * NUM_BINS + b2, mask=earlier, other=0)
    past_b2 = tl.load(cum_ptr + row_s * NUM_BINS + b2 + 1, mask=earlier & has_past, other=0)
    written = tl.sum(tl.load(above_ptr + row_s, mask=earlier, other=0) + past_b2, axis=0)
    return written, tl.sum(at_b2 - past_b2, axis=0)


@triton.jit
def _finish_spread_row(v_row, cand_row, out_row, hist_ptr, hist2_ptr, above_ptr, cum_ptr,
                       thr_key_ptr, thr_tok_ptr, pid, num_splits, prefix, need, b2,
                       K: tl.constexpr, NUM_BINS: tl.constexpr, SPLITS_PAD: tl.constexpr,
                       BLOCK: tl.constexpr):
    """Row ``pid``'s candidates resolved (every split written) and its histograms zeroed
    for the next call."""
    direct, n_cand = _split_counts(above_ptr, cum_ptr, pid, num_splits, b2, num_splits,
                                   NUM_BINS, SPLITS_PAD)
    _finish_row(v_row, cand_row, out_row, thr_key_ptr + pid, thr_tok_ptr + pid, prefix,
                need, direct, n_cand, K, NUM_BINS, BLOCK)
    bins = tl.arange(0, NUM_BINS)
    tl.store(hist_ptr + pid * NUM_BINS + bins, tl.zeros([NUM_BINS], tl.int32))
    tl.store(hist2_ptr + pid * NUM_BINS + bins, tl.zeros([NUM_BINS], tl.int32))


@triton.jit
def _finish_row(v_row, cand_row, out_row, thr_key_at, thr_tok_at, prefix, need, written,
                n_cand, K: tl.constexpr, NUM_BINS: tl.constexpr, BLOCK: tl.constexpr):
    """The ``K``-th key ``T`` from its top two bytes ``prefix`` and the candidates' last
    two (a histogram each); writes the candidates above ``T``, then the first ``need``
    equal to it in token order, after the ``written`` tokens; ``-1`` fills the rest;
    stores ``T`` and the last tie taken."""
    offs = tl.arange(0, BLOCK)
    thr = prefix
    for level in tl.static_range(2):
        h = tl.zeros([NUM_BINS], tl.int32)
        for c0 in range(0, n_cand, BLOCK):
            at = c0 + offs
            ok = at < n_cand
            tok = tl.load(cand_row + at, mask=ok, other=0)
            key = _order_key(tl.load(v_row + tok, mask=ok, other=0.0))
            ok = ok & ((key >> (16 - 8 * level)) == thr)
            h += _masked_histogram(((key >> (8 - 8 * level)) & 255).to(tl.int32), ok,
                                   NUM_BINS)
        byte, above = _bucket_of(h, need, NUM_BINS)
        need -= above
        thr = (thr << 8) | byte.to(tl.uint32)
    ties = 0
    last_tie = -1
    for c0 in range(0, n_cand, BLOCK):
        at = c0 + offs
        ok = at < n_cand
        tok = tl.load(cand_row + at, mask=ok, other=0)
        key = _order_key(tl.load(v_row + tok, mask=ok, other=0.0))
        tie = ok & (key == thr)
        tie_i = tie.to(tl.int32)
        tie = tie & (ties + tl.cumsum(tie_i, axis=0) <= need)
        take = (ok & (key > thr)) | tie
        take_i = take.to(tl.int32)
        tl.store(out_row + written + tl.cumsum(take_i, axis=0) - 1, tok, mask=take)
        written += tl.sum(take_i, axis=0)
        ties += tl.sum(tie_i, axis=0)
        last_tie = tl.maximum(last_tie, tl.max(tl.where(tie, tok, -1), axis=0))
    for j0 in range(0, K, BLOCK):
        j = j0 + offs
        tl.store(out_row + j, tl.full([BLOCK], -1, tl.int32), mask=(j >= written) & (j < K))
    tl.store(thr_key_at, thr.to(tl.int32, bitcast=True))
    tl.store(thr_tok_at, last_tie)


class TopKSelect:
    """The score pass and the top-``k`` select of one query and cache shape (buffers
    allocated once): ``k`` tokens per KV head by the group's summed probability, or per
    query head by score (``per_head``), optionally within a token range per sequence."""

    def __init__(self, q: torch.Tensor, kv: KVCache, k: int, *, per_head: bool = False,
                 scale: float, spread: bool = SPREAD_SELECT, l2_hints: bool = SCORE_L2_HINTS,
                 mass_block: int = MASS_BLOCK, select_span: int | None = SELECT_SPAN,
                 finish_launch: bool = FINISH_LAUNCH, token_copy: bool = False) -> None:
        """``spread``, ``l2_hints``, ``mass_block``, ``select_span``, ``finish_launch``: this
        object's launch choices (``SPREAD_SELECT``, ``SCORE_L2_HINTS``, ``MASS_BLOCK``,
        ``SELECT_SPAN``, ``FINISH_LAUNCH`` by default); ``select_span``: at most this many
        tokens per program of the mass, second-byte and write kernels, a power of two >=
        ``mass_block`` (None: the score pass's span, which also caps it); ``finish_launch``:
        the spread select's candidates resolved in a launch of their own (a program a row)
        rather than by the write kernel's last program a row; ``token_copy``: the score pass
        also writes ``token_scores [B, Hkv, capacity, Gp]`` (fp32, each token's group
        scores side by side, ``Gp`` the group padded to a power of two, ``-inf`` in the
        padding), which a draw of a token reads in one sector."""
        check_positive_int(mass_block, "mass_block")
        if select_span is not None:
            check_positive_int(select_span, "select_span")
            if select_span & (select_span - 1) or select_span < mass_block:
                raise InputError(f"select_span: must be a power of two >= mass_block "
                                 f"({mass_block}), got {select_span}")
        self.spread, self.l2_hints, self.mass_block = bool(spread), bool(l2_hints), mass_block
        self.select_span, self.finish_launch = select_span, bool(finish_launch)
        st = _static_for(q, kv)
        self.static = st
        self.batch, self.num_q_heads, self.head_dim = q.shape
        self.num_kv_heads = kv.num_kv_heads
        self.group = st.group
        self.capacity = kv_capacity(kv)
        self.k, self.per_head, self.scale = k, per_head, scale
        self.block_n = SCORE_BLOCK_N[self.head_dim]
        tiles = -(-self.capacity // self.block_n)
        splits = choose_num_splits(self.batch * self.num_kv_heads, self.capacity,
                                   self.block_n, num_sms(q.device), SCORE_PROGRAMS_PER_SM)
        self.tiles_per_split = -(-tiles // splits)
        self.splits = -(-tiles // self.tiles_per_split)  # the score pass's (and its stats')
        # the select's programs a row, each over span tokens (the last one's may be fewer)
        self.span = self.tiles_per_split * self.block_n
        if select_span is not None:  # never fewer programs than the score pass's
            self.span = min(self.span, select_span)
        self.select_splits = -(-self.capacity // self.span)
        dev = q.device
        self.num_sel = self.num_q_heads if per_head else self.num_kv_heads
        rows = self.batch * self.num_sel
        self.scores = torch.empty(self.batch, self.num_q_heads, self.capacity,
                                  dtype=torch.float32, device=dev)
        self.group_pad = triton.next_power_of_2(self.group)
        self.token_scores = (torch.empty(self.batch, self.num_kv_heads, self.capacity,
                                         self.group_pad, dtype=torch.float32, device=dev)
                             if token_copy else None)
        self.stat_m = torch.empty(self.batch * self.num_q_heads * self.splits,
                                  dtype=torch.float32, device=dev)
        self.stat_l = torch.empty_like(self.stat_m)
        self.lse = torch.empty(self.batch, self.num_q_heads, dtype=torch.float32, device=dev)
        self.mass = (None if per_head else
                     torch.empty(self.batch, self.num_kv_heads, self.capacity,
                                 dtype=torch.float32, device=dev))
        self.hist = torch.zeros(rows, HIST_BINS, dtype=torch.int32, device=dev)
        self.cand = torch.empty(rows, self.capacity, dtype=torch.int32, device=dev)
        # the spread select's: the second byte's histogram (zeroed after use, as the
        # first), per select split the tokens above the top byte and the second byte's
        # counts at or above each value, and the row's programs that have written (0 between)
        self.hist2 = torch.zeros(rows, HIST_BINS, dtype=torch.int32, device=dev)
        self.above = torch.empty(rows * self.select_splits, dtype=torch.int32, device=dev)
        self.cum = torch.empty(rows * self.select_splits, HIST_BINS, dtype=torch.int32,
                               device=dev)
        self.arrivals = torch.zeros(rows, dtype=torch.int32, device=dev)
        self.thr_key = torch.empty(rows, dtype=torch.int32, device=dev)
        self.thr_tok = torch.empty(rows, dtype=torch.int32, device=dev)

    def run_scores(self, q: torch.Tensor, kv: KVCache,
                   rng: torch.Tensor | None = None) -> torch.Tensor:
        """Writes the scores ``[B, Hq, capacity]`` and their per-split stats; advances the
        step counter ``rng`` ([1] int64) by one when given (later launches read it)."""
        st = self.static
        page_table = kv.page_table if st.paged else kv.lengths
        ks = kv.k.stride()
        _score_stats_kernel[(self.splits, self.batch * self.num_kv_heads)](
            q, kv.k, kv.lengths, page_table, self.scores, self.stat_m, self.stat_l,
            rng if rng is not None else kv.lengths,
            self.token_scores if self.token_scores is not None else self.scores,
            self.scale, self.capacity, self.tiles_per_split, self.splits,
            q.stride(0), q.stride(1), ks[0], ks[1], ks[2],
            page_table.stride(0) if st.paged else 0,
            self.scores.stride(0), self.scores.stride(1),
            NUM_KV_HEADS=self.num_kv_heads, GROUP=self.group, HEAD_DIM=self.head_dim,
            BLOCK_H=st.block_h, BLOCK_N=self.block_n, PAGED=st.paged,
            PAGE_SIZE=st.page_size, DOT_PRECISION=st.precision, WIDEN_BF16=st.widen_bf16,
            BUMP=rng is not None, K_EVICTION="evict_first" if self.l2_hints else "",
            S_EVICTION="evict_last" if self.l2_hints else "",
            TOKEN_COPY=self.token_scores is not None, GROUP_PAD=self.group_pad,
            num_warps=NUM_WARPS,
        )  # fmt: skip
        return self.scores

    def run_select(self, kv: KVCache, out: torch.Tensor, sink: int = 0,
                   window: int = 0, *, upto: str = "write") -> torch.Tensor:
        """Writes the chosen tokens into ``out [B, Hkv, ≥k]`` int32 (per head: head ``j``
        of a group at ``j·k``; ``-1`` where fewer are allowed), the tokens allowed being
        ``[min(n, sink), max(n − window, min(n, sink)))`` of a sequence of length ``n``;
        with the group's mass, also ``lse``. ``upto`` (profiling) stops after a launch:
        ``mass`` or ``second`` (the spread select's second byte); the call is then
        incomplete and leaves the histograms unzeroed."""
        values = self.scores if self.per_head else self.mass
        mass = self.mass if self.mass is not None else self.scores
        # split by the select's span; lse from the score pass's splits' stats
        _mass_hist_kernel[(self.select_splits, self.batch * self.num_sel)](
            self.scores, self.stat_m, self.stat_l, kv.lengths, mass, self.lse,
            self.hist, self.capacity, self.splits, self.span,
            self.scores.stride(0), self.scores.stride(1),
            NUM_SEL=self.num_sel, GROUP=self.group,
            BLOCK_G=triton.next_power_of_2(self.group),
            SPLITS_PAD=max(2, triton.next_power_of_2(self.splits)), BLOCK=self.mass_block,
            PER_HEAD=self.per_head, SINK=sink, WINDOW=window, NUM_BINS=HIST_BINS,
            num_warps=NUM_WARPS,
        )  # fmt: skip
        if upto == "mass":
            return out
        if self.spread:
            self._spread_select(values, kv, out, sink, window, upto)
            return out
        _select_kernel[(self.batch * self.num_sel,)](
            values, self.hist, kv.lengths, self.cand, out, self.thr_key,
            self.thr_tok, self.capacity, values.stride(0), values.stride(1),
            out.stride(0), out.stride(1),
            K=self.k, NUM_SEL=self.num_sel, GROUP=self.group, PER_HEAD=self.per_head,
            SINK=sink, WINDOW=window, NUM_BINS=HIST_BINS, BLOCK=SELECT_BLOCK,
            num_warps=SELECT_WARPS,
        )  # fmt: skip
        return out

    def _spread_select(self, values: torch.Tensor, kv: KVCache, out: torch.Tensor,
                       sink: int, window: int, upto: str = "write") -> None:
        """The select in two launches split like the mass kernel (the second byte's
        histogram, then the writes; the row's last program resolves the candidates, or
        with ``finish_launch`` a third launch, a program a row)."""
        grid = (self.select_splits, self.batch * self.num_sel)
        span = self.span
        block = min(SPREAD_BLOCK, triton.next_power_of_2(span))
        _second_byte_kernel[grid](
            values, self.hist, self.hist2, kv.lengths, self.above, self.cum,
            self.capacity, self.select_splits, span, values.stride(0), values.stride(1),
            K=self.k, NUM_SEL=self.num_sel, SINK=sink, WINDOW=window, NUM_BINS=HIST_BINS,
            BLOCK=block, num_warps=NUM_WARPS,
        )  # fmt: skip
        if upto == "second":
            return
        _spread_write_kernel[grid](
            values, self.hist, self.hist2, kv.lengths, self.above, self.cum, self.cand,
            self.arrivals, out, self.thr_key, self.thr_tok, self.capacity, self.select_splits,
            span, values.stride(0), values.stride(1), out.stride(0), out.stride(1),
            K=self.k, NUM_SEL=self.num_sel, GROUP=self.group, PER_HEAD=self.per_head,
            SINK=sink, WINDOW=window, NUM_BINS=HIST_BINS,
            SPLITS_PAD=max(2, triton.next_power_of_2(self.select_splits)), BLOCK=block,
            FINISH_HERE=not self.finish_launch, num_warps=NUM_WARPS,
        )  # fmt: skip
        if self.finish_launch:
            _spread_finish_kernel[(self.batch * self.num_sel,)](
                values, self.hist, self.hist2, self.above, self.cum, self.cand, out,
                self.thr_key, self.thr_tok, self.capacity, self.select_splits,
                values.stride(0), values.stride(1), out.stride(0), out.stride(1),
                K=self.k, NUM_SEL=self.num_sel, GROUP=self.group, PER_HEAD=self.per_head,
                NUM_BINS=HIST_BINS,
                SPLITS_PAD=max(2, triton.next_power_of_2(self.select_splits)), BLOCK=block,
                num_warps=NUM_WARPS,
            )  # fmt: skip
