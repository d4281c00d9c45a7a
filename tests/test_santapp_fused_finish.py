"""SANTA++ kernel: the group's last select program finishes the selection (no finisher
launch) and writes head lists without duplicates, against the finisher kernel.

Run on the CPU through Triton's interpreter at small shapes, with fixed noise: the same
kappas, teams and weights as the per-head finisher, outputs equal within fp tolerance,
each team of a group listed once (in its first selecting head's list).
"""

import itertools
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
from test_triton_santapp import _compare, _gumbels, _problem

import santa_kernels.triton_santapp as tsp
from santa_kernels.santapp import build_team_index
from santa_kernels.triton_santapp import (
    SantaPPWorkspace,
    make_plan,
    pack_teams,
    santapp_decode,
    santapp_triton_available,
)
from santa_kernels.triton_santapp_common import HOPPER

pytestmark = [pytest.mark.skipif(not santapp_triton_available()[0], reason="no Triton backend"),
              pytest.mark.usefixtures("one_thread")]


def _run(q, kv, packed, M, gumbels, fused, **plan):
    workspace = SantaPPWorkspace.for_inputs(q, kv, packed, M, teams_per_split=16, local=False,
                                            fused_finish=fused, **plan)
    assert workspace.plan.fused_finish == fused
    # the fused finisher searches; the finisher kernel compacts where it can
    assert (workspace.plan.compact > 0) == (not fused and workspace.plan.head_lists
                                            and workspace.plan.bracket > 0)
    out, info = santapp_decode(q, kv, packed, M, gumbels=gumbels, workspace=workspace)
    return workspace, out.clone(), info


def _lists(info, M):
    return info.union.view(*info.union.shape[:2], -1, M).cpu()


@pytest.mark.parametrize(("case", "lengths", "M", "plan"), [
    # against the per-head finisher's compaction (bracket 1, 2, 3)
    ("random", [330, 271], 7, {}),
    ("random", [330, 271], 3, {}),  # each split's largest
    ("random", [330, 271], 13, {}),
    ("short", [330, 90], 7, {}),  # the short row's late splits hold -inf only
    ("ties", [330, 271], 7, {}),  # q = 0 and integer noise: z ties everywhere
    ("flat", [330, 271], 7, {}),  # every z equal
    ("random", [330, 271], 7, {"bracket": False}),  # the search from the row's keys
    ("random", [330, 271], 7, {"head_lists": False}),  # the group's union and its count
    ("short", [330, 90], 13, {"head_lists": False, "bracket": False}),
])
def test_fused_finish_selects_as_the_finisher_kernel(case, lengths, M, plan):
    flat = case in ("ties", "flat")
    q, kv = _problem(heads=4, n=330, d=32, lengths=lengths, q_scale=0.0 if flat else 2.0,
                     dtype=torch.float32)
    packed = pack_teams(kv, build_team_index(kv, team_size=4, sink=2, exact_recent=3))
    gumbels = _gumbels(q.shape[0], q.shape[1], packed.max_teams, 5)
    if case == "ties":
        gumbels = gumbels.round()
    elif case == "flat":
        gumbels = torch.zeros_like(gumbels)
    ws, out, info = _run(q, kv, packed, M, gumbels, True, **plan)
    _, ref_out, ref = _run(q, kv, packed, M, gumbels, False, **plan)
    assert torch.equal(info.kappa, ref.kappa)
    assert torch.equal(info.selected(), ref.selected())
    assert torch.equal(info.team_weights(), ref.team_weights())
    assert info.union_sets() == ref.union_sets()
    assert torch.equal(info.read_counts().v_rows, ref.read_counts().v_rows)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert not ws.ticket.any() and int(ws.rng) == 1  # ready for the next call
    if not ws.plan.head_lists:  # the union in team order, as the finisher kernel's
        count = ref.count.cpu()
        assert torch.equal(info.count.cpu(), count)
        used = torch.arange(info.union.shape[-1]) < count[..., None]
        assert torch.equal(torch.where(used, info.union.cpu(), -1),
                           torch.where(used, ref.union.cpu(), -1))
        return
    # each head's list: the teams it selected that no earlier head of its group did,
    # in team order, -1 after them
    chosen = info.selected().cpu()
    chosen = chosen.view(kv.batch, kv.num_kv_heads, -1, chosen.shape[-1])
    earlier = (chosen.long().cumsum(2) - chosen.long()) > 0
    lists = _lists(info, M)
    for b in range(kv.batch):
        for h in range(kv.num_kv_heads):
            for g in range(chosen.shape[2]):
                teams = torch.nonzero(chosen[b, h, g] & ~earlier[b, h, g]).flatten().tolist()
                assert lists[b, h, g].tolist() == teams + [-1] * (M - len(teams))


