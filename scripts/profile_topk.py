"""The token selection methods' decode step on the GPU, launch by launch, with either
top-k select.

Run on the GPU:  python scripts/profile_topk.py [--shapes 1x32k,8x32k]

Per shape (Llama-3.1-8B heads by default, bf16) and method (oracle-topk k=1024, topk-santa
k=64 S=128, vattention at its defaults), each row is a part of the step's call timed alone
(``santa_bench.timing.graph_call_us``: CUDA-graph replays over input copies, each with its
own step, as many as the harness's cold-L2 plan takes), once with steps whose select is
split like the score pass (``TopKSelect(spread=True)``) and once with one program a row;
each variant below is a step built with that option (``select_options``, ``rest_block``,
``rest_span``,
``attend_programs_per_sm``), the module constants untouched:

- ``scores``: the score pass alone (K once, the scores and their per-split stats);
- ``scores + mass``, ``scores + mass + second byte`` (spread select only): the score
  pass and the select's first launches (these calls leave the select's histograms
  growing: their times, not their choices, are meant);
- ``scores + select``: the score pass, the mass kernel and the top-k select; minus
  ``scores``, the mass kernel and the select (spread: minus the row before, the writes);
- ``plan`` (vattention, topk-santa): the rows of a call (vAttention's plan kernel;
  top-k + S²ANTA's rest sums and systematic samples); minus the row before, those;
- ``step``: the whole call; minus the row before, the indexed attention and its merge;
- ``scores + select (finish in its own launch)``, ``step (finish in its own launch)``: as
  ``scores + select`` and ``step`` with the spread select's candidates resolved by a
  launch of their own, a program a row (``finish_launch``), not the write kernel's last
  program a row (``triton_topk.FINISH_LAUNCH``);
- ``scores + mass (N a step)``: the mass kernel with ``N`` tokens a step
  (``mass_block``) instead of ``triton_topk.MASS_BLOCK``'s;
- ``scores + mass (N tokens a program)``, ``scores + mass + second byte (...)``,
  ``scores + select (...)`` (oracle-topk): the spread select's launches as above with
  ``N`` tokens a program of the mass, second-byte and write kernels (``select_span``),
  and with the score pass's span (``select_span=None``), timed alongside;
- ``scores (L2 hints)``, ``scores + mass (L2 hints)``: with ``l2_hints`` (K loaded
  evict-first, the scores stored evict-last; ``triton_topk.SCORE_L2_HINTS`` by default);
- ``plan (N rest tokens a step)`` (topk-santa): the plan with the rest sampler's kernels
  stepping ``N`` tokens (``rest_block``) instead of ``triton_rest_sample.REST_BLOCK``'s;
- ``plan (N rest tokens a program)`` (topk-santa): the plan with the rest sampler's
  kernels at most ``N`` tokens a program (``rest_span``) instead of
  ``triton_rest_sample.REST_SPAN``'s (the score pass's span);
- ``step (N attend programs an SM)``: the whole call of a step built with the indexed
  attend's splits aimed at ``N`` programs an SM (``attend_programs_per_sm``;
  ``triton_indexed.PROGRAMS_PER_SM`` by default, vattention's
  ``triton_selection.VATTENTION_PROGRAMS_PER_SM``);
- ``step (tail scores by token)`` (vattention): the whole call of a step whose tail's
  draws read the score pass's token-major copy (``tail_scores="token"``);
- ``step (N attend rows a step)`` (vattention): the whole call of a step whose attend
  gathers ``N`` rows a step (``attend_chunk``) instead of ``triton_indexed.CHUNK``'s;
- ``step (attend registers uncapped)``, ``step (attend stages 5)``,
  ``step (attend as the other methods')`` (vattention): the whole call of a step whose
  attend leaves its registers to the compiler (``attend_max_registers=None``), stages its
  row loop 5 deep (``attend_stages=5``), or leaves both to the compiler with
  ``triton_indexed.PROGRAMS_PER_SM`` (the other methods' attend), instead of
  ``triton_selection``'s ``VATTENTION_MAX_REGISTERS``, ``VATTENTION_STAGES`` (Triton's)
  and ``VATTENTION_PROGRAMS_PER_SM``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

import santa_kernels.triton_selection as tsel
from santa_bench.baselines import clone_kv
from santa_bench.inputs import DecodeShape, make_decode_inputs
from santa_bench.timing import cold_l2_plan, graph_call_us, l2_cache_bytes
from santa_bench.units import parse_shapes

SELECTS = {"spread": True, "one program a row": False}  # TopKSelect's spread
MASS_BLOCKS = (256, 1024)  # the mass kernel's tokens a step, timed against MASS_BLOCK's
ATTEND_PROGRAMS = (4, 8, 16)  # the attend's programs an SM, timed against the default's
ATTEND_CHUNKS = (32, 128)  # vattention's attend rows a step, timed against CHUNK's
# vattention's attend launched otherwise than its defaults
VATTENTION_ATTENDS = {
    "step (attend registers uncapped)": {"attend_max_registers": None},
    "step (attend stages 5)": {"attend_stages": 5},
    "step (attend as the other methods')": {
        "attend_max_registers": None, "attend_stages": None,
        "attend_programs_per_sm": tsel.PROGRAMS_PER_SM},
}
REST_BLOCKS = (512, 1024)  # the rest sampler's tokens a step, timed against REST_BLOCK's
REST_SPANS = (512, 1024, 2048)  # the rest sampler's tokens a program, against REST_SPAN's
# oracle-topk's select's tokens a program (None: the score pass's span)
SELECT_SPANS = (None, 512, 1024, 2048)
# the spread select's stages up to each launch (TopKSelect.run_select's upto)
SELECT_STAGES = {"scores + mass": "mass", "scores + mass + second byte": "second",
                 "scores + select": "write"}
# the select and the step of steps whose select resolves its candidates in a launch of
# their own (TopKSelect's finish_launch), against FINISH_LAUNCH's
FINISH_STAGES = {"scores + select (finish in its own launch)": lambda s: _select(s),
                 "step (finish in its own launch)": lambda s: s}
# a method's step from (q, kv) and its options (select_options, attend_programs_per_sm;
# topk-santa's rest_block)
METHODS = {
    "oracle-topk k=1024": lambda q, kv, **o: tsel.OracleTopKStep(q, kv, k=1024, **o),
    "topk-santa k=64 S=128": lambda q, kv, **o: tsel.TopKSantaStep(q, kv, k=64, S=128, **o),
    "vattention": lambda q, kv, **o: tsel.VAttentionStep(q, kv, **o),
}


SPREAD = {"spread": True}  # the option sweeps' select


@dataclass(frozen=True)
class Row:
    """One part of a method's step at one shape, with one select."""

    shape: str
    method: str
    select: str
    stage: str
    us: float


