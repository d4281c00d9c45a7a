"""scripts/profile_santapp.py: its options, the plans of a case and their notes, the
stage cuts of the defaults' plan, one shape end to end through the Triton interpreter with a
stand-in timer (the GPU timing itself runs on a GPU only)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import functools
import math

import pytest

from conftest import load_script
from santa_bench.timing import cold_l2_plan
from santa_kernels.triton_santapp_common import HOPPER
from santa_kernels.triton_santapp_plan import make_plan

# the defaults' plan (HOPPER: neither option) first, the others in the script's order
PLANS = ["neither (default)", "both", "fused_finish only", "merge_ticket only"]


def _script():
    return load_script("profile_santapp")


def _variants(*shape, **kw):
    return _script().plan_variants(functools.partial(make_plan, *shape, 16, 76, 132, **kw))


def test_options_parse_with_their_defaults():
    script = _script()
    shapes, attns, Ms, draws, stages = script.parse_args([])
    assert shapes == [(1, 32768), (8, 32768)]
    assert attns == [(32, 8, 128), (28, 4, 128), (12, 2, 128)]
    assert Ms == [32, 64, 512] and draws == ["head", "pooled"] and stages
    assert script.parse_args(["--shapes", "2x8k", "--attn", "4/2/16", "--M", "7",
                              "--draws", "pooled", "--no-stages"]) == (
        [(2, 8192)], [(4, 2, 16)], [7], ["pooled"], False)


@pytest.mark.parametrize(("argv", "message"), [
    (["--attn", "32/8"], "--attn: expected HEADS/KV_HEADS/HEAD_DIM"),
    (["--attn", "32/5/128"], "--attn: heads: 32 query heads is not a multiple of 5"),
    (["--draws", "head,union"], "--draws: expected draws of head, pooled"),
    (["--M", "32,0"], "--M: expected positive integers"),
    (["--shapes", "32k"], "--shapes: expected BATCHxCTX"),
])
def test_a_bad_option_is_one_line_and_exit_2(argv, message, capsys):
    assert _script().main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"profile_santapp.py: {message}") and err.count("\n") == 1


def test_every_option_has_help(capsys):
    with pytest.raises(SystemExit):
        _script().main(["--help"])
    out = capsys.readouterr().out
    for option in ("--shapes", "--attn", "--M", "--draws", "--no-stages"):
        assert option in out
    assert "(default: 32/8/128,28/4/128,12/2/128)" in " ".join(out.split())


def test_four_plans_where_both_options_apply():
    """32/8/128 at B=8 (64 groups: no atomic merge), 32k: four plans, each timed, the
    defaults' first (neither option)."""
    variants = _variants(8, 32, 8, 128, 2044, 32)
    assert [v.name for v in variants] == PLANS
    assert [(v.plan.fused_finish, v.plan.merge_ticket) for v in variants] == [
        (False, False), (True, True), (True, False), (False, True)]
    assert [v.same_as for v in variants] == [None] * 4 and not any(v.note for v in variants)
    assert [v.default for v in variants] == [True, False, False, False]


@pytest.mark.parametrize(("options", "names"), [
    ({"fused_finish": True, "merge_ticket": True},
     ["both (default)", "fused_finish only", "merge_ticket only", "neither"]),
    ({"fused_finish": True, "merge_ticket": False},
     ["fused_finish only (default)", "both", "merge_ticket only", "neither"]),
    ({"fused_finish": False, "merge_ticket": True},
     ["merge_ticket only (default)", "both", "fused_finish only", "neither"]),
])
def test_the_plan_the_defaults_give_is_marked_and_first(options, names, monkeypatch):
    """The labels follow HOPPER: whichever plan its options give is first, timed, marked."""
    for key, on in options.items():
        monkeypatch.setitem(HOPPER, key, on)
    variants = _variants(8, 32, 8, 128, 2044, 32)
    assert [v.name for v in variants] == names
    assert variants[0].default and variants[0].options == options
    assert (variants[0].plan.fused_finish, variants[0].plan.merge_ticket) == (
        options["fused_finish"], options["merge_ticket"])
    assert not any(v.default for v in variants[1:])


