"""SANTA++ Triton kernels, stage 1: select (score the representatives, add Gumbel noise)
and finish (find each head's ``kappa``, write the selected teams).

The k-ary search on order-preserving integer keys and the compaction finisher are here.
The design is in :mod:`santa_kernels.triton_santapp`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from santa_kernels.triton_launch import _pdl_enter, _pdl_wait
from santa_kernels.triton_santapp_common import _interpreted, _scores


# ------------------------------------------------------------------ jit helpers
@triton.jit
def _key(z):
    """Order-preserving int32 key of fp32 ``z`` (no NaNs)."""
    bits = z.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def _unkey(key):
    bits = tl.where(key >= 0, key, key ^ 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _add2(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _add4(a0, a1, a2, a3, b0, b1, b2, b3):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3


@triton.jit
def _count_min_max(n0, lo0, hi0, n1, lo1, hi1):
    return n0 + n1, tl.minimum(lo0, lo1), tl.maximum(hi0, hi1)


@triton.jit
def _count_min(n0, lo0, n1, lo1):
    return n0 + n1, tl.minimum(lo0, lo1)


# Triton's interpreter runs a tl.reduce combine function element by element (Python calls:
# ~90% of the kth-search tests' time); under it the row reductions below are taken one at
# a time, with the same integer results. Compiled kernels keep the packed reductions.
_REDUCE_APART = tl.constexpr(_interpreted())


@triton.jit
def _row_sums2(a, b):
    """Row sums (axis 1) of two integer tensors, in one packed reduction."""
    if _REDUCE_APART:
        sa = tl.sum(a, axis=1)
        sb = tl.sum(b, axis=1)
    else:
        sa, sb = tl.reduce((a, b), 1, _add2)
    return sa, sb


@triton.jit
def _row_sums4(a, b, c, d):
    """Row sums (axis 1) of four integer tensors, in one packed reduction."""
    if _REDUCE_APART:
        sa = tl.sum(a, axis=1)
        sb = tl.sum(b, axis=1)
        sc = tl.sum(c, axis=1)
        sd = tl.sum(d, axis=1)
    else:
        sa, sb, sc, sd = tl.reduce((a, b, c, d), 1, _add4)
    return sa, sb, sc, sd


@triton.jit
def _row_count_min(n, v):
    """Per row (axis 1): the sum of ``n`` and the least ``v``, in one reduction."""
    if _REDUCE_APART:
        count = tl.sum(n, axis=1)
        least = tl.min(v, axis=1)
    else:
        count, least = tl.reduce((n, v), 1, _count_min)
    return count, least


@triton.jit
def _row_count_min_max(n, v, w):
    """Per row (axis 1): the sum of ``n``, the least ``v`` and the largest ``w``."""
    if _REDUCE_APART:
        count = tl.sum(n, axis=1)
        least = tl.min(v, axis=1)
        top = tl.max(w, axis=1)
    else:
        count, least, top = tl.reduce((n, v, w), 1, _count_min_max)
    return count, least, top


@triton.jit
def _threshold(lo, hi, lo_v, hi_v, J: tl.constexpr, WAYS: tl.constexpr):
    """Threshold ``J`` of ``WAYS`` (int32 keys ``[R]``) for the bracket ``[lo, hi)`` (int64).
    The last is the key-space midpoint (the bracket at least halves every step); the
    others split the bracket evenly in value space, or in key space where that gives no
    key strictly inside it (infinite or adjacent ends). Any key is a correct threshold:
    the choice only decides how fast the bracket shrinks."""
    if J == WAYS - 1:
        t = lo + (hi - lo) // 2
    else:
        t = _key(lo_v + (hi_v - lo_v) * ((J + 1) / WAYS)).to(tl.int64)
        t = tl.where((t > lo) & (t < hi), t, lo + (hi - lo) * (J + 1) // WAYS)
    return t.to(tl.int32)


@triton.jit
def _pair(key, ta, tb):
    """Per key, ``[key >= ta] + 65536 [key >= tb]``: two counts packed in one int32
    (rows hold at most FINISH_CAP < 65536 keys)."""
    return tl.where(key >= ta[:, None], 1, 0) + tl.where(key >= tb[:, None], 65536, 0)


@triton.jit
def _narrow(K, lo, hi, t, c):
    """Folds threshold ``t`` with ``c`` keys at or above it into the bracket."""
    t = t.to(tl.int64)
    lo = tl.where((c >= K) & (t > lo), t, lo)
    hi = tl.where((c < K) & (t < hi), t, hi)
    return lo, hi


@triton.jit
def _narrow4(K, lo, hi, t0, t1, t2, t3, s01, s23):
    """Folds four thresholds (counts packed in ``s01``, ``s23``) into the bracket; also
    returns whether one has exactly ``K`` keys at or above it."""
    c0, c1, c2, c3 = s01 & 0xFFFF, s01 >> 16, s23 & 0xFFFF, s23 >> 16
    lo, hi = _narrow(K, lo, hi, t0, c0)
    lo, hi = _narrow(K, lo, hi, t1, c1)
    lo, hi = _narrow(K, lo, hi, t2, c2)
    lo, hi = _narrow(K, lo, hi, t3, c3)
    return lo, hi, (c0 == K) | (c1 == K) | (c2 == K) | (c3 == K)


@triton.jit
def _kth_search(key, K, lo, hi, WAYS: tl.constexpr):
    """Per row of ``key [R, C]`` (int32; KEY_PAD: no entry), the ``K``-th largest key, or
    KEY_NEG_INF where the row has fewer than ``K`` entries, inside a bracket: ``lo [R]``
    has at least ``K`` keys at or above it (or is KEY_NEG_INF), ``hi [R]`` fewer than ``K``.

    ``WAYS``-ary search (4 or 8): each step counts the keys at or above ``WAYS`` thresholds
    inside ``[lo, hi)`` with one packed reduction and keeps the tightest bracket. A row is
    done when a threshold has exactly ``K`` keys at or above it (it becomes ``lo``) or at
    ``hi = lo + 1``; a closing reduction then finds the least key at or above ``lo``.
    Value-space thresholds finish Gumbel-perturbed scores in ~3-5 steps (bisection:
    ~10-12); the key-space midpoint bounds any input (ties, infinities) by 33 steps.
    (Finding each threshold's least key inside the steps instead, with no closing
    reduction, measured 3.4 us slower at 32k B=1: results/h200/tune-2026-12-01-s11.)"""
    lo = lo.to(tl.int64)
    hi = hi.to(tl.int64)
    active = hi - lo > 1
    steps = 0
    while (tl.max(active.to(tl.int32), axis=0) > 0) & (steps < 40):
        lo_v = _unkey(lo.to(tl.int32))
        hi_v = _unkey(hi.to(tl.int32))  # max key + 1 <= 0x7F800001: fits
        t0 = _threshold(lo, hi, lo_v, hi_v, 0, WAYS)
        t1 = _threshold(lo, hi, lo_v, hi_v, 1, WAYS)
        t2 = _threshold(lo, hi, lo_v, hi_v, 2, WAYS)
        t3 = _threshold(lo, hi, lo_v, hi_v, 3, WAYS)
        if WAYS == 8:
            t4 = _threshold(lo, hi, lo_v, hi_v, 4, WAYS)
            t5 = _threshold(lo, hi, lo_v, hi_v, 5, WAYS)
            t6 = _threshold(lo, hi, lo_v, hi_v, 6, WAYS)
            t7 = _threshold(lo, hi, lo_v, hi_v, 7, WAYS)
            s01, s23, s45, s67 = _row_sums4(_pair(key, t0, t1), _pair(key, t2, t3),
                                            _pair(key, t4, t5), _pair(key, t6, t7))
            new_lo, new_hi, hit = _narrow4(K, lo, hi, t0, t1, t2, t3, s01, s23)
            new_lo, new_hi, hit2 = _narrow4(K, new_lo, new_hi, t4, t5, t6, t7, s45, s67)
            hit = hit | hit2
        else:
            s01, s23 = _row_sums2(_pair(key, t0, t1), _pair(key, t2, t3))
            new_lo, new_hi, hit = _narrow4(K, lo, hi, t0, t1, t2, t3, s01, s23)
        # a threshold with exactly K keys above it makes the largest such the new lo
        lo = new_lo
        hi = new_hi
        active = active & ~hit & (hi - lo > 1)
        steps += 1
    lo32 = lo.to(tl.int32)
    above = key >= lo32[:, None]
    count, kth = _row_count_min(above.to(tl.int32), tl.where(above, key, 2147483647))
    return tl.where(count >= K, kth, -2139095041)


@triton.jit
def _kth_largest(key, K, lo, WAYS: tl.constexpr):
    """:func:`_kth_search` without a bracket: ``lo [R]`` is a key with at least ``K``
    entries at or above it (or KEY_NEG_INF); one reduction first finds the row's largest
    key and, where at least ``K`` are finite, its smallest finite key (a tighter lo)."""
    finite = key > -2139095041
    n_fin, least, top = _row_count_min_max(finite.to(tl.int32),
                                           tl.where(finite, key, 2147483647), key)
    lo = tl.where((n_fin >= K) & (least > lo), least, lo)
    return _kth_search(key, K, lo, top.to(tl.int64) + 1, WAYS)  # nothing at or above hi


@triton.jit
def _top_kth(a1, a2, a3, b1, b2, b3):
    """Merges two descending triples (the three largest of two sets)."""
    return (tl.maximum(a1, b1), tl.maximum(tl.minimum(a1, b1), tl.maximum(a2, b2)),
            tl.maximum(tl.maximum(a3, b3), tl.maximum(tl.minimum(a1, b2), tl.minimum(a2, b1))))


@triton.jit
def _top3(z):
    """Per row of ``z [R, C]`` (fp32), its three largest entries, descending (a multiset)."""
    ninf = tl.full(z.shape, float("-inf"), tl.float32)
    return tl.reduce((z, ninf, ninf), 1, _top_kth)


@triton.jit
def _tops_plane(groups, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, num_splits):
    """Entries a plane of ``split_kth`` holds: B * Hq * splits (``groups`` = B * Hkv)."""
    return (groups // NUM_KV_HEADS) * NUM_KV_HEADS * GROUP * num_splits


@triton.jit
def _inclusion_weight(z, phi, kappa):
    """``1/pi`` where ``z > kappa`` (the team was selected), else 0; ``pi = 1 - e^{-x}``,
    ``x = e^{phi - kappa}``, by its series for small ``x`` (fp32 has no expm1)."""
    x = tl.exp(phi - kappa)  # kappa = -inf: x = inf, pi = 1
    series = x * (1.0 - x * (0.5 - x * (1.0 / 6.0 - x * (1.0 / 24.0 - x * (1.0 / 120.0)))))
    pi = tl.where(x < 0.1, series, 1.0 - tl.exp(-x))
    return tl.where(z > kappa, 1.0 / tl.where(z > kappa, pi, 1.0), 0.0)


@triton.jit
def _selection_keys(
    z_ptr, cand_z_ptr, cand_id_ptr, split_kth_ptr, head_rows, mask_h, num_splits, n_cand,
    t_cap, C_PAD: tl.constexpr, S_PAD: tl.constexpr, LOCAL: tl.constexpr,
):
    """Per head row: the int32 keys of its candidates ``[R, C_PAD]`` (KEY_PAD: none), their
    team ids, which are real, and a key ``lo [R]`` with at least M+1 keys at or above it."""
    offs_c = tl.arange(0, C_PAD)
    inside = mask_h[:, None] & (offs_c < n_cand)[None, :]
    if LOCAL:
        cand = head_rows[:, None] * n_cand + offs_c[None, :]
        z = tl.load(cand_z_ptr + cand, mask=inside, other=float("-inf"), cache_modifier=".cg")
        ids = tl.load(cand_id_ptr + cand, mask=inside, other=-1, cache_modifier=".cg")
        real = inside & (ids >= 0)
        offs_s = tl.arange(0, S_PAD)
        kth_s = tl.load(split_kth_ptr + head_rows[:, None] * num_splits + offs_s[None, :],
                        mask=mask_h[:, None] & (offs_s < num_splits)[None, :],
                        other=-2139095041, cache_modifier=".cg")
        lo = tl.max(kth_s, axis=1)  # that split alone holds M+1 keys at or above it
    else:
        ids = offs_c[None, :] + (head_rows * 0).to(tl.int32)[:, None]
        z = tl.load(z_ptr + head_rows[:, None] * t_cap + ids, mask=inside, other=float("-inf"),
                    cache_modifier=".cg")
        real = inside
        lo = (head_rows * 0 - 2139095041).to(tl.int32)
    key = tl.where(real, _key(z), -2147483648)
    return key, ids, real, lo


@triton.jit
def _split_bracket(key, split_kth_ptr, head_rows, mask_h, K, num_splits, S_PAD: tl.constexpr,
                   BRACKET: tl.constexpr):
    """A search bracket per head row from the select programs' ``BRACKET``-th largest key
    of each split (direct selection; the plan makes ``BRACKET * splits >= K >
    (BRACKET - 1) * splits``): at least ``K`` keys lie at or above the least of them
    (``BRACKET`` in each split), fewer than ``K`` above the largest (only the ``BRACKET -
    1`` above it in each split). Where the splits whose key is finite cannot account
    for ``K`` keys (short sequences: splits past their teams hold ``-inf``), the row
    takes its least finite key instead (one reduction, only when some row needs it)."""
    offs_s = tl.arange(0, S_PAD)
    sk = tl.load(split_kth_ptr + head_rows[:, None] * num_splits + offs_s[None, :],
                 mask=mask_h[:, None] & (offs_s < num_splits)[None, :], other=-2147483648,
                 cache_modifier=".cg")
    finite = sk > -2139095041
    n_ok, least, top = _row_count_min_max(finite.to(tl.int32),
                                          tl.where(finite, sk, 2147483647), sk)
    hi = top.to(tl.int64) + 1
    enough = n_ok * BRACKET >= K
    lo = tl.where(enough, least, -2139095041)
    if tl.max((mask_h & ~enough).to(tl.int32), axis=0) > 0:  # short rows: the old bracket
        fin = key > -2139095041
        n_fin, least_key = _row_count_min(fin.to(tl.int32), tl.where(fin, key, 2147483647))
        lo = tl.where(enough | (n_fin < K), lo, least_key)
    return lo, hi


@triton.jit
def _rows_kappa(
    z_ptr, cand_z_ptr, cand_id_ptr, split_kth_ptr, head_rows, mask_h, M, num_splits, n_cand,
    t_cap, C_PAD: tl.constexpr, S_PAD: tl.constexpr, LOCAL: tl.constexpr, WAYS: tl.constexpr,
    SEARCH: tl.constexpr = True, BRACKET: tl.constexpr = 0,
):
    """Per head row: its candidates (keys, team ids, real), the (M+1)-th largest key and
    kappa (its value; -inf where the row has at most M candidates). Without ``SEARCH``
    (profiling only: wrong kappas) the search is skipped and kth is the lower bound.
    ``BRACKET`` (direct selection only): the select programs left a bracket per split."""
    key, ids, real, lo = _selection_keys(z_ptr, cand_z_ptr, cand_id_ptr, split_kth_ptr,
                                         head_rows, mask_h, num_splits, n_cand, t_cap,
                                         C_PAD, S_PAD, LOCAL)
    if BRACKET > 0:
        lo, hi = _split_bracket(key, split_kth_ptr, head_rows, mask_h, M + 1, num_splits,
                                S_PAD, BRACKET)
        kth = _kth_search(key, M + 1, lo, hi, WAYS) if SEARCH else lo
    else:
        kth = _kth_largest(key, M + 1, lo, WAYS) if SEARCH else lo
    kappa = tl.where(kth > -2139095041, _unkey(kth), float("-inf"))
    return key, ids, real, kth, kappa


@triton.jit
def _write_union(
    z_ptr, union_ptr, count_ptr, key, ids, real, kth, b, kvh, bkv, t_cap, union_cap,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, G_ROWS: tl.constexpr, C_PAD: tl.constexpr,
    LOCAL: tl.constexpr,
):
    """The compact union of the group's selected teams (rows = the G heads)."""
    hq = NUM_KV_HEADS * GROUP
    offs_h = tl.arange(0, G_ROWS)
    selected = real & (key > kth[:, None])
    if LOCAL:
        # candidates differ per head: a team selected by several heads belongs to the
        # first of them (section 6: GQA union), found by reading the others' z
        kappa = tl.where(kth > -2139095041, _unkey(kth), float("-inf"))
        taken = selected & (offs_h[:, None] < 0)
        for other in tl.static_range(GROUP):
            kappa_o = tl.sum(tl.where(offs_h == other, kappa, 0.0), axis=0)
            ask = selected & (offs_h[:, None] > other)
            z_o = tl.load(z_ptr + (b * hq + kvh * GROUP + other).to(tl.int64) * t_cap + ids,
                          mask=ask, other=float("-inf"), cache_modifier=".cg")
            taken = taken | (ask & (z_o > kappa_o))
        owned = (selected & ~taken).to(tl.int32)
        per_head = tl.sum(owned, axis=1)
        first = tl.cumsum(per_head, axis=0) - per_head
        slot = first[:, None] + tl.cumsum(owned, axis=1) - 1
        tl.store(union_ptr + bkv.to(tl.int64) * union_cap + slot, ids, mask=owned > 0)
        tl.store(count_ptr + bkv, tl.sum(per_head, axis=0))
    else:
        # column c is team c for every head: the union is the teams any head selected,
        # in team order (one scan over the teams)
        chosen = tl.max(selected.to(tl.int32), axis=0)  # [C_PAD]
        slot = tl.cumsum(chosen, axis=0) - 1
        tl.store(union_ptr + bkv.to(tl.int64) * union_cap + slot, tl.arange(0, C_PAD),
                 mask=chosen > 0)
        tl.store(count_ptr + bkv, tl.sum(chosen, axis=0))


