"""The seeds' accuracy tables (RULER, GSM8K) beside our task scores.

The anchor cells come from santa_bench/data/anchors.yaml (tables `ruler`, `gsm8k`); ours
are the mean scores of one model (:func:`table_model`) over the concrete tasks where
dense scores at least :data:`UNINFORMATIVE_DENSE`.
"""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

from santa_bench.anchors import Anchors, packaged_anchors
from santa_bench.plots.style import DENSE_FAMILIES
from santa_bench.plots.table_text import fmt

UNINFORMATIVE_DENSE = 0.2  # a task whose dense score is below this cannot show a cost


def _task_key(name: Any) -> str:
    """Return a task's table key: ``ruler-qa_1`` -> ``qa1``; every NIAH variant -> ``niah``."""
    key = re.sub(r"[^a-z0-9]", "", str(name).lower()).removeprefix("ruler")
    return "niah" if key.startswith("niah") else key


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
    text = fmt(value * 100 if unit in ("", "fraction", "ratio") and value <= 1 else value, ".2f")
    return f"{text} (uninf.)" if marked else text


def _model_scores(scores: pd.DataFrame) -> pd.DataFrame:
    """Return the score rows of :func:`table_model` (every row when none is named)."""
    model = table_model(scores)
    if model is None:
        return scores
    return scores[scores.model == model]


def ruler_tasks(anchors: Anchors | None = None) -> list[str]:
    """Return the RULER task columns of the seeds' table (FWE, NIAH, ...)."""
    return list((anchors or packaged_anchors())["ruler"].rows[0]["scores"])


def ruler_table(scores: pd.DataFrame, anchors: Anchors | None = None) -> pd.DataFrame:
    """Return the SANTA paper's RULER table beside our scores (anchor / ours)."""
    table = (anchors or packaged_anchors())["ruler"]
    if "ctx" in scores.columns:
        scores = scores[scores.ctx.isna() | (scores.ctx == table["ctx"])]
    scores = _model_scores(scores)
    records = []
    for anchor in table.rows:
        method, s = anchor.get("method"), anchor.get("S")
        record: dict[str, Any] = {"kernel": anchor["kernel"], "S": s if s is not None else "–"}
        for task, value in anchor["scores"].items():
            record[f"{task} anchor"] = f"{value:.2f}"
            record[f"{task} ours"] = _our_score(scores, task, method, s)
        records.append(record)
    return pd.DataFrame(records)


def gsm8k_methods(anchors: Anchors | None = None) -> list[str]:
    """Return the methods of the seeds' GSM8K table, in its column order."""
    row = (anchors or packaged_anchors())["gsm8k"].rows[0]
    return [key for key in row if key != "S"]


def gsm8k_table(scores: pd.DataFrame, anchors: Anchors | None = None) -> pd.DataFrame:
    """Return the SANTA paper's GSM8K table beside our scores; dense (SDPA) in the first
    row, under the first method's anchor column."""
    anchors = anchors or packaged_anchors()
    table, methods = anchors["gsm8k"], gsm8k_methods(anchors)
    scores = _model_scores(scores)
    dense = {f"{m} {w}": "–" for m in methods for w in ("anchor", "ours")}
    dense[f"{methods[0]} anchor"] = f"{table['dense']:.2f}"
    dense[f"{methods[0]} ours"] = _our_score(scores, "gsm8k", None, None)
    records: list[dict[str, Any]] = [{"S": "SDPA", **dense}]
    for anchor in table.rows:
        s = anchor["S"]
        record: dict[str, Any] = {"S": s}
        for method in methods:
            record[f"{method} anchor"] = f"{anchor[method]:.2f}"
            record[f"{method} ours"] = _our_score(scores, "gsm8k", method, s)
        records.append(record)
    return pd.DataFrame(records)


def scores_note(scores: pd.DataFrame, key: str, anchors: Anchors | None = None) -> str:
    """Return the note naming the model, device and sample counts of the "ours" cells of
    table `key` (ruler or gsm8k), the dense score of each concrete task and the
    uninformative tasks left out of the averages."""
    if scores.empty or "task" not in scores.columns:
        return ""
    if key == "ruler" and "ctx" in scores.columns:
        scores = scores[scores.ctx == (anchors or packaged_anchors())["ruler"]["ctx"]]
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
