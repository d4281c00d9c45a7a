"""An accuracy run prefills each batch of prompts once for every method of the run."""

from __future__ import annotations

import io
import json
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

import pytest
import torch
from rich.console import Console

from conftest import ModTok, tiny_llama
from santa_bench.accuracy.engine import Decoding, Engine, Prompt
from santa_bench.methods import REGISTRY

pytest.importorskip("transformers")

SPECS = (("dense", {}), ("santa-sys", {"S": 8}), ("santa-prop", {"S": 8}))


def test_a_group_decodes_as_each_method_alone_from_one_prefill_per_prompt():
    gen = torch.Generator().manual_seed(1)
    prompts = [Prompt(tuple(torch.randint(0, 90, (n,), generator=gen).tolist()), 6)
               for n in (40, 57, 33, 64, 48)]
    runs = [Decoding(REGISTRY.get(name), REGISTRY.get(name).resolve_params(params), seed=3,
                     backend="sdpa" if name == "dense" else "reference")
            for name, params in SPECS]
    model = tiny_llama()
    alone = Engine(model, batch=2, prefill_bytes=0)  # keeps no prefill between methods
    single = [alone.generate(r.method, r.params, prompts, seed=3, backend=r.backend,
                             keep_logits=True) for r in runs]
    assert alone.prefills.misses == 3 * len(prompts)
    grouped = Engine(model, batch=2, prefill_bytes=0)
    together = grouped.generate_many(runs, prompts, keep_logits=True)
    assert grouped.prefills.misses == len(prompts)  # one prefill per prompt, 3 methods
    for one, many in zip(single, together, strict=True):
        assert many.tokens == one.tokens
        assert many.kv_read_fraction == one.kv_read_fraction
        assert torch.equal(many.first_logits, one.first_logits)
        assert many.prefills == len(prompts)
        assert many.prefill_tokens == sum(len(p.ids) - 1 for p in prompts)


def test_a_method_that_fails_leaves_the_others_of_its_group(monkeypatch):
    from santa_bench.methods import Method

    original = Method.run_reference

    def broken(self, *args, **kwargs):
        if self.name == "santa-sys":
            raise RuntimeError("boom")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Method, "run_reference", broken)
    prompts = [Prompt(tuple(range(1, 30)), 3), Prompt(tuple(range(5, 40)), 3)]
    runs = [Decoding(REGISTRY.get(name), REGISTRY.get(name).resolve_params(params),
                     backend="sdpa" if name == "dense" else "reference")
            for name, params in SPECS]
    dense, sys, prop = Engine(tiny_llama(), batch=1).generate_many(runs, prompts)
    assert isinstance(sys, RuntimeError) and "boom" in str(sys)
    assert len(dense.tokens) == len(prop.tokens) == 2 and prop.decode_steps > 0


def _cases(tmp_path, methods=SPECS):
    from santa_bench.runners.tasks import expand_task_cases

    (tmp_path / "gsm8k").mkdir(exist_ok=True)
    (tmp_path / "gsm8k" / "test.jsonl").write_text(
        '{"question": "1+1?", "answer": "so #### 2"}\n{"question": "2+2?", "answer": "#### 4"}\n'
        '{"question": "3+3 is?", "answer": "#### 6"}\n')
    return expand_task_cases("gsm8k", "tiny", [(REGISTRY.get(n), p) for n, p in methods],
                             n=3, seed=0, max_new_tokens=4, data_dir=str(tmp_path),
                             device="cpu", batch=2)


