"""triton-indexed: decode attention over listed rows of the cache, for the selection
methods (docs/algorithms.md section 10).

``indexed_attention`` computes, for every query head ``h`` of KV head ``g``,

    o_h = Σ_r w_{h,r} e^{s_{h,r}} v_r / Σ_r w_{h,r} e^{s_{h,r}},    s_{h,r} = τ q_h·k_r

over the rows ``r`` of a per-(sequence, KV head) list, read from a contiguous or paged
cache. The rows come from two sources, both optional per call:

- **listed rows**: ``indices [B, Hkv, R]`` (int32; a negative entry is no row), the first
  ``counts[b, g]`` of them (all ``R`` without ``counts``). With ``block = P > 1`` an entry
  ``i`` stands for the ``P`` rows ``i·P .. i·P + P − 1`` (Quest's pages); rows past the
  sequence's length are skipped. ``log_weights`` (fp32) gives ``log w`` per entry, shared
  by the group (``[B, Hkv, R]``) or per query head (``[B, Hq, R]``; ``-inf`` leaves a row
  out for that head); 0 without it.
- **a uniform tail** (:class:`UniformTail`): ``count[b, g]`` rows drawn uniformly (with
  replacement) from the tokens ``[lo_b, hi_b)`` inside the kernel (Philox, keyed by the
  seed, the device step counter, the (sequence, KV head) and the draw), each with
  ``log w = log_weight[b, g]``; a draw on a token marked in ``exclude [B, Hkv, ≥N]``
  counts 0. A count that reaches ``hi − lo`` reads every token of the range once instead
  (with the same ``log w``).

A caller that has every token's ``τ q·k`` already (a score pass's fp32 stash, as the
token selection methods do) passes it as ``scores``: a row's scores are then read from it
(``G`` floats) instead of computed from its key, so of the cache only V rows are read.

One program owns a KV head of a sequence and all ``G`` query heads of its group (the
group's queries padded to ``BLOCK_H ≥ 16`` rows, so both products run on tensor cores
with ``tl.dot``), and a split of the rows: the rows of a (sequence, KV head) are cut into
``num_splits`` equal runs of whole ``CHUNK``-row tiles, each program walks its run with
the online softmax and writes its partial (max, mass, unnormalised output) per head;
a second kernel merges the splits by log-sum-exp (skipped with one split). Row counts are
read on the device, so a call never synchronises with the host and can be captured in a
CUDA graph (pass ``out`` and a :class:`IndexedWorkspace`).

``qk_scores`` is the companion score pass: ``τ q·k`` of every cached token for every
query head (fp32, ``-inf`` past each length), one read of K.

Head dims: powers of two 16..256; bf16, fp16 or fp32 storage; fp32 accumulation.
Interpreter (``TRITON_INTERPRET=1``): bf16 dot operands are widened to fp32 first, as in
``triton_splitkv``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from santa_kernels.kv import KVCache
from santa_kernels.triton_splitkv import (
    _INTERPRETED,
    LOG2E,
    MIN_BLOCK_H,
    _mma,
    choose_num_splits,
    kv_capacity,
    num_sms,
)
from santa_kernels.validate import InputError, check_positive_int, check_scale

HEAD_DIMS = (16, 32, 64, 128, 256)
KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
CHUNK = {16: 64, 32: 64, 64: 64, 128: 64, 256: 32}  # rows a step of a program (chunk=)
CHUNKS = (16, 32, 64, 128, 256)  # the rows a step a call may ask for (both products' sizes)
SCORE_BLOCK_N = {16: 128, 32: 128, 64: 128, 128: 64, 256: 32}  # tokens a score program
NUM_WARPS = 4
MERGE_BLOCK_S = 16
# stage-1 programs per SM the split count aims for (each program's row loop waits on its
# gathers: more programs keep more of them in flight; 8: oracle-topk's step 286.5 -> 281.2
# us at 32/8/128, 32k, B=8 on an H100, profile-topk.md of
# results/h100/2026-12-07-h100-kernels-floor-32k-every-method)
PROGRAMS_PER_SM = 8


def indexed_available() -> tuple[bool, str]:
    """Returns ``(True, "cuda")``, ``(True, "interpreter")`` or ``(False, why)``."""
    if _INTERPRETED:
        return True, "interpreter"
    if torch.cuda.is_available():
        return True, "cuda"
    return False, "needs a CUDA GPU or TRITON_INTERPRET=1"


@dataclass(frozen=True)
class UniformTail:
    """Rows drawn uniformly inside the kernel (see the module docstring).

    ``count`` ``[B, Hkv]`` int32 draws; ``lo``/``hi`` ``[B]`` int32 token range;
    ``log_weight`` ``[B, Hkv]`` fp32; ``exclude`` ``[B, Hkv, ≥capacity]`` uint8 or None
    (a contiguous map of whole 4-byte words is read a word at a time, a load the row
    loop's pipeline stages; any other, a byte at a time);
    ``rng`` a one-element int64 device step counter (the caller advances it); ``seed`` the
    Philox key; ``stride`` draws kept apart per (sequence, KV head) (≥ the largest count);
    ``token_scores`` (or None) fp32 ``[B, Hkv, ≥capacity, Gp]``: each token's group scores
    side by side (``Gp`` the group padded to a power of two), which the draws read instead
    of the call's ``scores`` (one sector a draw; ``-inf`` on a token the tail leaves out,
    the marks of ``exclude`` then needless).
    """

    count: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor
    log_weight: torch.Tensor
    exclude: torch.Tensor | None
    rng: torch.Tensor
    seed: int
    stride: int
    token_scores: torch.Tensor | None = None


def _word_readable(exclude: torch.Tensor | None) -> bool:
    """Whether the kernel may read ``exclude``'s marks a 4-byte word at a time (the
    words of a contiguous map of whole words, from an aligned start)."""
    return (exclude is not None and exclude.is_contiguous() and exclude.numel() % 4 == 0
            and exclude.data_ptr() % 4 == 0)


class IndexedWorkspace:
    """The fp32 partials of the split programs (``(d + 2) · 4`` bytes per query head and
    split), allocated once; a call with no more heads, splits or head dim reuses them."""

    def __init__(self, batch: int, num_q_heads: int, head_dim: int, num_splits: int,
                 device: torch.device | str | None = None) -> None:
        for name, value in (("batch", batch), ("num_q_heads", num_q_heads),
                            ("head_dim", head_dim), ("num_splits", num_splits)):
            check_positive_int(value, name)
        rows = batch * num_q_heads * num_splits
        self.rows, self.head_dim, self.num_splits = rows, head_dim, num_splits
        self.partial_out = torch.empty(rows * head_dim, dtype=torch.float32, device=device)
        self.partial_m = torch.empty(rows, dtype=torch.float32, device=device)
        self.partial_l = torch.empty(rows, dtype=torch.float32, device=device)

    def check(self, batch: int, num_q_heads: int, head_dim: int, num_splits: int) -> None:
        """Raises unless one call's partials fit."""
        rows = batch * num_q_heads * num_splits
        if rows > self.rows or rows * head_dim > self.partial_out.numel():
            raise InputError(f"workspace: holds {self.rows} partial rows of {self.head_dim}, "
                             f"the call needs {rows} of {head_dim}")


