"""How the kernel latencies of one run moved in another (the same cases, e.g. re-timed).

Run:  python scripts/latency_change.py OLD_RUN NEW_RUN [--results results/h200] [--min 1]

Joins the ``latency`` rows of the two runs by case (``case_hash``: the same method,
parameters, shape and timing mode) and prints a Markdown table of the cases whose median
moved by at least ``--min`` percent, largest first, with each run's copies and rotated
bytes where its rows record them, then the spread of the change over every joined case.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from santa_bench.results import ResultStore

LABEL_KEYS = ("method", "S", "M", "ctx", "batch")


def latency_rows(store: ResultStore, run: str) -> pd.DataFrame:
    """The run's ok latency rows, one per case (its last)."""
    frame = store.load([run])
    rows = frame[(frame.metric == "latency") & (frame.status == "ok")]
    return rows.drop_duplicates("case_hash", keep="last").set_index("case_hash")


def label(row: pd.Series) -> str:
    """``santa-prop S=128 32k B=1``: what the case is."""
    parts = [str(row["method"])]
    for key in ("S", "M"):
        if key in row and pd.notna(row[key]):
            parts.append(f"{key}={int(row[key])}")
    parts.append(f"{int(row['ctx']) // 1024}k B={int(row['batch'])}")
    return " ".join(parts)


def plan(row: pd.Series) -> str:
    """``4 x 68 MB`` (copies x bytes one call touches), or ``-`` for rows without it."""
    if "copies" not in row or pd.isna(row.get("copies")):
        return "-"
    return f"{int(row['copies'])} x {row['touched_bytes'] / 1e6:.0f} MB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", help="run id of the earlier run")
    parser.add_argument("new", help="run id of the later run")
    parser.add_argument("--results", type=Path, default=Path("results/h200"),
                        help="the store holding both runs (default: %(default)s)")
    parser.add_argument("--min", type=float, default=1.0,
                        help="list cases that moved by at least this many percent")
    args = parser.parse_args(argv)
    store = ResultStore(args.results)
    try:
        old, new = latency_rows(store, args.old), latency_rows(store, args.new)
    except ValueError as exc:
        print(f"latency_change.py: {exc}", file=sys.stderr)
        return 2
    joined = pd.merge(old, new, left_index=True, right_index=True, suffixes=("_old", ""))
    if joined.empty:
        print("latency_change.py: the two runs share no case", file=sys.stderr)
        return 2
    joined["change"] = 100 * (joined["value"] / joined["value_old"] - 1)
    print(f"{len(joined)} cases in both runs; median change {joined.change.median():+.1f}%, "
          f"range {joined.change.min():+.1f}% to {joined.change.max():+.1f}%\n")
    print(f"| case | {args.old} us | copies | {args.new} us | copies | change |")
    print("|---|---|---|---|---|---|")
    moved = joined[joined.change.abs() >= args.min]
    for _, row in moved.reindex(moved.change.abs().sort_values(ascending=False).index).iterrows():
        old_plan = plan(pd.Series({k.removesuffix("_old"): v for k, v in row.items()
                                   if k.endswith("_old")}))
        print(f"| {label(row)} | {row['value_old']:.1f} | {old_plan} | {row['value']:.1f} "
              f"| {plan(row)} | {row['change']:+.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
