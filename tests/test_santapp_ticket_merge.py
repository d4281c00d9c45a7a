"""SANTA++ kernel: the group's last attend program merges the partials (no merge kernel)
where the atomic merge is off, to the merge kernel's output bit for bit.

Run on the CPU through Triton's interpreter at small shapes, with fixed noise.
"""

import itertools
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
from test_santapp_fused_finish import _Counted
from test_triton_santapp import _gumbels, _problem

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


@pytest.mark.parametrize(("M", "plan"), [
    (7, {}),  # head lists, one block of partials a head
    (7, {"head_lists": False, "attend_loops": 2}),  # the union list
    (5, {"exact_programs": 70}),  # 73 partials a head: blocks of 64, the two-pass merge
])
def test_ticket_merge_gives_the_merge_kernels_output(M, plan):
    q, kv = _problem(heads=4, n=330, d=32, lengths=[330, 271], q_scale=2.0,
                     dtype=torch.float32)
    packed = pack_teams(kv, build_team_index(kv, team_size=4, sink=3, exact_recent=5))
    gumbels = _gumbels(q.shape[0], q.shape[1], packed.max_teams, 7)
    got = {}
    for ticket in (True, False):
        workspace = SantaPPWorkspace.for_inputs(q, kv, packed, M, merge_atomic=False,
                                                merge_ticket=ticket, **plan)
        p = workspace.plan
        assert p.merge_ticket == ticket and not p.merge_atomic
        assert (p.num_parts > p.merge_block) == (M == 5)
        out, info = santapp_decode(q, kv, packed, M, gumbels=gumbels, workspace=workspace)
        got[ticket] = (out.clone(), info.kappa.clone())
        assert int(workspace.rng) == 1  # advanced once, by the call's last kernel
        assert not workspace.attend_ticket.any()  # ready for the next call
    assert torch.equal(got[True][1], got[False][1])
    assert torch.equal(got[True][0], got[False][0])


def test_the_merge_ticket_launches_no_merge_kernel(monkeypatch):
    """With ``merge_ticket`` at B=8 and 32/8/128 (64 (sequence, KV head) groups: no atomic
    merge) the plan merges in the attend kernel; with the fused finish too a call launches
    the select and attend kernels only."""
    for M in (32, 64, 512):
        plan = make_plan(8, 32, 8, 128, 2044, M, 16, 76, 132, merge_ticket=True)
        assert plan.merge_ticket and not plan.merge_atomic
    # the atomic merge there
    assert not make_plan(1, 32, 8, 128, 2044, 32, 16, 76, 132, merge_ticket=True).merge_ticket
    q, kv = _problem(heads=4, n=330, d=32, lengths=[330, 271], q_scale=2.0,
                     dtype=torch.float32)
    packed = pack_teams(kv, build_team_index(kv, team_size=4, sink=3, exact_recent=5))

    class Refused:
        def __getitem__(self, grid):
            raise AssertionError("a merge or finisher kernel launched")

    for name in ("_merge_kernel", "_finish_heads_kernel", "_finish_kernel"):
        monkeypatch.setattr(tsp, name, Refused())
    workspace = SantaPPWorkspace.for_inputs(q, kv, packed, 7, merge_atomic=False,
                                            merge_ticket=True, fused_finish=True)
    out, _ = santapp_decode(q, kv, packed, 7, seed=3, workspace=workspace)
    assert torch.isfinite(out).all()


def test_many_groups_launch_the_merge_kernel_by_default(monkeypatch):
    """The merge ticket is an option: above the atomic merge's groups (B=8, 32/8/128) the
    defaults plan the merge kernel, and a call without the atomic merge launches it once,
    after the attend kernel."""
    assert not HOPPER["merge_ticket"]
    for M, draw in itertools.product((32, 64, 512), ("head", "pooled")):
        plan = make_plan(8, 32, 8, 128, 2044, M, 16, 76, 132, draw=draw)
        assert not plan.merge_ticket and not plan.merge_atomic, (M, draw)
    q, kv = _problem(heads=4, n=330, d=32, lengths=[330, 271], q_scale=2.0,
                     dtype=torch.float32)
    packed = pack_teams(kv, build_team_index(kv, team_size=4, sink=3, exact_recent=5))
    launches: list[str] = []
    for name in ("_attend_kernel", "_merge_kernel"):
        monkeypatch.setattr(tsp, name, _Counted(getattr(tsp, name), name, launches))
    workspace = SantaPPWorkspace.for_inputs(q, kv, packed, 7, merge_atomic=False)
    assert not workspace.plan.merge_ticket
    out, _ = santapp_decode(q, kv, packed, 7, seed=3, workspace=workspace)
    assert launches == ["_attend_kernel", "_merge_kernel"] and torch.isfinite(out).all()
    assert int(workspace.rng) == 1  # advanced once, by the merge kernel
