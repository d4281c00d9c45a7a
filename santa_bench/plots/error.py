"""error-vs-S: relative L2 error against dense attention per sample budget."""

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
    ok_rows,
    ordered_series,
    panel_grid,
    panel_title,
    select,
    series_colour,
    with_series,
)
from santa_bench.plots.style import (
    DENSE_FAMILIES,
    figure_legend,
    label_axes,
    line_style,
    log_axis,
    size_axis,
    styled,
)

NAME = "error-vs-S"
PRODUCER = "santa-bench kernel --ctx 4k,32k --S 16,64,256,1024 --baselines none"


@styled
def error_vs_S(frame: pd.DataFrame, runs: Sequence[dict[str, Any]] = ()) -> Rendered:
    """Return relative L2 error against dense vs the budget, log-log, with an S^-1/2 guide.

    One panel per (batch, ctx), or per (attention pattern, ctx) for fidelity rows;
    duplicate cases (e.g. two timing runs) are averaged; the dense kernels' own bf16
    error is a dotted floor when the store has them.
    """
    data = with_series(ok_rows(frame, "rel_l2_vs_dense"))
    sampled = data[data.budget.notna()]
    if sampled.empty:
        raise NoData(NAME, PRODUCER)
    floor = data[data.budget.isna() & data.family.isin(DENSE_FAMILIES) & (data.method != "dense")]
    by_pattern = "pattern" in sampled.columns and sampled.pattern.notna().any()
    row_key = "pattern" if by_pattern else "batch"
    fig, axes, panels = panel_grid(
        sampled,
        row_key,
        "ctx",
        "Relative L2 error vs dense attention",
        caption(sampled, runs),
        sharex=True,
        sharey=True,
    )
    points = []
    for ax, batch, ctx, panel in panels:
        for series, method, family in ordered_series(panel):
            rows = (
                panel[panel.series == series]
                .groupby("budget", as_index=False)
                .agg(rel_l2=("value", "mean"), cases=("value", "size"))
            )
            ax.plot(
                rows.budget,
                rows.rel_l2,
                label=series,
                color=series_colour(panel, series, method, family),
                **line_style(family, method),
            )
            points.append(
                rows.assign(
                    **{row_key: batch}, ctx=ctx, series=series, method=method, family=family
                )
            )
        if not panel.empty:
            s0 = panel.budget.min()
            y0 = float(np.exp(np.log(panel[panel.budget == s0].value).mean()))
            s = np.array(sorted(panel.budget.unique()))
            ax.plot(
                s,
                y0 * (s / s0) ** -0.5,
                color="#888888",
                linestyle=":",
                marker="",
                linewidth=1.2,
                label=r"$\propto S^{-1/2}$ guide",
            )
        dense = select(floor, batch=batch, ctx=ctx) if not by_pattern else floor[:0]
        if not dense.empty:
            ax.axhline(
                float(dense.value.median()),
                color="#1f4e99",
                linestyle="-.",
                linewidth=0.9,
                label="dense kernels (bf16 rounding)",
            )
        log_axis(ax, "y")
        size_axis(ax, sampled.budget, tokens=False)
        ax.set_title(
            f"{batch} · {panel_title(ctx=ctx)}"
            if by_pattern
            else panel_title(ctx=ctx, batch=batch)
        )
    label_axes(axes, f"{budget_name(sampled)} (samples per head)", "rel. L2 error vs dense")
    figure_legend(fig, axes.flat, "method")
    return Rendered(fig, concat_points(points).rename(columns={"budget": "S"}))
