"""triton-topk: the score pass and the exact top-``k`` select of the selection methods
(docs/algorithms.md section 10), in three launches split alike over the tokens and no
torch op over the tokens.

1. **Score pass** (:meth:`TopKSelect.run_scores`): ``τ q·k`` of every cached token for
   every query head, written once (fp32 ``[B, Hq, capacity]``, ``-inf`` past each
   length), and per split of the tokens each head's running max and sum of exponentials
   (the stats), so the softmax's normaliser ``lse`` needs no second pass over the scores.
2. **Mass and histogram** (:meth:`TopKSelect.run_select`, split like the score pass): per
   (sequence, KV head) the group's summed probabilities ``Σ_h e^{s_h − lse_h}`` (written,
   fp32, ``-1`` on tokens not allowed) and a histogram of the allowed tokens' buckets:
   the top 12 bits of their order-preserving key (the float's bits, sign flipped), for
   a mass 8 exponent and 3 mantissa bits, so a bucket spans 1/8 of an octave. Per query
   head (``per_head``) the key is the score itself and nothing is written. Each split
   keeps its counts at or above each bucket (``cum``: int16 while a split spans fewer
   than 2^15 tokens) and adds its histogram to the row's; the split-0 program writes
   ``lse [B, Hq]``.
3. **Writes** (split alike): the row's histogram gives the bucket ``b1`` of the ``k``-th
   key; each split writes its tokens above ``b1`` after the earlier splits' ones and
   lists those in ``b1`` (the candidates) after the earlier splits' candidates (both
   counts from the earlier splits' ``cum`` at ``b1`` and ``b1 + 1``); the row's last
   program to finish (an arrival counter) takes three histograms of the candidates (the
   key's other 20 bits: 8, 8, 4; the exact key ``T``), writes those above ``T``, then
   those equal to ``T`` in token order until ``k`` are chosen, and ``-1`` fills the
   rest. A token is chosen exactly when ``key > T`` or ``key = T`` and ``token ≤ last
   tie`` (both stored), which later kernels test without a list.

``SPREAD_SELECT = False`` runs 3 as the former select instead: one program per
(sequence, selecting head) walks every token (the same histogram, candidates, tokens,
threshold and last tie).

Bytes of the select at 32 query / 8 KV heads, 32k tokens, B = 8 (10 splits): the mass
kernel reads the scores (33.5 MB) and writes the mass (8.4 MB) and ``cum`` (5.2 MB,
8 KiB a split of a row; per head, 4x the rows: 21 MB); the write kernel reads the mass
once more (8.4 MB) and each program its row's histogram (16 KiB, from L2), then the
candidates (about 1% of a row).

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

HIST_BITS = 12  # the key's top bits a bucket holds (_bucket_key and _finish_row assume 12)
HIST_BINS = 1 << HIST_BITS  # for a mass: 8 exponent and 3 mantissa bits, 1/8 of an octave
SCORE_PROGRAMS_PER_SM = 4  # the score pass's programs per SM its split count aims for
MASS_BLOCK = 2048  # tokens a step (and a histogram call) of the mass kernel, at most
MASS_WARPS = 8
SELECT_BLOCK = 2048  # tokens a step of the select kernel (one program walks them all)
SPREAD_BLOCK = 2048  # tokens (or candidates) a step of the spread write kernel, at most
SPREAD_SELECT = True  # the select split like the score pass (False: one program a row)
# the score pass loads K evict-first and stores the scores evict-last (L2), so the mass
# kernel's read of them may hit L2
SCORE_L2_HINTS = False
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
    q_ptr, k_ptr, lengths_ptr, page_table_ptr, s_ptr, m_ptr, l_ptr, rng_ptr,
    tau, capacity, tiles_per_split, num_splits,
    stride_qb, stride_qh, stride_kblk, stride_kn, stride_kh, stride_ptb, stride_sb, stride_sh,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr, DOT_PRECISION: tl.constexpr, WIDEN_BF16: tl.constexpr,
    BUMP: tl.constexpr, L2_HINTS: tl.constexpr,
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
        if L2_HINTS:  # K streams past; the scores stay in L2 for the mass kernel
            k = tl.load(k_base + row_off[:, None] + offs_d[None, :], mask=ok[:, None],
                        other=0.0, eviction_policy="evict_first")
        else:
            k = tl.load(k_base + row_off[:, None] + offs_d[None, :], mask=ok[:, None],
                        other=0.0)
        s = _mma(q, tl.trans(k), None, DOT_PRECISION, WIDEN_BF16) * tau
        s = tl.where(ok[None, :], s, float("-inf"))
        if L2_HINTS:
            tl.store(s_rows + offs_n[None, :], s, mask=mask_h[:, None] & (offs_n < hi)[None, :],
                     eviction_policy="evict_last")
        else:
            tl.store(s_rows + offs_n[None, :], s, mask=mask_h[:, None] & (offs_n < hi)[None, :])
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
def _bucket_key(key):
    """The histogram bucket of an order key: its top ``HIST_BITS`` (12) bits."""
    return (key >> 20).to(tl.int32)


@triton.jit
def _allowed_range(lengths_ptr, b, SINK: tl.constexpr, WINDOW: tl.constexpr):
    """``[t_lo, t_hi)``: the tokens of sequence ``b`` a select may take."""
    n = tl.load(lengths_ptr + b).to(tl.int32)
    t_lo = tl.minimum(n, SINK)
    return t_lo, tl.maximum(n - WINDOW, t_lo)


@triton.jit
def _mass_hist_kernel(
    s_ptr, m_ptr, l_ptr, lengths_ptr, mass_ptr, lse_ptr, hist_ptr, cum_ptr,
    capacity, num_splits, tokens_per_split, stride_sb, stride_sh,
    NUM_SEL: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    SPLITS_PAD: tl.constexpr, BLOCK: tl.constexpr, PER_HEAD: tl.constexpr,
    SINK: tl.constexpr, WINDOW: tl.constexpr, NUM_BINS: tl.constexpr,
):
    """Per split of a row: the group's mass (written; not per head), a histogram of the
    allowed tokens' buckets (one ``tl.histogram`` per ``BLOCK`` tokens), kept per split
    as counts at or above each bucket and added to the row's."""
    split = tl.program_id(0)
    pid = tl.program_id(1)  # b * NUM_SEL + selecting head
    b = pid // NUM_SEL
    sel = pid % NUM_SEL
    t_lo, t_hi = _allowed_range(lengths_ptr, b, SINK, WINDOW)
    lo = split * tokens_per_split
    hi = tl.minimum(lo + tokens_per_split, capacity)
    offs = tl.arange(0, BLOCK)
    hist = tl.zeros([NUM_BINS], tl.int32)
    if PER_HEAD:
        s_row = s_ptr + b.to(tl.int64) * stride_sb + sel * stride_sh
        for t0 in range(lo, hi, BLOCK):
            tok = t0 + offs
            ok = (tok < hi) & (tok >= t_lo) & (tok < t_hi)
            key = _order_key(tl.load(s_row + tok, mask=ok, other=0.0))
            hist += _masked_histogram(_bucket_key(key), ok, NUM_BINS)
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
            ok = inside & (tok >= t_lo) & (tok < t_hi)
            s = tl.load(s_rows + tok[None, :], mask=mask_g[:, None] & ok[None, :],
                        other=float("-inf"))
            mass = tl.sum(tl.exp(s - lse[:, None]), axis=0)
            mass = tl.where(ok, mass, -1.0)
            tl.store(mass_row + tok, mass, mask=inside)
            hist += _masked_histogram(_bucket_key(_order_key(mass)), ok, NUM_BINS)
    bins = tl.arange(0, NUM_BINS)
    cum = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
    tl.store(cum_ptr + (pid * num_splits + split) * NUM_BINS + bins,
             cum.to(cum_ptr.dtype.element_ty))
    tl.atomic_add(hist_ptr + pid * NUM_BINS + bins, hist, mask=hist != 0)


