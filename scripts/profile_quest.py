"""Quest's decode step on the GPU, launch by launch, with each page select.

Run on the GPU:  python scripts/profile_quest.py [--shapes 1x32k,8x32k] [--pages 64,256]

Per shape (Llama-3.1-8B heads by default, bf16, page 16) and page budget, each row is a
part of ``QuestStep``'s call timed alone (``santa_bench.timing.graph_call_us``: CUDA-graph
replays over input copies, each with its own step, as many as the harness's cold-L2 plan
takes), once with steps built for each page select (``QuestStep(select=...)``): byte-wise,
four bits a pass, spread (its histogram filled by the bound programs), byte-wise in
its own launch after the bound kernel (``fused_select=False``), and resident (the row of
bounds held in registers) fused and in its own launch:

- ``bounds``: the bound kernel without the select (every page's score bound);
- ``bounds + select``: the same launch whose last program per (sequence, KV head) picks
  the row's pages (what a step runs), or the bound kernel and the select's own launch;
  minus ``bounds``, the select's cost;
- ``step``: the whole call (bounds and select, the indexed attention, its merge); minus
  ``bounds + select``, the attention;
- ``step (N pages a bound program)``: the whole call of a step (the default select,
  ``default_select()``, named in the select column) whose bound kernel scores ``N``
  pages a program (``bound_pages``) instead of ``triton_selection.QUEST_BLOCK_P``'s (128
  at head dim 128, 16-bit bounds);
- ``step (bound: P-page steps, N programs an SM, S stages)``: the whole call of a step
  (the default select) whose bound programs each walk a power of two of ``P``-page
  steps, the rows' steps shared out over ``N`` programs an SM, their loads pipelined
  ``S`` deep (``bound_pages``, ``bound_programs_per_sm``, ``bound_stages``);
- ``step (N attend programs an SM)``: the whole call of a step (the default select)
  whose indexed attend's splits aim at ``N`` programs an SM (``attend_programs_per_sm``)
  instead of ``triton_selection.QUEST_PROGRAMS_PER_SM``'s (16).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

import santa_kernels.triton_page_select as tps
import santa_kernels.triton_selection as tsel
from santa_bench.baselines import clone_kv
from santa_bench.inputs import DecodeShape, make_decode_inputs
from santa_bench.timing import cold_l2_plan, graph_call_us, l2_cache_bytes
from santa_bench.units import parse_shapes

PAGE = 16
# QuestStep's select and fused_select: the select in the bound kernel's last program per
# row, or (byte-wise) in triton_page_select's own launch after the bound kernel
SELECTS = {"byte-wise": ("bytes", True), "four bits a pass": ("nibbles", True),
           "spread": ("spread", True), "byte-wise, own launch": ("bytes", False),
           "resident": ("resident", True), "resident, own launch": ("resident", False)}
BOUND_PAGES = (64, 256)  # pages a bound program scores, timed against the default's
# the bound kernel's page loop (pages a step, programs an SM, pipeline stages; None:
# Triton's), timed against the default's (one step of QUEST_BLOCK_P's pages a program)
BOUND_LOOPS = ((64, 2, 3), (64, 4, 3), (64, 8, 2), (128, 2, 2), (32, 4, 4))
ATTEND_PROGRAMS = (4, 8, 32)  # the attend's programs an SM, timed against the default's


@dataclass(frozen=True)
class Row:
    """One part of Quest's step at one shape, with one select."""

    shape: str
    pages: int
    select: str
    stage: str
    us: float


def _built(inputs: list, pages: int, select: str = tps.SELECT,
           fused: bool = tsel.QUEST_FUSED_SELECT, **options) -> list:
    """``(step, (q, kv))`` per input copy: a ``QuestStep`` launching ``select`` (in the
    bound kernel with ``fused``; ``options``: its other launch options), its bounds
    built."""
    steps = [tsel.QuestStep(qi, kvi, page=PAGE, pages=pages, select=select,
                            fused_select=fused, **options)
             for qi, kvi in inputs]
    for step, (_, kvi) in zip(steps, inputs, strict=True):
        step.build(kvi)
    return list(zip(steps, inputs, strict=True))


def default_select() -> str:
    """The name in ``SELECTS`` of QuestStep's default select and launch."""
    return next(name for name, how in SELECTS.items()
                if how == (tps.SELECT, tsel.QUEST_FUSED_SELECT))