def test_a_grouped_run_stores_each_case_as_alone_with_its_hash(tmp_path, monkeypatch):
    from santa_bench import environment, execute, results
    from santa_bench.accuracy import models

    model = tiny_llama()
    monkeypatch.setattr(models, "load_model", lambda name, **kw: (model, ModTok()))
    cases = _cases(tmp_path)
    hashes = [results.config_hash(c) for c in cases]
    assert hashes == [  # as before the grouped run
        "e7158c5f16e61e09", "42c54da3ec31949e", "6c48e9a4d2e3909e"]
    env = environment.collect_environment("test")
    store = results.ResultStore(tmp_path / "res")
    out = io.StringIO()
    outcome = execute.run_cases(cases, store, env, console=Console(file=out, width=200))
    assert "estimated time: unknown (no stored prefill/decode throughput of tiny" in (
        out.getvalue())
    assert not outcome.failed and len(outcome.results) == 3
    assert {p.stem for p in store.root.glob("*/part-*.parquet")} == {
        f"part-{h}" for h in hashes}
    grouped = {c["method"]: {r["metric"]: r for r in rows} for c, rows in outcome.results}
    for rows in grouped.values():
        assert rows["prefills"]["value"] == 3  # the group's: one per prompt
        assert rows["prefill_tokens_per_s"]["value"] > 0
        assert rows["decode_tokens_per_s"]["value"] > 0
        assert rows["prefill_s"]["value"] == grouped["dense"]["prefill_s"]["value"]
    for case in cases:  # each method alone, in a store of its own
        alone = execute.run_cases([case], results.ResultStore(tmp_path / case["method"]), env)
        rows = {r["metric"]: r for r in alone.results[0][1]}
        assert rows["score"]["per_sample"] == grouped[case["method"]]["score"]["per_sample"]
        assert rows["generated_tokens"] == grouped[case["method"]]["generated_tokens"]
        assert json.loads(rows["score"]["per_sample"])
    again = execute.run_cases(cases, store, env)  # finished cases are skipped
    assert again.skipped == 3 and not again.results
    out = io.StringIO()  # other prompts of the same model: the stored rates give the time
    other = [{**case, "seed": 1} for case in cases]
    execute.run_cases(other, store, env, console=Console(file=out, width=200))
    assert "estimated time: " in out.getvalue() and " s (from the stored" in out.getvalue()


def test_the_estimate_from_stored_rates_and_for_llama_8b():
    import pandas as pd

    from santa_bench.accuracy.estimate import estimate_lines

    base = {"kind": "accuracy", "model": "qwen2.5-coder-0.5b", "device": "cuda",
            "task": "ruler-vt", "ctx": 32768, "n": 100, "seed": 0, "max_new_tokens": 128}
    cases = [{**base, "method": m} for m in ("dense", "santa-prop", "quest")]
    stored = {**base, "n": 50, "method": "dense"}
    frame = pd.DataFrame([
        {**stored, "metric": "prefill_tokens_per_s", "value": 32768.0},
        {**stored, "metric": "decode_tokens_per_s", "value": 100.0},
        {**stored, "metric": "generated_tokens", "value": 500.0},  # 10 a sample
        {**stored, "method": "santa-prop", "metric": "decode_tokens_per_s", "value": 200.0}])
    # prefill: 100 prompts x 1 s, once; decode: 1000 tokens each at 100, 200 and 150 (the
    # model's median): 121.7 s; x 8030 / 494 parameters for Llama-3.1-8B
    (line,) = estimate_lines(cases, frame)
    assert line.startswith("estimated time: 2 min (from the stored prefill/decode throughput"
                           " of qwen2.5-coder-0.5b on cuda); Llama-3.1-8B about 33 min (x16.3 ")
    (unknown,) = estimate_lines([{**c, "device": "cpu"} for c in cases], frame)
    assert unknown.startswith("estimated time: unknown")


def test_a_device_pool_gets_the_cases_of_a_prompt_group_as_one_unit(tmp_path):
    from santa_bench.execute import accuracy_groups, work_units

    cases = _cases(tmp_path)
    other = [{**case, "task": "mmlu", "max_new_tokens": 0} for case in cases]
    mixed = [cases[0], other[0], cases[1], other[1], cases[2]]
    assert work_units(mixed) == [[0, 2, 4], [1, 3]]
    assert [[c["task"] for c in g] for g in accuracy_groups(mixed)] == [
        ["gsm8k"] * 3, ["mmlu"] * 2]


