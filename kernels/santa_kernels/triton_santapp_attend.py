"""SANTA++ Triton kernels, stage 2: attend (the selected teams and the exact set, weighted
by ``1/pi``, into per-head partials; with ``merge_atomic`` merged in place).

The design is in :mod:`santa_kernels.triton_santapp`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from santa_kernels.triton_launch import _pdl_trigger, _pdl_wait, _row_offsets
from santa_kernels.triton_santapp_common import _scores, _weighted_values
from santa_kernels.triton_santapp_merge import _merge_atomic, _merge_ticket
from santa_kernels.triton_santapp_select import _inclusion_weight


# ---------------------------------------------------------------- kernel 2: attend
@triton.jit
def _online_update(q, k, v, w, s_ok, m_i, l_i, acc, scale, DOT_PRECISION: tl.constexpr):
    """Folds rows with weights ``w [G_PAD, N]`` (0: not read) into the running (m, l, acc)."""
    s = _scores(q, k, DOT_PRECISION) * scale
    s = tl.where(s_ok & (w > 0), s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)
    alpha = tl.exp(m_i - m_ref)
    p = w * tl.exp(s - m_ref[:, None])  # HT-weighted: p = w e^{s - m}
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + _weighted_values(p, v, DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _team_tile(member, bkv, head_rows, mask_g, union_ptr, count_ptr, team_start_ptr,
               team_len_ptr, sink, team_size, team_end, t_cap, union_cap,
               HEAD_LISTS: tl.constexpr, REGULAR: tl.constexpr):
    """The teams at list positions ``member`` (one per row of the tile): their ids, which
    are real, first rows, lengths, and z/phi cells ``[G_PAD, N]`` with their mask."""
    # head lists: head member // list_len's list, -1 marks no team
    team = tl.load(union_ptr + bkv.to(tl.int64) * union_cap + member,
                   mask=member < union_cap, other=-1 if HEAD_LISTS else 0)
    if HEAD_LISTS:
        mask_u = team >= 0
        team = tl.maximum(team, 0)
    else:
        mask_u = member < tl.load(count_ptr + bkv)
    if REGULAR:
        start = sink + team * team_size
        n_g = tl.minimum(team_size, team_end - start)
    else:
        table = bkv.to(tl.int64) * t_cap + team
        start = tl.load(team_start_ptr + table, mask=mask_u, other=0)
        n_g = tl.load(team_len_ptr + table, mask=mask_u, other=0)
    cell = head_rows[:, None] * t_cap + team[None, :]
    hw = mask_g[:, None] & mask_u[None, :]
    return team, mask_u, start, n_g, cell, hw


@triton.jit
def _team_kv(pos, ok, bkv, b, offs_d, mask_d, k_head, v_head, pk_ptr, pv_ptr, page_table_ptr,
             packed_rows, stride_kx, stride_ky, stride_pt, page_size,
             HEAD_DIM: tl.constexpr, PACKED: tl.constexpr, PAGED: tl.constexpr):
    """K and V rows ``[N, D_PAD]`` at cache positions ``pos`` (team-major packed storage,
    or the cache itself); rows where ``ok`` is false read nothing (zeros)."""
    if PACKED:
        rows = (bkv.to(tl.int64) * packed_rows + pos) * HEAD_DIM
        k = tl.load(pk_ptr + rows[:, None] + offs_d[None, :],
                    mask=ok[:, None] & mask_d[None, :], other=0.0)
        v = tl.load(pv_ptr + rows[:, None] + offs_d[None, :],
                    mask=ok[:, None] & mask_d[None, :], other=0.0)
    else:
        rows = _row_offsets(page_table_ptr, b, pos, stride_kx, stride_ky, stride_pt,
                           page_size, PAGED)
        k = tl.load(k_head + rows[:, None] + offs_d[None, :],
                    mask=ok[:, None] & mask_d[None, :], other=0.0)
        v = tl.load(v_head + rows[:, None] + offs_d[None, :],
                    mask=ok[:, None] & mask_d[None, :], other=0.0)
    return k, v


@triton.jit
def _team_chunk(chunk, offs_n, offs_d, offs_g, mask_d, mask_g, member, team, mask_u, start,
                n_g, cell, hw, bkv, b, q, k_head, v_head, pk_ptr, pv_ptr, z_ptr, phi_ptr,
                kappa_ptr, head_rows, page_table_ptr, packed_rows, list_len, stride_kx,
                stride_ky, stride_pt, page_size, m_i, l_i, acc, scale,
                HEAD_DIM: tl.constexpr, G_PAD: tl.constexpr, SLOT: tl.constexpr,
                PACKED: tl.constexpr, PAGED: tl.constexpr, HEAD_LISTS: tl.constexpr,
                DOT_PRECISION: tl.constexpr, pool_w_ptr, POOLED: tl.constexpr):
    """Folds rows ``chunk * SLOT + [0, SLOT)`` of the tile's teams, HT-weighted, into the
    running (m, l, acc)."""
    r = chunk * SLOT + offs_n % SLOT
    ok = mask_u & (r < n_g)
    k, v = _team_kv(tl.where(ok, start + r, 0), ok, bkv, b, offs_d, mask_d, k_head, v_head,
                    pk_ptr, pv_ptr, page_table_ptr, packed_rows, stride_kx, stride_ky,
                    stride_pt, page_size, HEAD_DIM, PACKED, PAGED)
    # loaded after K/V are requested so both round trips overlap
    w = _team_weights(cell, hw, member, offs_g, mask_g, head_rows, z_ptr, phi_ptr, kappa_ptr,
                      list_len, G_PAD, HEAD_LISTS, pool_w_ptr, bkv, POOLED)
    return _online_update(q, k, v, w, ok[None, :], m_i, l_i, acc, scale, DOT_PRECISION)


@triton.jit
def _team_weights(cell, hw, member, offs_g, mask_g, head_rows, z_ptr, phi_ptr, kappa_ptr,
                  list_len, G_PAD: tl.constexpr, HEAD_LISTS: tl.constexpr,
                  pool_w_ptr, bkv, POOLED: tl.constexpr):
    """``w [G_PAD, N]``: w_{h,g} = 1/pi_{h,g} for the heads that selected team g (the
    entry at list position ``member``), 0 for the others; POOLED: the entry's shared
    1/pi, the same for every head of the group."""
    if POOLED:  # the group's list of M entries (list_len = M), one weight for its heads
        w = tl.load(pool_w_ptr + bkv.to(tl.int64) * list_len + member[None, :]
                    + 0 * offs_g[:, None], mask=hw, other=0.0)
    else:
        z = tl.load(z_ptr + cell, mask=hw, other=float("-inf"))
        phi = tl.load(phi_ptr + cell, mask=hw, other=float("-inf"))
        kappa = tl.load(kappa_ptr + head_rows, mask=mask_g, other=0.0)
        w = _inclusion_weight(z, phi, kappa[:, None])
        if HEAD_LISTS:  # a team counts once: in its first selecting head's list
            first = tl.min(tl.where(w > 0, offs_g[:, None], G_PAD), axis=0)
            w = tl.where((first == member // list_len)[None, :], w, 0.0)
    return w


@triton.jit
def _attend_kernel(
    q_ptr, k_ptr, v_ptr, pk_ptr, pv_ptr, lengths_ptr, page_table_ptr,
    team_start_ptr, team_len_ptr, team_end_ptr,
    z_ptr, phi_ptr, kappa_ptr, union_ptr, count_ptr, pool_w_ptr,
    part_m_ptr, part_l_ptr, part_o_ptr, sum_l_ptr, sum_o_ptr, ticket_ptr, out_ptr, rng_ptr,
    scale, sink, team_size, t_cap, union_cap, packed_rows, num_parts, team_programs,
    exact_programs, list_len,
    stride_qb, stride_qh, stride_kx, stride_ky, stride_kh, stride_pt, page_size,
    stride_ob, stride_oh,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr, G_PAD: tl.constexpr, TPB: tl.constexpr, SLOT: tl.constexpr,
    CHUNKS: tl.constexpr, BLOCK_E: tl.constexpr,
    PACKED: tl.constexpr, PAGED: tl.constexpr, REGULAR: tl.constexpr,
    DOT_PRECISION: tl.constexpr, PDL: tl.constexpr = False, HEAD_LISTS: tl.constexpr = False,
    MERGE_ATOMIC: tl.constexpr = False, BLOCK_S: tl.constexpr = 64,
    LET_NEXT: tl.constexpr = False, LOOPS: tl.constexpr = 1, ATTEND_STAGES: tl.constexpr = 1,
    PRELOAD: tl.constexpr = False, L_PAD: tl.constexpr = 1, POOLED: tl.constexpr = False,
    MERGE_TICKET: tl.constexpr = False,
):
    """Grid ``(B * Hkv, num_parts)``: team programs (LOOPS tiles of TPB teams of the list
    each) and
    exact-set programs; each writes its heads' partial (m, l, o). With MERGE_ATOMIC the
    programs also add it, scaled to kappa, into the heads' sums, and the group's last
    program writes the output (and advances the step counter): no merge kernel.
    LET_NEXT (MERGE_ATOMIC): the kernel after the call may launch once every program has
    added its partial (not as they start: its programs would wait on SMs this grid needs).
    MERGE_TICKET (without MERGE_ATOMIC): the group's last program merges the group's
    partials as the merge kernel does (:func:`_merge_ticket`): no merge kernel.
    POOLED (draw=pooled, the union list of M teams a group): every head weights a listed
    team by the group's shared 1/pi (``pool_w``), each team read once for the group."""
    _pdl_wait(PDL)  # launched early: wait for the previous kernel
    if not MERGE_ATOMIC and not MERGE_TICKET:
        _pdl_trigger(PDL)  # the merge kernel may launch as this grid's last wave starts
    BLOCK_N: tl.constexpr = TPB * SLOT
    bkv = tl.program_id(0)
    c = tl.program_id(1)
    b = bkv // NUM_KV_HEADS
    kvh = bkv % NUM_KV_HEADS
    hq = NUM_KV_HEADS * GROUP
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D_PAD)
    mask_g = offs_g < GROUP
    mask_d = offs_d < HEAD_DIM
    head_rows = (b * hq + kvh * GROUP + offs_g).to(tl.int64)
    q = tl.load(q_ptr + b * stride_qb + (kvh * GROUP + offs_g)[:, None] * stride_qh
                + offs_d[None, :], mask=mask_g[:, None] & mask_d[None, :], other=0.0)
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], dtype=tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], dtype=tl.float32)
    team_end = tl.load(team_end_ptr + b)
    k_head = k_ptr + kvh * stride_kh
    v_head = v_ptr + kvh * stride_kh
    exact = c >= team_programs
    if c < team_programs:
        # rows of TPB teams of the union list, SLOT rows each. No branch on the device-side
        # count: the union entries load with it (the list is zero-initialised, so entries
        # past the count are valid team ids) and programs past the count read nothing
        # and write an empty partial (m = -inf), so the merge never reads the count.
        offs_n = tl.arange(0, BLOCK_N)
        if LOOPS == 1:  # one tile of the list a program
            member = c * TPB + offs_n // SLOT
            team, mask_u, start, n_g, cell, hw = _team_tile(
                member, bkv, head_rows, mask_g, union_ptr, count_ptr, team_start_ptr,
                team_len_ptr, sink, team_size, team_end, t_cap, union_cap, HEAD_LISTS, REGULAR)
            for chunk in range(CHUNKS):  # a loop, not unrolled: one chunk of K/V live at a time
                m_i, l_i, acc = _team_chunk(
                    chunk, offs_n, offs_d, offs_g, mask_d, mask_g, member, team, mask_u,
                    start, n_g, cell, hw, bkv, b, q, k_head, v_head, pk_ptr, pv_ptr, z_ptr,
                    phi_ptr, kappa_ptr, head_rows, page_table_ptr, packed_rows, list_len,
                    stride_kx, stride_ky, stride_pt, page_size, m_i, l_i, acc, scale,
                    HEAD_DIM, G_PAD, SLOT, PACKED, PAGED, HEAD_LISTS, DOT_PRECISION,
                    pool_w_ptr, POOLED)
        elif PRELOAD and TPB == 1:
            # LOOPS consecutive teams a program: their list entries, rows and weights
            # [G_PAD, L_PAD] before the loop, which then loads only K/V (addresses from
            # registers: a pipelined loop can stage them ATTEND_STAGES - 1 tiles ahead)
            offs_l = tl.arange(0, L_PAD)
            member_l = c * LOOPS + offs_l
            _, mask_l, start_l, n_l, cell_l, hw_l = _team_tile(
                member_l, bkv, head_rows, mask_g, union_ptr, count_ptr, team_start_ptr,
                team_len_ptr, sink, team_size, team_end, t_cap, union_cap, HEAD_LISTS, REGULAR)
            # no rows for entries past the list (their weights are 0: this saves the reads);
            # the L_PAD - LOOPS last columns are never picked
            n_l = tl.where(mask_l, n_l, 0)
            w_l = _team_weights(cell_l, hw_l, member_l, offs_g, mask_g, head_rows, z_ptr,
                                phi_ptr, kappa_ptr, list_len, G_PAD, HEAD_LISTS, pool_w_ptr,
                                bkv, POOLED)
            for step in tl.range(0, LOOPS * CHUNKS, num_stages=ATTEND_STAGES):
                here = offs_l == step // CHUNKS
                r = (step % CHUNKS) * SLOT + offs_n
                ok = r < tl.sum(tl.where(here, n_l, 0))
                k, v = _team_kv(tl.where(ok, tl.sum(tl.where(here, start_l, 0)) + r, 0), ok,
                                bkv, b, offs_d, mask_d, k_head, v_head, pk_ptr, pv_ptr,
                                page_table_ptr, packed_rows, stride_kx, stride_ky, stride_pt,
                                page_size, HEAD_DIM, PACKED, PAGED)
                w = tl.sum(tl.where(here[None, :], w_l, 0.0), axis=1)
                m_i, l_i, acc = _online_update(q, k, v, w[:, None], ok[None, :], m_i, l_i, acc,
                                               scale, DOT_PRECISION)
        else:  # LOOPS consecutive tiles a program, their loads pipelined ATTEND_STAGES deep
            for step in tl.range(0, LOOPS * CHUNKS, num_stages=ATTEND_STAGES):
                member = (c * LOOPS + step // CHUNKS) * TPB + offs_n // SLOT
                team, mask_u, start, n_g, cell, hw = _team_tile(
                    member, bkv, head_rows, mask_g, union_ptr, count_ptr, team_start_ptr,
                    team_len_ptr, sink, team_size, team_end, t_cap, union_cap, HEAD_LISTS,
                    REGULAR)
                m_i, l_i, acc = _team_chunk(
                    step % CHUNKS, offs_n, offs_d, offs_g, mask_d, mask_g, member, team,
                    mask_u, start, n_g, cell, hw, bkv, b, q, k_head, v_head, pk_ptr, pv_ptr,
                    z_ptr, phi_ptr, kappa_ptr, head_rows, page_table_ptr, packed_rows,
                    list_len, stride_kx, stride_ky, stride_pt, page_size, m_i, l_i, acc,
                    scale, HEAD_DIM, G_PAD, SLOT, PACKED, PAGED, HEAD_LISTS, DOT_PRECISION,
                    pool_w_ptr, POOLED)
    if exact:
        # exact set E: [0, min(sink, team_end)) and [team_end, length), weight 1
        length = tl.load(lengths_ptr + b)
        n_head = tl.minimum(sink, team_end)
        n_exact = n_head + tl.maximum(length - team_end, 0)
        e = c - team_programs
        offs_e = tl.arange(0, BLOCK_E)
        ones = tl.full([G_PAD, BLOCK_E], 1.0, tl.float32)
        for r0 in range(e * BLOCK_E, n_exact, exact_programs * BLOCK_E):
            r = r0 + offs_e
            ok = r < n_exact
            pos = tl.where(ok, tl.where(r < n_head, r, team_end + r - n_head), 0)
            k, v = _team_kv(pos, ok, bkv, b, offs_d, mask_d, k_head, v_head, pk_ptr, pv_ptr,
                            page_table_ptr, packed_rows, stride_kx, stride_ky, stride_pt,
                            page_size, HEAD_DIM, False, PAGED)
            m_i, l_i, acc = _online_update(q, k, v, ones, ok[None, :], m_i, l_i, acc, scale,
                                           DOT_PRECISION)
    part = head_rows * num_parts + c  # every program writes a (possibly empty) partial
    tl.store(part_m_ptr + part, m_i, mask=mask_g)
    tl.store(part_l_ptr + part, l_i, mask=mask_g)
    tl.store(part_o_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], acc,
             mask=mask_g[:, None] & mask_d[None, :])
    if MERGE_ATOMIC:
        _merge_atomic(part_m_ptr, part_l_ptr, part_o_ptr, sum_l_ptr, sum_o_ptr, ticket_ptr,
                      out_ptr, rng_ptr, kappa_ptr, m_i, l_i, acc, head_rows, offs_g, offs_d,
                      mask_g, mask_d, b, kvh, bkv, num_parts, stride_ob, stride_oh, GROUP,
                      HEAD_DIM, D_PAD, BLOCK_S, LET_NEXT)
    elif MERGE_TICKET:
        _merge_ticket(part_m_ptr, part_l_ptr, part_o_ptr, ticket_ptr, out_ptr, rng_ptr,
                      b * hq + kvh * GROUP, b, kvh, bkv, num_parts, stride_ob, stride_oh,
                      offs_d, mask_d, GROUP, HEAD_DIM, D_PAD, BLOCK_S, LET_NEXT)