@triton.jit
def _finish_selection(
    z_ptr, cand_z_ptr, cand_id_ptr, split_kth_ptr, kappa_ptr, union_ptr, count_ptr,
    b, kvh, bkv, M, num_splits, n_cand, t_cap, union_cap,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, G_ROWS: tl.constexpr,
    C_PAD: tl.constexpr, S_PAD: tl.constexpr, LOCAL: tl.constexpr, WAYS: tl.constexpr,
    BRACKET: tl.constexpr,
):
    """kappa per head of the group and the compact union of the selected teams."""
    hq = NUM_KV_HEADS * GROUP
    offs_h = tl.arange(0, G_ROWS)
    mask_h = offs_h < GROUP
    head_rows = (b * hq + kvh * GROUP + offs_h).to(tl.int64)
    key, ids, real, kth, kappa = _rows_kappa(z_ptr, cand_z_ptr, cand_id_ptr, split_kth_ptr,
                                             head_rows, mask_h, M, num_splits, n_cand, t_cap,
                                             C_PAD, S_PAD, LOCAL, WAYS, True, BRACKET)
    _write_union(z_ptr, union_ptr, count_ptr, key, ids, real, kth, b, kvh, bkv, t_cap,
                 union_cap, NUM_KV_HEADS, GROUP, G_ROWS, C_PAD, LOCAL)
    tl.store(kappa_ptr + head_rows, kappa, mask=mask_h)


