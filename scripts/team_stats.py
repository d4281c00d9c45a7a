"""SANTA++ team sizes on captured keys: what the select and attend kernels will work on.

Run:  python scripts/team_stats.py CAPTURE.safetensors [--team-size 16] [--leaders 4]

For each captured layer (``santa-bench capture``) and team policy (k-means, contiguous),
with the defaults' exact sink and window: the teams per KV head (the representatives
the select pass scores), the team length's mean, median, 90th and 99th percentiles and
maximum (the attend kernel's tile is sized by the longest team). Runs on a CPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import santa_kernels as sk
from santa_bench.capture import read_layer, read_metadata
from santa_kernels.triton_santapp import build_packed


def team_stats(kv: sk.KVCache, policy: str, team_size: int, leaders: int, sink: int,
               window: int) -> dict[str, float]:
    """Teams per KV head and team-length statistics of one index."""
    packed = build_packed(kv, policy=policy, team_size=team_size, leaders=leaders, seed=0,
                          sink=sink, exact_recent=window, copy=policy == "contiguous")
    lengths = packed.team_len[packed.team_len > 0].float()
    p50, p90, p99 = torch.quantile(lengths, torch.tensor([0.5, 0.9, 0.99])).tolist()
    heads = packed.team_len.shape[0] * packed.team_len.shape[1]
    return {"teams_per_head": len(lengths) / heads, "mean": float(lengths.mean()),
            "p50": p50, "p90": p90, "p99": p99, "max": float(packed.max_team_len)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("capture", type=Path, help="a file written by santa-bench capture")
    parser.add_argument("--team-size", type=int, default=16, help="P (default: 16)")
    parser.add_argument("--leaders", type=int, default=4, help="k-means leaders (default: 4)")
    parser.add_argument("--sink", type=int, default=4, help="exact first tokens (default: 4)")
    parser.add_argument("--window", type=int, default=64, help="exact last tokens (default: 64)")
    args = parser.parse_args(argv)
    try:
        layers = read_metadata(args.capture)["layers"].split(",")
    except (OSError, ValueError, KeyError) as exc:
        print(f"team_stats.py: {args.capture}: {exc}", file=sys.stderr)
        return 2
    print("| layer | policy | teams / KV head | mean | p50 | p90 | p99 | max |")
    print("|---|---|---|---|---|---|---|---|")
    for layer in layers:
        _, key, value = read_layer(args.capture, layer, dtype=torch.bfloat16)
        kv = sk.KVCache.contiguous(key[None].contiguous(), value[None].contiguous())
        for policy in ("kmeans", "contiguous"):
            s = team_stats(kv, policy, args.team_size, args.leaders, args.sink, args.window)
            print(f"| {layer} | {policy} | {s['teams_per_head']:.0f} | {s['mean']:.1f} | "
                  f"{s['p50']:.0f} | {s['p90']:.0f} | {s['p99']:.0f} | {s['max']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
