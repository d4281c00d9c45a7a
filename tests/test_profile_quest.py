"""scripts/profile_quest.py: one shape end to end through the Triton interpreter with a
stand-in timer (the GPU timing itself runs on a GPU only)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from conftest import load_script


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="the kernels on a CPU need the interpreter")
def test_one_shape_through_the_interpreter(capsys):
    """The bounds alone, then the select and the step of steps built with each select
    (fused in the bound kernel, and byte-wise in its own launch); the module's default
    select untouched."""
    script = load_script("profile_quest")
    tps = script.tps
    seen = []

    def timer(calls) -> float:  # runs the calls; "times" 1, 2, 3 ... us
        for call in calls:
            call()
        step = calls[0].__defaults__[0]  # the step a call runs
        seen.append((step.select_by, step.fused_select, step.bound_pages,
                     step.attend_programs_per_sm, step.bound_programs_per_sm,
                     step.bound_stages))
        return float(len(seen))

    rows = script.profile_shape(1, 1024, 4, 2, 16, 4, device="cpu", timer=timer)
    default = script.default_select()
    assert default == "resident, own launch"  # QuestStep's defaults (tps.SELECT, fused)
    assert [(r.select, r.stage) for r in rows] == [
        ("-", "bounds"), ("byte-wise", "bounds + select"), ("byte-wise", "step"),
        ("four bits a pass", "bounds + select"), ("four bits a pass", "step"),
        ("spread", "bounds + select"), ("spread", "step"),
        ("byte-wise, own launch", "bounds + select"), ("byte-wise, own launch", "step"),
        ("resident", "bounds + select"), ("resident", "step"),
        ("resident, own launch", "bounds + select"), ("resident, own launch", "step"),
        (default, "step (64 pages a bound program)"),
        (default, "step (256 pages a bound program)"),
        *((default, f"step (bound: {p}-page steps, {n} programs an SM, {s or 'default'} "
                    "stages)") for p, n, s in script.BOUND_LOOPS),
        (default, "step (4 attend programs an SM)"),
        (default, "step (8 attend programs an SM)"),
        (default, "step (32 attend programs an SM)")]
    per_sm = script.tsel.QUEST_PROGRAMS_PER_SM
    assert [x[3] for x in seen] == [per_sm] * (len(seen) - 3) + [4, 8, 32]
    loops = len(script.BOUND_LOOPS)
    default_loop = (script.tsel.QUEST_BOUND_PROGRAMS_PER_SM, script.tsel.QUEST_BOUND_STAGES)
    assert [x[4:] for x in seen] == [default_loop] * (len(seen) - 3 - loops) + [
        (n, s) for _, n, s in script.BOUND_LOOPS] + [default_loop] * 3
    assert [x[:3] for x in seen] == [("resident", False, None)] \
        + [("bytes", True, None)] * 2 + [("nibbles", True, None)] * 2 \
        + [("spread", True, None)] * 2 + [("bytes", False, None)] * 2 \
        + [("resident", True, None)] * 2 + [("resident", False, None)] * 2 \
        + [("resident", False, 64), ("resident", False, 256)] \
        + [("resident", False, p) for p, _, _ in script.BOUND_LOOPS] \
        + [("resident", False, None)] * 3
    assert tps.SELECT == "resident" and not script.tsel.QUEST_FUSED_SELECT
    script.print_rows(rows)
    table = capsys.readouterr().out
    assert "| 1k B=1 4/2/16 | 4 | byte-wise | bounds + select | 2.0 | 1.0 |" in table
