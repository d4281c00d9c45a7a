"""The time an accuracy run will take, from the prefill and decode throughput stored by
earlier runs of the same model on the same device (rows ``prefill_tokens_per_s`` and
``decode_tokens_per_s``), and the same run's time on Llama-3.1-8B for planning.

A run costs one prefill per prompt (its cases that share their prompts run as one group)
plus each case's decode: prompt tokens / prefill rate + generated tokens / decode rate.
A prompt's length is the stored mean of the same task at the same context, else the
context length; a case's generated tokens the stored mean of the same task, else its
generation budget (the case's ``max_new_tokens``, else its task's ``budget``). The decode
rate is the method's stored median, else the model's.
Llama-3.1-8B's time is the measured model's scaled by parameter count (time taken as
proportional to the weights read and multiplied; attention's share ignored).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

LLAMA_8B_PARAMS_M = 8030  # Llama-3.1-8B's parameters, millions


def format_duration(seconds: float) -> str:
    """``40 s``, ``12 min``, ``3.4 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _rows(frame: pd.DataFrame, model: str, device: str) -> pd.DataFrame:
    needed = {"metric", "value", "model", "device"}
    if frame.empty or not needed <= set(frame.columns):
        return frame.iloc[0:0]
    mine = frame[(frame.model == model) & (frame.device == device)]
    if "status" in mine.columns:
        mine = mine[mine.status.isna() | (mine.status == "ok")]
    return mine


def _median(rows: pd.DataFrame, metric: str) -> float:
    values = pd.to_numeric(rows[rows.metric == metric].value, errors="coerce").dropna()
    values = values[values > 0]
    return float(values.median()) if len(values) else math.nan


def _same(rows: pd.DataFrame, case: dict[str, Any], keys: tuple[str, ...]) -> pd.DataFrame:
    for key in keys:
        if key not in rows.columns:
            return rows.iloc[0:0]
        value = case.get(key)
        if value is None:
            rows = rows[rows[key].isna()]
        else:
            rows = rows[rows[key].astype(str) == str(value)]
    return rows


def _per(rows: pd.DataFrame, metric: str, per: str) -> float:
    """The stored mean of ``metric`` / ``per`` over the cases of ``rows``."""
    total = pd.to_numeric(rows[rows.metric == metric].value, errors="coerce").sum()
    count = pd.to_numeric(rows[rows.metric == per].value, errors="coerce").sum()
    return float(total / count) if count > 0 else math.nan


def _per_sample(rows: pd.DataFrame, metric: str) -> float:
    """The stored mean of ``metric`` per sample (cases' ``metric`` / their ``n``)."""
    found = rows[rows.metric == metric]
    if found.empty or "n" not in found.columns:
        return math.nan
    count = pd.to_numeric(found.n, errors="coerce").sum()
    total = pd.to_numeric(found.value, errors="coerce").sum()
    return float(total / count) if count > 0 else math.nan


def _budget(case: dict[str, Any]) -> int:
    """New tokens a sample of ``case`` may generate: its ``max_new_tokens``, else its
    task's budget (RULER's per task), else 1."""
    from santa_bench.accuracy.registry import TASKS

    budget = int(case.get("max_new_tokens") or 0)
    if not budget:
        try:
            budget = TASKS.get(str(case["task"])).budget
        except (KeyError, ValueError):
            budget = 0
    return max(1, budget)


def run_seconds(cases: list[dict[str, Any]], rows: pd.DataFrame) -> float:
    """The seconds ``cases`` (of one model and device) take at the rates of ``rows``
    (that model's stored rows on that device); NaN without both rates."""
    from santa_bench.runners.tasks import group_key

    prefill_rate = _median(rows, "prefill_tokens_per_s")
    model_decode = _median(rows, "decode_tokens_per_s")
    if math.isnan(prefill_rate) or math.isnan(model_decode):
        return math.nan
    seconds = 0.0
    for case in {group_key(c): c for c in cases}.values():  # one prefill a group
        prompt = _per(_same(rows, case, ("task", "ctx")), "prefill_tokens", "prefills")
        if math.isnan(prompt):
            prompt = float(case.get("ctx") or 0)
        seconds += int(case["n"]) * prompt / prefill_rate
    for case in cases:
        made = int(case["n"]) * _per_sample(_same(rows, case, ("task", "ctx")),
                                            "generated_tokens")
        if math.isnan(made):
            made = int(case["n"]) * _budget(case)
        rate = _median(_same(rows, case, ("method",)), "decode_tokens_per_s")
        seconds += made / (model_decode if math.isnan(rate) else rate)
    return seconds


def estimate_lines(cases: list[dict[str, Any]], frame: pd.DataFrame) -> list[str]:
    """One line per model of the accuracy ``cases`` still to run: their estimated time
    from the stored throughput (else: unknown) and Llama-3.1-8B's."""
    from santa_bench.accuracy.models import CATALOG

    cases = [c for c in cases if c.get("kind") == "accuracy"]
    lines = []
    for model, device in dict.fromkeys((str(c["model"]), str(c.get("device"))) for c in cases):
        mine = [c for c in cases if (str(c["model"]), str(c.get("device"))) == (model, device)]
        seconds = run_seconds(mine, _rows(frame, model, device))
        if math.isnan(seconds):
            lines.append(f"estimated time: unknown (no stored prefill/decode throughput of "
                         f"{model} on {device}; this run measures them)")
            continue
        line = (f"estimated time: {format_duration(seconds)} (from the stored prefill/decode "
                f"throughput of {model} on {device})")
        params = CATALOG[model].params_m if model in CATALOG else 0
        if params:
            scaled = seconds * LLAMA_8B_PARAMS_M / params
            ratio = LLAMA_8B_PARAMS_M / params
            line += (f"; Llama-3.1-8B about {format_duration(scaled)} (x{ratio:.1f} "
                     "parameters, time taken as proportional to them)")
        lines.append(line)
    return lines
