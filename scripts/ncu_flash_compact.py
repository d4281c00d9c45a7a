"""Runs the one-pass compact santa-flash kernel for Nsight Compute (GPU).

Usage (on the H200; ``source scripts/h200_setup.sh`` first)::

    ncu --clock-control none --kernel-name regex:_flash_compact_kernel --launch-skip 3 \
        --launch-count 1 --set full --import-source yes -o OUT/rep \
        python3 scripts/ncu_flash_compact.py BATCH CTX S [WARPS STAGES]

Llama-3.1-8B decode shape (Hq=32, Hkv=8, d=128), bf16, Gaussian K/V, Q x3 (the tune
sweeps' inputs); five calls on one workspace, so ``--launch-skip 3`` profiles a warm one.
"""

from __future__ import annotations

import sys

import torch
from tune_h200 import gpu_inputs  # the sweeps' inputs (scripts/ is on sys.path)

from santa_kernels import triton_santa as ts
from santa_kernels import triton_santa_flash_compact as tfc


def main() -> None:
    batch, ctx, S = (int(x) for x in sys.argv[1:4])
    config = (int(sys.argv[4]), int(sys.argv[5])) if len(sys.argv) > 5 else None
    q, kv = gpu_inputs(batch, ctx, 0)
    ws = ts.SantaWorkspace.for_inputs(q, kv, S, 64)
    for _ in range(5):
        tfc.santa_flash_compact(q, kv, S, workspace=ws, config=config)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
