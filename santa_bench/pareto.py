"""The verdict: speed and accuracy of the same method configurations.

Joins a model's accuracy rows (``kind == "accuracy"``: a task's score of a method
configuration) with the kernel rows (``kind == "kernel"``) of the same configuration at
the model's attention shape and context, on one GPU. Per configuration it reports the speedup
over the best dense baseline of the kernel run (with the run's bootstrap interval), the
retention against dense on the same samples (a paired bootstrap interval), the KV read
fraction (on the model's attention and on the kernel run's inputs) and the index build
cost; it marks the Pareto front (speedup against retention) and names per task family the
fastest configuration *matched* to dense: non-inferior by a paired test (the 95% paired
bootstrap interval of its score minus dense's lies above -:data:`MARGIN_POINTS` points),
and the fastest configuration at each retention band (:data:`RETENTION_BANDS`). A
difference whose interval holds 0 is *not separable* from dense, and is said so.

Speed is never joined across GPUs: a verdict's kernel rows are all of one GPU (its run's
``gpu_name``), named in its title; where the store holds kernel rows of several GPUs,
:func:`verdicts` gives one verdict per GPU. Accuracy rows may come from any GPU (a score
is the model's and the estimator's): the verdict names the GPUs they came from.

Kernel rows are timed on Gaussian inputs, and may also be timed on the model's own
attention (``santa-bench kernel --inputs``, rows with ``inputs`` =
``captured:<model>:...``): a sampled kernel's time and reads depend on where the softmax
mass sits. Where the model's captured rows exist, both speedups are shown; the verdict
(matched, faster than dense, the front) is the Gaussian inputs' as before.

A configuration run with some of the model's ``L`` layers dense (``--dense-layers``, ``d``
of them) is its own configuration (``santapp:M=256 dense_layers=21,22,23``); its kernel
time is that of the mean layer of such a step, from its sampled configuration's kernel
row and the best dense latency of the same run (:func:`with_dense_layers`).

A task is *informative* where dense scores at least :data:`INFORMATIVE` (``--min-dense``):
a task the model can hardly do says little about what a method keeps (at 25% and n = 100
a retention interval spans about +-35%); only the tasks above this line count.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from santa_bench.captured import GAUSSIAN
from santa_bench.labels import (
    DENSE_LAYERS,
    config_key,
    layered_key,
)
from santa_bench.labels import present as _present
from santa_bench.methods import REGISTRY
from santa_bench.stores import CPU, check_gpu, row_gpus

INFORMATIVE = 0.40  # dense score below which a task is left out (--min-dense)
MARGIN_POINTS = 2.0  # non-inferiority margin: score minus dense's, percentage points
RETENTION_BANDS = (0.99, 0.95, 0.90)  # the verdict's retention bands (point estimates)
BOOTSTRAP = 2000


NO_KERNEL_ROWS = "no GPU (no kernel rows at this shape)"
"""A verdict's GPU where no kernel row is in scope."""


class ParetoError(ValueError):
    """Bad input (no rows for the model, an unknown shape): a one-line message."""


class SeveralGPUs(ParetoError):
    """The kernel rows in scope span several GPUs, whose speeds are never joined."""

    def __init__(self, gpus: list[str]) -> None:
        super().__init__(f"kernel rows of {len(gpus)} GPUs ({', '.join(gpus)}): speed is "
                         "never compared across GPUs; --gpu NAME chooses one")
        self.gpus = gpus


def task_family(task: str) -> str:
    """The verdict's family of ``task`` as its registry entry names it:
    ``ruler-niah_single_1`` -> ``RULER NIAH``; ``gsm8k`` -> ``GSM8K``; else its name."""
    from santa_bench.accuracy.registry import TASKS

    found = TASKS.find(task)
    return (found.family or found.name) if found is not None else task.removeprefix("ruler-")


def verdict_task(task: Any) -> bool:
    """Whether the verdict joins rows of ``task`` (RULER's, and any task registered with
    ``verdict=True``)."""
    from santa_bench.accuracy.registry import TASKS

    found = TASKS.find(str(task))
    return found.verdict if found is not None else str(task).startswith("ruler-")


