"""The timing anchor tables: dense baselines and the papers' released kernels beside ours.

The anchor cells come from santa_bench/data/anchors.yaml (tables `dense`, `kernels`); ours
are the medians of the store's kernel rows at the anchors' attention shape (heads, KV heads,
head dim, dtype) and the same context, batch, S and timing.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from santa_bench.anchors import Anchors, packaged_anchors
from santa_bench.plots.rows import ok_rows
from santa_bench.plots.table_text import fmt
from santa_bench.units import format_size


def measured(frame: pd.DataFrame, metric: str, **where: Any) -> pd.Series | None:
    """Return the first ok row of `metric` matching `where` exactly, else None."""
    rows = ok_rows(frame, metric)
    for column, value in where.items():
        if column not in rows.columns:
            return None
        rows = rows[rows[column].isna()] if value is None else rows[rows[column] == value]
    return None if rows.empty else rows.iloc[0]


def at_shape(kernel: pd.DataFrame, shape: dict[str, Any]) -> pd.DataFrame:
    """Return the rows of `kernel` at `shape` (heads, kv_heads, head_dim, dtype): each
    shape column the store records must match."""
    mask = pd.Series(True, index=kernel.index)
    for name, value in shape.items():
        if name in kernel.columns:
            mask &= kernel[name] == value
    return kernel[mask]


def _speedup_cell(row: pd.Series | None) -> str:
    """Return "0.60× [0.59–0.60]" for a speedup row."""
    if row is None:
        return "–"
    ci = ""
    if not pd.isna(row.get("ci_low")) and not pd.isna(row.get("ci_high")):
        ci = f" [{row.ci_low:.2f}–{row.ci_high:.2f}]"
    return f"{row.value:.2f}×{ci}"


def _latency_text(value: float | list[float] | None) -> str:
    """Return an anchor latency as written: one median, a range "low–high", or "–"."""
    if value is None:
        return "–"
    if isinstance(value, list):
        low, high = value
        return f"{low:.1f}–{high:.1f}"
    return f"{value:.1f}"


def dense_table(kernel: pd.DataFrame, anchors: Anchors | None = None) -> pd.DataFrame:
    """Return the dense-baseline anchor table beside our medians (events and graph)."""
    table = (anchors or packaged_anchors())["dense"]
    kernel = at_shape(kernel, table["shape"])
    records = []
    for anchor in table.rows:
        ctx, batch, method = anchor["ctx"], anchor["batch"], anchor["method"]
        ours = {
            t: measured(kernel, "latency", method=method, ctx=ctx, batch=batch, timing=t)
            for t in ("events", "graph")
        }
        records.append(
            {
                "ctx": format_size(ctx),
                "B": batch,
                "baseline": method,
                "anchor events (µs)": _latency_text(anchor.get("events")),
                "ours events (µs)": fmt(None if ours["events"] is None else ours["events"].value),
                "anchor graph (µs)": _latency_text(anchor.get("graph")),
                "ours graph (µs)": fmt(None if ours["graph"] is None else ours["graph"].value),
            }
        )
    return pd.DataFrame(records)


def kernel_table(kernel: pd.DataFrame, anchors: Anchors | None = None) -> pd.DataFrame:
    """Return the released SANTA kernels (anchor) beside ours at the same shapes and S."""
    table = (anchors or packaged_anchors())["kernels"]
    kernel = at_shape(kernel, table["shape"])
    records = []
    for anchor in table.rows:
        ctx, batch, s = anchor["ctx"], anchor["batch"], anchor["S"]
        for method, name in table["kernels"].items():
            released = anchor[method]  # None: the released kernel does not run this case
            where = {"method": method, "ctx": ctx, "batch": batch, "S": float(s)}
            cells: dict[str, str] = {}
            for timing in ("events", "graph"):
                latency = measured(kernel, "latency", timing=timing, **where)
                speedup = measured(kernel, "speedup_vs_best_dense", timing=timing, **where)
                cells[f"ours {timing} (µs)"] = fmt(None if latency is None else latency.value)
                cells[f"ours {timing} speedup [95% CI]"] = _speedup_cell(speedup)
            best = measured(kernel, "speedup_vs_best_dense", timing="events", **where)
            best_us = None
            if best is not None and isinstance(best.get("best_dense"), str):
                row = measured(
                    kernel, "latency", method=best.best_dense, ctx=ctx, batch=batch, timing="events"
                )
                best_us = None if row is None else row.value
            records.append(
                {
                    "ctx": format_size(ctx),
                    "B": batch,
                    "S": s,
                    "kernel": name,
                    "anchor (µs)": "n/a" if released is None else fmt(released["us"]),
                    "anchor speedup": fmt(
                        None if released is None else released["speedup"], ".2f", "×"
                    ),
                    "anchor best dense (µs)": fmt(anchor["best_dense_us"]),
                    **{k: cells[k] for k in ("ours events (µs)", "ours events speedup [95% CI]")},
                    "ours best dense events (µs)": fmt(best_us),
                    **{k: cells[k] for k in ("ours graph (µs)", "ours graph speedup [95% CI]")},
                }
            )
    return pd.DataFrame(records)