@triton.jit
def _out_row_of(out_ptr, b, sel, stride_ob, stride_oh, K: tl.constexpr, GROUP: tl.constexpr,
                PER_HEAD: tl.constexpr):
    """Where row ``(b, sel)``'s list starts (per head: head ``j`` of KV head ``g`` writes
    its own segment of ``g``'s row list)."""
    if PER_HEAD:
        row = out_ptr + b * stride_ob + (sel // GROUP) * stride_oh + (sel % GROUP) * K
    else:
        row = out_ptr + b * stride_ob + sel * stride_oh
    return row


@triton.jit
def _select_kernel(
    v_ptr, hist_ptr, lengths_ptr, cand_ptr, out_ptr, thr_key_ptr,
    thr_tok_ptr, capacity, stride_vb, stride_vh, stride_ob, stride_oh,
    K: tl.constexpr, NUM_SEL: tl.constexpr, GROUP: tl.constexpr, PER_HEAD: tl.constexpr,
    SINK: tl.constexpr, WINDOW: tl.constexpr, NUM_BINS: tl.constexpr, BLOCK: tl.constexpr,
):
    """One program a row: with the row's histogram's bucket ``b1`` of the ``K``-th key,
    writes the allowed tokens above it and lists those in it (the candidates), which
    :func:`_finish_row` resolves."""
    pid = tl.program_id(0)  # b * NUM_SEL + selecting head
    b = pid // NUM_SEL
    sel = pid % NUM_SEL
    t_lo, t_hi = _allowed_range(lengths_ptr, b, SINK, WINDOW)
    v_row = v_ptr + b.to(tl.int64) * stride_vb + sel * stride_vh
    out_row = _out_row_of(out_ptr, b, sel, stride_ob, stride_oh, K, GROUP, PER_HEAD)
    cand_row = cand_ptr + pid.to(tl.int64) * capacity
    bins = tl.arange(0, NUM_BINS)
    hist_at = hist_ptr + pid * NUM_BINS + bins
    h1 = tl.load(hist_at)
    tl.debug_barrier()
    tl.store(hist_at, tl.zeros([NUM_BINS], tl.int32))  # zero for the next call
    b1, above = _bucket_of(h1, K, NUM_BINS)
    offs = tl.arange(0, BLOCK)
    written = 0
    n_cand = 0
    for t0 in range(0, capacity, BLOCK):
        tok = t0 + offs
        ok = (tok >= t_lo) & (tok < t_hi)
        bucket = _bucket_key(_order_key(tl.load(v_row + tok, mask=ok, other=0.0)))
        take = ok & (bucket > b1)
        cand = ok & (bucket == b1)
        take_i = take.to(tl.int32)
        cand_i = cand.to(tl.int32)
        tl.store(out_row + written + tl.cumsum(take_i, axis=0) - 1, tok, mask=take)
        tl.store(cand_row + n_cand + tl.cumsum(cand_i, axis=0) - 1, tok, mask=cand)
        written += tl.sum(take_i, axis=0)
        n_cand += tl.sum(cand_i, axis=0)
    tl.debug_barrier()  # the candidates are visible to the passes below
    _finish_row(v_row, cand_row, out_row, thr_key_ptr + pid, thr_tok_ptr + pid,
                b1.to(tl.uint32), K - above, written, n_cand, K, BLOCK)


@triton.jit
def _spread_write_kernel(
    v_ptr, hist_ptr, lengths_ptr, cum_ptr, cand_ptr, arrive_ptr,
    out_ptr, thr_key_ptr, thr_tok_ptr, capacity, num_splits, tokens_per_split,
    stride_vb, stride_vh, stride_ob, stride_oh,
    K: tl.constexpr, NUM_SEL: tl.constexpr, GROUP: tl.constexpr, PER_HEAD: tl.constexpr,
    SINK: tl.constexpr, WINDOW: tl.constexpr, NUM_BINS: tl.constexpr,
    SPLITS_PAD: tl.constexpr, BLOCK: tl.constexpr,
):
    """Per split of a row, with the row histogram's bucket ``b1`` of the ``K``-th key:
    writes the allowed tokens above ``b1`` (after the earlier splits' ones, counted by
    their ``cum``) and lists those in ``b1`` (the candidates, in token order across the
    splits); the row's last program to finish resolves the candidates
    (:func:`_finish_row`) and zeroes the row's histogram and arrival count."""
    split = tl.program_id(0)
    pid = tl.program_id(1)  # b * NUM_SEL + selecting head
    b = pid // NUM_SEL
    sel = pid % NUM_SEL
    t_lo, t_hi = _allowed_range(lengths_ptr, b, SINK, WINDOW)
    v_row = v_ptr + b.to(tl.int64) * stride_vb + sel * stride_vh
    out_row = _out_row_of(out_ptr, b, sel, stride_ob, stride_oh, K, GROUP, PER_HEAD)
    cand_row = cand_ptr + pid.to(tl.int64) * capacity
    bins = tl.arange(0, NUM_BINS)
    b1, above = _bucket_of(tl.load(hist_ptr + pid * NUM_BINS + bins), K, NUM_BINS)
    # the earlier splits' tokens above b1 and in it, from their counts
    offs_s = tl.arange(0, SPLITS_PAD)
    row_s = pid * num_splits + offs_s
    earlier = offs_s < split
    # (the scalar test as a tensor: the interpreter's & of the two breaks masks)
    has_past = (offs_s * 0 + b1 + 1) < NUM_BINS
    at_b1 = tl.load(cum_ptr + row_s * NUM_BINS + b1, mask=earlier, other=0).to(tl.int32)
    past_b1 = tl.load(cum_ptr + row_s * NUM_BINS + b1 + 1, mask=earlier & has_past,
                      other=0).to(tl.int32)
    written = tl.sum(past_b1, axis=0)
    n_cand = tl.sum(at_b1 - past_b1, axis=0)
    lo = split * tokens_per_split
    hi = tl.minimum(lo + tokens_per_split, capacity)
    offs = tl.arange(0, BLOCK)
    for t0 in range(lo, hi, BLOCK):
        tok = t0 + offs
        ok = (tok < hi) & (tok >= t_lo) & (tok < t_hi)
        bucket = _bucket_key(_order_key(tl.load(v_row + tok, mask=ok, other=0.0)))
        take = ok & (bucket > b1)
        cand = ok & (bucket == b1)
        take_i = take.to(tl.int32)
        cand_i = cand.to(tl.int32)
        tl.store(out_row + written + tl.cumsum(take_i, axis=0) - 1, tok, mask=take)
        tl.store(cand_row + n_cand + tl.cumsum(cand_i, axis=0) - 1, tok, mask=cand)
        written += tl.sum(take_i, axis=0)
        n_cand += tl.sum(cand_i, axis=0)
    # the semaphore pattern of Quest's fused select: every thread's stores, a CTA
    # barrier, one thread's release; its acquire (then the barrier that shares its
    # result) orders the last program's loads after every program's stores of the row
    tl.debug_barrier()
    arrived = tl.atomic_add(arrive_ptr + pid, 1, sem="acq_rel")
    if arrived == num_splits - 1:  # every split of the row has written its part
        every = offs_s < num_splits
        at_b1 = tl.load(cum_ptr + row_s * NUM_BINS + b1, mask=every, other=0).to(tl.int32)
        past_b1 = tl.load(cum_ptr + row_s * NUM_BINS + b1 + 1, mask=every & has_past,
                          other=0).to(tl.int32)
        _finish_row(v_row, cand_row, out_row, thr_key_ptr + pid, thr_tok_ptr + pid,
                    b1.to(tl.uint32), K - above, tl.sum(past_b1, axis=0),
                    tl.sum(at_b1 - past_b1, axis=0), K, BLOCK)
        tl.store(hist_ptr + pid * NUM_BINS + bins, tl.zeros([NUM_BINS], tl.int32))
        tl.store(arrive_ptr + pid, 0)  # zero for the next call


@triton.jit
def _refine(v_row, cand_row, n_cand, thr, need, DONE: tl.constexpr, BITS: tl.constexpr,
            BINS: tl.constexpr, BLOCK: tl.constexpr):
    """The ``need``-th largest key among the candidates whose top ``DONE`` bits are
    ``thr``: its top ``DONE + BITS`` bits (one histogram of ``BINS = 2^BITS`` buckets)
    and the ``need`` left below them."""
    offs = tl.arange(0, BLOCK)
    h = tl.zeros([BINS], tl.int32)
    for c0 in range(0, n_cand, BLOCK):
        at = c0 + offs
        ok = at < n_cand
        tok = tl.load(cand_row + at, mask=ok, other=0)
        key = _order_key(tl.load(v_row + tok, mask=ok, other=0.0))
        ok = ok & ((key >> (32 - DONE)) == thr)
        h += _masked_histogram(((key >> (32 - DONE - BITS)) & (BINS - 1)).to(tl.int32), ok,
                               BINS)
    digit, above = _bucket_of(h, need, BINS)
    return (thr << BITS) | digit.to(tl.uint32), need - above


@triton.jit
def _finish_row(v_row, cand_row, out_row, thr_key_at, thr_tok_at, bucket, need, written,
                n_cand, K: tl.constexpr, BLOCK: tl.constexpr):
    """The ``K``-th key ``T`` from its bucket (its top 12 bits) and the candidates' other
    20 bits (histograms of 8, 8 and 4 bits); writes the candidates above ``T``, then the
    first ``need`` equal to it in token order, after the ``written`` tokens; ``-1`` fills
    the rest; stores ``T`` and the last tie taken."""
    thr, need = _refine(v_row, cand_row, n_cand, bucket, need, 12, 8, 256, BLOCK)
    thr, need = _refine(v_row, cand_row, n_cand, thr, need, 20, 8, 256, BLOCK)
    thr, need = _refine(v_row, cand_row, n_cand, thr, need, 28, 4, 16, BLOCK)
    offs = tl.arange(0, BLOCK)
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
                 scale: float) -> None:
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
        self.splits = -(-tiles // self.tiles_per_split)
        dev = q.device
        self.num_sel = self.num_q_heads if per_head else self.num_kv_heads
        rows = self.batch * self.num_sel
        self.scores = torch.empty(self.batch, self.num_q_heads, self.capacity,
                                  dtype=torch.float32, device=dev)
        self.stat_m = torch.empty(self.batch * self.num_q_heads * self.splits,
                                  dtype=torch.float32, device=dev)
        self.stat_l = torch.empty_like(self.stat_m)
        self.lse = torch.empty(self.batch, self.num_q_heads, dtype=torch.float32, device=dev)
        self.mass = (None if per_head else
                     torch.empty(self.batch, self.num_kv_heads, self.capacity,
                                 dtype=torch.float32, device=dev))
        # the row's histogram (zeroed by the select after use), per split the counts at
        # or above each bucket, the candidates, and the row's programs that have written
        # (the spread select's; 0 between calls)
        self.hist = torch.zeros(rows, HIST_BINS, dtype=torch.int32, device=dev)
        span = self.tiles_per_split * self.block_n  # a split's counts fit int16 below 2^15
        self.cum = torch.empty(rows * self.splits, HIST_BINS, device=dev,
                               dtype=torch.int16 if span < 2**15 else torch.int32)
        self.cand = torch.empty(rows, self.capacity, dtype=torch.int32, device=dev)
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
            self.scale, self.capacity, self.tiles_per_split, self.splits,
            q.stride(0), q.stride(1), ks[0], ks[1], ks[2],
            page_table.stride(0) if st.paged else 0,
            self.scores.stride(0), self.scores.stride(1),
            NUM_KV_HEADS=self.num_kv_heads, GROUP=self.group, HEAD_DIM=self.head_dim,
            BLOCK_H=st.block_h, BLOCK_N=self.block_n, PAGED=st.paged,
            PAGE_SIZE=st.page_size, DOT_PRECISION=st.precision, WIDEN_BF16=st.widen_bf16,
            BUMP=rng is not None, L2_HINTS=SCORE_L2_HINTS, num_warps=NUM_WARPS,
        )  # fmt: skip
        return self.scores

    def run_select(self, kv: KVCache, out: torch.Tensor, sink: int = 0,
                   window: int = 0, *, upto: str = "write") -> torch.Tensor:
        """Writes the chosen tokens into ``out [B, Hkv, ≥k]`` int32 (per head: head ``j``
        of a group at ``j·k``; ``-1`` where fewer are allowed), the tokens allowed being
        ``[min(n, sink), max(n − window, min(n, sink)))`` of a sequence of length ``n``;
        with the group's mass, also ``lse``. ``upto="mass"`` (profiling) stops after the
        mass kernel; the call is then incomplete and leaves the histograms unzeroed."""
        values = self.scores if self.per_head else self.mass
        mass = self.mass if self.mass is not None else self.scores
        span = self.tiles_per_split * self.block_n
        _mass_hist_kernel[(self.splits, self.batch * self.num_sel)](
            self.scores, self.stat_m, self.stat_l, kv.lengths, mass, self.lse,
            self.hist, self.cum, self.capacity, self.splits, span,
            self.scores.stride(0), self.scores.stride(1),
            NUM_SEL=self.num_sel, GROUP=self.group,
            BLOCK_G=triton.next_power_of_2(self.group),
            SPLITS_PAD=max(2, triton.next_power_of_2(self.splits)),
            BLOCK=min(MASS_BLOCK, triton.next_power_of_2(span)), PER_HEAD=self.per_head,
            SINK=sink, WINDOW=window, NUM_BINS=HIST_BINS, num_warps=MASS_WARPS,
        )  # fmt: skip
        if upto == "mass":
            return out
        if SPREAD_SELECT:
            _spread_write_kernel[(self.splits, self.batch * self.num_sel)](
                values, self.hist, kv.lengths, self.cum, self.cand, self.arrivals, out,
                self.thr_key, self.thr_tok, self.capacity, self.splits, span,
                values.stride(0), values.stride(1), out.stride(0), out.stride(1),
                K=self.k, NUM_SEL=self.num_sel, GROUP=self.group, PER_HEAD=self.per_head,
                SINK=sink, WINDOW=window, NUM_BINS=HIST_BINS,
                SPLITS_PAD=max(2, triton.next_power_of_2(self.splits)),
                BLOCK=min(SPREAD_BLOCK, triton.next_power_of_2(span)),
                num_warps=SELECT_WARPS,
            )  # fmt: skip
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