def _select(step, upto: str = "write") -> Callable:
    """The score pass, the mass kernel and the select of ``step`` (its own range), up to
    the launch ``upto`` (``TopKSelect.run_select``)."""
    out = step.rows if hasattr(step, "rows") else step.top_rows
    sink, window = getattr(step, "sink", 0), getattr(step, "window", 0)

    def run(q, kv):
        step.top.run_scores(q, kv)
        step.top.run_select(kv, out, sink, window, upto=upto)

    return run


def _span_name(span: int | None) -> str:
    return "the score pass's span" if span is None else f"{span} tokens a program"


def _stages(step) -> dict[str, Callable]:
    stages = {"scores": lambda q, kv: step.top.run_scores(q, kv)}
    if step.top.spread:
        stages["scores + mass"] = _select(step, "mass")
        stages["scores + mass + second byte"] = _select(step, "second")
    stages["scores + select"] = _select(step)
    if hasattr(step, "plan"):
        stages["plan"] = step.plan
    stages["step"] = step
    return stages


def _built(build: Callable, inputs: list, **options) -> list:
    """A step per input copy, built with ``options``."""
    return [build(qi, kvi, **options) for qi, kvi in inputs]


def _time(timer: Callable[[list], float], steps: list, inputs: list,
          part: Callable) -> float:
    """``timer`` over each step's ``part(step)`` called on its own input copy."""
    return timer([lambda s=s, qi=qi, kvi=kvi: part(s)(qi, kvi)
                  for s, (qi, kvi) in zip(steps, inputs, strict=True)])


def _time_built(timer: Callable[[list], float], build: Callable, inputs: list,
                part: Callable, **options) -> float:
    """:func:`_time` over steps built with ``options`` (freed after)."""
    return _time(timer, _built(build, inputs, **options), inputs, part)


