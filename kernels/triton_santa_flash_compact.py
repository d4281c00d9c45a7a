"""S²ANTA-flash in one pass with compact, lagged V gathers (docs/algorithms.md section 4).

The same estimator as ``triton_santa.santa_flash``, bit-for-bit the same counts given
the same uniforms (or seed and step), in one streaming kernel plus the split merge.

Why another fused kernel. ``_flash_kernel`` turns a tile's draw into counts over the
tile's ``TILE`` rows and multiplies ``counts @ V`` with V loaded as a whole [TILE, d]
block, the unsampled rows masked off, in the iteration whose scores chose them: the
load's latency is exposed once per tile and most of the staged block is empty. Here a
tile's draw is turned into the ``S_tile`` sampled rows of every head directly (sample
``j`` of a head lies in the column ``i`` with ``f_{i-1} <= j < f_i``, ``f_i = floor(a +
S_tile F_i)`` the systematic floors of the integer local CDF ``F``, so its column is
``#{i : f_i <= j}``), and those ``G * S_tile`` rows are loaded at the end of the tile's
iteration and summed in the next one: the gather's latency hides behind the next K tile,
and only sampled rows move (a row sampled twice is loaded twice from the same address;
HBM moves it once). Loading them at the top of the next iteration instead, or summing
them two iterations later, was measured slower (H200, 2026-12-02:
results/h200/tune-2026-12-02-s18). K tiles come through Hopper's bulk tensor copies
where the cache allows (``SantaWorkspace.k_descriptor``), as in prop's score pass. A
head's ``P`` columns come out of one reduction over the tile, 8 bits a sample packed in
one integer that each gathered entry picks its own from
(:func:`_packed_columns`; through a [ROWS, P, TILE] block and its layout conversions
instead: 33.7 / 208.6 / 89.6 us against 30.6 / 190.0 / 83.7 at 32k B=1 / 32k B=8 /
128k B=1, S=2048; H200, 2026-12-03: results/h200/tune-2026-12-03-s22).

Tiles are drawn in pairs where the group allows (``draw_tiles``, :func:`default_draw_tiles`):
the lagged loop keeps streaming one K tile an iteration, and every second iteration draws
the last two tiles as one [2, ROWS, TILE] block, so that each reduction, the scan and each
exchange between warps serve both tiles (the draws are the same, term for term); the
accumulator's spare rows (the dot's 16 against 2 x ROWS) hold the pair's second tile until
the epilogue adds them (32k B=1 / 32k B=8 / 128k B=1, S=2048: 29.2 / 164.8 / 75.8 us
against 30.6 / 179.2 / 84.1 one tile at a time; H200, 2026-12-03: results/h200/tune-2026-12-03-s23).

``S_tile = max(1, S // T_b)`` depends on the sequence's length: the lagged loop holds
``P`` samples a head and tile (``P`` a power of two, by default the one covering
``S_tile`` at the cache's capacity, the common decode case); a program whose sequence
draws more (a shorter sequence) runs the same draw without the lag, ``P`` samples at a
time. The lagged loop holds no nested loop, so Triton's pipeliner stages its K tiles;
the other loop's K loads wait in their own iteration (only its inner loop over sample
chunks is pipelined), the price of a case decode batches rarely hit.

Byte model: reads ``B*Hkv*N*d*E`` (K) + the group's union of sampled V rows (HBM
traffic; ``<= B*Hkv*min(N, G*S)`` rows of ``d*E``); writes ``B*Hq*splits*(d+2)*4``
partials, which the merge reads and turns into ``B*Hq*d*E``.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from santa_kernels.kv import KVCache
from santa_kernels.triton_santa import (
    FLASH_W_BITS,
    H200_SM_COUNT,
    MIN_TILES_PER_SPLIT,
    PROGRAMS_PER_SM,
    SantaInfo,
    SantaWorkspace,
    _cache_args,
    _capacity,
    _check_uniforms,
    _dot_precision,
    _flash_local_weights,
    _flash_narrow_group,
    _merge_kernel,
    _next_pow2,
    _pdl_trigger,
    _prepare,
    _row_offsets,
    _tile_count,
    _tile_merge,
    _tile_scores,
    pdl_available,
)
from santa_kernels.triton_santa_flash2 import _launch_config
from santa_kernels.validate import InputError, check_positive_int

# (num_warps, num_stages) of the streaming kernel per head dim, and from LARGE_GROUPS
# (sequences x KV heads) on. d=128 swept on the H200 (S=2048, tile 64, lag 1; results/h200/
# tune-2026-12-02-s18/3-fcompact-tiles-warps.csv): (4, 3) 33.9 / 92.4 us at 32k B=1 /
# 128k B=1 (8 groups; (2, 3) 35.0 / 98.9, (4, 2) 34.8 / 99.1, (1, 3) 38.7 / 106.6), at
# 32k B=8 (64 groups) (2, 3) 210.4 us against 307.3 for (4, 3) (225.5 at four times the
# split); (4, 4), (8, 3) and (2, 4) 1.5-1.7x slower at B=1, within 6% at 32k B=8
# (1-fcompact-6d374e6.csv). d=64 and 256 not swept: the count pass's launches.
COMPACT_CONFIG = {64: (4, 4), 128: (4, 3), 256: (8, 2)}
COMPACT_CONFIG_LARGE = {128: (2, 3)}
LARGE_GROUPS = 32
# A tile's V rows are loaded at the end of its iteration and summed one iteration later:
# 33.9 / 307.3 / 92.4 us at 32k B=1 / 32k B=8 / 128k B=1 against 37.3 / 363.3 / 106.8
# loaded at the top of the next iteration (lag 0) and 38.3 / 381.4 / 109.5 summed two
# iterations later (lag 2) ((4, 3); 2-fcompact-88559cc.csv; both variants removed, code
# at 43ab94e)
MAX_LAG_SAMPLES = 64  # the lagged loop's samples a head and tile, at most (P)
LARGE_GROUP_PROGRAMS_PER_SM = 5  # programs of the 2-warp launch an SM holds (compact_splits)
PAIR_MAX_ENTRIES = 32  # gathered V rows a pair of tiles may carry (draw_tiles 2 by default)
# the packed columns by the closed form and each pair's V rows loaded once, from this P on
# (H200, S=2048 vs 128; tune-2026-12-03-s24/1-*: P=4 32k B=1 28.96 / 29.04 us against
# 29.14, B=8 162.24 / 161.78 against 164.17; P=1 (S=128, and 128k) both slower, by
# 0.3-2 us; offline the closed form is 903 against 948 pair-loop instructions at P=4,
# 815 against 780 at P=1, 857 against 845 at P=2)
CLOSED_MIN_SAMPLES = 4
# Register caps of the pair loop by warps a program (d=128, G=4, P=4, offline sm_90a
# compile, triton 3.6; no spills under either): 4 warps 168 uncapped (3 programs an SM),
# 128 capped (4 an SM); 2 warps 212 uncapped, 200 capped. The 2-warp pair launch's 46 KB
# of shared memory hold four programs an SM. Measured (S=2048,
# 32k, tune-2026-12-03-s23/3-* and 4-*): B=8 164.8 us capped against 171.6 uncapped at 8
# splits; 244.7 at 10 (two waves)
PAIR_MAXNREG = {4: 128, 2: 200}
# Pairs keep the 4-warp launch at every group count (four programs an SM at 128
# registers, as the 2-warp launch at 200, twice the warps): S=2048, 32k,
# results/h200/tune-2026-12-03-s24/3-*: B=4 86.04 us against 87.05, B=8 161.62 against
# 162.67, B=16 310.41 against 313.09 (2 stages, more programs an SM: slower, 176.97+ at B=8)
# The split merge as a programmatic dependent of the streaming kernel, below LARGE_GROUPS
# (32k B=1 S=2048, 2 alternations: 28.71 / 28.69 us against 28.99 / 29.07; at B=8 with the
# 4-warp launch 162.84 against 161.36: not there), on MERGE_WARPS warps (B=1 29.04 /
# 29.07 against 28.99 / 29.07 at 4; B=8 161.36 against 161.62)
MERGE_WARPS = 2


def pair_draws(group: int, samples: int, tile: int = 64, packed_columns: bool = True) -> bool:
    """Whether the lagged loop may draw its tiles in pairs: packed columns (``samples`` =
    P <= 8, tiles of at most 128 rows) and at most 8 heads a group (twice the group's
    padded rows within the dot's 16: the accumulator's spare rows hold a pair's second
    tile)."""
    return packed_columns and samples <= 8 and tile <= 128 and group <= 8


def default_draw_tiles(group: int, samples: int, tile: int = 64) -> int:
    """2 (pairs) where :func:`pair_draws` allows and a pair gathers at most
    :data:`PAIR_MAX_ENTRIES` rows, else 1. Measured against 1 (d=128, G=4; S=2048 / S=128,
    tune-2026-12-03-s23/2-* to 4-*): 32k B=1 29.2 / 26.1 us against 30.6 / 28.3, 128k B=1
    75.8 / 75.4 against 84.1 / 84.4, 32k B=8 164.8 / 141.0 against 179.2 / 159.1 (each
    at its own split), B=2 48.4 against 51.3, B=4 88.0 against 93.4, B=16 321.8 against
    339.8."""
    rows = max(2, _next_pow2(group))
    return 2 if pair_draws(group, samples, tile) and 2 * rows * samples <= PAIR_MAX_ENTRIES else 1


def v_words(v: torch.Tensor) -> bool:
    """Whether the kernel reads ``v`` [X, Y, Hkv, d] in 32-bit words of two elements:
    16-bit elements, even strides and head dim, a word-aligned base."""
    return (v.element_size() == 2 and v.shape[-1] % 2 == 0 and v.data_ptr() % 4 == 0
            and all(st % 2 == 0 for st in v.stride()[:3]) and v.stride(3) == 1)


def compact_config(head_dim: int, groups: int = 1, tile: int = 64,
                   pairs: bool = False) -> tuple[int, int]:
    """The default ``(num_warps, num_stages)`` for ``head_dim``, ``groups`` = B * Hkv and
    ``tile``. Tiles of 128 rows or more: 4 warps, 2 stages (d=128, S=2048: 42.0 / 261.2 /
    79.8 us at 32k B=1 / 32k B=8 / 128k B=1 against 42.0 / 306.6 / 111.7 for (4, 3); (1, 3)
    and (2, 3) slower everywhere; 3-fcompact-tiles-warps.csv). ``pairs`` (tiles drawn in
    pairs): the small-group launch at every group count."""
    key = min(COMPACT_CONFIG, key=lambda d: (abs(d - head_dim), d))
    if tile >= 128:
        return COMPACT_CONFIG[key][0], min(2, COMPACT_CONFIG[key][1])
    if groups >= LARGE_GROUPS and key in COMPACT_CONFIG_LARGE and not pairs:
        return COMPACT_CONFIG_LARGE[key]
    return COMPACT_CONFIG[key]


def compact_splits(groups: int, n_tiles: int, head_dim: int = 128, tile: int = 64,
                   sm_count: int = H200_SM_COUNT, pairs: bool = True) -> int:
    """The default split count for ``groups`` = B * Hkv sequences x KV heads of ``n_tiles``
    tiles: as many programs as fit the SMs at once under :func:`compact_config`'s launch
    (one wave: 4 programs an SM of 4 warps, 5 of the 2-warp large-group launch, whose 41 KB
    of shared memory allow five), at least MIN_TILES_PER_SPLIT tiles each. Measured on the
    H200 (S=2048, 32k; tune-2026-12-03-s22/3-* and 4-*): 10 splits at B=8 177.7 us against 188.8
    for the 9 of ``num_splits_for`` (12: 250.0, 14: 221.0), 20 at B=4 92.6 against 105.6
    (17; 22: 134.1), 5 at B=16 the same as before (6: 474.6 against 337.2); 64 at B=1
    (unchanged; 74: 40.0 against 30.6). ``pairs``: the launch draws tiles in pairs
    (:func:`default_draw_tiles`): :func:`compact_config`'s pair launch (4 warps, four
    programs an SM)."""
    warps, _ = compact_config(head_dim, groups, tile, pairs)
    per_sm = LARGE_GROUP_PROGRAMS_PER_SM if warps == 2 else PROGRAMS_PER_SM
    splits = max(1, min(per_sm * sm_count // max(1, groups),
                        -(-n_tiles // MIN_TILES_PER_SPLIT)))
    per_split = -(-n_tiles // splits)
    return -(-n_tiles // per_split)


def lag_samples(S: int, capacity: int, tile: int) -> int:
    """``P``: the power of two covering ``S_tile`` of a sequence at ``capacity`` rows,
    capped at :data:`MAX_LAG_SAMPLES`."""
    per_tile = max(1, S // max(1, -(-capacity // tile)))
    return min(MAX_LAG_SAMPLES, _next_pow2(per_tile))


@triton.jit
def _floors(w, mass, a, per_tile):
    """``f_i = floor(a + S_tile F_i)`` of the integer local CDF (``_flash_counts``' first
    term, the same operations: the same floors bit for bit)."""
    cum = tl.cumsum(w, axis=1)
    inv = 1.0 / tl.maximum(mass, 1).to(tl.float32)
    cdf_in = tl.where(cum >= mass[:, None], 1.0, cum.to(tl.float32) * inv[:, None])
    return tl.floor(a[:, None] + per_tile * cdf_in)


@triton.jit
def _flat(x, ROWS: tl.constexpr, P: tl.constexpr, GR: tl.constexpr):
    """[ROWS, P] -> [GR] in row-major order (repeated to fill ``GR > ROWS * P``)."""
    x = tl.reshape(x, [ROWS * P])
    if GR > ROWS * P:
        x = tl.reshape(tl.broadcast_to(x[None, :], [GR // (ROWS * P), ROWS * P]), [GR])
    return x


@triton.jit
def _expand(x, ROWS: tl.constexpr, G_PAD: tl.constexpr):
    """[ROWS] -> [G_PAD]: row ``r`` holds ``x[r % ROWS]``."""
    if G_PAD > ROWS:
        x = tl.reshape(tl.broadcast_to(x[None, :], [G_PAD // ROWS, ROWS]), [G_PAD])
    return x


@triton.jit
def _packed_columns(f, j0, per_tile, rows_ok, P: tl.constexpr, CLOSED: tl.constexpr = False):
    """Per head the columns ``#{i : f_i <= j}`` of its samples ``j = j0 + p < S_tile``
    (``p < P <= 8``; 0 past ``S_tile``), 8 bits each packed into one integer (a column is
    below TILE <= 128: the fields neither carry nor reach the sign bit): one reduction over
    the last axis in the layout of ``f`` (``[ROWS, TILE]``, or ``[2, ROWS, TILE]`` for a
    pair of tiles), no block of samples; -1 on heads not ``rows_ok``."""
    PACK: tl.constexpr = tl.int32 if P <= 4 else tl.int64
    if CLOSED:
        # element i adds 1 to the fields p >= k_i = clamp(f_i - j0, 0, P): the field mask
        # FULL >> 8 k << 8 k in a few integer operations instead of P compares; the fields
        # of samples past S_tile are cleared once, after the sum
        FULL: tl.constexpr = ((1 << (8 * P)) - 1) // 255  # 0x01 in each of the P fields
        k = tl.minimum(tl.maximum(f - j0, 0.0), P).to(tl.int32)
        km = tl.minimum(k, P - 1).to(PACK)  # shifts stay below the width
        bits = tl.where(k >= P, 0, (tl.full(f.shape, FULL, PACK) >> (8 * km)) << (8 * km))
        # fields p < n_ok (the samples below S_tile; n_ok >= 1 on every call) kept
        n_ok = tl.minimum(tl.maximum(per_tile - j0, 1.0), P).to(PACK)
        keep = tl.where(n_ok >= P, -1, (tl.full([], FULL, PACK) >> (8 * (P - n_ok))) * 255)
        packed = tl.sum(bits, axis=-1) & keep
    else:
        bits = tl.zeros(f.shape, dtype=PACK)
        for p in tl.static_range(P):
            # a product, not ``&``: the interpreter cannot AND a tensor with a scalar mask
            hit = (f <= (j0 + p)).to(PACK) * (per_tile > (j0 + p)).to(PACK)
            bits += hit << (8 * p)
        packed = tl.sum(bits, axis=-1)
    return tl.where(rows_ok, packed, -1)


@triton.jit
def _sampled_rows(f, j0, per_tile, rows_ok, t, page_table_ptr, b, stride_vx, stride_vy,
                  stride_pt, page_size, PAGED: tl.constexpr, TILE: tl.constexpr,
                  ROWS: tl.constexpr, P: tl.constexpr, GR: tl.constexpr,
                  PACKED: tl.constexpr = False, CLOSED: tl.constexpr = False):
    """Samples ``j0 .. j0 + P - 1`` of each head's tile draw, flattened to ``GR`` entries
    (entry ``c < ROWS * P``: head ``c // P``, sample ``j0 + c % P``): their sequence
    rows, V offsets and validity (``j < S_tile`` on a valid head and tile). ``PACKED``
    (P <= 8, TILE <= 128): the columns through :func:`_packed_columns`, one small vector
    a head carried to the entries instead of a [ROWS, P, TILE] block and its conversions."""
    if PACKED:
        # each entry gathers its head's packed columns (one exchange) and unpacks its own
        c = tl.arange(0, GR)
        slot = c % P
        packed = tl.gather(_packed_columns(f, j0, per_tile, rows_ok, P, CLOSED), (c // P) % ROWS,
                           0)
        col = ((packed >> (8 * slot)) & 255).to(tl.int32)
        ok = (packed >= 0) & (per_tile > (j0 + slot)) & (c < ROWS * P)
        n = tl.where(ok, t * TILE + col, 0)
    else:
        j = (j0 + tl.arange(0, P)).to(tl.float32)
        col = tl.sum((f[:, None, :] <= j[None, :, None]).to(tl.int32), axis=2)  # [ROWS, P]
        ok = (j[None, :] < per_tile) & rows_ok[:, None]
        n = _flat(tl.where(ok, t * TILE + col, 0), ROWS, P, GR)
        ok = _flat(ok, ROWS, P, GR) & (tl.arange(0, GR) < ROWS * P)
    off = _row_offsets(page_table_ptr, b, n, stride_vx, stride_vy, stride_pt, page_size, PAGED)
    return n, off, ok


@triton.jit
def _load_rows(v_base, off, ok, offs_w, mask_w):
    """The V rows at ``off`` [GR] as one [GR, D_PAD // HALVES] block of words (rows not
    ``ok``: zeros; ``v_base`` and ``off`` in words). ``HALVES`` 2 (16-bit elements):
    32-bit words of two elements, which the lagged loop carries to its next iteration in
    the registers they were loaded into. (Carried as a bf16 block, they were repacked at
    the end of the loading iteration, ptxas's byte permutes waiting on the load: 18% of
    the warps' stall samples at 32k B=1, the V latency exposed in the iteration meant to
    hide it; H200, 2026-12-02: results/h200/tune-2026-12-02-s20.)"""
    return tl.load(v_base + off[:, None] + offs_w[None, :], mask=ok[:, None] & mask_w[None, :],
                   other=0)


@triton.jit
def _head_sums(select, v, DOT_PRECISION: tl.constexpr, HALVES: tl.constexpr,
               ELEM: tl.constexpr):
    """``select @ v``: per head (a row of ``select``, 0/1 over the gathered rows), the sum
    of its sampled rows on tensor cores (exact: 0/1 weights), fp32 [G_PAD, D_PAD //
    HALVES]: with words of two elements the sums of the even and of the odd elements,
    else the sums twice."""
    if HALVES == 2:
        lo = (v & 0xFFFF).to(tl.int16).to(ELEM, bitcast=True)
        hi = (v >> 16).to(tl.int16).to(ELEM, bitcast=True)
        if DOT_PRECISION == "ieee":  # bf16 under the interpreter (see _dot_precision)
            o0 = tl.dot(select, lo.to(tl.float32), input_precision="ieee")
            o1 = tl.dot(select, hi.to(tl.float32), input_precision="ieee")
        else:
            o0 = tl.dot(select.to(ELEM), lo)
            o1 = tl.dot(select.to(ELEM), hi)
    elif DOT_PRECISION == "ieee":
        o0 = tl.dot(select.to(tl.float32), v.to(tl.float32), input_precision="ieee")
        o1 = o0
    else:
        o0 = tl.dot(select.to(v.dtype), v)
        o1 = o0
    return o0, o1


@triton.jit
def _rescaled(acc0, acc1, alpha, HALVES: tl.constexpr):
    """Both accumulators times ``alpha`` per row (acc1 only with words of two elements)."""
    acc0 = acc0 * alpha[:, None]
    if HALVES == 2:
        acc1 = acc1 * alpha[:, None]
    return acc0, acc1


@triton.jit
def _add_sums(acc0, acc1, coef, select, v, DOT_PRECISION: tl.constexpr,
              HALVES: tl.constexpr, ELEM: tl.constexpr):
    """``acc + coef * (select @ v)`` per accumulator row (acc1 only with words of two)."""
    s0, s1 = _head_sums(select, v, DOT_PRECISION, HALVES, ELEM)
    acc0 += coef[:, None] * s0
    if HALVES == 2:
        acc1 += coef[:, None] * s1
    return acc0, acc1


@triton.jit
def _narrow_scores(q, k_ptr, page_table_ptr, b, kvh, t, length, head_dim, scale, stride_kx,
                   stride_ky, stride_kh, stride_pt, page_size, k_desc, seq_rows,
                   PAGED: tl.constexpr, TILE: tl.constexpr, G_PAD: tl.constexpr,
                   ROWS: tl.constexpr, D_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr,
                   TMA: tl.constexpr):
    """Tile ``t``'s scores on the dot's G_PAD rows, narrowed to the ROWS real ones
    [ROWS, TILE] (-inf past the end)."""
    s, _, _ = _tile_scores(q, k_ptr, page_table_ptr, b, kvh, t, length, head_dim, scale,
                           stride_kx, stride_ky, stride_kh, stride_pt, page_size, PAGED, TILE,
                           D_PAD, DOT_PRECISION, k_desc, seq_rows, TMA)
    if ROWS < G_PAD:  # the padding rows of q are zero (-inf past the end): exact
        s = tl.sum(tl.reshape(s, [G_PAD // ROWS, ROWS, TILE]), axis=0)
    return s


@triton.jit
def _tile_draw(q, k_ptr, page_table_ptr, b, kvh, t, length, head_dim, scale, stride_kx,
               stride_ky, stride_kh, stride_pt, page_size, k_desc, seq_rows, head_rows,
               mask_g, uniforms_ptr, uniform_stride, seed, rng_base, per_tile,
               PAGED: tl.constexpr, TILE: tl.constexpr, G_PAD: tl.constexpr,
               ROWS: tl.constexpr, D_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr,
               W_SCALE: tl.constexpr, HAS_UNIFORMS: tl.constexpr, TMA: tl.constexpr):
    """Tile ``t``'s narrowed scores and its draw (``_flash_kernel``'s, term for term):
    ``(m_t, row_ok, l_t, f)``, ``l_t`` the tile mass and ``f`` the systematic floors of
    its integer local CDF."""
    s = _narrow_scores(q, k_ptr, page_table_ptr, b, kvh, t, length, head_dim, scale,
                       stride_kx, stride_ky, stride_kh, stride_pt, page_size, k_desc,
                       seq_rows, PAGED, TILE, G_PAD, ROWS, D_PAD, DOT_PRECISION, TMA)
    m_t, row_ok, w, mass = _flash_local_weights(s, W_SCALE)
    if HAS_UNIFORMS:
        a = tl.load(uniforms_ptr + head_rows * uniform_stride + t, mask=mask_g & row_ok,
                    other=0.0)
    else:
        a = tl.rand(seed, rng_base + t)
    return m_t, row_ok, mass.to(tl.float32) / W_SCALE, _floors(w, mass, a, per_tile)


@triton.jit
def _pair_draw(s0, s1, t0, head_rows, mask_g, uniforms_ptr, uniform_stride, seed, rng_base,
               per_tile, W_SCALE: tl.constexpr, HAS_UNIFORMS: tl.constexpr):
    """The draws of tiles ``t0`` and ``t0 + 1`` (scores ``s0``, ``s1`` [ROWS, TILE]) in
    one [2, ROWS, TILE] block, so that each reduction, the scan and every exchange
    between warps serve both tiles: ``_tile_draw``'s operations, term for term (the same
    floors bit for bit). Returns ``(m_t, row_ok, l_t, f)`` with a leading tile axis."""
    s = tl.permute(tl.join(s0, s1), (2, 0, 1))
    m_t = tl.max(s, axis=2)
    row_ok = m_t > float("-inf")
    m_safe = tl.where(row_ok, m_t, 0.0)
    w = (tl.exp(s - m_safe[:, :, None]) * W_SCALE + 0.5).to(tl.int32)
    mass = tl.sum(w, axis=2)
    tiles = t0 + tl.arange(0, 2)
    if HAS_UNIFORMS:
        a = tl.load(uniforms_ptr + head_rows[None, :] * uniform_stride + tiles[:, None],
                    mask=mask_g[None, :] & row_ok, other=0.0)
    else:
        a = tl.rand(seed, rng_base[None, :] + tiles[:, None])
    cum = tl.cumsum(w, axis=2)
    inv = 1.0 / tl.maximum(mass, 1).to(tl.float32)
    cdf_in = tl.where(cum >= mass[:, :, None], 1.0, cum.to(tl.float32) * inv[:, :, None])
    f = tl.floor(a[:, :, None] + per_tile * cdf_in)
    return m_t, row_ok, mass.to(tl.float32) / W_SCALE, f


@triton.jit
def _pair_merge(m_run, l_run, m_t, mass):
    """:func:`_tile_merge` of two tiles at once (``m_t``, ``mass`` [2, ROWS]): ``(m_new,
    l_new, alpha, w_t)``, ``w_t`` [2, ROWS] the tiles' weights against ``m_new``."""
    m_new = tl.maximum(m_run, tl.max(m_t, axis=0))
    m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)
    alpha = tl.exp(m_run - m_ref)
    w_t = tl.where(m_t > float("-inf"), tl.exp(m_t - m_ref[None, :]) * mass, 0.0)
    return m_new, l_run * alpha + tl.sum(w_t, axis=0), alpha, w_t


