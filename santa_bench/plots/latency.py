"""latency-vs-ctx: median decode latency against context length."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from santa_bench.plots.output import Rendered
from santa_bench.plots.rows import (
    BUDGET_COLUMNS,
    NoData,
    caption,
    concat_points,
    kernel_rows,
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
    log_axis,
    size_axis,
    styled,
)

NAME = "latency-vs-ctx"
PRODUCER = (
    "santa-bench kernel --ctx 8k,32k,128k --batch 1,8 --S 128 "
    "--methods santa-prop,santa-flash,triton-splitkv --baselines auto (on a GPU)"
)


@styled
def latency_vs_ctx(frame: pd.DataFrame, runs: Sequence[dict[str, Any]] = ()) -> Rendered:
    """Return median decode latency vs context, log-log, one panel per (timing, batch).

    Sampled methods are drawn at one budget (S=128 when present, else the smallest);
    narrow the rows with --where to pick another. Error bars are the IQR; a dotted line of
    a series' colour is its byte floor (its bytes at the fastest dense kernel's achieved
    bandwidth in the same run; santa_bench.roofline), and the CSV holds ``floor_ratio``.
    """
    data = with_series(ok_rows(kernel_rows(frame), "latency"))
    if data.empty or "ctx" not in data.columns:
        raise NoData(NAME, PRODUCER)
    data = _with_floor_us(data, frame)
    data, note = _one_budget_per_series(data)
    fig, axes, panels = panel_grid(
        data,
        "timing",
        "batch",
        f"Decode attention latency vs context{note}",
        caption(data, runs),
        sharex=True,
    )
    points = []
    for ax, timing, batch, panel in panels:
        for series, method, family in ordered_series(panel):
            rows = panel[panel.series == series].sort_values("ctx")
            rows = rows.groupby("ctx", as_index=False).agg(
                value=("value", "median"),
                q1=("q1_us", "median") if "q1_us" in rows else ("value", "median"),
                q3=("q3_us", "median") if "q3_us" in rows else ("value", "median"),
                floor_us=("floor_us", "median"),
            )
            low = (rows.value - rows.q1.fillna(rows.value)).clip(lower=0)
            high = (rows.q3.fillna(rows.value) - rows.value).clip(lower=0)
            ax.errorbar(
                rows.ctx,
                rows.value,
                yerr=[low, high],
                label=series,
                color=series_colour(panel, series, method, family),
                **line_style(family, method),
            )
            if rows.floor_us.notna().any():  # the byte floor: the same bytes at dense's rate
                ax.plot(rows.ctx, rows.floor_us, color=series_colour(panel, series, method,
                                                                    family),
                        linestyle=(0, (1, 2)), linewidth=0.8, alpha=0.6)
            points.append(
                rows.rename(
                    columns={"value": "latency_us", "q1": "q1_us", "q3": "q3_us"}
                ).assign(
                    timing=timing, batch=batch, series=series, method=method, family=family,
                    floor_ratio=rows.value / rows.floor_us,
                )
            )
        log_axis(ax, "y")
        size_axis(ax, data.ctx)
        ax.set_title(panel_title(batch=batch, timing=timing))
    label_axes(axes, "context length (tokens)", "latency per decode step (µs)")
    figure_legend(fig, axes.flat, "method")
    return Rendered(fig, concat_points(points))


def _one_budget_per_series(data: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Return rows of each sampled series at one budget (128 if measured, else its smallest)."""
    sampled = data[data.budget.notna()]
    if sampled.empty:
        return data, ""
    chosen = sampled.groupby("series").budget.agg(
        lambda b: 128.0 if (b == 128).any() else float(b.min())
    )
    keep = data.budget.isna() | (data.budget == data.series.map(chosen))
    notes = []
    for name in BUDGET_COLUMNS:  # e.g. "S=128, M=32"
        if name not in sampled.columns:
            continue
        series = sampled[sampled[name].notna()].series.unique()
        values = sorted({chosen[s] for s in series})
        if values:
            notes.append(f"{name}={int(values[0])}" if len(values) == 1 else f"{name}=128 or min")
    note = ", ".join(notes)
    return data[keep], f" (sampled methods at {note})"


def _with_floor_us(data: pd.DataFrame, frame: pd.DataFrame) -> pd.DataFrame:
    """The latency rows with ``floor_us`` (NaN where no dense baseline floors them)."""
    from santa_bench.roofline import floor_by_case

    floors = floor_by_case(kernel_rows(frame)) if {"run_id", "case_hash"} <= set(data) else {}
    keys = zip(data.get("run_id", []), data.get("case_hash", []), strict=False)
    values = [floors.get(key, (float("nan"), 0.0))[0] for key in keys]
    return data.assign(floor_us=values if len(values) == len(data) else float("nan"))
