"""S²ANTA-flash (docs/algorithms.md section 4): the ``santa-flash`` kernel, one streaming
pass with compact, lagged V gathers, and the merge of its splits.

Every tile of a sequence draws ``S_tile = max(1, S // T_b)`` systematic samples from its
local distribution (integer weights: an exact local CDF), and the tiles' partial sums are
merged by FlashDecoding's running rule, each weighted by its tile's mass. One program
streams the tiles of one split of one (sequence, KV head) and serves the group's ``G``
query heads through one ``tl.dot`` a tile, so K is read once a group.

A tile's draw is turned into the ``S_tile`` sampled rows of every head directly (sample
``j`` of a head lies in the column ``i`` with ``f_{i-1} <= j < f_i``, ``f_i = floor(a +
S_tile F_i)`` the systematic floors of the integer local CDF ``F``, so its column is
``#{i : f_i <= j}``), and those ``G * S_tile`` rows are loaded at the end of the tile's
iteration and summed in the next one: the gather's latency hides behind the next K tile,
and only sampled rows move (a row sampled twice is loaded twice from the same address;
HBM moves it once). K tiles come through Hopper's bulk tensor copies where the cache
allows (``SantaWorkspace.k_descriptor``), as in prop's score pass. A head's ``P`` columns
come out of one reduction over the tile, 8 bits a sample packed in one integer that each
gathered entry picks its own from (:func:`_packed_columns`), without a [ROWS, P, TILE]
block and its layout conversions.

Tiles are drawn in pairs where the group allows (:func:`default_draw_tiles`): the lagged
loop keeps streaming one K tile an iteration, and every second iteration draws the last
two tiles as one [2, ROWS, TILE] block, so that each reduction, the scan and each
exchange between warps serve both tiles (the draws are the same, term for term); the
accumulator's spare rows (the dot's 16 against 2 x ROWS) hold the pair's second tile
until the epilogue adds them.

``S_tile`` depends on the sequence's length: the lagged loop holds ``P`` samples a head
and tile (``P`` the power of two covering ``S_tile`` at the cache's capacity, the common
decode case); a program whose sequence draws more (a shorter sequence) runs the same
draw without the lag, ``P`` samples at a time. The lagged loop holds no nested loop, so
Triton's pipeliner stages its K tiles; the other loop's K loads wait in their own
iteration (only its inner loop over sample chunks is pipelined), the price of a case
decode batches rarely hit.

Each choice above and each launch value below was timed against its alternatives on an
H200 (the masked-block V gather of an earlier fused kernel, a separate gather pass,
gathers at other lags, unpacked columns, tiles one at a time, other launches and
splits); the runs that chose them, with their figures, are the ``tune-*`` and
``kernels-*`` folders of results/h200 from 2026-11-29 to 2026-12-03 and their READMEs.

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
from santa_kernels.triton_launch import (
    H200_SM_COUNT,
    _pdl_trigger,
    _pdl_wait,
    _row_offsets,
    pdl_available,
)
from santa_kernels.triton_santa import (
    MIN_TILES_PER_SPLIT,
    PROGRAMS_PER_SM,
    SantaInfo,
    SantaWorkspace,
    _cache_args,
    _capacity,
    _check_uniforms,
    _dot_precision,
    _group_queries,
    _next_pow2,
    _prepare,
    _tile_count,
    _tile_scores,
)

# (num_warps, num_stages) of the streaming kernel per head dim (d=64 and 256 were not
# swept), and from LARGE_GROUPS sequences x KV heads on where tiles are drawn one at a
# time by groups of at most LARGE_GROUP_MAX_HEADS query heads: two warps, more programs
# an SM
FLASH_CONFIG = {64: (4, 4), 128: (4, 3), 256: (8, 2)}
FLASH_CONFIG_LARGE = {128: (2, 3)}
LARGE_GROUPS = 32
# The 2-warp launch was measured on groups of 4 heads (32/8, P = 4: 4 rows a draw, 16
# gathered V rows a tile). A group of 5 to 8 heads draws 8 rows and gathers 32 V rows a
# tile at P = 4, twice that on each warp: at 28/4/128, ctx 32k, B=8 (32 groups) santa-flash
# S=2048 ran at 1.56x its byte floor on 2 warps, where 12/2's groups of 6 on 4 warps (16
# groups, the same draw and gather) ran at 1.14x (H100 kernel rows of 2026-12-07). Groups
# of more heads keep 4 warps
LARGE_GROUP_MAX_HEADS = 4
W_BITS = 30  # integer tile weights: a tile's total stays below 2**W_BITS
MAX_LAG_SAMPLES = 64  # the lagged loop's samples a head and tile, at most (P)
LARGE_GROUP_PROGRAMS_PER_SM = 5  # programs of the 2-warp large-group launch an SM holds
PAIR_MAX_ENTRIES = 32  # gathered V rows a pair of tiles may carry (else one tile a draw)
# From this P on the packed columns come by a closed form (a few integer operations an
# element instead of P compares) and a pair's V rows are loaded once, a tile after their
# draw; below it the compares and a first load at the draw (which brings the rows to L2
# early; the copy loaded a tile later is summed) are the faster
CLOSED_MIN_SAMPLES = 4
# Register caps of the pair loop by warps a program: 4 warps at 128 registers (four
# programs an SM, the count flash_splits plans for), 2 warps at 200; neither spills
PAIR_MAXNREG = {4: 128, 2: 200}
# The split merge on MERGE_WARPS warps, launched as a programmatic dependent of the
# streaming kernel (Hopper) below LARGE_GROUPS sequences x KV heads, where it hides the
# merge's launch; from there on it is launched after the streaming kernel
MERGE_WARPS = 2


def pair_draws(group: int, samples: int, tile: int = 64) -> bool:
    """Whether the lagged loop may draw its tiles in pairs: packed columns (``samples`` =
    P <= 8, tiles of at most 128 rows) and at most 8 heads a group (twice the group's
    padded rows within the dot's 16: the accumulator's spare rows hold a pair's second
    tile)."""
    return samples <= 8 and tile <= 128 and group <= 8


def default_draw_tiles(group: int, samples: int, tile: int = 64) -> int:
    """2 (pairs) where :func:`pair_draws` allows and a pair gathers at most
    :data:`PAIR_MAX_ENTRIES` rows, else 1."""
    rows = max(2, _next_pow2(group))
    return 2 if pair_draws(group, samples, tile) and 2 * rows * samples <= PAIR_MAX_ENTRIES else 1


def v_words(v: torch.Tensor) -> bool:
    """Whether the kernel reads ``v`` [X, Y, Hkv, d] in 32-bit words of two elements:
    16-bit elements, even strides and head dim, a word-aligned base."""
    return (v.element_size() == 2 and v.shape[-1] % 2 == 0 and v.data_ptr() % 4 == 0
            and all(st % 2 == 0 for st in v.stride()[:3]) and v.stride(3) == 1)


def flash_config(head_dim: int, groups: int = 1, tile: int = 64,
                 pairs: bool = False, heads: int = 1) -> tuple[int, int]:
    """Returns the ``(num_warps, num_stages)`` of the streaming kernel for ``head_dim``
    (the nearest swept one), ``groups`` = B * Hkv, ``tile`` and ``heads`` query heads a
    group: tiles of 128 rows or more take at most 2 stages; ``pairs`` (tiles drawn in
    pairs) and groups of more than :data:`LARGE_GROUP_MAX_HEADS` heads keep the
    small-group launch at every group count."""
    key = min(FLASH_CONFIG, key=lambda d: (abs(d - head_dim), d))
    if tile >= 128:
        return FLASH_CONFIG[key][0], min(2, FLASH_CONFIG[key][1])
    if (groups >= LARGE_GROUPS and key in FLASH_CONFIG_LARGE and not pairs
            and heads <= LARGE_GROUP_MAX_HEADS):
        return FLASH_CONFIG_LARGE[key]
    return FLASH_CONFIG[key]


def flash_splits(groups: int, n_tiles: int, head_dim: int = 128, tile: int = 64,
                 sm_count: int = H200_SM_COUNT, pairs: bool = True, heads: int = 1) -> int:
    """Returns the split count for ``groups`` = B * Hkv sequences x KV heads of ``n_tiles``
    tiles: as many programs as fit the SMs at once under :func:`flash_config`'s launch
    (one wave: 4 programs an SM of 4 warps, 5 of the 2-warp large-group launch, whose
    41 KB of shared memory allow five), at least MIN_TILES_PER_SPLIT tiles each.
    ``pairs``: the launch draws tiles in pairs (:func:`default_draw_tiles`); ``heads``:
    query heads a group."""
    warps, _ = flash_config(head_dim, groups, tile, pairs, heads)
    per_sm = LARGE_GROUP_PROGRAMS_PER_SM if warps == 2 else PROGRAMS_PER_SM
    splits = max(1, min(per_sm * sm_count // max(1, groups),
                        -(-n_tiles // MIN_TILES_PER_SPLIT)))
    per_split = -(-n_tiles // splits)
    return -(-n_tiles // per_split)


def lag_samples(S: int, capacity: int, tile: int) -> int:
    """Returns ``P``: the power of two covering ``S_tile`` of a sequence at ``capacity``
    rows, capped at :data:`MAX_LAG_SAMPLES`."""
    per_tile = max(1, S // max(1, -(-capacity // tile)))
    return min(MAX_LAG_SAMPLES, _next_pow2(per_tile))


@triton.jit
def _flash_program(lengths_ptr, S, num_kv_heads, tiles_per_split, TILE: tl.constexpr):
    """A program's tiles: ``(b, kvh, length, per_tile, t_begin, t_end)`` for the grid
    ``(splits, B * Hkv)``, tiles ``[t_begin, t_end)`` of sequence ``b``'s KV head ``kvh``,
    each drawing ``per_tile = S_tile = max(1, S // T_b)`` samples."""
    b = tl.program_id(1) // num_kv_heads
    kvh = tl.program_id(1) % num_kv_heads
    length = tl.load(lengths_ptr + b)
    n_tiles = tl.cdiv(length, TILE).to(tl.int32)
    per_tile = tl.maximum(S // n_tiles, 1).to(tl.float32)
    t_begin = tl.program_id(0) * tiles_per_split
    t_end = tl.minimum(t_begin + tiles_per_split, n_tiles)
    return b, kvh, length, per_tile, t_begin, t_end


@triton.jit
def _narrow_group(q_ptr, lengths_ptr, rng_ptr, S, num_kv_heads, num_q_heads, group,
                  head_dim, tiles_per_split, rng_stride, stride_qb, stride_qh,
                  TILE: tl.constexpr, G_PAD: tl.constexpr, ROWS: tl.constexpr,
                  D_PAD: tl.constexpr):
    """The prologue of a program whose tail runs on the ``ROWS`` real rows of the group
    (the dot on its ``G_PAD`` rows): :func:`_flash_program`'s tiles, the group's queries
    ``q`` [G_PAD, D_PAD], and per real row its head row id, mask and Philox base (section
    8: keyed by (step, sequence, head, tile); the step from ``rng_ptr``, advanced by the
    merge). Returns ``(b, kvh, length, per_tile, t_begin, t_end, q, head_rows, mask_g,
    rng_base)``."""
    b, kvh, length, per_tile, t_begin, t_end = _flash_program(lengths_ptr, S, num_kv_heads,
                                                              tiles_per_split, TILE)
    step = tl.load(rng_ptr)
    q, heads, mask_g = _group_queries(q_ptr, b, kvh, group, head_dim, stride_qb, stride_qh,
                                      G_PAD, D_PAD)
    if ROWS < G_PAD:
        heads = kvh * group + tl.arange(0, ROWS)
        mask_g = tl.arange(0, ROWS) < group
    head_rows = (b * num_q_heads + heads).to(tl.int64)
    rng_base = (step << 32) + head_rows * rng_stride
    return b, kvh, length, per_tile, t_begin, t_end, q, head_rows, mask_g, rng_base


@triton.jit
def _local_weights(s, W_SCALE: tl.constexpr):
    """Per row the local max ``m_t`` (``-inf``: no valid column), ``row_ok``, and integer
    weights ``w`` (step ``1 / W_SCALE`` of the row's max, the resolution an fp32 CDF has
    near 1) with their total ``mass``."""
    m_t = tl.max(s, axis=1)
    row_ok = m_t > float("-inf")
    m_safe = tl.where(row_ok, m_t, 0.0)
    w = (tl.exp(s - m_safe[:, None]) * W_SCALE + 0.5).to(tl.int32)
    return m_t, row_ok, w, tl.sum(w, axis=1)


@triton.jit
def _tile_merge(m_run, l_run, m_t, mass):
    """FlashDecoding's running merge of one tile into per-row ``(m_run, l_run)``: the
    tile's max ``m_t`` and mass ``sum e^{s - m_t}``. Returns ``(m_new, l_new, alpha,
    w_t)``: the running state, the factor rescaling what was accumulated so far, and the
    tile's weight ``e^{m_t - m_new} * mass`` (0 where ``m_t = -inf``: no valid column)."""
    m_new = tl.maximum(m_run, m_t)
    m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)
    alpha = tl.exp(m_run - m_ref)
    w_t = tl.where(m_t > float("-inf"), tl.exp(m_t - m_ref) * mass, 0.0)
    return m_new, l_run * alpha + w_t, alpha, w_t


@triton.jit
def _floors(w, mass, a, per_tile):
    """``f_i = floor(a + S_tile F_i)``, the systematic floors of the integer local CDF
    (integer partial sums: exact and order-free); sample ``j`` lies in the column ``i``
    with ``f_{i-1} <= j < f_i``."""
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
    the registers they were loaded into. (Carried as a 16-bit block, they would be
    repacked at the end of the loading iteration, the byte permutes waiting on the load:
    the V latency exposed in the iteration meant to hide it.)"""
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
    """Tile ``t``'s narrowed scores and its draw: ``(m_t, row_ok, l_t, f)``, ``l_t`` the
    tile mass and ``f`` the systematic floors of its integer local CDF."""
    s = _narrow_scores(q, k_ptr, page_table_ptr, b, kvh, t, length, head_dim, scale,
                       stride_kx, stride_ky, stride_kh, stride_pt, page_size, k_desc,
                       seq_rows, PAGED, TILE, G_PAD, ROWS, D_PAD, DOT_PRECISION, TMA)
    m_t, row_ok, w, mass = _local_weights(s, W_SCALE)
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
def _flash_kernel(
    q_ptr, k_ptr, v_ptr, lengths_ptr, page_table_ptr,
    part_m_ptr, part_l_ptr, part_o_ptr, counts_ptr, uniforms_ptr, rng_ptr, seed,
    scale, S, num_kv_heads, num_q_heads, group, head_dim: tl.constexpr, tiles_per_split,
    num_splits, counts_stride, uniform_stride, rng_stride,
    stride_qb, stride_qh, stride_kx, stride_ky, stride_kh, stride_vx, stride_vy, stride_vh,
    stride_pt, page_size,
    PAGED: tl.constexpr, TILE: tl.constexpr, G_PAD: tl.constexpr, ROWS: tl.constexpr,
    D_PAD: tl.constexpr, P: tl.constexpr, GR: tl.constexpr, HAS_UNIFORMS: tl.constexpr,
    STORE_COUNTS: tl.constexpr, DOT_PRECISION: tl.constexpr, W_BITS: tl.constexpr,
    k_desc=None, seq_rows=0, TMA: tl.constexpr = False,
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
        _narrow_group(q_ptr, lengths_ptr, rng_ptr, S, num_kv_heads, num_q_heads, group,
                      head_dim, tiles_per_split, rng_stride, stride_qb, stride_qh, TILE, G_PAD,
                      ROWS, D_PAD))
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



@triton.jit
def _merge_kernel(
    part_m_ptr, part_l_ptr, part_o_ptr, out_ptr, rng_ptr,
    num_q_heads, num_splits, part_stride, head_dim: tl.constexpr, stride_ob, stride_oh,
    SPLIT_PAD: tl.constexpr, D_PAD: tl.constexpr, PDL: tl.constexpr = False,
):
    # One program a (sequence, query head): the FlashDecoding merge of its splits'
    # partials; the call's last kernel, so it advances the Philox step (section 8).
    _pdl_wait(PDL)  # launched with launch_pdl: wait for the partials
    pid = tl.program_id(0)
    b = pid // num_q_heads
    h = pid % num_q_heads
    offs_sp = tl.arange(0, SPLIT_PAD)
    offs_d = tl.arange(0, D_PAD)
    mask_sp = offs_sp < num_splits
    mask_d = offs_d < head_dim
    part = pid.to(tl.int64) * part_stride + offs_sp
    m = tl.load(part_m_ptr + part, mask=mask_sp, other=float("-inf"))
    l_s = tl.load(part_l_ptr + part, mask=mask_sp, other=0.0)
    o = tl.load(part_o_ptr + part[:, None] * head_dim + offs_d[None, :],
                mask=mask_sp[:, None] & mask_d[None, :], other=0.0)
    weight = tl.exp(m - tl.max(m, axis=0))  # empty splits hold m = -inf: weight 0
    out = tl.sum(weight[:, None] * o, axis=0) / tl.sum(weight * l_s, axis=0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d,
             out.to(out_ptr.dtype.element_ty), mask=mask_d)
    if pid == 0:
        tl.store(rng_ptr, tl.load(rng_ptr) + 1)


def flash_workspace(q: torch.Tensor, kv: KVCache, S: int, tile: int = 64,
                    **kw) -> SantaWorkspace:
    """Returns a workspace for these inputs split by :func:`flash_splits` (``kw``: the
    workspace's, e.g. ``seed``)."""
    groups = q.shape[0] * kv.num_kv_heads
    group = q.shape[1] // max(1, kv.num_kv_heads)
    pairs = default_draw_tiles(group, lag_samples(S, _capacity(kv), tile), tile) == 2
    kw.setdefault("num_splits", flash_splits(groups, _tile_count(kv, tile), kv.head_dim,
                                             tile, pairs=pairs, heads=group))
    return SantaWorkspace.for_inputs(q, kv, S, tile, **kw)


def santa_flash(
    q: torch.Tensor, kv: KVCache, S: int, *, tile: int = 64, scale: float | None = None,
    seed: int | None = None, uniforms: torch.Tensor | None = None,
    workspace: SantaWorkspace | None = None, return_counts: bool = False,
) -> tuple[torch.Tensor, SantaInfo]:
    """Returns ``(out [B, Hq, d] in q.dtype, info)`` of S²ANTA-flash (section 4), one
    pass, each tile's sampled V rows gathered while the next tile streams.

    Every tile draws ``max(1, S // T_b)`` systematic samples from its local distribution,
    one Philox offset a (step, sequence, head, tile) (``uniforms [B, Hq, T]``: one offset
    a tile overrides Philox). ``workspace``: reusable buffers (default: one from
    :func:`flash_workspace`); each call advances its step counter once, so CUDA-graph
    replays draw fresh samples. ``return_counts`` adds per-row counts to ``info`` (an
    int32 buffer allocated by the call: off the hot path).
    """
    ws, scale = _prepare(q, kv, S, tile, scale, workspace, new_workspace=flash_workspace)
    batch, hq, d = q.shape
    hkv = kv.num_kv_heads
    group = hq // hkv
    n_tiles = _tile_count(kv, tile)
    uniforms = _check_uniforms(uniforms, (batch, hq, n_tiles))
    samples = lag_samples(S, _capacity(kv), tile)
    rows = max(2, _next_pow2(group))
    per_split = -(-n_tiles // ws.num_splits)
    splits = -(-n_tiles // per_split)
    table, paged, page_size, stride_pt = _cache_args(kv)
    k_desc = ws.k_descriptor(kv, tile) if kv.k.is_cuda else None
    # V in 32-bit words of two 16-bit elements where its strides allow (see _load_rows)
    halves = 2 if v_words(kv.v) else 1
    packed = samples <= 8 and tile <= 128
    draw_tiles = default_draw_tiles(group, samples, tile) if packed else 1
    warps, stages = flash_config(d, batch * hkv, tile, pairs=draw_tiles == 2, heads=group)
    closed = samples >= CLOSED_MIN_SAMPLES
    pdl = batch * hkv < LARGE_GROUPS and pdl_available(q.device)
    extra = {}
    maxnreg = PAIR_MAXNREG.get(warps) if draw_tiles == 2 else None
    if maxnreg is not None and os.environ.get("TRITON_INTERPRET", "0") != "1":
        extra["maxnreg"] = maxnreg  # the programs an SM flash_splits plans for
    counts = None
    if return_counts:
        counts = torch.zeros(batch * hq, _capacity(kv), dtype=torch.int32, device=q.device)
    _flash_kernel[(splits, batch * hkv)](
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
        DOT_PRECISION=_dot_precision(kv.k.dtype), W_BITS=W_BITS,
        k_desc=k_desc, seq_rows=kv.k.shape[1], TMA=k_desc is not None, HALVES=halves,
        PACKED=packed, DRAW_TILES=draw_tiles, V_TWICE=not closed, CLOSED_COLUMNS=closed,
        LET_MERGE=pdl, num_warps=warps, num_stages=stages, **extra,
    )
    out = ws.out(q.dtype)
    _merge_kernel[(batch * hq,)](
        ws.part_m, ws.part_l, ws.part_o, out, ws.rng, hq, splits, ws.num_splits, d,
        out.stride(0), out.stride(1),
        SPLIT_PAD=max(2, _next_pow2(splits)), D_PAD=_next_pow2(d), PDL=pdl,
        num_warps=MERGE_WARPS, **({"launch_pdl": True} if pdl else {}),
    )
    if counts is not None:
        counts = counts.view(batch, hq, -1)
    info = SantaInfo(method="flash", S=S, tile=tile, lengths=kv.lengths, num_kv_heads=hkv,
                     max_len=_capacity(kv), counts=counts)
    return out[:batch], info


__all__ = ["CLOSED_MIN_SAMPLES", "FLASH_CONFIG", "LARGE_GROUP_MAX_HEADS", "default_draw_tiles",
           "flash_config", "flash_splits", "flash_workspace", "lag_samples", "pair_draws",
           "santa_flash", "v_words"]
