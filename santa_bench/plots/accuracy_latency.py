"""pareto: mean task score against decode-step latency, with the Pareto front."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from santa_bench.plots.output import Rendered
from santa_bench.plots.rows import (
    BUDGET_COLUMNS,
    VARIANT_COLUMNS,
    NoData,
    accuracy_rows,
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
from santa_bench.plots.style import (
    DENSE_FAMILIES,
    figure_legend,
    label_axes,
    line_style,
    log_axis,
    new_figure,
    styled,
)

NAME = "pareto"
PRODUCER = (
    "santa-bench accuracy ruler ... and santa-bench kernel ... with the same methods, "
    "budgets and shapes"
)


@styled
def pareto(frame: pd.DataFrame, runs: Sequence[dict[str, Any]] = ()) -> Rendered:
    """Return mean task score vs decode-step latency, with the Pareto front.

    Accuracy rows (mean over tasks and seeds) join kernel latency rows on the method and
    every parameter both record (S, M, tile, ctx, ...); a dense accuracy row with no own
    latency takes the fastest dense baseline's. One panel per (timing, batch).
    """
    accuracy = accuracy_rows(frame)
    latency = with_series(ok_rows(kernel_rows(frame), "latency"))
    joined = _join_accuracy_latency(accuracy, latency) if not accuracy.empty else pd.DataFrame()
    if joined.empty:
        raise NoData(NAME, PRODUCER)
    keys = [(t, b) for t in unique(joined, "timing") for b in unique(joined, "batch")]
    keys = [k for k in keys if not select(joined, timing=k[0], batch=k[1]).empty]
    fig, axes = new_figure(
        1,
        len(keys),
        "Accuracy vs decode-step latency (marker size grows with the budget)",
        caption(pd.concat([accuracy, latency]), runs),
        panel=(3.8, 3.0),
    )
    points = []
    for j, (timing, batch) in enumerate(keys):
        ax = axes[0, j]
        panel = select(joined, timing=timing, batch=batch)
        for series, method, family in ordered_series(panel):
            rows = panel[panel.series == series].sort_values("budget")
            sizes = 12 + 10 * np.log2(rows.budget.fillna(1).clip(lower=1)) / 4
            colour = series_colour(panel, series, method, family)
            ax.plot(
                rows.latency_us,
                rows.score,
                color=colour,
                linewidth=0.8,
                alpha=0.6,
                linestyle=line_style(family, method)["linestyle"],
            )
            ax.scatter(
                rows.latency_us,
                rows.score,
                s=sizes,
                color=colour,
                label=series,
                marker=line_style(family, method)["marker"],
                zorder=3,
            )
            points.append(rows.assign(timing=timing, batch=batch))
        front = _pareto_front(panel)
        ax.step(
            front.latency_us,
            front.score,
            where="post",
            color="#888888",
            linestyle=":",
            linewidth=1.0,
            label="Pareto front",
        )
        log_axis(ax, "x")
        ax.set_title(panel_title(batch=batch, timing=timing))
    label_axes(axes, "latency per decode step (µs)", "mean task score")
    figure_legend(fig, axes.flat, "method")
    return Rendered(fig, concat_points(points))


def _join_accuracy_latency(accuracy: pd.DataFrame, latency: pd.DataFrame) -> pd.DataFrame:
    """Return one row per (method, params, timing, batch): mean score and latency (µs)."""
    candidates = (
        "method",
        *BUDGET_COLUMNS,
        *VARIANT_COLUMNS,
        "ctx",
        "batch",
        "heads",
        "kv_heads",
        "head_dim",
        "dtype",
        "layout",
    )
    keys = [
        c
        for c in candidates
        if c in accuracy.columns and c in latency.columns and accuracy[c].notna().any()
    ]
    group = [*keys, "series", "family", "budget"]
    scores = accuracy.groupby(group, dropna=False, as_index=False).agg(
        score=("value", "mean"), tasks=("task", "nunique")
    )
    lat_cols = [c for c in ("timing", "batch") if c in latency.columns and c not in keys]
    lat = latency[[*keys, *lat_cols, "value"]].rename(columns={"value": "latency_us"})
    lat = lat.groupby([*keys, *lat_cols], dropna=False, as_index=False).latency_us.median()
    joined = scores.merge(lat, on=keys, how="inner")
    # Dense accuracy rows run no kernel of their own: price them at the best dense baseline.
    dense = scores[scores.family.isin(DENSE_FAMILIES) & ~scores.series.isin(joined.series)]
    baselines = latency[latency.family == "baseline"]
    if not dense.empty and not baselines.empty:
        shape = [k for k in keys if k not in ("method", *BUDGET_COLUMNS, *VARIANT_COLUMNS)]
        best = (
            baselines.groupby([*shape, *lat_cols], dropna=False, as_index=False)
            .value.min()
            .rename(columns={"value": "latency_us"})
        )
        priced = (
            dense.merge(best, on=shape, how="inner") if shape else dense.merge(best, how="cross")
        )
        priced["series"] = priced.series + " (best dense kernel)"
        joined = pd.concat([joined, priced], ignore_index=True)
    return joined


def _pareto_front(points: pd.DataFrame) -> pd.DataFrame:
    """Return the points no other point beats on both latency (lower) and score (higher)."""
    ordered = points.sort_values(["latency_us", "score"], ascending=[True, False])
    best, keep = -math.inf, []
    for index, row in ordered.iterrows():
        if row.score > best:
            best = row.score
            keep.append(index)
    return ordered.loc[keep, ["latency_us", "score"]]
