"""SANTA++ Triton kernels, stage 3: merge (log-sum-exp merge of the attend partials, or
the atomic sums the attend programs leave).

The design is in :mod:`santa_kernels.triton_santapp`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from santa_kernels.triton_launch import _pdl_enter, _pdl_trigger


@triton.jit
def _merge_atomic(part_m_ptr, part_l_ptr, part_o_ptr, sum_l_ptr, sum_o_ptr, ticket_ptr,
                  out_ptr, rng_ptr, kappa_ptr, m_i, l_i, acc, head_rows, offs_g, offs_d,
                  mask_g, mask_d, b, kvh, bkv, num_parts, stride_ob, stride_oh,
                  GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                  BLOCK_S: tl.constexpr, LET_NEXT: tl.constexpr):
    """Adds an attend program's partial, scaled by ``e^{m - kappa}``, to its heads' sums;
    the group's last program to arrive (an acq_rel ticket) stores ``sum_o / sum_l``, or
    merges the partials by their maxima for a group where a sum left [2^-64, 2^64], and
    zeroes the sums and the ticket for the next call. Partials scaled to one reference
    per head are additive: the self-normalised estimate is their sum's ratio."""
    ref = tl.load(kappa_ptr + head_rows, mask=mask_g, other=0.0)
    ref = tl.where(ref > float("-inf"), ref, 0.0)  # kappa = -inf: every team selected
    live = mask_g & (m_i > float("-inf"))  # empty partials add nothing
    factor = tl.exp(tl.where(live, m_i - ref, float("-inf")))
    cells = head_rows[:, None] * HEAD_DIM + offs_d[None, :]
    tl.atomic_add(sum_l_ptr + head_rows, l_i * factor, mask=live, sem="relaxed")
    tl.atomic_add(sum_o_ptr + cells, acc * factor[:, None],
                  mask=live[:, None] & mask_d[None, :], sem="relaxed")
    _pdl_trigger(LET_NEXT)  # the kernel after the call waits for this grid's end anyway
    # every thread's adds are ordered before the ticket (barrier + acq_rel atomic)
    tl.debug_barrier()
    ticket = tl.atomic_add(ticket_ptr + bkv, 1, sem="acq_rel")
    if ticket == num_parts - 1:
        mask_o = mask_g[:, None] & mask_d[None, :]
        den = tl.load(sum_l_ptr + head_rows, mask=mask_g, other=1.0, cache_modifier=".cg")
        num = tl.load(sum_o_ptr + cells, mask=mask_o, other=0.0, cache_modifier=".cg")
        heads = kvh * GROUP + offs_g
        out_rows = out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
        ok = (den > 5.421010862427522e-20) & (den < 1.8446744073709552e19)
        if tl.sum((mask_g & ~ok).to(tl.int32), axis=0) == 0:
            tl.store(out_rows, (num / den[:, None]).to(out_ptr.dtype.element_ty), mask=mask_o)
        else:  # a sum under- or overflowed its range: the partials, by their maxima
            row0 = tl.min(head_rows, axis=0)  # the group's first head
            for g in range(GROUP):
                out = _merge_head(part_m_ptr, part_l_ptr, part_o_ptr, row0 + g, num_parts,
                                  offs_d, mask_d, HEAD_DIM, D_PAD, BLOCK_S, ".cg")
                tl.store(out_ptr + b * stride_ob + (kvh * GROUP + g) * stride_oh + offs_d,
                         out.to(out_ptr.dtype.element_ty), mask=mask_d)
        tl.store(sum_l_ptr + head_rows, tl.zeros_like(den), mask=mask_g)
        tl.store(sum_o_ptr + cells, tl.zeros_like(num), mask=mask_o)
        tl.store(ticket_ptr + bkv, 0)  # ready for the next call (graph replay)
        if bkv == 0:  # the call's last kernel advances the step counter (section 8)
            tl.store(rng_ptr, tl.load(rng_ptr) + 1)


