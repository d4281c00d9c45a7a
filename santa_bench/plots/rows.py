"""The store's rows as figures need them: selected, split into series, labelled.

Each preset reads the tidy rows of `ResultStore.load`; these helpers keep the ok rows of
a metric, name each method's variants as separate series with their own shade, and
write the panel titles and the caption (the machine, from each run's run.json).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from santa_bench.labels import config_label
from santa_bench.plots.style import family_rank, method_colour, new_figure, shade
from santa_bench.units import format_size

BUDGET_COLUMNS = ("S", "M")  # S: samples per head (SANTA); M: teams (SANTA++)
# Method parameters that split one method into several series when they vary. (Bernoulli's
# value-stage parameter cannot be stored as "value", a fixed column, so it is not listed.)
VARIANT_COLUMNS = ("tile", "alloc", "stash", "grouping", "draws", "team_size", "reps", "merge",
                   "passes", "gather")
SERIES_SHADES = (0.0, 0.45, -0.35, 0.7, -0.55)  # a method's variants, in label order
ACCURACY_METRICS = ("score",)
KNOWN_SHAPES = {(32, 8, 128): "Llama-3.1-8B", (28, 4, 128): "Qwen2.5-7B"}


class NoData(Exception):
    """A preset has no rows to plot; `command` says what would produce them."""

    def __init__(self, preset: str, command: str) -> None:
        super().__init__(f"{preset}: no data; produce it with: {command}")
        self.preset = preset
        self.command = command


def ok_rows(frame: pd.DataFrame, metrics: str | Sequence[str]) -> pd.DataFrame:
    """Return the ok rows of `metrics` with a finite value."""
    metrics = [metrics] if isinstance(metrics, str) else list(metrics)
    keep = frame.metric.isin(metrics) & (frame.status == "ok") & frame.value.notna()
    return frame[keep].copy()


def kernel_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Return the kernel rows on Gaussian inputs (all rows when the store has no `kind`
    column); rows timed on a model's captured attention (`inputs` = captured:...) are
    left to `santa-bench pareto` and `report`, which show them apart."""
    if "inputs" in frame.columns:
        frame = frame[frame.inputs.isna() | (frame.inputs == "gaussian")]
    if "kind" not in frame.columns:
        return frame
    return frame[frame.kind.isna() | (frame.kind == "kernel")]


def column(frame: pd.DataFrame, name: str) -> pd.Series:
    """Return `frame[name]`, or an all-NA column when the store never recorded it."""
    return frame[name] if name in frame.columns else pd.Series(pd.NA, index=frame.index)


def with_series(frame: pd.DataFrame) -> pd.DataFrame:
    """Return `frame` with `family`, `budget` (S, else M) and a `series` label per method.

    A method's label names the variant parameters that take several values in `frame`
    (e.g. `santa-prop alloc=largest-remainder`), so variants never merge into one line.
    """
    data = frame.copy()
    data["method"] = column(data, "method").fillna("").astype(str)
    data["family"] = column(data, "family").fillna("").astype(str)
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
            head = [(c, c, True) for c in varying]
            labels = rows.apply(
                lambda r, head=head, name=str(method): config_label(
                    {**r, "method": name}, head=head, rest=False),
                axis=1,
            )
            data.loc[rows.index, "series"] = labels
    # one colour a series: the method's own for its first, lighter or darker shades of it
    # for the other variants (in label order), so that variants stay apart in a legend
    data["colour"] = ""
    for (method, family), rows in data.groupby(["method", "family"], sort=False):
        base = method_colour(str(method), str(family))
        for k, series in enumerate(sorted(rows.series.unique())):
            colour = shade(base, SERIES_SHADES[k % len(SERIES_SHADES)])
            data.loc[rows.index[rows.series == series], "colour"] = colour
    return data


def series_colour(frame: pd.DataFrame, series: str, method: str, family: str) -> str:
    """Return the colour :func:`with_series` gave ``series`` (the method's, without it)."""
    if "colour" in frame.columns:
        picked = frame.loc[frame.series == series, "colour"]
        if len(picked) and picked.iloc[0]:
            return str(picked.iloc[0])
    return method_colour(method, family)


