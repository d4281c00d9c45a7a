"""S²ANTA-flash in two passes (docs/algorithms.md section 4): the same estimator as
``triton_santa.santa_flash``, bit-for-bit the same counts, with the V gather taken out of
the K stream.

``_flash_kernel`` gathers a tile's V rows at addresses that depend on the same tile's
scores, so the gather latency is exposed once per tile. Here:

* pass 1 ``_flash_count_kernel`` (grid ``(splits, B*Hkv)``): one ``tl.dot`` per K tile for
  all ``G`` query heads of the group; per (head, tile) the local max ``m_t``, the integer
  local CDF and the systematic counts of ``_flash_kernel`` (``SUB=1``), the same Philox
  stream. Writes counts (int16), ``m_t`` and the tile mass ``l_t`` to the workspace.
* pass 2 ``_flash_gather_kernel`` (grid ``(splits, B*Hkv)``): per tile, the group's counts
  block, a predicated V load of the rows some head sampled (masked-off rows cost no
  memory traffic), ``counts @ V`` with ``tl.dot`` and the FlashDecoding running merge.
  Nothing in a tile's V addresses depends on work of the same iteration beyond one small
  counts load, so Triton's software pipeliner prefetches the next tiles.
* the existing ``_merge_kernel`` combines the splits and advances the step counter.

Pass 2 has three forms (``gather=``):

* ``"masked"`` (the above): each tile's [TILE, d] V block, unsampled rows masked off.
  Measured (S=2048, H200): 28 us at 32k B=1 for ~12 MB of V rows (0.4-0.5 TB/s): each
  iteration holds a whole tile's staging buffer and registers for the ~18% of its rows
  that were sampled, so few useful bytes are in flight.
* ``"compact"``: pass 1 (``COMPACT``) lists, per program, the rows its tiles sampled
  (union over the group; a ``tl.cumsum`` of the row mask gives each its list position)
  with the group's counts at the same positions, and keeps its partial's running (max,
  mass); ``_compact_gather_kernel`` (launched as a programmatic dependent) reads only
  listed rows, ``BLOCK`` rows a dot, weights ``c * l_t * exp(m_t - m_p) / S_tile`` split
  in two 16-bit parts. Pass 2 alone: 11.2 / 51.9 / 12.6 us at 32k B=1 / 32k B=8 / 128k
  B=1 (masked: 28.1 / 183.7 / 93.4); pass 1 pays for the listing, 26.7-27.1 / 172-176
  / 88.7-89.6 us (masked counts: 22.3 / 152 / 73.9), in a scan and layout conversions
  that add 7 of its 21 barriers a tile (PTX). It is held at 128 registers, the 4-programs-
  an-SM cliff (134-137: 38 us at 32k B=1); a cap of 96 (5 an SM) was slower. Whole call
  41.5-42.3 / 229.5-234.6 / 104.6-105.0 us (masked 52.9 / 337.6 / 170.5).
* ``"inline"``: the same lists, gathered by the count program after its K tiles (one
  kernel fewer; ptxas: 128 registers at 32 rows a dot, 4 programs an SM, 162 at 64, 3
  an SM): 39.5-40.1 / 235-240 / 104.2-105.6 us.

(H200, 2026-12-02: results/h200/tune-2026-12-02-s14/README.md.)

Byte model (``E`` element size, ``T_b = ceil(N_b / tile)``, ``U`` the union of the
group's sampled rows, ``<= B*Hkv*N``): pass 1 reads ``B*Hkv*N*d*E`` (K) and writes
``B*Hq*(2*N + 8*T)`` (masked) or ``B*Hq*8*T + U*(4 + 2*G)`` (lists); pass 2 reads those
and ``U*d*E`` of V, writes ``B*Hq*splits*(d+2)*4``.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from santa_kernels.kv import KVCache
from santa_kernels.triton_santa import (
    FLASH_W_BITS,
    SantaInfo,
    SantaWorkspace,
    _cache_args,
    _capacity,
    _check_uniforms,
    _counts_dot,
    _dot_precision,
    _flash_counts,
    _flash_local_weights,
    _flash_narrow_group,
    _flash_program,
    _merge_kernel,
    _next_pow2,
    _pdl_trigger,
    _pdl_wait,
    _prepare,
    _row_offsets,
    _sm_count,
    _tile_count,
    _tile_merge,
    _tile_scores,
    num_splits_for,
    pdl_available,
)
from santa_kernels.validate import InputError, check_positive_int

# Hopper (H200) defaults per head dim, (num_warps, num_stages) of each pass. The count
# pass is the score pass's K stream (HOPPER_CONFIGS["stream"]); the gather pass streams
# the counts and the sampled V rows, 2-4 tiles in flight through the pipeliner. d=128's
# gather swept on the H200 (results/h200/tune-2026-11-29-s5/2-flash2.csv, S=2048, gather
# alone): 2 warps and 4 stages, 28.4 / 238 / 92.6 us at 32k B=1 / 32k B=8 / 128k B=1
# with programs of 8 / 28 / 32 tiles, against 35.6 / 300 / 118 for (4, 3) over the count
# pass's splits (8 / 57 / 32 tiles); 8 tiles at 128k B=1: 108 us, at B=8: 214;
# d=64 and 256 not swept: override per call (count_config=, gather_config=).
FLASH2_CONFIG = {
    64: {"count": (4, 4), "gather": (4, 4), "compact_maxnreg": None},
    128: {"count": (4, 3), "gather": (2, 4), "compact_maxnreg": 128},
    256: {"count": (8, 2), "gather": (8, 2), "compact_maxnreg": None},
}
# compact_maxnreg: a register cap for the count pass with row lists (gather="compact";
# None: ptxas' choice). 128 registers a thread is the cliff at 4 warps: 4 programs an SM
# at <= 128, 3 above. At d=128 ptxas gave the listing pass 128 registers at c5b4c84 and
# 134-137 after a later change (popcount list positions, since removed): its count pass
# went 26.7 -> 38.0 us at 32k B=1 and 88.7 -> 130.8 at 128k B=1
# (tune-2026-12-02-s14/5-compact-5819eb9.csv); capped at 128, no spills (ptxas -v), it
# runs as before (27.1 / 175.7 / 89.6 us, 6-compact-020e3d8.csv). A cap of 96 (5
# programs an SM, a 4-byte spill) was slower at every shape: 43.0 / 236.5 / 110.6 us
# against 41.0 / 227.4 / 103.0 uncapped (S=2048, 32k B=1 / 32k B=8 / 128k B=1;
# 3-compact-bc8101d.csv).
GATHER_TILES = 32  # tiles per gather program at most (default gather_splits)
GATHERS = ("masked", "compact", "inline")  # pass 2's V reads (santa_flash_two_pass)
# rows a dot of the list gathers (results/h200/tune-2026-12-02-s14/1-compact-5d88fae.csv:
# compact 41.8 / 42.7 / 47.8 us at 64 / 32 / 128 rows, 32k B=1; inline 40.1 / 55.3 / 55.5
# at 32 / 64 / 128, and at 128k B=1 105.4 / 150.2 / 145.5)
COMPACT_BLOCK, INLINE_BLOCK = 64, 32
# List positions by popcounts of a 64-bit row mask instead of the scan (17 barriers a
# tile instead of 21; code at 8aa9064, removed) were slower, both capped at 128 registers
# (S=2048, 32k B=1 / 32k B=8 / 128k B=1, us; tune-2026-12-02-s14/6-compact-020e3d8.csv):
# compact 42.1 / 235.9 / 108.7 against 41.5 / 230.9 / 105.0 with the scan; inline 54.8 /
# 285.4 / 154.3 against 39.5 / 237.1 / 104.2.
MAX_COUNT = (1 << 15) - 1  # counts are stored as int16: a row holds at most S_tile <= S
# counts @ V on tensor cores: exact with the counts in V's 16-bit dtype up to this count
_EXACT_COUNT = {torch.bfloat16: 256, torch.float16: 2048}


def two_pass_workspace(q: torch.Tensor, kv: KVCache, S: int, tile: int = 64,
                       **kw) -> SantaWorkspace:
    """A workspace for :func:`santa_flash_two_pass`: counts kept, and partials for the
    gather pass's default split (programs of at most :data:`GATHER_TILES` tiles)."""
    n_tiles = _tile_count(kv, tile)
    if kw.get("num_splits") is None:
        kw["num_splits"] = max(num_splits_for(q.shape[0] * kv.num_kv_heads, n_tiles,
                                              _sm_count(q.device)), -(-n_tiles // GATHER_TILES))
    ws = SantaWorkspace.for_inputs(q, kv, S, tile, store_counts=True, **kw)
    _entry_buffers(ws)  # the compact gathers' row lists
    return ws


def flash2_config(head_dim: int) -> dict:
    """Returns the default ``{"count": (warps, stages), "gather": (warps, stages)}``."""
    key = min(FLASH2_CONFIG, key=lambda d: (abs(d - head_dim), d))
    return FLASH2_CONFIG[key]


# ------------------------------------------------------------- pass 1: counts
@triton.jit
def _flash_count_kernel(
    q_ptr, k_ptr, lengths_ptr, page_table_ptr,
    tile_max_ptr, tile_mass_ptr, counts_ptr, uniforms_ptr, rng_ptr, seed,
    scale, S, num_kv_heads, num_q_heads, group, head_dim: tl.constexpr, tiles_per_split,
    counts_stride, stats_stride, uniform_stride, rng_stride,
    stride_qb, stride_qh, stride_kx, stride_ky, stride_kh, stride_pt, page_size,
    PAGED: tl.constexpr, TILE: tl.constexpr, G_PAD: tl.constexpr, ROWS: tl.constexpr,
    D_PAD: tl.constexpr, HAS_UNIFORMS: tl.constexpr, DOT_PRECISION: tl.constexpr,
    W_BITS: tl.constexpr, GROUP_RNG: tl.constexpr = False, DRAW: tl.constexpr = True,
    entry_rows_ptr=None, entry_count_ptr=None, entry_stride=0, num_splits=1,
    part_m_ptr=None, part_l_ptr=None, part_o_ptr=None, v_ptr=None,
    stride_vx=0, stride_vy=0, stride_vh=0,
    COMPACT: tl.constexpr = False, INLINE: tl.constexpr = False, BLOCK: tl.constexpr = 64,
    GATHER_G_PAD: tl.constexpr = 16, W_MODE: tl.constexpr = 0, PDL: tl.constexpr = False,
):
    # DRAW (profiling only): False stores the integer weights instead of the draw's
    # counts (no scan, no Philox, no floors): what the draw costs
    # One program: tiles [t_begin, t_end) of one (sequence, KV head), all G query heads.
    # The dot runs on G_PAD >= 16 rows; everything after it on ROWS >= G real rows.
    # COMPACT: instead of dense counts rows, the union of the group's sampled rows of the
    # program's tiles as a list (``entry_rows``, from ``t_begin * TILE``; its length in
    # ``entry_count``) with the group's counts at the same list positions, and the
    # program's running (max, mass) over its tiles as its partial's (m, l).
    # INLINE (with COMPACT): then the same program gathers its own list (_compact_gather).
    # PDL: let pass 2 (launched as a programmatic dependent) start once every program of
    # this one has; it waits for this kernel's writes before it reads.
    _pdl_trigger(PDL)
    W_SCALE: tl.constexpr = (1 << W_BITS) // TILE
    b, kvh, length, per_tile, t_begin, t_end, q, head_rows, mask_g, rng_base = (
        _flash_narrow_group(q_ptr, lengths_ptr, rng_ptr, S, num_kv_heads, num_q_heads, group,
                            head_dim, tiles_per_split, rng_stride, stride_qb, stride_qh, TILE,
                            G_PAD, ROWS, D_PAD, GROUP_RNG))
    kv_row = (b * num_kv_heads + kvh).to(tl.int64)
    cursor = t_begin * TILE  # the next list position (COMPACT)
    m_run = tl.full([ROWS], float("-inf"), tl.float32)
    l_run = tl.zeros([ROWS], dtype=tl.float32)
    for t in range(t_begin, t_end):
        s, offs_n, mask_n = _tile_scores(q, k_ptr, page_table_ptr, b, kvh, t, length, head_dim,
                                         scale, stride_kx, stride_ky, stride_kh, stride_pt,
                                         page_size, PAGED, TILE, D_PAD, DOT_PRECISION)
        if ROWS < G_PAD:  # the padding rows of q are zero (-inf past the end): exact
            s = tl.sum(tl.reshape(s, [G_PAD // ROWS, ROWS, TILE]), axis=0)
        # _flash_kernel's draw (SUB=1), term for term: identical scores give identical counts
        m_t, row_ok, w, mass = _flash_local_weights(s, W_SCALE)
        if DRAW:
            if HAS_UNIFORMS:
                a = tl.load(uniforms_ptr + head_rows * uniform_stride + t,
                            mask=mask_g & row_ok, other=0.0)
            else:
                a = tl.rand(seed, rng_base + t)
            counts = _flash_counts(w, mass, a, per_tile)
        else:
            counts = w >> 27
        ok = mask_g[:, None] & mask_n[None, :]
        mass_f = mass.to(tl.float32) / W_SCALE
        if COMPACT:
            counts = tl.where(ok, counts, 0.0)
            needed = tl.max(counts, axis=0) > 0  # rows some head of the group sampled
            taken = needed.to(tl.int32)
            rank = tl.cumsum(taken, axis=0) - taken  # among the tile's needed rows
            pos = cursor + rank  # their list positions, in row order
            tl.store(entry_rows_ptr + kv_row * entry_stride + pos, offs_n, mask=needed)
            tl.store(counts_ptr + head_rows[:, None] * counts_stride + pos[None, :],
                     counts.to(tl.int16), mask=mask_g[:, None] & needed[None, :])
            cursor += tl.sum(taken, axis=0)
            # the program's partial (m, l): FlashDecoding's running merge of the tiles
            m_run, l_run, _, _ = _tile_merge(m_run, l_run, m_t, mass_f)
        else:
            tl.store(counts_ptr + head_rows[:, None] * counts_stride + offs_n[None, :],
                     counts.to(tl.int16), mask=ok)
        tl.store(tile_max_ptr + head_rows * stats_stride + t, m_t, mask=mask_g)
        tl.store(tile_mass_ptr + head_rows * stats_stride + t, mass_f, mask=mask_g)
    if COMPACT:
        split = tl.program_id(0)
        tl.store(entry_count_ptr + kv_row * num_splits + split, cursor - t_begin * TILE)
        part = head_rows * num_splits + split
        tl.store(part_m_ptr + part, m_run, mask=mask_g)
        tl.store(part_l_ptr + part, l_run, mask=mask_g)
        if INLINE:
            tl.debug_barrier()  # the program's list, counts and stats: visible to every thread
            _compact_gather(v_ptr, page_table_ptr, tile_max_ptr, tile_mass_ptr, counts_ptr,
                            entry_rows_ptr, part_m_ptr, part_o_ptr, b, kvh, split,
                            t_begin * TILE, cursor - t_begin * TILE, per_tile, num_kv_heads,
                            num_q_heads, group, head_dim, num_splits, counts_stride,
                            stats_stride, entry_stride, stride_vx, stride_vy, stride_vh,
                            stride_pt, page_size, PAGED, TILE, GATHER_G_PAD, D_PAD, BLOCK,
                            W_MODE)


# ------------------------------------------------------------- pass 2: gather
@triton.jit
def _gather_tiles(v_base, page_table_ptr, tile_max_ptr, tile_mass_ptr, counts_ptr, b, length,
                  t_begin, t_end, per_tile, head_rows, mask_g, offs_d, mask_d, counts_stride,
                  stats_stride, stride_vx, stride_vy, stride_pt, page_size,
                  PAGED: tl.constexpr, TILE: tl.constexpr, G_PAD: tl.constexpr,
                  D_PAD: tl.constexpr, CNT_MODE: tl.constexpr):
    """Tiles [t_begin, t_end) of one (sequence, KV head): returns the running
    (m_run, l_run, acc) of the group's heads."""
    offs_c = tl.arange(0, TILE)
    m_run = tl.full([G_PAD], float("-inf"), tl.float32)
    l_run = tl.zeros([G_PAD], dtype=tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], dtype=tl.float32)
    for t in range(t_begin, t_end):
        offs_n = t * TILE + offs_c
        mask_n = offs_n < length
        # no column mask (the workspace pads every counts row): whole-row vector loads that
        # the pipeliner can stage through shared memory; columns past the length (stale
        # counts of earlier calls) are zeroed after the load
        counts = tl.load(counts_ptr + head_rows[:, None] * counts_stride + offs_n[None, :],
                         mask=mask_g[:, None], other=0)
        counts = tl.where(mask_n[None, :], counts.to(tl.float32), 0.0)
        m_t = tl.load(tile_max_ptr + head_rows * stats_stride + t, mask=mask_g,
                      other=float("-inf"))
        mass = tl.load(tile_mass_ptr + head_rows * stats_stride + t, mask=mask_g, other=0.0)
        # only rows some head of the group sampled are read (predicated loads: the
        # masked-off rows cost no memory traffic)
        needed = (tl.max(counts, axis=0) > 0) & mask_n
        rows = _row_offsets(page_table_ptr, b, tl.where(mask_n, offs_n, 0), stride_vx,
                            stride_vy, stride_pt, page_size, PAGED)
        v = tl.load(v_base + rows[:, None] + offs_d[None, :],
                    mask=needed[:, None] & mask_d[None, :], other=0.0)
        o = _counts_dot(counts, v, CNT_MODE)
        # FlashDecoding merge of the tile estimate (W_t / S_tile) * counts @ V, as
        # _flash_kernel does; padding rows hold m_t = -inf and weight 0
        m_run, l_run, alpha, w_t = _tile_merge(m_run, l_run, m_t, mass)
        acc = acc * alpha[:, None]
        acc += (w_t / per_tile)[:, None] * o
    return m_run, l_run, acc


@triton.jit
def _flash_gather_kernel(
    v_ptr, lengths_ptr, page_table_ptr, tile_max_ptr, tile_mass_ptr, counts_ptr,
    part_m_ptr, part_l_ptr, part_o_ptr,
    S, num_kv_heads, num_q_heads, group, head_dim: tl.constexpr, tiles_per_split, num_splits,
    counts_stride, stats_stride,
    stride_vx, stride_vy, stride_vh, stride_pt, page_size,
    PAGED: tl.constexpr, TILE: tl.constexpr, G_PAD: tl.constexpr, D_PAD: tl.constexpr,
    CNT_MODE: tl.constexpr,
):
    split = tl.program_id(0)
    b, kvh, length, per_tile, t_begin, t_end = _flash_program(lengths_ptr, S, num_kv_heads,
                                                              tiles_per_split, TILE)
    offs_g = tl.arange(0, G_PAD)
    mask_g = offs_g < group
    head_rows = (b * num_q_heads + kvh * group + offs_g).to(tl.int64)
    offs_d = tl.arange(0, D_PAD)
    mask_d = offs_d < head_dim
    m_run, l_run, acc = _gather_tiles(
        v_ptr + kvh * stride_vh, page_table_ptr, tile_max_ptr, tile_mass_ptr, counts_ptr, b,
        length, t_begin, t_end, per_tile, head_rows, mask_g, offs_d, mask_d, counts_stride,
        stats_stride, stride_vx, stride_vy, stride_pt, page_size,
        PAGED, TILE, G_PAD, D_PAD, CNT_MODE)
    part = head_rows * num_splits + split
    tl.store(part_m_ptr + part, m_run, mask=mask_g)
    tl.store(part_l_ptr + part, l_run, mask=mask_g)
    tl.store(part_o_ptr + part[:, None] * head_dim + offs_d[None, :], acc,
             mask=mask_g[:, None] & mask_d[None, :])


# ------------------------------------------------------------- pass 2: compact lists
@triton.jit
def _weights_dot(w, v, W_MODE: tl.constexpr):
    """``w @ v`` (fp32) for fp32 weights ``w``. W_MODE 0: an fp32 dot (fp32 V,
    interpreter); 1: ``w`` split into two 16-bit parts ``hi + lo`` in V's dtype, two
    tensor-core dots (a 2^-16 relative rounding of each weight)."""
    if W_MODE == 0:
        o = tl.dot(w, v.to(tl.float32), input_precision="ieee")
    else:
        hi = w.to(v.dtype)
        lo = (w - hi.to(tl.float32)).to(v.dtype)
        o = tl.dot(hi, v) + tl.dot(lo, v)
    return o


@triton.jit
def _compact_gather(v_ptr, page_table_ptr, tile_max_ptr, tile_mass_ptr, counts_ptr,
                    entry_rows_ptr, part_m_ptr, part_o_ptr, b, kvh, split, e_begin, n_entries,
                    per_tile, num_kv_heads, num_q_heads, group, head_dim, num_splits,
                    counts_stride, stats_stride, entry_stride, stride_vx, stride_vy,
                    stride_vh, stride_pt, page_size,
                    PAGED: tl.constexpr, TILE: tl.constexpr, G_PAD: tl.constexpr,
                    D_PAD: tl.constexpr, BLOCK: tl.constexpr, W_MODE: tl.constexpr):
    """One program's list (entries ``[e_begin, e_begin + n_entries)`` of (sequence, KV
    head)): ``sum_e c_ge * l_t(e) * exp(m_t(e) - m_g) / S_tile * V[row_e]`` for each head
    ``g`` of the group, ``m_g`` the program's partial max (stored by pass 1), into the
    partial's ``o``. Every loaded V row is one some head sampled, BLOCK rows a dot."""
    offs_g = tl.arange(0, G_PAD)
    mask_g = offs_g < group
    head_rows = (b * num_q_heads + kvh * group + offs_g).to(tl.int64)
    offs_d = tl.arange(0, D_PAD)
    mask_d = offs_d < head_dim
    part = head_rows * num_splits + split
    m_p = tl.load(part_m_ptr + part, mask=mask_g, other=float("-inf"))
    m_ref = tl.where(m_p > float("-inf"), m_p, 0.0)
    kv_row = (b * num_kv_heads + kvh).to(tl.int64)
    v_base = v_ptr + kvh * stride_vh
    acc = tl.zeros([G_PAD, D_PAD], dtype=tl.float32)
    for e0 in range(0, n_entries, BLOCK):
        offs_e = e0 + tl.arange(0, BLOCK)
        ok = offs_e < n_entries
        n = tl.load(entry_rows_ptr + kv_row * entry_stride + e_begin + offs_e, mask=ok, other=0)
        c = tl.load(counts_ptr + head_rows[:, None] * counts_stride + e_begin + offs_e[None, :],
                    mask=mask_g[:, None] & ok[None, :], other=0).to(tl.float32)
        drawn = c > 0
        stats = head_rows[:, None] * stats_stride + (n // TILE)[None, :]
        m_e = tl.load(tile_max_ptr + stats, mask=drawn, other=0.0)
        mass_e = tl.load(tile_mass_ptr + stats, mask=drawn, other=0.0)
        w = tl.where(drawn, c * mass_e * tl.exp(m_e - m_ref[:, None]), 0.0)
        rows = _row_offsets(page_table_ptr, b, n, stride_vx, stride_vy, stride_pt, page_size,
                            PAGED)
        v = tl.load(v_base + rows[:, None] + offs_d[None, :], mask=ok[:, None] & mask_d[None, :],
                    other=0.0)
        acc += _weights_dot(w, v, W_MODE)
    tl.store(part_o_ptr + part[:, None] * head_dim + offs_d[None, :], acc / per_tile,
             mask=mask_g[:, None] & mask_d[None, :])


@triton.jit
def _compact_gather_kernel(
    v_ptr, lengths_ptr, page_table_ptr, tile_max_ptr, tile_mass_ptr, counts_ptr,
    entry_rows_ptr, entry_count_ptr, part_m_ptr, part_o_ptr,
    S, num_kv_heads, num_q_heads, group, head_dim: tl.constexpr, tiles_per_split, num_splits,
    counts_stride, stats_stride, entry_stride,
    stride_vx, stride_vy, stride_vh, stride_pt, page_size,
    PAGED: tl.constexpr, TILE: tl.constexpr, G_PAD: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK: tl.constexpr, W_MODE: tl.constexpr, PDL: tl.constexpr,
):
    # grid (splits, B * Hkv): the list of the count program with the same index
    _pdl_wait(PDL)  # (launched as a dependent of pass 1: its lists are complete)
    split = tl.program_id(0)
    b, kvh, _, per_tile, t_begin, _ = _flash_program(lengths_ptr, S, num_kv_heads,
                                                     tiles_per_split, TILE)
    n_entries = tl.load(entry_count_ptr + (b * num_kv_heads + kvh).to(tl.int64) * num_splits
                        + split)
    _compact_gather(v_ptr, page_table_ptr, tile_max_ptr, tile_mass_ptr, counts_ptr,
                    entry_rows_ptr, part_m_ptr, part_o_ptr, b, kvh, split, t_begin * TILE,
                    n_entries, per_tile, num_kv_heads, num_q_heads, group, head_dim, num_splits,
                    counts_stride, stats_stride, entry_stride, stride_vx, stride_vy,
                    stride_vh, stride_pt, page_size, PAGED, TILE, G_PAD, D_PAD, BLOCK, W_MODE)


# ------------------------------------------------------------------ host side
def _entry_buffers(ws: SantaWorkspace) -> tuple[torch.Tensor, torch.Tensor]:
    """The workspace's row lists ``[B * Hkv, counts width]`` (int32) and their lengths
    ``[B * Hkv, num_splits]``, allocated on first use (:func:`two_pass_workspace` does it
    up front, outside any graph capture)."""
    if ws.entry_rows is None:
        rows = ws.batch * ws.num_kv_heads
        width = ws.counts.shape[1]
        ws.entry_rows = torch.zeros(rows, width, dtype=torch.int32, device=ws.device)
        ws.entry_count = torch.zeros(rows, ws.num_splits, dtype=torch.int32, device=ws.device)
    return ws.entry_rows, ws.entry_count


def _dense_counts(ws: SantaWorkspace, listed: torch.Tensor, batch: int, hkv: int, group: int,
                  region: int, splits: int) -> torch.Tensor:
    """The ``[B, Hq, N]`` counts of the compact lists (``return_counts``; not on the hot
    path): list entry ``j`` of split ``p`` holds row ``entry_rows[p * region + j]``."""
    capacity = listed.shape[-1]  # list positions never pass their rows: < capacity
    pos = torch.arange(capacity, device=listed.device)
    split = (pos // region).clamp_max(splits - 1)
    valid = (pos % region) < ws.entry_count[: batch * hkv, split]  # [B * Hkv, capacity]
    rows = ws.entry_rows[: batch * hkv, :capacity].long().where(valid, 0)
    per_head = valid.repeat_interleave(group, dim=0).view(listed.shape)
    src = torch.where(per_head, listed, torch.zeros_like(listed))
    index = rows.repeat_interleave(group, dim=0).view(listed.shape)
    dense = torch.zeros_like(listed)
    return dense.scatter_add_(-1, index, src)


def _launch_config(value, default: tuple[int, int], name: str) -> tuple[int, int]:
    if value is None:
        return default
    if (not isinstance(value, tuple | list) or len(value) != 2
            or not all(isinstance(x, int) and x > 0 for x in value)):
        raise InputError(f"{name}: expected (num_warps, num_stages), got {value!r}")
    return int(value[0]), int(value[1])


def santa_flash_two_pass(
    q: torch.Tensor, kv: KVCache, S: int, *, tile: int = 64, scale: float | None = None,
    seed: int | None = None, uniforms: torch.Tensor | None = None,
    workspace: SantaWorkspace | None = None, return_counts: bool = False,
    count_config: tuple[int, int] | None = None, gather_config: tuple[int, int] | None = None,
    group_offsets: bool = False, gather_splits: int | None = None, gather: str = "masked",
    block: int | None = None, count_splits: int | None = None, count_maxnreg: int | None = 0,
    pdl: bool | None = None,
    stages: tuple[str, ...] = ("count", "gather", "merge"), draw: bool = True,
) -> tuple[torch.Tensor, SantaInfo]:
    """Returns ``(out [B, Hq, d] in q.dtype, info)`` of S²ANTA-flash in two passes.

    Same estimator, arguments and outputs as :func:`santa_flash` (given the same
    ``uniforms [B, Hq, T]`` or the same seed and step, the same counts). The workspace
    must be built with ``store_counts=True`` (pass 2 reads the counts); ``S`` is at
    most 32767 (int16 counts). ``count_config`` / ``gather_config``: ``(num_warps,
    num_stages)`` of each pass (default :data:`FLASH2_CONFIG`). ``group_offsets``: as in
    :func:`santa_flash` (the same stream as ``santa_flash(..., group_offsets=True)``).
    ``gather_splits``: programs per (sequence, KV head) of pass 2 (at most the
    workspace's ``num_splits``; default: pass 1's split, cut to programs of at most
    :data:`GATHER_TILES` tiles). ``gather`` (:data:`GATHERS`): ``"masked"`` reads a tile's
    V block with the unsampled rows masked off; ``"compact"``: pass 1 lists the rows its
    tiles sampled and pass 2 reads only those, ``block`` rows a dot (default
    :data:`COMPACT_BLOCK` / :data:`INLINE_BLOCK`), on pass 1's split (``gather_splits``
    is refused); ``"inline"``: the same lists, gathered by the count program itself after
    its K tiles (no second kernel: ``gather_config`` does not apply).
    Profiling only: ``stages`` (the kernels to launch) and ``draw=False`` (pass 1 without
    its draw). ``count_splits``: programs per (sequence, KV head) of pass 1 (at most the
    workspace's ``num_splits``; default :func:`num_splits_for`). ``count_maxnreg``: the
    count pass's register cap with lists (0: ``FLASH2_CONFIG``'s ``compact_maxnreg``;
    None: none). ``pdl`` (compact): launch pass 2 as a programmatic dependent of pass 1
    (None: where the device has it).
    """
    if gather not in GATHERS:
        raise InputError(f"gather: expected one of {GATHERS}, got {gather!r}")
    if gather != "masked" and gather_splits is not None:
        raise InputError(f"gather_splits: the lists' pass 2 runs on pass 1's split "
                         f"(count_splits), not with gather={gather!r}")
    if block is None:  # H200, S=2048: inline 39.9 us at 32k B=1 with 32, 55.3 with 64
        block = INLINE_BLOCK if gather == "inline" else COMPACT_BLOCK
    if not isinstance(block, int) or block < 16 or block & (block - 1):
        raise InputError(f"block: a power of two >= 16, got {block!r}")
    if (workspace is None and isinstance(kv, KVCache) and isinstance(q, torch.Tensor)
            and q.dim() == 3):  # (bad inputs: _prepare says what is wrong)
        workspace = two_pass_workspace(q, kv, S, tile)
    ws, scale = _prepare(q, kv, S, tile, scale, workspace, counts=True)
    if S > MAX_COUNT:
        raise InputError(f"S: at most {MAX_COUNT} (int16 counts), got {S}")
    batch, hq, d = q.shape
    hkv = kv.num_kv_heads
    group = hq // hkv
    n_tiles = _tile_count(kv, tile)
    uniforms = _check_uniforms(uniforms, (batch, hq, n_tiles))
    defaults = flash2_config(d)
    count_warps, count_stages = _launch_config(count_config, defaults["count"], "count_config")
    gather_warps, gather_stages = _launch_config(gather_config, defaults["gather"],
                                                 "gather_config")
    g_pad = max(16, _next_pow2(group))
    rows = max(2, _next_pow2(group))
    d_pad = _next_pow2(d)
    if count_splits is None:
        count_splits = num_splits_for(batch * hkv, n_tiles, _sm_count(q.device))
        if gather != "masked":  # the lists' pass 2 runs on this split: programs of at most
            # GATHER_TILES tiles (at 32k B=8 the default's 57 tiles a program gave 320 us,
            # 29 tiles 268 us; tune-2026-12-02-s14)
            count_splits = max(count_splits, -(-n_tiles // GATHER_TILES))
        count_splits = min(ws.num_splits, count_splits)
    else:
        check_positive_int(count_splits, "count_splits")
        if count_splits > ws.num_splits:
            raise InputError(f"count_splits: at most the workspace's num_splits "
                             f"{ws.num_splits}, got {count_splits}")
    per_split = -(-n_tiles // count_splits)
    grid = (-(-n_tiles // per_split), batch * hkv)
    if gather_splits is None:  # the count pass's splits, cut to GATHER_TILES tiles each
        # (as many as the workspace's partials hold)
        gather_per_split = max(min(per_split, GATHER_TILES), -(-n_tiles // ws.num_splits))
    else:
        check_positive_int(gather_splits, "gather_splits")
        if gather_splits > ws.num_splits:
            raise InputError(f"gather_splits: at most the workspace's num_splits "
                             f"{ws.num_splits}, got {gather_splits}")
        gather_per_split = -(-n_tiles // gather_splits)
    splits = -(-n_tiles // gather_per_split)
    table, paged, page_size, stride_pt = _cache_args(kv)
    v_dtype = kv.v.dtype
    compact = gather != "masked"
    lists: dict = {}
    if compact:
        splits = grid[0]  # pass 2 gathers pass 1's lists, program for program
        entry_rows, entry_count = _entry_buffers(ws)
        lists = dict(
            entry_rows_ptr=entry_rows, entry_count_ptr=entry_count,
            entry_stride=entry_rows.stride(0), num_splits=ws.num_splits,
            part_m_ptr=ws.part_m, part_l_ptr=ws.part_l, part_o_ptr=ws.part_o, v_ptr=kv.v,
            stride_vx=kv.v.stride(0), stride_vy=kv.v.stride(1), stride_vh=kv.v.stride(2),
            COMPACT=True, INLINE=gather == "inline", BLOCK=block, GATHER_G_PAD=g_pad,
            W_MODE=0 if _dot_precision(v_dtype) == "ieee" else 1)
        if pdl is None:
            pdl = gather == "compact" and pdl_available(q.device)
        lists["PDL"] = bool(pdl) and gather == "compact"
        if count_maxnreg == 0:
            count_maxnreg = defaults["compact_maxnreg"] if gather == "compact" else None
        if count_maxnreg is not None and os.environ.get("TRITON_INTERPRET", "0") != "1":
            lists["maxnreg"] = check_positive_int(count_maxnreg, "count_maxnreg")
    if "count" in stages:
        _flash_count_kernel[grid](
            q, kv.k, kv.lengths, table, ws.tile_max, ws.tile_mass, ws.counts,
            uniforms if uniforms is not None else ws.tile_max, ws.rng,
            ws.seed if seed is None else int(seed),
            scale, S, hkv, hq, group, d, per_split, ws.counts.stride(0), ws.max_tiles, n_tiles,
            ws.max_tiles,
            q.stride(0), q.stride(1), kv.k.stride(0), kv.k.stride(1), kv.k.stride(2),
            stride_pt, page_size,
            PAGED=paged, TILE=tile, G_PAD=g_pad, ROWS=rows, D_PAD=d_pad,
            HAS_UNIFORMS=uniforms is not None, DOT_PRECISION=_dot_precision(kv.k.dtype),
            W_BITS=FLASH_W_BITS, GROUP_RNG=group_offsets, DRAW=draw, num_warps=count_warps,
            num_stages=count_stages, **lists,
        )
    if "gather" in stages and gather == "compact":
        _compact_gather_kernel[grid](
            kv.v, kv.lengths, table, ws.tile_max, ws.tile_mass, ws.counts,
            lists["entry_rows_ptr"], lists["entry_count_ptr"], ws.part_m, ws.part_o,
            S, hkv, hq, group, d, per_split, ws.num_splits, ws.counts.stride(0),
            ws.max_tiles, lists["entry_stride"],
            kv.v.stride(0), kv.v.stride(1), kv.v.stride(2), stride_pt, page_size,
            PAGED=paged, TILE=tile, G_PAD=g_pad, D_PAD=d_pad, BLOCK=block,
            W_MODE=lists["W_MODE"], PDL=lists["PDL"],
            num_warps=gather_warps, num_stages=gather_stages,
            **({"launch_pdl": True} if lists["PDL"] else {}),
        )
    elif "gather" in stages and not compact:
        if _dot_precision(v_dtype) == "ieee":
            cnt_mode = 0  # fp32 counts @ V
        elif _EXACT_COUNT.get(v_dtype, 0) >= S:
            cnt_mode = 1  # every count <= S_tile <= S is exact in V's 16-bit dtype
        else:
            cnt_mode = 2  # 256 * hi + lo: two dots (the fused kernel picks per call)
        _flash_gather_kernel[(splits, batch * hkv)](
            kv.v, kv.lengths, table, ws.tile_max, ws.tile_mass, ws.counts,
            ws.part_m, ws.part_l, ws.part_o,
            S, hkv, hq, group, d, gather_per_split, ws.num_splits, ws.counts.stride(0),
            ws.max_tiles,
            kv.v.stride(0), kv.v.stride(1), kv.v.stride(2), stride_pt, page_size,
            PAGED=paged, TILE=tile, G_PAD=g_pad, D_PAD=d_pad, CNT_MODE=cnt_mode,
            num_warps=gather_warps, num_stages=gather_stages,
        )
    out = ws.out(q.dtype)
    # (a merge launched as a programmatic dependent of the list gather was slower: 42.3 /
    # 234.6 / 104.9 us against 41.8 / 229.5 / 104.6 without PDL, where PDL for the gather
    # alone had gained ~1 us; tune-2026-12-02-s14/3- and 4-compact-*.csv)
    if "merge" in stages:
        _merge_kernel[(batch * hq,)](
            ws.part_m, ws.part_l, ws.part_o, out, ws.rng, hq, splits, ws.num_splits, d,
            out.stride(0), out.stride(1),
            SPLIT_PAD=max(2, _next_pow2(splits)), D_PAD=d_pad, num_warps=4,
        )
    counts = None
    if return_counts:
        counts = ws.counts[: batch * hq, : _capacity(kv)].view(batch, hq, -1)
        if compact:
            counts = _dense_counts(ws, counts, batch, hkv, group, per_split * tile, splits)
    info = SantaInfo(method="flash", S=S, tile=tile, lengths=kv.lengths, num_kv_heads=hkv,
                     max_len=_capacity(kv), counts=counts)
    return out[:batch], info


__all__ = ["FLASH2_CONFIG", "GATHERS", "flash2_config", "santa_flash_two_pass"]