def _retired_flash(rows: pd.DataFrame) -> pd.Series:
    """Which kernel rows timed a santa-flash kernel that no longer runs (the masked
    one-pass kernel, its default before, and the two-pass kernel): rows of santa-flash
    that name neither ``gather=compact`` (in one pass) nor the function that ran."""

    def column(name: str) -> pd.Series:
        return rows[name] if name in rows else pd.Series(math.nan, index=rows.index)

    current = (column("gather") == "compact") & column("passes").isna()
    current |= column("kernel_function").notna() & column("gather").isna()
    return (rows.method == "santa-flash") & ~current


def _samples(cell: Any) -> np.ndarray:
    if isinstance(cell, str):
        cell = json.loads(cell)
    return np.asarray(cell, dtype=float)


@dataclass
class Shape:
    """An attention shape: query heads, KV heads, head dimension (and the model's layer
    count, which times a configuration run with some layers dense; None: unknown)."""

    heads: int
    kv_heads: int
    head_dim: int
    layers: int | None = None

    @classmethod
    def parse(cls, text: str) -> Shape:
        try:
            fields = [int(p) for p in text.replace("x", "/").split("/")]
            if len(fields) not in (3, 4) or min(fields) < 1:
                raise ValueError
        except ValueError:
            raise ParetoError(
                f"--shape: expected HEADS/KV_HEADS/HEAD_DIM[/LAYERS], got {text!r}") from None
        return cls(*fields)

    def __str__(self) -> str:
        return f"{self.heads}/{self.kv_heads}/{self.head_dim}"


def model_shape(model: str) -> Shape:
    """The attention shape of a catalog model."""
    from santa_bench.accuracy.models import CATALOG

    if model not in CATALOG:
        raise ParetoError(f"{model}: not a catalog model; give its attention shape with --shape")
    return Shape(*CATALOG[model].attention, CATALOG[model].layers)


# ----------------------------------------------------------------- accuracy side
@dataclass
class Accuracy:
    """One configuration's scores: per task, the per-sample scores (paired with dense)."""

    per_task: dict[str, np.ndarray]
    read_fraction: float


def split_layers(config: str) -> tuple[str, tuple[int, ...]]:
    """``("santapp:M=256", (21, 22, 23))`` from ``santapp:M=256 dense_layers=21,22,23``."""
    base, _, layers = config.partition(DENSE_LAYERS)
    return base, tuple(int(x) for x in layers.split(",") if x)


def accuracy_rows(frame: pd.DataFrame, model: str, ctx: int) -> dict[str, Accuracy]:
    """Per configuration key (:func:`layered_key`), its per-sample scores on each RULER
    task at ``ctx`` (the newest row of a task)."""
    if not {"kind", "model", "ctx", "task"} <= set(frame.columns):
        return {}
    rows = frame[(frame.kind == "accuracy") & (frame.status == "ok") & (frame.model == model)]
    rows = rows[rows.task.map(verdict_task).astype(bool) & (rows.ctx == ctx)]
    if rows.empty:
        return {}
    rows = rows.assign(config=[layered_key(r) for _, r in rows.iterrows()])
    rows = rows[rows.config.notna()]
    out: dict[str, Accuracy] = {}
    for config, group in rows.groupby("config"):
        scores = group[group.metric == "score"].drop_duplicates("task", keep="last")
        reads = group[group.metric == "decode_kv_read_fraction"].value
        out[str(config)] = Accuracy(
            {str(r.task): _samples(r.per_sample) for r in scores.itertuples()},
            float(reads.mean()) if len(reads) else math.nan,
        )
    return out


def informative_tasks(dense: Accuracy, min_dense: float = INFORMATIVE) -> list[str]:
    """The tasks where dense scores at least ``min_dense``."""
    return sorted(t for t, s in dense.per_task.items() if len(s) and s.mean() >= min_dense)