# ---------------------------------------------------------------------------- kernels
@triton.jit
def _row_offsets(page_row_ptr, tok, ok, stride_kblk, stride_kn, PAGED: tl.constexpr,
                 PAGE_SIZE: tl.constexpr):
    """Element offsets of tokens ``tok`` from the (sequence or pool, KV head) base."""
    if PAGED:
        page = tl.load(page_row_ptr + tok // PAGE_SIZE, mask=ok, other=0).to(tl.int64)
        return page * stride_kblk + (tok % PAGE_SIZE).to(tl.int64) * stride_kn
    else:
        return tok.to(tl.int64) * stride_kn


@triton.jit
def _indexed_stage1(
    q_ptr, k_ptr, v_ptr, lengths_ptr, page_table_ptr,
    idx_ptr, count_ptr, lw_ptr,
    tail_count_ptr, tail_lo_ptr, tail_hi_ptr, tail_lw_ptr, exclude_ptr, rng_ptr,
    samples_ptr, score_ptr, tail_score_ptr,
    out_ptr, part_o_ptr, part_m_ptr, part_l_ptr,
    qk_scale, num_splits, idx_cap, seed, tail_stride, exclude_stride, tail_score_stride,
    stride_qb, stride_qh, stride_kblk, stride_kn, stride_kh, stride_ptb,
    stride_ob, stride_oh, stride_ib, stride_ih, stride_wb, stride_wh, stride_sb, stride_sh,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
    HAS_INDEX: tl.constexpr, HAS_COUNT: tl.constexpr, HAS_LW: tl.constexpr,
    LW_PER_HEAD: tl.constexpr, HAS_TAIL: tl.constexpr, HAS_EXCLUDE: tl.constexpr,
    EXCLUDE_WORDS: tl.constexpr,
    STORE_SAMPLES: tl.constexpr, WRITE_OUT: tl.constexpr, HAS_SCORES: tl.constexpr,
    TAIL_TOKEN_SCORES: tl.constexpr, GROUP_PAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr, WIDEN_BF16: tl.constexpr,
):
    split = tl.program_id(0)
    pid = tl.program_id(1)  # b * Hkv + g
    b = pid // NUM_KV_HEADS
    kv_head = pid % NUM_KV_HEADS
    offs_h = tl.arange(0, BLOCK_H)
    offs_c = tl.arange(0, CHUNK)
    offs_d = tl.arange(0, HEAD_DIM)
    mask_h = offs_h < GROUP
    heads = kv_head * GROUP + offs_h
    seq_len = tl.load(lengths_ptr + b).to(tl.int32)

    n_listed = 0
    if HAS_INDEX and HAS_COUNT:
        n_listed = tl.load(count_ptr + pid).to(tl.int32) * BLOCK
    elif HAS_INDEX:
        n_listed = idx_cap * BLOCK
    n_tail = 0
    t_lo = 0
    t_width = 0
    t_lw = 0.0
    rng_base = tl.cast(0, tl.int64)
    if HAS_TAIL:
        drawn_count = tl.load(tail_count_ptr + pid).to(tl.int32)
        t_lo = tl.load(tail_lo_ptr + b).to(tl.int32)
        t_width = tl.maximum(tl.load(tail_hi_ptr + b).to(tl.int32) - t_lo, 0)
        n_tail = tl.minimum(drawn_count, t_width)  # a count >= the range: each token once
        t_lw = tl.load(tail_lw_ptr + pid).to(tl.float32) * 1.4426950408889634
        rng_base = (tl.load(rng_ptr) << 32) + pid.to(tl.int64) * tail_stride
    total = n_listed + n_tail
    per_split = tl.cdiv(tl.cdiv(total, CHUNK), num_splits) * CHUNK
    lo = split * per_split
    hi = tl.minimum(lo + per_split, total)

    q_ptrs = q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=mask_h[:, None], other=0.0).to(k_ptr.dtype.element_ty)
    if PAGED:
        k_base = k_ptr + kv_head * stride_kh
        v_base = v_ptr + kv_head * stride_kh
    else:
        k_base = k_ptr + b.to(tl.int64) * stride_kblk + kv_head * stride_kh
        v_base = v_ptr + b.to(tl.int64) * stride_kblk + kv_head * stride_kh
    page_row_ptr = page_table_ptr + b * stride_ptb

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    for r0 in range(lo, hi, CHUNK):
        r = r0 + offs_c
        in_rows = r < hi
        listed = in_rows & (r < n_listed)
        slot = r // BLOCK
        tok = r * 0
        ok = listed
        if HAS_INDEX:
            idx = tl.load(idx_ptr + b * stride_ib + kv_head * stride_ih + slot, mask=listed,
                          other=-1)
            tok = idx * BLOCK + r % BLOCK
            ok = listed & (idx >= 0)
        tail_w = tl.zeros([CHUNK], tl.float32)
        drawn = in_rows & (r < 0)  # the tail's rows of the step (none without a tail)
        if HAS_TAIL:
            j = r - n_listed
            # (a scalar condition as a tensor: the interpreter's & of the two breaks masks)
            drawn = in_rows & (j >= 0) & ((offs_c * 0 + t_width) > 0)
            u = tl.rand(seed, rng_base + j)
            pick = tl.minimum((u * t_width.to(tl.float32)).to(tl.int32), t_width - 1)
            pick = tl.where(drawn_count >= t_width, j, pick)
            tok_t = t_lo + pick
            if STORE_SAMPLES:
                tl.store(samples_ptr + pid.to(tl.int64) * tail_stride + j, tok_t, mask=drawn)
            tok = tl.where(drawn, tok_t, tok)
            ok = ok | drawn
            tail_w = tl.where(drawn, t_lw, 0.0)
            if HAS_EXCLUDE:
                at = pid.to(tl.int64) * exclude_stride + tok_t
                if EXCLUDE_WORDS:  # the mark's 4-byte word: a load the pipeline stages
                    word = tl.load(exclude_ptr.to(tl.pointer_type(tl.int32)) + (at >> 2),
                                   mask=drawn, other=0)
                    hit = (word >> ((at & 3) * 8).to(tl.int32)) & 0xFF
                else:
                    hit = tl.load(exclude_ptr + at, mask=drawn, other=0)
        ok = ok & (tok >= 0) & (tok < seq_len)
        counted = ok
        if HAS_EXCLUDE:  # (with a tail only)
            # a draw on an excluded token counts 0: its row is read all the same (an exact
            # row, mostly in L2), so the row loads need not wait for the mark
            counted = ok & (hit == 0)
        row_off = _row_offsets(page_row_ptr, tok, ok, stride_kblk, stride_kn, PAGED,
                               PAGE_SIZE)
        kv_offs = row_off[:, None] + offs_d[None, :]
        scored = ok  # the rows whose scores come from the stash or their keys
        if TAIL_TOKEN_SCORES:  # the tail's from the token-major copy: one sector a draw
            scored = ok & ~drawn
        if HAS_SCORES:  # the score pass's τ q·k of the rows: no key is read
            s = tl.load(score_ptr + b.to(tl.int64) * stride_sb + heads[:, None] * stride_sh
                        + tok[None, :], mask=mask_h[:, None] & scored[None, :],
                        other=float("-inf")) * 1.4426950408889634
        else:
            k = tl.load(k_base + kv_offs, mask=scored[:, None], other=0.0)
            s = _mma(q, tl.trans(k), None, DOT_PRECISION, WIDEN_BF16) * qk_scale
        if TAIL_TOKEN_SCORES:
            s_t = tl.load(tail_score_ptr + pid.to(tl.int64) * tail_score_stride
                          + tok[None, :].to(tl.int64) * GROUP_PAD + offs_h[:, None],
                          mask=mask_h[:, None] & drawn[None, :], other=float("-inf"))
            s = tl.where(drawn[None, :], s_t * 1.4426950408889634, s)
        v = tl.load(v_base + kv_offs, mask=ok[:, None], other=0.0)
        s = s + tail_w[None, :]
        if HAS_LW:
            if LW_PER_HEAD:
                w_ptrs = (lw_ptr + b * stride_wb + heads[:, None] * stride_wh
                          + slot[None, :])
                lw = tl.load(w_ptrs, mask=mask_h[:, None] & listed[None, :], other=0.0)
                s = s + lw * 1.4426950408889634
            else:
                lw = tl.load(lw_ptr + b * stride_wb + kv_head * stride_wh + slot,
                             mask=listed, other=0.0)
                s = s + lw[None, :] * 1.4426950408889634
        s = tl.where(counted[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing yet
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        acc = _mma(p.to(v.dtype), v, acc, DOT_PRECISION, WIDEN_BF16)
        m_i = m_new

    if WRITE_OUT:
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o_ptrs = out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=mask_h[:, None])
    else:
        row = (b * (NUM_KV_HEADS * GROUP) + heads) * num_splits + split
        tl.store(part_m_ptr + row, m_i, mask=mask_h)
        tl.store(part_l_ptr + row, l_i, mask=mask_h)
        tl.store(part_o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], acc,
                 mask=mask_h[:, None])


