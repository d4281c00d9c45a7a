"""Launch-configuration sweep and stage breakdown of the Triton SANTA prop kernels (GPU).

Run on the H200: python3 scripts/profile_santa.py [OUT_CSV] > $OUT/profile.txt
Every figure is the median of CUDA-graph replays over ``COPIES`` rotated copies of the
inputs (each copy's K alone exceeds the 50 MB L2 at 32k, so reads are cold), in us per
call. Variants change ``HOPPER_CONFIGS[128]`` and the split count.
"""

from __future__ import annotations

import copy
import csv
import sys

import torch

import santa_kernels.triton_santa as ts
from santa_bench.inputs import DecodeShape, make_decode_inputs
from santa_bench.timing import graph_call_us
from santa_kernels.triton_splitkv import SplitKVWorkspace, splitkv_decode

DEFAULT = copy.deepcopy(ts.HOPPER_CONFIGS)
COPIES = 3
SHAPES = [(1, 32768), (8, 32768), (1, 131072)]
# name: config overrides for d=128
VARIANTS = {
    "two-kernel": {},
    "two-kernel-subs2": {"subs": 2},
}


def check_subs_match(q, kv, tag: str) -> None:
    """Same uniforms: wide K loads (subs=2) must sample exactly what subs=1 samples."""
    uniforms = torch.rand(q.shape[0], q.shape[1], device=q.device)
    results = []
    for subs in (1, 2):
        ts.HOPPER_CONFIGS[128] = {**DEFAULT[128], "subs": subs}
        out, info = ts.santa_prop(q, kv, 128, uniforms=uniforms, stash_dtype=torch.float16)
        results.append((out.clone(), info.sample_index.clone()))
    ts.HOPPER_CONFIGS[128] = copy.deepcopy(DEFAULT[128])
    (out0, idx0), (out1, idx1) = results
    err = float((out1.float() - out0.float()).abs().max())
    print(f"{tag} check subs=2: same samples {torch.equal(idx0, idx1)}, max |diff| {err:.2e}",
          flush=True)


def main() -> None:
    rows = []
    only = sys.argv[2:] or None
    for batch, ctx in SHAPES:
        inputs = [make_decode_inputs(DecodeShape(batch=batch, ctx=ctx), device="cuda", seed=i)
                  for i in range(COPIES)]
        k_mb = inputs[0][1].k.numel() * 2 / 1e6
        tag = f"B={batch} ctx={ctx // 1024}k"
        outs = [torch.empty_like(q) for q, _ in inputs]
        wss = [SplitKVWorkspace.for_inputs(q, kv) for q, kv in inputs]
        t = graph_call_us([lambda q=q, kv=kv, o=o, w=w: splitkv_decode(q, kv, out=o, workspace=w)
                        for (q, kv), o, w in zip(inputs, outs, wss, strict=True)])
        print(f"{tag} splitkv {t:.1f} us ({2 * k_mb / t:.2f} TB/s K+V)", flush=True)
        rows.append({"shape": tag, "variant": "splitkv", "splits": "", "S": "", "us": t})
        check_subs_match(*inputs[0], tag)
        for name, override in VARIANTS.items():
            if only and name not in only:
                continue
            ts.HOPPER_CONFIGS[128] = {**DEFAULT[128], **override}
            base = ts.num_splits_for(batch * 8, -(-ctx // 64))
            for factor in (0.5, 1, 2):
                splits = max(1, int(base * factor))
                try:
                    wss = [ts.SantaWorkspace.for_inputs(q, kv, 256, 64, num_splits=splits,
                                                        stash_dtype=torch.float16)
                           for q, kv in inputs]
                    line = f"{tag} {name} splits={splits}"
                    score = graph_call_us([
                        lambda q=q, kv=kv, w=w: ts._score_pass(q, kv, w, 128**-0.5, 64)
                        for (q, kv), w in zip(inputs, wss, strict=True)])
                    line += f" score {score:.1f} ({k_mb / score:.2f} TB/s K)"
                    rows.append({"shape": tag, "variant": name, "splits": splits,
                                 "S": "score", "us": score})
                    for S in (128, 256):
                        t = graph_call_us([
                            lambda q=q, kv=kv, w=w, S=S: ts.santa_prop(
                                q, kv, S, workspace=w, stash_dtype=torch.float16)
                            for (q, kv), w in zip(inputs, wss, strict=True)])
                        line += f" | S={S} {t:.1f}"
                        rows.append({"shape": tag, "variant": name, "splits": splits, "S": S,
                                     "us": t})
                    print(line, flush=True)
                except Exception as exc:  # a config that does not compile: report, go on
                    print(f"{tag} {name} splits={splits} FAILED {type(exc).__name__}: {exc}",
                          flush=True)
        ts.HOPPER_CONFIGS[128] = copy.deepcopy(DEFAULT[128])
        del inputs
        torch.cuda.empty_cache()
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["shape", "variant", "splits", "S", "us"])
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
