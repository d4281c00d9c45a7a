"""SANTA++ on captured attention: how often a decode step reads each head's heaviest key.

Run:  python scripts/top_key_inclusion.py CAPTURE.safetensors --methods SPECS [--seeds 64]

A retrieval answer hangs on a few keys (RULER's needle): a SANTA++ draw that leaves the
team holding them out reweights the rest and loses the answer, however unbiased the
estimator. For each captured layer (``santa-bench capture``, the last position's query)
and query head, the dense attention's heaviest key past the first ``--skip-first`` and
before the last ``--skip-last`` tokens (the attention sink and the recent tokens, which
the defaults attend exactly) and its share of the head's mass; for each SANTA++
configuration, the share of ``--seeds`` draws (the PyTorch reference)
in which that key is read: in the exact sink or window, or in a selected team. Printed
per configuration: the mean over heads whose heaviest key holds at least ``--share`` of
the mass (the retrieval-like heads), and over all heads. Runs on a CPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import santa_kernels as sk
from santa_bench.capture import read_layer, read_metadata
from santa_bench.labels import config_key
from santa_bench.methods import MethodError, parse_method_specs
from santa_kernels.santapp import build_team_index, santapp_attention


def heaviest_keys(q: torch.Tensor, kv: sk.KVCache, first: int,
                  last: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per query head of ``q [1, Hq, d]``: the position of the key with the most attention
    mass among positions ``[first, N - last)``, and that mass's share (float64)."""
    weights = sk.dense_attention(q, kv, compute_dtype=torch.float64).weights[0]  # [Hq, N]
    n = weights.shape[-1]
    if not 0 <= first < n - last:
        raise ValueError(f"no position left between the first {first} and last {last} of {n}")
    share, position = weights[:, first:n - last].max(dim=-1)
    return position + first, share


def inclusion(q: torch.Tensor, kv: sk.KVCache, params: dict, positions: torch.Tensor,
              seeds: int) -> torch.Tensor:
    """Per query head: the share of ``seeds`` SANTA++ draws that read ``positions[h]``."""
    index = build_team_index(kv, policy=params["policy"], team_size=params["team_size"],
                             leaders=params["leaders"],
                             representative=params["representative"], seed=0,
                             sink=params["sink"], exact_recent=params["window"])
    length = int(kv.lengths[0])
    group = q.shape[1] // kv.num_kv_heads
    heads = torch.arange(q.shape[1])
    team = index.team_of[0, heads // group, positions]  # [Hq], -1: in no team
    exact = (positions < params["sink"]) | (positions >= length - params["window"]) | (team < 0)
    read = torch.zeros(q.shape[1], dtype=torch.float64)
    for seed in range(seeds):
        out = santapp_attention(q, kv, index, params["M"], scheme=params["scheme"],
                                mix=params["mix"], sink=params["sink"],
                                window=params["window"], seed=seed,
                                draw=params.get("draw", "head"))
        chosen = out.team_weights[0, heads, team.clamp_min(0)] > 0
        read += (exact | chosen).double()
    return read / seeds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("capture", type=Path, help="a file written by santa-bench capture")
    parser.add_argument("--methods", required=True,
                        help="SANTA++ configurations as santa-bench names them, e.g. "
                             "santapp:M=32,santapp:M=32,policy=kmeans")
    parser.add_argument("--seeds", type=int, default=64, help="draws a case (default: 64)")
    parser.add_argument("--skip-first", type=int, default=4,
                        help="positions left out of the search at the start (default: 4)")
    parser.add_argument("--skip-last", type=int, default=64,
                        help="positions left out of the search at the end (default: 64)")
    parser.add_argument("--share", type=float, default=0.1,
                        help="retrieval-like heads: the heaviest key holds at least this "
                             "share of the mass (default: 0.1)")
    args = parser.parse_args(argv)
    try:
        specs = [(m, m.resolve_params(o)) for m, o in parse_method_specs(args.methods)]
    except MethodError as exc:
        print(f"top_key_inclusion.py: --methods: {exc}", file=sys.stderr)
        return 2
    if any(m.name != "santapp" for m, _ in specs):
        print("top_key_inclusion.py: --methods: SANTA++ (santapp) configurations only",
              file=sys.stderr)
        return 2
    if args.seeds < 1 or not 0 < args.share < 1 or min(args.skip_first, args.skip_last) < 0:
        print("top_key_inclusion.py: need --seeds >= 1, 0 < --share < 1 and --skip-* >= 0",
              file=sys.stderr)
        return 2
    try:
        layers = read_metadata(args.capture)["layers"].split(",")
    except (OSError, ValueError, KeyError) as exc:
        print(f"top_key_inclusion.py: {args.capture}: {exc}", file=sys.stderr)
        return 2
    rows: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for layer in layers:
        q, key, value = read_layer(args.capture, layer, dtype=torch.float32)
        q = q[-1:] if q.dim() == 3 else q[None]  # the last captured position
        kv = sk.KVCache.contiguous(key[None].contiguous(), value[None].contiguous())
        positions, share = heaviest_keys(q, kv, args.skip_first, args.skip_last)
        for method, params in specs:
            rows.setdefault(config_key({"method": method.name, **params}), []).append(
                (inclusion(q, kv, params, positions, args.seeds), share))
        print(f"layer {layer}: heaviest key's share per head "
              + " ".join(f"{s:.2f}" for s in share.tolist()), flush=True)
    print(f"\n| config | read, heads with share >= {args.share:g} | heads | read, all heads |")
    print("|---|---|---|---|")
    for label, parts in rows.items():
        read = torch.cat([r for r, _ in parts])
        share = torch.cat([s for _, s in parts])
        strong = share >= args.share
        mean = float(read[strong].mean()) if strong.any() else float("nan")
        print(f"| {label} | {mean:.3f} | {int(strong.sum())} | {float(read.mean()):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
