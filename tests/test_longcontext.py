"""LongBench v2 and HELMET-RAG: loaders, prompts fitted to ctx, scoring, runner (no network)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from santa_bench.accuracy import longcontext as lc
from santa_bench.accuracy.datasets import DataUnavailable
from santa_bench.methods import REGISTRY


class CharTok:
    """One token per character (ids < 128), reversible: enough to measure and cut prompts."""

    eos_token_id = 0

    def encode(self, text, add_special_tokens=True):
        return [1 + ord(c) % 127 for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(int(i) - 1) for i in ids if int(i) > 0)

    def __call__(self, text, return_tensors="pt"):
        return type("Enc", (), {"input_ids": torch.tensor([self.encode(text)])})


class ChatTok(CharTok):
    chat_template = "x"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return f"<user>{messages[0]['content']}</user><bot>"


TOK = CharTok()


def _longbench_rows(count: int = 3) -> list[dict]:
    return [
        {
            "_id": f"id{i}", "domain": "Single-Document QA", "sub_domain": "Academic",
            "difficulty": "easy", "length": "short", "question": f" Which is right {i}? ",
            "choice_A": "alpha", "choice_B": "beta", "choice_C": "gamma", "choice_D": "delta",
            "answer": "ABCD"[i % 4], "context": f"BEGIN {i} " + "lorem ipsum " * 200 + " END",
        }
        for i in range(count)
    ]  # fmt: skip


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_longbench_template_is_the_official_0shot_prompt():
    # THUDM/LongBench prompts/0shot.txt
    official = (
        "Please read the following text and answer the question below.\n\n<text>\n$DOC$\n"
        "</text>\n\nWhat is the correct answer to this question: $Q$\nChoices:\n(A) $C_A$\n"
        "(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\nFormat your response as follows: \"The correct "
        'answer is (insert answer here)".'
    )
    assert official == lc.LONGBENCH_TEMPLATE
    item = lc.LongBenchItem("x", "", "", "", "", " Q? ", ("a ", "b", "c", "d"), "B", " doc ")
    prompt = lc.longbench_prompt(item)
    assert "<text>\ndoc\n</text>" in prompt and "question: Q?\nChoices:\n(A) a\n(B) b" in prompt


@pytest.mark.parametrize(
    ("response", "letter"),
    [
        ("The correct answer is (B).", "B"),
        ("**The correct answer is (C)**", "C"),
        ("The correct answer is D", "D"),
        ("I think (A)", None),
        ("The correct answer is (E)", None),
    ],
)
def test_longbench_answer_extraction_follows_the_official_script(response, letter):
    assert lc.extract_answer(response) == letter
    assert lc.longbench_correct(response, "B") is (letter == "B")


def test_longbench_loads_the_data_dir_and_local_files(tmp_path, offline):
    folder = tmp_path / "longbench-v2"
    folder.mkdir()
    (folder / "data.json").write_text(json.dumps(_longbench_rows()))
    items = lc.load_longbench_v2(tmp_path)
    assert [i.id for i in items] == ["id0", "id1", "id2"] and items[1].answer == "B"
    assert items[0].choices == ("alpha", "beta", "gamma", "delta")
    frame = pd.DataFrame(_longbench_rows(2))
    frame.to_parquet(tmp_path / "lb.parquet")
    frame.to_csv(tmp_path / "lb.csv", index=False)
    frame.to_json(tmp_path / "lb.jsonl", orient="records", lines=True)
    for name in ("lb.parquet", "lb.csv", "lb.jsonl"):
        assert [i.answer for i in lc.load_longbench_v2(file=tmp_path / name)] == ["A", "B"]
    frame.drop(columns="context").to_json(tmp_path / "bad.jsonl", orient="records", lines=True)
    with pytest.raises(ValueError, match="context"):
        lc.load_longbench_v2(file=tmp_path / "bad.jsonl")


def test_missing_data_says_where_to_put_it(tmp_path, offline, monkeypatch):
    with pytest.raises(DataUnavailable, match=r"longbench-v2/data\.json.*THUDM/LongBench-v2"):
        lc.load_longbench_v2(tmp_path)
    monkeypatch.setenv("SANTA_BENCH_DATA", str(tmp_path / "env"))
    with pytest.raises(DataUnavailable, match=r"env/helmet/kilt/nq-dev-multikilt_1000_k220"):
        lc.load_helmet_rag("nq", 32768)
    with pytest.raises(DataUnavailable, match="not found"):
        lc.load_longbench_v2(file=tmp_path / "nope.jsonl")


@pytest.mark.parametrize("tokenizer", [CharTok(), ChatTok()])
def test_longbench_prompts_are_truncated_in_the_middle_to_ctx(tokenizer):
    items = [
        lc.LongBenchItem(
            r["_id"], r["domain"], r["sub_domain"], r["difficulty"], r["length"], r["question"],
            (r["choice_A"], r["choice_B"], r["choice_C"], r["choice_D"]), r["answer"],
            r["context"],
        )
        for r in _longbench_rows(2)
    ]
    ctx = 900
    samples = lc.longbench_samples(items, tokenizer, ctx)
    for sample, item in zip(samples, items, strict=True):
        text = tokenizer.decode(sample.input_ids)
        assert len(sample.input_ids) <= ctx - 128 and sample.max_new_tokens == 128
        assert len(sample.input_ids) >= ctx - 128 - 2  # filled, not over-cut
        assert "Please read the following text" in text and "BEGIN" in text
        assert text.endswith('"The correct answer is (insert answer here)".' + (
            "</user><bot>" if isinstance(tokenizer, ChatTok) else ""))
        assert "END" in text and text.count("lorem") < 200  # the middle was cut
        assert sample.references == (item.answer,)
    whole = lc.longbench_samples(items[:1], CharTok(), 100_000)[0]
    assert CharTok().decode(whole.input_ids) == lc.longbench_prompt(items[0])
    with pytest.raises(ValueError, match="too small"):
        lc.longbench_samples(items, CharTok(), 150)


def _ctxs(tag: str, count: int) -> list[dict]:
    return [{"title": f"{tag} title {j}", "text": f"{tag} passage {j} " + "words " * 20,
             "has_answer": j == 0} for j in range(count)]  # fmt: skip


def _write_helmet(root, dataset: str = "nq", k: int = 50) -> None:
    test_name, demo_name, _ = lc.HELMET_DATASETS[dataset]
    folder = root / "helmet" / "kilt"
    folder.mkdir(parents=True, exist_ok=True)
    tests = [{"id": f"q{i}", "question": f"who is person {i}?", "answers": [f"Person {i}", "P"],
              "ctxs": _ctxs(f"t{i}", 6), "s_pop": 10 ** (2 + i % 2 * 2)} for i in range(4)]
    demos = [{"id": f"d{i}", "question": f"demo question {i}?", "answers": [f"demo answer {i}"],
              "ctxs": _ctxs(f"d{i}", 3), "s_pop": 50} for i in range(5)]  # fmt: skip
    with open(folder / test_name.format(k=k), "w") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in tests)
    with open(folder / demo_name, "w") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in demos)


def test_helmet_k_follows_the_configs():
    assert [lc.helmet_k(c) for c in (4096, 8192, 8193, 32768, 131072, 10**6)] == [
        50, 50, 105, 220, 1000, 1000]


def test_helmet_rag_prompts_demos_and_truncation(tmp_path, offline):
    _write_helmet(tmp_path, "nq", 50)
    items, demos = lc.load_helmet_rag("nq", 8192, tmp_path)
    assert len(items) == 4 and len(demos) == 5 and items[0].answers == ("Person 0", "P")
    whole = lc.helmet_samples("nq", items[:1], demos, TOK, 100_000)[0]
    text = TOK.decode(whole.input_ids)
    assert text.startswith("Use the given documents to write a concise and short answer")
    assert "Answer: [answer]\n\nDocument (Title: d" in text  # two demonstrations first
    assert text.count("\nAnswer: demo answer") == 2
    assert "Document (Title: t0 title 0): t0 passage 0" in text
    assert text.endswith("\n\nQuestion: who is person 0?\nAnswer:")
    assert whole.max_new_tokens == 20 and whole.stop_newline
    again = lc.helmet_samples("nq", items[:1], demos, TOK, 100_000)[0]
    assert again == whole  # the demonstrations depend on the question only
    short = lc.helmet_samples("nq", items[:1], demos, TOK, len(whole.input_ids) - 180)[0]
    cut = TOK.decode(short.input_ids)
    assert len(short.input_ids) <= len(whole.input_ids) - 200
    assert cut.endswith("\n\nQuestion: who is person 0?\nAnswer:")
    assert "t0 passage 0" in cut and "t0 passage 5" not in cut  # the end of the passages goes
    popqa_dir = tmp_path / "p"
    _write_helmet(popqa_dir, "popqa", 220)
    items, demos = lc.load_helmet_rag("popqa", 32768, popqa_dir)
    assert [i.key for i in items] == ["q0", "q2"]  # log10(s_pop) < 3 only


@pytest.mark.parametrize(
    ("output", "answers", "score"),
    [
        ("The Eiffel Tower", ["eiffel tower"], 1.0),
        (" Answer: Paris, France\nmore", ["Paris"], 1.0),
        ("London", ["Paris", "london"], 1.0),
        ("Par", ["Paris"], 0.0),
        ("", ["x"], 0.0),
    ],
)
def test_sub_em_is_helmets(output, answers, score):
    assert lc.sub_em(output, answers) == score


def _tiny_runner():
    transformers = pytest.importorskip("transformers")
    from santa_bench.accuracy.tasks import PrefillCache
    from santa_bench.runners.tasks import TaskRunner

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=130, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=4096)
    runner = TaskRunner()
    runner._model_name = "tiny"
    runner._model = (transformers.LlamaForCausalLM(config).eval(), CharTok())
    runner.prefills = PrefillCache()
    return runner


def test_runner_scores_both_tasks_and_reuses_the_dense_prefill(tmp_path, offline):
    from santa_bench.runners.tasks import expand_task_cases

    (tmp_path / "longbench-v2").mkdir()
    (tmp_path / "longbench-v2" / "data.json").write_text(json.dumps(_longbench_rows(3)))
    _write_helmet(tmp_path, "nq", 50)
    runner = _tiny_runner()
    methods = [(REGISTRY.get("dense"), {}), (REGISTRY.get("santa-sys"), {"S": 8})]
    for task in ("longbench-v2", "helmet-rag-nq"):
        cases = expand_task_cases(task, "tiny", methods, n=2, seed=0, ctx=2048,
                                  data_dir=str(tmp_path))
        _, sampled = (runner.run(c) for c in cases)
        score = {r["metric"]: r for r in sampled}
        assert 0 <= score["score"]["value"] <= 1 and len(json.loads(score["score"]["per_sample"]))
        assert "retention" in score and 0 < score["decode_kv_read_fraction"]["value"] <= 1
    assert runner.prefills.misses == 4 and runner.prefills.hits == 4


def test_commands_cases_and_the_santapp_suite(tmp_path, offline):
    from pathlib import Path

    from typer.testing import CliRunner

    from santa_bench.cli import app
    from santa_bench.runners.tasks import case_command, expand_task_cases, task_case
    from santa_bench.sweep import load_suite

    dense = REGISTRY.get("dense")
    with pytest.raises(ValueError, match="ctx"):
        task_case("longbench-v2", "m", dense, {}, n=1, seed=0)
    with pytest.raises(ValueError, match="HELMET-RAG dataset"):
        task_case("helmet-rag-squad", "m", dense, {}, n=1, seed=0, ctx=8)
    cases = expand_task_cases("helmet-rag", "m", [(dense, {})], n=1, seed=0, ctx=8192)
    assert [c["task"] for c in cases] == [f"helmet-rag-{d}" for d in
                                          ("nq", "triviaqa", "hotpotqa", "popqa")]
    assert case_command(cases[1]).startswith(
        "santa-bench accuracy helmet-rag --datasets triviaqa --ctx 8192 --model m")
    lb = task_case("longbench-v2", "m", dense, {}, n=3, seed=0, ctx=4096, data_file="x.jsonl")
    assert case_command(lb).startswith("santa-bench accuracy longbench-v2 --ctx 4096 --model m")
    assert case_command(lb).endswith("--file x.jsonl") and "_data_file" in lb

    suite = load_suite(Path(__file__).resolve().parents[1] / "suites" / "santapp-32k.yaml")
    tasks = {c["task"] for c in suite.cases}
    assert {"longbench-v2", "helmet-rag-popqa", "ruler-niah_multiquery"} <= tasks

    result = CliRunner().invoke(
        app, ["accuracy", "longbench-v2", "--ctx", "2k", "--n", "1", "--data-dir",
              str(tmp_path), "--results", str(tmp_path / "res"),
              "--model", str(tmp_path / "local-model")],  # not a GGUF: gguf not needed
        catch_exceptions=False)
    assert result.exit_code == 1, result.output  # every case failed: no data
    flat = " ".join(result.output.split())
    assert "failed" in flat and "data.json" in flat
    bad = CliRunner().invoke(app, ["accuracy", "helmet-rag", "--datasets", "squad"],
                             catch_exceptions=False)
    assert bad.exit_code == 2 and "unknown ['squad']" in bad.output
