"""Reading a result folder together with the stores nested inside it.

``results/`` holds local runs (``results/<run_id>/``) and committed stores one folder
deeper (``results/h200/<run_id>/``, ``results/cpu/<run_id>/``). A
:class:`StoreSet` reads all of them as one store, for ``plot``, ``report`` and ``pareto``.

Each row's GPU is its run's (``gpu_name`` in run.json): :func:`row_gpus` names it, so
that speed rows of different GPUs are never compared.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from santa_bench.results import FIXED_COLUMNS, ResultStore, check_run_id

MAX_DEPTH = 3
"""How many folders below the root a nested store may lie."""

CPU = "CPU"
"""The GPU label of rows measured on a CPU."""
UNKNOWN_GPU = "unknown GPU"
"""The GPU label of GPU rows whose run records no GPU name (or has no run.json)."""


class StoreError(ValueError):
    """A result folder or a GPU that cannot be read as asked: a one-line message."""


def open_results(root: Path | str) -> StoreSet:
    """The :class:`StoreSet` at ``root`` (``--results``), which must be an existing folder:
    a missing one is a typo, not an empty store."""
    root = Path(root)
    if not root.is_dir():
        what = "not a folder" if root.exists() else "no such folder"
        raise StoreError(f"--results {root}: {what}")
    return StoreSet(root)


def run_gpu(record: dict[str, Any]) -> str:
    """The GPU a run ran on (its run.json ``record``): ``gpu_name``, :data:`CPU` for a
    CPU run, else :data:`UNKNOWN_GPU`."""
    if record.get("gpu_name"):
        return str(record["gpu_name"])
    return CPU if record.get("device") == "cpu" else UNKNOWN_GPU


def row_gpus(frame: pd.DataFrame, runs: list[dict[str, Any]]) -> pd.Series:
    """Each row's GPU (:func:`run_gpu` of its run; :data:`CPU` where the row's ``device``
    is ``cpu``), aligned with ``frame``."""
    by_run = {str(r.get("run_id")): run_gpu(r) for r in runs}
    if "run_id" not in frame:
        gpus = pd.Series(UNKNOWN_GPU, index=frame.index, dtype=object)
    else:
        gpus = frame["run_id"].map(lambda run: by_run.get(str(run), UNKNOWN_GPU)).astype(object)
    if "device" in frame:
        gpus = gpus.where(frame["device"] != "cpu", CPU)
    return gpus


def check_gpu(gpu: str, present: list[str] | set[str]) -> None:
    """StoreError unless ``gpu`` (``--gpu``) is one of the GPUs ``present`` (with rows)."""
    if gpu not in present:
        names = ", ".join(repr(g) for g in sorted(present)) or "none"
        raise StoreError(f"--gpu {gpu!r}: no rows of that GPU here; GPUs with rows: {names} "
                         "(--gpu NAME takes one of these names)")


def _is_run(folder: Path) -> bool:
    return (folder / "run.json").is_file() or any(folder.glob("part-*.parquet"))


def discover(root: Path | str, depth: int = MAX_DEPTH) -> list[Path]:
    """Returns the store roots at and below ``root``: ``root`` when it holds runs, and every
    folder below it (not a run itself) that holds runs, down to ``depth`` levels."""
    root = Path(root)
    if not root.is_dir():
        return []
    children = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    found = [root] if any(_is_run(child) for child in children) else []
    if depth > 0:
        for child in children:
            if not _is_run(child):
                found += discover(child, depth - 1)
    return found


class StoreSet:
    """The stores found at and below a root, read as one store (rows, runs, newest rows)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.stores = [ResultStore(path) for path in discover(self.root)] or [ResultStore(root)]

    def load(self, runs: list[str] | None = None) -> pd.DataFrame:
        """Every row of the given runs (default: all) of every store, columns unioned."""
        if runs is not None:
            for run in runs:
                check_run_id(run)
            held = {run for store in self.stores for run in runs if (store.root / run).is_dir()}
            if missing := [run for run in runs if run not in held]:
                raise ValueError(f"unknown runs under {self.root}: {missing}")
        frames = []
        for store in self.stores:
            mine = None if runs is None else [r for r in runs if (store.root / r).is_dir()]
            if mine == []:
                continue
            frame = store.load(mine)
            if not frame.empty:
                frames.append(frame)
        if not frames:
            return self.stores[0].load([]) if runs is not None else self.stores[0].load()
        if len(frames) == 1:
            return frames[0]
        data = pd.concat(frames, ignore_index=True, sort=False)
        params = [c for c in data.columns if c not in FIXED_COLUMNS]
        return data[params + list(FIXED_COLUMNS)]

    def runs(self) -> list[dict[str, Any]]:
        """The run.json records of every store."""
        return [record for store in self.stores for record in store.runs()]

    def unreadable_parts(self) -> list[Path]:
        """The part files of every store that could not be read (corrupt), once loaded."""
        return [path for store in self.stores for path in store.unreadable_parts()]

    def newest_per_case(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The rows of ``frame`` that belong, for their case, to the newest run holding it
        (by run.json date, then run id), as :meth:`ResultStore.newest_per_case`."""
        if frame.empty:
            return frame
        dates = {str(r.get("run_id")): str(r.get("date") or "") for r in self.runs()}
        when = frame["run_id"].map(lambda run: (dates.get(str(run), ""), str(run)))
        newest = when.groupby(frame["case_hash"]).transform("max")
        return frame[when == newest].reset_index(drop=True)
