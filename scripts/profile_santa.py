"""Stage breakdown of the Triton SANTA kernels on a GPU (graph replays, cold by size).

Run on the H200: python3 scripts/profile_santa.py > $OUT/profile.txt
Prints one line per (shape, variant): median microseconds of a CUDA-graph replay.
"""

from __future__ import annotations

import copy
import sys

import torch
import triton.testing

import santa_kernels.triton_santa as ts
from santa_bench.inputs import DecodeShape, make_decode_inputs
from santa_kernels.triton_splitkv import SplitKVWorkspace, splitkv_decode

DEFAULT = copy.deepcopy(ts.HOPPER_CONFIGS)


def bench(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=60) * 1e3


def main() -> None:
    only = sys.argv[1:] or None
    for batch, ctx in [(1, 32768), (8, 32768), (1, 131072)]:
        profile_shape(batch, ctx, only)
        torch.cuda.empty_cache()


def profile_shape(batch: int, ctx: int, only: list[str] | None) -> None:
    if True:
        q, kv = make_decode_inputs(DecodeShape(batch=batch, ctx=ctx), device="cuda")
        kv_mb = 2 * kv.k.numel() * kv.k.element_size() / 1e6
        tag = f"B={batch} ctx={ctx // 1024}k"
        ws_s = SplitKVWorkspace.for_inputs(q, kv)
        out = torch.empty_like(q)
        t = bench(lambda: splitkv_decode(q, kv, out=out, workspace=ws_s))
        print(f"{tag} splitkv {t:.1f} us ({kv_mb / t:.0f} GB/s of K+V)", flush=True)
        variants = {
            "default": ({}, torch.float32),
            "stash16": ({}, torch.float16),
            "stages4": ({"stream": (4, 4)}, torch.float32),
            "warps8": ({"stream": (8, 3)}, torch.float32),
            "tile128": ({}, torch.float16),
            "tile128w8": ({"stream": (8, 3)}, torch.float16),
        }
        for name, (override, stash) in variants.items():
            if only and name not in only:
                continue
            ts.HOPPER_CONFIGS[128] = {**DEFAULT[128], **override}
            tile = 128 if name.startswith("tile128") else 64
            for splits_factor in (0.5, 1, 2):
                base = ts.num_splits_for(batch * 8, -(-ctx // tile))
                splits = max(1, int(base * splits_factor))
                ws = ts.SantaWorkspace.for_inputs(
                    q, kv, 2048, tile, num_splits=splits, stash_dtype=stash
                )
                score = bench(
                    lambda ws=ws, tile=tile: ts._score_pass(q, kv, ws, 128**-0.5, tile)
                )
                k_mb = kv_mb / 2
                line = (
                    f"{tag} {name} splits={splits} score {score:.1f} us ({k_mb / score:.0f} GB/s K)"
                )
                if splits_factor == 1:
                    for S in (128, 256, 2048):
                        full = bench(
                            lambda ws=ws, S=S, stash=stash, tile=tile: ts.santa_prop(
                                q, kv, S, tile=tile, workspace=ws, stash_dtype=stash
                            )
                        )
                        line += f" | prop S={S} {full:.1f} (sample {full - score:.1f})"
                print(line, flush=True)
        ts.HOPPER_CONFIGS[128] = copy.deepcopy(DEFAULT[128])
        for stream in ((4, 3), (4, 2), (8, 2)) if not only or "flash" in only else ():
            ts.HOPPER_CONFIGS[128] = {**DEFAULT[128], "stream": stream}
            ws = ts.SantaWorkspace.for_inputs(q, kv, 2048, 64)
            line = f"{tag} flash warps,stages={stream}"
            for S in (128, 2048):
                t = bench(lambda ws=ws, S=S: ts.santa_flash(q, kv, S, workspace=ws))
                line += f" | S={S} {t:.1f}"
            print(line, flush=True)
        ts.HOPPER_CONFIGS[128] = copy.deepcopy(DEFAULT[128])


if __name__ == "__main__":
    main()