def test_the_atomic_merge_leaves_two_plans():
    """At B=1 (8 groups) the atomic merge runs: merge_ticket changes nothing, so
    merge_ticket only is the defaults' plan and fused_finish only is both's, noted."""
    variants = _variants(1, 32, 8, 128, 2044, 32)
    assert [v.same_as for v in variants] == [None, None, "both", "neither (default)"]
    assert variants[2].note == "same plan as both: the atomic merge runs (no merge_ticket)"
    assert variants[3].note == ("same plan as neither (default): the atomic merge runs "
                                "(no merge_ticket)")
    assert variants[0].default and not variants[3].default


def test_local_selection_and_the_fused_pools_teams_are_noted():
    """128k (8188 teams, local selection): fused_finish changes nothing; draw=pooled above
    fused_pool_max_teams neither; at B=1 only one plan is left to time. Each note names
    the options its plan differs in from the one it matches."""
    local = _variants(8, 32, 8, 128, 8188, 32)
    assert [v.same_as for v in local] == [None, None, "neither (default)", "both"]
    assert local[2].note == ("same plan as neither (default): no fused_finish in local "
                             "selection")
    assert local[3].note == "same plan as both: no fused_finish in local selection"
    one = _variants(1, 32, 8, 128, 8188, 32)
    assert [v.same_as for v in one] == [None] + ["neither (default)"] * 3
    assert [v.note.split(": ", 1)[1] for v in one[1:]] == [
        "no fused_finish in local selection; the atomic merge runs (no merge_ticket)",
        "no fused_finish in local selection", "the atomic merge runs (no merge_ticket)"]
    pooled = _variants(8, 32, 8, 128, 4000, 32, draw="pooled")
    teams = HOPPER["fused_pool_max_teams"]
    assert pooled[2].note == (f"same plan as neither (default): no fused_finish above {teams} "
                              "teams (pooled)")
    assert pooled[3].same_as == "both"


def test_each_plan_is_planned_once():
    """Each variant's plan, one ``plan_of`` call each (the defaults' plan is its
    variant's)."""
    planned = []

    def plan_of(**kw):
        planned.append(kw)
        return make_plan(1, 32, 8, 128, 2044, 32, 16, 76, 132, **kw)

    variants = _script().plan_variants(plan_of)
    assert planned == [v.options for v in variants]
    assert variants[0].plan == make_plan(1, 32, 8, 128, 2044, 32, 16, 76, 132)


def test_a_timing_makes_no_call_of_its_own(monkeypatch):
    """``graph_call_us`` warms (compiles) every call before it times: the calls run in the
    timer only."""
    script = _script()
    ran = []
    monkeypatch.setattr(script.tsp.SantaPPWorkspace, "for_inputs",
                        lambda *args, **kw: kw["seed"])
    monkeypatch.setattr(script.tsp, "santapp_decode",
                        lambda *args, workspace, stages: ran.append((workspace, stages)))
    copies = [("q", "kv", "packed")] * 3
    assert script._time_calls(copies, 4, "head", {}, ("select",), lambda calls: 7.0) == 7.0
    assert ran == []

    def timer(calls) -> float:
        for call in calls:
            call()
        return 1.0

    script._time_calls(copies, 4, "head", {}, ("select",), timer)
    assert ran == [(0, ("select",)), (1, ("select",)), (2, ("select",))]


def test_the_table_from_fake_timings(capsys):
    script = _script()
    Row = script.Row
    rows = [Row("32k B=1", "32/8/128", "head", 32, "neither (default)", 18.8, 1.0),
            Row("32k B=1", "32/8/128", "head", 32, "both", 33.7, 33.7 / 18.8),
            Row("32k B=1", "32/8/128", "head", 32, "merge_ticket only", math.nan, math.nan,
                "same plan as neither (default): the atomic merge runs (no merge_ticket)")]
    script.print_rows(rows)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| shape | attn | draw | M | plan | us | vs default | note |"
    assert lines[2] == "| 32k B=1 | 32/8/128 | head | 32 | neither (default) | 18.8 | 1.00 |  |"
    assert lines[3] == "| 32k B=1 | 32/8/128 | head | 32 | both | 33.7 | 1.79 |  |"
    assert lines[4] == ("| 32k B=1 | 32/8/128 | head | 32 | merge_ticket only |  |  | same "
                        "plan as neither (default): the atomic merge runs (no merge_ticket) |")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="the kernels on a CPU need the interpreter")
