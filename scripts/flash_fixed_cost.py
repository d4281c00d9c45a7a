"""The fixed and per-tile cost of a one-pass compact santa-flash program (H200 profiling).

B=1, Llama shape, 64 splits (512 programs, one wave), 1..16 tiles of 64 rows a program
(ctx = 64 x tiles x 64 rows), S = 4 samples a tile, input copies past L2 (cold): the
call, the streaming kernel alone and, as a floor, an empty Triton kernel on the same
grid, each under CUDA graphs (``graph_call_us``). A straight line through the streaming
times gives the program's fixed cost (launch, prologue, epilogue) and its cost a tile.
Prints a CSV.

Usage (on the GPU): ``python3 scripts/flash_fixed_cost.py [tiles,...] [draw_tiles]``.
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl
from merge_share import streaming_alone_us
from tune_h200 import copies, gpu_inputs

import santa_kernels.triton_santa as ts
import santa_kernels.triton_santa_flash_compact as tfc
from santa_bench.timing import graph_call_us

SPLITS = 64


@triton.jit
def _empty_kernel(x_ptr):
    if tl.program_id(0) < 0:  # never: a launch and nothing else
        tl.store(x_ptr, 0.0)


def main() -> None:
    tiles = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "1,2,4,8,16").split(",")]
    draw = int(sys.argv[2]) if len(sys.argv) > 2 else None
    print("tiles a program,ctx,what,us")
    scratch = torch.zeros(1, device="cuda")
    for grid, tag in (((SPLITS, 8), "empty kernel (64, 8)"), ((32,), "empty kernel (32,)")):
        calls = [lambda g=grid: _empty_kernel[g](scratch)] * 3
        print(f"-,-,{tag},{graph_call_us(calls):.2f}", flush=True)
    for per in tiles:
        ctx = SPLITS * per * 64
        S = 4 * (ctx // 64)
        inputs = [gpu_inputs(1, ctx, i) for i in range(copies(1, ctx, 0.6))]  # cold L2
        wss = [ts.SantaWorkspace.for_inputs(q, kv, S, 64, num_splits=SPLITS)
               for q, kv in inputs]
        calls = [lambda q=q, kv=kv, w=w, S=S: tfc.santa_flash_compact(q, kv, S, workspace=w,
                                                                      draw_tiles=draw)
                 for (q, kv), w in zip(inputs, wss, strict=True)]
        print(f"{per},{ctx},call,{graph_call_us(calls):.2f}", flush=True)
        print(f"{per},{ctx},streaming kernel alone,{streaming_alone_us(calls):.2f}",
              flush=True)
        del inputs, wss
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
