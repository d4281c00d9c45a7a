"""Markdown tables from the result store (the tables of docs/benchmarks.md).

Kernel rows on a model's captured attention (``santa-bench kernel --inputs``) get tables
of their own, named by their ``inputs``, beside those of the Gaussian inputs; a store
with Gaussian rows alone prints as before.

Rows carrying their GPU (a ``gpu_name`` column: ``santa-bench report`` fills it from each
row's run.json, :func:`santa_bench.stores.row_gpus`) show it in a column, and rows of
several GPUs get a table per GPU: a table, and the best dense latency of the speedup
matrix, never spans GPUs.
"""

from __future__ import annotations

import math

import pandas as pd

from santa_bench.captured import GAUSSIAN
from santa_bench.labels import TABLE_HEAD, TEXT_PARAMS, config_label
from santa_bench.units import format_size

KERNEL_METRICS = (
    "latency",
    "speedup_vs_best_dense",
    "bandwidth",
    "floor_ratio",
    "rel_l2_vs_dense",
    "kv_read_fraction",
)


def _with_inputs_column(kernel: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The rows with ``inputs`` filled (``gaussian`` where absent) and the table keys:
    ``timing, l2``, and ``inputs`` when some rows are not Gaussian."""
    labels = (kernel["inputs"].where(kernel["inputs"].notna(), GAUSSIAN).astype(str)
              if "inputs" in kernel else pd.Series(GAUSSIAN, index=kernel.index, dtype=object))
    kernel = kernel.assign(inputs=labels)
    keys = ["timing", "l2"] + (["inputs"] if set(labels) != {GAUSSIAN} else [])
    return kernel, keys


GPU = "gpu_name"
"""The column of a row's GPU, where the frame has one."""


def _with_gpu_key(kernel: pd.DataFrame, keys: list[str],
                  always: bool = False) -> tuple[pd.DataFrame, list[str]]:
    """Adds the GPU to the table keys where the rows hold several GPUs (``always``: where
    they hold a GPU column), so that a table never spans GPUs."""
    if GPU not in kernel or (not always and kernel[GPU].nunique(dropna=False) < 2):
        return kernel, keys
    return kernel.assign(**{GPU: kernel[GPU].fillna("").astype(str)}), [GPU, *keys]


def _with_shape_column(kernel: pd.DataFrame, keys: list[str]) -> tuple[pd.DataFrame, list[str]]:
    """Adds ``shape`` (``Hq/Hkv/d``) to the table keys where the rows hold several attention
    shapes, so each shape gets its own table."""
    if not {"heads", "kv_heads", "head_dim"} <= set(kernel.columns):
        return kernel, keys
    shape = (kernel.heads.astype("Int64").astype(str) + "/"
             + kernel.kv_heads.astype("Int64").astype(str) + "/"
             + kernel.head_dim.astype("Int64").astype(str))
    if shape.nunique() < 2:
        return kernel, keys
    return kernel.assign(shape=shape), [*keys, "shape"]


def _groups(rows: pd.DataFrame, keys: list[str]) -> list[tuple[tuple, pd.DataFrame]]:
    """The rows grouped by ``keys``, in order, the Gaussian inputs' before captured ones."""
    groups = list(rows.groupby(keys, dropna=False, sort=True))
    if "inputs" in keys:
        at = keys.index("inputs")
        groups.sort(key=lambda g: (*map(str, g[0][:at]), g[0][at] != GAUSSIAN, g[0][at]))
    return groups


def _title(key: tuple, keys: list[str]) -> str:
    """``timing: graph, L2: cold`` (and ``, inputs: captured:...``)."""
    names = {GPU: "GPU", "timing": "timing", "l2": "L2", "inputs": "inputs",
             "shape": "heads/KV heads/d"}
    return ", ".join(f"{names[k]}: {v}" for k, v in zip(keys, key, strict=True))


def _ctx_cell(row: pd.Series) -> str:
    """The context, ``(tiled)`` where captured K/V were tiled to it."""
    tiled = row.get("inputs_tiled")
    return format_size(int(row.ctx)) + (" (tiled)" if tiled is True or tiled == 1.0 else "")


def case_metrics(rows: pd.DataFrame, row: pd.Series) -> pd.DataFrame:
    """The metric rows of ``row``'s case, indexed by metric: the same case may sit in
    several runs (re-timings), so only ``row``'s run, its last write of each metric."""
    same = rows.case_hash == row.case_hash
    if "run_id" in rows:
        same &= rows.run_id == row.run_id
    return rows[same].drop_duplicates("metric", keep="last").set_index("metric")


def metric_value(case: pd.DataFrame, metric: str) -> float:
    """``metric``'s value in ``case`` (from :func:`case_metrics`), NaN when absent or not ok."""
    if metric not in case.index or case.loc[metric, "status"] != "ok":
        return math.nan
    return float(case.loc[metric, "value"])


def speedup_cell(case: pd.DataFrame, bold: bool = False) -> str:
    """``1.23x [1.21-1.25] vs best`` (the bootstrap interval), or ``-``."""
    speedup = metric_value(case, "speedup_vs_best_dense")
    if math.isnan(speedup):
        return "-"
    ci = case.loc["speedup_vs_best_dense"]
    ratio = f"**{speedup:.2f}x**" if bold else f"{speedup:.2f}x"
    return f"{ratio} [{ci.ci_low:.2f}-{ci.ci_high:.2f}] vs {ci.best_dense}"


def _label(row: pd.Series) -> str:
    """``santapp M=32 P=16 policy=kmeans``: a kernel table's configuration label."""
    return config_label(row, head=TABLE_HEAD, text_params=TEXT_PARAMS)


def kernel_table(frame: pd.DataFrame) -> str:
    """Returns one Markdown table per (timing, l2 state) of the kernel rows in ``frame``.

    Rows: (ctx, batch, method[, S]) sorted by latency; columns: median latency with its
    interquartile range, speedup against the best vendor dense baseline of the same
    group with its bootstrap 95% interval, achieved bandwidth on the method's byte
    model, its time over its byte floor (``floor_ratio``, stored or derived by
    :func:`santa_bench.roofline.with_floor`), relative L2 error against dense, the KV read
    fraction, and the GPU where the rows carry one (a table per GPU where they hold several).
    """
    from santa_bench.roofline import kernel_group_columns, with_floor

    kernel = frame[frame.get("kind") == "kernel"]
    kernel = with_floor(kernel, kernel_group_columns())
    kernel = kernel[kernel.metric.isin(KERNEL_METRICS)]
    if kernel.empty:
        return "(no kernel rows)\n"
    kernel, keys = _with_inputs_column(kernel)
    kernel, keys = _with_shape_column(kernel, keys)
    kernel, keys = _with_gpu_key(kernel, keys)
    lines: list[str] = []
    latency = kernel[kernel.metric == "latency"]
    runs = "run_id" in kernel and kernel.run_id.nunique() > 1  # name each line's run
    gpu = GPU in kernel
    for key, group in _groups(latency, keys):
        lines += [
            f"\n**{_title(key, keys)}**\n",
            "| ctx | B | method | latency (us) [IQR] | speedup vs best dense [95% CI] "
            "| bandwidth (TB/s) | over byte floor | rel. L2 vs dense | KV read |"
            + (" GPU |" if gpu else "") + (" run |" if runs else ""),
            "|---|---|---|---|---|---|---|---|---|" + ("---|" if gpu else "")
            + ("---|" if runs else ""),
        ]
        for _, row in group.sort_values(["ctx", "batch", "value"]).iterrows():
            case = case_metrics(kernel, row)
            lines.append(_kernel_line(row, case) + (f" {row[GPU]} |" if gpu else "")
                         + (f" {row.run_id} |" if runs else ""))
    return "\n".join(lines) + "\n"


def _kernel_line(row: pd.Series, case: pd.DataFrame) -> str:
    if row.status != "ok":
        latency = f"{row.status}: {row.reason}"
    else:
        q1, q3 = row.get("q1_us", math.nan), row.get("q3_us", math.nan)
        iqr = "" if pd.isna(q1) or pd.isna(q3) else f" [{q1:,.1f}-{q3:,.1f}]"
        latency = f"{row.value:,.1f}{iqr}"  # CPU wall-clock rows carry no quartiles
    speed = speedup_cell(case)
    bandwidth = metric_value(case, "bandwidth") / 1e3
    floor_ratio = metric_value(case, "floor_ratio")
    error = metric_value(case, "rel_l2_vs_dense")
    reads = metric_value(case, "kv_read_fraction")
    cells = [
        _ctx_cell(row),
        str(int(row.batch)),
        _label(row),
        latency,
        speed,
        "-" if math.isnan(bandwidth) else f"{bandwidth:.2f}",
        "-" if math.isnan(floor_ratio) else f"{floor_ratio:.2f}x",
        "-" if math.isnan(error) else f"{error:.1e}",
        "-" if math.isnan(reads) else f"{reads:.1%}",
    ]
    return "| " + " | ".join(cells) + " |"


def speedup_matrix(frame: pd.DataFrame) -> str:
    """Returns one Markdown table per (timing, l2 state): a line per (ctx, batch,
    method variant), a column per sample budget S, each cell the median latency and the
    speedup against the best dense baseline of its group (``41.3 us, 0.95x``).

    The full table of a sweep at a glance; a case stored by several runs shows the last
    one loaded (one run per call keeps it unambiguous). Methods without S are left out.
    Rows carrying their GPU get a table per GPU, its best dense latency of that GPU.
    """
    kernel = frame[(frame.get("kind") == "kernel") & frame.metric.isin(KERNEL_METRICS)]
    if "S" not in kernel:
        return "(no sampled kernel rows)\n"
    kernel, keys = _with_inputs_column(kernel)
    kernel, keys = _with_gpu_key(kernel, keys, always=True)
    every_latency = kernel[kernel.metric == "latency"]
    latency = every_latency[every_latency.S.notna()]
    if latency.empty:
        return "(no sampled kernel rows)\n"
    lines: list[str] = []
    for key, group in _groups(latency, keys):
        budgets = sorted({int(s) for s in group.S})
        same = dict(zip(keys, key, strict=True))
        rows, latencies = kernel, every_latency  # of the group's inputs and GPU
        for column in ("inputs", GPU):
            if column in same:
                rows = rows[rows[column] == same[column]]
                latencies = latencies[latencies[column] == same[column]]
        dense = _best_dense_latency(rows, latencies, same["timing"], same["l2"])
        lines += [
            f"\n**{_title(key, keys)}** (latency, speedup vs best dense)\n",
            "| ctx | B | method | best dense | " + " | ".join(f"S={s}" for s in budgets) + " |",
            "|---|---|---|---|" + "---|" * len(budgets),
        ]
        cells: dict[tuple[int, int, str], dict[int, str]] = {}
        for _, row in group.iterrows():
            method = _label(row.drop(labels="S"))
            cells.setdefault((int(row.ctx), int(row.batch), method), {})[int(row.S)] = (
                _matrix_cell(row, case_metrics(kernel, row)))
        for (ctx, batch, method), by_s in sorted(cells.items()):
            line = [format_size(ctx), str(batch), method, dense.get((ctx, batch), "-")]
            line += [by_s.get(s, "") for s in budgets]
            lines.append("| " + " | ".join(line) + " |")
    return "\n".join(lines) + "\n"


def _best_dense_latency(kernel: pd.DataFrame, latency: pd.DataFrame, timing: str,
                        l2: str) -> dict[tuple[int, int], str]:
    """``(ctx, batch) -> "sdpa-cudnn 38.4 us"``: the baseline the speedups of that group
    were taken against (named by their rows) and its median latency in the same mode."""
    speedups = kernel[(kernel.metric == "speedup_vs_best_dense") & (kernel.timing == timing)
                      & (kernel.l2 == l2)]
    same_mode = latency[(latency.timing == timing) & (latency.l2 == l2)]
    best: dict[tuple[int, int], str] = {}
    for (ctx, batch), group in speedups.groupby(["ctx", "batch"]):
        name = group.best_dense.dropna().iloc[-1] if group.best_dense.notna().any() else None
        rows = same_mode[(same_mode.ctx == ctx) & (same_mode.batch == batch)
                         & (same_mode.method == name) & (same_mode.status == "ok")]
        if name is not None and not rows.empty:
            best[(int(ctx), int(batch))] = f"{name} {rows.value.iloc[-1]:,.1f} us"
    return best


def _matrix_cell(row: pd.Series, case: pd.DataFrame) -> str:
    if row.status != "ok":
        return str(row.status)
    speedup = metric_value(case, "speedup_vs_best_dense")
    return f"{row.value:,.1f} us" + ("" if math.isnan(speedup) else f", {speedup:.2f}x")