@dataclass
class Retention:
    """A configuration's accuracy on a set of tasks, against dense on the same samples."""

    tasks: list[str]
    score: float  # mean over the tasks of the mean per-sample score
    dense: float
    retention: float
    low: float
    high: float
    diff_low: float = math.nan  # score minus dense, points: paired bootstrap 95% interval
    diff_high: float = math.nan

    @property
    def drop_points(self) -> float:
        return 100 * (self.dense - self.score)

    @property
    def matched(self) -> bool:
        """Non-inferior to dense: the interval of score minus dense's lies above the
        margin (a paired one-sided test at 2.5%)."""
        return self.diff_low >= -MARGIN_POINTS

    @property
    def versus_dense(self) -> str:
        """``below`` / ``above`` dense where the difference's interval excludes 0, else
        ``not separable`` (the data cannot rank them)."""
        if self.diff_high < 0:
            return "below"
        if self.diff_low > 0:
            return "above"
        return "not separable"


def retention(config: Accuracy, dense: Accuracy, tasks: Sequence[str],
              seed: int = 0) -> Retention | None:
    """Retention on ``tasks`` (None unless the configuration has every one): the ratio of
    the task-averaged scores, with a paired bootstrap interval (samples resampled within
    each task, the same indices for both)."""
    if not tasks or any(t not in config.per_task for t in tasks):
        return None
    pairs = []
    for task in tasks:
        ours, theirs = config.per_task[task], dense.per_task[task]
        if len(ours) != len(theirs):
            return None
        pairs.append((ours, theirs))
    score = float(np.mean([o.mean() for o, _ in pairs]))
    base = float(np.mean([d.mean() for _, d in pairs]))
    if base <= 0:
        return None
    rng = np.random.default_rng(seed)
    ours_boot = np.zeros(BOOTSTRAP)
    dense_boot = np.zeros(BOOTSTRAP)
    for ours, theirs in pairs:
        idx = rng.integers(0, len(ours), size=(BOOTSTRAP, len(ours)))
        ours_boot += ours[idx].mean(axis=1)
        dense_boot += theirs[idx].mean(axis=1)
    ratio = ours_boot / np.maximum(dense_boot, 1e-12)
    low, high = np.quantile(ratio, [0.025, 0.975])
    diff = 100 * (ours_boot - dense_boot) / len(pairs)
    diff_low, diff_high = np.quantile(diff, [0.025, 0.975])
    return Retention(list(tasks), score, base, score / base, float(low), float(high),
                     float(diff_low), float(diff_high))


# ----------------------------------------------------------------- kernel side
@dataclass
class Timing:
    """A configuration's kernel row at one batch size."""

    latency_us: float
    speedup: float
    low: float
    high: float
    best_dense: str
    read_fraction: float
    index_build_ms: float
    run_id: str
    inputs: str = GAUSSIAN
    tiled: bool = False  # captured K/V tiled to the context
    command: str = ""
    floor_ratio: float = math.nan  # latency over its byte floor (santa_bench.roofline)
    dense_runs: int = 1  # runs of this GPU whose dense medians widen the interval


def captured_prefix(model: str) -> str:
    """The ``inputs`` prefix of kernel rows on ``model``'s captured attention."""
    from santa_bench.capture import CAPTURED_PREFIX

    return f"{CAPTURED_PREFIX}{model}:"


def with_inputs(rows: pd.DataFrame, inputs: str) -> pd.DataFrame:
    """The kernel rows on ``inputs``: ``gaussian`` (rows without an ``inputs`` value too),
    or the rows whose ``inputs`` starts with the given prefix."""
    if "inputs" not in rows:
        return rows if inputs == GAUSSIAN else rows.iloc[0:0]
    labels = rows["inputs"].where(rows["inputs"].notna(), GAUSSIAN).astype(str)
    keep = labels == GAUSSIAN if inputs == GAUSSIAN else labels.str.startswith(inputs)
    return rows[keep]


def _timed_rows(frame: pd.DataFrame, shape: Shape, ctx: int, inputs: str) -> pd.DataFrame:
    """The ok GPU kernel rows of the configurations at ``shape`` and ``ctx`` on ``inputs``
    (not the dense baselines, which are the reference of a speedup, nor retired kernels)."""
    if not {"kind", "method"} <= set(frame.columns):
        return frame.iloc[0:0]
    rows = with_inputs(frame[(frame.kind == "kernel") & (frame.status == "ok")], inputs)
    for column, value in (("heads", shape.heads), ("kv_heads", shape.kv_heads),
                          ("head_dim", shape.head_dim), ("ctx", ctx)):
        if column not in rows:
            return rows.iloc[0:0]
        rows = rows[rows[column] == value]
    if "device" in rows:
        rows = rows[rows.device == "cuda"]
    rows = rows[~_retired_flash(rows)]
    baselines = {m.name for m in REGISTRY if m.family == "baseline"}
    return rows[~rows.method.isin(baselines)]


