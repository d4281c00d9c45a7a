"""S²ANTA-flash on prop's score pass: a logit stash, then the tile draws (ALGORITHMS.md
section 4).

The same estimator as ``triton_santa.santa_flash`` (every tile draws ``S_tile = max(1,
S // T_b)`` systematic samples from its local distribution; mass-weighted merge), in
two kernels:

* pass 1 is prop's score pass (``triton_santa._score_pass_kernel``): K streamed once
  for the whole GQA group, per tile the log-mass ``m_t + log l_t`` of every head and a
  stash of local logits ``s_i - m_t`` (fp16 by default). Nothing in it waits for a
  sample: it is the fastest K stream the suite has (BENCHMARKS.md).
* pass 2 ``_stash_draw_kernel`` (grid ``(splits, B * Hkv)``, a programmatic dependent of
  pass 1 on Hopper): a block of ``R`` (head, tile) rows at a time, the group's stash
  rows of ``R / ROWS`` tiles are loaded as one [R, TILE] block; each row's integer local
  CDF and systematic floors are ``_flash_kernel``'s (the same operations on the same
  local logits: with an fp32 stash the same counts as the fused kernels given the same
  uniforms or seed and step); sample ``j`` of a row lies in column ``#{i : f_i <= j}``
  (as in ``triton_santa_flash_compact``); the block's ``R * P`` sampled V rows are
  loaded at once and summed per head by a ``weights @ V`` tensor-core dot, the weights
  ``l_t e^{m_t - m_run} / S_tile`` split in two 16-bit parts (relative error <= 2^-16).
  Nothing in a block's addresses depends on another block, so many are in flight.
  The splits are merged by the group's last program to finish (an acq_rel ticket, as
  in prop's sample pass): no third launch.

Byte model (``E`` element size, ``E_s`` stash element size, ``T_b = ceil(N_b / tile)``):
pass 1 reads ``B*Hkv*N*d*E`` (K) and writes ``B*Hq*(N*E_s + 4*T)``; pass 2 reads those,
the group's union of sampled V rows (HBM traffic; ``<= B*Hkv*min(N, G*S)`` rows of
``d*E``) and writes ``B*Hq*splits*(d+2)*4`` partials, which the last program reads and
turns into ``B*Hq*d*E``.
"""

from __future__ import annotations

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
    _config,
    _dot_precision,
    _flash_local_weights,
    _flash_program,
    _flash_rng_base,
    _next_pow2,
    _pdl_wait,
    _prepare,
    _row_offsets,
    _score_pass,
    _sm_count,
    _stash_evict,
    _tile_count,
    pdl_available,
)
from santa_kernels.triton_santa_flash2 import _launch_config
from santa_kernels.triton_santa_flash_compact import _expand, _floors
from santa_kernels.validate import InputError, check_positive_int

# Pass 2's defaults: (num_warps, num_stages), (head, tile) rows a draw block, programs an
# SM (the split count). Not yet swept on the H200.
STASH_DRAW_CONFIG = (4, 1)
STASH_DRAW_ROWS = 64
STASH_GATHER_ROWS = 128  # sampled rows a block, at most (R * P)
STASH_PROGRAMS_PER_SM = 4
MERGE_BLOCK = 16  # splits of a head the last program merges a step (one load round trip)


