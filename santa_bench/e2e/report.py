"""Markdown tables of the e2e rows in a store (the e2e tables of docs/benchmarks.md).

``python -m santa_bench.e2e.report RESULTS [RUN,...]`` prints one table per (model,
weights, prefill, layout, rest of the step, timing; rows stored before ``rest`` existed
ran the eager ``torch`` rest): for each (ctx, batch), every dense backend and method
with its median and p90 step latency, tokens/s, attention's share of the step, the
speedup over the fastest dense backend (bootstrap 95% interval) and, with real weights,
the token agreement with dense.
"""

from __future__ import annotations

import math
import sys

import pandas as pd

from santa_bench.labels import TABLE_HEAD, TEXT_PARAMS, config_label
from santa_bench.report import case_metrics, metric_value, speedup_cell
from santa_bench.units import format_size

TABLE_KEYS = ("model", "weights", "prefill", "layout", "rest", "timing")


def _label(row: pd.Series) -> str:
    # the budgets in the head; the kernel tables' other head parameters are not named
    label = config_label(row, head=TABLE_HEAD[:2], skip=[k for k, _, _ in TABLE_HEAD[2:]],
                         text_params=TEXT_PARAMS)
    if isinstance(row.get("dense_layers"), str) and row["dense_layers"]:
        label += f" (exact layers {row['dense_layers']})"
    return label


def e2e_table(frame: pd.DataFrame) -> str:
    """Returns the Markdown tables of the e2e rows of ``frame`` (see the module docstring)."""
    if "kind" not in frame.columns:
        return "(no e2e rows)\n"
    rows = frame[frame.kind == "e2e"]
    if rows.empty:
        return "(no e2e rows)\n"
    rest = rows["rest"] if "rest" in rows.columns else pd.Series(index=rows.index, dtype=object)
    rows = rows.assign(rest=rest.fillna("torch"))
    lines: list[str] = []
    steps = rows[rows.metric == "step_ms_median"]
    for keys, group in steps.groupby(list(TABLE_KEYS), dropna=False, sort=True):
        described = ", ".join(f"{k}: {v}" for k, v in zip(TABLE_KEYS, keys, strict=True))
        lines += [
            f"\n**{described}**\n",
            "| ctx | B | method | backend | step ms p50 | p90 | tokens/s | attention share "
            "| speedup vs best dense [95% CI] | token agreement |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        ordered = group.assign(_dense=group.family != "dense").sort_values(
            ["ctx", "batch", "_dense", "value"])
        for _, row in ordered.iterrows():
            case = case_metrics(rows, row)
            lines.append(_line(row, case))
    return "\n".join(lines) + "\n"


def _line(row: pd.Series, case: pd.DataFrame) -> str:
    def value(metric: str) -> float:
        return metric_value(case, metric)

    def fmt(number: float, spec: str) -> str:
        return "-" if math.isnan(number) else format(number, spec)

    step = f"{row.value:.2f}" if row.status == "ok" else f"{row.status}: {row.reason}"
    speed = speedup_cell(case, bold=True)
    cells = [
        format_size(int(row.ctx)), str(int(row.batch)), _label(row), str(row.backend), step,
        fmt(value("step_ms_p90"), ".2f"), fmt(value("tokens_per_s"), ",.0f"),
        fmt(value("attention_share"), ".0%"), speed, fmt(value("token_agreement"), ".1%"),
    ]
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - thin wrapper
    from santa_bench.results import ResultStore

    args = sys.argv[1:] if argv is None else argv
    if not args:
        raise SystemExit("usage: python -m santa_bench.e2e.report RESULTS [RUN,...]")
    runs = [r for r in args[1].split(",") if r] if len(args) > 1 else None
    print(e2e_table(ResultStore(args[0]).load(runs)))


if __name__ == "__main__":  # pragma: no cover
    main()