@triton.jit
def _finish_group(
    z_ptr, split_kth_ptr, kappa_ptr, union_ptr, count_ptr, head_rows, mask_h, b, kvh, bkv, M,
    num_splits, t_cap, union_cap,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, G_ROWS: tl.constexpr,
    C_PAD: tl.constexpr, S_PAD: tl.constexpr, WAYS: tl.constexpr, BRACKET: tl.constexpr,
    HEAD_LISTS: tl.constexpr,
):
    """kappa of every head of one group (``head_rows [G_ROWS]``, direct selection) and its
    head lists, in the group's last select program (no finisher launch). Each row's kappa
    is the finisher kernels': the k-ary search over the row's keys, from the select
    programs' bracket where there is one (the compaction's [CAP, CAP] rankings of G rows
    would take more registers than the scoring: fewer select programs an SM). A team goes to
    the list of the first head that selected it only (team order; the select programs
    set every slot to -1), so the attend programs read it once for the group; without
    ``HEAD_LISTS`` the group's compact union and its count are written instead."""
    K = M + 1
    offs_h = tl.arange(0, G_ROWS)
    key, ids, real, _lo = _selection_keys(z_ptr, z_ptr, z_ptr, split_kth_ptr, head_rows, mask_h,
                                          num_splits, t_cap, t_cap, C_PAD, S_PAD, False)
    if BRACKET > 0:
        lo, hi = _split_bracket(key, split_kth_ptr, head_rows, mask_h, K, num_splits, S_PAD,
                                BRACKET)
        kth = _kth_search(key, K, lo, hi, WAYS)
    else:
        kth = _kth_largest(key, K, (head_rows * 0 - 2139095041).to(tl.int32), WAYS)
    tl.store(kappa_ptr + head_rows, tl.where(kth > -2139095041, _unkey(kth), float("-inf")),
             mask=mask_h)
    if HEAD_LISTS:
        chosen = (real & (key > kth[:, None]) & mask_h[:, None]).to(tl.int32)
        owned = chosen > 0
        if GROUP > 1:  # a team counts in its first selecting head's list only
            owned = owned & (tl.cumsum(chosen, axis=0) == chosen)
        slot = tl.cumsum(owned.to(tl.int32), axis=1) - 1
        tl.store(union_ptr + bkv.to(tl.int64) * union_cap + offs_h[:, None] * M + slot, ids,
                 mask=owned)
    else:
        _write_union(z_ptr, union_ptr, count_ptr, key, ids, real, kth, b, kvh, bkv, t_cap,
                     union_cap, NUM_KV_HEADS, GROUP, G_ROWS, C_PAD, False)


