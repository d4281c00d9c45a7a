"""Paper-style figures and anchor tables from the result store (`santa-bench plot`).

Each preset reads the tidy rows of `ResultStore.load` and returns a `Rendered` (the
matplotlib Figure and the plotted points as a DataFrame); `save` writes PNG, PDF and the
points' CSV. One style for every figure: a hue per method family, a fixed colour per
method (`method_colour`: the `plot` style each method's family module declares in the
method registry), dashed dense baselines, units on every axis, and the machine
(from each run's run.json) under the title. A preset whose rows are absent raises
`NoData` carrying the command that would produce them.
"""

from __future__ import annotations

import functools
import math
import re
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import matplotlib as mpl
import numpy as np
import pandas as pd
import typer
from matplotlib.axes import Axes
from matplotlib.colors import to_hex, to_rgb
from matplotlib.figure import Figure
from matplotlib.ticker import (
    FixedLocator,
    FuncFormatter,
    LogLocator,
    NullFormatter,
    NullLocator,
    PercentFormatter,
)

from santa_bench.stores import StoreSet
from santa_bench.units import format_size, parse_list

DPI = 150
ANCHORS_SOURCE = "docs/anchors.md"
BUDGET_COLUMNS = ("S", "M")  # S: samples per head (SANTA); M: teams (SANTA++)
# Method parameters that split one method into several series when they vary. (Bernoulli's
# value-stage parameter cannot be stored as "value", a fixed column, so it is not listed.)
VARIANT_COLUMNS = ("tile", "alloc", "stash", "grouping", "draws", "team_size", "reps", "merge",
                   "passes", "gather")
SERIES_SHADES = (0.0, 0.45, -0.35, 0.7, -0.55)  # a method's variants, in label order
DENSE_FAMILIES = ("dense", "baseline")
ACCURACY_METRICS = ("score",)
STAGE_METRIC = re.compile(r"^stage_(?P<stage>.+)_us$")

FAMILY_ORDER = ("dense", "baseline", "santa", "santapp", "bernoulli", "oracle")
FAMILY_COLOURS = {
    "dense": "#000000",
    "baseline": "#1f4e99",
    "santa": "#d62728",
    "santapp": "#2ca02c",
    "bernoulli": "#9467bd",
    "oracle": "#7f7f7f",
}
FAMILY_MARKERS = {
    "dense": "s",
    "baseline": "s",
    "santa": "o",
    "santapp": "^",
    "bernoulli": "D",
    "oracle": "x",
}
STYLE: dict[str, Any] = {
    "font.size": 8.5,
    "axes.titlesize": 9,
    "axes.labelsize": 8.5,
    "legend.fontsize": 8,
    "figure.titlesize": 10,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.4,
    "lines.markersize": 4.5,
    "errorbar.capsize": 2,
    "pdf.fonttype": 42,
}
KNOWN_SHAPES = {(32, 8, 128): "Llama-3.1-8B", (28, 4, 128): "Qwen2.5-7B"}


class NoData(Exception):
    """A preset has no rows to plot; `command` says what would produce them."""

    def __init__(self, preset: str, command: str) -> None:
        super().__init__(f"{preset}: no data; produce it with: {command}")
        self.preset = preset
        self.command = command


class Rendered(NamedTuple):
    """A rendered figure and the points it plots (written as CSV beside it)."""

    figure: Figure
    points: pd.DataFrame


class Tables(NamedTuple):
    """The anchor tables as Markdown and LaTeX, and each table's rows."""

    markdown: str
    latex: str
    frames: dict[str, pd.DataFrame]


# --------------------------------------------------------------------------- style


@functools.cache
def _method_styles() -> dict[str, Any]:
    """Method name -> its registered :class:`~santa_bench.methods.PlotStyle`."""
    from santa_bench.methods import REGISTRY

    return {method.name: method.plot for method in REGISTRY}


def method_colour(method: str, family: str | None = None) -> str:
    """Return the fixed colour of `method`: its own (its registered plot style), else a
    stable shade of its family's hue."""
    style = _method_styles().get(method)
    if style is not None and style.colour is not None:
        return style.colour
    shade = (zlib.crc32(method.encode()) % 5 - 2) / 6  # -1/3 .. 1/3: darker or lighter
    return _shade(FAMILY_COLOURS.get(family or "", "#7f7f7f"), shade)


def _line_style(family: str, method: str | None = None) -> dict[str, Any]:
    """Return plot kwargs (marker, linestyle) that mark a family, or the method's own
    (its registered plot style) where it declares them."""
    dense = family in DENSE_FAMILIES
    style = _method_styles().get(method or "")
    marker = style.marker if style is not None and style.marker else None
    linestyle = style.linestyle if style is not None and style.linestyle else None
    return {"marker": marker or FAMILY_MARKERS.get(family, "o"),
            "linestyle": linestyle or ("--" if dense else "-")}


def _family_rank(family: str) -> int:
    return FAMILY_ORDER.index(family) if family in FAMILY_ORDER else len(FAMILY_ORDER)


def _styled(render_fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a render function under STYLE, so every text and line it makes is styled alike."""

    @functools.wraps(render_fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with mpl.rc_context(STYLE):
            return render_fn(*args, **kwargs)

    return wrapper


def _new_figure(nrows: int, ncols: int, title: str, caption: str, panel=(3.4, 2.6), **kw):
    """Return (figure, 2-D axes) with constrained layout and the title + caption on top."""
    width = max(panel[0] * ncols, 6.4)  # wide enough for a five-column legend
    height = panel[1] * nrows + 1.2  # title, caption and the legend below the panels
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    fig.suptitle("\n".join([title, *_wrap(caption, int(width * 12))]))
    return fig, axes


def _wrap(caption: str, width: int) -> list[str]:
    """Return the caption's lines, broken only between its " · " parts, each <= width chars."""
    lines: list[str] = []
    for part in caption.split(" · ") if caption else []:
        if lines and len(lines[-1]) + 3 + len(part) <= width:
            lines[-1] += " · " + part
        else:
            lines.append(part)
    return lines


def _label_axes(axes: np.ndarray, xlabel: str, ylabel: str) -> None:
    """Label the x axes of the bottom row and the y axes of the first column only."""
    for ax in axes[-1, :]:
        ax.set_xlabel(xlabel)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)


