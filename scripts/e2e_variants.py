"""Launch variants of the attention backends inside the e2e decode loop, on one loan.

Run on the H200:  python3 scripts/e2e_variants.py OUT_DIR
Llama-3.1-8B config with random bf16 weights, K/V filled at random (speed only), the
gemm rest, every step one CUDA-graph replay (the e2e loop of ``santa-bench e2e``). One
model and one prefilled session per shape (``E2E_SHAPES``, default ``4x32768,8x32768``);
each variant (``E2E_VARIANTS``: names of :data:`VARIANTS`, default all) decodes the same
prefill ``E2E_ROUNDS`` times (default 2), variants interleaved, so loan drift falls on
all of them alike. Rows (step median / p90 and the attention-only pass, ms; whether the
greedy tokens equal the first variant of the same backend: the variants change launches,
not arithmetic, so they must) go to OUT_DIR/variants.csv as they are measured.

``E2E_PROFILE``: variants decoded once more under torch.profiler (CUPTI kernel records of
the graph replays): per kernel its median duration, and per pair of kernels that follow
each other on the stream the median gap from the first's end to the second's start
(negative: the second started early, PDL), to OUT_DIR/profile.csv. Medians, so the two
eager warm-up steps inside a decode do not count.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import torch

import santa_kernels.triton_santa as ts
import santa_kernels.triton_santapp as tsp
import santa_kernels.triton_splitkv as tsk
from santa_bench.e2e.attention import (
    DecodeAttention,
    TritonSampledDecode,
    TritonSantaPPDecode,
    TritonSplitKVDecode,
)
from santa_bench.e2e.configs import named_config
from santa_bench.e2e.loop import DecodeSession
from santa_bench.e2e.model import Decoder
from santa_bench.methods import REGISTRY

FIELDS = ["shape", "variant", "round", "step_ms", "step_p90_ms", "attention_ms",
          "same_tokens", "seconds", "note"]
PROFILE_FIELDS = ["shape", "variant", "what", "kernel", "count", "median_us"]


def short_name(kernel: str) -> str:
    """A Triton kernel's function name (CUPTI records carry its mangled launch name)."""
    return kernel.split("(")[0].split("<")[0][:60]