@pytest.mark.usefixtures("one_thread")
def test_one_shape_through_the_interpreter():
    """Each draw's distinct plans timed on workspaces planned with their options (B=1: the
    atomic merge, two plans a draw), the ratio to the defaults'; an M covering every team
    noted."""
    script = _script()
    tsp = script.tsp
    seen = []

    def timer(calls) -> float:  # runs the calls; "times" 1, 2, 3 ... us
        for call in calls:
            call()
        seen.append(len(calls))
        return float(len(seen))

    planned = []
    for_inputs = tsp.SantaPPWorkspace.for_inputs

    def record(*args, **kw):
        workspace = for_inputs(*args, **kw)
        planned.append((kw["draw"], workspace.plan.fused_finish, workspace.plan.merge_ticket))
        return workspace

    tsp.SantaPPWorkspace.for_inputs = record
    try:
        rows, cuts = script.profile_attn(1, 1024, (4, 2, 16), [4, 1000], ["head", "pooled"],
                                         stages=False, device="cpu", timer=timer)
    finally:
        tsp.SantaPPWorkspace.for_inputs = for_inputs
    assert seen == [1] * 4 and cuts == []  # one copy without an L2 to rotate through
    # the defaults' plans size the copies, then each draw's two plans
    assert planned == [("head", False, False), ("pooled", False, False),
                       ("head", False, False), ("head", True, False),
                       ("pooled", False, False), ("pooled", True, False)]
    assert [(r.draw, r.M, r.plan, r.us) for r in rows if r.M == 4] == [
        (d, 4, p, us) for d, first in (("head", 1.0), ("pooled", 3.0))
        for p, us in zip(PLANS, (first, first + 1, math.nan, math.nan), strict=True)]
    head = [r for r in rows if r.draw == "head" and r.M == 4]
    assert head[1].vs_default == 2.0 and head[2].note.startswith("same plan as both:")
    assert head[3].note.startswith("same plan as neither (default):")
    dense = [r for r in rows if r.M == 1000]
    assert [r.note.endswith("teams: dense attention") for r in dense] == [True, True]


def _cuts(*shape, **kw):
    plan = make_plan(*shape, 16, 76, 132, **kw)
    return [(c.name, c.stages) for c in _script().stage_cuts(plan)]


CALL = ("select", "attend", "merge")


BOTH = {"fused_finish": True, "merge_ticket": True}


@pytest.mark.parametrize(("shape", "kw", "finish", "merge"), [
    ((8, 32, 8, 128, 2044, 32), BOTH, "fused finish", "merge ticket"),
    ((1, 32, 8, 128, 2044, 32), BOTH, "fused finish", "atomic merge"),
    ((8, 32, 8, 128, 2044, 32), {"draw": "pooled", **BOTH}, "fused pool draw", "merge ticket"),
    ((8, 32, 8, 128, 4000, 32), {"draw": "pooled", **BOTH}, "pool kernel", "merge ticket"),
    ((8, 32, 8, 128, 2044, 32), {"draw": "pooled"}, "pool kernel", "merge kernel"),
    ((1, 32, 8, 128, 2044, 32), {"draw": "pooled"}, "pool kernel", "atomic merge"),
    ((8, 32, 8, 128, 2044, 32), {"finish_heads": 0, "merge_ticket": True}, "finisher",
     "merge ticket"),
    ((8, 32, 8, 128, 2044, 32), {"fused_finish": True}, "fused finish", "merge kernel"),
])
def test_the_stage_cuts_of_a_plan(shape, kw, finish, merge):
    """The select kernel alone, the selection finished (how the plan finishes), the attend
    without the merge, the whole call (how the plan merges)."""
    assert _cuts(*shape, **kw) == [("score", ("score",)), (f"select + {finish}", ("select",)),
                                   ("select + attend", ("select", "attend")),
                                   (f"call ({merge})", CALL)]


