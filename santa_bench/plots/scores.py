"""ruler-vs-budget: task score against the sample budget, dense as a band."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from santa_bench.plots.output import Rendered
from santa_bench.plots.rows import (
    NoData,
    accuracy_rows,
    budget_name,
    caption,
    concat_points,
    ordered_series,
    panel_grid,
    panel_title,
    series_colour,
)
from santa_bench.plots.style import (
    figure_legend,
    label_axes,
    line_style,
    size_axis,
    styled,
)

NAME = "ruler-vs-budget"
PRODUCER = (
    "santa-bench accuracy ruler --model meta-llama/Llama-3.1-8B-Instruct "
    "--ctx 32k --methods dense,santa-prop:S=128,santa-prop:S=256,santa-flash:S=2048"
)


@styled
def ruler_vs_budget(frame: pd.DataFrame, runs: Sequence[dict[str, Any]] = ()) -> Rendered:
    """Return task score vs budget, one panel per task (and context); dense as a band.

    Sampled methods: mean over seeds with the seeds' standard deviation; the dense
    band spans the dense rows' min..max (a thin band around one run).
    """
    data = accuracy_rows(frame)
    if data.empty or not data.budget.notna().any():
        raise NoData(NAME, PRODUCER)
    unit = next((u for u in data.unit.dropna().unique() if u), "")
    fig, axes, panels = panel_grid(
        data,
        "ctx",
        "task",
        "Task score vs sample budget (dense as a band)",
        caption(data, runs),
        sharex=True,
    )
    points = []
    for ax, ctx, task, panel in panels:
        for series, method, family in ordered_series(panel):
            rows = panel[panel.series == series]
            colour = series_colour(panel, series, method, family)
            if rows.budget.isna().all():
                low, high, mean = rows.value.min(), rows.value.max(), rows.value.mean()
                pad = max(high - low, 1e-3 * max(abs(mean), 1.0)) / 2 if high == low else 0
                ax.axhspan(low - pad, high + pad, color=colour, alpha=0.15, linewidth=0)
                ax.axhline(
                    mean,
                    color=colour,
                    linestyle="--",
                    linewidth=1.0,
                    label=f"{series} (dense band)",
                )
                points.append(
                    pd.DataFrame(
                        [
                            {
                                "budget": np.nan,
                                "score": mean,
                                "low": low,
                                "high": high,
                                "seeds": len(rows),
                            }
                        ]
                    ).assign(ctx=ctx, task=task, series=series, method=method, family=family)
                )
                continue
            stats = rows.groupby("budget", as_index=False).agg(
                score=("value", "mean"), std=("value", "std"), seeds=("value", "size")
            )
            ax.errorbar(
                stats.budget,
                stats.score,
                yerr=stats["std"].fillna(0),
                label=series,
                color=colour,
                **line_style(family, method),
            )
            points.append(
                stats.assign(ctx=ctx, task=task, series=series, method=method, family=family)
            )
        size_axis(ax, data.budget, tokens=False)
        if panel.value.between(0, 1).all():  # scores and ratios: the whole [0, 1] range
            ax.set_ylim(-0.05, 1.05)
        ax.set_title(panel_title(task=task, ctx=ctx))
    label_axes(
        axes,
        f"budget {budget_name(data)} (samples or teams per head)",
        f"score ({unit})" if unit else "score",
    )
    figure_legend(fig, axes.flat, "method")
    return Rendered(fig, concat_points(points))
