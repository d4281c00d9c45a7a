"""Runs santa-flash on the stash a few times for Nsight Compute (GPU; no PDL).

Run on the H200:
  ncu --clock-control none --kernel-name regex:_stash_draw_kernel --launch-skip 3 \\
      --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats \\
      --section WarpStateStats python3 scripts/ncu_flash_stash.py BATCH CTX S [KEY=VALUE ...]
(KEY=VALUE: ``santa_flash_stash`` integer keyword arguments, e.g. ``programs_per_sm=2``)
"""

from __future__ import annotations

import sys

import torch
from tune_h200 import gpu_inputs  # scripts/: the sweeps' inputs, made on the GPU

import santa_kernels.triton_santa_flash_stash as tfs


def main() -> None:
    batch, ctx, S = (int(v) for v in sys.argv[1:4])
    q, kv = gpu_inputs(batch, ctx, 0)
    kw = {k: int(v) for k, v in (arg.split("=") for arg in sys.argv[4:])}
    ws = tfs.stash_workspace(q, kv, S, 64)
    for _ in range(5):
        tfs.santa_flash_stash(q, kv, S, workspace=ws, pdl=False, **kw)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