@pytest.mark.parametrize(("kw", "teams", "merge"), [
    ({}, 2044, "merge kernel"),
    ({"fused_finish": True, "merge_ticket": True}, 8188, "merge ticket"),
])
def test_the_per_head_finisher_is_cut_at_its_search_and_union(kw, teams, merge):
    """draw=head with the per-head finisher (32k with the defaults, or 128k: local
    selection, where the fused finish asked for does not apply): its kth search and its
    union step cut off before the whole finisher."""
    assert _cuts(8, 32, 8, 128, teams, 32, **kw) == [
        ("score", ("score",)),
        ("select + finisher, no search", ("select", "no-search")),
        ("select + finisher, no union", ("select", "no-union")),
        ("select + finisher", ("select",)), ("select + attend", ("select", "attend")),
        (f"call ({merge})", CALL)]


def test_the_stage_table_from_fake_timings(capsys):
    """Each cut minus the one before, none for a case's first cut."""
    script = _script()
    StageRow = script.StageRow
    rows = [StageRow("32k B=1", "32/8/128", "pooled", 32, "score", 8.0),
            StageRow("32k B=1", "32/8/128", "pooled", 32, "select + fused pool draw", 38.5),
            StageRow("32k B=1", "32/8/128", "pooled", 32, "select + attend", 50.25),
            StageRow("32k B=1", "32/8/128", "pooled", 32, "call (atomic merge)", 52.0),
            StageRow("32k B=1", "32/8/128", "pooled", 64, "score", 9.0),
            StageRow("32k B=1", "32/8/128", "pooled", 64, "select + fused pool draw",
                     math.nan)]
    script.print_stage_rows(rows)
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["| shape | attn | draw | M | stage | us | minus the stage before (us) |",
                         "|---|---|---|---|---|---|---|"]
    assert lines[2:] == [
        "| 32k B=1 | 32/8/128 | pooled | 32 | score | 8.0 |  |",
        "| 32k B=1 | 32/8/128 | pooled | 32 | select + fused pool draw | 38.5 | 30.5 |",
        "| 32k B=1 | 32/8/128 | pooled | 32 | select + attend | 50.2 | 11.8 |",
        "| 32k B=1 | 32/8/128 | pooled | 32 | call (atomic merge) | 52.0 | 1.8 |",
        "| 32k B=1 | 32/8/128 | pooled | 64 | score | 9.0 |  |",
        "| 32k B=1 | 32/8/128 | pooled | 64 | select + fused pool draw |  |  |"]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="the kernels on a CPU need the interpreter")
@pytest.mark.usefixtures("one_thread")
def test_the_stage_cuts_through_the_interpreter(monkeypatch):
    """The defaults' plan (B=1, draw=pooled: the pool kernel, the atomic merge) cut at each
    stage, each cut warmed up by the timer and timed on workspaces of the defaults'
    options, over the copies the score's bytes take (more than the whole call's); the whole
    call's row is the defaults' plan row."""
    script = _script()
    tsp = script.tsp
    seen = []

    def timer(calls) -> float:  # warms the first copy, counts the copies; "times" 10, 20 ... us
        calls[0]()
        seen.append(len(calls))
        return 10.0 * len(seen)

    cut = []
    decode = tsp.santapp_decode

    def record(*args, **kw):
        if "workspace" in kw:  # not the call that sizes the copies
            cut.append((kw["stages"], kw["workspace"].plan.fused_finish))
        return decode(*args, **kw)

    monkeypatch.setattr(tsp, "santapp_decode", record)
    monkeypatch.setattr(script, "l2_cache_bytes", lambda device: 4096)
    rows, cuts = script.profile_attn(1, 1024, (4, 2, 16), [4], ["pooled"], device="cpu",
                                     timer=timer)
    assert [(r.plan, r.us) for r in rows if not math.isnan(r.us)] == [
        ("neither (default)", 10.0), ("both", 20.0)]
    assert [(c.stage, c.us) for c in cuts] == [
        ("score", 30.0), ("select + pool kernel", 40.0), ("select + attend", 50.0),
        ("call (atomic merge)", 10.0)]
    # each timing's warm-up call: the plans' (whole calls), then each cut's (the defaults')
    assert cut == [(CALL, False), (CALL, True), (("score",), False), (("select",), False),
                   (("select", "attend"), False)]
    q_bytes, reps = 4 * 16 * 2, 2 * 60 * 16 * 2  # 60 teams of 16 tokens, bf16
    copies = cold_l2_plan(q_bytes + reps + 2 * 60 * 4, 4096)[0]
    assert seen == [1, 1] + [copies] * 3 and copies > 1