def kernel_gpus(frame: pd.DataFrame, runs: Sequence[dict[str, Any]], model: str, shape: Shape,
                ctx: int) -> list[str]:
    """The GPUs (:func:`santa_bench.stores.row_gpus`) of the kernel rows a verdict of
    ``model`` at ``shape`` and ``ctx`` would join (on Gaussian or the model's captured
    inputs), sorted."""
    found: set[str] = set()
    for inputs in (GAUSSIAN, captured_prefix(model)):
        rows = _timed_rows(frame, shape, ctx, inputs)
        found |= set(row_gpus(rows, list(runs)))
    return sorted(found)


def kernel_rows(frame: pd.DataFrame, runs: Sequence[dict[str, Any]], shape: Shape, ctx: int,
                gpu: str | None, inputs: str = GAUSSIAN) -> dict[tuple[str, int], Timing]:
    """Per (configuration key, batch), the newest kernel row at ``shape`` and ``ctx`` on
    ``gpu`` (a GPU name from run.json, :func:`santa_bench.stores.run_gpu`; None: any, for
    rows known to be of one GPU) and on ``inputs`` (see :func:`with_inputs`)."""
    from santa_bench.roofline import floor_by_case

    rows = _timed_rows(frame, shape, ctx, inputs)
    dates = {str(r.get("run_id")): str(r.get("date") or "") for r in runs}
    if gpu is not None:
        rows = rows[row_gpus(rows, list(runs)) == gpu]
    if rows.empty:
        return {}
    kernel = frame[(frame.get("kind") == "kernel") & frame.run_id.isin(set(rows.run_id))]
    floors = floor_by_case(kernel)
    spread = dense_medians(frame, list(runs), shape, ctx, gpu, inputs)
    rows = rows.assign(config=[config_key(r) for _, r in rows.iterrows()],
                       when=rows.run_id.map(lambda run: (dates.get(str(run), ""), str(run))))
    out: dict[tuple[str, int], Timing] = {}
    for (config, batch), group in rows.groupby(["config", "batch"]):
        newest = group[group.when == group.when.max()]
        by_metric = newest.drop_duplicates("metric", keep="last").set_index("metric")

        def value(metric: str, by_metric: pd.DataFrame = by_metric) -> float:
            return float(by_metric.loc[metric, "value"]) if metric in by_metric.index \
                else math.nan

        if "latency" not in by_metric.index:
            continue
        speed = by_metric.loc["speedup_vs_best_dense"] \
            if "speedup_vs_best_dense" in by_metric.index else None
        out[(str(config), int(batch))] = Timing(
            latency_us=value("latency"),
            speedup=float(speed.value) if speed is not None else math.nan,
            low=float(speed.ci_low) if speed is not None else math.nan,
            high=float(speed.ci_high) if speed is not None else math.nan,
            best_dense=str(speed.best_dense) if speed is not None else "",
            read_fraction=value("kv_read_fraction"),
            index_build_ms=value("index_build_ms"),
            run_id=str(newest.run_id.iloc[0]),
            inputs=str(newest.inputs.iloc[0]) if "inputs" in newest
            and isinstance(newest.inputs.iloc[0], str) else GAUSSIAN,
            tiled=bool(newest.inputs_tiled.iloc[0]) if "inputs_tiled" in newest
            and _present(newest.inputs_tiled.iloc[0]) else False,
            command=str(newest.command.iloc[0]) if "command" in newest else "",
            floor_ratio=floors.get((str(newest.run_id.iloc[0]),
                                    str(newest.case_hash.iloc[0])) if "case_hash" in newest
                                   else ("", ""), (math.nan, math.nan))[1],
        )
        if speed is not None:
            key = (str(config), int(batch))
            out[key] = widened(out[key], spread.get((int(batch), str(speed.best_dense)), {}))
    return out


