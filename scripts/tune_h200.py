"""Launch-parameter sweep of the SANTA++ finisher and the prop score pass (GPU).

Run on the H200:  python3 scripts/tune_h200.py OUT_DIR [santapp] [flat] [prop]
Llama-3.1-8B shape (Hq=32, Hkv=8, d=128, bf16), inputs made on the GPU (Gaussian K/V,
Q x3 like the harness). Every figure is the median of CUDA-graph replays rotating enough
input copies that one pass reads more than 4x the L2 (cold reads), in us per call.

- ``santapp``: M=32 contiguous teams; the finishing step as one program per KV group
  (``finish_heads=0``) or per head (1, 2) with several warp counts: the full call, the
  select stage (score + finish) and the score kernel alone; first checks that every
  variant selects the same teams as ``finish_heads=0`` given the same Gumbel noise.
- ``flat``: santa-prop S=128 (fp16 stash) with a near-uniform softmax (Q x0.05, what a
  randomly initialised model gives, as in ``santa-bench e2e --prefill random``) against
  the harness's Q x3: score pass alone and the whole call.
- ``prop``: ``HOPPER_CONFIGS[128]`` stream (warps, stages) x subs for the score pass.
- ``stores``: the score pass with its statistics and stash stores, statistics only,
  neither (profiling flag ``STORES``), at the default and twice the split count.
- ``e2e``: prop and split-KV over the e2e loop's cache (32 layers, one workspace).
- ``flash``: santa-flash (``triton_santa_flash``) at S=128 and 2048 (env FLASH_BUDGETS),
  tiles of 64 (FLASH_TILES), over its default split and multiples of it (FLASH_MULTS,
  fractions too) against cuDNN; every split checked to draw the default split's counts
  given the same seed and step.
- ``split``: santa-prop's sample pass over 1-8 programs per head (``sample_splits``), S=128
  and 256: the whole call; first checks that every split draws the same samples.
- ``sample``: prop's sample pass with parts skipped (``sample_profile`` 1: the binary
  search, 2: the stash load, 3: the V gather; timing only), other warp counts, the one
  loop (env SAMPLE_BUDGETS=128,256 picks the budgets).
- ``occupancy``: prop's sample pass launches (warps, samples an iteration, programs a
  head), S=128 and 256, same samples checked.
- ``phased``: prop's sample pass as three loops (tile search, stash rows, V rows staged
  through shared memory) with 2-4 stages and 32-128 samples a block, S=128 and 256
  (env PHASED_VARIANTS=a,b picks some, PHASED_ROUNDS the alternations).
- ``tma``: prop's score pass with K through tensor descriptors (bulk tensor copies) or
  per-thread copies: the pass alone and the call at S=128 and 256 (same samples checked).
- ``tmastream``: the score pass through tensor descriptors with one (warps, stages,
  programs per SM, tiles a load) launch at every batch: the pass alone and the call.
- ``pdl``: santa-prop with the sample pass launched as a programmatic dependent of the
  score pass or not, S=128 and 256; first checks both draw the same samples.
- ``pdlpp``: SANTA++ M=32 with its kernels launched as programmatic dependents or not;
  first checks both select the same teams and agree on the output.
- ``warps``: prop's score pass with 1-2 warps a program against 4, stages 2-4, 4 or 8
  programs per SM: the pass alone and the call at S=128 (same samples checked first).
- ``pps``: prop's 4-warp score pass with 2-4 stages and 4-10 programs an SM as the split
  target: the pass alone and the call at S=128 and 256 (same samples checked first).
- ``ppknobs``: SANTA++ M=32 (teams of 16, and of 64 above 32k) with one launch knob
  changed at a time (warps, rows a chunk, merge block, search width, PDL groups): the
  call and its stage prefixes (same teams checked).
- ``finprof``: the SANTA++ finisher by parts (``"no-union"``, ``"no-search"`` stages).
- ``reps``: the SANTA++ contiguous index build with the representatives by the torch loop
  or by ``_contiguous_reps_kernel``; first checks both pack the same index.
- ``harness``: santa-prop S=128 / 256 and cuDNN timed as these sweeps time them and as
  the kernel harness does (its inputs, adapter and copy plan), with the steps between.
- ``s256``: prop S=256 with the phased sample pass over two programs a head and/or 4
  warps, the scaled row search with and without PDL, 256 samples a block (env
  S256_VARIANTS=a,b picks some, S256_ROUNDS the alternations).
- ``block``: prop's phased sample pass with 256 samples a block and the scaled search
  (the default) against 128 a block, S=128..2048.
- ``phased4``: prop where the sample pass runs one loop (e.g. B=4) against the phased
  loops with 256 or 128 samples a block.
The sections ``evict``, ``tail`` and ``statsblk`` (results/h200/tune-2026-11-29, commits
named there), ``wide`` (results/h200/tune-2026-11-29-s4, commit ``a05c5a2``) and
``colmask`` (same folder, commit ``be5f18f``), ``fold`` (results/h200/tune-2026-11-29-s5,
commit ``d6ed554``), ``pipe`` (results/h200/tune-2026-12-01-s10, commit ``964b965``),
``fstash`` and ``fstashprof`` (results/h200/tune-2026-12-02-s19, commit ``2ccaa4a``),
and santa-flash's ``flash`` (its masked and two-pass kernels' launches), ``flash2``,
``compact`` and ``fcompact`` (results/h200/tune-2026-11-29-s4 to tune-2026-12-03-s24,
last at commit ``ae66660``) went with the kernels and kernel knobs they measured; of
those only the whole-tile stash stores ``colmask`` compared were kept (as the default).
Rows go to OUT_DIR/tune.csv as they are measured (an interrupted run keeps them; a second
run into the same OUT_DIR appends).
``TUNE_SHAPES=4x32768,...`` replaces the shapes (batch x context) every section sweeps.
"""

from __future__ import annotations

import copy
import csv
import itertools
import math
import os
import sys
import time
import traceback
from pathlib import Path

import torch

import santa_kernels as sk
import santa_kernels.triton_santa as ts
import santa_kernels.triton_santa_flash as tsf
import santa_kernels.triton_santapp as tsp
from santa_bench.timing import graph_call_us
from santa_kernels.triton_splitkv import SplitKVWorkspace, splitkv_decode

