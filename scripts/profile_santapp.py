"""SANTA++ Triton kernel on the GPU: latency vs dense, stage breakdown, bandwidth, index build.

Run on the H200:  python3 scripts/profile_santapp.py OUT_DIR [--quick]
Llama-3.1-8B shape (Hq=32, Hkv=8, d=128, bf16), contiguous teams. Per shape (B, ctx) and
(M, P): the index build + pack time (``build_ms``, prefill-time work) against a dense
causal SDPA prefill of one layer at the same context (``prefill_ms``), CUDA-graph latency
of the full call, of its stage prefixes (select, select+attend, the select kernel
alone), the speedup over the faster of triton-splitkv and cuDNN SDPA in the same graph
mode, KV read fraction / read-equivalent, rel. L2 against fp32 dense, and
the bandwidth of the byte model against a measured device copy. Every latency is the
median of graph replays rotating enough input copies that the bytes *read* exceed 4x L2.
Writes OUT_DIR/santapp_profile.csv and .json; prints a table and the speedup bars (BARS).
"""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import torch

import santa_kernels as sk
import santa_kernels.triton_santapp as tsp
from santa_bench.baselines import BASELINES
from santa_bench.inputs import DecodeShape, make_decode_inputs
from santa_bench.timing import copy_bandwidth_gbps, graph_call_us
from santa_kernels.triton_splitkv import SplitKVWorkspace, splitkv_decode

SHAPES = [(1, 32768), (8, 32768), (1, 131072)]
CONFIGS = [(32, 16), (32, 64), (64, 16), (64, 64)]  # (M, team size P)
BARS = {(1, 32768): 2.0, (8, 32768): 2.5, (1, 131072): 3.0}  # speedup held to at M=32
MAX_COPIES = 24