def draw_block(heads: int, per_tile: int, rows: int | None = None) -> tuple[int, int]:
    """``(R, P)``: (head, tile) rows a draw block and samples a row, for ``heads`` rows a
    tile (the score pass's statistics rows: the group padded). ``P`` is the power of two
    covering ``per_tile`` (at most :data:`STASH_GATHER_ROWS` // ``heads``); ``R`` a power
    of two >= ``heads``, ``rows`` or :data:`STASH_DRAW_ROWS` capped so that the block's
    ``R * P`` gathered rows stay within :data:`STASH_GATHER_ROWS` (and >= 16: the dot)."""
    samples = min(_next_pow2(max(1, per_tile)), max(1, STASH_GATHER_ROWS // heads))
    want = STASH_DRAW_ROWS if rows is None else check_positive_int(rows, "rows")
    if want & (want - 1):
        raise InputError(f"rows: a power of two, got {want}")
    r = max(heads, min(want, STASH_GATHER_ROWS // samples))
    while r * samples < 16:
        r *= 2
    return r, samples


@triton.jit
def _weighted_sums(weights, v, DOT_PRECISION: tl.constexpr):
    """``weights @ v`` [G_PAD, D_PAD] fp32: fp32 weights in two 16-bit parts on tensor
    cores (hi + lo: relative error <= 2^-16 for bf16), one fp32 dot under 'ieee'."""
    if DOT_PRECISION == "ieee":
        o = tl.dot(weights, v.to(tl.float32), input_precision="ieee")
    else:
        hi = weights.to(v.dtype)
        lo = (weights - hi.to(tl.float32)).to(v.dtype)
        o = tl.dot(lo, v, tl.dot(hi, v))
    return o


@triton.jit
def _block_rows(f, j0, per_tile, ok_r, t_r, page_table_ptr, b, stride_vx, stride_vy,
                stride_pt, page_size, PAGED: tl.constexpr, TILE: tl.constexpr,
                R: tl.constexpr, P: tl.constexpr):
    """Samples ``j0 .. j0 + P - 1`` of each (head, tile) row's draw, flattened row-major
    to [R * P]: their sequence rows, V offsets and validity."""
    j = (j0 + tl.arange(0, P)).to(tl.float32)
    col = tl.sum((f[:, None, :] <= j[None, :, None]).to(tl.int32), axis=2)  # [R, P]
    ok = (j[None, :] < per_tile) & ok_r[:, None]
    n = tl.reshape(tl.where(ok, t_r[:, None] * TILE + col, 0), [R * P])
    ok = tl.reshape(ok, [R * P])
    off = _row_offsets(page_table_ptr, b, n, stride_vx, stride_vy, stride_pt, page_size, PAGED)
    return n, off, ok


@triton.jit
def _merge_group(part_m_ptr, part_l_ptr, part_o_ptr, out_ptr, head0, out_row0, group,
                 num_splits, part_stride, head_dim, stride_oh, offs_d, mask_d,
                 ROWS: tl.constexpr, D_PAD: tl.constexpr, BLOCK: tl.constexpr):
    """FlashDecoding's merge of the ``num_splits`` partials of the group's heads into
    ``out``: the (head, split) pairs of ``BLOCK`` splits as one [ROWS * BLOCK] block (one
    load round trip when ``num_splits <= BLOCK``; reads bypass L1: other programs wrote
    them)."""
    offs = tl.arange(0, ROWS * BLOCK)
    h = offs // BLOCK
    base = (head0 + h).to(tl.int64) * part_stride
    ok_h = h < group
    m_all = tl.full([ROWS], float("-inf"), tl.float32)
    for p0 in range(0, num_splits, BLOCK):
        ok = ok_h & (p0 + offs % BLOCK < num_splits)
        m = tl.load(part_m_ptr + base + p0 + offs % BLOCK, mask=ok, other=float("-inf"),
                    cache_modifier=".cg")
        m_all = tl.maximum(m_all, tl.max(tl.reshape(m, [ROWS, BLOCK]), axis=1))
    m_ref = tl.where(m_all > float("-inf"), m_all, 0.0)
    num = tl.zeros([ROWS, D_PAD], dtype=tl.float32)
    den = tl.zeros([ROWS], dtype=tl.float32)
    for p0 in range(0, num_splits, BLOCK):
        ok = ok_h & (p0 + offs % BLOCK < num_splits)
        idx = base + p0 + offs % BLOCK
        m = tl.load(part_m_ptr + idx, mask=ok, other=float("-inf"), cache_modifier=".cg")
        l_s = tl.load(part_l_ptr + idx, mask=ok, other=0.0, cache_modifier=".cg")
        o = tl.load(part_o_ptr + idx[:, None] * head_dim + offs_d[None, :],
                    mask=ok[:, None] & mask_d[None, :], other=0.0, cache_modifier=".cg")
        wgt = tl.exp(tl.reshape(m, [ROWS, BLOCK]) - m_ref[:, None])  # empty splits: 0
        num += tl.sum(tl.reshape(o, [ROWS, BLOCK, D_PAD]) * wgt[:, :, None], axis=1)
        den += tl.sum(wgt * tl.reshape(l_s, [ROWS, BLOCK]), axis=1)
    offs_h = tl.arange(0, ROWS)
    tl.store(out_ptr + (out_row0 + offs_h)[:, None] * stride_oh + offs_d[None, :],
             (num / tl.where(den > 0, den, 1.0)[:, None]).to(out_ptr.dtype.element_ty),
             mask=(offs_h < group)[:, None] & mask_d[None, :])


@triton.jit
def _stash_draw_kernel(
    v_ptr, lengths_ptr, page_table_ptr, tile_lse_ptr, stash_ptr,
    part_m_ptr, part_l_ptr, part_o_ptr, out_ptr, ticket_ptr, counts_ptr, uniforms_ptr,
    rng_ptr, seed,
    S, num_kv_heads, num_q_heads, group, head_dim: tl.constexpr, tiles_per_split,
    part_stride, stash_stride, stats_stride, counts_stride, uniform_stride, rng_stride,
    stride_vx, stride_vy, stride_vh, stride_pt, page_size, stride_ob, stride_oh,
    PAGED: tl.constexpr, TILE: tl.constexpr, ROWS: tl.constexpr, R: tl.constexpr,
    P: tl.constexpr, G_PAD: tl.constexpr, D_PAD: tl.constexpr, HAS_UNIFORMS: tl.constexpr,
    STORE_COUNTS: tl.constexpr, DOT_PRECISION: tl.constexpr, W_BITS: tl.constexpr,
    GROUP_RNG: tl.constexpr, PDL: tl.constexpr, STASH_EVICT: tl.constexpr,
    MERGE_BLOCK: tl.constexpr, PROFILE: tl.constexpr = 0,
):
    # PROFILE (timing only, wrong outputs): 1 = no draw (each row's first P columns),
    # 2 = no V loads, 3 = no merge
    # One program: tiles [t_begin, t_end) of one (sequence, KV head), all G query heads,
    # CH = R / ROWS tiles a block; block row r = h * CH + k is head h's tile t_begin' + k.
    _pdl_wait(PDL)  # pass 1's statistics and stash (a programmatic dependent on Hopper)
    W_SCALE: tl.constexpr = (1 << W_BITS) // TILE
    CH: tl.constexpr = R // ROWS
    split = tl.program_id(0)
    pid_bkv = tl.program_id(1)
    b, kvh, _length, per_tile, t_begin, t_end = _flash_program(lengths_ptr, S, num_kv_heads,
                                                              tiles_per_split, TILE)
    step = tl.load(rng_ptr + 1)  # the call's step, snapshot by pass 1
    offs_r = tl.arange(0, R)
    h_r = offs_r // CH
    k_r = offs_r % CH
    head_r = (b * num_q_heads + kvh * group + h_r).to(tl.int64)
    rng_base = _flash_rng_base(step, head_r, b, kvh, num_kv_heads, rng_stride, GROUP_RNG)
    offs_i = tl.arange(0, TILE)
    offs_d = tl.arange(0, D_PAD)
    mask_d = offs_d < head_dim
    v_base = v_ptr + kvh * stride_vh
    # a gathered row e (of R * P) belongs to head e // (CH * P)
    head_e = tl.arange(0, R * P) // (CH * P)
    head_of_e = tl.reshape(tl.broadcast_to(head_r[:, None], [R, P]), [R * P])
    stat_base = pid_bkv.to(tl.int64) * stats_stride * ROWS
    m_run = tl.full([ROWS], float("-inf"), tl.float32)
    l_run = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], dtype=tl.float32)  # row g: head g (rows >= ROWS: 0)
    for c0 in range(t_begin, t_end, CH):
        t_r = c0 + k_r
        ok_r = (h_r < group) & (t_r < t_end)
        lse = tl.load(tile_lse_ptr + stat_base + t_r * ROWS + h_r, mask=ok_r,
                      other=float("-inf"))
        s = tl.load(stash_ptr + head_r[:, None] * stash_stride + t_r[:, None] * TILE
                    + offs_i[None, :], mask=ok_r[:, None], other=float("-inf"),
                    eviction_policy=STASH_EVICT).to(tl.float32)
        _m_loc, row_ok, w, mass = _flash_local_weights(s, W_SCALE)
        ok_r = ok_r & row_ok
        if HAS_UNIFORMS:
            a = tl.load(uniforms_ptr + head_r * uniform_stride + t_r, mask=ok_r, other=0.0)
        else:
            a = tl.rand(seed, rng_base + t_r)
        if PROFILE == 1:
            f = tl.broadcast_to(offs_i[None, :].to(tl.float32), [R, TILE]) + a[:, None] * 0.0
        else:
            f = _floors(w, mass, a, per_tile)
        # FlashDecoding's running merge, per head over the block's CH tiles
        lse2 = tl.reshape(lse, [ROWS, CH])
        m_new = tl.maximum(m_run, tl.max(lse2, axis=1))
        m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)
        alpha = tl.exp(m_run - m_ref)
        w_t = tl.exp(lse2 - m_ref[:, None])  # l_t e^{m_t - m_ref}; 0 where no tile
        l_run = l_run * alpha + tl.sum(w_t, axis=1)
        m_run = m_new
        acc = acc * _expand(alpha, ROWS, G_PAD)[:, None]
        coef = tl.reshape(w_t, [R]) / per_tile
        coef_e = tl.reshape(tl.broadcast_to(coef[:, None], [R, P]), [R * P])
        weights = tl.where(head_e[None, :] == tl.arange(0, G_PAD)[:, None], coef_e[None, :],
                           0.0)
        for j0 in range(0, per_tile.to(tl.int32), P):  # one step unless S_tile > P
            n, off, ok = _block_rows(f, j0, per_tile, ok_r, t_r, page_table_ptr, b,
                                     stride_vx, stride_vy, stride_pt, page_size, PAGED, TILE,
                                     R, P)
            if PROFILE == 2:
                v = tl.zeros([R * P, D_PAD], dtype=v_ptr.dtype.element_ty) + off[:, None].to(
                    v_ptr.dtype.element_ty) * 0
            else:
                v = tl.load(v_base + off[:, None] + offs_d[None, :],
                            mask=ok[:, None] & mask_d[None, :], other=0.0)
            acc += _weighted_sums(weights, v, DOT_PRECISION)
            if STORE_COUNTS:
                tl.atomic_add(counts_ptr + head_of_e * counts_stride + n, 1, mask=ok,
                              sem="relaxed")
    heads = kvh * group + tl.arange(0, ROWS)
    mask_g = tl.arange(0, ROWS) < group
    part = (b * num_q_heads + heads).to(tl.int64) * part_stride + split
    acc = tl.sum(tl.reshape(acc, [G_PAD // ROWS, ROWS, D_PAD]), axis=0)
    tl.store(part_m_ptr + part, m_run, mask=mask_g)
    tl.store(part_l_ptr + part, l_run, mask=mask_g)
    tl.store(part_o_ptr + part[:, None] * head_dim + offs_d[None, :], acc,
             mask=mask_g[:, None] & mask_d[None, :])
    # the group's last program to finish merges its splits (partials ordered before the
    # ticket: barrier + acq_rel atomic, as in prop's sample pass)
    tl.debug_barrier()
    ticket = tl.atomic_add(ticket_ptr + pid_bkv, 1, sem="acq_rel")
    if (ticket == tl.num_programs(0) - 1) & (PROFILE != 3):
        _merge_group(part_m_ptr, part_l_ptr, part_o_ptr, out_ptr + b * stride_ob,
                     b * num_q_heads + kvh * group, kvh * group, group, tl.num_programs(0),
                     part_stride, head_dim, stride_oh, offs_d, mask_d, ROWS, D_PAD,
                     MERGE_BLOCK)
        tl.store(ticket_ptr + pid_bkv, 0)  # ready for the next call (graph replay)
    if (ticket == tl.num_programs(0) - 1) & (PROFILE == 3):
        tl.store(ticket_ptr + pid_bkv, 0)


def _partials(ws: SantaWorkspace, splits: int):
    """``(m, l, o)`` partial buffers for ``splits`` programs a group: the workspace's own
    where they fit, else buffers kept on the workspace (allocated on first use)."""
    if splits <= ws.num_splits:
        return ws.part_m, ws.part_l, ws.part_o, ws.num_splits
    held = getattr(ws, "stash_draw_parts", None)
    if held is None or held[3] < splits:
        rows = ws.batch * ws.num_q_heads
        f32 = {"dtype": torch.float32, "device": ws.device}
        held = (torch.empty(rows, splits, **f32), torch.empty(rows, splits, **f32),
                torch.empty(rows, splits, ws.head_dim, **f32), splits)
        ws.stash_draw_parts = held
    return held


def stash_workspace(q: torch.Tensor, kv: KVCache, S: int, tile: int = 64, *,
                    stash_dtype: torch.dtype = torch.float16, **kw) -> SantaWorkspace:
    """A workspace for :func:`santa_flash_stash` with its partial buffers allocated (so a
    CUDA-graph capture allocates nothing)."""
    ws = SantaWorkspace.for_inputs(q, kv, S, tile, stash_dtype=stash_dtype, **kw)
    _partials(ws, _split_plan(ws, kv, S, tile, None, None)[1])
    return ws


def _split_plan(ws: SantaWorkspace, kv: KVCache, S: int, tile: int, rows: int | None,
                programs_per_sm: int | None) -> tuple[int, int, int, int]:
    """``(tiles_per_split, splits, R, P)`` of pass 2 at the cache's capacity."""
    n_tiles = _tile_count(kv, tile)
    r, p = draw_block(ws.stats_rows, max(1, S // n_tiles), rows)
    ch = r // ws.stats_rows
    per_sm = STASH_PROGRAMS_PER_SM if programs_per_sm is None else programs_per_sm
    check_positive_int(per_sm, "programs_per_sm")
    groups = ws.batch * ws.num_kv_heads
    wanted = max(1, -(-per_sm * _sm_count(ws.device) // groups))
    blocks = -(-n_tiles // ch)
    per_split = -(-blocks // min(wanted, blocks)) * ch
    return per_split, -(-n_tiles // per_split), r, p


def santa_flash_stash(
    q: torch.Tensor, kv: KVCache, S: int, *, tile: int = 64, scale: float | None = None,
    seed: int | None = None, uniforms: torch.Tensor | None = None,
    workspace: SantaWorkspace | None = None, return_counts: bool = False,
    group_offsets: bool = False, stash_dtype: torch.dtype = torch.float16,
    rows: int | None = None, programs_per_sm: int | None = None,
    config: tuple[int, int] | None = None, pdl: bool | None = None, stages: str = "both",
    profile: int = 0,
) -> tuple[torch.Tensor, SantaInfo]:
    """Returns ``(out [B, Hq, d] in q.dtype, info)`` of S²ANTA-flash (section 4): prop's
    score pass, then the tile draws from its logit stash and the sampled rows' gather.

    Same estimator, arguments and outputs as :func:`santa_kernels.triton_santa.santa_flash`
    (with an fp32 stash, the same counts given the same ``uniforms [B, Hq, T]`` or seed
    and step). ``stash_dtype`` applies where the call builds its workspace (a given one
    keeps its own). ``rows``: (head, tile) rows a draw block (a power of two; default
    :data:`STASH_DRAW_ROWS`); ``programs_per_sm``: pass 2's split count target;
    ``config``: pass 2's ``(num_warps, num_stages)``. ``return_counts`` adds per-row
    counts (an int32 buffer allocated by the call: off the hot path). Profiling only:
    ``pdl`` (None: where available), ``stages="draw"`` (pass 2 alone, on the statistics
    and stash of the call before), ``profile`` (``_stash_draw_kernel``'s PROFILE).
    """
    ws, scale = _prepare(q, kv, S, tile, scale, workspace, stash_dtype=stash_dtype)
    batch, hq, d = q.shape
    hkv = kv.num_kv_heads
    group = hq // hkv
    n_tiles = _tile_count(kv, tile)
    uniforms = _check_uniforms(uniforms, (batch, hq, n_tiles))
    warps, num_stages = _launch_config(config, STASH_DRAW_CONFIG, "config")
    per_split, splits, r, p = _split_plan(ws, kv, S, tile, rows, programs_per_sm)
    part_m, part_l, part_o, part_stride = _partials(ws, splits)
    cfg = _config(d)
    if pdl is None:
        pdl = bool(cfg.get("pdl"))
    pdl = bool(pdl) and pdl_available(q.device)
    if stages not in ("both", "draw"):
        raise InputError(f"stages: 'both' or 'draw', got {stages!r}")
    stash_evict = _stash_evict(cfg, batch * hq, _capacity(kv), ws.stash)
    if stages == "both":
        _score_pass(q, kv, ws, scale, tile, pdl=pdl, stash_evict=stash_evict)
    table, paged, page_size, stride_pt = _cache_args(kv)
    counts = None
    if return_counts:
        counts = torch.zeros(batch * hq, _capacity(kv), dtype=torch.int32, device=q.device)
    out = ws.out(q.dtype)
    _stash_draw_kernel[(splits, batch * hkv)](
        kv.v, kv.lengths, table, ws.tile_lse, ws.stash, part_m, part_l, part_o, out,
        ws.sample_ticket, counts if counts is not None else part_m,
        uniforms if uniforms is not None else part_m, ws.rng,
        ws.seed if seed is None else int(seed),
        S, hkv, hq, group, d, per_split, part_stride, ws.stash.stride(0), ws.max_tiles,
        counts.stride(0) if counts is not None else 0, n_tiles, ws.max_tiles,
        kv.v.stride(0), kv.v.stride(1), kv.v.stride(2), stride_pt, page_size,
        out.stride(0), out.stride(1),
        PAGED=paged, TILE=tile, ROWS=ws.stats_rows, R=r, P=p,
        G_PAD=max(16, _next_pow2(group)), D_PAD=_next_pow2(d),
        HAS_UNIFORMS=uniforms is not None, STORE_COUNTS=counts is not None,
        DOT_PRECISION=_dot_precision(kv.v.dtype), W_BITS=FLASH_W_BITS,
        GROUP_RNG=group_offsets, PDL=pdl, STASH_EVICT=stash_evict, MERGE_BLOCK=MERGE_BLOCK,
        PROFILE=profile, num_warps=warps, num_stages=num_stages,
        **({"launch_pdl": True} if pdl else {}),
    )
    if counts is not None:
        counts = counts.view(batch, hq, -1)
    info = SantaInfo(method="flash", S=S, tile=tile, lengths=kv.lengths, num_kv_heads=hkv,
                     max_len=_capacity(kv), counts=counts)
    return out[:batch], info


__all__ = ["STASH_DRAW_CONFIG", "draw_block", "santa_flash_stash", "stash_workspace"]
