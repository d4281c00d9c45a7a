"""Prints the accuracy rows of a result store as one Markdown table (and writes its CSV).

Rows: a method configuration (its parameters that differ from the defaults); columns: the
tasks, each cell the score in % (Wilson interval) and, for sampled methods, the retention
against dense; a last column the mean KV read fraction. Usage:

    python scripts/accuracy_table.py RESULTS_DIR [--csv OUT.csv] [--model NAME]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from santa_bench import labels
from santa_bench.methods import REGISTRY
from santa_bench.results import ResultStore


def config_label(row: pd.Series) -> str:
    """``santa-prop S=128`` / ``santapp M=32 policy=kmeans``: the method and the parameters
    its configuration names (budgets, and the rest away from their defaults)."""
    label = labels.config_label({**row, "method": REGISTRY.get(row["method"]).name})
    if row["method"] != "dense" and (layers := labels.dense_layers_of(row)):  # as pareto keys it
        label += " dense_layers=" + ",".join(map(str, layers))
    return label


def accuracy_table(frame: pd.DataFrame, model: str | None = None) -> pd.DataFrame:
    """Returns the table (a row per configuration, a column per task)."""
    if frame.empty or "kind" not in frame:
        return pd.DataFrame()
    rows = frame[(frame["kind"] == "accuracy") & (frame.status == "ok")].copy()
    if model is not None:
        rows = rows[rows.model == model]
    if rows.empty:
        return pd.DataFrame()
    rows["config"] = rows.apply(config_label, axis=1)
    rows["task"] = rows.task.astype(str).str.removeprefix("ruler-")
    cells: dict[tuple[str, str], str] = {}
    for (config, task), group in rows.groupby(["config", "task"]):
        by_metric = {m: g.iloc[-1] for m, g in group.groupby("metric")}
        score = by_metric.get("score")
        if score is None:
            continue
        text = f"{100 * score.value:.1f} [{100 * score.ci_low:.0f}, {100 * score.ci_high:.0f}]"
        retention = by_metric.get("retention")
        if retention is not None and not pd.isna(retention.value):
            text += f" r={retention.value:.2f}"
        cells[(config, task)] = text
    reads = rows[rows.metric == "decode_kv_read_fraction"].groupby("config").value.mean()
    configs = sorted({c for c, _ in cells}, key=lambda c: (not c.startswith("dense"), c))
    tasks = sorted({t for _, t in cells})
    table = pd.DataFrame(
        [{"config": c, **{t: cells.get((c, t), "–") for t in tasks},
          "KV read": f"{reads.get(c, float('nan')):.3f}"} for c in configs])
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--csv", type=Path)
    parser.add_argument("--model")
    args = parser.parse_args(argv)
    table = accuracy_table(ResultStore(args.results).load(), args.model)
    if table.empty:
        print(f"no accuracy rows in {args.results} (give the result store: the folder that "
              "holds the run folders)", file=sys.stderr)
        return 1
    header = "| " + " | ".join(table.columns) + " |"
    print(header)
    print("|" + "---|" * len(table.columns))
    for record in table.itertuples(index=False):
        print("| " + " | ".join(map(str, record)) + " |")
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
