"""Bandwidth of stored santapp rows on every byte a call reads: the K/V rows, the
representatives with their ``log n`` (and int8 scales), q and the output. For runs made
before the harness counted the tables (metric ``bytes_read_tables``); Llama-3.1-8B shape
(8 KV heads, d = 128, 32 query heads, bf16).

Usage: python3 scripts/santapp_bandwidth.py RESULTS RUN_ID
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from santa_bench.results import ResultStore

KV_HEADS, HEAD_DIM, Q_HEADS = 8, 128, 32


def main() -> None:
    root, run = sys.argv[1], sys.argv[2]
    frame = ResultStore(root).load()
    frame = frame[frame.run_id == run]
    copy = json.loads((Path(root) / run / "run.json").read_text())["copy_bandwidth_gbps"]
    kv_bytes = frame[frame.metric == "bytes_read"].set_index("case_hash")["value"]
    latency = frame[(frame.metric == "latency") & (frame.method == "santapp")]
    for _, row in latency.sort_values(["ctx", "batch", "team_size"]).iterrows():
        batch, ctx, team = int(row["batch"]), int(row["ctx"]), int(row["team_size"])
        int8 = row.get("reps") == "int8"
        per_rep = HEAD_DIM * (1 if int8 else 2) + 4 + (4 if int8 else 0)  # codes, log n, scale
        tables = batch * KV_HEADS * -(-ctx // team) * per_rep
        q_out = 2 * batch * Q_HEADS * HEAD_DIM * 2
        us = row["value"]
        kv_only = (kv_bytes[row["case_hash"]] + q_out) / us / 1e3  # GB/s
        every = (kv_bytes[row["case_hash"]] + tables + q_out) / us / 1e3
        print(f"{ctx // 1024}k B={batch} P={team} reps={'int8' if int8 else 'bf16'}: "
              f"{us:.1f} us, K/V only {kv_only / 1e3:.2f} TB/s = {100 * kv_only / copy:.1f}% "
              f"of copy, every byte {every / 1e3:.2f} TB/s = {100 * every / copy:.1f}% "
              f"(tables {tables / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
