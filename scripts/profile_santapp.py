"""SANTA++'s Triton decode on the GPU under each launch plan of its finish and its merge.

Run on the GPU:  python scripts/profile_santapp.py [--shapes 1x32k,8x32k]
                 [--attn 32/8/128,28/4/128,12/2/128] [--M 32,64,512] [--draws head,pooled]
                 [--no-stages]

Per shape, attention shape (bf16 Gaussian inputs), draw and M, each row is one call of
``santapp_decode`` (``santa_bench.timing.graph_call_us``: CUDA-graph replays over input
copies, each with its own team index and workspace, as many as the harness's cold-L2 plan
takes for the call's bytes) under one plan, every plan's kernels compiled by the warm-up
``graph_call_us`` runs before it times. The team index is the method's (the library's
defaults), built and packed once a shape and copy, outside the timing. The plans:

- ``both``: ``fused_finish`` (no finisher kernel: the group's last select program
  finishes the selection; draw=pooled: draws the group's teams) and ``merge_ticket`` (no
  merge kernel: the group's last attend program merges);
- ``fused_finish only``, ``merge_ticket only``;
- ``neither``: a finisher kernel (draw=pooled: the pool kernel) and the merge kernel.

Where the atomic merge runs (up to ``HOPPER["merge_atomic_max_groups"]`` (sequence, KV
head) groups) it takes the merge kernel's or the ticket's place in every plan.

The plan whose options are ``HOPPER``'s (the defaults') comes first, its name marked
``(default)``; the other three follow in that order. ``vs default`` is the row's time over
the defaults' plan's: below 1, faster. A plan that an option does not change there
(``merge_ticket`` where the atomic merge runs, ``fused_finish`` in local selection or above
the fused pool's teams) is the same plan as one above it: its row says so (why the options
it differs in do not apply) and is not timed.

A second table (``--no-stages``: none) breaks the defaults' plan's call down, in the
manner of ``profile_quest.py``: the call cut at each profiling stage of ``santapp_decode``
(``stages=``), each cut warmed up by ``graph_call_us`` and timed, cheapest first, with each
cut's time minus the one before:

- ``score``: the select kernel alone (no finish, no pooled draw); the cuts rotate through
  the copies this cut's bytes (q and the representatives) take;
- draw=head with the per-head finisher (no fused finish): ``select + finisher, no
  search`` (no kth search, no union) and ``select + finisher, no union``;
- ``select + ...``: the selection finished, by the select kernel's last program of the
  group (``fused finish``, ``fused pool draw``) or a kernel of its own (``finisher``,
  ``pool kernel``); minus ``score``, what finishing costs;
- ``select + attend``: the attend kernel without the merge;
- ``call (...)``: the whole call (the defaults' row of the first table), with its merge
  (``atomic merge``, ``merge ticket`` or ``merge kernel``); minus ``select + attend``,
  what merging costs.

The cuts are timing only: their outputs are wrong.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton

import santa_kernels.triton_santapp as tsp
from santa_bench.baselines import clone_kv
from santa_bench.inputs import DecodeShape, make_decode_inputs
from santa_bench.timing import cold_l2_plan, graph_call_us, l2_cache_bytes
from santa_bench.units import parse_list, parse_shapes
from santa_kernels.santapp import KERNEL_DRAWS
from santa_kernels.triton_santapp_common import HOPPER

VARIANTS = {  # plan -> the plan's options (the defaults' plan is timed first)
    "both": {"fused_finish": True, "merge_ticket": True},
    "fused_finish only": {"fused_finish": True, "merge_ticket": False},
    "merge_ticket only": {"fused_finish": False, "merge_ticket": True},
    "neither": {"fused_finish": False, "merge_ticket": False},
}
DEFAULT_MARK = " (default)"  # after the name of the plan the defaults (HOPPER) give


@dataclass(frozen=True)
class Variant:
    """One plan of a case: timed unless ``same_as`` (an earlier variant with this plan)."""

    name: str
    options: dict
    plan: tsp.SantaPPPlan
    same_as: str | None
    note: str
    default: bool  # the variant whose options are HOPPER's (first, timed)


@dataclass(frozen=True)
class Row:
    """One plan of SANTA++'s call at one shape, attention shape, draw and M."""

    shape: str
    attn: str
    draw: str
    M: int
    plan: str
    us: float  # nan: not timed (see note)
    vs_default: float  # us over the defaults' plan's us
    note: str = ""