def _figure_legend(fig: Figure, axes: Iterable[Axes], title: str | None = None) -> None:
    """Add one legend (unique labels, first-seen order) outside the panels, on the right."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if not label.startswith("_"):
                seen.setdefault(label, handle)
    if seen:
        fig.legend(
            list(seen.values()),
            list(seen),
            loc="outside lower center",
            title=title,
            # long variant labels ("santapp team_size=64 reps=int8") in fewer columns
            ncols=min(len(seen), 5 if max(map(len, seen)) <= 20 else 3),
            frameon=False,
        )


def _size_axis(
    ax: Axes, values: Iterable[float], axis: str = "x", base: int = 2, tokens: bool = True
) -> None:
    """Put a log axis with ticks at exactly `values`, labelled 8k / 32k (or 2048 if not tokens)."""
    ticks = sorted({float(v) for v in values if not pd.isna(v)})
    if axis == "x":
        ax.set_xscale("log", base=base)
        target = ax.xaxis
    else:
        ax.set_yscale("log", base=base)
        target = ax.yaxis
    target.set_major_locator(FixedLocator(ticks))
    label = format_size if tokens else str
    target.set_major_formatter(FuncFormatter(lambda v, _pos: label(round(v))))
    target.set_minor_locator(NullLocator())


def _log_axis(ax: Axes, axis: str = "y") -> None:
    """Make a base-10 log axis with ticks at 1, 2, 5 x 10^k labelled plainly (no minor labels)."""
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    target.set_minor_formatter(NullFormatter())


# --------------------------------------------------------------------------- rows


def _ok(frame: pd.DataFrame, metrics: str | Sequence[str]) -> pd.DataFrame:
    """Return the ok rows of `metrics` with a finite value."""
    metrics = [metrics] if isinstance(metrics, str) else list(metrics)
    keep = frame.metric.isin(metrics) & (frame.status == "ok") & frame.value.notna()
    return frame[keep].copy()


def _kernel(frame: pd.DataFrame) -> pd.DataFrame:
    """Return the kernel rows (all rows when the store has no `kind` column)."""
    if "kind" not in frame.columns:
        return frame
    return frame[frame.kind.isna() | (frame.kind == "kernel")]


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    """Return `frame[name]`, or an all-NA column when the store never recorded it."""
    return frame[name] if name in frame.columns else pd.Series(pd.NA, index=frame.index)


def _with_series(frame: pd.DataFrame) -> pd.DataFrame:
    """Return `frame` with `family`, `budget` (S, else M) and a `series` label per method.

    A method's label names the variant parameters that take several values in `frame`
    (e.g. `santa-prop alloc=largest-remainder`), so variants never merge into one line.
    """
    data = frame.copy()
    data["method"] = _column(data, "method").fillna("").astype(str)
    data["family"] = _column(data, "family").fillna("").astype(str)
    budget = pd.Series(np.nan, index=data.index)
    for name in BUDGET_COLUMNS:
        if name in data.columns:
            budget = budget.fillna(pd.to_numeric(data[name], errors="coerce"))
    data["budget"] = budget
    data["series"] = data.method.astype(str)
    for method, rows in data.groupby("method", sort=False):
        # a parameter set on some rows and left at its default (NA) on others varies too
        varying = [
            c for c in VARIANT_COLUMNS
            if c in rows.columns and rows[c].notna().any() and rows[c].nunique(dropna=False) > 1
        ]
        if varying:
            labels = rows.apply(
                lambda r, vs=varying, name=str(method): " ".join(
                    [name] + [f"{c}={_param_text(r[c])}" for c in vs if not pd.isna(r[c])]
                ),
                axis=1,
            )
            data.loc[rows.index, "series"] = labels
    # one colour a series: the method's own for its first, lighter or darker shades of it
    # for the other variants (in label order), so that variants stay apart in a legend
    data["colour"] = ""
    for (method, family), rows in data.groupby(["method", "family"], sort=False):
        base = method_colour(str(method), str(family))
        for k, series in enumerate(sorted(rows.series.unique())):
            colour = _shade(base, SERIES_SHADES[k % len(SERIES_SHADES)])
            data.loc[rows.index[rows.series == series], "colour"] = colour
    return data


def _shade(colour: str, amount: float) -> str:
    """``colour`` lighter (``amount`` > 0, towards white) or darker (< 0, towards black)."""
    rgb = np.array(to_rgb(colour))
    mixed = rgb + amount * (1.0 - rgb) if amount > 0 else rgb * (1.0 + amount)
    return to_hex(np.clip(mixed, 0, 1))


def _series_colour(frame: pd.DataFrame, series: str, method: str, family: str) -> str:
    """The colour :func:`_with_series` gave ``series`` (the method's, without that column)."""
    if "colour" in frame.columns:
        picked = frame.loc[frame.series == series, "colour"]
        if len(picked) and picked.iloc[0]:
            return str(picked.iloc[0])
    return method_colour(method, family)


def _param_text(value: Any) -> str:
    """A parameter value for a label: whole floats without their ``.0`` (team_size=16)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _budget_name(frame: pd.DataFrame) -> str:
    """Return the budget's axis name: S, M, or both."""
    names = [n for n in BUDGET_COLUMNS if n in frame.columns and frame[n].notna().any()]
    return " or ".join(names) if names else "S"


def _ordered_series(data: pd.DataFrame) -> list[tuple[str, str, str]]:
    """Return (series, method, family) sorted by family, then method, then series."""
    keys = data[["series", "method", "family"]].drop_duplicates()
    return sorted(
        (tuple(map(str, k)) for k in keys.itertuples(index=False)),
        key=lambda k: (_family_rank(k[2]), k[1], k[0]),
    )


def _unique(frame: pd.DataFrame, column: str) -> list:
    """Return the sorted distinct values of `column` (NaN kept as one None entry)."""
    if column not in frame.columns:
        return [None]
    values = frame[column].drop_duplicates().tolist()
    finite = sorted(v for v in values if not pd.isna(v))
    return finite + ([None] if any(pd.isna(v) for v in values) else [])


def _select(frame: pd.DataFrame, **where: Any) -> pd.DataFrame:
    """Return the rows where each column equals its value (None matches NA or absence)."""
    mask = pd.Series(True, index=frame.index)
    for column, value in where.items():
        if column not in frame.columns:
            continue
        mask &= frame[column].isna() if value is None else frame[column] == value
    return frame[mask]


def _panel_title(**parts: Any) -> str:
    """Return "32k · B=8 · graph" from the panel keys that are set."""
    text = []
    for key, value in parts.items():
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        if key == "ctx":
            text.append(f"ctx {format_size(int(value))}")
        elif key == "batch":
            text.append(f"B={int(value)}")
        elif key == "timing":
            text.append(f"{value} timing")
        else:
            text.append(str(value))
    return " · ".join(text)


def caption(frame: pd.DataFrame, runs: Sequence[dict[str, Any]] = ()) -> str:
    """Return "NVIDIA H200 · torch 2.11.0 · triton 3.6.0 · 2026-11-29 · <shape>" for a frame.

    The machine comes from the run.json records of the runs whose rows are in `frame`;
    the model shape from its heads/kv_heads/head_dim/dtype (or a `model` column).
    """
    ids = set(_column(frame, "run_id").dropna().astype(str))
    records = [r for r in runs if str(r.get("run_id")) in ids]

    def joined(key: str, transform: Callable[[Any], str] = str) -> str:
        values = dict.fromkeys(transform(r[key]) for r in records if r.get(key))
        return " / ".join(values)

    gpu = joined("gpu_name") or joined("device")
    parts = [gpu]
    parts += [f"{name} {version}" for name in ("torch", "triton") if (version := joined(name))]
    parts.append(joined("date", lambda d: str(d)[:10]))
    if "model" in frame.columns and frame.model.notna().any():
        parts.append(", ".join(map(str, _unique(frame, "model")[:3])))
    shape_cols = ("heads", "kv_heads", "head_dim")
    if all(c in frame.columns for c in shape_cols):
        shapes = frame[list(shape_cols)].dropna().drop_duplicates()
        if len(shapes) == 1:
            h, kvh, d = (int(v) for v in shapes.iloc[0])
            name = KNOWN_SHAPES.get((h, kvh, d))
            dtype = "/".join(map(str, _unique(frame.dropna(subset=["heads"]), "dtype")))
            shape = f"{h} q / {kvh} kv heads, d={d}" + (f", {dtype}" if dtype else "")
            parts.append(f"{name} shape ({shape})" if name else shape)
    return " · ".join(p for p in parts if p)


# --------------------------------------------------------------------------- presets


@_styled
def latency_vs_ctx(frame: pd.DataFrame, runs: Sequence[dict[str, Any]] = ()) -> Rendered:
    """Return median decode latency vs context, log-log, one panel per (timing, batch).

    Sampled methods are drawn at one budget (S=128 when present, else the smallest);
    narrow the rows with --where to pick another. Error bars are the IQR.
    """
    data = _with_series(_ok(_kernel(frame), "latency"))
    if data.empty or "ctx" not in data.columns:
        raise NoData("latency-vs-ctx", PRODUCERS["latency-vs-ctx"])
    data, note = _one_budget_per_series(data)
    timings, batches = _unique(data, "timing"), _unique(data, "batch")
    fig, axes = _new_figure(
        len(timings),
        len(batches),
        f"Decode attention latency vs context{note}",
        caption(data, runs),
        sharex=True,
    )
    points = []
    for i, timing in enumerate(timings):
        for j, batch in enumerate(batches):
            ax = axes[i, j]
            panel = _select(data, timing=timing, batch=batch)
            for series, method, family in _ordered_series(panel):
                rows = panel[panel.series == series].sort_values("ctx")
                rows = rows.groupby("ctx", as_index=False).agg(
                    value=("value", "median"),
                    q1=("q1_us", "median") if "q1_us" in rows else ("value", "median"),
                    q3=("q3_us", "median") if "q3_us" in rows else ("value", "median"),
                )
                low = (rows.value - rows.q1.fillna(rows.value)).clip(lower=0)
                high = (rows.q3.fillna(rows.value) - rows.value).clip(lower=0)
                ax.errorbar(
                    rows.ctx,
                    rows.value,
                    yerr=[low, high],
                    label=series,
                    color=_series_colour(panel, series, method, family),
                    **_line_style(family, method),
                )
                points.append(
                    rows.rename(
                        columns={"value": "latency_us", "q1": "q1_us", "q3": "q3_us"}
                    ).assign(
                        timing=timing, batch=batch, series=series, method=method, family=family
                    )
                )
            _log_axis(ax, "y")
            _size_axis(ax, data.ctx)
            ax.set_title(_panel_title(batch=batch, timing=timing))
    _label_axes(axes, "context length (tokens)", "latency per decode step (µs)")
    _figure_legend(fig, axes.flat, "method")
    return Rendered(fig, _points(points))


@_styled
def speedup_vs_S(frame: pd.DataFrame, runs: Sequence[dict[str, Any]] = ()) -> Rendered:
    """Return bars of speedup over the best dense baseline per budget, with bootstrap CIs.

    One panel per (timing, batch) row and context column; 1x (the best dense) is dashed.
    """
    data = _with_series(_ok(_kernel(frame), "speedup_vs_best_dense"))
    data = data[data.budget.notna()]
    if data.empty:
        raise NoData("speedup-vs-S", PRODUCERS["speedup-vs-S"])
    rows_keys = [(t, b) for t in _unique(data, "timing") for b in _unique(data, "batch")]
    rows_keys = [k for k in rows_keys if not _select(data, timing=k[0], batch=k[1]).empty]
    contexts = _unique(data, "ctx")
    best = ", ".join(map(str, _unique(data.dropna(subset=["best_dense"]), "best_dense")))
    fig, axes = _new_figure(
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
        row = _select(data, timing=timing, batch=batch)
        budgets = sorted(row.budget.unique())  # the budgets this timing/batch row measured
        for j, ctx in enumerate(contexts):
            ax = axes[i, j]
            panel = _select(row, ctx=ctx)
            ax.axhline(1.0, color="#444444", linestyle="--", linewidth=0.9, label="best dense (1×)")
            present = _ordered_series(panel)
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
                    color=_series_colour(panel, series, method, family),
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
            ax.set_title(_panel_title(ctx=ctx, batch=batch, timing=timing))
    _label_axes(axes, f"{_budget_name(data)} (samples per head)", "speedup vs best dense (×)")
    _figure_legend(fig, axes.flat, "method")
    return Rendered(fig, _points(points).rename(columns={"value": "speedup", "budget": "S"}))


@_styled
def error_vs_S(frame: pd.DataFrame, runs: Sequence[dict[str, Any]] = ()) -> Rendered:
    """Return relative L2 error against dense vs the budget, log-log, with an S^-1/2 guide.

    One panel per (batch, ctx), or per (attention pattern, ctx) for fidelity rows;
    duplicate cases (e.g. two timing runs) are averaged; the dense kernels' own bf16
    error is a dotted floor when the store has them.
    """
    data = _with_series(_ok(frame, "rel_l2_vs_dense"))
    sampled = data[data.budget.notna()]
    if sampled.empty:
        raise NoData("error-vs-S", PRODUCERS["error-vs-S"])
    floor = data[data.budget.isna() & data.family.isin(DENSE_FAMILIES) & (data.method != "dense")]
    by_pattern = "pattern" in sampled.columns and sampled.pattern.notna().any()
    row_key = "pattern" if by_pattern else "batch"
    batches, contexts = _unique(sampled, row_key), _unique(sampled, "ctx")
    fig, axes = _new_figure(
        len(batches),
        len(contexts),
        "Relative L2 error vs dense attention",
        caption(sampled, runs),
        sharex=True,
        sharey=True,
    )
    points = []
    for i, batch in enumerate(batches):
        for j, ctx in enumerate(contexts):
            ax = axes[i, j]
            panel = _select(sampled, **{row_key: batch}, ctx=ctx)
            for series, method, family in _ordered_series(panel):
                rows = (
                    panel[panel.series == series]
                    .groupby("budget", as_index=False)
                    .agg(rel_l2=("value", "mean"), cases=("value", "size"))
                )
                ax.plot(
                    rows.budget,
                    rows.rel_l2,
                    label=series,
                    color=_series_colour(panel, series, method, family),
                    **_line_style(family, method),
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
            dense = _select(floor, batch=batch, ctx=ctx) if not by_pattern else floor[:0]
            if not dense.empty:
                ax.axhline(
                    float(dense.value.median()),
                    color="#1f4e99",
                    linestyle="-.",
                    linewidth=0.9,
                    label="dense kernels (bf16 rounding)",
                )
            _log_axis(ax, "y")
            _size_axis(ax, sampled.budget, tokens=False)
            ax.set_title(
                f"{batch} · {_panel_title(ctx=ctx)}"
                if by_pattern
                else _panel_title(ctx=ctx, batch=batch)
            )
    _label_axes(axes, f"{_budget_name(sampled)} (samples per head)", "rel. L2 error vs dense")
    _figure_legend(fig, axes.flat, "method")
    return Rendered(fig, _points(points).rename(columns={"budget": "S"}))


@_styled
def ruler_vs_budget(frame: pd.DataFrame, runs: Sequence[dict[str, Any]] = ()) -> Rendered:
    """Return task score vs budget, one panel per task (and context); dense as a band.

    Sampled methods: mean over seeds with the seeds' standard deviation; the dense
    band spans the dense rows' min..max (a thin band around one run).
    """
    data = _accuracy_rows(frame)
    if data.empty or not data.budget.notna().any():
        raise NoData("ruler-vs-budget", PRODUCERS["ruler-vs-budget"])
    tasks, contexts = _unique(data, "task"), _unique(data, "ctx")
    unit = next((u for u in data.unit.dropna().unique() if u), "")
    fig, axes = _new_figure(
        len(contexts),
        len(tasks),
        "Task score vs sample budget (dense as a band)",
        caption(data, runs),
        sharex=True,
    )
    points = []
    for i, ctx in enumerate(contexts):
        for j, task in enumerate(tasks):
            ax = axes[i, j]
            panel = _select(data, ctx=ctx, task=task)
            for series, method, family in _ordered_series(panel):
                rows = panel[panel.series == series]
                colour = _series_colour(panel, series, method, family)
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
                    **_line_style(family, method),
                )
                points.append(
                    stats.assign(ctx=ctx, task=task, series=series, method=method, family=family)
                )
            _size_axis(ax, data.budget, tokens=False)
            if panel.value.between(0, 1).all():  # scores and ratios: the whole [0, 1] range
                ax.set_ylim(-0.05, 1.05)
            ax.set_title(_panel_title(task=task, ctx=ctx))
    _label_axes(
        axes,
        f"budget {_budget_name(data)} (samples or teams per head)",
        f"score ({unit})" if unit else "score",
    )
    _figure_legend(fig, axes.flat, "method")
    return Rendered(fig, _points(points))


@_styled
def pareto(frame: pd.DataFrame, runs: Sequence[dict[str, Any]] = ()) -> Rendered:
    """Return mean task score vs decode-step latency, with the Pareto front.

    Accuracy rows (mean over tasks and seeds) join kernel latency rows on the method and
    every parameter both record (S, M, tile, ctx, ...); a dense accuracy row with no own
    latency takes the fastest dense baseline's. One panel per (timing, batch).
    """
    accuracy = _accuracy_rows(frame)
    latency = _with_series(_ok(_kernel(frame), "latency"))
    joined = _join_accuracy_latency(accuracy, latency) if not accuracy.empty else pd.DataFrame()
    if joined.empty:
        raise NoData("pareto", PRODUCERS["pareto"])
    keys = [(t, b) for t in _unique(joined, "timing") for b in _unique(joined, "batch")]
    keys = [k for k in keys if not _select(joined, timing=k[0], batch=k[1]).empty]
    fig, axes = _new_figure(
        1,
        len(keys),
        "Accuracy vs decode-step latency (marker size grows with the budget)",
        caption(pd.concat([accuracy, latency]), runs),
        panel=(3.8, 3.0),
    )
    points = []
    for j, (timing, batch) in enumerate(keys):
        ax = axes[0, j]
        panel = _select(joined, timing=timing, batch=batch)
        for series, method, family in _ordered_series(panel):
            rows = panel[panel.series == series].sort_values("budget")
            sizes = 12 + 10 * np.log2(rows.budget.fillna(1).clip(lower=1)) / 4
            colour = _series_colour(panel, series, method, family)
            ax.plot(
                rows.latency_us,
                rows.score,
                color=colour,
                linewidth=0.8,
                alpha=0.6,
                linestyle=_line_style(family, method)["linestyle"],
            )
            ax.scatter(
                rows.latency_us,
                rows.score,
                s=sizes,
                color=colour,
                label=series,
                marker=_line_style(family, method)["marker"],
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
        _log_axis(ax, "x")
        ax.set_title(_panel_title(batch=batch, timing=timing))
    _label_axes(axes, "latency per decode step (µs)", "mean task score")
    _figure_legend(fig, axes.flat, "method")
    return Rendered(fig, _points(points))


@_styled
def reads(frame: pd.DataFrame, runs: Sequence[dict[str, Any]] = ()) -> Rendered:
    """Return the fraction of dense K+V bytes each method reads vs its budget.

    One panel per (batch, ctx); 100% (dense) and 50% (all of K, none of V) are drawn.
    """
    data = _with_series(_ok(frame, "kv_read_fraction"))
    sampled = data[data.budget.notna()]
    if sampled.empty:
        raise NoData("reads", PRODUCERS["reads"])
    batches, contexts = _unique(sampled, "batch"), _unique(sampled, "ctx")
    fig, axes = _new_figure(
        len(batches),
        len(contexts),
        "KV-cache bytes read vs sample budget",
        caption(sampled, runs),
        sharex=True,
        sharey=True,
    )
    points = []
    for i, batch in enumerate(batches):
        for j, ctx in enumerate(contexts):
            ax = axes[i, j]
            panel = _select(sampled, batch=batch, ctx=ctx)
            ax.axhline(1.0, color="#000000", linestyle="--", linewidth=0.9, label="dense (100%)")
            ax.axhline(
                0.5, color="#888888", linestyle=":", linewidth=0.9, label="all of K, no V (50%)"
            )
            for series, method, family in _ordered_series(panel):
                rows = (
                    panel[panel.series == series]
                    .groupby("budget", as_index=False)
                    .agg(kv_read_fraction=("value", "mean"))
                )
                ax.plot(
                    rows.budget,
                    rows.kv_read_fraction,
                    label=series,
                    color=_series_colour(panel, series, method, family),
                    **_line_style(family, method),
                )
                points.append(
                    rows.assign(batch=batch, ctx=ctx, series=series, method=method, family=family)
                )
            _size_axis(ax, sampled.budget, tokens=False)
            ax.set_ylim(0, 1.08)
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
            ax.set_title(_panel_title(ctx=ctx, batch=batch))
    _label_axes(axes, f"budget {_budget_name(sampled)}", "KV bytes read / dense")
    _figure_legend(fig, axes.flat, "method")
    return Rendered(fig, _points(points))


@_styled
def stages(frame: pd.DataFrame, runs: Sequence[dict[str, Any]] = ()) -> Rendered:
    """Return stacked per-stage time (rows `stage_<name>_us`) per case, one panel per timing.

    A black tick marks the case's measured end-to-end latency when the store has it.
    """
    data = frame[frame.metric.astype(str).str.match(STAGE_METRIC.pattern)]
    data = _with_series(data[(data.status == "ok") & data.value.notna()])
    if data.empty:
        raise NoData("stages", PRODUCERS["stages"])
    data["stage"] = data.metric.str.replace(STAGE_METRIC, r"\g<stage>", regex=True)
    stage_names = list(dict.fromkeys(data.stage))
    palette = mpl.colormaps["tab10"]
    totals = _ok(_kernel(frame), "latency").set_index("case_hash").value
    totals = totals[~totals.index.duplicated()]
    timings = _unique(data, "timing")
    ncases = data.case_hash.nunique()
    fig, axes = _new_figure(
        1,
        len(timings),
        "Time per stage of one decode step",
        caption(data, runs),
        panel=(max(3.4, 0.55 * ncases + 1.2), 3.0),
    )
    budget = _budget_name(data)
    points = []
    for j, timing in enumerate(timings):
        ax = axes[0, j]
        panel = _select(data, timing=timing)
        order = (
            (
                panel.drop_duplicates("case_hash")
                .assign(rank=lambda d: d.family.map(_family_rank))
                .sort_values(["rank", "method", "budget", "ctx", "batch"], na_position="first")
            )
            if {"ctx", "batch"} <= set(panel.columns)
            else panel.drop_duplicates("case_hash")
        )
        labels = []
        for x, case in enumerate(order.itertuples(index=False)):
            rows = panel[panel.case_hash == case.case_hash].set_index("stage").value
            bottom = 0.0
            for k, stage in enumerate(stage_names):
                if stage not in rows.index:
                    continue
                height = float(rows.loc[[stage]].median())
                ax.bar(x, height, bottom=bottom, width=0.7, color=palette(k % 10), label=stage)
                points.append(
                    {
                        "timing": timing,
                        "case": x,
                        "series": case.series,
                        "budget": case.budget,
                        "ctx": getattr(case, "ctx", None),
                        "batch": getattr(case, "batch", None),
                        "stage": stage,
                        "stage_us": height,
                        "bottom_us": bottom,
                    }
                )
                bottom += height
            if case.case_hash in totals.index:
                ax.plot(
                    [x],
                    [totals.loc[case.case_hash]],
                    marker="_",
                    markersize=14,
                    color="black",
                    linestyle="",
                    label="measured total",
                )
            label = case.series
            if not pd.isna(case.budget):
                label += f"\n{budget}={int(case.budget)}"
            if not pd.isna(getattr(case, "ctx", np.nan)):
                label += f"\n{format_size(int(case.ctx))} B={int(case.batch)}"
            labels.append(label)
        ax.set_xticks(range(len(labels)), labels, fontsize=7)
        ax.grid(axis="x", visible=False)
        ax.set_title(_panel_title(timing=timing))
        ax.set_ylabel("time per decode step (µs)")
    _figure_legend(fig, axes.flat, "stage")
    return Rendered(fig, pd.DataFrame(points))


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


def _accuracy_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Return the ok task-score rows (metric in ACCURACY_METRICS, with a `task`)."""
    if "task" not in frame.columns:
        return _with_series(frame.iloc[0:0])
    data = _ok(frame, ACCURACY_METRICS)
    return _with_series(data[data.task.notna()])


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


def _points(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Return the concatenated points of a figure (empty frame if none)."""
    parts = [p for p in parts if not p.empty]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


# --------------------------------------------------------------------------- anchor tables

# docs/anchors.md, "Dense baselines (exact attention)": events medians (ranges as written),
# graph replays where measured. Keys: (ctx, batch) -> method -> (events, graph).
ANCHOR_DENSE: dict[tuple[int, int], dict[str, tuple[str, str]]] = {
    (8192, 1): {
        "sdpa-cudnn": ("22.3", ""),
        "sdpa-flash": ("29.5", ""),
        "flashinfer-tc": ("24.6", ""),
        "flashinfer-cuda": ("", ""),
    },
    (8192, 8): {
        "sdpa-cudnn": ("79.9", ""),
        "sdpa-flash": ("83.0", ""),
        "flashinfer-tc": ("82.3", ""),
        "flashinfer-cuda": ("", ""),
    },
    (32768, 1): {
        "sdpa-cudnn": ("49.6–50.3", "37.1"),
        "sdpa-flash": ("58.4–58.8", "46.2"),
        "flashinfer-tc": ("52.7–53.2", "40.9"),
        "flashinfer-cuda": ("60.6–61.1", "56.7"),
    },
    (32768, 8): {
        "sdpa-cudnn": ("252.7–258.2", "239.5"),
        "sdpa-flash": ("254.7–269.4", ""),
        "flashinfer-tc": ("257.2–261.7", "245.0"),
        "flashinfer-cuda": ("386.8–388.6", ""),
    },
    (131072, 1): {
        "sdpa-cudnn": ("138.9", ""),
        "sdpa-flash": ("155.4–157.4", ""),
        "flashinfer-tc": ("144.5", ""),
        "flashinfer-cuda": ("", ""),
    },
}
# docs/anchors.md, "The papers' released kernels on this H200" (OPUSLab/SANTA CUDA, events):
# (ctx, batch, S) -> (flash us, prop us, best dense us, flash speedup, prop speedup).
ANCHOR_KERNELS: dict[tuple[int, int, int], tuple[float | None, ...]] = {
    (8192, 1, 128): (38.0, 49.9, 22.3, 0.59, 0.45),
    (8192, 1, 2048): (52.3, 63.3, 22.3, 0.43, 0.35),
    (32768, 1, 128): (77.2, 90.8, 49.9, 0.65, 0.55),
    (32768, 1, 2048): (89.0, 102.2, 49.9, 0.56, 0.49),
    (32768, 8, 128): (400.2, None, 258.2, 0.65, None),
    (131072, 1, 128): (277.6, 259.5, 138.9, 0.50, 0.54),
}
# docs/anchors.md, "Claims in the seeds": SANTA paper, Llama-3.1-8B-Instruct, 32k RULER.
ANCHOR_RULER: list[tuple[str, str | None, int | None, tuple[float, ...]]] = [
    ("SDPA", None, None, (95.60, 98.35, 64.00, 58.80)),
    ("prop", "santa-prop", 128, (95.40, 98.25, 64.40, 60.20)),
    ("prop", "santa-prop", 256, (95.47, 98.50, 63.40, 60.60)),
    ("flash", "santa-flash", 2048, (94.13, 98.25, 64.60, 60.00)),
    ("flash", "santa-flash", 256, (66.20, 88.95, 63.00, 57.20)),
]
RULER_TASKS = ("FWE", "NIAH", "QA1", "QA2")
# docs/anchors.md, GSM8K (Llama 8B): S -> (sys, strat, SANTA iid); SDPA 78.06.
ANCHOR_GSM8K: dict[int, tuple[float, float, float]] = {
    16: (44.63, 39.12, 5.51),
    32: (68.59, 67.00, 38.26),
    64: (76.42, 74.43, 63.63),
    128: (77.33, 75.64, 70.23),
    256: (77.56, 78.17, 75.61),
}
GSM8K_SDPA = 78.06
GSM8K_METHODS = ("santa-sys", "santa-strat", "santa-iid")


def _fmt(value: float | None, spec: str = ".1f", suffix: str = "") -> str:
    """Return `value` formatted, or "–" when missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:{spec}}{suffix}"


def _measured(frame: pd.DataFrame, metric: str, **where: Any) -> pd.Series | None:
    """Return the first ok row of `metric` matching `where` exactly, else None."""
    rows = _ok(frame, metric)
    for column, value in where.items():
        if column not in rows.columns:
            return None
        rows = rows[rows[column].isna()] if value is None else rows[rows[column] == value]
    return None if rows.empty else rows.iloc[0]


def _speedup_cell(row: pd.Series | None) -> str:
    """Return "0.60× [0.59–0.60]" for a speedup row."""
    if row is None:
        return "–"
    ci = ""
    if not pd.isna(row.get("ci_low")) and not pd.isna(row.get("ci_high")):
        ci = f" [{row.ci_low:.2f}–{row.ci_high:.2f}]"
    return f"{row.value:.2f}×{ci}"


def _dense_table(kernel: pd.DataFrame) -> pd.DataFrame:
    """Return the dense-baseline anchor table beside our medians (events and graph)."""
    records = []
    for (ctx, batch), methods in ANCHOR_DENSE.items():
        for method, (events, graph) in methods.items():
            ours = {
                t: _measured(kernel, "latency", method=method, ctx=ctx, batch=batch, timing=t)
                for t in ("events", "graph")
            }
            records.append(
                {
                    "ctx": format_size(ctx),
                    "B": batch,
                    "baseline": method,
                    "anchor events (µs)": events or "–",
                    "ours events (µs)": _fmt(
                        None if ours["events"] is None else ours["events"].value
                    ),
                    "anchor graph (µs)": graph or "–",
                    "ours graph (µs)": _fmt(None if ours["graph"] is None else ours["graph"].value),
                }
            )
    return pd.DataFrame(records)


def _kernel_anchor_table(kernel: pd.DataFrame) -> pd.DataFrame:
    """Return the released SANTA kernels (anchor) beside ours at the same shapes and S."""
    records = []
    for (ctx, batch, s), (flash, prop, dense, flash_x, prop_x) in ANCHOR_KERNELS.items():
        for name, method, anchor, anchor_x in (
            ("S²ANTA-flash", "santa-flash", flash, flash_x),
            ("S²ANTA-prop", "santa-prop", prop, prop_x),
        ):
            where = {"method": method, "ctx": ctx, "batch": batch, "S": float(s)}
            cells: dict[str, str] = {}
            for timing in ("events", "graph"):
                latency = _measured(kernel, "latency", timing=timing, **where)
                speedup = _measured(kernel, "speedup_vs_best_dense", timing=timing, **where)
                cells[f"ours {timing} (µs)"] = _fmt(None if latency is None else latency.value)
                cells[f"ours {timing} speedup [95% CI]"] = _speedup_cell(speedup)
            best = _measured(kernel, "speedup_vs_best_dense", timing="events", **where)
            best_us = None
            if best is not None and isinstance(best.get("best_dense"), str):
                row = _measured(
                    kernel, "latency", method=best.best_dense, ctx=ctx, batch=batch, timing="events"
                )
                best_us = None if row is None else row.value
            records.append(
                {
                    "ctx": format_size(ctx),
                    "B": batch,
                    "S": s,
                    "kernel": name,
                    "anchor (µs)": _fmt(anchor) if anchor is not None else "n/a",
                    "anchor speedup": _fmt(anchor_x, ".2f", "×"),
                    "anchor best dense (µs)": _fmt(dense),
                    **{k: cells[k] for k in ("ours events (µs)", "ours events speedup [95% CI]")},
                    "ours best dense events (µs)": _fmt(best_us),
                    **{k: cells[k] for k in ("ours graph (µs)", "ours graph speedup [95% CI]")},
                }
            )
    return pd.DataFrame(records)


def _task_key(name: Any) -> str:
    """Return a task's table key: ``ruler-qa_1`` -> ``qa1``; every NIAH variant -> ``niah``."""
    key = re.sub(r"[^a-z0-9]", "", str(name).lower()).removeprefix("ruler")
    return "niah" if key.startswith("niah") else key


UNINFORMATIVE_DENSE = 0.2  # a task whose dense score is below this cannot show a cost


def table_model(scores: pd.DataFrame) -> str | None:
    """Return the model the seeds' tables are filled from: the one with the most score
    rows, GPU runs first (None when the store has no task scores)."""
    if scores.empty or "model" not in scores.columns:
        return None
    rows = scores[(scores.metric == "score") & scores.model.notna()]
    if "device" in rows.columns and (rows.device == "cuda").any():
        rows = rows[rows.device == "cuda"]
    return None if rows.empty else str(rows.model.value_counts().idxmax())


def dense_by_task(scores: pd.DataFrame) -> dict[str, float]:
    """Return the mean dense score of each concrete task (``ruler-vt``, ``gsm8k``, ...)."""
    if scores.empty:
        return {}
    rows = scores[(scores.metric == "score") & scores.family.isin(DENSE_FAMILIES)]
    return {str(t): float(g.value.mean()) for t, g in rows.groupby("task")}


def uninformative_tasks(scores: pd.DataFrame) -> list[str]:
    """Return the tasks whose dense score is below :data:`UNINFORMATIVE_DENSE`: a small
    model at chance there shows nothing of what a method costs."""
    return sorted(t for t, v in dense_by_task(scores).items() if v < UNINFORMATIVE_DENSE)


def _our_score(scores: pd.DataFrame, task: str, method: str | None, s: int | None) -> str:
    """Return our mean score (as %) for a task/method/S over its informative concrete
    tasks (dense >= 20%); where every one is uninformative, the mean of all marked
    "(uninf.)"; "–" where nothing was measured."""
    if scores.empty:
        return "–"
    tasks = scores[scores.task.map(_task_key) == _task_key(task)]
    skip = set(uninformative_tasks(tasks))
    if method is None:
        rows = tasks[tasks.family.isin(DENSE_FAMILIES) & tasks.budget.isna()]
    else:
        rows = tasks[(tasks.method == method) & (tasks.budget == s)]
    if rows.empty:
        return "–"
    marked = bool(skip) and skip >= set(rows.task.unique())
    if not marked:
        rows = rows[~rows.task.isin(skip)]
    value = float(rows.value.mean())
    unit = str(rows.unit.iloc[0])
    text = _fmt(value * 100 if unit in ("", "fraction", "ratio") and value <= 1 else value, ".2f")
    return f"{text} (uninf.)" if marked else text


def _model_scores(scores: pd.DataFrame) -> pd.DataFrame:
    """The score rows of :func:`table_model` (every row when none is named)."""
    model = table_model(scores)
    if model is None:
        return scores
    return scores[scores.model == model]


def _ruler_table(scores: pd.DataFrame) -> pd.DataFrame:
    """Return the SANTA paper's 32k RULER table beside our scores (anchor / ours)."""
    if "ctx" in scores.columns:
        scores = scores[scores.ctx.isna() | (scores.ctx == 32768)]
    scores = _model_scores(scores)
    records = []
    for label, method, s, values in ANCHOR_RULER:
        record: dict[str, Any] = {"kernel": label, "S": s if s is not None else "–"}
        for task, anchor in zip(RULER_TASKS, values, strict=True):
            record[f"{task} anchor"] = f"{anchor:.2f}"
            record[f"{task} ours"] = _our_score(scores, task, method, s)
        records.append(record)
    return pd.DataFrame(records)


def _gsm8k_table(scores: pd.DataFrame) -> pd.DataFrame:
    """Return the SANTA paper's GSM8K table (sys / strat / iid) beside our scores."""
    scores = _model_scores(scores)
    records = [
        {
            "S": "SDPA",
            **{
                f"{m} {w}": ("78.06" if w == "anchor" and m == "santa-sys" else "–")
                for m in GSM8K_METHODS
                for w in ("anchor", "ours")
            },
        }
    ]
    records[0]["santa-sys ours"] = _our_score(scores, "gsm8k", None, None)
    for s, values in ANCHOR_GSM8K.items():
        record: dict[str, Any] = {"S": s}
        for method, anchor in zip(GSM8K_METHODS, values, strict=True):
            record[f"{method} anchor"] = f"{anchor:.2f}"
            record[f"{method} ours"] = _our_score(scores, "gsm8k", method, s)
        records.append(record)
    return pd.DataFrame(records)


TABLE_NOTES = {
    "dense": (
        "Dense baselines, median latency (µs)",
        f"Anchor: {ANCHORS_SOURCE}, 'Dense baselines' (H200, torch 2.11.0, triton 3.6.0, "
        "FlashInfer 0.6.6, triton.testing.do_bench, L2 flushed; ranges as written). "
        "Ours: kernel rows of the store (cold L2, medians).",
    ),
    "kernels": (
        "Released SANTA kernels vs ours at the same shapes",
        f"Anchor: {ANCHORS_SOURCE}, 'The papers' released kernels on this H200' "
        "(OPUSLab/SANTA CUDA kernels, sm_90, seed 1690, events timing, vs cuDNN SDPA). "
        "Ours: santa-flash / santa-prop Triton kernels; speedup vs our best dense "
        "baseline of the same run and timing, bootstrap 95% CI.",
    ),
    "ruler": (
        "RULER 32k (Llama-3.1-8B-Instruct), score (%)",
        f"Anchor: {ANCHORS_SOURCE}, 'Claims in the seeds' (SANTA paper; prefill dense, "
        "decode sampled). Ours: `score` rows with task FWE/NIAH/QA1/QA2.",
    ),
    "gsm8k": (
        "GSM8K (Llama 8B), accuracy (%)",
        f"Anchor: {ANCHORS_SOURCE}, 'Claims in the seeds' (SANTA paper; SDPA 78.06 in the "
        "first row). Ours: `score` rows with task gsm8k.",
    ),
}


def _scores_note(scores: pd.DataFrame, key: str) -> str:
    """Names the model, device and sample counts of the "ours" cells, the dense score of
    each concrete task and the uninformative tasks left out of the averages."""
    if scores.empty or "task" not in scores.columns:
        return ""
    if key == "ruler" and "ctx" in scores.columns:
        scores = scores[scores.ctx == 32768]
    scores = _model_scores(scores)
    scores = scores[scores.task.astype(str).str.startswith("ruler-")] if key == "ruler" else (
        scores[scores.task == "gsm8k"])
    if scores.empty:
        return ""
    model = table_model(scores)
    devices = sorted(str(d) for d in scores.get("device", pd.Series(dtype=str)).dropna().unique())
    counts = sorted({int(n) for n in scores.get("n", pd.Series(dtype=float)).dropna()})
    dense = dense_by_task(scores)
    per_task = ", ".join(f"{t.removeprefix('ruler-')} {100 * v:.0f}" for t, v in dense.items())
    skip = [t.removeprefix("ruler-") for t in uninformative_tasks(scores)]
    note = (f" Filled from {model} ({', '.join(devices) or 'cpu'}; n = "
            f"{', '.join(map(str, counts))} a task and method).")
    if per_task:
        note += f" Dense score per task (%): {per_task}."
    if skip:
        note += (f" Uninformative (dense < {100 * UNINFORMATIVE_DENSE:.0f}%), left out of "
                 f"the averages and marked (uninf.) where alone: {', '.join(skip)}.")
    return note


def render_tables(frame: pd.DataFrame) -> Tables:
    """Return every anchor table of docs/anchors.md beside our measurements (Markdown, LaTeX).

    Raises NoData when the store has none of the measurements the tables compare.
    """
    kernel = _kernel(frame)
    scores = _accuracy_rows(frame)
    frames = {
        "dense": _dense_table(kernel),
        "kernels": _kernel_anchor_table(kernel),
        "ruler": _ruler_table(scores),
        "gsm8k": _gsm8k_table(scores),
    }
    ours = [c for t in frames.values() for c in t.columns if "ours" in c]
    if all((t[c] == "–").all() for t in frames.values() for c in t.columns if c in ours):
        raise NoData("tables", PRODUCERS["tables"])
    markdown, latex = [], []
    for key, table in frames.items():
        title, note = TABLE_NOTES[key]
        if key in ("ruler", "gsm8k"):
            note += _scores_note(scores, key)
        markdown += [f"### {title}", "", _markdown(table), "", f"*{note}*", ""]
        latex += [_latex(table, title, note, key), ""]
    markdown.append(
        "Not compared yet: the page-subset floor for SANTA++ (FlashInfer paged decode on a "
        f"random page subset, {ANCHORS_SOURCE}) — no SANTA++ kernel rows in the store."
    )
    return Tables("\n".join(markdown) + "\n", "\n".join(latex), frames)


def _markdown(table: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(map(str, table.columns)) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)


_TEX = {
    "&": r"\&",
    "%": r"\%",
    "_": r"\_",
    "#": r"\#",
    "×": r"$\times$",
    "µ": r"$\mu$",
    "–": "--",
    "²": r"$^2$",
    "'": "'",
}


def _tex(text: Any) -> str:
    return "".join(_TEX.get(ch, ch) for ch in str(text))


def _latex(table: pd.DataFrame, title: str, note: str, key: str) -> str:
    head = " & ".join(_tex(c) for c in table.columns) + r" \\"
    body = [" & ".join(_tex(v) for v in row) + r" \\" for row in table.itertuples(index=False)]
    return "\n".join(
        [
            r"\begin{table}[t]",
            r"\centering\small",
            rf"\caption{{{_tex(title)}. {_tex(note)}}}",
            rf"\label{{tab:anchor-{key}}}",
            r"\begin{tabular}{" + "l" * len(table.columns) + "}",
            r"\toprule",
            head,
            r"\midrule",
            *body,
            r"\bottomrule",
            r"\end{tabular}",
            r"\end{table}",
        ]
    )


# --------------------------------------------------------------------------- registry + CLI

PRODUCERS: dict[str, str] = {
    "latency-vs-ctx": "santa-bench kernel --ctx 8k,32k,128k --batch 1,8 --S 128 "
    "--methods santa-prop,santa-flash,triton-splitkv --baselines auto (on a GPU)",
    "speedup-vs-S": "santa-bench kernel --ctx 8k,32k,128k --batch 1,8 --S 64,128,256,2048 "
    "--methods santa-prop,santa-flash,santa-strat,santa-iid --baselines auto (on a GPU)",
    "error-vs-S": "santa-bench kernel --ctx 4k,32k --S 16,64,256,1024 --baselines none",
    "ruler-vs-budget": "santa-bench accuracy ruler --model meta-llama/Llama-3.1-8B-Instruct "
    "--ctx 32k --methods dense,santa-prop:S=128,santa-prop:S=256,santa-flash:S=2048",
    "pareto": "santa-bench accuracy ruler ... and santa-bench kernel ... with the same methods, "
    "budgets and shapes",
    "reads": "santa-bench kernel --ctx 8k,32k --S 64,128,256,2048 --baselines none",
    "stages": "santa-bench kernel --methods <SANTA++ method> --ctx 32k --batch 1,8 "
    "(records stage_*_us rows)",
    "tables": "santa-bench kernel --ctx 8k,32k,128k --batch 1,8 --S 128,2048 "
    "--methods santa-prop,santa-flash --baselines auto --no-graph (on a GPU)",
}
FIGURES: dict[str, Callable[[pd.DataFrame, Sequence[dict[str, Any]]], Rendered]] = {
    "latency-vs-ctx": latency_vs_ctx,
    "speedup-vs-S": speedup_vs_S,
    "error-vs-S": error_vs_S,
    "ruler-vs-budget": ruler_vs_budget,
    "pareto": pareto,
    "reads": reads,
    "stages": stages,
}
PRESETS: tuple[str, ...] = (*FIGURES, "tables")

DEFAULT_OUT = Path("plots/local")
"""``plot``'s default output: beside the committed figures of plots/, ignored by git, so
that a local run never overwrites them (``--out plots/`` does, on purpose)."""


def render(name: str, frame: pd.DataFrame, runs: Sequence[dict[str, Any]] = ()) -> Rendered:
    """Return the named figure preset rendered from `frame` (NoData if it has no rows)."""
    if name not in FIGURES:
        raise ValueError(f"unknown figure preset {name!r}; choose from {', '.join(FIGURES)}")
    return FIGURES[name](frame, runs)


def save(rendered: Rendered, out: Path, name: str) -> list[Path]:
    """Write `<out>/<name>.png`, `.pdf` and `.csv` (the plotted points); return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf", out / f"{name}.csv"]
    with mpl.rc_context(STYLE):
        rendered.figure.savefig(paths[0], dpi=DPI, metadata={"Software": None})
        rendered.figure.savefig(paths[1], metadata={"CreationDate": None, "Creator": None})
    rendered.points.to_csv(paths[2], index=False, float_format="%.6g")
    return paths


def save_tables(tables: Tables, out: Path) -> list[Path]:
    """Write tables.md, tables.tex and one CSV per table; return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "tables.md", out / "tables.tex"]
    paths[0].write_text(tables.markdown)
    paths[1].write_text("% needs \\usepackage{booktabs}\n" + tables.latex + "\n")
    for key, table in tables.frames.items():
        path = out / f"tables-{key}.csv"
        table.to_csv(path, index=False)
        paths.append(path)
    return paths


@dataclass
class PlotReport:
    """What `plot_all` wrote, and the presets it could not render with their producers."""

    written: dict[str, list[Path]]
    missing: dict[str, str]


def plot_all(
    frame: pd.DataFrame, runs: Sequence[dict[str, Any]], presets: Sequence[str], out: Path
) -> PlotReport:
    """Render and save each preset that has data; return what was written and what is missing."""
    report = PlotReport({}, {})
    for name in presets:
        try:
            if name == "tables":
                report.written[name] = save_tables(render_tables(frame), out)
            else:
                rendered = render(name, frame, runs)
                report.written[name] = save(rendered, out, name)
        except NoData as missing:
            report.missing[name] = missing.command
    return report


def plot_command(
    presets: Annotated[
        list[str] | None,
        typer.Argument(help=f"Presets to render (default: all): {', '.join(PRESETS)}."),
    ] = None,
    results_dir: Annotated[
        Path,
        typer.Option(
            "--results",
            help="Result store root to read, with the stores nested below it "
            "(results/ holds results/h200/, results/smollm2-cpu/, ...).",
        ),
    ] = Path("results"),
    run: Annotated[
        str | None, typer.Option(help="Comma list of run ids to include (default: all).")
    ] = None,
    where: Annotated[
        str | None,
        typer.Option(help="pandas query on the rows, e.g. \"batch == 1 and timing == 'graph'\"."),
    ] = None,
    out: Annotated[
        Path,
        typer.Option(
            help="Folder for PNG, PDF and CSV files. The default is ignored by git; "
            "--out plots/ replaces the committed figures."
        ),
    ] = DEFAULT_OUT,
    all_runs: Annotated[
        bool,
        typer.Option(
            "--all-runs",
            help="Plot every run's rows of a case (median and spread over the runs); "
            "default: of each case only the newest run's rows (after --run and --where).",
        ),
    ] = False,
) -> None:
    """Render paper-style figures (PNG, PDF, CSV of points) and anchor tables from a store.

    With no preset, renders every preset that has data and says, for each that has
    none, which command would produce it.
    """
    chosen = list(presets or PRESETS)
    if unknown := [p for p in chosen if p not in PRESETS]:
        typer.echo(
            f"error: unknown preset(s) {unknown}; choose from {', '.join(PRESETS)}", err=True
        )
        raise typer.Exit(code=2)
    store = StoreSet(results_dir)
    try:
        frame = store.load(parse_list(run) or None)
        if where and not frame.empty:
            frame = frame.query(where)
        if not all_runs:
            frame = store.newest_per_case(frame)
    except Exception as exc:  # a bad --run or --where is the user's to fix
        typer.echo(f"error: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(code=2) from exc
    try:
        report = plot_all(frame, store.runs(), chosen, out)
    except OSError as exc:
        typer.echo(f"error: --out {out}: cannot write there ({exc.strerror or exc})", err=True)
        raise typer.Exit(code=2) from None
    for name, paths in report.written.items():
        typer.echo(f"{name}: " + ", ".join(str(p) for p in paths))
    for name, command in report.missing.items():
        typer.echo(f"{name}: no data; produce it with: {command}")
