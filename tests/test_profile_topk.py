"""scripts/profile_topk.py: one shape end to end through the Triton interpreter with a
stand-in timer (the GPU timing itself runs on a GPU only)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from conftest import load_script


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="the kernels on a CPU need the interpreter")
def test_one_shape_through_the_interpreter(capsys):
    """Per method the score pass alone, then its select, plan and step with steps built
    for each select, then the option sweeps, each timed on steps built with its option;
    the module constants untouched."""
    script = load_script("profile_topk")
    tsel = script.tsel
    from santa_kernels import triton_indexed as tix
    from santa_kernels import triton_rest_sample as trs
    from santa_kernels import triton_topk as ttk

    methods = {"oracle-topk k=8": lambda q, kv, **o: tsel.OracleTopKStep(q, kv, k=8, **o),
               "topk-santa k=4 S=4": lambda q, kv, **o: tsel.TopKSantaStep(q, kv, k=4, S=4,
                                                                           **o),
               "vattention": lambda q, kv, **o: tsel.VAttentionStep(q, kv, sink=4, window=4,
                                                                    topk=8, **o)}
    seen = []

    def timer(calls) -> float:  # runs the calls; "times" 1, 2, 3 ... us
        for call in calls:
            call()
        step = calls[0].__defaults__[0]  # the step a call runs: its options
        sampler = getattr(step, "sampler", None)
        seen.append((step.top.spread, step.top.mass_block, step.top.l2_hints,
                     (sampler.block, sampler.span) if sampler else None,
                     step.attend_programs_per_sm,
                     getattr(step, "chunk", None), getattr(step, "max_registers", None),
                     getattr(step, "stages", None), step.top.select_span,
                     step.top.select_splits, step.top.finish_launch,
                     getattr(step, "tail_scores", None)))
        return float(len(seen))

    rows = script.profile_shape(1, 1024, 4, 2, 16, methods, device="cpu", timer=timer)
    spread = ("scores + mass", "scores + mass + second byte", "scores + select")
    sweep = ([("spread", f"scores + mass ({b} a step)") for b in script.MASS_BLOCKS]
             + [("spread", "scores (L2 hints)"), ("spread", "scores + mass (L2 hints)")]
             + [("spread", f"step ({n} attend programs an SM)")
                for n in script.ATTEND_PROGRAMS])
    spans = [("spread", f"{st} ({name})") for name in ("the score pass's span",
                                                       "512 tokens a program",
                                                       "1024 tokens a program",
                                                       "2048 tokens a program")
             for st in spread]
    mass_at = len(script.MASS_BLOCKS)  # oracle-topk's span rows: after the mass blocks'
    finish = [("spread", st) for st in script.FINISH_STAGES]
    oracle = ([("-", "scores")] + [("spread", st) for st in (*spread, "step")]
              + [("one program a row", st) for st in ("scores + select", "step")] + finish
              + sweep[:mass_at] + spans + sweep[mass_at:])
    planned = ([("-", "scores")] + [("spread", st) for st in (*spread, "plan", "step")]
               + [("one program a row", st) for st in ("scores + select", "plan", "step")]
               + finish + sweep)
    rest = [("spread", f"plan ({b} rest tokens a step)") for b in script.REST_BLOCKS]
    rest += [("spread", f"plan ({n} rest tokens a program)") for n in script.REST_SPANS]
    at = len(sweep) - len(script.ATTEND_PROGRAMS)  # the rest sweep: before the attend's
    santa = planned[:len(planned) - len(sweep)] + sweep[:at] + rest + sweep[at:]
    planned += [("spread", "step (tail scores by token)")]
    attend = [("spread", f"step ({c} attend rows a step)") for c in script.ATTEND_CHUNKS]
    attend += [("spread", stage) for stage in script.VATTENTION_ATTENDS]
    assert [(r.select, r.stage) for r in rows] == oracle + santa + planned + attend

    def options(n, spread=True, mass=512, hints=False, programs=tix.PROGRAMS_PER_SM, rest=None,
                chunk=None, regs=None, stages=None, span=ttk.SELECT_SPAN, finish=False,
                tail=None):
        # the score pass's span at 1k tokens, B=1, 2 KV heads: 4 splits of 256 (a longer
        # select_span is capped at it)
        splits = -(-1024 // min(span or 256, 256))
        return [(spread, mass, hints, rest, programs, chunk, regs, stages, span, splits,
                 finish, tail)] * n

    def swept(rest=None, spans=False, **vatt):
        return (options(1, mass=256, rest=rest, **vatt)
                + options(1, mass=1024, rest=rest, **vatt)
                + [x for span in script.SELECT_SPANS if spans for x in options(3, span=span)]
                + options(2, hints=True, rest=rest, **vatt)
                + [x for r in script.REST_BLOCKS if rest for x in options(1, rest=(r, 256))]
                + [x for n in script.REST_SPANS if rest
                   for x in options(1, rest=(trs.REST_BLOCK, min(n, 256)))]
                + [x for n in script.ATTEND_PROGRAMS
                   for x in options(1, rest=rest, **{**vatt, "programs": n})])

    santa = (256, 256)  # the rest sampler's tokens a step and a program (the score pass's)
    vatt = {"programs": tsel.VATTENTION_PROGRAMS_PER_SM, "chunk": tix.CHUNK[16],
            "regs": tsel.VATTENTION_MAX_REGISTERS, "stages": tsel.VATTENTION_STAGES,
            "tail": tsel.VATTENTION_TAIL_SCORES}
    assert script.SELECT_SPANS == (None, 512, 1024, 2048)
    assert seen == (options(5) + options(2, spread=False) + options(2, finish=True)
                    + swept(spans=True)
                    + options(6, rest=santa) + options(3, spread=False, rest=santa)
                    + options(2, rest=santa, finish=True) + swept(rest=santa)
                    + options(6, **vatt) + options(3, spread=False, **vatt)
                    + options(2, finish=True, **vatt) + swept(**vatt)
                    + options(1, **{**vatt, "tail": "token"})
                    + [x for c in script.ATTEND_CHUNKS
                       for x in options(1, **{**vatt, "chunk": c})]
                    + options(1, **{**vatt, "regs": None})
                    + options(1, **{**vatt, "stages": 5})
                    + options(1, **{**vatt, "regs": None, "stages": None,
                                    "programs": tix.PROGRAMS_PER_SM}))
    assert trs.REST_BLOCK == 256 and trs.REST_SPAN == 1024
    assert ttk.SPREAD_SELECT is True and ttk.MASS_BLOCK == 512 and ttk.SELECT_SPAN == 2048
    assert tix.PROGRAMS_PER_SM == 8 and ttk.SCORE_L2_HINTS is False
    assert ttk.FINISH_LAUNCH is False
    assert tsel.VATTENTION_PROGRAMS_PER_SM == 8 and tix.CHUNK[16] == 64
    assert tsel.VATTENTION_MAX_REGISTERS == 128 and tsel.VATTENTION_STAGES is None
    script.print_rows(rows)
    table = capsys.readouterr().out
    # each spread row less the row before it; one program a row's select less the scores
    assert "| 1k B=1 4/2/16 | oracle-topk k=8 | spread | scores + mass | 2.0 | 1.0 |" in table
    assert "| oracle-topk k=8 | spread | scores + select | 4.0 | 1.0 |" in table
    assert "| oracle-topk k=8 | one program a row | scores + select | 6.0 | 5.0 |" in table
