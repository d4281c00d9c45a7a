"""scripts/profile_topk.py: one shape end to end through the Triton interpreter with a
stand-in timer (the GPU timing itself runs on a GPU only)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from conftest import load_script


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="the kernels on a CPU need the interpreter")
def test_one_shape_through_the_interpreter(capsys):
    """Per method the score pass alone, then its select, plan and step with each select,
    the select switch set while each is captured and restored after."""
    script = load_script("profile_topk")
    tsel, ttk = script.tsel, script.ttk
    methods = {"oracle-topk k=8": lambda q, kv: tsel.OracleTopKStep(q, kv, k=8),
               "topk-santa k=4 S=4": lambda q, kv: tsel.TopKSantaStep(q, kv, k=4, S=4),
               "vattention": lambda q, kv: tsel.VAttentionStep(q, kv, sink=4, window=4,
                                                               topk=8)}
    seen = []

    def timer(calls) -> float:  # runs the calls; "times" 1, 2, 3 ... us
        for call in calls:
            call()
        seen.append(ttk.SPREAD_SELECT)
        return float(len(seen))

    rows = script.profile_shape(1, 1024, 4, 2, 16, methods, device="cpu", timer=timer)
    spread = ("scores + mass", "scores + mass + second byte", "scores + select")
    sweep = ([("spread", f"scores + mass ({b} a step)") for b in script.MASS_BLOCKS]
             + [("spread", "scores (L2 hints)"), ("spread", "scores + mass (L2 hints)")]
             + [("spread", f"step ({n} attend programs an SM)")
                for n in script.ATTEND_PROGRAMS])
    oracle = ([("-", "scores")] + [("spread", st) for st in (*spread, "step")]
              + [("one program a row", st) for st in ("scores + select", "step")] + sweep)
    planned = ([("-", "scores")] + [("spread", st) for st in (*spread, "plan", "step")]
               + [("one program a row", st) for st in ("scores + select", "plan", "step")]
               + sweep)
    rest = [("spread", f"plan ({b} rest tokens a step)") for b in script.REST_BLOCKS]
    at = len(sweep) - len(script.ATTEND_PROGRAMS)  # the rest sweep: before the attend's
    santa = planned[:len(planned) - len(sweep)] + sweep[:at] + rest + sweep[at:]
    assert [(r.select, r.stage) for r in rows] == oracle + santa + planned
    swept = [True] * len(sweep)
    assert seen == ([True] * 5 + [False] * 2 + swept
                    + [True] * 6 + [False] * 3 + swept + [True] * len(rest)
                    + [True] * 6 + [False] * 3 + swept)
    assert script.trs.REST_BLOCK == 256
    assert ttk.SPREAD_SELECT is True and ttk.MASS_BLOCK == 512
    assert script.tix.PROGRAMS_PER_SM == 2 and ttk.SCORE_L2_HINTS is False
    script.print_rows(rows)
    table = capsys.readouterr().out
    # each spread row less the row before it; one program a row's select less the scores
    assert "| 1k B=1 4/2/16 | oracle-topk k=8 | spread | scores + mass | 2.0 | 1.0 |" in table
    assert "| oracle-topk k=8 | spread | scores + select | 4.0 | 1.0 |" in table
    assert "| oracle-topk k=8 | one program a row | scores + select | 6.0 | 5.0 |" in table