SHAPES = [(1, 32768), (8, 32768), (1, 131072)]
if os.environ.get("TUNE_SHAPES"):  # e.g. TUNE_SHAPES=4x32768,16x8192 (batch x context)
    SHAPES = [tuple(int(v) for v in shape.split("x"))
              for shape in os.environ["TUNE_SHAPES"].split(",")]
FINISH_VARIANTS = {  # measured 2026-11-29 (results/h200/tune-2026-11-29): head1-w8 best
    "group": {"finish_heads": 0},
    "head1-w8": {"finish_heads": 1, "finish_warps": 8},
    "head1-w16": {"finish_heads": 1, "finish_warps": 16},
    "head1-w4": {"finish_heads": 1, "finish_warps": 4},
}
STREAM_VARIANTS = [(4, 2), (4, 3), (4, 4), (4, 5), (8, 3), (8, 4)]
TAU = 128**-0.5
FIELDS = ["section", "shape", "variant", "what", "us", "note"]


class Rows:
    """The sweep's CSV: appended to when it exists (two sections run into one OUT keep
    both), with its header once."""

    def __init__(self, path: Path) -> None:
        fresh = not path.exists() or path.stat().st_size == 0
        self.f = open(path, "a", newline="")  # noqa: SIM115 (kept open for the run)
        self.w = csv.DictWriter(self.f, fieldnames=FIELDS)
        if fresh:
            self.w.writeheader()

    def add(self, **row) -> None:
        self.w.writerow(row)
        self.f.flush()
        print(" | ".join(f"{row.get(k, '')}" for k in FIELDS), flush=True)


