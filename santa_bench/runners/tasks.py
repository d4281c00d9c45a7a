"""The task runner: accuracy of a real model on a task, decode steps through a method.

A case is (task, model, method and its parameters, n samples, seed). Rows: the task
``score`` with a Wilson 95% interval, the mean KV read fraction of the decode calls,
and, for a method other than dense, its ``retention`` (score / dense score on the same
samples in the same run) with a paired bootstrap interval. Per-sample correctness is
stored (``per_sample``, JSON) so retention survives a resumed run.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

from santa_bench.methods import REGISTRY, Registry

TASKS = ("mmlu", "gsm8k")
PLANNED_TASK_PREFIXES = ("ruler", "longbench", "helmet")  # accepted in suites, not run yet
PAIR_KEYS = ("task", "model", "n", "seed", "dense_layers", "max_new_tokens")


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Returns the Wilson score interval of a proportion."""
    if n == 0:
        return math.nan, math.nan
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


class TaskRunner:
    """Runs accuracy cases; keeps one model loaded and the dense results per sample set."""

    def __init__(self, registry: Registry = REGISTRY) -> None:
        self.registry = registry
        self._model_name: str | None = None
        self._model: Any = None
        self.dense: dict[tuple, list[bool]] = {}

    def model(self, name: str):
        if name != self._model_name:
            from santa_bench.accuracy.models import load_model

            self._model, self._model_name = load_model(name), name
        return self._model

    def samples(self, case: dict[str, Any]) -> list:
        from santa_bench.accuracy import datasets

        if case["task"] == "mmlu":
            items = datasets.load_mmlu_redux(case.get("_data_dir"))
        elif case["task"] == "gsm8k":
            items = datasets.load_gsm8k(case.get("_data_dir"))
        else:
            raise ValueError(f"task {case['task']!r} is not implemented yet ({', '.join(TASKS)})")
        random.Random(case["seed"]).shuffle(items)
        return items[: case["n"]]

    def recall(self, frame, fingerprint: str) -> None:
        """Loads stored dense per-sample results (for resumed runs)."""
        if frame.empty or "per_sample" not in frame.columns:
            return
        rows = frame[
            (frame.metric == "score")
            & (frame.method == "dense")
            & (frame.env_fingerprint == fingerprint)
            & frame.per_sample.notna()
        ]
        for record in rows.to_dict("records"):
            self.dense[tuple(record.get(k) for k in PAIR_KEYS)] = json.loads(record["per_sample"])

    def run(self, case: dict[str, Any]) -> list[dict[str, Any]]:
        from santa_bench.accuracy.tasks import gsm8k_loop, mmlu_loop, retention_ci

        method = self.registry.get(case["method"])
        params = {p.name: case[p.name] for p in method.params if p.name in case}
        spec = method.name + (
            ":" + ",".join(f"{k}={v}" for k, v in params.items()) if params else ""
        )
        model, tokenizer = self.model(case["model"])
        layers = tuple(int(x) for x in str(case.get("dense_layers") or "").split(",") if x)
        items = self.samples(case)
        from santa_bench.accuracy.integration import use_method

        info = use_method(model, spec, seed=case["seed"], dense_layers=layers)
        if case["task"] == "mmlu":
            correct = mmlu_loop(model, tokenizer, items)
        else:
            correct = gsm8k_loop(model, tokenizer, items, case["max_new_tokens"])
        n = len(correct)
        low, high = wilson(sum(correct), n)
        reads = info["kv_read_fraction"]
        rows = [
            {
                "metric": "score",
                "value": sum(correct) / n,
                "unit": "ratio",
                "ci_low": low,
                "ci_high": high,
                "per_sample": json.dumps([int(c) for c in correct]),
            },
            {
                "metric": "decode_kv_read_fraction",
                "value": sum(reads) / len(reads) if reads else 1.0,
                "unit": "ratio",
            },
        ]
        key = tuple(case.get(k) for k in PAIR_KEYS)
        if method.name == "dense":
            self.dense[key] = [bool(c) for c in correct]
        elif key in self.dense:
            ratio, low, high = retention_ci(correct, self.dense[key], seed=case["seed"])
            rows.append(
                {
                    "metric": "retention",
                    "value": ratio,
                    "unit": "ratio",
                    "ci_low": low,
                    "ci_high": high,
                }
            )
        else:
            rows.append(
                {
                    "metric": "retention",
                    "value": math.nan,
                    "unit": "ratio",
                    "status": "skipped",
                    "reason": "no dense run on the same samples",
                }
            )
        return rows


def task_case(
    task: str,
    model: str,
    method,
    overrides: dict[str, Any],
    *,
    n: int,
    seed: int,
    dense_layers: str = "",
    max_new_tokens: int = 256,
    ctx: int | None = None,
    data_dir: str | None = None,
) -> dict[str, Any]:
    """Returns the accuracy case of one method (the same dict for the CLI and suites)."""
    if task not in TASKS and not task.startswith(PLANNED_TASK_PREFIXES):
        raise ValueError(f"task: expected one of {TASKS}, got {task!r}")
    if n <= 0:
        raise ValueError(f"n: must be > 0, got {n}")
    case = {
        "kind": "accuracy",
        "task": task,
        "model": model,
        "method": method.name,
        "family": method.family,
        **method.resolve_params(overrides),
        "n": n,
        "seed": seed,
        "dense_layers": dense_layers,
        "device": "cpu",
        "max_new_tokens": max_new_tokens if task == "gsm8k" else 0,
    }
    if ctx is not None:
        case["ctx"] = ctx
    if data_dir:
        case["_data_dir"] = str(data_dir)  # where the data is: not part of the case
    return case


def expand_task_cases(
    task: str,
    model: str,
    methods: list,
    *,
    n: int,
    seed: int,
    dense_layers: str = "",
    max_new_tokens: int = 256,
    data_dir: str | None = None,
) -> list[dict[str, Any]]:
    """Returns one accuracy case per method; dense first, so retention can be computed."""
    ordered = sorted(methods, key=lambda m: m[0].name != "dense")
    if ordered[0][0].name != "dense":
        ordered.insert(0, (REGISTRY.get("dense"), {}))  # the same run always includes dense
    return [
        task_case(
            task,
            model,
            method,
            overrides,
            n=n,
            seed=seed,
            dense_layers=dense_layers,
            max_new_tokens=max_new_tokens,
            data_dir=data_dir,
        )
        for method, overrides in ordered
    ]


def case_command(case: dict[str, Any], registry: Registry = REGISTRY) -> str:
    """Returns the ``santa-bench accuracy <task>`` command line that runs exactly ``case``."""
    import shlex

    method = registry.get(case["method"])
    params = [f"{p.name}={case[p.name]}" for p in method.params if case.get(p.name) is not None]
    spec = method.name + (":" + ",".join(params) if params else "")
    args = [
        "santa-bench",
        "accuracy",
        case["task"],
        "--model",
        case["model"],
        "--methods",
        spec,
        "--n",
        str(case["n"]),
        "--seed",
        str(case["seed"]),
    ]
    if case.get("dense_layers"):
        args += ["--dense-layers", str(case["dense_layers"])]
    if case["task"] == "gsm8k":
        args += ["--max-new-tokens", str(case["max_new_tokens"])]
    if case.get("_data_dir"):
        args += ["--data-dir", case["_data_dir"]]
    return shlex.join(args)