def profile_shape(batch: int, ctx: int, heads: int, kv_heads: int, head_dim: int,
                  pages: int, *, device: str = "cuda",
                  timer: Callable[[list], float] = graph_call_us) -> list[Row]:
    """Every row of one shape (``device`` and ``timer`` let a CPU test run it through the
    Triton interpreter)."""
    shape = f"{ctx // 1024}k B={batch} {heads}/{kv_heads}/{head_dim}"
    q, kv = make_decode_inputs(DecodeShape(batch, ctx, heads, kv_heads, head_dim), seed=0,
                               device=device)
    es = kv.k.element_size()
    page_cap = -(-ctx // PAGE)
    touched = batch * kv_heads * (page_cap * 2 * head_dim + pages * PAGE * 2 * head_dim) * es
    n_copies, _ = cold_l2_plan(touched, l2_cache_bytes(device))
    inputs = [(q.clone(), clone_kv(kv)) for _ in range(n_copies)]
    pairs = _built(inputs, pages)
    rows = [Row(shape, pages, "-", "bounds", timer(
        [lambda s=s, qi=qi, kvi=kvi: s.page_bounds(qi, kvi, update=False)
         for s, (qi, kvi) in pairs]))]
    for name, (select, fused) in SELECTS.items():
        pairs = _built(inputs, pages, select, fused)  # each step launches this select
        rows.append(Row(shape, pages, name, "bounds + select", timer(
            [lambda s=s, qi=qi, kvi=kvi: s.select(qi, kvi) for s, (qi, kvi) in pairs])))
        rows.append(Row(shape, pages, name, "step", timer(
            [lambda s=s, qi=qi, kvi=kvi: s(qi, kvi) for s, (qi, kvi) in pairs])))
    default = default_select()
    for per_program in BOUND_PAGES:  # the default select, the bound kernel split otherwise
        pairs = _built(inputs, pages, bound_pages=per_program)
        rows.append(Row(shape, pages, default, f"step ({per_program} pages a bound program)",
                        timer([lambda s=s, qi=qi, kvi=kvi: s(qi, kvi) for s, (qi, kvi) in pairs])))
    for per_step, per_sm, stages in BOUND_LOOPS:  # the default select, bound page loops
        pairs = _built(inputs, pages, bound_pages=per_step, bound_programs_per_sm=per_sm,
                       bound_stages=stages)
        rows.append(Row(shape, pages, default, f"step (bound: {per_step}-page steps, {per_sm} "
                        f"programs an SM, {stages or 'default'} stages)",
                        timer([lambda s=s, qi=qi, kvi=kvi: s(qi, kvi) for s, (qi, kvi) in pairs])))
    for per_sm in ATTEND_PROGRAMS:  # the default select, the attend split otherwise
        pairs = _built(inputs, pages, attend_programs_per_sm=per_sm)
        rows.append(Row(shape, pages, default, f"step ({per_sm} attend programs an SM)",
                        timer([lambda s=s, qi=qi, kvi=kvi: s(qi, kvi) for s, (qi, kvi) in pairs])))
    del pairs
    inputs.clear()
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def print_rows(rows: list[Row]) -> None:
    """A Markdown table: each row's time, and the select's tail and the attention (the
    differences of the rows above)."""
    print("| shape | pages | select | stage | us | minus the stage before (us) |")
    print("|---|---|---|---|---|---|")
    bounds = before = 0.0
    for r in rows:
        if r.stage == "bounds":
            bounds = r.us
        diff = r.us - (bounds if r.stage == "bounds + select" else before)
        extra = "" if r.stage == "bounds" else f"{diff:.1f}"
        print(f"| {r.shape} | {r.pages} | {r.select} | {r.stage} | {r.us:.1f} | {extra} |")
        before = r.us


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="1x32k,8x32k",
                        help="BATCHxCTX, comma-separated (default: %(default)s)")
    parser.add_argument("--heads", type=int, default=32, help="query heads (default: 32)")
    parser.add_argument("--kv-heads", type=int, default=8, help="KV heads (default: 8)")
    parser.add_argument("--head-dim", type=int, default=128, help="head dim (default: 128)")
    parser.add_argument("--pages", default="64,256",
                        help="page budgets, comma-separated (default: %(default)s)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_quest.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        shapes = parse_shapes(args.shapes)
        budgets = [int(p) for p in args.pages.split(",")]
    except ValueError as exc:
        print(f"profile_quest.py: --shapes/--pages: {exc}", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    rows: list[Row] = []
    for batch, ctx in shapes:
        for pages in budgets:
            rows += profile_shape(batch, ctx, args.heads, args.kv_heads, args.head_dim, pages)
    print_rows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