def dense_medians(frame: pd.DataFrame, runs: Sequence[dict[str, Any]], shape: Shape,
                  ctx: int, gpu: str | None, inputs: str = GAUSSIAN
                  ) -> dict[tuple[int, str], dict[str, float]]:
    """``(batch, dense baseline) -> {run: median latency}``: every run of ``gpu`` that timed
    that baseline at ``shape``, ``ctx`` and ``inputs`` (its repeated timings)."""
    rows = frame[(frame.get("kind") == "kernel") & (frame.status == "ok")
                 & (frame.get("family") == "baseline") & (frame.metric == "latency")]
    rows = with_inputs(rows, inputs)
    for column, value in (("heads", shape.heads), ("kv_heads", shape.kv_heads),
                          ("head_dim", shape.head_dim), ("ctx", ctx)):
        if column not in rows:
            return {}
        rows = rows[rows[column] == value]
    if gpu is not None and not rows.empty:
        rows = rows[row_gpus(rows, list(runs)) == gpu]
    out: dict[tuple[int, str], dict[str, float]] = {}
    for record in rows.itertuples():
        out.setdefault((int(record.batch), str(record.method)), {})[str(record.run_id)] = float(
            record.value)
    return out


def widened(timing: Timing, medians: dict[str, float]) -> Timing:
    """``timing`` with its speedup interval widened by the spread of its dense baseline's
    median over the runs of the GPU (``medians``): the ends scale by the fastest and the
    slowest median over the one of the timing's own run (unchanged with one run)."""
    if len(medians) < 2 or math.isnan(timing.speedup):
        return timing
    # the dense median the speedup was taken against (recalled from an earlier run of the
    # same environment when the timing's own run timed no baseline)
    own = medians.get(timing.run_id, timing.latency_us * timing.speedup)
    fastest, slowest = min(medians.values()), max(medians.values())
    return dataclasses.replace(timing, low=timing.low * fastest / own,
                               high=timing.high * slowest / own, dense_runs=len(medians))


def best_dense_latency(frame: pd.DataFrame, shape: Shape, ctx: int, batch: int,
                       inputs: str = GAUSSIAN,
                       runs: set[str] | None = None) -> tuple[str, float] | None:
    """The fastest dense baseline's latency (``baseline`` family) at a shape, if timed;
    ``runs``: only in these kernel runs (those the speedups come from)."""
    rows = frame[(frame.get("kind") == "kernel") & (frame.status == "ok")
                 & (frame.get("family") == "baseline") & (frame.metric == "latency")]
    if runs is not None:
        rows = rows[rows.run_id.astype(str).isin(runs)]
    rows = with_inputs(rows, inputs)
    for column, value in (("heads", shape.heads), ("kv_heads", shape.kv_heads),
                          ("head_dim", shape.head_dim), ("ctx", ctx), ("batch", batch)):
        if column not in rows:
            return None
        rows = rows[rows[column] == value]
    if rows.empty:
        return None
    best = rows.loc[rows.value.idxmin()]
    return str(best.method), float(best.value)


def with_dense_layers(timing: Timing, dense: int, layers: int) -> Timing:
    """A configuration's kernel row as the mean layer of a step that runs ``dense`` of the
    model's ``layers`` layers dense: time ``((L - d) t + d t_dense) / L`` with ``t_dense``
    the run's best dense latency (``t s``), speedup ``L / ((L - d) / s + d)`` (the
    interval's ends alike), KV read ``((L - d) r + d) / L``, index build ``(L - d) / L``."""
    sampled = (layers - dense) / layers

    def speed(s: float) -> float:
        return layers / ((layers - dense) / s + dense) if s > 0 else math.nan

    dense_us = timing.latency_us * timing.speedup
    return Timing(
        latency_us=sampled * timing.latency_us + (1 - sampled) * dense_us,
        speedup=speed(timing.speedup), low=speed(timing.low), high=speed(timing.high),
        best_dense=timing.best_dense,
        read_fraction=sampled * timing.read_fraction + (1 - sampled),
        index_build_ms=sampled * timing.index_build_ms,
        run_id=timing.run_id, inputs=timing.inputs, tiled=timing.tiled, command=timing.command,
    )