def gpu_inputs(batch: int, ctx: int, seed: int, q_scale: float = 3.0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = (torch.randn(batch, 32, 128, device="cuda", generator=gen) * q_scale).bfloat16()
    k = torch.randn(batch, ctx, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(batch, ctx, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    return q, sk.KVCache.contiguous(k, v)


def copies(batch: int, ctx: int, read_fraction: float) -> int:
    kv_bytes = 2 * batch * ctx * 8 * 128 * 2
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    wanted = math.ceil(4 * l2 / max(1, read_fraction * kv_bytes))
    free, _ = torch.cuda.mem_get_info()
    return max(3, min(24, wanted, int(0.35 * free) // kv_bytes))


def dense_us(inputs) -> float:
    outs = [torch.empty_like(q) for q, _ in inputs]
    wss = [SplitKVWorkspace.for_inputs(q, kv) for q, kv in inputs]
    return graph_call_us([lambda q=q, kv=kv, o=o, w=w: splitkv_decode(q, kv, out=o, workspace=w)
                          for (q, kv), o, w in zip(inputs, outs, wss, strict=True)])


def santapp_cases(rows: Rows, section: str):
    """Yields ``(shape tag, inputs, packs, gumbels)`` per shape and team size (M=32): rotated
    input copies for cold reads, their contiguous indexes, one shared Gumbel noise; the
    split-KV row of each shape first."""
    for batch, ctx in SHAPES:
        tag = f"B={batch} {ctx // 1024}k"
        inputs = [gpu_inputs(batch, ctx, i) for i in range(copies(batch, ctx, 0.1))]
        rows.add(section=section, shape=tag, variant="splitkv", what="call",
                 us=f"{dense_us(inputs[:3]):.2f}", note=f"{len(inputs)} copies")
        team_sizes = (16, 64) if ctx > 32768 else (16,)
        if os.environ.get("PP_TEAM_SIZES"):  # e.g. PP_TEAM_SIZES=16,64,128
            team_sizes = tuple(int(p) for p in os.environ["PP_TEAM_SIZES"].split(","))
        for P in team_sizes:
            packs = [tsp.build_packed(kv, team_size=P, sink=0, exact_recent=0) for _, kv in inputs]
            gumbels = -torch.log(-torch.log(
                torch.rand(batch, 32, packs[0].max_teams, device="cuda").clamp(1e-12, 1 - 1e-7)))
            yield f"{tag} P={P}", inputs, packs, gumbels
        del inputs
        torch.cuda.empty_cache()


def santapp_run(inputs, packs, gumbels, **ws_kw):
    """(workspaces, (kappa, union sets, output, HBM bytes by the byte model) of the first
    copy given ``gumbels``)."""
    wss = [tsp.SantaPPWorkspace.for_inputs(q, kv, p, 32, seed=i, **ws_kw)
           for i, ((q, kv), p) in enumerate(zip(inputs, packs, strict=True))]
    (q0, kv0), p0 = inputs[0], packs[0]
    out, info = tsp.santapp_decode(q0, kv0, p0, 32, gumbels=gumbels, workspace=wss[0])
    return wss, (info.kappa.clone(), info.union_sets(), out.float().clone(), info.bytes_moved(q0))


def same_selection(got, base) -> bool:
    """The same kappa and unions, outputs equal to 1% of their largest entry (HT outputs on
    random keys reach tens, where bf16 steps exceed an absolute 1e-2)."""
    return (torch.equal(got[0], base[0]) and got[1] == base[1]
            and float((got[2] - base[2]).abs().max()) < 1e-2 * max(1.0, float(base[2].abs().max())))


def santapp_calls(inputs, packs, wss, stages=tsp.STAGES):
    return [lambda q=q, kv=kv, p=p, w=w: tsp._launch(q, kv, p, 32, w, TAU, None, None, stages)
            for (q, kv), p, w in zip(inputs, packs, wss, strict=True)]


def santapp_section(rows: Rows) -> None:
    for shape, inputs, packs, gumbels in santapp_cases(rows, "santapp"):
        base = None
        for name, kw in FINISH_VARIANTS.items():
            try:
                wss, got = santapp_run(inputs, packs, gumbels, **kw)
                base = base or got
                full = graph_call_us(santapp_calls(inputs, packs, wss))
                select = graph_call_us(santapp_calls(inputs, packs, wss, ("select",)))
                plan = wss[0].plan
                note = (f"same={same_selection(got, base)} parts={plan.finish_parts} "
                        f"warps={plan.finish_warps} ways={plan.finish_ways} "
                        f"local={plan.local} c_pad={plan.c_pad}")
                rows.add(section="santapp", shape=shape, variant=name, what="call",
                         us=f"{full:.2f}", note=note)
                rows.add(section="santapp", shape=shape, variant=name, what="select",
                         us=f"{select:.2f}", note="")
                if name == "group":
                    score = graph_call_us(santapp_calls(inputs, packs, wss, ("score",)))
                    rows.add(section="santapp", shape=shape, variant=name, what="score",
                             us=f"{score:.2f}", note="")
            except Exception as exc:  # report and go on
                rows.add(section="santapp", shape=shape, variant=name, what="FAILED", us="",
                         note=f"{type(exc).__name__}: {exc}"[:300])


def prop_calls(inputs, S, splits=None, stores=2):
    wss = [ts.SantaWorkspace.for_inputs(q, kv, S, 64, num_splits=splits,
                                        stash_dtype=torch.float16) for q, kv in inputs]
    score = [lambda q=q, kv=kv, w=w: ts._score_pass(q, kv, w, TAU, 64, stores)
             for (q, kv), w in zip(inputs, wss, strict=True)]
    full = [lambda q=q, kv=kv, w=w: ts.santa_prop(q, kv, S, workspace=w,
                                                  stash_dtype=torch.float16)
            for (q, kv), w in zip(inputs, wss, strict=True)]
    return score, full


def flat_section(rows: Rows) -> None:
    for batch, ctx in SHAPES[:2]:
        tag = f"B={batch} {ctx // 1024}k"
        for q_scale in (3.0, 0.05):
            inputs = [gpu_inputs(batch, ctx, i, q_scale) for i in range(3)]
            score, full = prop_calls(inputs, 128)
            _, info = ts.santa_prop(*inputs[0], 128, stash_dtype=torch.float16)
            unique = info.read_counts(128).v_rows.float().mean().item() if hasattr(
                info, "read_counts") else float("nan")
            rows.add(section="flat", shape=tag, variant=f"q x{q_scale}", what="score",
                     us=f"{graph_call_us(score):.2f}", note="")
            rows.add(section="flat", shape=tag, variant=f"q x{q_scale}", what="call S=128",
                     us=f"{graph_call_us(full):.2f}",
                     note=f"unique V rows per KV group {unique:.1f}")
            del inputs
            torch.cuda.empty_cache()


def fixed_stream(config: dict) -> dict:
    """``config`` without the large-batch launch (``stream_large``), so that its
    ``stream`` launch is the one timed at every batch."""
    return {k: v for k, v in config.items() if k != "stream_large"}


def score_and_call(rows: Rows, section: str, tag: str, name: str, inputs, note: str = "",
                   budgets: tuple[int, ...] = (128,)) -> None:
    """Rows: prop's score pass alone (with its K rate) and the whole call at each S."""
    try:
        for S in budgets:
            score, full = prop_calls(inputs, S)
            if budgets[0] == S:  # the score pass does not depend on S
                t_score = graph_call_us(score)
                k_bytes = sum(kv.k.numel() * kv.k.element_size() for _, kv in inputs)
                rows.add(section=section, shape=tag, variant=name, what="score",
                         us=f"{t_score:.2f}",
                         note=f"{k_bytes / len(inputs) / t_score / 1e6:.2f} TB/s K")
            rows.add(section=section, shape=tag, variant=name, what=f"call S={S}",
                     us=f"{graph_call_us(full):.2f}", note=note)
    except Exception as exc:
        rows.add(section=section, shape=tag, variant=name, what="FAILED", us="",
                 note=f"{type(exc).__name__}: {exc}"[:300])


def prop_section(rows: Rows) -> None:
    default = copy.deepcopy(ts.HOPPER_CONFIGS)
    for batch, ctx in SHAPES:
        tag = f"B={batch} {ctx // 1024}k"
        inputs = [gpu_inputs(batch, ctx, i) for i in range(3)]
        rows.add(section="prop", shape=tag, variant="splitkv", what="call",
                 us=f"{dense_us(inputs):.2f}", note="")
        for warps, stages in STREAM_VARIANTS:
            for subs in (1, 2):
                ts.HOPPER_CONFIGS[128] = {**fixed_stream(default[128]), "stream": (warps, stages),
                                          "subs": subs}
                score_and_call(rows, "prop", tag, f"w{warps}s{stages}x{subs}", inputs)
        ts.HOPPER_CONFIGS[128] = copy.deepcopy(default[128])
        del inputs
        torch.cuda.empty_cache()


def stores_section(rows: Rows) -> None:
    """What the score pass's stores cost (statistics + stash, statistics only, neither),
    with its tail on the dot's 16 padded rows or on the G real rows (``narrow``)."""
    default = copy.deepcopy(ts.HOPPER_CONFIGS)
    for batch, ctx in SHAPES:
        tag = f"B={batch} {ctx // 1024}k"
        inputs = [gpu_inputs(batch, ctx, i) for i in range(3)]
        for narrow in (False, True):
            ts.HOPPER_CONFIGS[128] = {**default[128], "narrow": narrow}
            for stores in (2, 1, 0):
                try:
                    score, full = prop_calls(inputs, 128, None, stores)
                    t = graph_call_us(score)
                    rows.add(section="stores", shape=tag, variant=f"narrow={narrow}",
                             what=f"score stores={stores}", us=f"{t:.2f}",
                             note=f"{batch * ctx * 8 * 128 * 2 / t / 1e6:.2f} TB/s K")
                    if stores == 2:
                        rows.add(section="stores", shape=tag, variant=f"narrow={narrow}",
                                 what="call S=128", us=f"{graph_call_us(full):.2f}", note="")
                except Exception as exc:
                    rows.add(section="stores", shape=tag, variant=f"narrow={narrow}",
                             what="FAILED", us="", note=f"{type(exc).__name__}: {exc}"[:300])
        ts.HOPPER_CONFIGS[128] = copy.deepcopy(default[128])
        del inputs
        torch.cuda.empty_cache()


def e2e_section(rows: Rows, batch: int = 8, ctx: int = 32768, layers: int = 32,
                device: str = "cuda") -> None:
    """prop and split-KV on the e2e loop's cache (32 layers, B=8, 32k, capacity ctx + 32,
    one shared workspace) against three harness-style copies."""
    from santa_bench.e2e.cache import StaticKVCache

    if device == "cuda":
        device = f"cuda:{torch.cuda.current_device()}"
    cache = StaticKVCache(num_layers=layers, batch=batch, capacity=ctx + 32, num_kv_heads=8,
                          head_dim=128, dtype=torch.bfloat16, device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    for k, v in zip(cache.k, cache.v, strict=True):
        k.normal_(generator=gen)
        v.normal_(generator=gen)
    kvs = cache.layers
    shared = ts.SantaWorkspace(batch, 32, 8, cache.capacity, 128, 128, 64, device=device,
                              stash_dtype=torch.float16)
    for length, q_scale in ((ctx, 3.0), (ctx + 32, 3.0), (ctx + 32, 1.25), (ctx + 32, 30.0)):
        cache.lengths.fill_(length)
        q = (torch.randn(batch, 32, 128, device=device, generator=gen) * q_scale).bfloat16()
        tag = f"B={batch} len={length} q x{q_scale}"
        calls = [lambda kv=kv, q=q: ts.santa_prop(q, kv, 128, workspace=shared,
                                                  stash_dtype=torch.float16) for kv in kvs]
        rows.add(section="e2e", shape=tag, variant=f"{layers} layers shared ws",
                 what="call S=128", us=f"{graph_call_us(calls):.2f}",
                 note=f"splits={shared.num_splits}")
        score = [lambda kv=kv, q=q: ts._score_pass(q, kv, shared, TAU, 64) for kv in kvs]
        rows.add(section="e2e", shape=tag, variant=f"{layers} layers shared ws", what="score",
                 us=f"{graph_call_us(score):.2f}", note="")
    del cache, kvs
    torch.cuda.empty_cache()


def flash_section(rows: Rows) -> None:
    """santa-flash (triton_santa_flash) against cuDNN over its default split and multiples
    of it; each split checked to draw the default split's counts given the same seed and
    step (the Philox offsets are a tile's, whatever the split)."""
    budgets = [int(x) for x in os.environ.get("FLASH_BUDGETS", "128,2048").split(",")]
    tiles = [int(x) for x in os.environ.get("FLASH_TILES", "64").split(",")]
    # split multipliers of the default split (fractions allowed: 0.5 halves it)
    mults = [float(x) for x in os.environ.get("FLASH_MULTS", "1").split(",")]
    from santa_bench.baselines.sdpa import CUDNN

    for batch, ctx in SHAPES:
        tag = f"B={batch} {ctx // 1024}k"
        inputs = [gpu_inputs(batch, ctx, i) for i in range(3)]
        cudnn = [CUDNN.prepare(q, kv).run for q, kv in inputs]
        rows.add(section="flash", shape=tag, variant="sdpa-cudnn", what="call",
                 us=f"{graph_call_us(cudnn):.2f}", note="")
        del cudnn
        (q0, kv0) = inputs[0]
        for tile, S in itertools.product(tiles, budgets):
            default = tsf.flash_workspace(q0, kv0, S, tile).num_splits
            base = None
            for mult in mults:
                splits = max(1, round(mult * default))
                try:
                    wss = [ts.SantaWorkspace.for_inputs(q, kv, S, tile, num_splits=splits)
                           for q, kv in inputs]
                    out, info = tsf.santa_flash(q0, kv0, S, workspace=wss[0], seed=1,
                                                return_counts=True, tile=tile)
                    counts = info.row_counts().clone()
                    base = base or (counts, out.float().clone())
                    same = torch.equal(counts, base[0])
                    diff = float((out.float() - base[1]).abs().max())
                    v_frac = float((counts.view(batch, 8, -1, ctx).amax(2) > 0).float().mean())
                    calls = [lambda q=q, kv=kv, w=w, S=S, t=tile:
                             tsf.santa_flash(q, kv, S, workspace=w, tile=t)
                             for (q, kv), w in zip(inputs, wss, strict=True)]
                    rows.add(section="flash", shape=tag, variant=f"splits x{mult:g} ({splits})",
                             what=f"S={S} tile={tile}", us=f"{graph_call_us(calls):.2f}",
                             note=f"same={same} maxdiff={diff:.2e} V rows {100 * v_frac:.1f}%")
                    del wss
                except Exception as exc:  # report and go on
                    rows.add(section="flash", shape=tag, variant=f"splits x{mult:g}",
                             what="FAILED", us="", note=f"{type(exc).__name__}: {exc}"[:300])
        del inputs
        torch.cuda.empty_cache()


def prop_draw(q, kv, S: int):
    """(sample indices, output) of one santa-prop call on a fresh workspace (seed 3)."""
    ws = ts.SantaWorkspace.for_inputs(q, kv, S, 64, seed=3, stash_dtype=torch.float16)
    out, info = ts.santa_prop(q, kv, S, workspace=ws, stash_dtype=torch.float16)
    return info.sample_index.clone(), out.float().clone()


def checked_draw(inputs, base):
    """``(base, same)``: one S=128 draw on the first input copy, against ``base`` (the first
    draw of a sweep; this one where None); ``same`` is the exception's name where the
    draw fails (the timing that follows reports the failure)."""
    try:
        got = prop_draw(*inputs[0], 128)
    except Exception as exc:
        return base, type(exc).__name__
    base = base or got
    return base, (torch.equal(got[0], base[0])
                  and float((got[1] - base[1]).abs().max()) < 1e-2)


def prop_variants(rows: Rows, section: str, variants: dict[str, dict], budgets=(128,),
                  reps: int = 1, same_samples: bool = True, score: bool = False) -> None:
    """santa-prop with ``HOPPER_CONFIGS[128]`` overridden by each variant, alternated
    ``reps`` times (drift between runs shows), timed over rotated inputs; with
    ``same_samples``, first checks each variant draws the first one's samples."""
    default = copy.deepcopy(ts.HOPPER_CONFIGS)
    for batch, ctx in SHAPES:
        tag = f"B={batch} {ctx // 1024}k"
        inputs = [gpu_inputs(batch, ctx, i) for i in range(3)]
        rows.add(section=section, shape=tag, variant="splitkv", what="call",
                 us=f"{dense_us(inputs):.2f}", note="")
        if score:
            rows.add(section=section, shape=tag, variant="score pass", what="",
                     us=f"{graph_call_us(prop_calls(inputs, 128)[0]):.2f}", note="")
        for S in budgets:
            base = None
            for rep in range(reps):
                for name, overrides in variants.items():
                    ts.HOPPER_CONFIGS[128] = {**default[128], **overrides}
                    try:
                        note = f"rep={rep} splits={ts.sample_splits_for(batch * 32, S)}"
                        if same_samples:
                            got = prop_draw(*inputs[0], S)
                            base = base or got
                            same = (torch.equal(got[0], base[0])
                                    and float((got[1] - base[1]).abs().max()) < 1e-2)
                            note += f" same={same}"
                        _, full = prop_calls(inputs, S)
                        rows.add(section=section, shape=tag, variant=name, what=f"call S={S}",
                                 us=f"{graph_call_us(full):.2f}", note=note)
                    except Exception as exc:
                        rows.add(section=section, shape=tag, variant=name, what="FAILED",
                                 us="", note=f"{type(exc).__name__}: {exc}"[:300])
        ts.HOPPER_CONFIGS[128] = copy.deepcopy(default[128])
        del inputs
        torch.cuda.empty_cache()


def split_section(rows: Rows) -> None:
    prop_variants(rows, "split", {f"sample_splits={n}": {"sample_splits": n}
                                  for n in (1, 2, 4, 8)}, budgets=(128, 256))


def sample_section(rows: Rows) -> None:
    """prop's sample pass with parts skipped (timing only), other warp counts and the one
    loop instead of the phased loops; env SAMPLE_BUDGETS=128,256 (default 128)."""
    variants = {"default": {}, "no search": {"sample_profile": 1},
                "no stash": {"sample_profile": 2}, "no V": {"sample_profile": 3},
                "warps 4": {"sample": (4, 128)}, "warps 16": {"sample": (16, 128)},
                "phased block 64": {"sample_phased_block": 64},
                "one loop": {"sample_phased": 0}}
    budgets = tuple(int(v) for v in os.environ.get("SAMPLE_BUDGETS", "128").split(","))
    prop_variants(rows, "sample", variants, budgets=budgets, same_samples=False, score=True)


OCCUPANCY_VARIANTS = {  # the sample pass: (warps, samples an iteration), programs a head
    # (the register-cap rows "rN" of 1-occupancy.csv went with their knob, sample_maxnreg:
    # code at 4f2d924)
    "default": {},
    "w8 b256": {"sample": (8, 256)},
    "w8 b64": {"sample": (8, 64)},
    "small w8": {"sample_small_warps": 8},
    "splits 8": {"sample_splits": 8},
}


PHASED_VARIANTS = {  # the sample pass as three loops, the V gather pipelined
    "default": {},
    "ph2 b128": {"sample_phased": 2, "sample_phased_block": 128},
    "ph3 b128": {"sample_phased": 3, "sample_phased_block": 128},
    "ph3 b64": {"sample_phased": 3, "sample_phased_block": 64},
    "ph4 b64": {"sample_phased": 4, "sample_phased_block": 64},
    "ph3 b32": {"sample_phased": 3, "sample_phased_block": 32},
    "ph2 b256": {"sample_phased": 2, "sample_phased_block": 256},  # S=256: one block
    "ph1 b256": {"sample_phased": 1, "sample_phased_block": 256},
}


def phased_section(rows: Rows) -> None:
    """prop's sample pass as three loops (tile search; stash rows; V rows pipelined through
    shared memory by a product with ones) against the one loop, S=128 and 256, same
    samples checked."""
    wanted = os.environ.get("PHASED_VARIANTS")  # e.g. "default,ph2 b128"
    variants = {name: knobs for name, knobs in PHASED_VARIANTS.items()
                if not wanted or name in wanted.split(",")}
    prop_variants(rows, "phased", variants, budgets=(128, 256),
                  reps=int(os.environ.get("PHASED_ROUNDS", "1")))


def index_section(rows: Rows) -> None:
    """prop's row search inside each sampled tile: the CDF entry of every row against the
    threshold, or one rescaled threshold a sample against the running sums
    (``index_scaled_rows``: up to that many heads), S=128 and 256, three alternated rounds
    (8-index.csv in results/h200/tune-2026-12-02-s15 ran "scaled" as a flag at every
    batch, code cefc371)."""
    prop_variants(rows, "index", {"default": {}, "unscaled": {"index_scaled_rows": 0},
                                  "scaled": {"index_scaled_rows": 1 << 30}},
                  budgets=(128, 256), reps=3, same_samples=False)


def occupancy_section(rows: Rows) -> None:
    """prop's sample pass with other block sizes, warps and programs a head (by the
    offline sm_90 compile: 255 registers and 1 program of 8 warps an SM, with a spill at
    256 samples an iteration), S=128 and 256, two rounds."""
    prop_variants(rows, "occupancy", OCCUPANCY_VARIANTS, budgets=(128, 256), reps=2)


def tma_section(rows: Rows) -> None:
    """prop with K through tensor descriptors (``tma``: bulk tensor copies) or per-thread
    copies, two rounds: the score pass alone and the call at S=128 and 256, first
    checking both draw the same samples."""
    default = copy.deepcopy(ts.HOPPER_CONFIGS)
    variants = {"copies": {}, "tma": {"tma": True}}
    for batch, ctx in SHAPES:
        tag = f"B={batch} {ctx // 1024}k"
        inputs = [gpu_inputs(batch, ctx, i) for i in range(3)]
        rows.add(section="tma", shape=tag, variant="splitkv", what="call",
                 us=f"{dense_us(inputs):.2f}", note="")
        base = None
        for rep in range(2):
            for name, overrides in variants.items():
                ts.HOPPER_CONFIGS[128] = {**default[128], **overrides}
                base, same = checked_draw(inputs, base)
                score_and_call(rows, "tma", tag, name, inputs, note=f"same={same} rep={rep}",
                               budgets=(128, 256))
        ts.HOPPER_CONFIGS[128] = copy.deepcopy(default[128])
        del inputs
        torch.cuda.empty_cache()


TMA_STREAMS = [(4, 3, 4, 1), (1, 4, 8, 1), (4, 4, 4, 1), (4, 2, 4, 1), (2, 4, 4, 1),
               (2, 3, 8, 1), (1, 3, 8, 1), (2, 4, 8, 1), (4, 3, 4, 2), (4, 2, 8, 1),
               (1, 2, 8, 2), (8, 3, 2, 2)]


def tmastream_section(rows: Rows) -> None:
    """prop's score pass with K through tensor descriptors, one launch at every batch:
    (warps, stages, programs per SM, tiles a load) in ``TMA_STREAMS``: the pass alone and
    the call at S=128, first checking each draws the first one's samples."""
    default, pps = copy.deepcopy(ts.HOPPER_CONFIGS), ts.PROGRAMS_PER_SM
    for batch, ctx in SHAPES:
        tag = f"B={batch} {ctx // 1024}k"
        inputs = [gpu_inputs(batch, ctx, i) for i in range(3)]
        base = None
        for warps, stages, per_sm, subs in TMA_STREAMS:
            ts.HOPPER_CONFIGS[128] = {**fixed_stream(default[128]), "tma": True,
                                      "stream": (warps, stages), "subs": subs}
            ts.PROGRAMS_PER_SM = per_sm
            base, same = checked_draw(inputs, base)
            score_and_call(rows, "tmastream", tag, f"w{warps}s{stages} pps{per_sm} x{subs}",
                           inputs, note=f"same={same}")
        ts.HOPPER_CONFIGS[128], ts.PROGRAMS_PER_SM = copy.deepcopy(default[128]), pps
        del inputs
        torch.cuda.empty_cache()


def pdl_section(rows: Rows) -> None:
    prop_variants(rows, "pdl", {"pdl=0": {"pdl": False}, "pdl=1": {"pdl": True}},
                  budgets=(128, 256), reps=2)


def pdlpp_section(rows: Rows) -> None:
    max_groups = tsp.HOPPER["pdl_max_groups"]
    for shape, inputs, packs, gumbels in santapp_cases(rows, "pdlpp"):
        base = None
        for rep in range(2):
            for pdl in (False, True, "all"):  # "all": also where B * Hkv > pdl_max_groups
                tsp.HOPPER["pdl"] = bool(pdl)
                tsp.HOPPER["pdl_max_groups"] = 1 << 30 if pdl == "all" else max_groups
                try:
                    wss, got = santapp_run(inputs, packs, gumbels)
                    base = base or got
                    rows.add(section="pdlpp", shape=shape, variant=f"pdl={pdl}",
                             what="call M=32",
                             us=f"{graph_call_us(santapp_calls(inputs, packs, wss)):.2f}",
                             note=f"same={same_selection(got, base)} rep={rep}")
                except Exception as exc:
                    rows.add(section="pdlpp", shape=shape, variant=f"pdl={pdl}",
                             what="FAILED", us="", note=f"{type(exc).__name__}: {exc}"[:300])
        tsp.HOPPER["pdl"] = True
        tsp.HOPPER["pdl_max_groups"] = max_groups


def _attend_rows(rows_d128: int) -> dict[int, int]:
    """``HOPPER["attend_rows"]`` with ``rows_d128`` rows a team program at head dim 128."""
    return {**tsp.HOPPER["attend_rows"], 128: rows_d128}


PP_KNOBS = {  # HOPPER overrides (or workspace keywords, "ws") of the SANTA++ launches
    "default": {},  # 64 rows a program at d=128 (the CSVs' "rows=64" rows at 7348d68)
    "rows=128 warps=8": {"attend_rows": _attend_rows(128), "attend_warps": 8},
    "rows=256 warps=8": {"attend_rows": _attend_rows(256), "attend_warps": 8},
    "rows=256 warps=4": {"attend_rows": _attend_rows(256)},
    "rows=128 warps=2": {"attend_rows": _attend_rows(128), "attend_warps": 2},
    "attend_warps=8": {"attend_warps": 8},
    "attend_warps=2": {"attend_warps": 2},
    "attend_rows=32": {"attend_rows": _attend_rows(32)},
    "attend_rows=128": {"attend_rows": _attend_rows(128)},
    "merge_block=32": {"merge_block": 32},
    "merge_block=128": {"merge_block": 128},
    "merge_warps=8": {"merge_warps": 8},
    "select_warps_small=8": {"select_warps_small": 8},
    "select_warps_large=4": {"select_warps_large": 4},
    "search_keys=8": {"search_8way_keys_per_thread": 8},
    "search_keys=32": {"search_8way_keys_per_thread": 32},
    "pdl_max_groups=64": {"pdl_max_groups": 64},
    "finish_warps=4": {"ws": {"finish_heads": 1, "finish_warps": 4}},
    "finish_warps=16": {"ws": {"finish_heads": 1, "finish_warps": 16}},
    "local": {"ws": {"local": True}},
    "local finish_warps=4": {"ws": {"local": True, "finish_warps": 4}},
    "score_warps=8": {"score_warps_few": 8},  # the select kernel's warps before tune-2026-12-01-s11
    "bracket off": {"ws": {"bracket": False}},  # the finisher's search from [least, top]
    "lists off": {"ws": {"head_lists": False}},  # the union step (ticket) instead
    # the finisher of tune-2026-12-01-s10
    "both off": {"ws": {"bracket": False, "head_lists": False}},
    "both off finish_warps=4": {"ws": {"bracket": False, "head_lists": False,
                                       "finish_warps": 4}},
    # the finisher's bracketed search (tune-2026-12-01-s11)
    "compact off": {"ws": {"compact": False}},
    "merge kernel": {"ws": {"merge_atomic": False}},  # partials merged by their own kernel
    "merge atomic": {"ws": {"merge_atomic": True}},  # ... by atomic sums in the attend grid
    "pdl bf16": {"pdl_before_merge": True},  # select -> finish -> attend chained, any reps
    "select_teams_many=64": {"select_teams_many": 64},
    "select_teams_many=256": {"select_teams_many": 256},
    "score_warps_many=8": {"score_warps_many": 8},
    "score_warps_many=2": {"score_warps_many": 2},
    # team programs walking 2-16 tiles of the list, their tile loop pipelined 1-6 deep
    **{f"loops={n} stages={st}": {"ws": {"attend_loops": n, "attend_stages": st}}
       for n in (2, 4, 8, 16) for st in (1, 2, 3, 4, 5, 6)},
    # ... their list entries (one team a tile: rows and weights too) loaded before the loop
    **{f"preload loops={n} stages={st}": {"ws": {"attend_loops": n, "attend_stages": st,
                                                 "attend_preload": True}}
       for n in (2, 4, 8, 16, 32, 64) for st in (1, 2, 3, 4, 5)},
    # the default of tune-2026-12-04-s25 (4 tiles at most)
    "no preload": {"ws": {"attend_preload": False}},
    **{f"preload loops={n} stages={st} lists off": {
        "ws": {"attend_loops": n, "attend_stages": st, "attend_preload": True,
               "head_lists": False}} for n in (4, 8) for st in (1, 3)},
    **{f"loops={n} stages={st} rows=128": {"attend_rows": _attend_rows(128),
                                          "ws": {"attend_loops": n, "attend_stages": st}}
       for n in (2, 4) for st in (2, 3)},
}


def ppknobs_section(rows: Rows) -> None:
    """SANTA++ M=32 with one launch knob changed at a time (``PP_KNOBS``; env PP_KNOBS=a,b
    picks some): the whole call and its select / select+attend prefixes, each checked to
    select the default's teams (set TUNE_SHAPES, e.g. 4x32768,8x32768)."""
    default = copy.deepcopy(tsp.HOPPER)
    wanted = os.environ.get("PP_KNOBS")  # e.g. "default,attend_rows=128"
    knobs_run = {name: knobs for name, knobs in PP_KNOBS.items()
                 if not wanted or name in wanted.split(",")}
    for shape, inputs, packs, gumbels in santapp_cases(rows, "ppknobs"):
        base = None
        for name, knobs in knobs_run.items():
            tsp.HOPPER.update({k: v for k, v in knobs.items() if k != "ws"})
            try:
                wss, got = santapp_run(inputs, packs, gumbels, **knobs.get("ws", {}))
                base = base or got
                plan = wss[0].plan
                note = (f"same={same_selection(got, base)} MB={got[3] / 1e6:.1f} "
                        f"programs={plan.batch * plan.num_kv_heads * plan.num_parts} "
                        f"loops={plan.loops}")
                for what, stages in (("call", tsp.STAGES), ("select", ("select",)),
                                     ("select+attend", ("select", "attend"))):
                    us = graph_call_us(santapp_calls(inputs, packs, wss, stages))
                    rows.add(section="ppknobs", shape=shape, variant=name, what=what,
                             us=f"{us:.2f}", note=f"{note} GB/s={got[3] / us / 1e3:.0f}")
            except Exception as exc:
                rows.add(section="ppknobs", shape=shape, variant=name, what="FAILED", us="",
                         note=f"{type(exc).__name__}: {exc}"[:300])
            tsp.HOPPER.clear()
            tsp.HOPPER.update(copy.deepcopy(default))


FINISH_PROFILE = {  # stage sets of the SANTA++ call: what the finisher's parts cost
    "score": ("score",),
    "select": ("select",),
    "select, no union": ("select", "no-union"),
    "select, neither": ("select", "no-search"),  # no search: no union either
    "call": tsp.STAGES,
}


def finprof_section(rows: Rows) -> None:
    """SANTA++ M=32: the select kernel alone, then with the finisher in full, without its
    union step (or head lists), without both its kth search and the union (kappa = -inf:
    the z loads go with the search; timing only: the outputs are wrong), and the whole
    call; two rounds."""
    for shape, inputs, packs, gumbels in santapp_cases(rows, "finprof"):
        wss, _ = santapp_run(inputs, packs, gumbels)
        for rep in range(2):
            for name, stages in FINISH_PROFILE.items():
                us = graph_call_us(santapp_calls(inputs, packs, wss, stages))
                rows.add(section="finprof", shape=shape, variant=name, what="stages",
                         us=f"{us:.2f}", note=f"rep={rep}")


def reps_section(rows: Rows) -> None:
    """SANTA++ contiguous index build: the representatives by the torch loop or by
    ``_contiguous_reps_kernel`` (``reps_kernel``), leader and mean, P=16 and 64; first
    checks both give the same packed index."""
    for batch, ctx in SHAPES:
        tag = f"B={batch} {ctx // 1024}k"
        _, kv = gpu_inputs(batch, ctx, 0)
        for P in (16, 64):
            for rep in ("leader", "mean"):
                got = {}
                for kernel in (False, True):
                    packed, ms = tsp.time_index_build(kv, team_size=P, representative=rep,
                                                      reps_kernel=kernel, repeats=5,
                                                      sink=0, exact_recent=0)
                    got[kernel] = packed
                    same = (torch.equal(packed.reps, got[False].reps)
                            and torch.equal(packed.log_n, got[False].log_n))
                    rows.add(section="reps", shape=f"{tag} P={P}", variant=f"kernel={int(kernel)}",
                             what=f"build {rep}", us=f"{ms * 1e3:.1f}",
                             note=f"same={same}")
        del kv
        torch.cuda.empty_cache()


def warps_section(rows: Rows) -> None:
    """prop's score pass with 1-2 warps a program (intra-warp reductions: fewer CTA
    barriers per tile) against the default 4, stages 2-4, and 4 or 8 programs per SM
    (``PROGRAMS_PER_SM``): the score pass alone and the whole call at S=128, first
    checking each variant draws the default's samples."""
    default, pps = copy.deepcopy(ts.HOPPER_CONFIGS), ts.PROGRAMS_PER_SM
    variants = [(4, 3, 4), (2, 3, 4), (2, 4, 4), (1, 3, 4), (1, 4, 4), (2, 3, 8), (1, 3, 8),
                (1, 4, 8)]
    for batch, ctx in SHAPES:
        tag = f"B={batch} {ctx // 1024}k"
        inputs = [gpu_inputs(batch, ctx, i) for i in range(3)]
        base = None
        for warps, stages, per_sm in variants:
            ts.HOPPER_CONFIGS[128] = {**fixed_stream(default[128]), "stream": (warps, stages)}
            ts.PROGRAMS_PER_SM = per_sm
            base, same = checked_draw(inputs, base)
            score_and_call(rows, "warps", tag, f"w{warps}s{stages} pps{per_sm}", inputs,
                           note=f"same={same}")
        ts.HOPPER_CONFIGS[128], ts.PROGRAMS_PER_SM = copy.deepcopy(default[128]), pps
        del inputs
        torch.cuda.empty_cache()


def pps_section(rows: Rows) -> None:
    """prop's score pass at 4 warps (the small-batch launch) with 2-4 stages and 4-10
    programs an SM as the split target (``PROGRAMS_PER_SM``; by the offline sm_90 compile
    45 registers a thread and 21 / 37 / 54 KB of shared memory a program at 2 / 3 / 4
    stages, so 10 / 6 / 4 programs fit an SM): the pass alone and the call at S=128 and
    256, first checking each variant draws the default's samples."""
    default, pps = copy.deepcopy(ts.HOPPER_CONFIGS), ts.PROGRAMS_PER_SM
    variants = [(3, 4), (3, 5), (3, 6), (4, 4), (2, 6), (2, 8), (2, 10)]
    for batch, ctx in SHAPES:
        tag = f"B={batch} {ctx // 1024}k"
        inputs = [gpu_inputs(batch, ctx, i) for i in range(3)]
        base = None
        for stages, per_sm in variants:
            ts.HOPPER_CONFIGS[128] = {**fixed_stream(default[128]), "stream": (4, stages)}
            ts.PROGRAMS_PER_SM = per_sm
            base, same = checked_draw(inputs, base)
            name = f"w4s{stages} pps{per_sm}"
            score_and_call(rows, "pps", tag, name, inputs, note=f"same={same}",
                           budgets=(128, 256))
        ts.HOPPER_CONFIGS[128], ts.PROGRAMS_PER_SM = copy.deepcopy(default[128]), pps
        del inputs
        torch.cuda.empty_cache()


# the sample pass's launch before tune-2026-12-02-s16: 128 samples a block, the per-row CDF above 64
# heads, one loop for 64 < B * Hq < 256
PER_ROW_128 = {"sample_phased_block": 128, "index_scaled_block": 1 << 62,
               "sample_phased_skip_block": 1 << 62}


def s256_section(rows: Rows) -> None:
    """prop S=256: sample-pass launch variants (see the module docstring) on top of the
    launch before tune-2026-12-02-s16 (``PER_ROW_128``, "default" here: 3-s256.csv in
    results/h200/tune-2026-12-02-s16 ran at a6c8f21, where it was the default),
    alternated."""
    variants = {"default": {}, "splits 2": {"sample_splits": 2},
                "warps 4": {"sample": (4, 128)},
                "splits 2 warps 4": {"sample_splits": 2, "sample": (4, 128)},
                # the scaled row search (3 programs an SM fit: 80 registers), launched as
                # a dependent of the score pass or after it; 256 samples a block
                "scaled": {"index_scaled_rows": 1 << 30}, "no pdl": {"pdl": False},
                "scaled no pdl": {"index_scaled_rows": 1 << 30, "pdl": False},
                "b256": {"sample_phased_block": 256},
                "b256 scaled": {"sample_phased_block": 256, "index_scaled_rows": 1 << 30}}
    wanted = os.environ.get("S256_VARIANTS")  # e.g. "default,scaled"
    variants = {k: {**PER_ROW_128, **v} for k, v in variants.items()
                if not wanted or k in wanted.split(",")}
    prop_variants(rows, "s256", variants, budgets=(256,),
                  reps=int(os.environ.get("S256_ROUNDS", "2")), same_samples=False)


def block_section(rows: Rows) -> None:
    """prop's phased sample pass with 256 samples a block and the scaled row search there
    (the default since tune-2026-12-02-s16) against 128 a block and the per-row CDF, S=128..2048,
    two alternated rounds (same samples checked: rounding may move a few)."""
    prop_variants(rows, "block", {"256 scaled": {}, "128": PER_ROW_128},
                  budgets=(128, 256, 512, 1024, 2048), reps=2)


def phased4_section(rows: Rows) -> None:
    """prop at the heads where the sample pass runs one loop (64 < B * Hq < 256, e.g. B=4):
    against the phased loops with 256 samples a block (scaled; the default since tune-2026-12-02-s16
    from S=256, so "one loop" names the launch before it) or 128 (per-row CDF)."""
    prop_variants(rows, "phased4", {
        "one loop": {"sample_phased_skip_block": 1 << 62},
        "phased 256 scaled": {"sample_phased_skip": (0, 0)},
        "phased 128": {**PER_ROW_128, "sample_phased_skip": (0, 0)}},
        budgets=(128, 256, 1024, 2048), reps=2, same_samples=False)


def harness_section(rows: Rows) -> None:
    """santa-prop and cuDNN timed as the tune sweeps time them (three GPU-made copies in
    rotation) and as the kernel harness does (its inputs, its adapter, ``measure`` with
    its copy plan), and the steps between: one copy, the harness's CPU-made inputs."""
    from santa_bench.inputs import DecodeShape, make_decode_inputs
    from santa_bench.methods import REGISTRY
    from santa_bench.runners.kernel import time_prepared

    def harness_us(name, q, kv, params):
        method = REGISTRY.get(name)
        resolved = method.resolve_params(params)
        prepared = method.prepare(q, kv, seed=0, **resolved)
        timing = time_prepared(method, prepared, q, kv, 0, resolved, graph=True, cold_l2=True,
                               budget_ms=300.0)
        return timing.median_us, f"copies={timing.n_copies} {timing.l2_state}"

    for batch, ctx in SHAPES:
        tag = f"B={batch} {ctx // 1024}k"
        gpu = [gpu_inputs(batch, ctx, i) for i in range(3)]
        shape = DecodeShape(batch=batch, ctx=ctx, heads=32, kv_heads=8, head_dim=128)
        made = [make_decode_inputs(shape, seed=i, device="cuda") for i in range(3)]
        for S in (128, 256):
            for label, inputs in (("gpu x3", gpu), ("gpu x1", gpu[:1]), ("made x3", made),
                                  ("made x1", made[:1])):
                rows.add(section="harness", shape=tag, variant=f"tune {label}",
                         what=f"call S={S}", us=f"{graph_call_us(prop_calls(inputs, S)[1]):.2f}",
                         note="")
            us, note = harness_us("santa-prop", *made[0], {"S": S})
            rows.add(section="harness", shape=tag, variant="harness", what=f"call S={S}",
                     us=f"{us:.2f}", note=note)
        us, note = harness_us("sdpa-cudnn", *made[0], {})
        rows.add(section="harness", shape=tag, variant="harness", what="cudnn", us=f"{us:.2f}",
                 note=note)
        del gpu, made
        torch.cuda.empty_cache()


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tune")
    out.mkdir(parents=True, exist_ok=True)
    sections = sys.argv[2:] or ["santapp", "flat", "prop"]
    rows = Rows(out / "tune.csv")
    t0 = time.time()
    for name in sections:
        sections_by_name = {"santapp": santapp_section, "flat": flat_section,
                            "prop": prop_section, "stores": stores_section, "e2e": e2e_section,
                            "flash": flash_section,
                            "split": split_section, "sample": sample_section,
                            "pdl": pdl_section, "occupancy": occupancy_section,
                            "tma": tma_section, "tmastream": tmastream_section,
                            "phased": phased_section,
                            "pdlpp": pdlpp_section, "reps": reps_section,
                            "warps": warps_section, "ppknobs": ppknobs_section,
                            "pps": pps_section, "index": index_section,
                            "finprof": finprof_section, "harness": harness_section,
                            "s256": s256_section, "block": block_section,
                            "phased4": phased4_section}
        try:
            sections_by_name[name](rows)
        except Exception:  # report, go on with the next section
            traceback.print_exc()
        print(f"-- {name} done at {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