@triton.jit
def _pair_rows(f, per_tile, rows_ok, t0, page_table_ptr, b, stride_vx, stride_vy,
               stride_pt, page_size, PAGED: tl.constexpr, TILE: tl.constexpr,
               ROWS: tl.constexpr, P: tl.constexpr, GR: tl.constexpr,
               CLOSED: tl.constexpr = False):
    """:func:`_sampled_rows` (packed) of a pair's draw ``f`` [2, ROWS, TILE]: entry ``c <
    2 * ROWS * P`` is tile ``t0 + c // (ROWS * P)``, head ``(c // P) % ROWS``, sample
    ``c % P``."""
    c = tl.arange(0, GR)
    slot = c % P
    packed = tl.reshape(_packed_columns(f, 0, per_tile, rows_ok, P, CLOSED), [2 * ROWS])
    packed = tl.gather(packed, (c // P) % (2 * ROWS), 0)
    col = ((packed >> (8 * slot)) & 255).to(tl.int32)
    ok = (packed >= 0) & (per_tile > slot) & (c < 2 * ROWS * P)
    n = tl.where(ok, (t0 + c // (ROWS * P)) * TILE + col, 0)
    off = _row_offsets(page_table_ptr, b, n, stride_vx, stride_vy, stride_pt, page_size, PAGED)
    return n, off, ok


@triton.jit
def _flash_compact_kernel(
    q_ptr, k_ptr, v_ptr, lengths_ptr, page_table_ptr,
    part_m_ptr, part_l_ptr, part_o_ptr, counts_ptr, uniforms_ptr, rng_ptr, seed,
    scale, S, num_kv_heads, num_q_heads, group, head_dim: tl.constexpr, tiles_per_split,
    num_splits, counts_stride, uniform_stride, rng_stride,
    stride_qb, stride_qh, stride_kx, stride_ky, stride_kh, stride_vx, stride_vy, stride_vh,
    stride_pt, page_size,
    PAGED: tl.constexpr, TILE: tl.constexpr, G_PAD: tl.constexpr, ROWS: tl.constexpr,
    D_PAD: tl.constexpr, P: tl.constexpr, GR: tl.constexpr, HAS_UNIFORMS: tl.constexpr,
    STORE_COUNTS: tl.constexpr, DOT_PRECISION: tl.constexpr, W_BITS: tl.constexpr,
    GROUP_RNG: tl.constexpr = False, k_desc=None, seq_rows=0, TMA: tl.constexpr = False,
    HALVES: tl.constexpr = 1, PACKED: tl.constexpr = False, DRAW_TILES: tl.constexpr = 1,
    V_TWICE: tl.constexpr = True, CLOSED_COLUMNS: tl.constexpr = False,
    LET_MERGE: tl.constexpr = False,
):
    # One program: tiles [t_begin, t_end) of one (sequence, KV head), all G query heads.
    # The dot runs on G_PAD >= 16 rows, everything after it on ROWS >= G real rows.
    # STORE_COUNTS (tests, read accounting): per-row counts by atomic adds (int32).
    W_SCALE: tl.constexpr = (1 << W_BITS) // TILE
    _pdl_trigger(LET_MERGE)  # the merge (launch_pdl) may launch as this grid's programs start
    split = tl.program_id(0)
    b, kvh, length, per_tile, t_begin, t_end, q, head_rows, mask_g, rng_base = (
        _flash_narrow_group(q_ptr, lengths_ptr, rng_ptr, S, num_kv_heads, num_q_heads, group,
                            head_dim, tiles_per_split, rng_stride, stride_qb, stride_qh, TILE,
                            G_PAD, ROWS, D_PAD, GROUP_RNG))
    # V moves in words of HALVES elements (see _load_rows): D_W of them a row
    D_W: tl.constexpr = D_PAD // HALVES
    offs_w = tl.arange(0, D_W)
    mask_w = offs_w < head_dim // HALVES
    elem = v_ptr.dtype.element_ty
    if HALVES == 2:  # the V strides come in words
        v_base = v_ptr.to(tl.pointer_type(tl.int32)) + kvh * stride_vh
    else:
        v_base = v_ptr + kvh * stride_vh
    m_run = tl.full([ROWS], float("-inf"), tl.float32)
    l_run = tl.zeros([ROWS], dtype=tl.float32)
    # the accumulators on the dot's G_PAD rows (row r: head r % ROWS; rows >= ROWS stay 0):
    # each tile's per-head sums come from select @ V dots, no reshape of V; acc1 holds the
    # odd elements' sums with words of two (HALVES 2), else is unused
    acc0 = tl.zeros([G_PAD, D_W], dtype=tl.float32)
    acc1 = tl.zeros([G_PAD, D_W], dtype=tl.float32)
    offs_c = tl.arange(0, GR)
    # entry c of the gathered rows is summed into accumulator row c // P (DRAW_TILES 2:
    # rows ROWS.. 2 ROWS - 1 hold the second tile of a pair; the epilogue sums them)
    select = ((offs_c[None, :] // P == tl.arange(0, G_PAD)[:, None])
              & (offs_c[None, :] < DRAW_TILES * ROWS * P)).to(tl.float32)
    # entry c's head row (STORE_COUNTS): head (c // P) % ROWS of the group
    entry_heads = (b * num_q_heads + kvh * group + (offs_c // P) % ROWS).to(tl.int64)
    if DRAW_TILES == 2 and per_tile <= P:
        # tiles in pairs: one draw for two tiles (every exchange between warps serves
        # both), at the pair's second iteration (a lone last tile pairs with an empty one).
        # Every iteration loads the latest pair's V rows: at its draw (from HBM) and again
        # a tile later (from L2), the copy summed at the next pair; the load stays outside
        # the branch (loaded inside it, Triton 3.6 converts the block for the dot right
        # after the load, and the V latency is exposed in the drawing iteration)
        v1 = tl.zeros([GR, D_W], dtype=tl.int32 if HALVES == 2 else elem)
        c1 = tl.zeros([2, ROWS], dtype=tl.float32)
        s_prev = tl.full([ROWS, TILE], float("-inf"), tl.float32)
        off = tl.zeros([GR], dtype=tl.int64)
        ok = offs_c < 0
        for t in range(t_begin, t_end):
            s = _narrow_scores(q, k_ptr, page_table_ptr, b, kvh, t, length, head_dim, scale,
                               stride_kx, stride_ky, stride_kh, stride_pt, page_size, k_desc,
                               seq_rows, PAGED, TILE, G_PAD, ROWS, D_PAD, DOT_PRECISION, TMA)
            second = (t - t_begin) % 2
            if (second == 1) | (t == t_end - 1):
                s0 = tl.where(second == 1, s_prev, s)
                s1 = tl.where(second == 1, s, float("-inf"))
                t0 = t - second
                m_t, row_ok, mass, f = _pair_draw(s0, s1, t0, head_rows, mask_g, uniforms_ptr,
                                                  uniform_stride, seed, rng_base, per_tile,
                                                  W_SCALE, HAS_UNIFORMS)
                m_run, l_run, alpha, w_t = _pair_merge(m_run, l_run, m_t, mass)
                acc0, acc1 = _rescaled(acc0, acc1, _expand(alpha, ROWS, G_PAD), HALVES)
                carried = tl.reshape(c1 * alpha[None, :], [2 * ROWS])  # last pair's, rescaled
                acc0, acc1 = _add_sums(acc0, acc1, _expand(carried, 2 * ROWS, G_PAD), select,
                                       v1, DOT_PRECISION, HALVES, elem)
                c1 = w_t / per_tile
                n, off, ok = _pair_rows(f, per_tile, mask_g[None, :] & row_ok, t0,
                                        page_table_ptr, b, stride_vx, stride_vy, stride_pt,
                                        page_size, PAGED, TILE, ROWS, P, GR, CLOSED_COLUMNS)
                if STORE_COUNTS:
                    tl.atomic_add(counts_ptr + entry_heads * counts_stride + n, 1, mask=ok,
                                  sem="relaxed")
            else:
                s_prev = s
            if V_TWICE:
                v1 = _load_rows(v_base, off, ok, offs_w, mask_w)
            else:  # the rows once: a tile after their draw, or at once where the next
                # iteration sums them (a lone last tile) or none follows
                # (a product: the interpreter cannot AND a tensor with a scalar mask)
                now = ((second == 0) | (t >= t_end - 2)).to(tl.int32)
                v1 = _load_rows(v_base, off, (ok.to(tl.int32) * now) != 0, offs_w, mask_w)
        acc0, acc1 = _add_sums(acc0, acc1, _expand(tl.reshape(c1, [2 * ROWS]), 2 * ROWS, G_PAD),
                               select, v1, DOT_PRECISION, HALVES, elem)
    elif per_tile <= P:
        # the last tile's sampled V rows (in flight) and their weight W_t / S_tile a sample
        v1 = tl.zeros([GR, D_W], dtype=tl.int32 if HALVES == 2 else elem)
        c1 = tl.zeros([ROWS], dtype=tl.float32)
        for t in range(t_begin, t_end):
            m_t, row_ok, mass, f = _tile_draw(
                q, k_ptr, page_table_ptr, b, kvh, t, length, head_dim, scale, stride_kx,
                stride_ky, stride_kh, stride_pt, page_size, k_desc, seq_rows, head_rows,
                mask_g, uniforms_ptr, uniform_stride, seed, rng_base, per_tile, PAGED, TILE,
                G_PAD, ROWS, D_PAD, DOT_PRECISION, W_SCALE, HAS_UNIFORMS, TMA)
            m_run, l_run, alpha, w_t = _tile_merge(m_run, l_run, m_t, mass)
            acc0, acc1 = _rescaled(acc0, acc1, _expand(alpha, ROWS, G_PAD), HALVES)
            acc0, acc1 = _add_sums(acc0, acc1, _expand(c1 * alpha, ROWS, G_PAD), select, v1,
                                   DOT_PRECISION, HALVES, elem)
            c1 = w_t / per_tile
            n, off, ok = _sampled_rows(f, 0, per_tile, mask_g & row_ok, t, page_table_ptr, b,
                                       stride_vx, stride_vy, stride_pt, page_size, PAGED,
                                       TILE, ROWS, P, GR, PACKED, CLOSED_COLUMNS)
            v1 = _load_rows(v_base, off, ok, offs_w, mask_w)  # summed next iteration
            if STORE_COUNTS:
                tl.atomic_add(counts_ptr + entry_heads * counts_stride + n, 1, mask=ok,
                              sem="relaxed")
        acc0, acc1 = _add_sums(acc0, acc1, _expand(c1, ROWS, G_PAD), select, v1,
                               DOT_PRECISION, HALVES, elem)
    else:  # more than P samples a tile: the same draw, P samples at a time, no lag
        for t in range(t_begin, t_end):
            m_t, row_ok, mass, f = _tile_draw(
                q, k_ptr, page_table_ptr, b, kvh, t, length, head_dim, scale, stride_kx,
                stride_ky, stride_kh, stride_pt, page_size, k_desc, seq_rows, head_rows,
                mask_g, uniforms_ptr, uniform_stride, seed, rng_base, per_tile, PAGED, TILE,
                G_PAD, ROWS, D_PAD, DOT_PRECISION, W_SCALE, HAS_UNIFORMS, TMA)
            m_run, l_run, alpha, w_t = _tile_merge(m_run, l_run, m_t, mass)
            acc0, acc1 = _rescaled(acc0, acc1, _expand(alpha, ROWS, G_PAD), HALVES)
            coef = _expand(w_t / per_tile, ROWS, G_PAD)
            for j0 in range(0, per_tile.to(tl.int32), P):
                n, off, ok = _sampled_rows(f, j0, per_tile, mask_g & row_ok, t,
                                           page_table_ptr, b, stride_vx, stride_vy, stride_pt,
                                           page_size, PAGED, TILE, ROWS, P, GR, PACKED,
                                           CLOSED_COLUMNS)
                v = _load_rows(v_base, off, ok, offs_w, mask_w)
                acc0, acc1 = _add_sums(acc0, acc1, coef, select, v, DOT_PRECISION, HALVES,
                                       elem)
                if STORE_COUNTS:
                    tl.atomic_add(counts_ptr + entry_heads * counts_stride + n, 1, mask=ok,
                                  sem="relaxed")
    part = head_rows * num_splits + split
    tl.store(part_m_ptr + part, m_run, mask=mask_g)
    tl.store(part_l_ptr + part, l_run, mask=mask_g)
    o_rows = part_o_ptr + part[:, None] * head_dim
    o_mask = mask_g[:, None] & mask_w[None, :]
    acc0 = tl.sum(tl.reshape(acc0, [G_PAD // ROWS, ROWS, D_W]), axis=0)  # rows >= ROWS: 0
    tl.store(o_rows + HALVES * offs_w[None, :], acc0, mask=o_mask)
    if HALVES == 2:
        acc1 = tl.sum(tl.reshape(acc1, [G_PAD // ROWS, ROWS, D_W]), axis=0)
        tl.store(o_rows + 2 * offs_w[None, :] + 1, acc1, mask=o_mask)


def compact_workspace(q: torch.Tensor, kv: KVCache, S: int, tile: int = 64,
                      draw_tiles: int | None = None, **kw) -> SantaWorkspace:
    """A workspace for these inputs split by :func:`compact_splits` for calls drawing
    ``draw_tiles`` tiles at once (default :func:`default_draw_tiles`; ``kw``: the
    workspace's, e.g. ``seed``)."""
    groups = q.shape[0] * kv.num_kv_heads
    if draw_tiles is None:
        draw_tiles = default_draw_tiles(q.shape[1] // max(1, kv.num_kv_heads),
                                        lag_samples(S, _capacity(kv), tile), tile)
    pairs = draw_tiles == 2
    kw.setdefault("num_splits", compact_splits(groups, _tile_count(kv, tile),
                                               kv.head_dim, tile, pairs=pairs))
    return SantaWorkspace.for_inputs(q, kv, S, tile, **kw)


def santa_flash_compact(
    q: torch.Tensor, kv: KVCache, S: int, *, tile: int = 64, scale: float | None = None,
    seed: int | None = None, uniforms: torch.Tensor | None = None,
    workspace: SantaWorkspace | None = None, return_counts: bool = False,
    group_offsets: bool = False, samples: int | None = None,
    config: tuple[int, int] | None = None, tma: bool = True, maxnreg: int | None = None,
    words: bool = True, packed_columns: bool = True, draw_tiles: int | None = None,
    v_twice: bool | None = None, closed_columns: bool | None = None,
    pdl: bool | None = None, merge_warps: int = MERGE_WARPS,
) -> tuple[torch.Tensor, SantaInfo]:
    """Returns ``(out [B, Hq, d] in q.dtype, info)`` of S²ANTA-flash (section 4), one
    pass, each tile's sampled V rows gathered while the next tile streams.

    Same estimator, arguments and outputs as :func:`santa_kernels.triton_santa.santa_flash`
    (given the same ``uniforms [B, Hq, T]`` or the same seed and step, the same counts).
    ``samples``: ``P``, the lagged loop's samples a head and tile (a power of two; default
    :func:`lag_samples`); sequences drawing more take the loop without the lag.
    ``config``: ``(num_warps, num_stages)`` (default :func:`compact_config`). ``tma``:
    K through a tensor descriptor where the cache allows (contiguous, Hopper).
    ``maxnreg``: a register cap for the streaming kernel (compiled GPU kernels only).
    ``words``: V in 32-bit words where :func:`v_words` allows (False: element by element).
    ``packed_columns``: the sampled columns through one packed reduction a head (P <= 8
    and tiles of at most 128 rows; else, or False, through a [ROWS, P, TILE] block).
    ``draw_tiles``: 2 draws the lagged loop's tiles in pairs (one block, one exchange for
    both; packed columns only, twice the group's padded rows within the dot's 16 and at
    most :data:`PAIR_MAX_ENTRIES` gathered rows), 1 one at a time; default
    :func:`default_draw_tiles`. ``v_twice`` (pairs): each pair's V rows are loaded at its
    draw and again a tile later (the copy summed; the first load brings them to L2 early);
    False: once, a tile after the draw; default: once from :data:`CLOSED_MIN_SAMPLES`
    samples a tile on. ``closed_columns`` (packed): each element's share of the packed
    columns in a few integer operations instead of P compares (the same columns); default
    from :data:`CLOSED_MIN_SAMPLES` on. ``pdl`` (Hopper; ignored where
    :func:`pdl_available` is false): the merge launched as a programmatic dependent of the
    streaming kernel (default: below :data:`LARGE_GROUPS` sequences x KV heads);
    ``merge_warps``: the merge kernel's warps.
    ``return_counts`` adds per-row counts (an int32 buffer allocated by the call: off the
    hot path).
    """
    ws, scale = _prepare(q, kv, S, tile, scale, workspace, new_workspace=compact_workspace)
    batch, hq, d = q.shape
    hkv = kv.num_kv_heads
    group = hq // hkv
    n_tiles = _tile_count(kv, tile)
    uniforms = _check_uniforms(uniforms, (batch, hq, n_tiles))
    if samples is None:
        samples = lag_samples(S, _capacity(kv), tile)
    check_positive_int(samples, "samples")
    if samples & (samples - 1):
        raise InputError(f"samples: a power of two, got {samples}")
    rows = max(2, _next_pow2(group))
    per_split = -(-n_tiles // ws.num_splits)
    splits = -(-n_tiles // per_split)
    table, paged, page_size, stride_pt = _cache_args(kv)
    k_desc = ws.k_descriptor(kv, tile) if tma and kv.k.is_cuda else None
    # V in 32-bit words of two 16-bit elements where its strides allow (see _load_rows)
    halves = 2 if words and v_words(kv.v) else 1
    packed = packed_columns and samples <= 8 and tile <= 128
    if draw_tiles is None:
        draw_tiles = default_draw_tiles(group, samples, tile) if packed else 1
    if draw_tiles not in (1, 2) or (
            draw_tiles == 2 and not pair_draws(group, samples, tile, packed_columns)):
        raise InputError(f"draw_tiles: 1, or 2 with packed columns (P <= 8, tiles of at "
                         f"most 128 rows) and a group of at most 8 heads, got {draw_tiles} "
                         f"(group {group}, P {samples}, tile {tile})")
    warps, stages = _launch_config(
        config, compact_config(d, batch * hkv, tile, pairs=draw_tiles == 2), "config")
    if v_twice is None:
        v_twice = samples < CLOSED_MIN_SAMPLES
    if closed_columns is None:
        closed_columns = samples >= CLOSED_MIN_SAMPLES
    if pdl is None:
        pdl = batch * hkv < LARGE_GROUPS
    pdl = pdl and pdl_available(q.device)
    check_positive_int(merge_warps, "merge_warps")
    if maxnreg is None and draw_tiles == 2:
        maxnreg = PAIR_MAXNREG.get(warps)  # the programs an SM compact_splits plans for
    extra = {}
    if maxnreg is not None and os.environ.get("TRITON_INTERPRET", "0") != "1":
        extra["maxnreg"] = check_positive_int(maxnreg, "maxnreg")
    counts = None
    if return_counts:
        counts = torch.zeros(batch * hq, _capacity(kv), dtype=torch.int32, device=q.device)
    _flash_compact_kernel[(splits, batch * hkv)](
        q, kv.k, kv.v, kv.lengths, table, ws.part_m, ws.part_l, ws.part_o,
        counts if counts is not None else ws.part_m,
        uniforms if uniforms is not None else ws.part_m, ws.rng,
        ws.seed if seed is None else int(seed),
        scale, S, hkv, hq, group, d, per_split, ws.num_splits,
        counts.stride(0) if counts is not None else 0, n_tiles, ws.max_tiles,
        q.stride(0), q.stride(1), kv.k.stride(0), kv.k.stride(1), kv.k.stride(2),
        kv.v.stride(0) // halves, kv.v.stride(1) // halves, kv.v.stride(2) // halves,
        stride_pt, page_size,
        PAGED=paged, TILE=tile, G_PAD=max(16, _next_pow2(group)),
        ROWS=rows, D_PAD=_next_pow2(d), P=samples, GR=max(16, draw_tiles * rows * samples),
        HAS_UNIFORMS=uniforms is not None, STORE_COUNTS=counts is not None,
        DOT_PRECISION=_dot_precision(kv.k.dtype), W_BITS=FLASH_W_BITS,
        GROUP_RNG=group_offsets, k_desc=k_desc, seq_rows=kv.k.shape[1],
        TMA=k_desc is not None, HALVES=halves,
        PACKED=packed, DRAW_TILES=draw_tiles, V_TWICE=v_twice, CLOSED_COLUMNS=closed_columns,
        LET_MERGE=pdl, num_warps=warps, num_stages=stages, **extra,
    )
    out = ws.out(q.dtype)
    _merge_kernel[(batch * hq,)](
        ws.part_m, ws.part_l, ws.part_o, out, ws.rng, hq, splits, ws.num_splits, d,
        out.stride(0), out.stride(1),
        SPLIT_PAD=max(2, _next_pow2(splits)), D_PAD=_next_pow2(d), PDL=pdl,
        num_warps=merge_warps, **({"launch_pdl": True} if pdl else {}),
    )
    if counts is not None:
        counts = counts.view(batch, hq, -1)
    info = SantaInfo(method="flash", S=S, tile=tile, lengths=kv.lengths, num_kv_heads=hkv,
                     max_len=_capacity(kv), counts=counts)
    return out[:batch], info


__all__ = ["CLOSED_MIN_SAMPLES", "COMPACT_CONFIG", "compact_config", "compact_splits",
           "compact_workspace", "default_draw_tiles", "lag_samples", "pair_draws",
           "santa_flash_compact"]