def _timings_of(config: str, timings: dict[tuple[str, int], Timing], batches: Sequence[int],
                layers: int | None) -> dict[int, Timing]:
    """The kernel rows of ``config`` per batch: its own, or for a configuration with dense
    layers its sampled configuration's mixed with dense (:func:`with_dense_layers`)."""
    base, dense = split_layers(config)
    rows = {b: t for (c, b), t in timings.items() if c == base and b in batches}
    if not dense:
        return rows
    return {b: with_dense_layers(t, len(dense), layers) for b, t in rows.items()} \
        if layers else {}


# ----------------------------------------------------------------- the join
@dataclass
class Point:
    """One configuration: its accuracy and its kernel timings."""

    config: str
    overall: Retention | None
    families: dict[str, Retention | None]
    read_fraction: float  # on the model's attention (accuracy runs)
    timings: dict[int, Timing]
    front: set[int] = field(default_factory=set)  # batches where it is on the front
    # on the informative tasks it has, where it lacks some (not on the front, no verdict)
    partial: Retention | None = None
    captured: dict[int, Timing] = field(default_factory=dict)  # on the model's attention


@dataclass
class Verdict:
    """What :func:`verdict` found."""

    model: str
    shape: Shape
    ctx: int
    batches: tuple[int, ...]
    gpu: str
    dense: Accuracy
    tasks: list[str]
    families: dict[str, list[str]]
    points: list[Point]
    missing: list[tuple[str, str, str]]  # (config, what is missing, the command)
    accuracy_runs: list[str]
    kernel_runs: list[str]
    environments: list[dict[str, Any]]
    dense_latency: dict[int, tuple[str, float] | None]
    captured_inputs: list[str] = field(default_factory=list)  # the labels of captured rows
    captured_dense_latency: dict[int, tuple[str, float] | None] = field(default_factory=dict)
    set_aside: list[str] = field(default_factory=list)  # configs run with dense layers
    accuracy_gpus: list[str] = field(default_factory=list)  # the accuracy runs' GPUs
    skipped_parts: list[str] = field(default_factory=list)  # unreadable parts left out
    min_dense: float = INFORMATIVE  # dense score of an informative task

    @property
    def has_captured(self) -> bool:
        """Whether kernel rows on the model's captured attention were joined."""
        return bool(self.captured_inputs)

    def fastest(self, family: str, batch: int, band: float | None = None) -> Point | None:
        """The fastest configuration matched to dense (non-inferior: see
        :attr:`Retention.matched`) on ``family`` at ``batch``, or with ``band`` the fastest
        whose retention is at least ``band`` (None when there is none)."""
        best: Point | None = None
        for point in self.points:
            if point.config == "dense":
                continue
            ret = point.overall if family == "all" else point.families.get(family)
            timing = point.timings.get(batch)
            if ret is None or timing is None or math.isnan(timing.speedup):
                continue
            if not (ret.matched if band is None else ret.retention >= band):
                continue
            if best is None or timing.speedup > best.timings[batch].speedup:
                best = point
        return best


def _front(points: list[Point], batch: int) -> None:
    """Marks the points on the Pareto front (higher speedup, higher retention) at batch.
    Dense itself (speedup 1, retention 1) competes without being marked: a configuration
    slower than dense and no more accurate is dominated by not using it."""
    scored = [(p, p.timings[batch].speedup, p.overall.retention) for p in points
              if p.overall is not None and batch in p.timings
              and not math.isnan(p.timings[batch].speedup)]
    rivals = [(s, r) for _, s, r in scored] + [(1.0, 1.0)]
    for point, speed, ret in scored:
        dominated = any(s >= speed and r >= ret and (s > speed or r > ret) for s, r in rivals)
        if not dominated:
            point.front.add(batch)


def kernel_command(config: str, shape: Shape, ctx: int, batches: Sequence[int]) -> str:
    """The command that times ``config`` at the shape (with the dense baselines)."""
    return (f"santa-bench kernel --ctx {ctx // 1024}k --batch {','.join(map(str, batches))} "
            f"--heads {shape.heads} --kv-heads {shape.kv_heads} --head-dim {shape.head_dim} "
            f"--methods {config} --baselines auto")


