"""docs/adding-a-task.md: its example task, loaded with --plugin and run through
`santa-bench accuracy task` on a tiny random model (no download), as the page says."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import tiny_llama
from santa_bench import plugins
from santa_bench.accuracy.registry import TASKS, Task, TaskError, TaskRegistry, register_task
from santa_bench.results import ResultStore

DOC = Path(__file__).resolve().parent.parent / "docs" / "adding-a-task.md"

pytest.importorskip("transformers")


def _module_source() -> str:
    found = re.search(r"<!-- example-task: .*?-->\n```python\n(.*?)```", DOC.read_text(), re.S)
    assert found, "the doc's example module is missing"
    return found.group(1)


class _Tokenizer:
    """Characters as ids (a tiny model needs no real tokenizer)."""

    eos_token_id = 96

    def __call__(self, text):
        return type("T", (), {"input_ids": [ord(c) % 90 for c in text]})

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(48 + int(i) % 10) for i in ids)


@pytest.fixture
def doc_plugin(tmp_path, monkeypatch):
    """The doc's module as ``my_tasks`` on the path; the registry and the plugin state are
    restored afterwards."""
    (tmp_path / "my_tasks.py").write_text(_module_source())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(TASKS, "_tasks", dict(TASKS._tasks))
    monkeypatch.setattr(plugins, "_loaded", {})
    monkeypatch.setenv(plugins.ENV, "")  # restored (unset) afterwards
    yield tmp_path
    sys.modules.pop("my_tasks", None)


def test_the_docs_task_runs_through_accuracy_task(doc_plugin, monkeypatch):
    from santa_bench.accuracy import models
    from santa_bench.cli import app

    model = tiny_llama()
    monkeypatch.setattr(models, "load_model", lambda name, **kw: (model, _Tokenizer()))
    store = doc_plugin / "results"
    runner = CliRunner()
    listed = runner.invoke(app, ["--plugin", "my_tasks", "list"])
    assert listed.exit_code == 0, listed.output
    assert "count-up" in listed.output and TASKS.get("count-up").module == "my_tasks"
    result = runner.invoke(app, ["--plugin", "my_tasks", "accuracy", "task", "count-up",
                                 "--model", "tiny", "--methods", "dense,santa-prop:S=8",
                                 "--n", "3", "--device", "cpu", "--results", str(store)])
    assert result.exit_code == 0, result.output
    frame = ResultStore(store).load()
    assert set(frame["task"]) == {"count-up"} and set(frame["method"]) == {"dense", "santa-prop"}
    assert set(frame["status"]) == {"ok"} and "ctx" not in frame.columns
    scores = frame[frame.metric == "score"].set_index("method")["value"]
    assert ((scores >= 0) & (scores <= 1)).all()
    assert "retention" in set(frame[frame.method == "santa-prop"].metric)
    command = frame[frame.method == "santa-prop"]["command"].iloc[0]
    assert command.startswith("santa-bench --plugin my_tasks accuracy task count-up --model")


def test_the_docs_task_through_the_public_api(doc_plugin):
    import importlib

    module = importlib.import_module("my_tasks")
    registry = TaskRegistry()
    register_task(registry=registry)(module.count_up)
    task = registry.get("count-up")
    case = {"n": 4, "seed": 3}
    items = task.samples(case, lambda: None)
    assert items == task.samples(case, lambda: None) and len(items) == 4
    text, answer = items[0]
    assert int(answer) == int(text.split()[-1]) + 1
    generation = type("G", (), {"tokens": [[ord(c) - 48 for c in a] for _, a in items]})
    scores, texts = task.score(_Tokenizer(), items, generation)
    assert scores == [True] * 4 and texts[0].split()[0] == items[0][1]
    assert task.command_args({}) == ["accuracy", "task", "count-up"]
    with pytest.raises(TaskError, match="registered twice"):
        register_task(registry=registry)(module.count_up)


def test_register_task_refuses_what_is_not_a_task():
    with pytest.raises(TaskError, match="not a Task"):
        register_task(registry=TaskRegistry())(lambda: "mmlu")
    assert isinstance(TASKS.get("ruler-qa1"), Task) and TASKS.get("ruler-qa1").name == "ruler-qa_1"
    assert TASKS.expand("helmet-rag") == [f"helmet-rag-{d}"
                                          for d in ("nq", "triviaqa", "hotpotqa", "popqa")]


def test_the_docs_task_through_transformers_own_loop(doc_plugin, monkeypatch):
    """A model family the suite's decoder does not run goes through transformers' loop:
    a task without its own ``hf_scores`` is scored from its prompts there too."""
    from santa_bench import environment, execute, results
    from santa_bench.accuracy import models
    from santa_bench.methods import REGISTRY
    from santa_bench.runners.tasks import TaskRunner, expand_task_cases

    plugins.load(["my_tasks"])
    model = tiny_llama()
    monkeypatch.setattr(models, "load_model", lambda name, **kw: (model, _Tokenizer()))
    monkeypatch.setattr(TaskRunner, "engine", lambda self, *args: None)
    cases = expand_task_cases("count-up", "tiny", [(REGISTRY.get("santa-sys"), {"S": 8})],
                              n=2, seed=0, device="cpu")
    outcome = execute.run_cases(cases, results.ResultStore(doc_plugin / "res"),
                                environment.collect_environment("test"))
    by_method = {case["method"]: {r["metric"]: r for r in rows} for case, rows in outcome.results}
    assert set(by_method) == {"dense", "santa-sys"}
    for rows in by_method.values():
        assert rows["score"].get("status", "ok") == "ok" and 0 <= rows["score"]["value"] <= 1
    assert by_method["santa-sys"]["decode_kv_read_fraction"]["value"] < 1


def test_a_registered_task_joins_the_verdict(monkeypatch):
    from santa_bench import pareto

    monkeypatch.setattr(TASKS, "_tasks", dict(TASKS._tasks))
    TASKS.register(Task("toy-recall", "a toy", lambda c, t: [], lambda t, i, m: [],
                        lambda t, i, g: ([], []), long_context=True, family="Toy",
                        verdict=True, module="my_tasks"))
    assert pareto.task_family("toy-recall") == "Toy" and pareto.verdict_task("toy-recall")
    assert pareto.task_family("ruler-qa1") == "RULER QA" and pareto.verdict_task("ruler-vt")
    assert not pareto.verdict_task("gsm8k") and pareto.task_family("gsm8k") == "GSM8K"
    command = pareto.accuracy_command("santa-prop:S=64", "m", 32768, ["ruler-vt", "toy-recall"],
                                      5)
    ruler, toy = command.split("; ")
    assert ruler.startswith("santa-bench accuracy ruler --tasks vt --ctx 32k --n 5")
    assert toy.startswith("santa-bench --plugin my_tasks accuracy task toy-recall --ctx 32k")