@dataclass(frozen=True)
class Cut:
    """One cut of a call: its name in the stage table and the stages it launches."""

    name: str
    stages: tuple[str, ...]


@dataclass(frozen=True)
class StageRow:
    """The defaults' plan's call at one shape, attention shape, draw and M, cut at one
    stage."""

    shape: str
    attn: str
    draw: str
    M: int
    stage: str
    us: float


def stage_cuts(plan: tsp.SantaPPPlan) -> list[Cut]:
    """The cuts of a call under ``plan``, cheapest first, the whole call last (see the
    module's docstring)."""
    pooled = plan.draw == "pooled"
    if plan.fused_finish:
        finish = "fused pool draw" if pooled else "fused finish"
    else:
        finish = "pool kernel" if pooled else "finisher"
    cuts = [Cut("score", ("score",))]
    if not pooled and not plan.fused_finish and plan.finish_heads:  # the per-head finisher
        cuts += [Cut("select + finisher, no search", ("select", "no-search")),
                 Cut("select + finisher, no union", ("select", "no-union"))]
    merge = ("atomic merge" if plan.merge_atomic else
             "merge ticket" if plan.merge_ticket else "merge kernel")
    return [*cuts, Cut(f"select + {finish}", ("select",)),
            Cut("select + attend", ("select", "attend")), Cut(f"call ({merge})", tsp.STAGES)]


def parse_attn(text: str) -> list[tuple[int, int, int]]:
    """Returns ``[(heads, kv_heads, head_dim), ...]`` for a comma list such as
    ``"32/8/128,12/2/128"``."""
    out = []
    for item in parse_list(text):
        fields = item.split("/")
        if len(fields) != 3 or not all(f.isdigit() and int(f) > 0 for f in fields):
            raise ValueError(f"expected HEADS/KV_HEADS/HEAD_DIM (e.g. 32/8/128), got {item!r}")
        heads, kv_heads, head_dim = map(int, fields)
        DecodeShape(1, 1, heads, kv_heads, head_dim)  # heads a multiple of kv_heads
        out.append((heads, kv_heads, head_dim))
    if not out:
        raise ValueError("no attention shape given (e.g. 32/8/128)")
    return out


def parse_draws(text: str) -> list[str]:
    """Returns the draws of a comma list, each one the kernel implements."""
    draws = parse_list(text)
    bad = [d for d in draws if d not in KERNEL_DRAWS]
    if bad or not draws:
        raise ValueError(f"expected draws of {', '.join(KERNEL_DRAWS)}, got {text!r}")
    return draws


def default_variant() -> str:
    """The :data:`VARIANTS` plan whose options are ``HOPPER``'s (the defaults')."""
    return next(name for name, options in VARIANTS.items()
                if all(bool(HOPPER[k]) == on for k, on in options.items()))


def _not_applied(plan: tsp.SantaPPPlan) -> dict[str, str]:
    """Why each option asked for in ``plan`` (every option on) is off there, by option."""
    why = {}
    if not plan.fused_finish:
        why["fused_finish"] = (
            "no fused_finish in local selection" if plan.local else
            f"no fused_finish above {HOPPER['fused_pool_max_teams']} teams (pooled)")
    if not plan.merge_ticket:
        why["merge_ticket"] = ("the atomic merge runs (no merge_ticket)" if plan.merge_atomic
                               else "no merge_ticket")
    return why