def captured_kernel_command(config: str, shape: Shape, ctx: int, batches: Sequence[int],
                            timings: Sequence[Timing]) -> str:
    """The command that times ``config`` on the capture file the other captured rows used
    (read from their stored commands; ``FILE`` when none names one)."""
    import shlex

    path = "FILE"
    for timing in timings:
        args = shlex.split(timing.command) if timing.command else []
        if "--inputs" in args[:-1]:
            path = args[args.index("--inputs") + 1]
            break
    return kernel_command(config, shape, ctx, batches) + f" --inputs {shlex.quote(path)}"


def accuracy_command(config: str, model: str, ctx: int, tasks: Sequence[str], n: int) -> str:
    """The command that scores ``config`` on the tasks of the verdict (RULER's in one
    command; another registered task in one command each, ``;``-joined)."""
    from santa_bench.accuracy.registry import TASKS

    names = ",".join(t.removeprefix("ruler-") for t in tasks if t.startswith("ruler-"))
    base, dense = split_layers(config)
    layers = f" --dense-layers {','.join(map(str, dense))}" if dense else ""
    rest = f"--ctx {ctx // 1024}k --n {n} --model {model} --methods {base}{layers} --device cuda"
    commands = [f"santa-bench accuracy ruler --tasks {names} {rest}"] if names else []
    for task in (t for t in tasks if not t.startswith("ruler-")):
        found = TASKS.find(task)
        module = found.module if found is not None else "santa_bench."
        plugin = "" if module.startswith("santa_bench.") else f"--plugin {module} "
        commands.append(f"santa-bench {plugin}accuracy task {task} {rest}")
    return "; ".join(commands)


def _gpus_of_rows(frame: pd.DataFrame, runs: Sequence[dict[str, Any]]) -> set[str]:
    """The GPUs the store's rows were measured on (CPU rows left out)."""
    return set(row_gpus(frame, list(runs))) - {CPU}


def verdicts(frame: pd.DataFrame, runs: Sequence[dict[str, Any]], model: str, *,
             shape: Shape | None = None, ctx: int = 32768, batches: Sequence[int] = (1, 8),
             gpu: str | None = None, min_dense: float = INFORMATIVE) -> list[Verdict]:
    """:func:`verdict` on ``gpu``; with none, one verdict per GPU of the kernel rows in
    scope (:func:`kernel_gpus`), in name order (one verdict where there are none)."""
    try:
        return [verdict(frame, runs, model, shape=shape, ctx=ctx, batches=batches, gpu=gpu,
                        min_dense=min_dense)]
    except SeveralGPUs as exc:
        return [verdict(frame, runs, model, shape=shape, ctx=ctx, batches=batches, gpu=one,
                        min_dense=min_dense)
                for one in exc.gpus]


