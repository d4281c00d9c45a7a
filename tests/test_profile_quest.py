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
                     step.attend_programs_per_sm))
        return float(len(seen))

    rows = script.profile_shape(1, 1024, 4, 2, 16, 4, device="cpu", timer=timer)
    assert [(r.select, r.stage) for r in rows] == [
        ("-", "bounds"), ("byte-wise", "bounds + select"), ("byte-wise", "step"),
        ("four bits a pass", "bounds + select"), ("four bits a pass", "step"),
        ("spread", "bounds + select"), ("spread", "step"),
        ("byte-wise, own launch", "bounds + select"), ("byte-wise, own launch", "step"),
        ("resident", "bounds + select"), ("resident", "step"),
        ("resident, own launch", "bounds + select"), ("resident, own launch", "step"),
        ("byte-wise", "step (32 pages a bound program)"),
        ("byte-wise", "step (128 pages a bound program)"),
        ("byte-wise", "step (2 attend programs an SM)"),
        ("byte-wise", "step (4 attend programs an SM)"),
        ("byte-wise", "step (16 attend programs an SM)")]
    per_sm = script.tsel.QUEST_PROGRAMS_PER_SM
    assert [x[3] for x in seen] == [per_sm] * (len(seen) - 3) + [2, 4, 16]
    assert [x[:3] for x in seen] == [("bytes", True, None)] * 3 \
        + [("nibbles", True, None)] * 2 \
        + [("spread", True, None)] * 2 + [("bytes", False, None)] * 2 \
        + [("resident", True, None)] * 2 + [("resident", False, None)] * 2 \
        + [("bytes", True, 32), ("bytes", True, 128)] + [("bytes", True, None)] * 3
    assert tps.SELECT == "bytes"
    script.print_rows(rows)
    table = capsys.readouterr().out
    assert "| 1k B=1 4/2/16 | 4 | byte-wise | bounds + select | 2.0 | 1.0 |" in table
