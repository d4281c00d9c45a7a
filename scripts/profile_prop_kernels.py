"""Per-kernel GPU durations of santa-prop's two passes by the torch profiler (GPU).

Run on the H200:  python3 scripts/profile_prop_kernels.py [OUT.csv]
Llama-3.1-8B shape, fp16 stash, the tune sweeps' inputs (``tune_h200.gpu_inputs``: Gaussian,
Q x3), three rotated copies; each pass's mean kernel duration over 30 calls, with the
sample pass launched as a programmatic dependent of the score pass (``pdl``, the default:
its kernel starts early and waits, so its duration includes the wait) and not (its own
duration).
"""

from __future__ import annotations

import copy
import csv
import sys

import torch
from torch.profiler import ProfilerActivity, profile
from tune_h200 import gpu_inputs  # scripts/: the sweeps' inputs, made on the GPU

import santa_kernels.triton_santa as ts

SHAPES = [(1, 131072), (8, 32768), (1, 32768)]


def main() -> None:
    out = open(sys.argv[1] if len(sys.argv) > 1 else "prop_kernels.csv", "w", newline="")  # noqa: SIM115
    w = csv.writer(out)
    w.writerow(["shape", "S", "pdl", "kernel", "mean_us", "calls"])
    default = copy.deepcopy(ts.HOPPER_CONFIGS)
    for batch, ctx in SHAPES:
        inputs = [gpu_inputs(batch, ctx, i) for i in range(3)]
        for S in (128, 256):
            for pdl in (True, False):
                ts.HOPPER_CONFIGS[128] = {**default[128], "pdl": pdl}
                wss = [ts.SantaWorkspace.for_inputs(q, kv, S, 64, stash_dtype=torch.float16)
                       for q, kv in inputs]
                for (q, kv), ws in zip(inputs, wss, strict=True):  # compile, warm
                    ts.santa_prop(q, kv, S, workspace=ws, stash_dtype=torch.float16)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for i in range(30):
                        q, kv = inputs[i % 3]
                        ts.santa_prop(q, kv, S, workspace=wss[i % 3],
                                      stash_dtype=torch.float16)
                    torch.cuda.synchronize()
                for evt in prof.key_averages():
                    if evt.device_type.name != "CUDA" or not evt.count:
                        continue
                    mean = evt.device_time_total / evt.count
                    w.writerow([f"B={batch} {ctx // 1024}k", S, pdl, evt.key[:60],
                                f"{mean:.2f}", evt.count])
                    print(f"B={batch} {ctx // 1024}k S={S} pdl={pdl} {evt.key[:40]}: "
                          f"{mean:.2f} us x{evt.count}", flush=True)
        ts.HOPPER_CONFIGS[128] = copy.deepcopy(default[128])
        del inputs
        torch.cuda.empty_cache()
    out.close()


if __name__ == "__main__":
    main()