def test_a_group_lists_each_team_once():
    """Teams several heads of a group select sit in one list only: the attend programs
    load each once (the per-head finisher lists them in every selecting head's list)."""
    q, kv = _problem(heads=4, n=330, d=32, lengths=[330, 271], q_scale=2.0,
                     dtype=torch.float32)
    packed = pack_teams(kv, build_team_index(kv, team_size=4, sink=2, exact_recent=3))
    gumbels = _gumbels(q.shape[0], q.shape[1], packed.max_teams, 5)
    _, _, info = _run(q, kv, packed, 13, gumbels, True)
    entries = info.union.cpu()
    listed = (entries >= 0).sum(-1)
    union = torch.tensor([[len(teams) for teams in row] for row in info.union_sets()])
    assert torch.equal(listed, union)
    assert int((info.selected().sum(-1)).sum()) > int(union.sum())  # heads shared teams


def test_fused_finish_matches_the_reference():
    q, kv = _problem(heads=6, n=330, d=32, lengths=[330, 271], q_scale=2.0,
                     dtype=torch.float32)
    index = build_team_index(kv, team_size=8, sink=0, exact_recent=4)
    packed = pack_teams(kv, index)
    workspace = SantaPPWorkspace.for_inputs(q, kv, packed, 5, fused_finish=True)
    assert workspace.plan.fused_finish and workspace.plan.head_lists
    _compare(q, kv, index, packed, 5, workspace=workspace)


def test_fused_finish_draws_the_same_teams_from_the_philox_stream():
    q, kv = _problem(heads=4, n=330, d=32, lengths=[330, 271], q_scale=2.0,
                     dtype=torch.float32)
    packed = pack_teams(kv, build_team_index(kv, team_size=4, sink=2, exact_recent=3))
    got = {}
    for fused in (True, False):
        workspace = SantaPPWorkspace.for_inputs(q, kv, packed, 7, fused_finish=fused, seed=11)
        outs = []
        for _ in range(2):  # the second call draws fresh teams from the advanced stream
            out, info = santapp_decode(q, kv, packed, 7, workspace=workspace)
            outs.append((out.clone(), info.kappa.clone(), info.selected().clone()))
        got[fused] = outs
    for (out, kappa, chosen), (ref_out, ref_kappa, ref_chosen) in zip(got[True], got[False],
                                                                      strict=True):
        assert torch.equal(kappa, ref_kappa) and torch.equal(chosen, ref_chosen)
        torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)
    assert not torch.equal(got[True][0][2], got[True][1][2])


def test_the_fused_finish_launches_no_finisher(monkeypatch):
    """With ``fused_finish`` at Llama-3.1-8B's shape (32/8/128, 32k, teams of 16) the plan
    fuses the finisher into the select kernel; a call launches select and attend only (no
    merge kernel at B=1), with head lists and with the union list."""
    for batch, M in ((1, 32), (1, 64), (8, 32), (8, 64), (1, 512), (8, 512)):
        plan = make_plan(batch, 32, 8, 128, 2044, M, 16, 76, 132, fused_finish=True)
        assert plan.fused_finish and not plan.local
        assert plan.head_lists == (M < 512)  # 4 x 512 slots > 2044 teams: the union
    q, kv = _problem(heads=4, n=330, d=32, lengths=[330, 271], q_scale=2.0,
                     dtype=torch.float32)
    packed = pack_teams(kv, build_team_index(kv, team_size=4, sink=2, exact_recent=3))

    def refuse(*args, **kwargs):
        raise AssertionError("a finisher kernel launched")

    class Refused:
        def __getitem__(self, grid):
            return refuse

    monkeypatch.setattr(tsp, "_finish_heads_kernel", Refused())
    monkeypatch.setattr(tsp, "_finish_kernel", Refused())
    monkeypatch.setattr(tsp, "_merge_kernel", Refused())
    for head_lists in (True, False):
        workspace = SantaPPWorkspace.for_inputs(q, kv, packed, 7, head_lists=head_lists,
                                                fused_finish=True)
        out, info = santapp_decode(q, kv, packed, 7, seed=3, workspace=workspace)
        assert torch.isfinite(out).all() and bool((info.kappa > float("-inf")).all())


