"""The byte floor of a kernel call: the time its bytes take at the fastest dense kernel's
achieved bandwidth in the same run, and how far a call's time is above it.

A call's bytes (``moved_bytes`` of santa_bench.runners.kernel, from the byte model every
kernel row records) are the K/V bytes its read counts give at the cache dtype (Quest's
page bounds at their stored size, the cache dtype), the tables it reads besides the cache
(``bytes_read_tables``: SANTA++'s representatives; vAttention's token-major copy of the
scores, written), a logit or score stash written and
read back (in ``bytes_read``), ``q`` read and the output written. Indices and split-KV
partials are not counted, so the floor is a lower bound of the bytes: ``floor_ratio``
errs against the method, never for it. tests/test_byte_models.py checks the counts
against the rows each kernel reads.

``floor_us = bytes / bandwidth of the fastest dense baseline of the same group`` and
``floor_ratio = latency / floor_us``. The kernel runner stores both as metric rows for
every timed method; :func:`with_floor` derives them for stored rows that lack them.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from santa_bench.kernel_keys import GROUP_KEYS

FLOOR_METRICS = ("floor_us", "floor_ratio")


def floor_rows(
    moved_bytes: float, latency_us: float, dense_bandwidth_gbps: float | None, best_dense: str
) -> list[dict[str, Any]]:
    """The ``floor_us`` and ``floor_ratio`` rows of a call that moves ``moved_bytes`` in
    ``latency_us``, against a dense baseline that achieved ``dense_bandwidth_gbps``
    (skipped rows, with the reason, when none was timed in the group)."""
    if not dense_bandwidth_gbps or not math.isfinite(dense_bandwidth_gbps):
        reason = "no dense baseline's bandwidth in this group"
        return [
            metric_row("floor_us", math.nan, "us", status="skipped", reason=reason),
            metric_row("floor_ratio", math.nan, "x", status="skipped", reason=reason),
        ]
    floor_us = moved_bytes / (dense_bandwidth_gbps * 1e3)  # GB/s -> bytes/us
    return [
        metric_row("floor_us", floor_us, "us", best_dense=best_dense),
        metric_row("floor_ratio", latency_us / floor_us, "x", best_dense=best_dense),
    ]


def metric_row(metric: str, value: float, unit: str, status: str = "ok", reason: str = "",
               **extra: Any) -> dict[str, Any]:
    """One result row of a kernel case: ``metric``, ``value``, ``unit``, its status and
    reason, and any ``extra`` columns (the kernel runner's rows too)."""
    return {"metric": metric, "value": float(value), "unit": unit, "status": status,
            "reason": reason, **extra}


def kernel_group_columns() -> list[str]:
    """The columns of a kernel row's speed group (the kernel runner's ``GROUP_KEYS``, and
    its inputs): one dense baseline floors the calls of one group."""
    return [*GROUP_KEYS, "inputs", "inputs_digest"]


def floor_by_case(frame: pd.DataFrame) -> dict[tuple[str, str], tuple[float, float]]:
    """``(run_id, case_hash) -> (floor_us, floor_ratio)`` of the kernel rows of ``frame``,
    stored or derived (:func:`with_floor`)."""
    rows = with_floor(frame, kernel_group_columns())
    if rows.empty or "metric" not in rows.columns:
        return {}
    ok = rows[rows.metric.isin(FLOOR_METRICS) & (rows.status == "ok")]
    table = ok.pivot_table(index=["run_id", "case_hash"], columns="metric", values="value",
                           aggfunc="first")
    if not set(FLOOR_METRICS) <= set(table.columns):
        return {}
    return {key: (float(r.floor_us), float(r.floor_ratio))
            for key, r in zip(table.index, table.itertuples(), strict=True)}


def with_floor(frame: pd.DataFrame, group_columns: list[str]) -> pd.DataFrame:
    """``frame`` (kernel rows) with ``floor_us`` / ``floor_ratio`` rows derived for every
    timed case that has none, from its ``latency`` and ``bandwidth`` rows and the fastest
    dense baseline (``family`` ``baseline`` rows, or ``best_dense`` named by a speedup row)
    of the same ``run_id`` and ``group_columns``. Speed is never compared across runs."""
    needed = {"metric", "value", "status", "case_hash", "run_id", "method"}
    if frame.empty or not needed <= set(frame.columns):
        return frame
    ok = frame[frame.status == "ok"]
    latency = {(r, c): v for r, c, v in ok.loc[ok.metric == "latency",
                                                 ["run_id", "case_hash", "value"]].itertuples(
                                                     index=False)}
    bandwidth = ok[ok.metric == "bandwidth"]
    if bandwidth.empty:
        return frame
    have = set(frame.loc[frame.metric == "floor_us", ["run_id", "case_hash"]].itertuples(
        index=False, name=None))
    dense_names = _dense_names(frame)
    keys = ["run_id", *[c for c in group_columns if c in frame.columns]]
    derived = []
    for _, group in bandwidth.groupby(keys, dropna=False, sort=False):
        dense = group[group.method.isin(dense_names)]
        if dense.empty:
            continue
        times = [latency.get((r, c), math.inf) for r, c in zip(dense.run_id, dense.case_hash,
                                                                  strict=True)]
        if not times or min(times) == math.inf:
            continue
        fastest = dense.iloc[min(range(len(times)), key=times.__getitem__)]
        for record in group.to_dict("records"):
            key = (record["run_id"], record["case_hash"])
            if key in have or key not in latency:
                continue
            time_us = float(latency[key])
            moved = record["value"] * 1e3 * time_us  # GB/s x us -> bytes
            for row in floor_rows(moved, time_us, float(fastest["value"]), fastest["method"]):
                derived.append({**record, **row})
    if not derived:
        return frame
    return pd.concat([frame, pd.DataFrame(derived)], ignore_index=True)


def _dense_names(frame: pd.DataFrame) -> set[str]:
    """The methods that are dense baselines: those a speedup row names as ``best_dense``,
    and the registry's vendor baselines."""
    from santa_bench.methods import REGISTRY

    names = {m.name for m in REGISTRY if m.kernel_kind == "baseline"}
    if "best_dense" in frame.columns:
        names |= set(frame["best_dense"].dropna().astype(str))
    return names