def profile_shape(batch: int, ctx: int, heads: int, kv_heads: int, head_dim: int,
                  methods: dict[str, Callable] = METHODS, *, device: str = "cuda",
                  timer: Callable[[list], float] = graph_call_us) -> list[Row]:
    """Every row of one shape (``device`` and ``timer`` let a CPU test run it through the
    Triton interpreter)."""
    shape = f"{ctx // 1024}k B={batch} {heads}/{kv_heads}/{head_dim}"
    q, kv = make_decode_inputs(DecodeShape(batch, ctx, heads, kv_heads, head_dim), seed=0,
                               device=device)
    touched = (2 * batch * ctx * kv_heads * head_dim * kv.k.element_size()
               + 2 * 4 * batch * heads * ctx)  # K and V, the scores written and read
    n_copies, _ = cold_l2_plan(touched, l2_cache_bytes(device))
    inputs = [(q.clone(), clone_kv(kv)) for _ in range(n_copies)]
    rows = []
    for method, build in methods.items():
        sampled = oracle = False
        for name, spread in SELECTS.items():
            steps = _built(build, inputs, select_options={"spread": spread})
            for stage in _stages(steps[0]):
                if stage == "scores" and not spread:
                    continue  # no select in it
                rows.append(Row(shape, method, "-" if stage == "scores" else name, stage,
                                _time(timer, steps, inputs,
                                      lambda s, st=stage: _stages(s)[st])))
            sampled = "plan" in _stages(steps[0]) and hasattr(steps[0], "sampler")
            oracle = isinstance(steps[0], tsel.OracleTopKStep)
            del steps
        # the spread select's candidates resolved in a launch of their own
        steps = _built(build, inputs, select_options={**SPREAD, "finish_launch": True})
        for stage, part in FINISH_STAGES.items():
            rows.append(Row(shape, method, "spread", stage, _time(timer, steps, inputs, part)))
        del steps
        for block in MASS_BLOCKS:  # the mass kernel's step, against MASS_BLOCK's
            rows.append(Row(shape, method, "spread", f"scores + mass ({block} a step)",
                            _time_built(timer, build, inputs, lambda s: _select(s, "mass"),
                                        select_options={**SPREAD, "mass_block": block})))
        for span in SELECT_SPANS if oracle else ():  # the select's programs, each span long
            steps = _built(build, inputs, select_options={**SPREAD, "select_span": span})
            for stage, upto in SELECT_STAGES.items():
                rows.append(Row(shape, method, "spread", f"{stage} ({_span_name(span)})",
                                _time(timer, steps, inputs, lambda s, u=upto: _select(s, u))))
            del steps
        steps = _built(build, inputs, select_options={**SPREAD, "l2_hints": True})
        for stage, part in (("scores (L2 hints)", lambda s: lambda q, kv:
                             s.top.run_scores(q, kv)),
                            ("scores + mass (L2 hints)", lambda s: _select(s, "mass"))):
            rows.append(Row(shape, method, "spread", stage,
                            _time(timer, steps, inputs, part)))
        del steps
        if sampled:
            for block in REST_BLOCKS:  # top-k + S²ANTA's rest sums and samples
                rows.append(Row(shape, method, "spread", f"plan ({block} rest tokens a step)",
                                _time_built(timer, build, inputs, lambda s: s.plan,
                                            select_options=SPREAD, rest_block=block)))
            for span in REST_SPANS:  # the rest sampler's programs, each span long
                rows.append(Row(shape, method, "spread",
                                f"plan ({span} rest tokens a program)",
                                _time_built(timer, build, inputs, lambda s: s.plan,
                                            select_options=SPREAD, rest_span=span)))
        for per_sm in ATTEND_PROGRAMS:  # the step built for this many programs
            rows.append(Row(shape, method, "spread", f"step ({per_sm} attend programs an SM)",
                            _time_built(timer, build, inputs, lambda s: s,
                                        select_options=SPREAD,
                                        attend_programs_per_sm=per_sm)))
        if method == "vattention":  # its tail's draws reading a token-major copy
            rows.append(Row(shape, method, "spread", "step (tail scores by token)",
                            _time_built(timer, build, inputs, lambda s: s,
                                        select_options=SPREAD, tail_scores="token")))
        if method == "vattention":  # its attend's rows a step and register cap
            for chunk in ATTEND_CHUNKS:
                rows.append(Row(shape, method, "spread", f"step ({chunk} attend rows a step)",
                                _time_built(timer, build, inputs, lambda s: s,
                                            select_options=SPREAD, attend_chunk=chunk)))
            for stage, options in VATTENTION_ATTENDS.items():
                rows.append(Row(shape, method, "spread", stage,
                                _time_built(timer, build, inputs, lambda s: s,
                                            select_options=SPREAD, **options)))
    inputs.clear()
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def print_rows(rows: list[Row]) -> None:
    """A Markdown table: each row's time and, but for ``scores``, its difference from the
    row before of the same method and select."""
    print("| shape | method | select | stage | us | minus the stage before (us) |")
    print("|---|---|---|---|---|---|")
    scores = before = 0.0
    for r in rows:
        if r.stage == "scores":
            scores = r.us
        diff = r.us - (scores if r.stage == "scores + select" and r.select != "spread"
                       else before)
        extra = "" if r.stage == "scores" else f"{diff:.1f}"
        print(f"| {r.shape} | {r.method} | {r.select} | {r.stage} | {r.us:.1f} | {extra} |")
        before = r.us


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="1x32k,8x32k",
                        help="BATCHxCTX, comma-separated (default: %(default)s)")
    parser.add_argument("--heads", type=int, default=32, help="query heads (default: 32)")
    parser.add_argument("--kv-heads", type=int, default=8, help="KV heads (default: 8)")
    parser.add_argument("--head-dim", type=int, default=128, help="head dim (default: 128)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_topk.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        shapes = parse_shapes(args.shapes)
    except ValueError as exc:
        print(f"profile_topk.py: --shapes: {exc}", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    rows: list[Row] = []
    for batch, ctx in shapes:
        rows += profile_shape(batch, ctx, args.heads, args.kv_heads, args.head_dim)
    print_rows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