# ------------------------------------------------- draw=pooled: the group's draw
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
def _pool_group(
    phi_ptr, gumbel_ptr, rng_ptr, seed, kappa_ptr, pool_kappa_ptr, union_ptr, count_ptr,
    pool_w_ptr, bkv, M, t_cap, union_cap,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, G_ROWS: tl.constexpr,
    C_PAD: tl.constexpr, HAS_GUMBELS: tl.constexpr, WAYS: tl.constexpr,
):
    """The pooled draw of (sequence, KV head) ``bkv`` (:mod:`santa_kernels.triton_santapp_pool`):
    the pool kernel's program, or the group's last select program (fused finish)."""
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


# ---------------------------------------------------------------- kernel 1: select
@triton.jit
def _select_kernel(
    q_ptr, reps_ptr, log_n_ptr, reps_scale_ptr, gumbel_ptr, rng_ptr, seed,
    phi_ptr, z_ptr, cand_z_ptr, cand_id_ptr, split_kth_ptr, union_ptr,
    kappa_ptr, count_ptr, ticket_ptr, pool_kappa_ptr, pool_w_ptr,
    scale, M, num_splits, n_cand, t_cap, union_cap, stride_qb, stride_qh,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr, G_PAD: tl.constexpr, G_ROWS: tl.constexpr, TB: tl.constexpr,
    M1_PAD: tl.constexpr, LOCAL: tl.constexpr, HAS_GUMBELS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, PDL: tl.constexpr = False,
    ENTRY_PDL: tl.constexpr = False, REPS_AS: tl.constexpr = "", BRACKET: tl.constexpr = 0,
    HEAD_LISTS: tl.constexpr = False, TOPS: tl.constexpr = False, POOLED: tl.constexpr = False,
    FINISH: tl.constexpr = False, C_PAD: tl.constexpr = 2, S_PAD: tl.constexpr = 2,
    WAYS: tl.constexpr = 8,
):
    """Grid ``(splits, B * Hkv)``: scores a block of ``TB`` representatives for the ``G``
    heads of a KV head, writes ``phi`` and ``z`` (and the finisher's candidates or
    bracket). POOLED (draw=pooled): writes ``phi`` only; the pool kernel draws. FINISH
    (direct selection): the group's last program to finish (an acq_rel ticket) finds its
    heads' kappa and writes their lists or the union (:func:`_finish_group`; POOLED: it
    draws the group's teams, :func:`_pool_group`, with ``gumbels [B, Hkv, T]`` where
    HAS_GUMBELS): no finisher or pool kernel."""
    _pdl_enter(PDL, False)  # the next kernel may launch as this grid's last wave starts
    split = tl.program_id(0)
    bkv = tl.program_id(1)
    b = bkv // NUM_KV_HEADS
    kvh = bkv % NUM_KV_HEADS
    hq = NUM_KV_HEADS * GROUP
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D_PAD)
    mask_d = offs_d < HEAD_DIM
    offs_t = split * TB + tl.arange(0, TB)
    mask_t = offs_t < t_cap
    # the representatives and team sizes are fixed after the prefill: with ENTRY_PDL (the
    # call launched as a programmatic dependent of the step's previous kernel) they load
    # while that kernel finishes, and only the query waits for it
    team_rows = bkv * t_cap + offs_t
    reps = tl.load(reps_ptr + team_rows.to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :],
                   mask=mask_t[:, None] & mask_d[None, :], other=0.0)
    log_n = tl.load(log_n_ptr + team_rows, mask=mask_t, other=float("-inf"))
    if REPS_AS != "":  # int8 codes (exact in 16-bit floats) in the cache dtype; * scale below
        rep_scale = tl.load(reps_scale_ptr + team_rows, mask=mask_t, other=0.0)
        reps = reps.to(tl.float32)  # (int8 -> bf16 directly is wrong in the interpreter)
        if REPS_AS == "bf16":
            reps = reps.to(tl.bfloat16)
        elif REPS_AS == "fp16":
            reps = reps.to(tl.float16)
    _pdl_wait(ENTRY_PDL)
    # section 6: phi_g = tau q.r_g + log n_g for the G heads of the group, one dot
    q = tl.load(q_ptr + b * stride_qb + (kvh * GROUP + offs_g)[:, None] * stride_qh
                + offs_d[None, :], mask=(offs_g < GROUP)[:, None] & mask_d[None, :], other=0.0)
    s = _scores(q, reps, DOT_PRECISION)  # [G_PAD, TB]; the padding rows of q are zero
    if G_PAD > G_ROWS:  # keep G_ROWS rows: adding the zero rows is exact
        s = tl.sum(tl.reshape(s, [G_PAD // G_ROWS, G_ROWS, TB]), axis=0)
    if REPS_AS != "":
        s = s * rep_scale[None, :]
    offs_h = tl.arange(0, G_ROWS)
    mask_h = offs_h < GROUP
    head_rows = b * hq + kvh * GROUP + offs_h
    phi = s * scale + log_n[None, :]
    valid = mask_h[:, None] & mask_t[None, :]
    cells = head_rows[:, None] * t_cap + offs_t[None, :]  # < 2**31 (checked by the plan)
    if POOLED:  # the pool kernel pools every head's phi over the teams, then draws
        tl.store(phi_ptr + cells, phi, mask=valid)
        if FINISH:  # the group's last program draws (an acq_rel ticket)
            tl.debug_barrier()
            if tl.atomic_add(ticket_ptr + bkv, 1, sem="acq_rel") == num_splits - 1:
                _pool_group(phi_ptr, gumbel_ptr, rng_ptr, seed, kappa_ptr, pool_kappa_ptr,
                            union_ptr, count_ptr, pool_w_ptr, bkv, M, t_cap, union_cap,
                            NUM_KV_HEADS, GROUP, G_ROWS, C_PAD, HAS_GUMBELS, WAYS)
                tl.store(ticket_ptr + bkv, 0)  # ready for the next call (graph replay)
        return
    if HAS_GUMBELS:
        gumbel = tl.load(gumbel_ptr + cells, mask=valid, other=0.0)
    else:
        # section 8: Philox keyed by (seed, step) (the step lives on the device), counter
        # (b, head block of 4, team): rand4x serves four heads per counter
        key = (tl.load(rng_ptr) << 32) + seed
        u = tl.zeros([G_ROWS, TB], dtype=tl.float32)
        for block in tl.static_range((G_ROWS + 3) // 4):
            counter = (b * hq + kvh * GROUP + 4 * block) * t_cap + offs_t
            u0, u1, u2, u3 = tl.rand4x(key, counter)
            row = offs_h[:, None] - 4 * block
            u = tl.where(row == 0, u0[None, :], u)
            u = tl.where(row == 1, u1[None, :], u)
            u = tl.where(row == 2, u2[None, :], u)
            u = tl.where(row == 3, u3[None, :], u)
        gumbel = -tl.log(-tl.log(tl.maximum(u, 1e-12)))
    z = tl.where(valid, phi + gumbel, float("-inf"))
    tl.store(phi_ptr + cells, phi, mask=valid)
    tl.store(z_ptr + cells, z, mask=valid)
    if LOCAL:
        # this block's top M+1 per head: every global top-(M+1) team is among them
        keys = tl.where(valid, _key(z), -2147483648)
        kth = _kth_largest(keys, M + 1, tl.full([G_ROWS], -2139095041, tl.int32), 8)
        keep = valid & (keys >= kth[:, None])
        rank = tl.cumsum(keep.to(tl.int32), axis=1) - 1
        keep = keep & (rank < M + 1)
        base = head_rows[:, None] * n_cand + split * (M + 1)
        tl.store(cand_z_ptr + base + rank, z, mask=keep)
        tl.store(cand_id_ptr + base + rank, offs_t[None, :] + 0 * offs_h[:, None], mask=keep)
        kept = tl.sum(keep.to(tl.int32), axis=1)
        offs_m = tl.arange(0, M1_PAD)
        empty = mask_h[:, None] & (offs_m[None, :] >= kept[:, None]) & (offs_m < M + 1)[None, :]
        tl.store(cand_id_ptr + base + offs_m[None, :], -1 + 0 * offs_m[None, :], mask=empty)
        tl.store(split_kth_ptr + head_rows * num_splits + split, kth, mask=mask_h)
    elif BRACKET > 0:
        # the finisher's search bracket: this block's BRACKET-th largest z in plane 0;
        # with TOPS (the compact finisher) the larger ones in the planes after it
        v1, v2, v3 = _top3(z)
        plane = _tops_plane(tl.num_programs(1), NUM_KV_HEADS, GROUP, num_splits)
        at = split_kth_ptr + head_rows * num_splits + split
        if BRACKET == 1:
            tl.store(at, _key(v1), mask=mask_h)
        elif BRACKET == 2:
            tl.store(at, _key(v2), mask=mask_h)
            if TOPS:
                tl.store(at + plane, _key(v1), mask=mask_h)
        else:
            tl.store(at, _key(v3), mask=mask_h)
            if TOPS:
                tl.store(at + plane, _key(v2), mask=mask_h)
                tl.store(at + 2 * plane, _key(v1), mask=mask_h)
    if HEAD_LISTS:  # noqa: SIM102 (constexpr)  the finishers write only their chosen slots
        if split == 0:
            offs_l = tl.arange(0, M1_PAD)[None, :]
            tl.store(union_ptr + bkv.to(tl.int64) * union_cap + offs_h[:, None] * M + offs_l,
                     -1 + 0 * offs_l, mask=mask_h[:, None] & (offs_l < M))
    if FINISH:
        # every thread's z, bracket and list stores are ordered before the ticket
        # (barrier + acq_rel atomic); the last of the group's programs reads them all
        tl.debug_barrier()
        ticket = tl.atomic_add(ticket_ptr + bkv, 1, sem="acq_rel")
        if ticket == num_splits - 1:
            _finish_group(z_ptr, split_kth_ptr, kappa_ptr, union_ptr, count_ptr,
                          head_rows.to(tl.int64), mask_h, b, kvh, bkv, M, num_splits, t_cap,
                          union_cap, NUM_KV_HEADS, GROUP, G_ROWS, C_PAD, S_PAD, WAYS, BRACKET,
                          HEAD_LISTS)
            tl.store(ticket_ptr + bkv, 0)  # ready for the next call (graph replay)


@triton.jit
def _finish_kernel(
    z_ptr, cand_z_ptr, cand_id_ptr, split_kth_ptr, kappa_ptr, union_ptr, count_ptr,
    M, num_splits, n_cand, t_cap, union_cap,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, G_ROWS: tl.constexpr,
    C_PAD: tl.constexpr, S_PAD: tl.constexpr, LOCAL: tl.constexpr, WAYS: tl.constexpr,
    PDL: tl.constexpr = False, BRACKET: tl.constexpr = 0,
):
    _pdl_enter(PDL, True)  # launched early: wait for the previous kernel
    bkv = tl.program_id(0)
    _finish_selection(z_ptr, cand_z_ptr, cand_id_ptr, split_kth_ptr, kappa_ptr, union_ptr,
                      count_ptr, bkv // NUM_KV_HEADS, bkv % NUM_KV_HEADS, bkv, M, num_splits,
                      n_cand, t_cap, union_cap, NUM_KV_HEADS, GROUP, G_ROWS, C_PAD, S_PAD,
                      LOCAL, WAYS, BRACKET)


@triton.jit
def _at_least(c, keys):
    """Per entry of ``c [N]``, how many of ``keys [P]`` are at or above it (one [N, P]
    comparison)."""
    return tl.sum((keys[None, :] >= c[:, None]).to(tl.int32), axis=1)


@triton.jit
def _compact_finish(
    z_ptr, split_kth_ptr, scratch_key_ptr, scratch_id_ptr, kappa_ptr, list_ptr, head_rows,
    mask_h, M, num_splits, t_cap,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
    C_PAD: tl.constexpr, S_PAD: tl.constexpr, TOPS_PAD: tl.constexpr, CAP: tl.constexpr,
    WAYS: tl.constexpr, BRACKET: tl.constexpr,
):
    """kappa and the head list of one head row (``head_rows [1]``) without the search where
    the keys allow. The splits' top ``BRACKET`` keys (plane ``i`` of ``split_kth``: each
    split's ``(BRACKET - i)``-th largest, :func:`_tops_plane` entries a plane) hold at
    least M+1 keys at or above their own (M+1)-th largest ``lo``, so kappa >= lo; the keys
    at or above ``lo`` (~M+5 of 2048 on Gumbel-perturbed rows) are compacted in team
    order through ``scratch`` and, where at most CAP, kappa is the largest of them with at
    least M+1 at or above it (one [CAP, CAP] comparison; a multiset rank, so ties and -inf
    go as in the search). Rows with more keys above ``lo`` take the bracketed search over all keys.
    Writes the row's kappa and its selected teams, in team order, to ``list_ptr`` (M
    slots)."""
    K = M + 1
    key, ids, real, _lo = _selection_keys(z_ptr, z_ptr, z_ptr, split_kth_ptr, head_rows, mask_h,
                                          num_splits, t_cap, t_cap, C_PAD, S_PAD, False)
    row = tl.max(head_rows, axis=0)
    offs_p = tl.arange(0, TOPS_PAD)
    plane = _tops_plane(tl.num_programs(0), NUM_KV_HEADS, GROUP, num_splits)
    tops = tl.load(split_kth_ptr + (offs_p // num_splits) * plane + row * num_splits
                   + offs_p % num_splits, mask=offs_p < BRACKET * num_splits,
                   other=-2147483648, cache_modifier=".cg")
    finite = tops > -2139095041
    lo = tl.max(tl.where(finite & (_at_least(tops, tops) >= K), tops, -2139095041), axis=0)
    key1 = tl.max(key, axis=0)  # the one row as [C_PAD]
    ids1 = tl.max(ids, axis=0)
    cand = (tl.max(real.to(tl.int32), axis=0) > 0) & (key1 >= lo)
    pos = tl.cumsum(cand.to(tl.int32), axis=0) - 1
    n = tl.sum(cand.to(tl.int32), axis=0)
    keep = cand & (pos < CAP)
    tl.store(scratch_key_ptr + row * CAP + pos, key1, mask=keep)
    tl.store(scratch_id_ptr + row * CAP + pos, ids1, mask=keep)
    if n <= CAP:
        tl.debug_barrier()  # the compacted keys, stored by every thread, visible to all
        offs_k = tl.arange(0, CAP)
        inside = offs_k < n
        ck = tl.load(scratch_key_ptr + row * CAP + offs_k, mask=inside, other=-2147483648)
        cid = tl.load(scratch_id_ptr + row * CAP + offs_k, mask=inside, other=0)
        kth = tl.max(tl.where(inside & (_at_least(ck, ck) >= K), ck, -2139095041), axis=0)
        ranked = inside & (ck > kth)  # (names differ by branch: their shapes do)
        tl.store(list_ptr + tl.cumsum(ranked.to(tl.int32), axis=0) - 1, cid, mask=ranked)
    else:
        lo_b, hi_b = _split_bracket(key, split_kth_ptr, head_rows, mask_h, K, num_splits,
                                    S_PAD, BRACKET)
        kth = tl.max(_kth_search(key, K, tl.maximum(lo_b, lo), hi_b, WAYS), axis=0)
        searched = cand & (key1 > kth)  # kth >= lo: every chosen key is a candidate
        tl.store(list_ptr + tl.cumsum(searched.to(tl.int32), axis=0) - 1, ids1, mask=searched)
    kappa = tl.where(kth > -2139095041, _unkey(kth), float("-inf"))
    tl.store(kappa_ptr + row, kappa)


@triton.jit
def _finish_heads_kernel(
    z_ptr, cand_z_ptr, cand_id_ptr, split_kth_ptr, kappa_ptr, union_ptr, count_ptr, ticket_ptr,
    scratch_key_ptr, scratch_id_ptr,
    M, num_splits, n_cand, t_cap, union_cap, finish_parts,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, G_ROWS: tl.constexpr,
    H_ROWS: tl.constexpr, C_PAD: tl.constexpr, S_PAD: tl.constexpr, LOCAL: tl.constexpr,
    WAYS: tl.constexpr, PDL: tl.constexpr = False, WRITE_UNION: tl.constexpr = True,
    SEARCH: tl.constexpr = True, BRACKET: tl.constexpr = 0, HEAD_LISTS: tl.constexpr = False,
    COMPACT: tl.constexpr = 0, TOPS_PAD: tl.constexpr = 2,
):
    """Grid ``(B * Hkv, finish_parts)``: each program finds kappa for ``H_ROWS`` heads of
    the group (the kth search spread over the group's heads instead of one program per
    group); the last of the group's programs to finish (an acq_rel ticket) writes the
    union from the group's kappas (not with WRITE_UNION False: profiling only, the call's
    output is then wrong; nor is it without SEARCH, which skips the kth search and the
    union: kappa = -inf would select more teams than the union holds). With HEAD_LISTS
    there is no union step: each program writes its heads' selected teams, in team order,
    to their own ``M`` slots of the list (-1 past them) and the attend programs skip a
    team in every slot but its first selecting head's."""
    _pdl_enter(PDL, True)  # launched early: wait for the previous kernel
    bkv = tl.program_id(0)
    part = tl.program_id(1)
    b = bkv // NUM_KV_HEADS
    kvh = bkv % NUM_KV_HEADS
    hq = NUM_KV_HEADS * GROUP
    offs_h = part * H_ROWS + tl.arange(0, H_ROWS)
    mask_h = offs_h < GROUP
    head_rows = (b * hq + kvh * GROUP + offs_h).to(tl.int64)
    if COMPACT > 0:  # one head a program (H_ROWS = 1), head lists, a bracket
        _compact_finish(z_ptr, split_kth_ptr, scratch_key_ptr, scratch_id_ptr, kappa_ptr,
                        union_ptr + bkv.to(tl.int64) * union_cap + part * M, head_rows, mask_h,
                        M, num_splits, t_cap, NUM_KV_HEADS, GROUP, C_PAD, S_PAD, TOPS_PAD,
                        COMPACT, WAYS, BRACKET)
        return
    keys, ids, real, kth, kappa = _rows_kappa(
        z_ptr, cand_z_ptr, cand_id_ptr, split_kth_ptr, head_rows, mask_h, M, num_splits,
        n_cand, t_cap, C_PAD, S_PAD, LOCAL, WAYS, SEARCH, BRACKET)  # fmt: skip
    tl.store(kappa_ptr + head_rows, kappa, mask=mask_h)
    if not WRITE_UNION or not SEARCH:  # without the search every team would be selected
        return
    if HEAD_LISTS:  # at most M keys lie above the (M+1)-th largest
        # (the select kernel set every slot to -1: slots past the chosen stay so)
        chosen = real & (keys > kth[:, None]) & mask_h[:, None]
        slot = tl.cumsum(chosen.to(tl.int32), axis=1) - 1
        lists = union_ptr + bkv.to(tl.int64) * union_cap + offs_h[:, None] * M
        tl.store(lists + slot, ids, mask=chosen)
        return
    # every thread's kappa store is ordered before the ticket (barrier + acq_rel atomic)
    tl.debug_barrier()
    ticket = tl.atomic_add(ticket_ptr + bkv, 1, sem="acq_rel")
    if ticket == finish_parts - 1:
        offs_g = tl.arange(0, G_ROWS)
        mask_g = offs_g < GROUP
        rows = (b * hq + kvh * GROUP + offs_g).to(tl.int64)
        key_g, ids_g, real_g, _lo_g = _selection_keys(z_ptr, cand_z_ptr, cand_id_ptr,
                                                  split_kth_ptr, rows, mask_g, num_splits,
                                                  n_cand, t_cap, C_PAD, S_PAD, LOCAL)
        kappa_g = tl.load(kappa_ptr + rows, mask=mask_g, other=float("-inf"),
                          cache_modifier=".cg")
        _write_union(z_ptr, union_ptr, count_ptr, key_g, ids_g, real_g, _key(kappa_g), b,
                     kvh, bkv, t_cap, union_cap, NUM_KV_HEADS, GROUP, G_ROWS, C_PAD, LOCAL)
        tl.store(ticket_ptr + bkv, 0)  # ready for the next call (graph replay)
