"""speedup-vs-S: speedup over the best dense baseline per sample budget."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from santa_bench.plots.output import Rendered
from santa_bench.plots.rows import (
    NoData,
    budget_name,
    caption,
    concat_points,
    kernel_rows,
    ok_rows,
    ordered_series,
    panel_title,
    select,
    series_colour,
    unique,
    with_series,
)
from santa_bench.plots.style import figure_legend, label_axes, new_figure, styled

NAME = "speedup-vs-S"
PRODUCER = (
    "santa-bench kernel --ctx 8k,32k,128k --batch 1,8 --S 64,128,256,2048 "
    "--methods santa-prop,santa-flash,santa-strat,santa-iid --baselines auto (on a GPU)"
)


@styled
def speedup_vs_S(frame: pd.DataFrame, runs: Sequence[dict[str, Any]] = ()) -> Rendered:
    """Return bars of speedup over the best dense baseline per budget, with bootstrap CIs.

    One panel per (timing, batch) row and context column; 1x (the best dense) is dashed.
    """
    data = with_series(ok_rows(kernel_rows(frame), "speedup_vs_best_dense"))
    data = data[data.budget.notna()]
    if data.empty:
        raise NoData(NAME, PRODUCER)
    rows_keys = [(t, b) for t in unique(data, "timing") for b in unique(data, "batch")]
    rows_keys = [k for k in rows_keys if not select(data, timing=k[0], batch=k[1]).empty]
    contexts = unique(data, "ctx")
    best = ", ".join(map(str, unique(data.dropna(subset=["best_dense"]), "best_dense")))
    fig, axes = new_figure(
        len(rows_keys),
        len(contexts),
        "Speedup over the best dense baseline"
        + (f" ({best})" if best else "")
        + ", 95% bootstrap CI",
        caption(data, runs),
        panel=(3.2, 2.3),
        sharey=True,
    )
    points = []
    for i, (timing, batch) in enumerate(rows_keys):
        row = select(data, timing=timing, batch=batch)
        budgets = sorted(row.budget.unique())  # the budgets this timing/batch row measured
        for j, ctx in enumerate(contexts):
            ax = axes[i, j]
            panel = select(row, ctx=ctx)
            ax.axhline(1.0, color="#444444", linestyle="--", linewidth=0.9, label="best dense (1×)")
            present = ordered_series(panel)
            width = 0.8 / max(len(present), 1)
            for k, (series, method, family) in enumerate(present):
                rows = panel[panel.series == series]
                rows = rows.groupby("budget", as_index=False).agg(
                    value=("value", "median"),
                    ci_low=("ci_low", "min"),
                    ci_high=("ci_high", "max"),
                    best_dense=("best_dense", "first"),
                )
                x = np.array([budgets.index(b) for b in rows.budget]) + (k + 0.5) * width - 0.4
                low = (rows.value - rows.ci_low.fillna(rows.value)).clip(lower=0)
                high = (rows.ci_high.fillna(rows.value) - rows.value).clip(lower=0)
                ax.bar(
                    x,
                    rows.value,
                    width=width,
                    yerr=[low, high],
                    label=series,
                    color=series_colour(panel, series, method, family),
                    error_kw={"elinewidth": 0.8},
                )
                points.append(
                    rows.assign(
                        timing=timing,
                        batch=batch,
                        ctx=ctx,
                        series=series,
                        method=method,
                        family=family,
                    )
                )
            ax.set_xticks(range(len(budgets)), [str(int(b)) for b in budgets])
            ax.grid(axis="x", visible=False)
            ax.set_title(panel_title(ctx=ctx, batch=batch, timing=timing))
    label_axes(axes, f"{budget_name(data)} (samples per head)", "speedup vs best dense (×)")
    figure_legend(fig, axes.flat, "method")
    return Rendered(fig, concat_points(points).rename(columns={"value": "speedup", "budget": "S"}))