@triton.jit
def _merge_ticket(part_m_ptr, part_l_ptr, part_o_ptr, ticket_ptr, out_ptr, rng_ptr, row0, b,
                  kvh, bkv, num_parts, stride_ob, stride_oh, offs_d, mask_d,
                  GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                  BLOCK_S: tl.constexpr, LET_NEXT: tl.constexpr):
    """After an attend program stored its partials: the group's last program to arrive (an
    acq_rel ticket) merges the partials of the group's heads (``row0``: its first head's
    row) as the merge kernel does, to the bit, and zeroes the ticket for the next call. No
    merge kernel launches, and no float atomics: reproducible."""
    _pdl_trigger(LET_NEXT)  # the kernel after the call waits for this grid's end anyway
    # every thread's partial stores are ordered before the ticket (barrier + acq_rel atomic)
    tl.debug_barrier()
    ticket = tl.atomic_add(ticket_ptr + bkv, 1, sem="acq_rel")
    if ticket == num_parts - 1:
        if num_parts <= BLOCK_S:  # one block a head: every head's loads issue at once
            offs_s = tl.arange(0, BLOCK_S)
            mask_s = offs_s < num_parts
            for g in tl.static_range(GROUP):
                rows = (row0 + g) * num_parts + offs_s
                m = tl.load(part_m_ptr + rows, mask=mask_s, other=float("-inf"),
                            cache_modifier=".cg")
                l_s = tl.load(part_l_ptr + rows, mask=mask_s, other=0.0, cache_modifier=".cg")
                o = tl.load(part_o_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :],
                            mask=mask_s[:, None] & mask_d[None, :], other=0.0,
                            cache_modifier=".cg")
                m_max = tl.max(m, axis=0)
                w = tl.exp(m - tl.where(m_max > float("-inf"), m_max, 0.0))  # as _merge_head
                out = tl.sum(w[:, None] * o, axis=0) / tl.sum(w * l_s, axis=0)
                tl.store(out_ptr + b * stride_ob + (kvh * GROUP + g) * stride_oh + offs_d,
                         out.to(out_ptr.dtype.element_ty), mask=mask_d)
        else:
            for g in range(GROUP):
                out = _merge_head(part_m_ptr, part_l_ptr, part_o_ptr, row0 + g, num_parts,
                                  offs_d, mask_d, HEAD_DIM, D_PAD, BLOCK_S, ".cg")
                tl.store(out_ptr + b * stride_ob + (kvh * GROUP + g) * stride_oh + offs_d,
                         out.to(out_ptr.dtype.element_ty), mask=mask_d)
        tl.store(ticket_ptr + bkv, 0)  # ready for the next call (graph replay)
        if bkv == 0:  # the call's last kernel advances the step counter (section 8)
            tl.store(rng_ptr, tl.load(rng_ptr) + 1)


# ----------------------------------------------------------------- kernel 3: merge
@triton.jit
def _merge_head(part_m_ptr, part_l_ptr, part_o_ptr, row, num_parts, offs_d, mask_d,
                HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_S: tl.constexpr,
                CACHE: tl.constexpr):
    """Head ``row``'s output ``[D_PAD]`` (fp32) from its ``num_parts`` partials (m, l, o):
    the max over every partial first, then one weighted sum (no running rescale)."""
    base = row * num_parts
    offs_s = tl.arange(0, BLOCK_S)
    m_lanes = tl.full([BLOCK_S], float("-inf"), tl.float32)
    for s0 in range(0, num_parts, BLOCK_S):
        m = tl.load(part_m_ptr + base + s0 + offs_s, mask=s0 + offs_s < num_parts,
                    other=float("-inf"), cache_modifier=CACHE)
        m_lanes = tl.maximum(m_lanes, m)
    m_max = tl.max(m_lanes, axis=0)
    m_ref = tl.where(m_max > float("-inf"), m_max, 0.0)
    l_lanes = tl.zeros([BLOCK_S], dtype=tl.float32)
    acc = tl.zeros([BLOCK_S, D_PAD], dtype=tl.float32)
    for s0 in range(0, num_parts, BLOCK_S):
        mask_s = s0 + offs_s < num_parts
        rows = base + s0 + offs_s
        m = tl.load(part_m_ptr + rows, mask=mask_s, other=float("-inf"), cache_modifier=CACHE)
        l_s = tl.load(part_l_ptr + rows, mask=mask_s, other=0.0, cache_modifier=CACHE)
        o = tl.load(part_o_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=mask_s[:, None] & mask_d[None, :], other=0.0, cache_modifier=CACHE)
        w = tl.exp(m - m_ref)  # empty partials: 0
        l_lanes += w * l_s
        acc += w[:, None] * o
    return tl.sum(acc, axis=0) / tl.sum(l_lanes, axis=0)


@triton.jit
def _merge_kernel(
    part_m_ptr, part_l_ptr, part_o_ptr, out_ptr, rng_ptr,
    num_parts, stride_ob, stride_oh,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr = False,
    LET_NEXT: tl.constexpr = False,
):
    """Log-sum-exp merge of one head's partials, as triton_splitkv's stage 2: the max
    over every partial first, then one weighted sum (no running rescale). Every attend
    program wrote its partial (empty ones hold m = -inf: weight 0), so nothing here
    waits on the device-side union count; ``BLOCK_S >= num_parts`` at B=1 (one step).
    LET_NEXT (without PDL): the kernel after the call may launch as this one starts."""
    _pdl_enter(PDL, True)  # launched early: wait for the previous kernel
    _pdl_trigger(LET_NEXT)
    pid = tl.program_id(0)
    hq = NUM_KV_HEADS * GROUP
    offs_d = tl.arange(0, D_PAD)
    mask_d = offs_d < HEAD_DIM
    out = _merge_head(part_m_ptr, part_l_ptr, part_o_ptr, pid.to(tl.int64), num_parts,
                      offs_d, mask_d, HEAD_DIM, D_PAD, BLOCK_S, "")
    tl.store(out_ptr + (pid // hq) * stride_ob + (pid % hq) * stride_oh + offs_d,
             out.to(out_ptr.dtype.element_ty), mask=mask_d)
    if pid == 0:  # the call's last kernel advances the step counter (section 8)
        tl.store(rng_ptr, tl.load(rng_ptr) + 1)
