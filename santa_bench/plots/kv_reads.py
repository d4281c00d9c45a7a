"""reads: the fraction of dense K+V bytes each method reads per sample budget."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
from matplotlib.ticker import PercentFormatter

from santa_bench.plots.output import Rendered
from santa_bench.plots.rows import (
    NoData,
    budget_name,
    caption,
    concat_points,
    ok_rows,
    ordered_series,
    panel_grid,
    panel_title,
    series_colour,
    with_series,
)
from santa_bench.plots.style import (
    figure_legend,
    label_axes,
    line_style,
    size_axis,
    styled,
)

NAME = "reads"
PRODUCER = "santa-bench kernel --ctx 8k,32k --S 64,128,256,2048 --baselines none"


@styled
def reads(frame: pd.DataFrame, runs: Sequence[dict[str, Any]] = ()) -> Rendered:
    """Return the fraction of dense K+V bytes each method reads vs its budget.

    One panel per (batch, ctx); 100% (dense) and 50% (all of K, none of V) are drawn.
    """
    data = with_series(ok_rows(frame, "kv_read_fraction"))
    sampled = data[data.budget.notna()]
    if sampled.empty:
        raise NoData(NAME, PRODUCER)
    fig, axes, panels = panel_grid(
        sampled,
        "batch",
        "ctx",
        "KV-cache bytes read vs sample budget",
        caption(sampled, runs),
        sharex=True,
        sharey=True,
    )
    points = []
    for ax, batch, ctx, panel in panels:
        ax.axhline(1.0, color="#000000", linestyle="--", linewidth=0.9, label="dense (100%)")
        ax.axhline(
            0.5, color="#888888", linestyle=":", linewidth=0.9, label="all of K, no V (50%)"
        )
        for series, method, family in ordered_series(panel):
            rows = (
                panel[panel.series == series]
                .groupby("budget", as_index=False)
                .agg(kv_read_fraction=("value", "mean"))
            )
            ax.plot(
                rows.budget,
                rows.kv_read_fraction,
                label=series,
                color=series_colour(panel, series, method, family),
                **line_style(family, method),
            )
            points.append(
                rows.assign(batch=batch, ctx=ctx, series=series, method=method, family=family)
            )
        size_axis(ax, sampled.budget, tokens=False)
        ax.set_ylim(0, 1.08)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_title(panel_title(ctx=ctx, batch=batch))
    label_axes(axes, f"budget {budget_name(sampled)}", "KV bytes read / dense")
    figure_legend(fig, axes.flat, "method")
    return Rendered(fig, concat_points(points))
