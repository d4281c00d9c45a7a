"""SANTA++ Triton kernels: the launch plan of a call shape and its workspace.

:func:`make_plan` fixes every static launch choice (splits, local or direct selection,
finisher, attend tiling, merge); :class:`SantaPPWorkspace` holds the buffers a plan needs.
The design is in :mod:`santa_kernels.triton_santapp`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from santa_kernels.kv import KVCache
from santa_kernels.santapp import KERNEL_DRAWS
from santa_kernels.triton_launch import _sm_count
from santa_kernels.triton_santapp_common import (
    FINISH_CAP,
    FINISH_MAX_SCALE,
    H200_SM_COUNT,
    HOPPER,
    MAX_TEAMS_PER_SPLIT,
    PROGRAMS_PER_SM,
    _next_pow2,
)
from santa_kernels.triton_santapp_pack import PackedTeams
from santa_kernels.validate import InputError, check_positive_int


# --------------------------------------------------------------------- planning
@dataclass(frozen=True)
class SantaPPPlan:
    """Launch geometry of one call shape (everything static: no device values)."""

    batch: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    max_teams: int
    M: int
    group: int
    g_pad: int  # dot rows (>= 16)
    g_rows: int  # finisher rows (next_pow2(G))
    teams_per_split: int  # TB
    num_splits: int
    local: bool  # candidates per split (True) or the finisher reads every z (False)
    n_cand: int  # candidates per head the finisher reads
    c_pad: int
    m1_pad: int
    s_pad: int
    slot: int  # rows per team per chunk (power of two)
    chunks: int  # chunks per team
    teams_per_block: int  # TPB teams per attend program
    union_cap: int
    team_programs: int  # attend programs per (b, kv head) over the union list
    exact_programs: int
    exact_rows: int  # BLOCK_E
    num_parts: int
    select_warps: int  # the finisher's warps unless finish_warps is given
    score_warps: int  # the select kernel's warps
    search_ways: int  # thresholds per step of the finisher's kth-largest search (4 or 8)
    bracket: int  # j > 0: select programs leave each split's j-th largest z (search bracket)
    head_lists: bool  # the per-head finisher writes M slots a head, no union step
    compact: int  # CAP > 0: the finisher ranks <= CAP compacted keys instead of searching
    tops_pad: int  # next_pow2(bracket * splits): the split tops the compact finisher reads
    finish_heads: int  # heads per finishing program (0: one program per KV group)
    h_rows: int  # rows of a per-head finishing program (next_pow2(finish_heads))
    finish_parts: int  # finishing programs per KV group (per-head finisher)
    finish_warps: int
    finish_ways: int
    merge_block: int  # partials per merge step
    merge_warps: int
    merge_atomic: bool = False  # the attend programs merge (atomic sums + ticket)
    # without merge_atomic, an option (HOPPER's default: off, the merge kernel runs): the
    # group's last attend program merges the partials (no merge kernel; the merge kernel's
    # output to the bit)
    merge_ticket: bool = False
    loops: int = 1  # tiles of TPB teams per team program
    attend_stages: int = 1  # software-pipeline depth of a team program's tile loop (loops > 1)
    attend_preload: bool = False  # a team program loads its list entries before its loop
    # head: each query head its own M teams; pooled: one draw of M a (sequence, KV head)
    # from the heads' mean probabilities (the pool kernel finishes it, the list holds M
    # teams a group with their shared 1/pi)
    draw: str = "head"
    # an option of direct selection (HOPPER's default: off, the finisher or pool kernel
    # runs): the group's last select program finishes the selection (kappa, head lists
    # without duplicates, or the union; draw=pooled: the pool's draw), no finisher launch
    fused_finish: bool = False


def make_plan(
    batch: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    max_teams: int,
    M: int,
    max_team_len: int,
    exact_max: int,
    sms: int = H200_SM_COUNT,
    *,
    teams_per_split: int | None = None,
    local: bool | None = None,
    teams_per_block: int | None = None,
    exact_programs: int | None = None,
    finish_heads: int | None = None,
    finish_warps: int | None = None,
    bracket: bool | None = None,
    head_lists: bool | None = None,
    compact: bool | None = None,
    merge_atomic: bool | None = None,
    merge_ticket: bool | None = None,
    attend_loops: int | None = None,
    attend_stages: int | None = None,
    attend_preload: bool | None = None,
    kv_element_size: int = 2,
    draw: str = "head",
    fused_finish: bool | None = None,
) -> SantaPPPlan:
    """Plans the grids (keyword overrides are for tests and tuning). K/V tiles keep their
    byte size: 4-byte K/V and d > 128 halve the rows a program loads at once. ``draw``
    (:data:`santa_kernels.santapp.KERNEL_DRAWS`): ``pooled`` scores directly (no local
    candidates, bracket or head lists) and lists ``M`` teams a (sequence, KV head)."""
    if draw not in KERNEL_DRAWS:
        raise InputError(f"draw: the SANTA++ kernel implements {KERNEL_DRAWS}, got {draw!r} "
                         "(union is reference-only: santa_kernels.santapp)")
    pooled = draw == "pooled"
    group = num_q_heads // num_kv_heads
    g_rows = max(2, _next_pow2(group))
    if batch * num_q_heads * max_teams >= 2**31:
        raise InputError("q: B * Hq * teams must stay below 2**31 (int32 offsets)")
    if pooled:  # the pool kernel holds one row of every team's key per (sequence, KV head)
        if _next_pow2(max_teams) > FINISH_MAX_SCALE * FINISH_CAP:
            raise InputError(f"draw=pooled: at most {FINISH_MAX_SCALE * FINISH_CAP} teams a "
                             f"(sequence, KV head) in the kernel, got {max_teams}")
        local, bracket, head_lists, compact, finish_heads = False, False, False, False, 0
    bkv = batch * num_kv_heads
    m1 = M + 1
    target = PROGRAMS_PER_SM * sms
    if local is None:  # the direct finisher's union step holds G_ROWS x next_pow2(T) keys
        local = g_rows * _next_pow2(max_teams) > FINISH_MAX_SCALE * FINISH_CAP
    if teams_per_split is None:
        if not local:
            wanted = max(1, -(-target // bkv))
            cap = HOPPER["select_teams_many"] if bkv >= HOPPER["many_groups"] else 256
            teams_per_split = min(cap, max(16, _next_pow2(-(-max_teams // wanted))))
        else:
            teams_per_split = max(64, _next_pow2(2 * m1))
            while (
                teams_per_split < MAX_TEAMS_PER_SPLIT
                and g_rows * _next_pow2(-(-max_teams // teams_per_split) * m1) > FINISH_CAP
            ):
                teams_per_split *= 2
    tb = teams_per_split
    if tb < 16 or tb & (tb - 1):
        raise InputError(f"teams_per_split: must be a power of two >= 16, got {tb}")
    if local and tb < m1:
        raise InputError(f"teams_per_split: {tb} is below M+1 = {m1} (local mode)")
    splits = -(-max_teams // tb)
    n_cand = splits * m1 if local else max_teams
    shrink = max(1, kv_element_size // 2)
    rows_cap = (128 if head_dim <= 128 else 32) // shrink
    slot = min(_next_pow2(max_team_len), rows_cap)
    chunks = -(-max_team_len // slot)
    union_cap = min(M if pooled else group * M, max_teams)
    block_rows = HOPPER["attend_rows"][min(HOPPER["attend_rows"], key=lambda k: abs(k - head_dim))]
    block_rows = max(16, block_rows // shrink)
    if teams_per_block is None:
        tpb = max(1, block_rows // slot)
        least = max(1, 16 // slot)  # tl.dot needs >= 16 rows
        while tpb > least and bkv * -(-union_cap // tpb) < sms:  # >= 1 program per SM
            tpb //= 2
        teams_per_block = max(tpb, least)
    if teams_per_block * slot < 16 or teams_per_block & (teams_per_block - 1):
        raise InputError(
            f"teams_per_block: must be a power of two with teams_per_block * {slot} >= 16"
        )
    exact_rows = HOPPER["exact_rows"][min(HOPPER["exact_rows"], key=lambda k: abs(k - head_dim))]
    exact_rows = max(16, exact_rows // shrink)
    if exact_programs is None:
        exact_programs = min(8, max(1, -(-exact_max // exact_rows)))
    check_positive_int(exact_programs, "exact_programs")
    if attend_preload is None:
        attend_preload = HOPPER["attend_preload"]
    # one team a tile only: with several, z/phi stay in the loop, staged too (94 KB), and
    # the preload measured slower (32k B=8 P=16 58.6 -> 68.7-220 us; H200, 2026-12-04,
    # results/h200/tune-2026-12-04-s26)
    attend_preload = bool(attend_preload) and teams_per_block == 1
    if attend_preload and slot > block_rows:
        # a pipelined K/V tile keeps its byte size (two 128-row buffers: one program an SM)
        slot = block_rows
        chunks = -(-max_team_len // slot)
    max_loops = HOPPER["attend_preload_max_loops" if attend_preload else "attend_max_loops"]
    if attend_loops is None:  # fewer, longer team programs while the grid stays full
        per_sm = HOPPER["attend_loop_programs_per_sm"]
        attend_loops = 1
        while (per_sm and attend_loops < max_loops
               and bkv * (-(-union_cap // (teams_per_block * attend_loops * 2)) + exact_programs)
               >= per_sm * sms):
            attend_loops *= 2
    check_positive_int(attend_loops, "attend_loops")
    team_programs = -(-union_cap // (teams_per_block * attend_loops))
    if attend_stages is None:
        attend_stages = HOPPER["attend_stages"]
        if attend_preload and attend_loops > 1:  # deeper for short walks
            short = attend_loops <= HOPPER["attend_preload_deep_max_loops"]
            attend_stages = HOPPER["attend_preload_deep_stages" if short
                                   else "attend_preload_stages"]
    check_positive_int(attend_stages, "attend_stages")
    c_pad = _next_pow2(n_cand)
    select_warps = (
        HOPPER["select_warps_large"] if g_rows * c_pad > 2048 else HOPPER["select_warps_small"]
    )
    keys_per_thread = g_rows * c_pad // (32 * select_warps)
    search_ways = 8 if keys_per_thread <= HOPPER["search_8way_keys_per_thread"] else 4
    if finish_heads is None:
        finish_heads = HOPPER["finish_heads"]
    if finish_heads < 0:
        raise InputError(f"finish_heads: must be >= 0, got {finish_heads}")
    h_rows = _next_pow2(min(finish_heads, group)) if finish_heads else g_rows
    finish_parts = -(-group // h_rows) if finish_heads else 1
    if finish_warps is None:
        finish_warps = select_warps  # the union step holds G x C_PAD keys either way
        if pooled:  # the pool kernel's search holds one row of C_PAD keys
            finish_warps = HOPPER["select_warps_large" if c_pad > 2048 else "select_warps_small"]
    check_positive_int(finish_warps, "finish_warps")
    search_rows = 1 if pooled else h_rows
    finish_ways = (
        8 if search_rows * c_pad // (32 * finish_warps) <= HOPPER["search_8way_keys_per_thread"]
        else 4
    )
    if bracket is None:
        bracket = HOPPER["bracket"]
    rank = -(-m1 // splits)  # j * splits >= M+1 > (j - 1) * splits
    bracket_rank = rank if bracket and not local and rank <= 3 and max_teams >= m1 else 0
    if head_lists is None:
        head_lists = HOPPER["head_lists"]
    head_lists = bool(head_lists) and finish_heads > 0 and union_cap == group * M
    if fused_finish is None:
        fused_finish = HOPPER["fused_finish"]
    # pooled: while the pool's one row of keys keeps the select kernel's warps (<= 2048)
    fused_finish = bool(fused_finish) and not local and (
        not pooled or c_pad <= HOPPER["fused_pool_max_teams"])
    if compact is None:
        compact = HOPPER["compact"]
    compact = compact and not fused_finish  # the fused finisher searches
    compact_cap = 0
    if compact and bracket_rank and head_lists and h_rows == 1:
        compact_cap = max(16, _next_pow2(math.ceil(HOPPER["compact_slack"] * m1)))
        compact_cap = compact_cap if compact_cap <= HOPPER["compact_max_cap"] else 0
    score_warps = (HOPPER["score_warps_many"] if not local and bkv >= HOPPER["many_groups"]
                   else HOPPER["score_warps_few"])
    if fused_finish:  # the last select program holds the group's G_ROWS x C_PAD keys
        score_warps = max(score_warps, finish_warps if pooled else select_warps)
    num_parts = team_programs + exact_programs
    merge_atomic = bool(
        HOPPER["merge_atomic"] and bkv <= HOPPER["merge_atomic_max_groups"]
        if merge_atomic is None else merge_atomic
    )
    merge_ticket = not merge_atomic and bool(
        HOPPER["merge_ticket"] if merge_ticket is None else merge_ticket)
    merge_block = min(HOPPER["merge_block"], max(2, _next_pow2(num_parts)))
    merge_warps = HOPPER["merge_warps"] * (2 if merge_block * _next_pow2(head_dim) >= 4096 else 1)
    return SantaPPPlan(
        batch=batch,
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        max_teams=max_teams,
        M=M,
        group=group,
        g_pad=max(16, _next_pow2(group)),
        g_rows=g_rows,
        teams_per_split=tb,
        num_splits=splits,
        local=local,
        n_cand=n_cand,
        c_pad=c_pad,
        m1_pad=_next_pow2(m1),
        s_pad=max(2, _next_pow2(splits)),
        slot=slot,
        chunks=chunks,
        teams_per_block=teams_per_block,
        union_cap=union_cap,
        team_programs=team_programs,
        exact_programs=exact_programs,
        exact_rows=exact_rows,
        num_parts=num_parts,
        select_warps=select_warps,
        score_warps=score_warps,
        search_ways=search_ways,
        bracket=bracket_rank,
        head_lists=head_lists,
        compact=compact_cap,
        tops_pad=max(2, _next_pow2(bracket_rank * splits)),
        finish_heads=finish_heads,
        h_rows=h_rows,
        finish_parts=finish_parts,
        finish_warps=finish_warps,
        finish_ways=finish_ways,
        merge_block=merge_block,
        merge_warps=merge_warps,
        merge_atomic=merge_atomic,
        merge_ticket=merge_ticket,
        loops=attend_loops,
        attend_stages=attend_stages,
        attend_preload=attend_preload,
        draw=draw,
        fused_finish=fused_finish,
    )


# -------------------------------------------------------------------- workspace
class SantaPPWorkspace:
    """Every buffer one SANTA++ call needs, allocated once for a :class:`SantaPPPlan`.

    Holds the Philox ``seed`` and the device step counter ``rng`` (advanced by the call's
    last kernel). Outputs are views of the workspace: the next call overwrites them.
    """

    def __init__(
        self, plan: SantaPPPlan, *, device: torch.device | str = "cuda", seed: int = 0
    ) -> None:
        self.plan = plan
        self.device = torch.device(device)
        self.seed = int(seed)
        p = plan
        rows = p.batch * p.num_q_heads
        bkv = p.batch * p.num_kv_heads
        f32 = {"dtype": torch.float32, "device": self.device}
        i32 = {"dtype": torch.int32, "device": self.device}
        self.phi = torch.empty(rows, p.max_teams, **f32)
        self.z = torch.empty(rows, p.max_teams, **f32)
        cand = rows * p.n_cand if p.local else 1
        self.cand_z = torch.empty(cand, **f32)
        self.cand_id = torch.empty(cand, **i32)
        # the splits' BRACKET-th largest z (plane 0); with compact also their larger ones
        planes = p.bracket if p.compact else 1
        self.split_kth = torch.empty(
            rows * p.num_splits * planes if p.local or p.bracket else 1, **i32
        )
        self.scratch_key = torch.empty(max(1, rows * p.compact), **i32)  # compacted keys
        self.scratch_id = torch.empty(max(1, rows * p.compact), **i32)
        self.ticket = torch.zeros(bkv, **i32)
        # the atomic merge's per-head sums and per-group tickets (zeroed by each group's
        # last attend program for the next call)
        self.sum_l = torch.zeros(rows if p.merge_atomic else 1, **f32)
        self.sum_o = torch.zeros(rows * p.head_dim if p.merge_atomic else 1, **f32)
        self.attend_ticket = torch.zeros(bkv if p.merge_atomic or p.merge_ticket else 1, **i32)
        self.kappa = torch.empty(rows, **f32)
        self.union = torch.zeros(bkv, p.union_cap, **i32)  # entries always team ids
        self.count = torch.zeros(bkv, **i32)
        # draw=pooled: the listed teams' shared 1/pi and each group's kappa
        pooled = p.draw == "pooled"
        self.pool_w = torch.zeros(bkv * p.union_cap if pooled else 1, **f32)
        self.pool_kappa = torch.empty(bkv if pooled else 1, **f32)
        self.part_m = torch.empty(rows * p.num_parts, **f32)
        self.part_l = torch.empty(rows * p.num_parts, **f32)
        self.part_o = torch.empty(rows * p.num_parts * p.head_dim, **f32)
        self.rng = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._out: dict[torch.dtype, torch.Tensor] = {}

    @classmethod
    def for_inputs(
        cls, q: torch.Tensor, kv: KVCache, packed: PackedTeams, M: int, *, seed: int = 0, **plan_kw
    ) -> SantaPPWorkspace:
        """Returns a workspace planned for exactly this call shape."""
        plan = _plan_for(q, kv, packed, M, **plan_kw)
        return cls(plan, device=q.device, seed=seed)

    def reset_rng(self, step: int = 0, seed: int | None = None) -> None:
        """Sets the device step counter (and optionally the seed): replays a run exactly."""
        self.rng.fill_(step)
        self.ticket.zero_()
        self.attend_ticket.zero_()
        self.sum_l.zero_()
        self.sum_o.zero_()
        if seed is not None:
            self.seed = int(seed)

    def out(self, dtype: torch.dtype) -> torch.Tensor:
        if dtype not in self._out:
            p = self.plan
            self._out[dtype] = torch.empty(
                p.batch, p.num_q_heads, p.head_dim, dtype=dtype, device=self.device
            )
        return self._out[dtype]


def teams_selected(M: int, packed: PackedTeams) -> int:
    """The ``M`` a call plans for: at most the tables' team count ``T``. A (sequence, KV
    head) with ``M`` teams or fewer reads every one of them (``pi = 1``: exact there), so
    ``M`` above ``T`` selects what ``T`` does."""
    return min(M, packed.max_teams)


def reads_every_team(M: int, packed: PackedTeams) -> bool:
    """Whether a call with ``M`` reads every team of every (sequence, KV head): ``M`` at or
    above the tables' team count. Such a call is dense attention (exact everywhere), which a
    dense decode kernel computes faster than the selection's kernels; callers that want
    the output alone may run one instead."""
    return packed.max_teams <= M


def _plan_for(q, kv, packed: PackedTeams, M: int, **plan_kw) -> SantaPPPlan:
    M = teams_selected(M, packed)
    sms = _sm_count(q.device)
    return make_plan(
        q.shape[0],
        q.shape[1],
        kv.num_kv_heads,
        kv.head_dim,
        packed.max_teams,
        M,
        packed.max_team_len,
        packed.exact_max,
        sms,
        kv_element_size=kv.k.element_size(),
        **plan_kw,
    )