def accuracy_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Return the ok task-score rows (metric in ACCURACY_METRICS, with a `task`), as series."""
    if "task" not in frame.columns:
        return with_series(frame.iloc[0:0])
    data = ok_rows(frame, ACCURACY_METRICS)
    return with_series(data[data.task.notna()])


def budget_name(frame: pd.DataFrame) -> str:
    """Return the budget's axis name: S, M, or both."""
    names = [n for n in BUDGET_COLUMNS if n in frame.columns and frame[n].notna().any()]
    return " or ".join(names) if names else "S"


def ordered_series(data: pd.DataFrame) -> list[tuple[str, str, str]]:
    """Return (series, method, family) sorted by family, then method, then series."""
    keys = data[["series", "method", "family"]].drop_duplicates()
    return sorted(
        (tuple(map(str, k)) for k in keys.itertuples(index=False)),
        key=lambda k: (family_rank(k[2]), k[1], k[0]),
    )


def unique(frame: pd.DataFrame, name: str) -> list:
    """Return the sorted distinct values of column `name` (NaN kept as one None entry)."""
    if name not in frame.columns:
        return [None]
    values = frame[name].drop_duplicates().tolist()
    finite = sorted(v for v in values if not pd.isna(v))
    return finite + ([None] if any(pd.isna(v) for v in values) else [])


def select(frame: pd.DataFrame, **where: Any) -> pd.DataFrame:
    """Return the rows where each column equals its value (None matches NA or absence)."""
    mask = pd.Series(True, index=frame.index)
    for name, value in where.items():
        if name not in frame.columns:
            continue
        mask &= frame[name].isna() if value is None else frame[name] == value
    return frame[mask]


def panel_grid(data: pd.DataFrame, row_key: str, col_key: str, title: str, caption: str,
               **subplots: Any) -> tuple[Any, np.ndarray, list[tuple[Any, Any, Any, pd.DataFrame]]]:
    """A figure of one panel per (row value, column value) of ``data``: returns
    ``(figure, axes, panels)``, ``panels`` listing ``(ax, row value, column value, the
    panel's rows)`` row by row (``subplots``: as :func:`new_figure` takes them)."""
    rows, cols = unique(data, row_key), unique(data, col_key)
    fig, axes = new_figure(len(rows), len(cols), title, caption, **subplots)
    panels = [(axes[i, j], r, c, select(data, **{row_key: r, col_key: c}))
              for i, r in enumerate(rows) for j, c in enumerate(cols)]
    return fig, axes, panels


def concat_points(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Return the concatenated points of a figure (empty frame if none)."""
    parts = [p for p in parts if not p.empty]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def panel_title(**parts: Any) -> str:
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
    ids = set(column(frame, "run_id").dropna().astype(str))
    records = [r for r in runs if str(r.get("run_id")) in ids]

    def joined(key: str, transform: Callable[[Any], str] = str) -> str:
        values = dict.fromkeys(transform(r[key]) for r in records if r.get(key))
        return " / ".join(values)

    gpu = joined("gpu_name") or joined("device")
    parts = [gpu]
    parts += [f"{name} {version}" for name in ("torch", "triton") if (version := joined(name))]
    parts.append(joined("date", lambda d: str(d)[:10]))
    if "model" in frame.columns and frame.model.notna().any():
        parts.append(", ".join(map(str, unique(frame, "model")[:3])))
    shape_cols = ("heads", "kv_heads", "head_dim")
    if all(c in frame.columns for c in shape_cols):
        shapes = frame[list(shape_cols)].dropna().drop_duplicates()
        if len(shapes) == 1:
            h, kvh, d = (int(v) for v in shapes.iloc[0])
            name = KNOWN_SHAPES.get((h, kvh, d))
            dtype = "/".join(map(str, unique(frame.dropna(subset=["heads"]), "dtype")))
            shape = f"{h} q / {kvh} kv heads, d={d}" + (f", {dtype}" if dtype else "")
            parts.append(f"{name} shape ({shape})" if name else shape)
    return " · ".join(p for p in parts if p)
