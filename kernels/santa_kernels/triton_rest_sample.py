"""S²ANTA-sys samples of the tokens off a top-``k`` set, for top-k + S²ANTA
(docs/algorithms.md section 10.4), in two launches over the score stash of
``triton_topk``, split alike in spans of the tokens (the score pass's, or at most
``RestSampler(span=N)`` tokens a program: more programs, fewer serial steps each):

1. **Rest sums**: per split and query head, ``R = Σ p_i`` over the split's valid tokens
   off the top set (``p_i = e^{s_i − lse}``; a token is in the set by the select's
   threshold test). The split-0 program also clears the sample slots.
2. **Systematic samples**: per split, each head's running sum of the rest starts at its
   earlier splits' ``R``; with ``M = Σ R`` and one uniform ``u`` per head (Philox, the
   same in every split), token ``i`` takes the samples ``m`` with
   ``C_{i−1} ≤ (u + m) M / S < C_i`` (``C`` the running sum), written at the head's
   slots ``m`` with log-weight ``log(M / S) + lse − s_i``, so that ``w_i e^{s_i} = M Z / S``.
   A head whose rest holds no mass keeps no sample (token ``-1``, log-weight ``-inf``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from santa_kernels.triton_topk import TopKSelect, _lse_of, _order_key
from santa_kernels.validate import check_positive_int

REST_BLOCK = 256  # tokens a step of either kernel
# RestSampler's default span: at most this many tokens a program of either kernel (None: the
# score pass's span, so the rest is split like it; 1024: the plan 340.4 -> 329.7 us at
# 32/8/128, 32k, B=8 on an H100, profile-topk.md of
# results/h100/2026-12-07-h100-kernels-floor-32k-every-method-c373426)
REST_SPAN = 1024
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
def _rest_sum_kernel(
    s_ptr, m_ptr, l_ptr, lengths_ptr, mass_ptr, thr_key_ptr, thr_tok_ptr, rest_ptr,
    rows_ptr, lw_ptr, capacity, num_splits, rest_splits, tokens_per_split, stride_sb,
    stride_sh, stride_rb, stride_rh, stride_wb, stride_wh,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    SPLITS_PAD: tl.constexpr, REST_PAD: tl.constexpr, K: tl.constexpr, S: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK: tl.constexpr, HAS_TOP: tl.constexpr,
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
    tl.store(rest_ptr + rows * rest_splits + split, total, mask=mask_g)
    if split == 0:  # clear the heads' sample slots (a slot no token takes stays empty)
        for m0 in range(0, S, BLOCK_S):
            m = m0 + tl.arange(0, BLOCK_S)
            col = K + offs_g[:, None] * S + m[None, :]
            ok = mask_g[:, None] & (m < S)[None, :]
            tl.store(rows_ptr + b * stride_rb + kv_head * stride_rh + col,
                     tl.full([BLOCK_G, BLOCK_S], -1, tl.int32), mask=ok)
            tl.store(lw_ptr + b * stride_wb + heads[:, None] * stride_wh + col,
                     tl.full([BLOCK_G, BLOCK_S], float("-inf"), tl.float32), mask=ok)


@triton.jit
def _systematic_kernel(
    s_ptr, m_ptr, l_ptr, lengths_ptr, mass_ptr, thr_key_ptr, thr_tok_ptr, rest_ptr,
    rows_ptr, lw_ptr, rng_ptr, seed, capacity, num_splits, rest_splits, tokens_per_split,
    stride_sb, stride_sh, stride_rb, stride_rh, stride_wb, stride_wh,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    SPLITS_PAD: tl.constexpr, REST_PAD: tl.constexpr, K: tl.constexpr, S: tl.constexpr,
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
    # M and the rest before this split, from the rest sums
    offs_s = tl.arange(0, REST_PAD)
    r = tl.load(rest_ptr + rows[:, None] * rest_splits + offs_s[None, :],
                mask=mask_g[:, None] & (offs_s < rest_splits)[None, :], other=0.0)
    mass_total = tl.sum(r, axis=1)
    run = tl.sum(tl.where((offs_s < split)[None, :], r, 0.0), axis=1)
    live = mask_g & (mass_total > 0)
    per_sample = tl.where(live, S / tl.where(live, mass_total, 1.0), 0.0)  # S / M
    u = tl.rand(seed, (tl.load(rng_ptr) << 32) + rows.to(tl.int64))
    log_w0 = tl.log(tl.where(live, mass_total, 1.0) / S) + lse  # log(M / S) + lse
    s_rows = s_ptr + b.to(tl.int64) * stride_sb + heads[:, None] * stride_sh
    mass_row = mass_ptr + pid.to(tl.int64) * capacity
    row_list = rows_ptr + b * stride_rb + kv_head * stride_rh + K + offs_g[:, None] * S
    lw_list = lw_ptr + b * stride_wb + heads[:, None] * stride_wh + K + offs_g[:, None] * S
    lo = split * tokens_per_split
    hi = tl.minimum(lo + tokens_per_split, capacity)
    offs = tl.arange(0, BLOCK)
    for t0 in range(lo, hi, BLOCK):
        tok = t0 + offs
        p, s = _rest_probs(s_rows, mass_row, tok, tok < hi, n, lse, mask_g, thr, last_tie,
                           HAS_TOP)
        c = run[:, None] + tl.cumsum(p, axis=1)
        # samples below C: N(x) = clamp(⌈x S / M − u⌉, 0, S)
        first = _samples_below(c - p, per_sample, u, S)
        count = _samples_below(c, per_sample, u, S) - first
        count = tl.where(live[:, None] & (p > 0), count, 0)
        log_w = log_w0[:, None] - s
        tok2 = tl.broadcast_to(tok[None, :], [BLOCK_G, BLOCK])
        for extra in range(0, tl.max(tl.max(count, axis=1), axis=0)):
            take = count > extra
            tl.store(row_list + first + extra, tok2, mask=take)
            tl.store(lw_list + first + extra, log_w, mask=take)
        run = tl.max(c, axis=1)


@triton.jit
def _samples_below(x, per_sample, u, S: tl.constexpr):
    """``[BLOCK_G, BLOCK]`` int32: samples ``m`` with ``(u + m) M / S < x``."""
    t = tl.minimum(tl.maximum(x * per_sample[:, None] - u[:, None], 0.0), S * 1.0)
    whole = t.to(tl.int32)
    return tl.where(whole.to(tl.float32) < t, whole + 1, whole)


class RestSampler:
    """The two launches of the rest's systematic samples over a :class:`TopKSelect`'s
    stash (``k`` its top set's size, 0 for none; ``S`` samples per query head)."""

    def __init__(self, top: TopKSelect, k: int, S: int, *, block: int = REST_BLOCK,
                 span: int | None = REST_SPAN) -> None:
        """``block``: tokens a step of either kernel (``REST_BLOCK`` by default); ``span``:
        at most this many tokens a program of either kernel (``REST_SPAN`` by default; None:
        the score pass's span, which also caps it)."""
        check_positive_int(block, "block")
        if span is not None:
            check_positive_int(span, "span")
        self.top, self.k, self.S, self.block = top, k, S, block
        score_span = top.tiles_per_split * top.block_n
        self.span = score_span if span is None else min(span, score_span)
        self.splits = -(-top.capacity // self.span)  # the rest sums' splits
        self.rest = torch.empty(top.batch * top.num_q_heads * self.splits,
                                dtype=torch.float32, device=top.scores.device)

    def run(self, kv, rows: torch.Tensor, log_weights: torch.Tensor, rng: torch.Tensor,
            seed: int) -> None:
        """Writes each head's samples into ``rows [B, Hkv, k + G S]`` (head ``j``'s at
        ``k + j S``) and their log-weights into ``log_weights [B, Hq, k + G S]``."""
        top = self.top
        mass = top.mass
        common = dict(
            NUM_KV_HEADS=top.num_kv_heads, GROUP=top.group,
            BLOCK_G=triton.next_power_of_2(top.group),
            SPLITS_PAD=max(2, triton.next_power_of_2(top.splits)),
            REST_PAD=max(2, triton.next_power_of_2(self.splits)), K=self.k, S=self.S,
            BLOCK=self.block, HAS_TOP=self.k > 0, num_warps=NUM_WARPS,
        )  # fmt: skip
        grid = (self.splits, top.batch * top.num_kv_heads)
        strides = (top.scores.stride(0), top.scores.stride(1), rows.stride(0), rows.stride(1),
                   log_weights.stride(0), log_weights.stride(1))
        head = (top.scores, top.stat_m, top.stat_l, kv.lengths, mass, top.thr_key,
                top.thr_tok, self.rest, rows, log_weights)
        # in spans of self.span tokens (the lse from the score pass's splits' stats)
        _rest_sum_kernel[grid](
            *head, top.capacity, top.splits, self.splits, self.span, *strides,
            BLOCK_S=min(128, triton.next_power_of_2(self.S)), **common,
        )  # fmt: skip
        _systematic_kernel[grid](
            *head, rng, seed, top.capacity, top.splits, self.splits, self.span, *strides,
            **common,
        )  # fmt: skip