@triton.jit
def _indexed_merge(
    part_o_ptr, part_m_ptr, part_l_ptr, out_ptr, num_splits, stride_ob, stride_oh,
    NUM_Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
):
    pid = tl.program_id(0)  # b * Hq + head
    b = pid // NUM_Q_HEADS
    head = pid % NUM_Q_HEADS
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM)
    first = pid * num_splits
    m_lanes = tl.full([BLOCK_S], float("-inf"), tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        mask_s = s0 + offs_s < num_splits
        m = tl.load(part_m_ptr + first + s0 + offs_s, mask=mask_s, other=float("-inf"))
        m_lanes = tl.maximum(m_lanes, m)
    m_max = tl.max(m_lanes, axis=0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # a head with no row at all
    l_lanes = tl.zeros([BLOCK_S], tl.float32)
    acc = tl.zeros([BLOCK_S, HEAD_DIM], tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        mask_s = s0 + offs_s < num_splits
        rows = first + s0 + offs_s
        m = tl.load(part_m_ptr + rows, mask=mask_s, other=float("-inf"))
        l_s = tl.load(part_l_ptr + rows, mask=mask_s, other=0.0)
        o_s = tl.load(part_o_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :],
                      mask=mask_s[:, None], other=0.0)
        w = tl.exp2(m - m_max)
        l_lanes += w * l_s
        acc += w[:, None] * o_s
    total = tl.sum(l_lanes, axis=0)
    o = tl.sum(acc, axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + b * stride_ob + head * stride_oh + offs_d,
             o.to(out_ptr.dtype.element_ty))


@triton.jit
def _scores_kernel(
    q_ptr, k_ptr, lengths_ptr, page_table_ptr, s_ptr, tau, capacity,
    stride_qb, stride_qh, stride_kblk, stride_kn, stride_kh, stride_ptb, stride_sb, stride_sh,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr, DOT_PRECISION: tl.constexpr, WIDEN_BF16: tl.constexpr,
):
    tile = tl.program_id(0)
    pid = tl.program_id(1)
    b = pid // NUM_KV_HEADS
    kv_head = pid % NUM_KV_HEADS
    offs_h = tl.arange(0, BLOCK_H)
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    mask_h = offs_h < GROUP
    heads = kv_head * GROUP + offs_h
    seq_len = tl.load(lengths_ptr + b).to(tl.int32)
    ok = offs_n < seq_len
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_h[:, None], other=0.0).to(k_ptr.dtype.element_ty)
    if PAGED:
        k_base = k_ptr + kv_head * stride_kh
    else:
        k_base = k_ptr + b.to(tl.int64) * stride_kblk + kv_head * stride_kh
    row_off = _row_offsets(page_table_ptr + b * stride_ptb, offs_n, ok, stride_kblk,
                           stride_kn, PAGED, PAGE_SIZE)
    k = tl.load(k_base + row_off[:, None] + offs_d[None, :], mask=ok[:, None], other=0.0)
    s = _mma(q, tl.trans(k), None, DOT_PRECISION, WIDEN_BF16) * tau
    s = tl.where(ok[None, :], s, float("-inf"))
    tl.store(s_ptr + b * stride_sb + heads[:, None] * stride_sh + offs_n[None, :], s,
             mask=mask_h[:, None] & (offs_n < capacity)[None, :])


# -------------------------------------------------------------------------------- API
@dataclass(frozen=True)
class _Static:
    """What a launch derives from shapes and dtypes only."""

    group: int
    block_h: int
    widen_bf16: bool
    precision: str
    paged: bool
    page_size: int


@functools.lru_cache(maxsize=256)
def _static(q_shape: tuple[int, ...], q_dtype: torch.dtype, device: torch.device, layout: str,
            k_shape: tuple[int, ...], kv_dtype: torch.dtype, k_strides: tuple[int, ...],
            v_strides: tuple[int, ...]) -> _Static:
    if len(q_shape) != 3:
        raise InputError(f"q: expected a tensor [B, Hq, d], got {q_shape}")
    _, hq, d = q_shape
    hkv = k_shape[2]
    if d != k_shape[3]:
        raise InputError(f"q: head dim {d} does not match the KV cache head dim {k_shape[3]}")
    if d not in HEAD_DIMS:
        raise InputError(f"k: head dim {d} is not supported by triton-indexed "
                         f"(supported: {list(HEAD_DIMS)})")
    if hq % hkv:
        raise InputError(f"q: {hq} query heads is not a multiple of {hkv} KV heads")
    for name, dtype in (("q", q_dtype), ("k", kv_dtype)):
        if dtype not in KERNEL_DTYPES:
            raise InputError(f"{name}: dtype {dtype} is not supported by triton-indexed "
                             "(bfloat16, float16, float32)")
    if k_strides != v_strides or k_strides[3] != 1:
        raise InputError("k: K and V must share strides with a unit-stride head dim")
    ok, why = indexed_available()
    if not ok:
        raise InputError(f"q: triton-indexed {why}")
    if why == "cuda" and device.type != "cuda":
        raise InputError(f"q: triton-indexed runs on CUDA tensors, got {device}")
    group = hq // hkv
    widen = kv_dtype == torch.bfloat16 and _INTERPRETED
    return _Static(group, max(MIN_BLOCK_H, triton.next_power_of_2(group)), widen,
                   "ieee" if kv_dtype == torch.float32 or widen else "tf32",
                   layout == "paged", k_shape[1] if layout == "paged" else 1)


def _static_for(q: torch.Tensor, kv: KVCache) -> _Static:
    if not isinstance(kv, KVCache):
        raise InputError(f"kv: expected a santa_kernels.KVCache, got {type(kv).__name__}")
    if q.device != kv.k.device:
        raise InputError(f"q: on {q.device}, the KV cache is on {kv.k.device}")
    return _static(tuple(q.shape), q.dtype, q.device, kv.layout, tuple(kv.k.shape),
                   kv.k.dtype, kv.k.stride(), kv.v.stride())


def check_chunk(chunk: int | None, head_dim: int) -> int:
    """The rows a step of a call: ``chunk``, or :data:`CHUNK`'s for the head dim."""
    if head_dim not in CHUNK:
        raise InputError(f"k: head dim {head_dim} is not supported by triton-indexed")
    if chunk is None:
        return CHUNK[head_dim]
    if isinstance(chunk, bool) or chunk not in CHUNKS:
        raise InputError(f"chunk: expected one of {', '.join(map(str, CHUNKS))}, "
                         f"got {chunk!r}")
    return chunk


def choose_splits(q: torch.Tensor, kv: KVCache, rows: int,
                  programs_per_sm: int = PROGRAMS_PER_SM, chunk: int | None = None) -> int:
    """Splits for a call expected to attend ``rows`` rows per (sequence, KV head) in
    ``chunk``-row steps (:data:`CHUNK`'s by default), aimed at ``programs_per_sm``
    programs an SM."""
    return choose_num_splits(q.shape[0] * kv.num_kv_heads, max(1, rows),
                             check_chunk(chunk, q.shape[2]), num_sms(q.device),
                             programs_per_sm)


def indexed_attention(
    q: torch.Tensor,
    kv: KVCache,
    indices: torch.Tensor | None = None,
    *,
    counts: torch.Tensor | None = None,
    log_weights: torch.Tensor | None = None,
    block: int = 1,
    tail: UniformTail | None = None,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    workspace: IndexedWorkspace | None = None,
    num_splits: int | None = None,
    samples: torch.Tensor | None = None,
    scores: torch.Tensor | None = None,
    chunk: int | None = None,
    max_registers: int | None = None,
    stages: int | None = None,
) -> torch.Tensor:
    """Returns ``[B, Hq, d]`` attention over the listed rows and the uniform tail (see the
    module docstring). ``num_splits`` defaults to what :func:`choose_splits` gives for the
    listed rows (``workspace.num_splits`` when a workspace is passed). ``samples``
    (``[B · Hkv, tail.stride]`` int32) receives the tail's drawn tokens (tests, read
    counts). ``scores`` (fp32 ``[B, Hq, ≥N]``, unit stride in N: :func:`qk_scores`' or a
    score pass's ``τ q·k`` at this ``scale``) gives each row's scores, so no key is read.
    ``chunk``: the rows a program gathers a step (one of :data:`CHUNKS`; :data:`CHUNK`'s
    for the head dim by default); the tail's draws do not depend on it or on the splits.
    ``max_registers``: the registers a thread of the row programs may use (the launch's
    ``maxnreg``; the compiler's choice when None): fewer, more programs an SM.
    ``stages``: the software pipeline's stages of their row loop (the launch's
    ``num_stages``; Triton's default when None): more, more row steps' loads in flight.
    Does no host-device sync."""
    st = _static_for(q, kv)
    batch, hq, d = q.shape
    hkv = kv.num_kv_heads
    tau = check_scale(scale, d)
    check_positive_int(block, "block")
    chunk = check_chunk(chunk, d)
    for name, value in (("max_registers", max_registers), ("stages", stages)):
        if value is not None:
            check_positive_int(value, name)
    if indices is None and tail is None:
        raise InputError("indices: give row indices, a uniform tail, or both")
    if indices is not None and (indices.dim() != 3 or tuple(indices.shape[:2]) != (batch, hkv)
                                or indices.dtype != torch.int32 or indices.stride(2) != 1):
        raise InputError(f"indices: expected an int32 tensor [B={batch}, Hkv={hkv}, R] with "
                         f"unit stride in R, got {tuple(indices.shape)} {indices.dtype}")
    idx_cap = 0 if indices is None else indices.shape[2]
    per_head = False
    if log_weights is not None:
        if indices is None or log_weights.dtype != torch.float32 or log_weights.dim() != 3:
            raise InputError("log_weights: expected fp32 [B, Hkv or Hq, R] beside indices")
        per_head = log_weights.shape[1] == hq and hq != hkv
        if (log_weights.shape[0] != batch or log_weights.shape[1] not in (hkv, hq)
                or log_weights.shape[2] != idx_cap or log_weights.stride(2) != 1):
            raise InputError(f"log_weights: expected [B, Hkv or Hq, {idx_cap}], got "
                             f"{tuple(log_weights.shape)}")
    if scores is not None and (scores.dtype != torch.float32 or scores.dim() != 3
                               or tuple(scores.shape[:2]) != (batch, hq)
                               or scores.shape[2] < kv_capacity(kv) or scores.stride(2) != 1):
        raise InputError(f"scores: expected an fp32 tensor [B={batch}, Hq={hq}, "
                         f">={kv_capacity(kv)}] with unit stride, got {tuple(scores.shape)} "
                         f"{scores.dtype}")
    if num_splits is None:
        num_splits = (workspace.num_splits if workspace is not None
                      else choose_splits(q, kv, idx_cap * block, chunk=chunk))
    check_positive_int(num_splits, "num_splits")
    if out is None:
        out = torch.empty((batch, hq, d), dtype=q.dtype, device=q.device)
    elif out.shape != q.shape or out.dtype not in KERNEL_DTYPES or out.stride(2) != 1:
        raise InputError(f"out: expected a bf16/fp16/fp32 tensor {tuple(q.shape)} with unit "
                         "stride in d")
    if q.stride(2) != 1:
        q = q.contiguous()
    if num_splits > 1:
        if workspace is None:
            workspace = IndexedWorkspace(batch, hq, d, num_splits, device=q.device)
        workspace.check(batch, hq, d, num_splits)
        parts = (workspace.partial_out, workspace.partial_m, workspace.partial_l)
    else:
        parts = (out, out, out)
    dummy = kv.lengths
    page_table = kv.page_table if st.paged else dummy
    k_strides = kv.k.stride()
    idx_t = indices if indices is not None else dummy
    lw_t = log_weights if log_weights is not None else dummy
    token_scores = tail.token_scores if tail is not None else None
    if token_scores is not None and (
            token_scores.dtype != torch.float32 or token_scores.dim() != 4
            or tuple(token_scores.shape[:2]) != (batch, hkv)
            or token_scores.shape[2] < kv_capacity(kv)
            or token_scores.shape[3] < st.group or not token_scores.is_contiguous()):
        raise InputError(f"tail.token_scores: expected a contiguous fp32 tensor [B={batch}, "
                         f"Hkv={hkv}, >={kv_capacity(kv)}, >={st.group}], got "
                         f"{tuple(token_scores.shape)} {token_scores.dtype}")
    if tail is not None:
        tail_args = (tail.count, tail.lo, tail.hi, tail.log_weight,
                     tail.exclude if tail.exclude is not None else dummy, tail.rng)
        exclude_stride = tail.exclude.stride(1) if tail.exclude is not None else 0
        if tail.exclude is not None and (tail.exclude.dtype != torch.uint8
                                         or tail.exclude.stride(2) != 1
                                         or tail.exclude.stride(0) != hkv * exclude_stride):
            raise InputError("tail.exclude: expected a contiguous uint8 [B, Hkv, N]")
    else:
        tail_args = (dummy,) * 6
        exclude_stride = 0
    _indexed_stage1[(num_splits, batch * hkv)](
        q, kv.k, kv.v, kv.lengths, page_table,
        idx_t, counts if counts is not None else dummy, lw_t,
        *tail_args, samples if samples is not None else dummy,
        scores if scores is not None else dummy,
        token_scores if token_scores is not None else dummy, out, *parts,
        tau * LOG2E, num_splits, idx_cap, tail.seed if tail is not None else 0,
        tail.stride if tail is not None else 0, exclude_stride,
        token_scores.stride(1) if token_scores is not None else 0,
        q.stride(0), q.stride(1), k_strides[0], k_strides[1], k_strides[2],
        page_table.stride(0) if st.paged else 0, out.stride(0), out.stride(1),
        idx_t.stride(0) if indices is not None else 0,
        idx_t.stride(1) if indices is not None else 0,
        lw_t.stride(0) if log_weights is not None else 0,
        lw_t.stride(1) if log_weights is not None else 0,
        scores.stride(0) if scores is not None else 0,
        scores.stride(1) if scores is not None else 0,
        NUM_KV_HEADS=hkv, GROUP=st.group, HEAD_DIM=d, BLOCK_H=st.block_h, CHUNK=chunk,
        BLOCK=block, PAGED=st.paged, PAGE_SIZE=st.page_size,
        HAS_INDEX=indices is not None, HAS_COUNT=counts is not None,
        HAS_LW=log_weights is not None, LW_PER_HEAD=per_head, HAS_TAIL=tail is not None,
        HAS_EXCLUDE=tail is not None and tail.exclude is not None,
        EXCLUDE_WORDS=tail is not None and _word_readable(tail.exclude),
        STORE_SAMPLES=samples is not None and tail is not None,
        WRITE_OUT=num_splits == 1, HAS_SCORES=scores is not None,
        TAIL_TOKEN_SCORES=token_scores is not None,
        GROUP_PAD=token_scores.shape[3] if token_scores is not None else 1,
        DOT_PRECISION=st.precision, WIDEN_BF16=st.widen_bf16, num_warps=NUM_WARPS,
        maxnreg=max_registers, num_stages=stages,
    )  # fmt: skip
    if num_splits > 1:
        _indexed_merge[(batch * hq,)](
            *parts, out, num_splits, out.stride(0), out.stride(1),
            NUM_Q_HEADS=hq, HEAD_DIM=d,
            BLOCK_S=min(MERGE_BLOCK_S, triton.next_power_of_2(num_splits)),
            num_warps=NUM_WARPS,
        )  # fmt: skip
    return out


def qk_scores(q: torch.Tensor, kv: KVCache, *, scale: float | None = None,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """Returns ``[B, Hq, capacity]`` fp32 scores ``τ q·k`` of every cached token, ``-inf``
    past each sequence's length (``capacity``: the cache's rows per sequence). One read of
    K; no host-device sync."""
    st = _static_for(q, kv)
    batch, hq, d = q.shape
    cap = kv_capacity(kv)
    tau = check_scale(scale, d)
    if out is None:
        out = torch.empty((batch, hq, cap), dtype=torch.float32, device=q.device)
    elif (out.shape != (batch, hq, cap) or out.dtype != torch.float32
          or out.stride(2) != 1):
        raise InputError(f"out: expected an fp32 tensor {(batch, hq, cap)}")
    block_n = SCORE_BLOCK_N[d]
    page_table = kv.page_table if st.paged else kv.lengths
    k_strides = kv.k.stride()
    _scores_kernel[(math.ceil(cap / block_n), batch * kv.num_kv_heads)](
        q, kv.k, kv.lengths, page_table, out, tau, cap,
        q.stride(0), q.stride(1), k_strides[0], k_strides[1], k_strides[2],
        page_table.stride(0) if st.paged else 0, out.stride(0), out.stride(1),
        NUM_KV_HEADS=kv.num_kv_heads, GROUP=st.group, HEAD_DIM=d, BLOCK_H=st.block_h,
        BLOCK_N=block_n, PAGED=st.paged, PAGE_SIZE=st.page_size,
        DOT_PRECISION=st.precision, WIDEN_BF16=st.widen_bf16, num_warps=NUM_WARPS,
    )  # fmt: skip
    return out