class _Counted:
    """A kernel whose launches are listed by name (then run)."""

    def __init__(self, kernel, name: str, launches: list[str]) -> None:
        self.kernel, self.name, self.launches = kernel, name, launches

    def __getitem__(self, grid):
        self.launches.append(self.name)
        return self.kernel[grid]


def test_the_default_plan_launches_the_finisher(monkeypatch):
    """The fused finish is an option: at Llama-3.1-8B's shape the defaults plan the
    finisher kernel (draw=head) or the pool kernel (draw=pooled) after the select kernel,
    and a call with the defaults launches it."""
    assert not HOPPER["fused_finish"]
    for batch, M, draw in itertools.product((1, 8), (32, 64, 512), ("head", "pooled")):
        plan = make_plan(batch, 32, 8, 128, 2044, M, 16, 76, 132, draw=draw)
        assert not plan.fused_finish and not plan.local, (batch, M, draw)
    q, kv = _problem(heads=4, n=330, d=32, lengths=[330, 271], q_scale=2.0,
                     dtype=torch.float32)
    packed = pack_teams(kv, build_team_index(kv, team_size=4, sink=2, exact_recent=3))
    launches: list[str] = []
    for name in ("_select_kernel", "_finish_heads_kernel", "_finish_kernel", "_pool_kernel"):
        monkeypatch.setattr(tsp, name, _Counted(getattr(tsp, name), name, launches))
    for draw, finisher in (("head", "_finish_heads_kernel"), ("pooled", "_pool_kernel")):
        launches.clear()
        out, _ = santapp_decode(q, kv, packed, 7, seed=3, draw=draw)
        assert launches == ["_select_kernel", finisher], draw
        assert torch.isfinite(out).all()


@pytest.mark.parametrize("noise", ["given", "philox"])
def test_fused_pooled_draw_is_the_pool_kernels(noise, monkeypatch):
    """draw=pooled: the group's last select program draws the group's M teams as the pool
    kernel did (the same teams, 1/pi and kappas; no pool kernel launches)."""
    q, kv = _problem(heads=6, n=330, d=32, lengths=[330, 271], q_scale=2.0,
                     dtype=torch.float32)
    packed = pack_teams(kv, build_team_index(kv, team_size=4, sink=2, exact_recent=3))
    gumbels = None
    if noise == "given":
        gumbels = _gumbels(q.shape[0], kv.num_kv_heads, packed.max_teams, 9)
    got = {}
    for fused in (False, True):
        if fused:  # the pool kernel must not launch
            monkeypatch.setattr(tsp, "_pool_kernel", None)
        workspace = SantaPPWorkspace.for_inputs(q, kv, packed, 5, draw="pooled", seed=4,
                                                fused_finish=fused)
        assert workspace.plan.fused_finish == fused
        out, info = santapp_decode(q, kv, packed, 5, gumbels=gumbels, workspace=workspace)
        got[fused] = (out.clone(), info.union.clone(), info.count.clone(),
                      info.pool_w.clone(), info.pool_kappa.clone(), info.kappa.clone())
        assert not workspace.ticket.any() and int(workspace.rng) == 1
    for fused_part, kernel_part in zip(got[True][1:], got[False][1:], strict=True):
        assert torch.equal(fused_part, kernel_part)
    torch.testing.assert_close(got[True][0], got[False][0], rtol=1e-5, atol=1e-6)


def test_pooled_draws_over_2048_teams_keep_the_pool_kernel():
    plan = make_plan(1, 32, 8, 128, 8188, 32, 16, 76, 132, draw="pooled", fused_finish=True)
    assert not plan.fused_finish and plan.c_pad == 8192
    plan = make_plan(1, 32, 8, 128, 2044, 32, 16, 76, 132, draw="pooled", fused_finish=True)
    assert plan.fused_finish and plan.score_warps == 4
