"""triton-splitkv: the suite's own FlashDecoding, exact dense decode attention in Triton.

One decode step ``o = softmax(τ q Kᵀ) V`` (docs/algorithms.md section 1) computed with the
split-KV tiling of section 4, in two kernels:

- **Stage 1** (``_splitkv_stage1``), grid ``(num_splits, B * Hkv)``. A program owns one
  KV head of one sequence and *all* ``G = Hq / Hkv`` query heads of its group, so each
  K/V tile is read once per group. The group's queries are padded to ``BLOCK_H >= 16``
  rows so both products run on tensor cores (``tl.dot``): scores
  ``[BLOCK_H, d] x [d, BLOCK_N]`` and ``p [BLOCK_H, BLOCK_N] x V [BLOCK_N, d]``.
  The program walks its chunk of the sequence in ``BLOCK_N``-token tiles with the
  online softmax and writes, per query head, the running max ``m`` (base-2 logits),
  the mass ``ℓ = Σ 2^(s - m)`` and the unnormalised output ``Σ 2^(s - m) v`` (fp32) to a
  workspace. With ``num_splits == 1`` it normalises and writes the output directly and
  stage 2 is skipped.
- **Stage 2** (``_splitkv_stage2``), grid ``(B * Hq,)``: merges the partials across
  splits by log-sum-exp, ``o = Σ_s 2^(m_s - M) acc_s / Σ_s 2^(m_s - M) ℓ_s`` with
  ``M = max_s m_s``, and writes ``[B, Hq, d]`` in the output's dtype.

Splits are cut per sequence inside the kernel: sequence ``b`` of valid length ``L_b``
has ``T_b = ceil(L_b / BLOCK_N)`` tiles and split ``s`` takes the whole tiles
``[s·c_b, (s+1)·c_b)`` with ``c_b = ceil(T_b / num_splits)``. Only the sequence's last
tile is partial (masked); splits past the end write an empty partial (``m = -inf``,
``ℓ = 0``), which the merge weighs by zero. Sequences of different lengths in one batch
therefore each spread over all splits.

Layouts: contiguous ``[B, N, Hkv, d]`` and paged ``[num_pages, page_size, Hkv, d]`` with
``page_table [B, max_pages]`` (any power-of-two page size). When ``page_size`` is a
multiple of ``BLOCK_N`` a tile lies inside one page and costs one page-table load;
otherwise (small pages) every row looks up its own page. Head dims: powers of two 16..256;
any GQA group size; q/K/V in bf16, fp16 or fp32 (fp32 products use IEEE fp32, not TF32);
accumulation in fp32; scale defaults to ``1/sqrt(d)``.

CUDA graphs: ``splitkv_decode`` never synchronises with the host (it does not read
``lengths`` or check values for NaN; the :class:`~santa_kernels.KVCache` constructor
already did). The split count is chosen from static shapes (the cache's capacity, not
its valid lengths). Pass a preallocated ``out`` and a :class:`SplitKVWorkspace` to make
a call allocation-free, so it can be captured and replayed::

    ws = SplitKVWorkspace.for_inputs(q, kv)          # once, outside capture
    out = torch.empty_like(q)
    splitkv_decode(q, kv, out=out, workspace=ws)     # capture / replay this

Host cost: everything that depends only on shapes, dtypes and strides (checks, split
count, constexprs) is planned once per shape and cached, so a steady decode loop pays
a few attribute reads plus the two Triton launches.

Interpreter (``TRITON_INTERPRET=1``, CPU tests): identical code, except that bf16 dot
operands are widened to fp32 first, because the interpreter multiplies bf16 bit patterns.

Tuning knobs: :data:`CONFIGS` (tile and launch parameters per head dim),
:func:`choose_num_splits` (grid size) or an explicit ``num_splits`` / ``config``.

Byte model (what the benchmark divides by time; :func:`splitkv_bytes` computes it)::

    bytes = Σ_b L_b · Hkv · d · 2 · e_kv            K and V rows of the valid tokens
          + B · Hq · d · e_q                        q
          + B · Hq · d · e_out                      out
          + 2 · B · Hq · S · (d + 2) · 4            workspace: stage 1 writes the fp32
                                                    partials (acc, m, ℓ), stage 2 reads them
                                                    (0 when S = num_splits = 1)
          (+ page-table entries read: Σ_b Hkv · ⌈L_b / page_size⌉ · 4, negligible,
           and B lengths; both ignored by splitkv_bytes' headline figure)

with ``e_*`` the element sizes in bytes. At Llama-3.1-8B shape (Hq=32, Hkv=8, d=128,
bf16), 32k tokens, B=1 and S≈32: 134.2 MB of K+V against ~1.1 MB of workspace traffic.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from santa_kernels.kv import KVCache
from santa_kernels.triton_launch import _pdl_trigger, _pdl_wait, pdl_available
from santa_kernels.validate import InputError, check_positive_int, check_scale

LOG2E = 1.4426950408889634  # scores are kept in base 2 so the kernel can use exp2

# ----------------------------------------------------------------------------- config


@dataclass(frozen=True)
class SplitKVConfig:
    """Tile and launch parameters of stage 1.

    ``block_n``: tokens per tile for 16-bit KV (halved for fp32 KV, so a tile keeps its
    byte size); ``num_warps``: warps per program; ``num_stages``: Triton's
    software-pipelining depth for the contiguous layout; ``paged_num_stages``: the same
    for the paged layout, where the pipeliner spends stages on the page-table load that
    the K/V addresses depend on.
    """

    block_n: int
    num_warps: int
    num_stages: int
    paged_num_stages: int


# Per head dim, for Hopper (H100/H200: 227 KB shared memory per block, 64K registers per
# SM). A K+V tile pair is 32 KB in 16-bit storage at every d (64x128, 128x64, 256x32
# rows x d). Compiled for sm_90 (Triton 3.9), num_stages=3 double-buffers the pair
# (~70 KB shared memory; 128 registers a thread at d=128, no spills), so three programs
# fit on an SM and each keeps one 32 KB tile pair in flight while it computes on the
# other: ~64-96 KB in flight per SM, above the ~31-62 KB that 4.1 TB/s / 132 SMs x
# 1-2 us of latency needs. The paged path reaches the same double buffering only at
# num_stages=5 (3 and 4 leave a single K/V buffer: the page-table load takes a stage).
# num_stages=4 (three buffers, ~102 KB) is the next thing to try on the GPU.
CONFIGS: dict[int, SplitKVConfig] = {
    16: SplitKVConfig(block_n=128, num_warps=4, num_stages=3, paged_num_stages=5),
    32: SplitKVConfig(block_n=128, num_warps=4, num_stages=3, paged_num_stages=5),
    64: SplitKVConfig(block_n=128, num_warps=4, num_stages=3, paged_num_stages=5),
    128: SplitKVConfig(block_n=64, num_warps=4, num_stages=3, paged_num_stages=5),
    256: SplitKVConfig(block_n=32, num_warps=4, num_stages=3, paged_num_stages=5),
}

STAGE2_NUM_WARPS = 4
STAGE2_BLOCK_S = 16  # splits merged per step of the stage-2 loop
MIN_BLOCK_H = 16  # tl.dot needs >= 16 rows; the GQA group is padded up to this
# stage 2 as a programmatic dependent of stage 1 (its launch overlapping stage 1's last
# wave) where pdl_available(). H200, e2e loop at 32k (results/h200/e2e-variants-2026-12-01-s8
# /1-variants.csv): step 7.97-8.00 -> 7.99 ms at B=4, 11.81 -> 11.81 at B=8: off
MERGE_PDL = False
MAX_SPLITS = 128
MIN_TILES_PER_SPLIT = 2  # a split shorter than this mostly pays its own prologue
TARGET_PROGRAMS_PER_SM = 2  # "waves": stage-1 programs per SM the split count aims for
DEFAULT_NUM_SMS = 132  # H200; used when there is no CUDA device (interpreter)


def default_config(head_dim: int, kv_dtype: torch.dtype) -> SplitKVConfig:
    """Returns the stage-1 config for ``head_dim`` and the KV storage dtype."""
    if head_dim not in CONFIGS:
        raise InputError(
            f"k: head dim {head_dim} is not supported by triton-splitkv "
            f"(supported: {sorted(CONFIGS)})"
        )
    cfg = CONFIGS[head_dim]
    if kv_dtype == torch.float32:  # same tile bytes with 4-byte elements
        cfg = dataclasses.replace(cfg, block_n=max(16, cfg.block_n // 2))
    return cfg


@functools.cache
def _cuda_num_sms(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (``DEFAULT_NUM_SMS`` off CUDA)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _cuda_num_sms(index)
    return DEFAULT_NUM_SMS


def choose_num_splits(
    batch_kv_heads: int,
    max_len: int,
    block_n: int,
    sms: int = DEFAULT_NUM_SMS,
    programs_per_sm: int = TARGET_PROGRAMS_PER_SM,
) -> int:
    """Returns the number of KV splits for ``batch_kv_heads = B * Hkv`` stage-1 rows.

    Aims for at least ``programs_per_sm * sms`` stage-1 programs (about two waves), then
    among up to twice that many picks the split count whose last wave is fullest
    (``waves / ceil(waves)``, smallest count on ties). Each count is first evened out
    over the tiles (``ceil(T / ceil(T / s))``) so no split is left empty at ``max_len``.
    Capped by ``MAX_SPLITS`` and by ``MIN_TILES_PER_SPLIT`` tiles per split; a batch that
    already fills the target gets 1 split (no merge kernel).
    """
    tiles = max(1, math.ceil(max_len / block_n))
    cap = max(1, min(MAX_SPLITS, tiles // MIN_TILES_PER_SPLIT))
    target = programs_per_sm * sms
    if batch_kv_heads >= target or cap == 1:
        return 1
    s_min = min(cap, math.ceil(target / batch_kv_heads))
    best, best_eff = 1, -1.0
    for s in range(s_min, min(cap, 2 * s_min) + 1):
        even = math.ceil(tiles / math.ceil(tiles / s))  # splits that actually get tiles
        waves = batch_kv_heads * even / sms
        eff = waves / math.ceil(waves)
        if eff > best_eff + 1e-9:
            best, best_eff = even, eff
    return best


def kv_capacity(kv: KVCache) -> int:
    """Longest sequence the cache can hold (from shapes only; no device sync)."""
    if kv.layout == "paged":
        return int(kv.page_table.shape[1]) * kv.page_size
    return int(kv.k.shape[1])


# -------------------------------------------------------------------------- workspace


class SplitKVWorkspace:
    """Reusable fp32 buffers for the stage-1 partials, so repeated calls allocate nothing.

    Holds room for ``batch * num_q_heads * num_splits`` partial rows of ``head_dim``
    (accumulator) plus one ``m`` and one ``ℓ`` each: ``(d + 2) * 4`` bytes a row. A
    workspace sized for one shape serves any call needing no more rows and elements.
    Not thread- or stream-safe: concurrent calls must use different workspaces.
    """

    def __init__(
        self,
        batch: int,
        num_q_heads: int,
        head_dim: int,
        num_splits: int,
        device: torch.device | str | None = None,
    ) -> None:
        for name, value in (
            ("batch", batch),
            ("num_q_heads", num_q_heads),
            ("head_dim", head_dim),
            ("num_splits", num_splits),
        ):
            check_positive_int(value, name)
        rows = batch * num_q_heads * num_splits
        self.rows = rows
        self.head_dim = head_dim
        self.num_splits = num_splits
        self.partial_out = torch.empty(rows * head_dim, dtype=torch.float32, device=device)
        self.partial_m = torch.empty(rows, dtype=torch.float32, device=device)
        self.partial_l = torch.empty(rows, dtype=torch.float32, device=device)

    @classmethod
    def for_inputs(
        cls,
        q: torch.Tensor,
        kv: KVCache,
        num_splits: int | None = None,
        config: SplitKVConfig | None = None,
    ) -> SplitKVWorkspace:
        """Returns a workspace sized for ``splitkv_decode(q, kv, num_splits=...)``."""
        batch, num_q_heads, head_dim = q.shape
        splits = _plan_for(q, kv, num_splits, config).splits
        return cls(batch, num_q_heads, head_dim, splits, device=q.device)

    @property
    def nbytes(self) -> int:
        return 4 * (self.partial_out.numel() + self.partial_m.numel() + self.partial_l.numel())

    def check(
        self, batch: int, num_q_heads: int, head_dim: int, num_splits: int, device: torch.device
    ) -> None:
        """Raises unless this workspace can hold one call's partials (it needs no views:
        the kernels index the flat buffers from their start)."""
        rows = batch * num_q_heads * num_splits
        if rows > self.rows or rows * head_dim > self.partial_out.numel():
            raise InputError(
                f"workspace: holds {self.rows} partial rows of {self.head_dim}, the call needs "
                f"{rows} of {head_dim} (B={batch}, Hq={num_q_heads}, num_splits={num_splits})"
            )
        if self.partial_out.device != device:
            raise InputError(f"workspace: on {self.partial_out.device}, the inputs are on {device}")


# ---------------------------------------------------------------------------- kernels


@triton.jit
def _kv_tile_offsets(
    page_row_ptr,  # this sequence's page-table row (paged only)
    start_n,  # first token of the tile
    offs_n,  # [BLOCK_N] token offsets inside the tile
    mask_n,  # [BLOCK_N] valid tokens
    stride_kblk,  # elements between pages (paged only)
    stride_kn,  # elements between consecutive tokens
    PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Returns ``(tile_off, row_off)``: token ``start_n + offs_n`` sits at element offset
    ``tile_off + row_off`` from the (sequence or page pool, KV head) base pointer."""
    if not PAGED:
        # int64 tile start keeps offsets past 2^31 elements (very long contexts) exact
        return tl.cast(start_n, tl.int64) * stride_kn, offs_n * stride_kn
    elif PAGE_SIZE % BLOCK_N == 0:
        # tiles are BLOCK_N-aligned, so the whole tile lies in one page: one lookup
        page = tl.load(page_row_ptr + start_n // PAGE_SIZE).to(tl.int64)
        return page * stride_kblk + (start_n % PAGE_SIZE) * stride_kn, offs_n * stride_kn
    else:
        # pages smaller than (or not a multiple of) the tile: look up each row's page
        tok = start_n + offs_n
        page = tl.load(page_row_ptr + tok // PAGE_SIZE, mask=mask_n, other=0).to(tl.int64)
        return tl.cast(0, tl.int64), page * stride_kblk + (tok % PAGE_SIZE) * stride_kn


@triton.jit
def _mma(a, b, acc, DOT_PRECISION: tl.constexpr, WIDEN_BF16: tl.constexpr):
    """Returns ``acc + a @ b`` (tensor cores on GPU). The Triton interpreter multiplies
    the raw bit patterns of bf16 operands (triton-lang/triton#11584), so under it bf16
    operands are widened to fp32 first; the values, hence the result, are the same."""
    if WIDEN_BF16:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc=acc, input_precision=DOT_PRECISION)


@triton.jit
def _splitkv_stage1(
    q_ptr,
    k_ptr,
    v_ptr,
    lengths_ptr,
    page_table_ptr,
    out_ptr,
    part_o_ptr,
    part_m_ptr,
    part_l_ptr,
    qk_scale,  # τ · log2(e): scores come out in base 2
    num_splits,
    stride_qb,
    stride_qh,
    stride_kblk,  # K/V dim 0: sequence (contiguous) or page (paged)
    stride_kn,  # K/V dim 1: token (contiguous) or slot in page (paged)
    stride_kh,  # K/V dim 2: KV head (dim 3, d, is unit-stride)
    stride_ptb,
    stride_ob,
    stride_oh,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,  # query heads per KV head
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,  # GROUP padded to a power of two >= 16 (tensor-core rows)
    BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    WRITE_OUT: tl.constexpr,  # num_splits == 1: normalise and write the output here
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 KV (no TF32); ignored for 16-bit
    WIDEN_BF16: tl.constexpr,  # interpreter + bf16 only, see _mma
    ENTRY_PDL: tl.constexpr = False,  # launched as a programmatic dependent: wait first
    LET_NEXT: tl.constexpr = False,  # the next kernel may launch as this one starts
):
    _pdl_wait(ENTRY_PDL)
    _pdl_trigger(LET_NEXT)
    split = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // NUM_KV_HEADS
    kv_head = pid_bh % NUM_KV_HEADS

    offs_h = tl.arange(0, BLOCK_H)  # query head inside the group (padded rows masked)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    mask_h = offs_h < GROUP
    heads = kv_head * GROUP + offs_h  # global query-head index

    # This split's tokens [lo, hi): whole tiles, so only the sequence's last tile is partial.
    seq_len = tl.load(lengths_ptr + b).to(tl.int32)
    tiles_per_split = tl.cdiv(tl.cdiv(seq_len, BLOCK_N), num_splits)
    lo = split * tiles_per_split * BLOCK_N
    hi = tl.minimum(lo + tiles_per_split * BLOCK_N, seq_len)

    # The group's queries, cast to the KV dtype so tl.dot sees one input type.
    q_ptrs = q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=mask_h[:, None], other=0.0).to(k_ptr.dtype.element_ty)

    # Base pointers of this KV head (and, contiguous, of this sequence).
    if PAGED:
        k_base = k_ptr + kv_head * stride_kh
        v_base = v_ptr + kv_head * stride_kh
    else:
        k_base = k_ptr + b.to(tl.int64) * stride_kblk + kv_head * stride_kh
        v_base = v_ptr + b.to(tl.int64) * stride_kblk + kv_head * stride_kh
    page_row_ptr = page_table_ptr + b * stride_ptb

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)  # running max (base-2 logits)
    l_i = tl.zeros([BLOCK_H], tl.float32)  # running mass Σ 2^(s - m_i)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)  # running Σ 2^(s - m_i) v
    for start_n in range(lo, hi, BLOCK_N):
        mask_n = start_n + offs_n < hi
        tile_off, row_off = _kv_tile_offsets(
            page_row_ptr,
            start_n,
            offs_n,
            mask_n,
            stride_kblk,
            stride_kn,
            PAGED,
            PAGE_SIZE,
            BLOCK_N,
        )
        kv_offs = tile_off + row_off[:, None] + offs_d[None, :]
        k = tl.load(k_base + kv_offs, mask=mask_n[:, None], other=0.0)
        v = tl.load(v_base + kv_offs, mask=mask_n[:, None], other=0.0)

        # Scores of all the group's heads against the tile: [BLOCK_H, BLOCK_N].
        s = _mma(q, tl.trans(k), None, DOT_PRECISION, WIDEN_BF16) * qk_scale
        s = tl.where(mask_n[None, :], s, float("-inf"))

        # Online softmax: rescale what was accumulated under the old max.
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)  # 0 on the first tile (m_i = -inf)
        p = tl.exp2(s - m_new[:, None])  # masked tokens: 2^-inf = 0
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        # p is rounded to the KV dtype (as FlashAttention does) to use the tensor cores.
        acc = _mma(p.to(v.dtype), v, acc, DOT_PRECISION, WIDEN_BF16)
        m_i = m_new

    if WRITE_OUT:
        # One split covers the whole sequence (>= 1 token), so l_i > 0.
        o = acc / l_i[:, None]
        o_ptrs = out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=mask_h[:, None])
    else:
        # Partial row of (b, head, split); empty splits store m=-inf, l=0, acc=0.
        row = (b * (NUM_KV_HEADS * GROUP) + heads) * num_splits + split
        tl.store(part_m_ptr + row, m_i, mask=mask_h)
        tl.store(part_l_ptr + row, l_i, mask=mask_h)
        tl.store(part_o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=mask_h[:, None])


