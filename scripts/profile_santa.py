"""S²ANTA-prop and S²ANTA-flash on the GPU, stage by stage, against the byte limit.

Run on the GPU:  python scripts/profile_santa.py [--shapes 1x32k,8x32k,1x128k] [--out CSV]

SANTA reads all of K, so at equal bandwidth it is at most 2x a dense kernel that reads
K and V once. Per shape (Llama-3.1-8B heads by default, bf16, Gaussian q scaled x3, K, V),
each row is one stage with the bytes it must move (the byte model below), its time
(``santa_bench.timing.graph_call_us``: the harness's CUDA-graph replays over input
copies, each with its own workspace, as many as the harness's cold-L2 plan takes), its
achieved bandwidth, and the time those bytes take at the device's measured copy
bandwidth (the floor). A method's ``total`` row gives its speedup over cuDNN SDPA timed
the same way, the speedup at the floor, and the target figure it is held to.

Byte model (bytes a call must read or write, never fewer):

- ``prop score``: K (every row), q; writes the logit stash (santa-prop's default dtype,
  rows padded to whole 512-column blocks) and the per-tile log-masses. The same pass
  without its stores (``stores=0``, profiling only) shows what reading K alone costs.
- ``prop sample``: the per-tile log-masses, the stash tiles its samples fall in (one
  64-row tile a distinct sampled tile), the unique V rows of each GQA group; writes out.
- ``flash``: K, q, the unique V rows it samples (its own counts), the split partials
  (written, then read by the merge) and out.
- ``cudnn``: K and V, q, out.

Times of a stage alone come from launching it alone (the prop score pass); the prop
sample pass is the call's time minus its score pass.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

import santa_kernels.triton_santa as ts
import santa_kernels.triton_santa_flash as tsf
from santa_bench.baselines import BASELINES, clone_kv
from santa_bench.inputs import DecodeShape, make_decode_inputs
from santa_bench.methods import REGISTRY
from santa_bench.methods._common import STASH_DTYPES
from santa_bench.timing import cold_l2_plan, copy_bandwidth_gbps, graph_call_us, l2_cache_bytes
from santa_bench.units import parse_shapes

TILE = 64
STASH_BLOCK = 512
# the targets held to, speedup over cuDNN: (method, batch, ctx) -> figure
TARGETS = {("prop", 1, 32768): 1.6, ("prop", 8, 32768): 1.85, ("prop", 1, 131072): 1.85,
           ("flash", 1, 32768): 1.45, ("flash", 8, 32768): 1.7, ("flash", 1, 131072): 1.8}


@dataclass(frozen=True)
class Row:
    """One stage of one method at one shape."""

    shape: str
    method: str
    stage: str
    mbytes: float  # bytes the stage must move, in MB
    us: float
    tbps: float  # achieved: bytes / time
    floor_us: float  # bytes at the measured copy bandwidth
    speedup: float = math.nan  # total rows: cuDNN time / this time
    floor_speedup: float = math.nan  # total rows: cuDNN time / floor time
    target: float = math.nan


def stash_bytes(batch: int, heads: int, n: int, itemsize: int) -> int:
    """The logit stash one S²ANTA-prop call writes: rows padded to whole STASH_BLOCKs."""
    return batch * heads * -(-n // STASH_BLOCK) * STASH_BLOCK * itemsize


def prop_bytes(q: torch.Tensor, kv, ws: ts.SantaWorkspace, v_rows: int,
               tiles_sampled: int) -> tuple[int, int]:
    """(score pass, sample pass) bytes of one S²ANTA-prop call (the module's byte model)."""
    batch, hq, d = q.shape
    es = kv.k.element_size()
    n = int(kv.lengths.max())
    n_tiles = -(-n // TILE)
    k_bytes = batch * n * kv.num_kv_heads * d * es
    stash = stash_bytes(batch, hq, n, ws.stash.element_size())
    stats = batch * kv.num_kv_heads * n_tiles * ws.stats_rows * 4
    q_out = batch * hq * d * es
    score = k_bytes + q_out + stash + stats
    sample = stats + tiles_sampled * TILE * ws.stash.element_size() + v_rows * d * es + q_out
    return score, sample


def flash_bytes(q: torch.Tensor, kv, ws: ts.SantaWorkspace, v_rows: int) -> int:
    """Bytes of one S²ANTA-flash call (the module's byte model)."""
    batch, hq, d = q.shape
    es = kv.k.element_size()
    n = int(kv.lengths.max())
    k_bytes = batch * n * kv.num_kv_heads * d * es
    partials = 2 * batch * hq * ws.num_splits * (d + 2) * 4  # written, then merged
    return k_bytes + 2 * batch * hq * d * es + v_rows * d * es + partials


def profile_shape(batch: int, ctx: int, heads: int, kv_heads: int, head_dim: int, S_prop: int,
                  S_flash: int, copy_tbps: float, *, device: str = "cuda",
                  timer: Callable[[list], float] = graph_call_us,
                  dense: str = "sdpa-cudnn") -> list[Row]:
    """Every row of one shape (``device``, ``timer`` and ``dense`` let a CPU test run it
    through the Triton interpreter)."""
    shape = f"{ctx // 1024}k B={batch}"
    q, kv = make_decode_inputs(DecodeShape(batch, ctx, heads, kv_heads, head_dim), seed=0,
                               device=device)
    kv_bytes = 2 * kv.k.numel() * kv.k.element_size()
    stash = STASH_DTYPES[REGISTRY.get("santa-prop").resolve_params({})["stash"]]  # its default
    stash_traffic = 2 * stash_bytes(batch, heads, ctx, stash.itemsize)  # written, read back
    n_copies, _ = cold_l2_plan(kv_bytes // 2 + stash_traffic, l2_cache_bytes(device),
                               workspace_bytes=stash_traffic)
    inputs = [(q.clone(), clone_kv(kv)) for _ in range(n_copies)]
    rows: list[Row] = []

    def row(method: str, stage: str, nbytes: int, us: float, dense_us: float = math.nan,
            target: float = math.nan) -> Row:
        floor = nbytes / (copy_tbps * 1e6)
        return Row(shape, method, stage, nbytes / 1e6, us, nbytes / (us * 1e6), floor,
                   dense_us / us, dense_us / floor, target)

    dense_us = timer([BASELINES[dense].prepare(qi, kvi) for qi, kvi in inputs])
    dense_bytes = kv_bytes + 2 * q.numel() * q.element_size()
    rows.append(row(dense, "total", dense_bytes, dense_us, dense_us))

    # prop: the whole call, and its score pass alone, each copy on its own workspace
    spaces = [ts.SantaWorkspace.for_inputs(q, kv, S_prop, TILE, stash_dtype=stash)
              for _ in inputs]
    ws = spaces[0]
    _, info = ts.santa_prop(q, kv, S_prop, workspace=ws)
    reads = info.read_counts(head_dim)
    index = info.sample_index.reshape(batch * heads, S_prop).long()
    tiles_sampled = sum(int(torch.unique(r // TILE).numel()) for r in index)
    score_b, sample_b = prop_bytes(q, kv, ws, int(reads.v_rows.sum()), tiles_sampled)
    full = timer([lambda qi=qi, kvi=kvi, w=w: ts.santa_prop(qi, kvi, S_prop, workspace=w)
                  for (qi, kvi), w in zip(inputs, spaces, strict=True)])
    cfg = ts._config(head_dim)
    pdl = bool(cfg.get("pdl")) and ts.pdl_available(q.device)
    evict = ts._stash_evict(cfg, batch * heads, ts._capacity(kv), ws.stash)
    scale = head_dim**-0.5

    def score_pass(stores: int) -> float:  # 2: as a call runs it; 0: no stores (profiling)
        return timer([lambda qi=qi, kvi=kvi, w=w: ts._score_pass(
            qi, kvi, w, scale, TILE, stores=stores, pdl=pdl, entry_pdl=False,
            stash_evict=evict) for (qi, kvi), w in zip(inputs, spaces, strict=True)])

    score, bare = score_pass(2), score_pass(0)
    k_only = batch * int(kv.lengths.max()) * kv_heads * head_dim * kv.k.element_size()
    target = TARGETS.get(("prop", batch, ctx), math.nan)
    rows += [row("prop", "score pass, no stores (K read)", k_only, bare),
             row("prop", "score pass", score_b, score),
             row("prop", "sample pass (call - score)", sample_b, max(full - score, 1e-3)),
             row("prop", "total", score_b + sample_b, full, dense_us, target)]

    # flash: the whole call (its merge kernel reads a few KB)
    spaces.clear()
    flash_spaces = [tsf.flash_workspace(q, kv, S_flash, TILE) for _ in inputs]
    wsf = flash_spaces[0]
    _, finfo = tsf.santa_flash(q, kv, S_flash, workspace=wsf, return_counts=True)
    f_rows = int(finfo.read_counts(head_dim).v_rows.sum())
    flash = timer([lambda qi=qi, kvi=kvi, w=w: tsf.santa_flash(qi, kvi, S_flash, workspace=w)
                   for (qi, kvi), w in zip(inputs, flash_spaces, strict=True)])
    rows.append(row("flash", "total", flash_bytes(q, kv, wsf, f_rows), flash, dense_us,
                    TARGETS.get(("flash", batch, ctx), math.nan)))
    inputs.clear()
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def print_rows(rows: list[Row]) -> None:
    print("| shape | method | stage | MB | us | TB/s | floor us | speedup | at floor | target |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        extra = ("" if math.isnan(r.speedup) else f"{r.speedup:.2f}x",
                 "" if math.isnan(r.floor_speedup) else f"{r.floor_speedup:.2f}x",
                 "" if math.isnan(r.target) else f"{r.target:.2f}x")
        print(f"| {r.shape} | {r.method} | {r.stage} | {r.mbytes:.1f} | {r.us:.1f} | "
              f"{r.tbps:.2f} | {r.floor_us:.1f} | " + " | ".join(extra) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="1x32k,8x32k,1x128k",
                        help="BATCHxCTX, comma-separated (default: %(default)s)")
    parser.add_argument("--heads", type=int, default=32, help="query heads (default: 32)")
    parser.add_argument("--kv-heads", type=int, default=8, help="KV heads (default: 8)")
    parser.add_argument("--head-dim", type=int, default=128, help="head dim (default: 128)")
    parser.add_argument("--S-prop", type=int, default=128, help="prop's S (default: 128)")
    parser.add_argument("--S-flash", type=int, default=2048, help="flash's S (default: 2048)")
    parser.add_argument("--out", type=Path, help="also write the rows to this CSV file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_santa.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        shapes = parse_shapes(args.shapes)
    except ValueError as exc:
        print(f"profile_santa.py: --shapes: {exc}", file=sys.stderr)
        return 2
    copy_tbps = copy_bandwidth_gbps("cuda") / 1e3
    print(f"{torch.cuda.get_device_name()}, copy bandwidth {copy_tbps:.2f} TB/s, "
          f"torch {torch.__version__}")
    rows: list[Row] = []
    for batch, ctx in shapes:
        rows += profile_shape(batch, ctx, args.heads, args.kv_heads, args.head_dim,
                              args.S_prop, args.S_flash, copy_tbps)
    print_rows(rows)
    if args.out:
        with args.out.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(Row.__dataclass_fields__))
            writer.writeheader()
            writer.writerows(vars(r) for r in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
