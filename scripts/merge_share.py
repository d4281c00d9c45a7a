"""How much of a one-pass compact santa-flash call is its split merge (H200 profiling).

Times under CUDA graphs (``graph_call_us``, 3 input copies in turn), per shape: the whole
call, the call without its merge launch (the streaming kernel alone), and the merge
alone (the merge kernel on the partials of a call). Prints a CSV; the merge's share is
what fusing it into the streaming kernel could save at most.

Usage (on the GPU): ``python3 scripts/merge_share.py [S] [BxCTX,...]``.
"""

from __future__ import annotations

import sys

import torch
from tune_h200 import gpu_inputs

import santa_kernels.triton_santa as ts
import santa_kernels.triton_santa_flash_compact as tfc
from santa_bench.timing import graph_call_us


class _NoLaunch:
    """Stands in for a Triton kernel: ``kernel[grid](...)`` does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def streaming_alone_us(calls) -> float:
    """``graph_call_us(calls)`` with the compact kernel's merge launch skipped: the
    streaming kernel alone."""
    merge = tfc._merge_kernel
    tfc._merge_kernel = _NoLaunch()
    try:
        return graph_call_us(calls)
    finally:
        tfc._merge_kernel = merge


def _merge_only(ws, q, rows: int, splits: int) -> None:
    """The call's merge kernel alone (no PDL), on the partials in ``ws`` (32 query heads, d=128)."""
    out = ws.out(q.dtype)
    tfc._merge_kernel[(rows,)](ws.part_m, ws.part_l, ws.part_o, out, ws.rng, 32, splits,
                               ws.num_splits, 128, out.stride(0), out.stride(1),
                               SPLIT_PAD=max(2, ts._next_pow2(splits)), D_PAD=128,
                               num_warps=tfc.MERGE_WARPS)


def main() -> None:
    S = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
    shapes = [tuple(int(v) for v in s.split("x"))
              for s in (sys.argv[2] if len(sys.argv) > 2 else "1x32768,8x32768,1x131072")
              .split(",")]
    print("shape,what,us")
    for batch, ctx in shapes:
        inputs = [gpu_inputs(batch, ctx, i) for i in range(3)]
        wss = [tfc.compact_workspace(q, kv, S, 64) for q, kv in inputs]
        calls = [lambda q=q, kv=kv, w=w: tfc.santa_flash_compact(q, kv, S, workspace=w)
                 for (q, kv), w in zip(inputs, wss, strict=True)]
        tag = f"B={batch} {ctx // 1024}k"
        print(f"{tag},call,{graph_call_us(calls):.2f}", flush=True)
        print(f"{tag},streaming kernel alone,{streaming_alone_us(calls):.2f}", flush=True)
        n_tiles = ctx // 64
        splits = -(-n_tiles // -(-n_tiles // wss[0].num_splits))
        merges = [lambda w=w, q=q, r=batch * 32, s=splits: _merge_only(w, q, r, s)
                  for (q, _), w in zip(inputs, wss, strict=True)]
        print(f"{tag},merge alone ({splits} splits),{graph_call_us(merges):.2f}", flush=True)
        del inputs, wss
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
