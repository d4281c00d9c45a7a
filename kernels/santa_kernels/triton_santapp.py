"""Triton kernels for SANTA++ decode attention (docs/algorithms.md sections 6 and 8).

One decode step for ``q [B, Hq, d]`` runs four kernels: select, finish, attend and merge
(no merge kernel with the atomic merge, the default up to 16 (sequence, KV head) groups;
the options ``fused_finish`` and ``merge_ticket`` drop the finish and the merge kernel,
measured slower), none of which synchronises with the host, so a call can be captured in
a CUDA graph; the Philox step counter lives on the device (``rng``, advanced by the last
kernel) so every replay draws fresh Gumbel noise.

1. **select** ``(splits, B*Hkv)``: each program scores a block of ``TB`` representatives
   for all ``G`` query heads of its KV head with one ``tl.dot`` (``phi = tau q.r + log n``,
   ``-inf`` for padding teams), adds Gumbel noise (32-bit Philox keyed by ``(seed, step)``,
   counter ``(b, block of 4 heads, team)``, ``rand4x``; ``gumbels=`` overrides it) and
   writes ``phi`` and ``z = phi + Gumbel``. In *local* mode (many teams: ``G * T``
   above ``FINISH_MAX_SCALE *`` :data:`FINISH_CAP`) it also keeps its block's top
   ``M+1`` per head as candidates (threshold found by the search below); in direct
   selection it stores each head's ``j``-th largest ``z`` of its block (``bracket``,
   ``j = ceil((M+1) / splits) <= 3``): the finisher's search bracket.
   **finish** (its own kernel, grid ``(B*Hkv, G)``, one program per query head;
   ``finish_heads=0``: one program per KV group) finds ``kappa`` = the ``(M+1)``-th
   largest ``z`` by a k-ary search on order-preserving integer keys
   (``triton_santapp_select._kth_search``: 4 or 8 thresholds a step, one packed reduction
   each, ~3-5 dependent steps instead of ~11 for bisection; from the select programs'
   bracket, or from the row's least finite and largest key).
   With ``compact`` (the per-head finisher's default in direct selection) the select
   programs leave their split's top ``j`` z: the (M+1)-th largest of those bounds kappa
   from below, and the ~M+5 keys at or above the bound are compacted and ranked by one
   comparison instead (``triton_santapp_select._compact_finish``; the search where more
   than ``CAP`` lie there). With ``head_lists`` (the per-head finisher's default) each
   program writes its head's selected teams (``z > kappa``, team order) to that head's
   ``M`` slots of the list; otherwise the group's last finishing program (an acq_rel
   ticket) writes the compact union over the group (team order, or in local mode a team
   belongs to the first head that selected it) and its count. The call at 32k B=1: 23.8 us
   with the earlier finisher, 21.6 with lists and bracket, 20.7 with the compaction (H200,
   2026-12-01: results/h200/tune-2026-12-01-s11, tune-2026-12-01-s12).
   **fused finish** (``fused_finish``, an option of direct selection; off by default, the
   finish kernel being faster at every M and draw timed: H100, 2026-12-07): no finish
   kernel; the group's last select program (an acq_rel ticket) finds its ``G`` heads'
   kappas by the (bracketed) search over the ``[G, T]`` keys and writes the head lists, a
   team in its first selecting head's list only (so the attend programs load it once for
   the group, as the byte model counts), or the union.
2. **attend** ``(B*Hkv, chunks + exact programs)``: a team program loads ``TPB`` teams of
   the list (``SLOT`` rows each; with head lists a slot counts only in the list of the
   first head that selected its team; otherwise programs past the device-side union
   count read nothing; empty programs write an empty partial, so the merge needs no count),
   K once for the whole group (``tl.dot`` with ``[G_PAD, d]`` queries), the weight
   ``w_{h,g} = 1/pi_{h,g}`` (``pi = 1 - exp(-exp(phi - kappa))``; 0 where head ``h`` did
   not select ``g``), and V; it keeps the weighted online softmax
   ``p = w e^{s - m}`` and writes a partial ``(m, l, acc)`` per head. Exact programs walk
   the exact set ``E`` (tokens in no team: the first ``sink`` and ``[team_end, length)``)
   with weight 1. With ``merge_atomic`` (the default up to 16 (sequence, KV head)
   groups) each program also adds its partial scaled by ``e^{m - kappa}`` into per-head
   fp32 sums (scaled to one reference per head the partials are additive; ``1/pi``
   keeps a selected team's term near ``e^{s - phi}``, so the sums stay in range) and the
   group's last program (an acq_rel ticket) writes ``sum_o / sum_l``, or merges the
   partials as below where a sum left [2^-64, 2^64]; it advances ``rng``. No merge kernel
   runs then (20.7 -> 18.1 us at 32k B=1; not bitwise reproducible: the adds' order).
3. **merge** ``(B*Hq)``, the default where the atomic merge is off: log-sum-exp merge of
   every partial as triton_splitkv's stage 2 (max first, then one weighted sum over up to
   64 partials a step; about one attend program per SM keeps B=1 at 33 partials per head),
   ``out = num / den`` in q's dtype (the self-normalised Horvitz-Thompson ratio of section
   6); advances ``rng``. With ``merge_ticket`` (an option; off by default, the merge kernel
   being faster at every M and draw timed: H100, 2026-12-07) no merge kernel runs: the
   group's last attend program (an acq_rel ticket) merges the group's partials the same
   way, to the same bits.

``draw=pooled`` (:data:`santa_kernels.santapp.KERNEL_DRAWS`; ``draw=union`` is
reference-only): one draw of ``M`` teams per (sequence, KV head) from
``p_g = mean_h softmax(phi_h)_g``, every head of the group weighting the same teams by the
shared ``1/pi_g``. The select programs write ``phi`` only (no Gumbel noise, bracket or
candidates); the **pool** kernel (``triton_santapp_pool``, grid ``(B*Hkv)``, in place of
the finishers, the default; with the option ``fused_finish``, up to
``HOPPER["fused_pool_max_teams"]`` teams, the group's last select program instead) pools
the group's ``G`` rows of ``phi``, adds Gumbel noise (counter ``(b, KV head, team)``),
finds ``kappa`` by the same k-ary search over one row of ``T`` keys (at most 16384 teams)
and writes the chosen teams (team order) to the group's ``M`` list slots with their
``1/pi``; the attend programs read each listed team once for all ``G`` heads (no head
lists, no union), so a KV head reads ``M`` teams where ``head``'s union holds up to
``G*M``.

Team storage (:class:`PackedTeams`): representatives ``[B, Hkv, T, d]`` in the cache dtype,
``log n_g`` (``-inf`` for padding), team start/length tables and the exact-set bounds.
``contiguous`` teams are *views* of the cache: team ``g`` is the rows
``start_g .. start_g + n_g - 1`` of the cache (contiguous or paged; paged rows are looked
up in the page table), nothing is copied. ``kmeans`` teams (or ``copy=True``) are copied
team-major into ``[B, Hkv, R, d]`` K/V buffers so each team is one contiguous read. Index
build + pack is prefill-time work: :func:`build_packed` does both, :func:`time_index_build`
times it apart from decode.

Limits: head dim >= 16 (any; padded to a power of two); team sizes >= 1, no power of two
needed (a team is read in chunks of ``SLOT = next_pow2(longest team)`` rows, at most 128,
32 for ``d > 128``, halved for fp32); group size <= 64; K/V in bf16, fp16 or fp32;
``gumbel-topk`` only (multinomial and ``mix`` are reference-only and raise);
``1 <= M <=`` the fewest teams of any (sequence, KV head).

Byte model (element size ``E``, ``T`` teams per (b, kv head), union ``U`` teams of the
group, ``n_u`` their members, ``X`` exact rows):

* select: reads ``B*Hkv*T*(d*E + 4)`` (representatives, ``log n``) + q; writes
  ``2*B*Hq*T*4`` (``phi``, ``z``; L2-resident) + local candidates ``B*Hq*splits*(M+1)*8``;
  the finishers re-read ``z`` (or the candidates) from L2.
* attend: reads ``Σ (n_u + X) * 2 * d * E`` (K and V rows, union per group) + ``U*G*8``
  (``z``, ``phi``); writes ``B*Hq*(chunks used + exact programs)*(d + 2)*4``. With
  ``draw=pooled`` the union is the group's ``M`` listed teams (``U = M``; ``U*4`` bytes
  of weights), and the pool kernel re-reads ``phi`` (``B*Hq*T*4``, L2) instead of the
  finishers' ``z``.
* merge: reads those partials, writes ``B*Hq*d*E`` (atomic merge: each attend program
  adds ``(d + 1)`` fp32 a head of its group; the group's last program reads the sums
  once).

At Llama-3.1-8B shape (Hq=32, Hkv=8, d=128, bf16), 32k tokens, P=16, M=32, B=1: the
representatives are 8 x 2048 x 256 B = 4.2 MB and the teams at most 8 x 128 x 16 rows x
512 B = 8.4 MB, against 134 MB of dense K+V (<= 9.4%). The KV read fraction reported
excludes the representatives (union rows + exact rows); the read-equivalent adds them
as K rows. With ``reps=int8`` (:func:`quantize_packed`) a representative is d int8 codes
and one fp32 scale: 8 x 2048 x 132 B = 2.2 MB at that shape.

This module holds the call (checks, launch order, :func:`santapp_decode`) and re-exports
the stages, one module each: ``triton_santapp_pack`` (team storage), ``triton_santapp_plan``
(launch plan and workspace), ``triton_santapp_select`` (select and finish kernels),
``triton_santapp_pool`` (the pooled draw's pool kernel),
``triton_santapp_attend`` (attend kernel), ``triton_santapp_merge`` (merge kernel and the
atomic merge), with the constants and Hopper launch parameters in ``triton_santapp_common``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from santa_kernels.kv import KVCache
from santa_kernels.reads import ReadCounts
from santa_kernels.triton_launch import pdl_available
from santa_kernels.triton_santapp_attend import _attend_kernel
from santa_kernels.triton_santapp_common import (
    _REPS_AS,
    HOPPER,
    KERNEL_DTYPES,
    MAX_GROUP,
    STAGES,
    _dot_precision,
    _next_pow2,
    santapp_triton_available,
)
from santa_kernels.triton_santapp_common import FINISH_CAP as FINISH_CAP
from santa_kernels.triton_santapp_common import FINISH_MAX_SCALE as FINISH_MAX_SCALE
from santa_kernels.triton_santapp_common import H200_SM_COUNT as H200_SM_COUNT
from santa_kernels.triton_santapp_common import KEY_NEG_INF as KEY_NEG_INF
from santa_kernels.triton_santapp_common import KEY_PAD as KEY_PAD
from santa_kernels.triton_santapp_common import MAX_TEAMS_PER_SPLIT as MAX_TEAMS_PER_SPLIT
from santa_kernels.triton_santapp_common import PROGRAMS_PER_SM as PROGRAMS_PER_SM
from santa_kernels.triton_santapp_merge import _merge_kernel
from santa_kernels.triton_santapp_pack import REPS_KERNEL_ELEMENTS as REPS_KERNEL_ELEMENTS
from santa_kernels.triton_santapp_pack import (
    PackedTeams,
    build_packed,
    pack_teams,
    time_index_build,
)
from santa_kernels.triton_santapp_pack import quantize_packed as quantize_packed
from santa_kernels.triton_santapp_plan import (
    SantaPPPlan,
    SantaPPWorkspace,
    make_plan,
    reads_every_team,
    teams_selected,
)
from santa_kernels.triton_santapp_plan import _plan_for as _plan_for  # the method adapter plans
from santa_kernels.triton_santapp_pool import _pool_kernel
from santa_kernels.triton_santapp_select import _finish_heads_kernel, _finish_kernel, _select_kernel
from santa_kernels.validate import InputError, check_positive_int, check_scale


# -------------------------------------------------------------------- host side
@dataclass(frozen=True)
class SantaPPInfo:
    """What one call selected (views into the workspace; read off the hot path).

    ``z``/``phi [B, Hq, T]``, ``kappa [B, Hq]``, ``union [B, Hkv, U]`` with ``count [B, Hkv]``
    valid entries (team ids); with ``head_lists`` the union holds ``U / M`` lists of ``M``
    slots, one per head of the group (team ids, -1: none; a team may sit in several, or
    with ``fused_finish`` in its first selecting head's only) and ``count`` is not
    written. ``draw="pooled"``: ``union`` is the group's one list of
    ``M`` teams, ``pool_w [B, Hkv, M]`` their shared ``1/pi`` and ``pool_kappa [B, Hkv]``
    the group's kappa; ``z`` is not written and ``kappa`` holds each head's merge
    reference.
    """

    M: int
    packed: PackedTeams
    z: torch.Tensor
    phi: torch.Tensor
    kappa: torch.Tensor
    union: torch.Tensor
    count: torch.Tensor
    lengths: torch.Tensor
    head_lists: bool = False
    draw: str = "head"
    pool_w: torch.Tensor | None = None
    pool_kappa: torch.Tensor | None = None

    def _per_head(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, Hkv, T]`` -> ``[B, Hq, T]`` (every query head of a group the same)."""
        return x.repeat_interleave(self.z.shape[1] // x.shape[1], dim=1)

    def selected(self) -> torch.Tensor:
        """``[B, Hq, T]`` bool: the teams each head selected (``z > kappa``)."""
        if self.draw == "pooled":
            return self._per_head(self.members()).to(self.z.device)
        return self.z > self.kappa[..., None]

    def team_weights(self) -> torch.Tensor:
        """``[B, Hq, T]`` float64: ``1/pi`` of each selected team, 0 elsewhere."""
        if self.draw == "pooled":
            weights = self._scatter_union(self.pool_w.double().cpu(), 0.0)
            return self._per_head(weights).to(self.z.device)
        z, phi, kappa = self.z.double(), self.phi.double(), self.kappa.double()[..., None]
        pi = -torch.expm1(-torch.exp(phi - kappa))
        chosen = z > kappa
        return torch.where(chosen, 1 / torch.where(chosen, pi, 1), 0)

    def _scatter_union(self, values: torch.Tensor, empty: float | bool) -> torch.Tensor:
        """``[B, Hkv, T]`` on the CPU: ``values`` (one a slot of the union, or one for all)
        at the teams of the union's used slots, ``empty`` elsewhere."""
        union = self.union.long().cpu()
        slots = torch.arange(union.shape[-1])
        if self.head_lists:
            used = union >= 0
        else:
            used = slots[None, None, :] < self.count.long().cpu()[..., None]
        teams = self.z.shape[-1]
        out = torch.full((*union.shape[:2], teams + 1), empty, dtype=values.dtype)
        out.scatter_(2, torch.where(used, union, teams), torch.where(used, values, empty))
        return out[..., :teams]

    def members(self) -> torch.Tensor:
        """``[B, Hkv, T]`` bool: the teams the attend programs read (the group's union;
        draw=pooled: its one list of M)."""
        return self._scatter_union(torch.tensor(True), False)

    def union_sets(self) -> list[list[set[int]]]:
        """The union of every (sequence, KV head) as Python sets."""
        members = self.members()
        return [[set(torch.nonzero(row).flatten().tolist()) for row in seq] for seq in members]

    def read_counts(self) -> ReadCounts:
        """K/V rows read per (sequence, KV head): the union's members plus the exact set."""
        packed = self.packed
        members = self.members()
        team_len = packed.team_len.long().cpu()
        lengths = self.lengths.long().cpu()
        team_end = packed.team_end.long().cpu()
        n_exact = torch.minimum(torch.full_like(team_end, packed.sink), team_end)
        n_exact = n_exact + (lengths - team_end).clamp_min(0)
        rows = torch.where(members, team_len[..., : members.shape[-1]], 0).sum(-1)
        rows = rows + n_exact[:, None]
        d = packed.head_dim
        return ReadCounts(
            k_rows=rows, k_features=rows * d, v_rows=rows.clone(), context=lengths, head_dim=d
        )

    @property
    def representatives_read(self) -> torch.Tensor:
        return self.packed.num_teams.clone()

    def bytes_moved(self, q: torch.Tensor) -> int:
        """HBM bytes of the call by the module's byte model: representatives and ``log n``
        of every (sequence, KV head), the K/V rows read, q and the output (the L2-resident
        workspace traffic is left out)."""
        packed = self.packed
        tables = packed.reps.numel() * packed.reps.element_size() + packed.log_n.numel() * 4
        if packed.reps_scale is not None:
            tables += packed.reps_scale.numel() * 4
        rows = self.read_counts().kv_bytes(packed.kv_itemsize)
        return tables + rows + 2 * q.numel() * q.element_size()

    def read_equivalent(self) -> float:
        """KV read fraction with every representative counted as one K row (int8 codes and
        their scale: as the share of a K row's bytes they take)."""
        reads = self.read_counts()
        d = reads.head_dim
        read = float(reads.k_features.sum()) + float(reads.v_rows.sum()) * d
        share = 1.0
        if self.packed.reps_scale is not None:
            share = (d * self.packed.reps.element_size() + 4) / (d * self.packed.kv_itemsize)
        read += float(self.representatives_read.sum()) * d * share
        return read / (2 * reads.dense_rows * d)


def check_scheme(scheme: str = "gumbel-topk", mix: float = 0.0) -> None:
    """Raises unless the kernel implements this selection (gumbel-topk without mixing)."""
    if scheme != "gumbel-topk":
        raise InputError(
            f"scheme: the SANTA++ kernel implements 'gumbel-topk' only, got {scheme!r} "
            "(multinomial is reference-only: santa_kernels.santapp)"
        )
    if mix:
        raise InputError(
            f"mix: the SANTA++ kernel has no defensive mixing, got {mix!r} "
            "(use santa_kernels.santapp for mix > 0)"
        )


def _check_call(q, kv, packed, M, workspace) -> int:
    """Validates a call; returns the ``M`` it plans for (:func:`teams_selected`)."""
    if not isinstance(kv, KVCache):
        raise InputError(f"kv: expected a santa_kernels.KVCache, got {type(kv).__name__}")
    if not isinstance(packed, PackedTeams):
        raise InputError(f"packed: expected a PackedTeams, got {type(packed).__name__}")
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise InputError("q: expected a tensor [B, Hq, d]")
    batch, hq, d = q.shape
    if batch != kv.batch or d != kv.head_dim or hq % kv.num_kv_heads:
        raise InputError(
            f"q: shape {tuple(q.shape)} does not fit the cache "
            f"(B={kv.batch}, Hkv={kv.num_kv_heads}, d={kv.head_dim})"
        )
    if q.dtype not in KERNEL_DTYPES or kv.dtype not in KERNEL_DTYPES:
        raise InputError(
            f"q/kv: dtypes {q.dtype}/{kv.dtype} not supported by the kernel "
            "(bf16, fp16, fp32; use santa_kernels.santapp for float64)"
        )
    if d < 16:
        raise InputError(f"q: head dim must be >= 16 for the kernel, got {d}")
    if hq // kv.num_kv_heads > MAX_GROUP:
        raise InputError(f"q: GQA group of {hq // kv.num_kv_heads} heads (at most {MAX_GROUP})")
    if q.stride(-1) != 1 or kv.k.stride(-1) != 1 or kv.k.stride() != kv.v.stride():
        raise InputError("q/k/v: the head dim must be contiguous and K, V share strides")
    if q.device != kv.device:
        raise InputError(f"q: on {q.device}, the cache is on {kv.device}")
    if (packed.batch, packed.num_kv_heads, packed.head_dim) != (kv.batch, kv.num_kv_heads, d):
        raise InputError(
            f"packed: built for B={packed.batch}, Hkv={packed.num_kv_heads}, "
            f"d={packed.head_dim}; the cache has B={kv.batch}, Hkv={kv.num_kv_heads}, d={d}"
        )
    reps_dtype = kv.dtype if packed.reps_scale is None else torch.int8
    if packed.reps.device != kv.device or packed.reps.dtype != reps_dtype:
        raise InputError("packed: not on the cache's device or in its dtype (pack it again)")
    M = teams_selected(check_positive_int(M, "M"), packed)
    if workspace is not None:
        if not isinstance(workspace, SantaPPWorkspace):
            raise InputError("workspace: expected a SantaPPWorkspace")
        p = workspace.plan
        shape = (p.batch, p.num_q_heads, p.num_kv_heads, p.head_dim, p.max_teams, p.M)
        if shape != (batch, hq, kv.num_kv_heads, d, packed.max_teams, M):
            raise InputError(
                f"workspace: planned for (B, Hq, Hkv, d, T, M) = {shape}, got "
                f"{(batch, hq, kv.num_kv_heads, d, packed.max_teams, M)}"
            )
        if workspace.device != q.device:
            raise InputError(f"workspace: on {workspace.device}, inputs on {q.device}")
        if p.slot * p.chunks < packed.max_team_len:
            raise InputError("workspace: planned for shorter teams (pack changed)")
    return M


# the profiling cuts _launch takes besides STAGES (timing only: the outputs are wrong)
PROFILE_STAGES = ("score", "no-union", "no-search")


def _launch(q, kv, packed, M, ws, tau, seed, gumbels, stages,
            pdl_chain: bool = False) -> torch.Tensor:
    """Launches the call's kernels (``stages``: a subset of :data:`STAGES`, for profiling;
    the output is only meaningful with all of them; ``("score",)`` runs the select kernel
    without finishing the selection; ``"no-union"`` added: the finisher does not write the
    union (or the head lists), ``"no-search"``: nor does it search kappa (profiling: wrong
    outputs); ``pdl_chain``: see
    :func:`santapp_decode`). Returns the output buffer."""
    p = ws.plan
    batch, hq, d = q.shape
    hkv = kv.num_kv_heads
    precision = _dot_precision(kv.dtype)
    d_pad = _next_pow2(d)
    can_pdl = pdl_available(q.device)
    pdl = can_pdl and bool(HOPPER.get("pdl")) and batch * hkv <= HOPPER["pdl_max_groups"]
    dep = {"launch_pdl": True} if pdl else {}  # kernels after the first
    # select -> finish -> attend as programmatic dependents even where the merge is not
    before_merge = HOPPER.get("pdl_before_merge")
    if before_merge == "int8":
        before_merge = packed.reps_format == "int8"
    early = pdl or (can_pdl and bool(before_merge))
    dep_early = {"launch_pdl": True} if early else {}
    chain = pdl_chain and can_pdl
    pooled = p.draw == "pooled"
    lists = p.head_lists and "score" not in stages
    # the profiling stages "no-union" / "no-search" time the search's parts
    stages_full = "no-union" not in stages and "no-search" not in stages
    # the group's last select program finishes (not while profiling the finisher's parts)
    fused = p.fused_finish and "score" not in stages and stages_full
    if "score" in stages:  # profiling: the select kernel alone, without its finisher
        stages = (*stages, "select")
    if "select" in stages:
        _select_kernel[(p.num_splits, batch * hkv)](
            q, packed.reps, packed.log_n,
            packed.reps_scale if packed.reps_scale is not None else packed.log_n,
            gumbels if gumbels is not None else ws.phi, ws.rng,
            (ws.seed if seed is None else int(seed)) & 0xFFFFFFFF,
            ws.phi, ws.z, ws.cand_z, ws.cand_id, ws.split_kth, ws.union,
            ws.kappa, ws.count, ws.ticket, ws.pool_kappa, ws.pool_w,
            tau, M, p.num_splits, p.n_cand, p.max_teams, p.union_cap, q.stride(0), q.stride(1),
            NUM_KV_HEADS=hkv, GROUP=p.group, HEAD_DIM=d, D_PAD=d_pad, G_PAD=p.g_pad,
            G_ROWS=p.g_rows, TB=p.teams_per_split, M1_PAD=p.m1_pad,
            LOCAL=p.local, HAS_GUMBELS=gumbels is not None,  # pooled: the fused draw's
            DOT_PRECISION=precision, PDL=early, ENTRY_PDL=chain,
            REPS_AS=_REPS_AS[kv.dtype] if packed.reps_scale is not None else "",
            BRACKET=p.bracket, HEAD_LISTS=lists, TOPS=lists and p.compact > 0, num_stages=1,
            num_warps=p.score_warps, **({"POOLED": True} if pooled else {}),
            **({"FINISH": True, "C_PAD": p.c_pad, "S_PAD": p.s_pad,
                "WAYS": p.finish_ways if pooled else p.search_ways} if fused else {}),
            **({"launch_pdl": True} if chain else {}),
        )  # fmt: skip
    # the finishing kernel, unless the select kernel finished the selection (or drew the
    # pooled teams)
    if not fused and "select" in stages and "score" not in stages:
        if pooled:
            _pool_kernel[(batch * hkv,)](
                ws.phi, gumbels if gumbels is not None else ws.phi, ws.rng,
                (ws.seed if seed is None else int(seed)) & 0xFFFFFFFF,
                ws.kappa, ws.pool_kappa, ws.union, ws.count, ws.pool_w, M, p.max_teams,
                p.union_cap,
                NUM_KV_HEADS=hkv, GROUP=p.group, G_ROWS=p.g_rows, C_PAD=p.c_pad,
                HAS_GUMBELS=gumbels is not None, WAYS=p.finish_ways, PDL=early,
                num_warps=p.finish_warps, num_stages=1, **dep_early,
            )  # fmt: skip
        elif p.finish_heads:
            _finish_heads_kernel[(batch * hkv, p.finish_parts)](
                ws.z, ws.cand_z, ws.cand_id, ws.split_kth, ws.kappa, ws.union, ws.count, ws.ticket,
                ws.scratch_key, ws.scratch_id,
                M, p.num_splits, p.n_cand, p.max_teams, p.union_cap, p.finish_parts,
                NUM_KV_HEADS=hkv, GROUP=p.group, G_ROWS=p.g_rows, H_ROWS=p.h_rows, C_PAD=p.c_pad,
                S_PAD=p.s_pad, LOCAL=p.local, WAYS=p.finish_ways, PDL=early,
                num_warps=p.finish_warps, num_stages=1, WRITE_UNION="no-union" not in stages,
                SEARCH="no-search" not in stages, BRACKET=p.bracket, HEAD_LISTS=lists,
                COMPACT=p.compact if lists and stages_full else 0, TOPS_PAD=p.tops_pad,
                **dep_early,
            )  # fmt: skip
        else:
            _finish_kernel[(batch * hkv,)](
                ws.z, ws.cand_z, ws.cand_id, ws.split_kth, ws.kappa, ws.union, ws.count,
                M, p.num_splits, p.n_cand, p.max_teams, p.union_cap,
                NUM_KV_HEADS=hkv, GROUP=p.group, G_ROWS=p.g_rows, C_PAD=p.c_pad, S_PAD=p.s_pad,
                LOCAL=p.local, WAYS=p.search_ways, PDL=early, BRACKET=p.bracket,
                num_warps=p.finish_warps, num_stages=1, **dep_early,
            )  # fmt: skip
    paged = kv.layout == "paged"
    table = kv.page_table if paged else kv.lengths
    packed_k = packed.packed_k if packed.packed_k is not None else kv.k
    packed_v = packed.packed_v if packed.packed_v is not None else kv.v
    packed_rows = int(packed.packed_k.shape[2]) if packed.packed_k is not None else 0
    out = ws.out(q.dtype)
    atomic = p.merge_atomic and "merge" in stages  # the attend programs merge
    ticket = p.merge_ticket and not atomic and "merge" in stages  # their last one merges
    if "attend" in stages:
        _attend_kernel[(batch * hkv, p.num_parts)](
            q, kv.k, kv.v, packed_k, packed_v, kv.lengths, table,
            packed.team_start, packed.team_len, packed.team_end,
            ws.z, ws.phi, ws.kappa, ws.union, ws.count, ws.pool_w,
            ws.part_m, ws.part_l, ws.part_o, ws.sum_l, ws.sum_o, ws.attend_ticket, out, ws.rng,
            tau, packed.sink, packed.team_size, p.max_teams, p.union_cap, packed_rows,
            p.num_parts, p.team_programs, p.exact_programs, M,
            q.stride(0), q.stride(1), kv.k.stride(0), kv.k.stride(1), kv.k.stride(2),
            table.stride(0) if paged else 0, kv.page_size if paged else 1,
            out.stride(0), out.stride(1),
            NUM_KV_HEADS=hkv, GROUP=p.group, HEAD_DIM=d, D_PAD=d_pad, G_PAD=p.g_pad,
            TPB=p.teams_per_block, SLOT=p.slot, CHUNKS=p.chunks, BLOCK_E=p.exact_rows,
            PACKED=packed.packed_k is not None, PAGED=paged, REGULAR=packed.regular,
            DOT_PRECISION=precision, PDL=early, HEAD_LISTS=lists,
            MERGE_ATOMIC=atomic, BLOCK_S=p.merge_block, LET_NEXT=(atomic or ticket) and chain,
            **({"LOOPS": p.loops, "ATTEND_STAGES": p.attend_stages,
                "PRELOAD": p.attend_preload, "L_PAD": _next_pow2(p.loops)}
               if p.loops > 1 else {}),
            **({"POOLED": True} if pooled else {}),
            **({"MERGE_TICKET": True} if ticket else {}),
            num_warps=HOPPER["attend_warps"], num_stages=1,
            **dep_early,
        )  # fmt: skip
    if "merge" in stages and not atomic and not ticket:
        _merge_kernel[(batch * hq,)](
            ws.part_m, ws.part_l, ws.part_o, out, ws.rng,
            p.num_parts, out.stride(0), out.stride(1),
            NUM_KV_HEADS=hkv, GROUP=p.group, HEAD_DIM=d, D_PAD=d_pad,
            BLOCK_S=p.merge_block, PDL=pdl, LET_NEXT=chain and not pdl,
            num_warps=p.merge_warps, **dep,
        )  # fmt: skip
    return out


def santapp_decode(
    q: torch.Tensor,
    kv: KVCache,
    packed: PackedTeams,
    M: int,
    *,
    scale: float | None = None,
    seed: int | None = None,
    gumbels: torch.Tensor | None = None,
    workspace: SantaPPWorkspace | None = None,
    pdl_chain: bool = False,
    draw: str | None = None,
    stages: tuple[str, ...] = STAGES,
) -> tuple[torch.Tensor, SantaPPInfo]:
    """Returns ``(out [B, Hq, d] in q.dtype, info)``: one SANTA++ decode step (section 6,
    gumbel-topk, exact set = the pack's). ``draw`` (``head`` or ``pooled``; None: the
    workspace's, else ``head``): how a GQA group's heads draw their teams, as
    ``santapp_attention``'s. ``gumbels [B, Hq, T]`` (``[B, Hkv, T]`` with
    ``draw=pooled``) replaces the Philox
    Gumbel noise (tests). With a ``workspace`` the call allocates nothing
    and never synchronises (CUDA-graph capturable). ``pdl_chain``: the call sits between
    kernels that launch as programmatic dependents (the e2e step's gemm rest): where
    :func:`pdl_available`, its first kernel launches as a dependent of the kernel before
    and loads the representatives before waiting for it, and its last lets the next kernel
    launch early (no effect elsewhere). ``stages`` (profiling; outputs meaningful only with
    the default :data:`STAGES`): the launches to run, a subset of :data:`STAGES` and
    :data:`PROFILE_STAGES` (``("score",)``: the select kernel without finishing the
    selection; ``("select", "attend")``: no merge)."""
    if stages is not STAGES and (not stages or not set(stages) <= {*STAGES, *PROFILE_STAGES}):
        raise InputError(f"stages: expected some of {STAGES + PROFILE_STAGES}, got {stages!r}")
    M = _check_call(q, kv, packed, M, workspace)  # at most the tables' team count
    if draw is None:
        draw = workspace.plan.draw if workspace is not None else "head"
    ws = workspace or SantaPPWorkspace.for_inputs(q, kv, packed, M, draw=draw)
    p = ws.plan
    if draw != p.draw:
        raise InputError(f"workspace: planned for draw={p.draw}, got draw={draw}")
    batch, hq, d = q.shape
    hkv = kv.num_kv_heads
    tau = check_scale(scale, d)
    if gumbels is not None:
        rows = hkv if draw == "pooled" else hq
        if tuple(gumbels.shape) != (batch, rows, p.max_teams):
            raise InputError(
                f"gumbels: expected shape {(batch, rows, p.max_teams)}, got "
                f"{tuple(gumbels.shape)}"
            )
        gumbels = gumbels.to(device=q.device, dtype=torch.float32).contiguous()
    out = _launch(q, kv, packed, M, ws, tau, seed, gumbels, tuple(stages), pdl_chain)
    info = SantaPPInfo(
        M=M,
        packed=packed,
        z=ws.z.view(batch, hq, p.max_teams),
        phi=ws.phi.view(batch, hq, p.max_teams),
        kappa=ws.kappa.view(batch, hq),
        union=ws.union.view(batch, hkv, p.union_cap),
        count=ws.count.view(batch, hkv),
        lengths=kv.lengths,
        head_lists=p.head_lists,
        draw=p.draw,
        pool_w=ws.pool_w.view(batch, hkv, -1) if p.draw == "pooled" else None,
        pool_kappa=ws.pool_kappa.view(batch, hkv) if p.draw == "pooled" else None,
    )
    return out, info


__all__ = [
    "PackedTeams",
    "SantaPPInfo",
    "SantaPPPlan",
    "SantaPPWorkspace",
    "build_packed",
    "check_scheme",
    "make_plan",
    "pack_teams",
    "reads_every_team",
    "santapp_decode",
    "santapp_triton_available",
    "time_index_build",
]