def prefill_ms(batch: int, ctx: int, reps: int = 3) -> float:
    """One layer's dense causal attention prefill (SDPA, flash backend), milliseconds."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(batch, 32, ctx, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(batch, 8, ctx, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    times = []
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
        for _ in range(reps + 1):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=True
            )
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    return sorted(times[1:])[len(times[1:]) // 2]


def dense_times(inputs) -> dict[str, float]:
    """triton-splitkv and cuDNN SDPA, graph mode, over the given input copies."""
    result = {}
    outs = [torch.empty_like(q) for q, _ in inputs]
    wss = [SplitKVWorkspace.for_inputs(q, kv) for q, kv in inputs]
    result["triton-splitkv"] = graph_call_us([
        lambda q=q, kv=kv, o=o, w=w: splitkv_decode(q, kv, out=o, workspace=w)
        for (q, kv), o, w in zip(inputs, outs, wss, strict=True)
    ])  # fmt: skip
    try:
        prepared = [BASELINES["sdpa-cudnn"].prepare(q, kv) for q, kv in inputs]
        result["sdpa-cudnn"] = graph_call_us(prepared)
    except Exception as exc:  # cuDNN missing: report splitkv alone
        print(f"sdpa-cudnn unavailable: {type(exc).__name__}: {exc}", flush=True)
    return result


def profile_config(inputs, dense_ref, M: int, P: int) -> dict:
    packs = [tsp.time_index_build(kv, team_size=P, sink=0, exact_recent=0) for _, kv in inputs]
    build = packs[0][1]
    packs = [p for p, _ in packs]
    wss = [tsp.SantaPPWorkspace.for_inputs(q, kv, p, M, seed=i)
           for i, ((q, kv), p) in enumerate(zip(inputs, packs, strict=True))]
    row: dict = {"M": M, "P": P, "build_ms": build, "plan": str(wss[0].plan)}
    q0, kv0 = inputs[0]

    def calls(stages):
        return [
            lambda q=q, kv=kv, p=p, w=w: tsp._launch(q, kv, p, M, w, 128**-0.5, None, None,
                                                     stages)
            for (q, kv), p, w in zip(inputs, packs, wss, strict=True)
        ]  # fmt: skip

    row["us"] = graph_call_us(calls(tsp.STAGES))
    select = graph_call_us(calls(("select",)))
    select_attend = graph_call_us(calls(("select", "attend")))
    row["select_us"] = select
    row["attend_us"] = select_attend - select
    row["merge_us"] = row["us"] - select_attend
    # the select kernel without its finisher: select_us - score_us = the finish
    row["score_us"] = graph_call_us(calls(("score",)))
    out, info = tsp.santapp_decode(q0, kv0, packs[0], M, workspace=wss[0])
    reads = info.read_counts()
    row["kv_read_fraction"] = reads.kv_read_fraction
    row["read_equivalent"] = info.read_equivalent()
    row["bytes_moved"] = info.bytes_moved(q0)
    row["rel_l2"] = float((out.float() - dense_ref).norm() / dense_ref.norm())
    row["union_teams_mean"] = float(info.count.float().mean())
    return row


def copies_for(kv_bytes: int, touched: int) -> int:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    free, _ = torch.cuda.mem_get_info()
    wanted = math.ceil(4 * l2 / max(touched, 1))
    return max(3, min(MAX_COPIES, wanted, int(0.4 * free) // max(kv_bytes, 1)))


def main() -> None:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "santapp_profile")
    quick = "--quick" in sys.argv
    out_dir.mkdir(parents=True, exist_ok=True)
    copy_bw = copy_bandwidth_gbps("cuda")  # the harness's figure (read + write)
    print(f"device copy bandwidth {copy_bw:.0f} GB/s", flush=True)
    rows = []
    for batch, ctx in SHAPES[:1] if quick else SHAPES:
        shape = DecodeShape(batch=batch, ctx=ctx)
        first = make_decode_inputs(shape, device="cuda", seed=0)
        kv_bytes = 2 * first[1].k.numel() * first[1].k.element_size()
        # fewest bytes one call reads over CONFIGS (M=32, P=16): representatives (K/16)
        # plus at most G*M = 128 teams of 16 rows of K and V per (sequence, KV head)
        touched = kv_bytes // 32 + batch * 8 * 128 * 16 * 2 * 128 * 2
        inputs = [first] + [make_decode_inputs(shape, device="cuda", seed=i)
                            for i in range(1, copies_for(kv_bytes, touched))]
        dense = dense_times(inputs[:3])
        best_name, best_us = min(dense.items(), key=lambda item: item[1])
        dense_ref = sk.dense_attention(*first).out.float()
        fill = prefill_ms(batch, ctx)
        tag = f"B={batch} ctx={ctx // 1024}k"
        print(f"{tag}: {len(inputs)} copies; dense "
              + ", ".join(f"{k} {v:.1f} us" for k, v in dense.items())
              + f"; prefill (1 layer) {fill:.2f} ms", flush=True)
        for M, P in CONFIGS[:1] if quick else CONFIGS:
            try:
                row = profile_config(inputs, dense_ref, M, P)
            except Exception as exc:  # report and go on with the next configuration
                print(f"{tag} M={M} P={P} FAILED {type(exc).__name__}: {exc}", flush=True)
                continue
            gbps = row["bytes_moved"] / (row["us"] * 1e-6) / 1e9
            row.update(shape=tag, batch=batch, ctx=ctx, copies=len(inputs),
                       best_dense=best_name, best_dense_us=best_us, prefill_ms=fill,
                       build_pct_of_prefill=100 * row["build_ms"] / fill,
                       speedup=best_us / row["us"],
                       gbps=gbps, pct_of_copy_bw=100 * gbps / copy_bw, copy_gbps=copy_bw,
                       **{f"dense_{k}_us": v for k, v in dense.items()})
            rows.append(row)
            print(f"{tag} M={M:3d} P={P:3d} | {row['us']:6.1f} us "
                  f"({row['select_us']:.1f} select + {row['attend_us']:.1f} attend + "
                  f"{row['merge_us']:.1f} merge; score {row['score_us']:.1f}) | "
                  f"x{row['speedup']:.2f} vs {best_name} | KV {100 * row['kv_read_fraction']:.1f}%"
                  f" (+reps {100 * row['read_equivalent']:.1f}%) | {gbps:.0f} GB/s = "
                  f"{row['pct_of_copy_bw']:.0f}% of copy | build {row['build_ms']:.2f} ms = "
                  f"{row['build_pct_of_prefill']:.1f}% of prefill | rel L2 {row['rel_l2']:.3f}",
                  flush=True)
        del inputs, first
        torch.cuda.empty_cache()
    if not rows:
        return
    with open(out_dir / "santapp_profile.csv", "w", newline="") as f:
        fields = sorted({k for row in rows for k in row})
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    (out_dir / "santapp_profile.json").write_text(json.dumps(rows, indent=1))
    print("\nbars (M=32, graph mode):")
    for row in rows:
        bar = BARS.get((row["batch"], row["ctx"]))
        if row["M"] != 32 or bar is None:
            continue
        print(f"  {row['shape']} P={row['P']}: speedup {row['speedup']:.2f} (bar {bar}) "
              f"{'PASS' if row['speedup'] >= bar else 'FAIL'}; bandwidth "
              f"{row['pct_of_copy_bw']:.0f}% of copy (bar 70) "
              f"{'PASS' if row['pct_of_copy_bw'] >= 70 else 'FAIL'}; build "
              f"{row['build_pct_of_prefill']:.1f}% of prefill (bar 10) "
              f"{'PASS' if row['build_pct_of_prefill'] < 10 else 'FAIL'}")


if __name__ == "__main__":
    main()
