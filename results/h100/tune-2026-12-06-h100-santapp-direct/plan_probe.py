"""SANTA++ M=512 at the Qwen shapes under alternative select plans (GPU timing probe).

Run on the GPU (tree installed), from the repository root:
    python3 results/h100/tune-2026-12-06-h100-santapp-direct/plan_probe.py OUT.csv
--dry: build the plans on the CPU only (no timing).
"""
import csv
import math
import sys

import torch

import santa_kernels.triton_santapp as tsp
from santa_bench.baselines import BASELINES
from santa_bench.inputs import DecodeShape, make_decode_inputs

SHAPES = [(1, 14, 2, 64), (8, 14, 2, 64), (1, 28, 4, 128)]
PLANS = {
    "default": {},
    "old-local": {"local": True},
    "local-tb1024": {"local": True, "teams_per_split": 1024},
    "direct-w8": {"local": False, "finish_warps": 8},
    "direct-w16": {"local": False, "finish_warps": 16},
    "direct-w32": {"local": False, "finish_warps": 32},
}
M, CTX = 512, 32768
dry = "--dry" in sys.argv
out = [a for a in sys.argv[1:] if not a.startswith("--")]
rows = []
for batch, hq, hkv, d in SHAPES:
    shape = DecodeShape(batch=batch, ctx=CTX, heads=hq, kv_heads=hkv, head_dim=d)
    dev = "cpu" if dry else "cuda"
    first = make_decode_inputs(shape, device=dev, seed=0)
    kv_bytes = 2 * first[1].k.numel() * first[1].k.element_size()
    l2 = 0 if dry else torch.cuda.get_device_properties(0).L2_cache_size
    n = 1 if dry else max(3, min(16, math.ceil(4 * l2 / kv_bytes)))
    inputs = [first] + [make_decode_inputs(shape, device=dev, seed=i) for i in range(1, n)]
    packs = [tsp.build_packed(kv, team_size=16, sink=4, exact_recent=64) for _, kv in inputs]
    base = {"B": batch, "shape": f"{hq}/{hkv}/{d}", "copies": n}
    if not dry:
        from santa_bench.timing import graph_call_us
        cudnn = graph_call_us([BASELINES["sdpa-cudnn"].prepare(q, kv) for q, kv in inputs])
        rows.append({**base, "plan": "sdpa-cudnn", "us": round(cudnn, 2)})
        print(rows[-1], flush=True)
    for name, kw in PLANS.items():
        try:
            wss = [tsp.SantaPPWorkspace(tsp._plan_for(q, kv, p, M, **kw), device=q.device, seed=i)
                   for i, ((q, kv), p) in enumerate(zip(inputs, packs, strict=True))]
        except Exception as exc:
            print(name, "plan failed:", exc, flush=True)
            continue
        p0 = wss[0].plan
        row = {**base, "plan": name, "local": p0.local, "splits": p0.num_splits,
               "tb": p0.teams_per_split, "c_pad": p0.c_pad, "select_warps": p0.select_warps,
               "finish_warps": p0.finish_warps}
        if not dry:
            def calls(stages, inputs=inputs, packs=packs, wss=wss, tau=d**-0.5):
                return [lambda q=q, kv=kv, p=p, w=w: tsp._launch(q, kv, p, M, w, tau, None, None,
                                                                  stages)
                        for (q, kv), p, w in zip(inputs, packs, wss, strict=True)]
            try:
                row["us"] = round(graph_call_us(calls(tsp.STAGES)), 2)
                row["select_us"] = round(graph_call_us(calls(("select",))), 2)
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"[:200]
        rows.append(row)
        print(row, flush=True)
if out:
    keys = sorted({k for r in rows for k in r})
    with open(out[0], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