def verdict(frame: pd.DataFrame, runs: Sequence[dict[str, Any]], model: str, *,
            shape: Shape | None = None, ctx: int = 32768, batches: Sequence[int] = (1, 8),
            gpu: str | None = None, min_dense: float = INFORMATIVE) -> Verdict:
    """Joins accuracy and kernel rows of ``model`` (see the module's docstring): the kernel
    rows of ``gpu`` (None: the one GPU of the kernel rows in scope; where they span several,
    a ParetoError: see :func:`verdicts`), the accuracy rows of any GPU, on the tasks where
    dense scores at least ``min_dense``."""
    if not 0.0 <= min_dense < 1.0:
        raise ParetoError(f"--min-dense: a score in [0, 1), got {min_dense}")
    if gpu is not None:
        try:
            check_gpu(gpu, _gpus_of_rows(frame, runs))
        except ValueError as exc:
            raise ParetoError(str(exc)) from None
    acc = accuracy_rows(frame, model, ctx)
    if not acc:
        raise ParetoError(f"no RULER accuracy rows of {model} at ctx {ctx} in the store")
    if "dense" not in acc:
        raise ParetoError(f"no dense accuracy rows of {model}: retention needs them")
    shape = shape or model_shape(model)
    if gpu is None:
        found = kernel_gpus(frame, runs, model, shape, ctx)
        if len(found) > 1:
            raise SeveralGPUs(found)
        gpu = found[0] if found else None
    run_env = {str(r.get("run_id")): r for r in runs}
    acc_rows = frame[(frame.get("kind") == "accuracy") & (frame.model == model)
                     & frame.task.map(verdict_task).astype(bool) & (frame.ctx == ctx)]
    set_aside: list[str] = []
    if shape.layers is None:  # a step with dense layers cannot be timed without the count
        set_aside = sorted(c for c in acc if split_layers(c)[1])
        acc = {c: a for c, a in acc.items() if c not in set_aside}
    accuracy_runs = sorted(set(acc_rows.run_id.astype(str)))
    accuracy_gpus = sorted(set(row_gpus(acc_rows, list(runs))))
    dense = acc["dense"]
    tasks = informative_tasks(dense, min_dense)
    families: dict[str, list[str]] = {}
    for task in tasks:
        families.setdefault(task_family(task), []).append(task)
    timings = kernel_rows(frame, runs, shape, ctx, gpu)
    captured = kernel_rows(frame, runs, shape, ctx, gpu, captured_prefix(model))
    configs = sorted(set(acc) | {c for c, _ in timings}, key=lambda c: (c != "dense", c))
    points: list[Point] = []
    missing: list[tuple[str, str, str]] = []
    n = max((len(s) for s in dense.per_task.values()), default=0)
    for config in configs:
        base = split_layers(config)[0]
        by_batch = _timings_of(config, timings, batches, shape.layers)
        if config == "dense":
            points.append(Point(config, retention(dense, dense, tasks),
                                {f: retention(dense, dense, ts) for f, ts in families.items()},
                                1.0, {}))
            continue
        score = acc.get(config)
        if score is None:
            missing.append((config, "accuracy rows",
                            accuracy_command(config, model, ctx, tasks, n)))
        elif lacking := [t for t in tasks if t not in score.per_task]:
            missing.append((config, "accuracy on " + ", ".join(
                t.removeprefix("ruler-") for t in lacking),
                accuracy_command(config, model, ctx, lacking, n)))
        if lacking_b := [b for b in batches if b not in by_batch]:
            missing.append((config, f"kernel rows at B={','.join(map(str, lacking_b))}",
                            kernel_command(base, shape, ctx, lacking_b)))
        on_model = _timings_of(config, captured, batches, shape.layers)
        if captured and (lacking_c := [b for b in batches if b not in on_model]):
            missing.append((config, "kernel rows on captured inputs at "
                            f"B={','.join(map(str, lacking_c))}",
                            captured_kernel_command(base, shape, ctx, lacking_c,
                                                    list(captured.values()))))
        has = [t for t in tasks if score and t in score.per_task]
        points.append(Point(
            config,
            retention(score, dense, tasks) if score else None,
            {f: retention(score, dense, ts) for f, ts in families.items()} if score else {},
            score.read_fraction if score else math.nan,
            by_batch,
            partial=retention(score, dense, has) if score and len(has) < len(tasks) else None,
            captured=on_model,
        ))
    for batch in batches:
        _front([p for p in points if p.config != "dense"], batch)
    gaussian_runs = {t.run_id for p in points for t in p.timings.values()}
    captured_runs = {t.run_id for p in points for t in p.captured.values()}
    kernel_runs = sorted(gaussian_runs | captured_runs)
    used = set(accuracy_runs) | set(kernel_runs)
    labels = sorted({t.inputs for p in points for t in p.captured.values()})
    return Verdict(model, shape, ctx, tuple(batches), gpu or NO_KERNEL_ROWS, dense, tasks,
                   families,
                   points, missing, accuracy_runs, kernel_runs,
                   [run_env[r] for r in sorted(used) if r in run_env],
                   {b: best_dense_latency(frame, shape, ctx, b, runs=gaussian_runs)
                    for b in batches},
                   labels,
                   {b: best_dense_latency(frame, shape, ctx, b, captured_prefix(model),
                                          runs=captured_runs)
                    for b in batches} if labels else {},
                   set_aside, accuracy_gpus, min_dense=min_dense)