def plan_variants(plan_of: Callable[..., tsp.SantaPPPlan]) -> list[Variant]:
    """The plans of one case: the defaults' plan (named with :data:`DEFAULT_MARK`), then
    the others in :data:`VARIANTS`' order. ``plan_of(**options)`` plans the call
    (``tsp._plan_for`` of its inputs); a variant whose plan an earlier one has is noted with
    why the options it differs in do not apply, not timed."""
    first = default_variant()
    names = [first, *(name for name in VARIANTS if name != first)]
    plans = {name: plan_of(**VARIANTS[name]) for name in names}
    every = next(name for name, options in VARIANTS.items() if all(options.values()))
    why = _not_applied(plans[every])
    out: list[Variant] = []
    for name in names:
        options, plan = VARIANTS[name], plans[name]
        label = name + DEFAULT_MARK if name == first else name
        twin = next((v for v in out if v.plan == plan), None)
        note = ""
        if twin is not None:
            differ = [why[k] for k in options if options[k] != twin.options[k] and k in why]
            note = f"same plan as {twin.name}: {'; '.join(differ)}"
        out.append(Variant(label, options, plan, twin.name if twin else None, note,
                           name == first))
    return out


def _time_calls(copies: list, M: int, draw: str, options: dict, stages: tuple[str, ...],
                timer: Callable[[list], float]) -> float:
    """One call (``stages`` of it) on workspaces planned with ``options``, one a copy, timed
    by ``timer`` (``graph_call_us`` warms every call, compiling its kernels, first)."""
    spaces = [tsp.SantaPPWorkspace.for_inputs(qi, kvi, pi, M, seed=i, draw=draw, **options)
              for i, (qi, kvi, pi) in enumerate(copies)]
    calls = [lambda qi=qi, kvi=kvi, pi=pi, w=w: tsp.santapp_decode(qi, kvi, pi, M, workspace=w,
                                                                   stages=stages)
             for (qi, kvi, pi), w in zip(copies, spaces, strict=True)]
    return timer(calls)


def profile_attn(batch: int, ctx: int, attn: tuple[int, int, int], Ms: list[int],
                 draws: list[str], *, stages: bool = True, device: str = "cuda",
                 timer: Callable[[list], float] = graph_call_us,
                 ) -> tuple[list[Row], list[StageRow]]:
    """Every row of one shape and attention shape, and (``stages``) the defaults' plan's
    call's cuts (``device`` and ``timer`` let a CPU test run it through the Triton
    interpreter)."""
    heads, kv_heads, head_dim = attn
    shape, label = f"{ctx // 1024}k B={batch}", "/".join(map(str, attn))
    q, kv = make_decode_inputs(DecodeShape(batch, ctx, heads, kv_heads, head_dim), seed=0,
                               device=device)
    packed = tsp.build_packed(kv)  # the method's team index (the library's defaults)
    cases = [(draw, M) for draw in draws for M in Ms]
    # the copies the call with the fewest bytes (of the defaults' plans) needs, and the
    # cuts the score's (q and the representatives: more copies, for the cuts only)
    l2 = l2_cache_bytes(device)
    n_copies = 1
    for draw, M in cases:
        if not tsp.reads_every_team(M, packed):
            _, info = tsp.santapp_decode(q, kv, packed, M, draw=draw)
            n_copies = max(n_copies, cold_l2_plan(info.bytes_moved(q), l2)[0])
    score_bytes = sum(t.nbytes for t in (q, packed.reps, packed.log_n, packed.reps_scale)
                      if t is not None)
    n_cut_copies = max(n_copies, cold_l2_plan(score_bytes, l2)[0] if stages else 1)
    copies = [(q, kv, packed)]
    for _ in range(n_cut_copies - 1):
        kv_copy = clone_kv(kv)
        copies.append((q.clone(), kv_copy, tsp.build_packed(kv_copy)))
    rows: list[Row] = []
    cut_rows: list[StageRow] = []
    for draw, M in cases:
        if tsp.reads_every_team(M, packed):
            rows.append(Row(shape, label, draw, M, "-", math.nan, math.nan,
                            f"M covers all {packed.max_teams} teams: dense attention"))
            continue
        variants = plan_variants(
            lambda **kw: tsp._plan_for(q, kv, packed, M, draw=draw, **kw))  # noqa: B023
        timed = {v.name: _time_calls(copies[:n_copies], M, draw, v.options, tsp.STAGES, timer)
                 for v in variants if v.same_as is None}
        default = next(v for v in variants if v.default)
        default_us = timed[default.name]
        for v in variants:
            us = timed.get(v.name, math.nan)
            rows.append(Row(shape, label, draw, M, v.name, us, us / default_us, v.note))
        if stages:
            *cuts, call = stage_cuts(default.plan)
            cut_rows += [StageRow(shape, label, draw, M, cut.name, _time_calls(
                copies, M, draw, default.options, cut.stages, timer)) for cut in cuts]
            cut_rows.append(StageRow(shape, label, draw, M, call.name, default_us))
    copies.clear()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return rows, cut_rows


