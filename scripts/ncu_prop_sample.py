"""Runs santa-prop a few times for Nsight Compute (GPU; sample pass launched plainly).

Run on the H200:
  ncu --kernel-name regex:_sample_pass_kernel --launch-skip 3 --launch-count 1 \\
      --section SpeedOfLight --section WarpStateStats --section SourceCounters \\
      python3 scripts/ncu_prop_sample.py BATCH CTX S [KEY=VALUE ...]
(KEY=VALUE: ``HOPPER_CONFIGS[128]`` overrides, integers, e.g. ``index_scaled_rows=0``)
"""

from __future__ import annotations

import sys

import torch
from tune_h200 import gpu_inputs  # scripts/: the sweeps' inputs, made on the GPU

import santa_kernels.triton_santa as ts


def main() -> None:
    batch, ctx, S = (int(v) for v in sys.argv[1:4])
    q, kv = gpu_inputs(batch, ctx, 0)
    overrides = {k: int(v) for k, v in (arg.split("=") for arg in sys.argv[4:])}
    ts.HOPPER_CONFIGS[128] = {**ts.HOPPER_CONFIGS[128], "pdl": False, **overrides}
    ws = ts.SantaWorkspace.for_inputs(q, kv, S, 64, stash_dtype=torch.float16)
    for _ in range(5):
        ts.santa_prop(q, kv, S, workspace=ws, stash_dtype=torch.float16)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