def test_every_task_states_its_protocol_and_rows_carry_it():
    from santa_bench.accuracy.registry import TASKS
    from santa_bench.runners.tasks import protocol_columns

    for task in TASKS:  # the built-in ones (a test may have registered a toy task)
        if task.module.startswith("santa_bench."):
            assert "prefilled densely" in task.protocol, task.name
            assert "chat template" in task.protocol, task.name
    ruler = protocol_columns({"task": "ruler-niah_single_1", "dense_layers": "21,22,23"})
    assert "128 tokens" in ruler["protocol"] and "string_match_all" in ruler["protocol"]
    assert ruler["sampled_layers"] == "all but 21,22,23 (dense)"
    assert protocol_columns({"task": "mmlu"})["sampled_layers"] == "all"


def test_a_group_keeps_no_prefill_in_the_store_but_a_single_call_does():
    prompts = [Prompt(tuple(range(1, n)), 3) for n in (20, 31)]
    dense = REGISTRY.get("dense")
    run = Decoding(dense, dense.resolve_params({}), seed=0, backend="sdpa")
    grouped = Engine(tiny_llama(), batch=2)
    grouped.generate_many([run, run], prompts)
    assert grouped.prefills.bytes == 0 and grouped.prefills.misses == len(prompts)
    single = Engine(tiny_llama(), batch=2)
    single.generate(dense, {}, prompts, backend="sdpa")
    assert single.prefills.bytes > 0 and single.prefills.misses == len(prompts)


def test_a_single_call_keeps_no_prefill_once_the_device_runs_short(monkeypatch):
    """Kept prefills beside a batch's static cache once filled an 80 GB GPU: none is kept
    while the device has less free than the engine's headroom."""
    prompts = [Prompt(tuple(range(1, n)), 3) for n in (20, 31)]
    dense = REGISTRY.get("dense")
    short = Engine(tiny_llama(), batch=2)
    short.headroom = 1 << 30
    monkeypatch.setattr(short, "free_device_bytes", lambda: (1 << 30) - 1)
    short.generate(dense, {}, prompts, backend="sdpa")
    assert short.prefills.bytes == 0 and short.prefills.misses == len(prompts)
    roomy = Engine(tiny_llama(), batch=2)
    roomy.headroom = 1 << 30
    monkeypatch.setattr(roomy, "free_device_bytes", lambda: 1 << 30)
    roomy.generate(dense, {}, prompts, backend="sdpa")
    assert roomy.prefills.bytes > 0


@pytest.mark.parametrize("held_out", ["ruler-niah_single_2", "ruler-niah_multivalue"])
def test_the_estimate_of_a_task_without_rows_is_near_its_measured_time(held_out):
    """Leave one task of the committed 1.5B run out: its 15 cases, estimated from the other
    tasks' rows (RULER cases set no max_new_tokens: the task's own budget bounds the
    decode), come within 35% of the wall time the run measured for them."""
    from pathlib import Path

    import pandas as pd

    from santa_bench.accuracy.estimate import run_seconds

    run = (Path(__file__).resolve().parents[1] / "results" / "h100"
           / "2026-12-07-h100-accuracy-ruler-qwen2.5-coder-1.5b")
    frame = pd.concat([pd.read_parquet(p) for p in sorted(run.glob("part-*.parquet"))])
    mine = frame[frame.task == held_out]
    cases = [{"kind": "accuracy", "model": r.model, "device": r.device, "task": r.task,
              "ctx": int(r.ctx), "n": int(r.n), "seed": 0, "method": r.method,
              "max_new_tokens": int(r.max_new_tokens)}
             for r in mine[mine.metric == "score"].itertuples()]
    assert len(cases) == 15 and all(c["max_new_tokens"] == 0 for c in cases)
    measured = float(mine[mine.metric == "wall_s"].value.iloc[0])  # the group's
    estimate = run_seconds(cases, frame[frame.task != held_out])
    assert abs(estimate / measured - 1) < 0.35, (estimate, measured)