@triton.jit
def _splitkv_stage2(
    part_o_ptr,
    part_m_ptr,
    part_l_ptr,
    out_ptr,
    num_splits,
    stride_ob,
    stride_oh,
    NUM_Q_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,  # splits merged per loop step
    PDL: tl.constexpr = False,  # launched as a programmatic dependent of stage 1
    LET_NEXT: tl.constexpr = False,  # the next kernel may launch as this one starts
):
    _pdl_wait(PDL)
    _pdl_trigger(LET_NEXT)
    pid = tl.program_id(0)  # b * Hq + head
    b = pid // NUM_Q_HEADS
    head = pid % NUM_Q_HEADS
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM)
    first_row = pid * num_splits

    # Pass 1: global max M over the splits (elementwise over the lanes, reduced after).
    m_lanes = tl.full([BLOCK_S], float("-inf"), tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        mask_s = s0 + offs_s < num_splits
        m = tl.load(part_m_ptr + first_row + s0 + offs_s, mask=mask_s, other=float("-inf"))
        m_lanes = tl.maximum(m_lanes, m)
    m_max = tl.max(m_lanes, axis=0)  # finite: split 0 always holds >= 1 token

    # Pass 2: weights 2^(m_s - M) (0 for empty splits) applied to mass and accumulators.
    l_lanes = tl.zeros([BLOCK_S], tl.float32)
    acc = tl.zeros([BLOCK_S, HEAD_DIM], tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        mask_s = s0 + offs_s < num_splits
        rows = first_row + s0 + offs_s
        m = tl.load(part_m_ptr + rows, mask=mask_s, other=float("-inf"))
        l_s = tl.load(part_l_ptr + rows, mask=mask_s, other=0.0)
        o_s = tl.load(
            part_o_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :],
            mask=mask_s[:, None],
            other=0.0,
        )
        w = tl.exp2(m - m_max)
        l_lanes += w * l_s
        acc += w[:, None] * o_s

    o = tl.sum(acc, axis=0) / tl.sum(l_lanes, axis=0)
    tl.store(out_ptr + b * stride_ob + head * stride_oh + offs_d, o.to(out_ptr.dtype.element_ty))


# -------------------------------------------------------------------------------- API

_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_INTERPRETED = type(_splitkv_stage1).__name__ == "InterpretedFunction"


def splitkv_available() -> tuple[bool, str]:
    """Returns ``(True, "cuda")``, ``(True, "interpreter")`` or ``(False, why)``.

    The interpreter counts only when ``TRITON_INTERPRET=1`` was set before this module
    was imported (Triton decides at ``@triton.jit`` time).
    """
    if _INTERPRETED:
        return True, "interpreter"
    if torch.cuda.is_available():
        return True, "cuda"
    return False, "needs a CUDA GPU or TRITON_INTERPRET=1"


@dataclass(frozen=True)
class _Plan:
    """Everything about a launch that depends only on shapes, dtypes and strides."""

    splits: int
    grid1: tuple[int, int]
    grid2: tuple[int]
    stage1_meta: dict  # constexprs and launch options of stage 1
    stage2_meta: dict


@functools.lru_cache(maxsize=256)
def _make_plan(
    q_shape: tuple[int, ...],
    q_dtype: torch.dtype,
    device: torch.device,
    layout: str,
    k_shape: tuple[int, ...],
    kv_dtype: torch.dtype,
    kv_strides: tuple[int, ...],
    v_strides: tuple[int, ...],
    capacity: int,
    num_splits: int | None,
    config: SplitKVConfig | None,
) -> _Plan:
    """Validates a call's static description and plans its launches (cached per shape, so
    a steady decode loop pays a dictionary lookup, not the checks)."""
    if len(q_shape) != 3:
        raise InputError(f"q: expected a tensor [B, Hq, d], got {q_shape}")
    batch, hq, d = q_shape
    hkv = k_shape[2]
    if d != k_shape[3]:
        raise InputError(f"q: head dim {d} does not match the KV cache head dim {k_shape[3]}")
    if hq % hkv != 0:
        raise InputError(f"q: {hq} query heads is not a multiple of {hkv} KV heads")
    for name, dtype in (("q", q_dtype), ("k", kv_dtype)):
        if dtype not in _KERNEL_DTYPES:
            raise InputError(
                f"{name}: dtype {dtype} is not supported by triton-splitkv "
                "(bfloat16, float16, float32; use santa_kernels.reference for float64)"
            )
    if kv_strides != v_strides or kv_strides[3] != 1:
        raise InputError("k: K and V must share strides with a unit-stride head dim")
    ok, why = splitkv_available()
    if not ok:
        raise InputError(f"q: triton-splitkv {why}")
    if why == "cuda" and device.type != "cuda":
        raise InputError(f"q: triton-splitkv runs on CUDA tensors, got {device}")

    cfg = config or default_config(d, kv_dtype)
    if cfg.block_n < 16 or cfg.block_n & (cfg.block_n - 1):
        raise InputError(f"config: block_n must be a power of two >= 16, got {cfg.block_n}")
    if num_splits is None:
        splits = choose_num_splits(batch * hkv, capacity, cfg.block_n, num_sms(device))
    else:
        splits = num_splits
    paged = layout == "paged"
    group = hq // hkv
    widen_bf16 = kv_dtype == torch.bfloat16 and _INTERPRETED
    stage1_meta = dict(
        NUM_KV_HEADS=hkv,
        GROUP=group,
        HEAD_DIM=d,
        BLOCK_H=max(MIN_BLOCK_H, triton.next_power_of_2(group)),
        BLOCK_N=cfg.block_n,
        PAGED=paged,
        PAGE_SIZE=k_shape[1] if paged else 1,
        WRITE_OUT=splits == 1,
        DOT_PRECISION="ieee" if kv_dtype == torch.float32 or widen_bf16 else "tf32",
        WIDEN_BF16=widen_bf16,
        num_warps=cfg.num_warps,
        num_stages=cfg.paged_num_stages if paged else cfg.num_stages,
    )
    stage2_meta = dict(
        NUM_Q_HEADS=hq,
        HEAD_DIM=d,
        BLOCK_S=min(STAGE2_BLOCK_S, triton.next_power_of_2(splits)),
        num_warps=STAGE2_NUM_WARPS,
    )
    return _Plan(splits, (splits, batch * hkv), (batch * hq,), stage1_meta, stage2_meta)


def _plan_for(
    q: torch.Tensor, kv: KVCache, num_splits: int | None, config: SplitKVConfig | None
) -> _Plan:
    if not isinstance(kv, KVCache):
        raise InputError(f"kv: expected a santa_kernels.KVCache, got {type(kv).__name__}")
    if not isinstance(q, torch.Tensor):
        raise InputError(f"q: expected a torch.Tensor, got {type(q).__name__}")
    k = kv.k
    if q.dim() != 3 or q.shape[0] != kv.lengths.shape[0]:
        raise InputError(f"q: expected [B={kv.batch}, Hq, d], got {tuple(q.shape)}")
    if q.device != k.device:
        raise InputError(f"q: on {q.device}, the KV cache is on {k.device}")
    if num_splits is not None:
        check_positive_int(num_splits, "num_splits")
    return _make_plan(
        tuple(q.shape), q.dtype, q.device, kv.layout, tuple(k.shape), k.dtype,
        k.stride(), kv.v.stride(), kv_capacity(kv), num_splits, config,
    )  # fmt: skip


def splitkv_decode(
    q: torch.Tensor,
    kv: KVCache,
    *,
    scale: float | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    workspace: SplitKVWorkspace | None = None,
    config: SplitKVConfig | None = None,
    pdl_chain: bool = False,
) -> torch.Tensor:
    """Returns exact decode attention ``softmax(scale · q Kᵀ) V`` as ``[B, Hq, d]``.

    ``q``: ``[B, Hq, d]`` (bf16/fp16/fp32); ``kv``: a contiguous or paged KVCache.
    ``scale`` defaults to ``1/sqrt(d)``. ``num_splits`` overrides
    :func:`choose_num_splits` (1 skips the merge kernel). ``out`` (``[B, Hq, d]``,
    unit stride in d; any of the three dtypes) receives the result, else a new tensor
    of q's dtype. ``workspace`` supplies the partial buffers (see
    :class:`SplitKVWorkspace`), else they are allocated per call. ``config`` overrides
    the per-head-dim :data:`CONFIGS` entry (for tuning). Does no host-device sync.
    ``pdl_chain``: the call sits between kernels that launch as programmatic dependents
    (the e2e step's gemm rest): where :func:`pdl_available`, stage 1 launches as a
    dependent of the kernel before, and the last kernel lets the next launch early.
    Stage 2 is a programmatic dependent of stage 1 where :data:`MERGE_PDL` allows.
    """
    plan = _plan_for(q, kv, num_splits, config)
    batch, hq, d = q.shape
    tau = check_scale(scale, d)

    if out is None:
        out = torch.empty((batch, hq, d), dtype=q.dtype, device=q.device)
    elif (
        not isinstance(out, torch.Tensor)
        or out.shape != q.shape
        or out.dtype not in _KERNEL_DTYPES
        or out.device != q.device
        or out.stride(2) != 1
    ):
        raise InputError(
            f"out: expected a bf16/fp16/fp32 tensor of shape {(batch, hq, d)} on {q.device} "
            "with unit stride in d"
        )
    if q.stride(2) != 1:
        q = q.contiguous()

    splits = plan.splits
    if splits > 1:
        if workspace is None:
            workspace = SplitKVWorkspace(batch, hq, d, splits, device=q.device)
        else:
            workspace.check(batch, hq, d, splits, q.device)
        part_o, part_m, part_l = workspace.partial_out, workspace.partial_m, workspace.partial_l
    else:
        part_o = part_m = part_l = out  # unused by stage 1 when it writes the output

    paged = kv.layout == "paged"
    page_table = kv.page_table if paged else kv.lengths  # dummy pointer when contiguous
    q_strides, k_strides, out_strides = q.stride(), kv.k.stride(), out.stride()
    pdl = pdl_available(q.device)
    chain = pdl_chain and pdl
    merge_pdl = MERGE_PDL and pdl and splits > 1
    _splitkv_stage1[plan.grid1](
        q, kv.k, kv.v, kv.lengths, page_table,
        out, part_o, part_m, part_l,
        tau * LOG2E, splits,
        q_strides[0], q_strides[1],
        k_strides[0], k_strides[1], k_strides[2],
        page_table.stride(0) if paged else 0,
        out_strides[0], out_strides[1],
        **plan.stage1_meta, ENTRY_PDL=chain, LET_NEXT=merge_pdl or (chain and splits == 1),
        **({"launch_pdl": True} if chain else {}),
    )  # fmt: skip
    if splits > 1:
        _splitkv_stage2[plan.grid2](
            part_o, part_m, part_l, out, splits,
            out_strides[0], out_strides[1],
            **plan.stage2_meta, PDL=merge_pdl, LET_NEXT=chain,
            **({"launch_pdl": True} if merge_pdl else {}),
        )  # fmt: skip
    return out


def splitkv_bytes(q: torch.Tensor, kv: KVCache, num_splits: int) -> int:
    """Bytes one call moves by the module's byte model (reads ``lengths``: syncs)."""
    batch, hq, d = q.shape
    kv_bytes = int(kv.lengths.sum()) * kv.num_kv_heads * d * 2 * kv.k.element_size()
    q_out_bytes = 2 * batch * hq * d * q.element_size()
    workspace_bytes = 2 * batch * hq * num_splits * (d + 2) * 4 if num_splits > 1 else 0
    return kv_bytes + q_out_bytes + workspace_bytes