def kernel_profile(trace: Path) -> list[dict]:
    """Per kernel and per consecutive pair of kernels: count and median (us) from a chrome
    trace's kernel records, in start order."""
    events = json.loads(trace.read_text())["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    durations: dict[str, list[float]] = {}
    gaps: dict[str, list[float]] = {}
    for prev, cur in zip([None, *kernels], kernels, strict=False):
        name = short_name(cur["name"])
        durations.setdefault(name, []).append(cur["dur"])
        if prev is not None:
            pair = f"{short_name(prev['name'])} -> {name}"
            gaps.setdefault(pair, []).append(cur["ts"] - prev["ts"] - prev["dur"])
    rows = [{"what": "duration", "kernel": k, "count": len(v),
             "median_us": round(statistics.median(v), 3)} for k, v in durations.items()]
    rows += [{"what": "gap", "kernel": k, "count": len(v),
              "median_us": round(statistics.median(v), 3)} for k, v in gaps.items()]
    return rows


def profiled(session, attend, out: Path, tag: str) -> list[dict]:
    """Decodes once more under torch.profiler; returns :func:`kernel_profile` rows."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        session.decode(attend, graph=True, rest="gemm")
    trace = out / f"trace-{tag}.json"
    prof.export_chrome_trace(str(trace))
    rows = kernel_profile(trace)
    trace.unlink()  # tens of MB: the table is what comes back
    return rows


def patched(obj, **values):
    """A context that sets attributes of ``obj`` (or keys, for a dict) and restores them."""
    if isinstance(obj, dict):
        return mock.patch.dict(obj, values)
    return mock.patch.multiple(obj, **values)


@contextlib.contextmanager
def plan_overrides(**kw) -> Iterator[None]:
    """SANTA++ plans made inside the block take these :func:`make_plan` keywords."""
    make_plan = tsp.make_plan

    def planned(*args, **given):
        return make_plan(*args, **{**kw, **given})

    with patched(tsp, make_plan=planned):
        yield


def forced_chain(backend: DecodeAttention, on: bool | None) -> DecodeAttention:
    """``backend`` with its PDL chain forced on/off (None: as the loop sets it)."""
    if on is not None:
        set_chain = type(backend).set_pdl_chain
        backend.set_pdl_chain = lambda _on: set_chain(backend, on)  # type: ignore[method-assign]
    return backend


def santapp_params(**overrides) -> dict:
    method = REGISTRY.get("santapp")
    return {**{p.name: p.default for p in method.params}, "M": 32, **overrides}


def splitkv(chain: bool | None, merge_pdl: bool):
    def make(scale: float):
        return forced_chain(TritonSplitKVDecode(scale), chain), patched(tsk, MERGE_PDL=merge_pdl)
    return make


def santapp(chain: bool | None, hopper: dict | None = None, reps: str = "model", **plan_kw):
    """SANTA++ M=32 (representatives ``reps``) with ``HOPPER`` overrides and
    :func:`make_plan` keywords."""
    def make(scale: float):
        ctx = contextlib.ExitStack()
        if hopper:
            ctx.enter_context(patched(tsp.HOPPER, **hopper))
        if plan_kw:
            ctx.enter_context(plan_overrides(**plan_kw))
        backend = TritonSantaPPDecode(santapp_params(reps=reps), scale, seed=0)
        return forced_chain(backend, chain), ctx
    return make


def prop(chain: bool | None, config: dict | None = None, **module):
    """santa-prop S=128 with ``HOPPER_CONFIGS[128]`` overrides and module constants
    (e.g. ``PROGRAMS_PER_SM``) patched."""
    def make(scale: float):
        ctx = contextlib.ExitStack()
        if config:
            ctx.enter_context(patched(ts.HOPPER_CONFIGS[128], **config))
        if module:
            ctx.enter_context(patched(ts, **module))
        method = REGISTRY.get("santa-prop")
        params = {**{p.name: p.default for p in method.params}, "S": 128}
        return forced_chain(TritonSampledDecode(method, params, scale, seed=0), chain), ctx
    return make


SCORE_PASS = ts._score_pass
ROWS_128 = {**tsp.HOPPER["attend_rows"], 128: 128}  # 128 K/V rows a team program at d=128

def santapp_no_union(make):
    """A SANTA++ variant whose finisher skips the union step (wrong output: profiling)."""
    def wrapped(scale: float):
        backend, ctx = make(scale)
        stack = contextlib.ExitStack()
        stack.enter_context(ctx)
        stack.enter_context(patched(tsp, STAGES=(*tsp.STAGES, "no-union")))
        return backend, stack
    return wrapped


# name: (family, factory(scale) -> (backend, context active during prepare + decode))
VARIANTS: dict[str, tuple[str, Callable]] = {
    "splitkv": ("dense", splitkv(False, False)),
    "splitkv chain": ("dense", splitkv(True, False)),
    "splitkv merge-pdl": ("dense", splitkv(False, True)),
    "splitkv chain merge-pdl": ("dense", splitkv(True, True)),
    "prop": ("prop", prop(False)),
    "prop chain": ("prop", prop(True)),
    # the session-8 launch: the 4-warp stream below 64 groups, the stash without L2 policy
    "prop chain s8": ("prop", prop(True, {"large_groups": 64, "stash_evict": ""})),
    "prop chain no-stash-l2": ("prop", prop(True, {"stash_evict": ""})),
    # the score pass's 1-warp stream (default from 64 groups) at 32 groups too
    "prop chain large@32": ("prop", prop(True, {"large_groups": 32})),
    "prop chain large@32 w2": ("prop", prop(True, {"large_groups": 32,
                                                        "stream_large": (2, 3, 6)})),
    "prop chain stages=4": ("prop", prop(True, {"stream": (4, 4)})),
    "prop chain ppsm=6": ("prop", prop(True, PROGRAMS_PER_SM=6)),
    "prop large@32": ("prop", prop(False, {"large_groups": 32})),
    "prop large@32 x12": ("prop", prop(False, {"large_groups": 32, "stream_large": (1, 4, 12)})),
    "prop large@32 x16": ("prop", prop(False, {"large_groups": 32, "stream_large": (1, 4, 16)})),
    "prop large@32 s3x8": ("prop", prop(False, {"large_groups": 32, "stream_large": (1, 3, 8)})),
    "prop chain large@32 x12": ("prop", prop(True, {"large_groups": 32,
                                                    "stream_large": (1, 4, 12)})),
    "prop ppsm=8": ("prop", prop(False, PROGRAMS_PER_SM=8)),
    "prop ppsm=12": ("prop", prop(False, PROGRAMS_PER_SM=12)),
    "prop ppsm=16": ("prop", prop(False, PROGRAMS_PER_SM=16)),
    # deeper score-pass pipelines (warps, stages): more K bytes in flight a program
    **{f"prop chain large@32 w{w}s{st}": ("prop", prop(True, {
        "large_groups": 32, "stream_large": (w, st, 8)})) for w, st in (
            (1, 5), (1, 6), (1, 7), (2, 6), (2, 7), (4, 6), (4, 7))},
    # split counts of the 1-warp stream (programs a SM they aim for)
    **{f"prop chain large@32 x{n}": ("prop", prop(True, {
        "large_groups": 32, "stream_large": (1, 4, n)})) for n in (6, 7, 9, 10)},
    # the 1-warp stream's split count forced (default at 32k: 33 at B=4, 17 at B=8)
    **{f"prop chain splits={n}": ("prop", prop(True, {"large_splits": n}))
       for n in (15, 16, 24, 31, 32, 48)},
    # K loads of two tiles (subs=2: one 128-row load and dot, statistics per 64 rows)
    **{f"prop chain subs=2 w{w}s{st}": ("prop", prop(True, {
        "subs": 2, "stream_large": (w, st, 8)})) for w, st in ((1, 2), (1, 3), (2, 3), (4, 3))},
    # profiling only (wrong outputs): the score pass without the stash (1) or any store
    # (0); the sample pass without its search (1), stash loads (2) or V gather (3)
    **{f"prop chain large@32 stores={n}": ("prop-profile", prop(
        True, {"large_groups": 32}, _score_pass=functools.partial(SCORE_PASS, stores=n)))
       for n in (0, 1)},
    **{f"prop chain large@32 sprof={n}": ("prop-profile", prop(
        True, {"large_groups": 32, "sample_profile": n})) for n in (1, 2, 3)},
    # the stash stored and loaded with an L2 evict_last policy
    "prop chain stash-el": ("prop", prop(True, {"stash_evict": "evict_last"})),
    "prop chain large@32 stash-el": ("prop", prop(True, {"large_groups": 32,
                                                         "stash_evict": "evict_last"})),
    # sample-pass programs a head (default 1 from 128 heads) and warps (default 8)
    "prop chain ssplits=2": ("prop", prop(True, {"sample_splits": 2})),
    "prop chain ssplits=4": ("prop", prop(True, {"sample_splits": 4})),
    "prop chain swarps=4": ("prop", prop(True, {"sample_small_rows": 256})),
    "santapp": ("santapp", santapp(False)),
    "santapp chain": ("santapp", santapp(True)),
    "santapp inner-pdl": ("santapp", santapp(False, {"pdl_max_groups": 64})),
    "santapp chain inner-pdl": ("santapp", santapp(True, {"pdl_max_groups": 64})),
    "santapp chain local": ("santapp", santapp(True, local=True)),
    # representatives a select program scores (default at 32k B=4-8: 256)
    "santapp chain tb=128": ("santapp", santapp(True, teams_per_split=128)),
    "santapp chain tb=512": ("santapp", santapp(True, teams_per_split=512)),
    # the select (score) kernel's warps apart from the finisher's (default: both 8)
    "santapp chain score-warps=4": ("santapp", santapp(True, {"select_warps_large": 4},
                                                       finish_warps=8)),
    "santapp chain tb=128 score-warps=4": ("santapp", santapp(
        True, {"select_warps_large": 4}, teams_per_split=128, finish_warps=8)),
    "santapp chain finish-warps=4": ("santapp", santapp(True, finish_warps=4)),
    "santapp chain attend-warps=2": ("santapp", santapp(True, {"attend_warps": 2})),
    "santapp chain rows=128": ("santapp", santapp(True, {"attend_rows": ROWS_128})),
    # int8 representatives (half the select kernel's bytes); other teams, other tokens
    "santapp chain int8": ("santapp-int8", santapp(True, reps="int8")),
    "santapp chain int8 tb=128": ("santapp-int8", santapp(True, reps="int8",
                                                          teams_per_split=128)),
    "santapp chain int8 tb=128 score-warps=4": ("santapp-int8", santapp(
        True, {"select_warps_large": 4}, reps="int8", teams_per_split=128, finish_warps=8)),
    "santapp chain int8 no-union": ("no-union", santapp_no_union(santapp(True, reps="int8"))),
    "santapp chain int8 pdl-before-merge": ("santapp-int8", santapp(
        True, {"pdl_before_merge": True}, reps="int8")),
    "santapp chain pdl-before-merge": ("santapp", santapp(True, {"pdl_before_merge": True})),
}


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "e2e-variants")
    out.mkdir(parents=True, exist_ok=True)
    shapes = [tuple(int(x) for x in s.split("x"))
              for s in os.environ.get("E2E_SHAPES", "4x32768,8x32768").split(",")]
    names = [n.strip() for n in os.environ.get("E2E_VARIANTS", ",".join(VARIANTS)).split(",")]
    profile_names = [n.strip() for n in os.environ.get("E2E_PROFILE", "").split(",") if n.strip()]
    unknown = [n for n in names + profile_names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"E2E_VARIANTS: unknown {unknown}; known: {list(VARIANTS)}")
    rounds = int(os.environ.get("E2E_ROUNDS", "2"))
    prof_file = (out / "profile.csv").open("a", newline="") if profile_names else None
    prof_writer = csv.DictWriter(prof_file, fieldnames=PROFILE_FIELDS) if prof_file else None
    if prof_writer:
        prof_writer.writeheader()
    steps = int(os.environ.get("E2E_STEPS", "32"))
    path = out / "variants.csv"
    new = not path.exists()
    f = path.open("a", newline="")
    w = csv.DictWriter(f, fieldnames=FIELDS)
    if new:
        w.writeheader()
    model = Decoder.random(named_config("llama-3.1-8b"), device="cuda", dtype=torch.bfloat16,
                           seed=0)
    for batch, ctx in shapes:
        session = DecodeSession(model, batch=batch, ctx=ctx, steps=steps, seed=0)
        session.prefill("random")
        shape = f"B={batch} {ctx // 1024}k"
        first_tokens: dict[str, torch.Tensor] = {}
        for rnd in range(rounds):
            for name in names:
                family, make = VARIANTS[name]
                row = {"shape": shape, "variant": name, "round": rnd}
                t0 = time.time()
                try:
                    attend, ctx_manager = make(session.scale)
                    with ctx_manager:
                        session.prepare(attend)
                        result = session.decode(attend, graph=True, rest="gemm")
                    ref = first_tokens.setdefault(family, result.tokens)
                    row.update(step_ms=round(result.step_ms_median, 4),
                               step_p90_ms=round(result.step_ms_p90, 4),
                               attention_ms=round(result.attention_ms_median, 4),
                               same_tokens=bool(torch.equal(ref, result.tokens)))
                except Exception as exc:  # keep the other variants
                    traceback.print_exc()
                    row["note"] = f"{type(exc).__name__}: {exc}"[:300]
                row["seconds"] = round(time.time() - t0, 1)
                w.writerow(row)
                f.flush()
                print(" | ".join(str(row.get(k, "")) for k in FIELDS), flush=True)
                del attend
                torch.cuda.empty_cache()
        for name in profile_names:
            attend, ctx_manager = VARIANTS[name][1](session.scale)
            try:
                with ctx_manager:
                    session.prepare(attend)
                    rows = profiled(session, attend, out, f"{batch}-{name.replace(' ', '_')}")
                for r in rows:
                    prof_writer.writerow({"shape": shape, "variant": name, **r})
                prof_file.flush()
                print(f"profiled {shape} {name}: {len(rows)} rows", flush=True)
            except Exception:
                traceback.print_exc()
        del session
        torch.cuda.empty_cache()
    f.close()
    if prof_file:
        prof_file.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
