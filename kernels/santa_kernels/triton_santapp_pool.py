"""SANTA++ Triton kernels, stage 1 with ``draw=pooled``: the pool kernel draws one set of
``M`` teams per (sequence, KV head) from its query heads' mean team probabilities.

Grid ``(B * Hkv,)``, after the select kernel wrote every head's ``phi [G, T]``. A program
takes each head's log-softmax over its teams (``phi - lse_h``), pools them by a
log-sum-exp over the heads (``log p_g = log mean_h softmax(phi_h)_g``), adds Gumbel noise
(Philox keyed by ``(seed, step)``, counter ``(b, KV head, team)``; ``gumbels=`` overrides
it), finds ``kappa`` = the ``(M+1)``-th largest ``z`` by the finishers' k-ary search
(``-inf`` where the group has at most ``M`` teams: every one is taken, ``pi = 1``) and
writes the chosen teams in team order to the group's ``M`` list slots with their shared
``1/pi`` (``pi = 1 - exp(-exp(log p_g - kappa))``) and their count. The attend programs
read each listed team once for the whole group. Each head's merge reference
(``kappa_ptr``: ``lse_h + kappa``, or ``lse_h`` where kappa is ``-inf``) keeps a team's
weighted term near ``p_{h,g} / p_g <= G`` in the atomic merge's sums. The design is in
:mod:`santa_kernels.triton_santapp`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from santa_kernels.triton_launch import _pdl_enter
from santa_kernels.triton_santapp_select import _inclusion_weight, _key, _kth_largest, _unkey


@triton.jit
def _pooled_log_probs(phi_ptr, row0, t_cap, offs_t, mask_t, offs_h, GROUP: tl.constexpr,
                      G_ROWS: tl.constexpr, C_PAD: tl.constexpr):
    """``(log p [C_PAD], lse [G_ROWS])``: the heads' mean probability of every team (as a
    log; ``-inf`` for padding teams and past them) and each head's log-sum-exp over its
    teams, heads ``row0 ..`` of ``phi``."""
    m = tl.full([C_PAD], float("-inf"), tl.float32)  # running log-sum-exp over the heads
    s = tl.zeros([C_PAD], dtype=tl.float32)
    lse = tl.zeros([G_ROWS], dtype=tl.float32)
    for h in range(GROUP):
        phi = tl.load(phi_ptr + (row0 + h) * t_cap + offs_t, mask=mask_t, other=float("-inf"),
                      cache_modifier=".cg")
        top = tl.max(phi, axis=0)
        ref = tl.where(top > float("-inf"), top, 0.0)  # a head without teams adds nothing
        lse_h = ref + tl.log(tl.sum(tl.exp(phi - ref), axis=0))
        x = phi - lse_h
        m_new = tl.maximum(m, x)
        m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)
        s = s * tl.exp(m - m_ref) + tl.exp(x - m_ref)
        m = m_new
        lse = tl.where(offs_h == h, lse_h, lse)
    some = m > float("-inf")  # a team some head has (s >= 1 there)
    log_p = tl.where(some, m + tl.log(tl.where(some, s, 1.0) / GROUP), float("-inf"))
    return log_p, lse


@triton.jit
def _pool_kernel(
    phi_ptr, gumbel_ptr, rng_ptr, seed, kappa_ptr, pool_kappa_ptr, union_ptr, count_ptr,
    pool_w_ptr, M, t_cap, union_cap,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, G_ROWS: tl.constexpr,
    C_PAD: tl.constexpr, HAS_GUMBELS: tl.constexpr, WAYS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Grid ``(B * Hkv)``: one (sequence, KV head)'s pooled draw (the module's steps);
    ``gumbels [B, Hkv, T]`` with HAS_GUMBELS, else Philox."""
    _pdl_enter(PDL, True)  # launched early: wait for the select kernel
    bkv = tl.program_id(0)
    b = bkv // NUM_KV_HEADS
    kvh = bkv % NUM_KV_HEADS
    row0 = (b * NUM_KV_HEADS * GROUP + kvh * GROUP).to(tl.int64)
    offs_t = tl.arange(0, C_PAD)
    mask_t = offs_t < t_cap
    offs_h = tl.arange(0, G_ROWS)
    log_p, lse = _pooled_log_probs(phi_ptr, row0, t_cap, offs_t, mask_t, offs_h, GROUP,
                                   G_ROWS, C_PAD)
    cells = bkv * t_cap + offs_t  # < 2**31 (checked by the plan)
    if HAS_GUMBELS:
        gumbel = tl.load(gumbel_ptr + cells, mask=mask_t, other=0.0)
    else:
        u = tl.rand((tl.load(rng_ptr) << 32) + seed, cells)
        gumbel = -tl.log(-tl.log(tl.maximum(u, 1e-12)))
    z = tl.where(log_p > float("-inf"), log_p + gumbel, float("-inf"))
    key = tl.where(mask_t, _key(z), -2147483648)  # KEY_PAD past the teams
    kth = _kth_largest(key[None, :], M + 1, tl.full([1], -2139095041, tl.int32), WAYS)
    kth = tl.max(kth, axis=0)
    kappa = tl.where(kth > -2139095041, _unkey(kth), float("-inf"))
    chosen = key > kth  # at most M keys lie above the (M+1)-th largest
    slot = tl.cumsum(chosen.to(tl.int32), axis=0) - 1
    w = _inclusion_weight(z, log_p, kappa)
    lists = bkv.to(tl.int64) * union_cap + slot
    tl.store(union_ptr + lists, offs_t, mask=chosen)
    tl.store(pool_w_ptr + lists, w, mask=chosen)
    tl.store(count_ptr + bkv, tl.sum(chosen.to(tl.int32), axis=0))
    tl.store(pool_kappa_ptr + bkv, kappa)
    ref = lse + tl.where(kappa > float("-inf"), kappa, 0.0)
    tl.store(kappa_ptr + row0 + offs_h, ref, mask=offs_h < GROUP)