def print_rows(rows: list[Row]) -> None:
    """A Markdown table: each plan's time and its ratio to the defaults' plan."""
    print("| shape | attn | draw | M | plan | us | vs default | note |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        us = "" if math.isnan(r.us) else f"{r.us:.1f}"
        ratio = "" if math.isnan(r.vs_default) else f"{r.vs_default:.2f}"
        print(f"| {r.shape} | {r.attn} | {r.draw} | {r.M} | {r.plan} | {us} | {ratio} | "
              f"{r.note} |")


def print_stage_rows(rows: list[StageRow]) -> None:
    """A Markdown table: each cut of the defaults' plan's call, and its time minus the
    cut's before (none for a case's first)."""
    print("| shape | attn | draw | M | stage | us | minus the stage before (us) |")
    print("|---|---|---|---|---|---|---|")
    case = before = None
    for r in rows:
        us = "" if math.isnan(r.us) else f"{r.us:.1f}"
        first = (r.shape, r.attn, r.draw, r.M) != case
        diff = "" if first or math.isnan(r.us - before) else f"{r.us - before:.1f}"
        print(f"| {r.shape} | {r.attn} | {r.draw} | {r.M} | {r.stage} | {us} | {diff} |")
        case, before = (r.shape, r.attn, r.draw, r.M), r.us


def parse_args(argv: list[str] | None = None):
    """Returns ``(shapes, attns, Ms, draws, stages)``; ValueError names the option at
    fault."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Each case is timed under four plans: both, fused_finish only, "
               "merge_ticket only, neither, the defaults' plan first and marked (default); "
               "vs default = the plan's us / the defaults' plan's. A second table times "
               "the defaults' plan's call cut at each stage (score, select, "
               "select + attend, call) and each cut minus the one before.")
    parser.add_argument("--shapes", default="1x32k,8x32k",
                        help="BATCHxCTX, comma-separated (default: %(default)s)")
    parser.add_argument("--attn", default="32/8/128,28/4/128,12/2/128",
                        help="HEADS/KV_HEADS/HEAD_DIM, comma-separated (default: %(default)s)")
    parser.add_argument("--M", default="32,64,512",
                        help="teams selected (per query head with draw=head, per KV head "
                             "with draw=pooled), comma-separated (default: %(default)s)")
    parser.add_argument("--draws", default="head,pooled",
                        help="how a GQA group's heads draw their teams, comma-separated, of "
                             f"{', '.join(KERNEL_DRAWS)} (default: %(default)s)")
    parser.add_argument("--no-stages", action="store_true",
                        help="skip the second table (the defaults' plan's call cut at each "
                             "stage)")
    args = parser.parse_args(argv)
    parsers = {"--shapes": (parse_shapes, args.shapes), "--attn": (parse_attn, args.attn),
               "--M": (_parse_teams, args.M), "--draws": (parse_draws, args.draws)}
    out = []
    for option, (parse, text) in parsers.items():
        try:
            out.append(parse(text))
        except ValueError as exc:
            raise ValueError(f"{option}: {exc}") from None
    return (*out, not args.no_stages)


def _parse_teams(text: str) -> list[int]:
    Ms = parse_list(text, int)
    if not Ms or min(Ms) < 1:
        raise ValueError(f"expected positive integers, got {text!r}")
    return Ms


def main(argv: list[str] | None = None) -> int:
    try:
        shapes, attns, Ms, draws, stages = parse_args(argv)
    except ValueError as exc:
        print(f"profile_santapp.py: {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("profile_santapp.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {triton.__version__}")
    rows: list[Row] = []
    cut_rows: list[StageRow] = []
    for batch, ctx in shapes:
        for attn in attns:
            plans, cuts = profile_attn(batch, ctx, attn, Ms, draws, stages=stages)
            rows += plans
            cut_rows += cuts
    print_rows(rows)
    if stages:
        print()
        print_stage_rows(cut_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
