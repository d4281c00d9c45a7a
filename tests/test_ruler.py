"""RULER: task configs, templates (verbatim upstream), generation lengths, scoring, runner names."""

from __future__ import annotations

import re

import pytest

from santa_bench.accuracy import ruler
from santa_bench.accuracy.ruler import RULER_TASKS, DataUnavailable, generate, score
from santa_bench.methods import REGISTRY
from santa_bench.runners.tasks import case_command, expand_task_cases, task_case


class StubTokenizer:
    """Words and punctuation marks as tokens (no Hugging Face tokenizer offline)."""

    def encode(self, text: str) -> list[int]:
        return [hash(t) % 50_000 for t in re.findall(r"\w+|[^\w\s]", text)]

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))


TOK = StubTokenizer()


def _data_or_skip() -> None:
    try:
        ruler.fetch_ruler_data()
    except DataUnavailable as exc:
        pytest.skip(f"RULER data unavailable: {exc}")


# long_context_eval/data/synthetic/constants.py (nvidia-long-context-eval==26.3), verbatim
UPSTREAM = {
    "niah": {
        "tokens_to_generate": 128,
        "template": """Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} for {query} mentioned in the provided text?""",  # noqa: E501
        "answer_prefix": """ The special magic {type_needle_v} for {query} mentioned in the provided text are""",  # noqa: E501
    },
    "variable_tracking": {
        "tokens_to_generate": 30,
        "template": """Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\nQuestion: Find all variables that are assigned the value {query} in the text above.""",  # noqa: E501
        "answer_prefix": """ Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are assgined the value {query}, they are: """,  # noqa: E501
    },
    "common_words_extraction": {
        "tokens_to_generate": 120,
        "template": """Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?""",  # noqa: E501
        "answer_prefix": """ Answer: The top 10 words that appear most often in the list are:""",
    },
    "freq_words_extraction": {
        "tokens_to_generate": 50,
        "template": """Read the following coded text and track the frequency of each coded word. Find the three most frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three most frequently appeared words in the above coded text?""",  # noqa: E501
        "answer_prefix": """ Answer: According to the coded text above, the three most frequently appeared words are:""",  # noqa: E501
    },
    "qa": {
        "tokens_to_generate": 32,
        "template": """Answer the question based on the given documents. Only give me the answer and do not output any other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}""",  # noqa: E501
        "answer_prefix": """ Answer:""",
    },
}


def test_templates_are_upstream_verbatim():
    assert ruler.TEMPLATES == UPSTREAM


def test_the_13_tasks_and_their_configs():
    assert list(RULER_TASKS) == [
        "niah_single_1", "niah_single_2", "niah_single_3",
        "niah_multikey_1", "niah_multikey_2", "niah_multikey_3",
        "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2",
    ]  # fmt: skip
    assert RULER_TASKS["niah_multikey_3"].args["type_needle_k"] == "uuids"
    assert RULER_TASKS["niah_multikey_1"].args["num_needle_k"] == 4
    assert RULER_TASKS["cwe"].args == {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10}
    assert RULER_TASKS["qa_2"].args == {"dataset": "hotpotqa"}
    assert RULER_TASKS["niah_single_1"].tokens_to_generate == 128
    assert RULER_TASKS["vt"].tokens_to_generate == 30
    assert RULER_TASKS["qa_1"].metric == "string_match_part"
    assert RULER_TASKS["fwe"].metric == "string_match_all"


def _check_samples(task: str, samples: list, ctx: int) -> None:
    ttg = RULER_TASKS[task].tokens_to_generate
    budget = ctx - ttg
    # qa adds whole documents (hundreds of tokens each): a looser lower bound
    floor = 0.7 if task.startswith("qa") else 0.9
    for s in samples:
        n = len(TOK.encode(s.prompt + s.answer_prefix))
        assert floor * budget <= n <= budget, (task, ctx, n, budget)
        assert s.length == n + ttg and s.tokens_to_generate == ttg
        assert s.outputs and all(isinstance(o, str) and o for o in s.outputs)
        if task.startswith("niah") or task == "vt":
            assert all(o in s.prompt for o in s.outputs)
        if task == "qa_1":
            assert any(o in s.prompt for o in s.outputs)  # the gold document is present


@pytest.mark.parametrize("ctx", [1024, 2048])
@pytest.mark.parametrize("task", list(RULER_TASKS))
def test_every_task_fits_the_context(task, ctx):
    _data_or_skip()
    if task == "qa_2" and ctx == 1024:  # ten HotpotQA paragraphs alone exceed 1k tokens
        with pytest.raises(ValueError, match="too small"):
            generate(task, TOK, ctx, 2, seed=0)
        return
    samples = generate(task, TOK, ctx, 3, seed=0)
    assert len(samples) == 3
    _check_samples(task, samples, ctx)


def test_prompts_follow_the_templates():
    _data_or_skip()
    single = generate("niah_single_2", TOK, 1024, 1, seed=1)[0]
    assert single.prompt.startswith(
        "A special magic number is hidden within the following text. Make sure to memorize "
        "it. I will quiz you about the number afterwards.\n"
    )
    key = re.search(r"for (\S+) mentioned", single.answer_prefix).group(1)
    assert single.prompt.endswith(
        f"\nWhat is the special magic number for {key} mentioned in the provided text?"
    )
    assert single.answer_prefix == (
        f" The special magic number for {key} mentioned in the provided text is"
    )
    needle = f"One of the special magic numbers for {key} is: {single.outputs[0]}."
    assert needle in single.prompt
    multi = generate("niah_multivalue", TOK, 1024, 1, seed=1)[0]
    assert multi.prompt.startswith("Some special magic numbers are hidden")
    assert multi.answer_prefix.endswith("mentioned in the provided text are")
    assert len(multi.outputs) == 4
    vt = generate("vt", TOK, 1024, 1, seed=1)[0]
    assert vt.prompt.startswith(" Memorize and track the chain(s)")  # the in-context example
    assert vt.prompt.count("Memorize and track the chain(s)") == 2
    assert re.fullmatch(
        r" Answer: According to the chain\(s\) of variable assignment in the text above, "
        r"5 variables are assgined the value \d{5}, they are: ",
        vt.answer_prefix,
    )
    assert len(vt.outputs) == 5
    qa = generate("qa_1", TOK, 1024, 1, seed=1)[0]
    assert qa.answer_prefix == " Answer:"
    assert "\n\nThe following are given documents.\n\nDocument 1:\n" in qa.prompt
    assert qa.prompt.endswith("\n\nQuestion: In what country is Normandy located?")
    fwe = generate("fwe", TOK, 1024, 1, seed=1)[0]
    assert fwe.prompt.startswith("Read the following coded text") and "..." in fwe.prompt
    assert len(fwe.outputs) == 3


def test_generation_is_deterministic_for_a_seed():
    _data_or_skip()
    for task in ("niah_multikey_2", "niah_single_3", "vt", "cwe", "fwe", "qa_1"):
        a = generate(task, TOK, 1024, 2, seed=3)
        assert a == generate(task, TOK, 1024, 2, seed=3)
        assert a != generate(task, TOK, 1024, 2, seed=4)


def test_unknown_task_and_missing_data(tmp_path):
    with pytest.raises(ValueError, match="unknown RULER task"):
        generate("niah_single_9", TOK, 1024, 1)
    with pytest.raises(DataUnavailable, match=r"squad\.json"):
        ruler.fetch_ruler_data(tmp_path)


def test_scoring_string_match_all_and_part():
    refs = [["1234567", "7654321"]]
    assert score("niah_multivalue", ["The numbers are 1234567 and 7654321."], refs) == [1.0]
    assert score("niah_multivalue", ["1234567 only"], refs) == [0.5]
    assert score("cwe", ["1. APPLE 2. pear"], [["apple", "Pear", "fig"]]) == [2 / 3]
    assert score("qa_1", ["it is in PARIS, France"], [["paris", "Lyon"]]) == [1.0]
    assert score("qa_2", ["no idea"], [["yes"]]) == [0.0]
    assert score("vt", ["", None, "  \n"], [["AB"], ["AB"], [""]]) == [0.0, 0.0, 0.0]
    assert ruler.postprocess_pred("  a\x01b \n") == "a\nb"
    with pytest.raises(ValueError):
        score("vt", ["a"], [])


def test_runner_accepts_ruler_tasks():
    dense = REGISTRY.get("dense")
    case = task_case("ruler-niah_single_1", "m", dense, {}, n=2, seed=0, ctx=2048)
    assert case["task"] == "ruler-niah_single_1" and case["ctx"] == 2048
    assert case["max_new_tokens"] == 0
    with pytest.raises(ValueError, match="unknown RULER task"):
        task_case("ruler-foo", "m", dense, {}, n=2, seed=0, ctx=2048)
    with pytest.raises(ValueError, match="ctx"):
        task_case("ruler-vt", "m", dense, {}, n=2, seed=0)
    cases = expand_task_cases("ruler-qa_1", "m", [(dense, {})], n=2, seed=0, ctx=4096)
    assert [c["ctx"] for c in cases] == [4096]
    alias = task_case("ruler-qa2", "m", dense, {}, n=1, seed=0, ctx=8)  # suites' names
    assert case_command(alias).startswith("santa-bench accuracy ruler --tasks qa_2 --ctx 8")
    command = case_command(cases[0])
    assert command.startswith("santa-bench accuracy ruler --tasks qa_1 --ctx 4096 --model m")


def test_ruler_niah_expands_to_the_eight_niah_tasks():
    from santa_bench.runners.tasks import RULER_GROUPS, expand_task_names
    from santa_bench.sweep import suite_from_dict

    niah = [t for t in RULER_TASKS if t.startswith("niah")]
    assert list(RULER_GROUPS["niah"]) == niah and len(niah) == 8
    assert expand_task_names("ruler-niah") == [f"ruler-{t}" for t in niah]
    assert expand_task_names("ruler-qa1") == ["ruler-qa1"]
    dense = REGISTRY.get("dense")
    cases = expand_task_cases("ruler-niah", "m", [(dense, {})], n=1, seed=0, ctx=4096)
    assert [c["task"] for c in cases] == [f"ruler-{t}" for t in niah]
    with pytest.raises(ValueError, match="unknown RULER task"):
        task_case("ruler-niah", "m", dense, {}, n=1, seed=0, ctx=4096)  # a group, not a task
    suite = suite_from_dict(
        {
            "runner": "accuracy",
            "fixed": {"model": "m", "ctx": "32k"},
            "grid": {"task": ["ruler-fwe", "ruler-niah"]},
            "zip": {"method": ["dense", "santa-prop"], "S": [128, 128]},
        }
    )
    tasks = [c["task"] for c in suite.cases]
    assert len(tasks) == 2 * 9 and tasks.count("ruler-niah_multiquery") == 2
    assert "ruler-niah" not in tasks


def test_ruler_32k_suite_runs_the_eight_niah_tasks():
    from pathlib import Path

    from santa_bench.sweep import load_suite

    suite = load_suite(Path(__file__).resolve().parents[1] / "suites" / "ruler-32k.yaml")
    tasks = {c["task"] for c in suite.cases}
    assert {f"ruler-{t}" for t in RULER_TASKS if t.startswith("niah")} <= tasks
    assert len(suite.cases) == 5 * (3 + 8)  # dense + 4 sampled, over fwe, qa1, qa2, 8 niah


def test_cached_long_samples_load_without_ruler_data(tmp_path, monkeypatch):
    """A GPU machine offline has the sample cache but no RULER data: the cache serves."""
    monkeypatch.setenv("SANTA_BENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(ruler, "_tokenizer_key", lambda tokenizer: "stub")
    sample = ruler.RulerSample("essay haystack", " answer:", ["42"], 128, 8192)
    path = ruler._sample_file("niah_single_2", TOK, 8192, 1, 0)
    assert path is not None and str(path).startswith(str(tmp_path))
    ruler._store_samples(path, [sample])

    def offline(*_args, **_kwargs):
        raise DataUnavailable("offline")

    monkeypatch.setattr(ruler, "fetch_ruler_data", offline)
    assert generate("niah_single_2", TOK, 8192, 1, seed=0) == [sample]
    path.unlink()
    with pytest.raises(DataUnavailable, match="offline"):
        generate("niah_single_2", TOK, 8192, 1, seed=0)


def test_cli_runs_long_contexts_from_the_cache_without_ruler_data(monkeypatch, tmp_path):
    """Offline with no RULER data: 32k cases still run (from the sample cache); 2k fails."""
    from typer.testing import CliRunner

    monkeypatch.setenv("SANTA_BENCH_CACHE", str(tmp_path))  # no cached samples
    from santa_bench.accuracy import cli as accuracy_cli
    from santa_bench.cli import app

    def offline(*_args, **_kwargs):
        raise DataUnavailable("RULER data is not here (offline)")

    ran: list = []
    monkeypatch.setattr(ruler, "fetch_ruler_data", offline)
    monkeypatch.setattr(accuracy_cli.cli_options, "require_model_packages", lambda *a: None)
    monkeypatch.setattr(accuracy_cli, "_run", lambda cases, *a: ran.append(cases) or [])
    monkeypatch.setattr(accuracy_cli, "_task_table", lambda *a: None)
    runner = CliRunner()
    short = runner.invoke(app, ["accuracy", "ruler", "--tasks", "niah_single_2", "--ctx", "2k"])
    assert short.exit_code != 0 and "offline" in short.output and not ran
    long = runner.invoke(app, ["accuracy", "ruler", "--tasks", "niah_single_2", "--ctx", "32k"])
    assert long.exit_code == 0, long.output
    assert "cached samples" in long.output and ran and ran[0]


def test_cli_fetches_no_ruler_data_when_every_sample_is_cached(monkeypatch, tmp_path):
    """An offline GPU machine given the sample cache: no download is tried (pip's retries
    cost a minute a run), no warning; one task missing from the cache: the fetch runs."""
    from typer.testing import CliRunner

    from santa_bench.accuracy import cli as accuracy_cli
    from santa_bench.cli import app

    monkeypatch.setenv("SANTA_BENCH_CACHE", str(tmp_path))
    folder = tmp_path / "data" / "ruler-samples"
    folder.mkdir(parents=True)
    for task in ("niah_single_1", "vt"):
        (folder / f"{task}-32768-n100-s0-0123456789abcdef.json").write_text("[]")
    fetched: list = []
    monkeypatch.setattr(ruler, "fetch_ruler_data", lambda *a, **k: fetched.append(1))
    monkeypatch.setattr(accuracy_cli.cli_options, "require_model_packages", lambda *a: None)
    monkeypatch.setattr(accuracy_cli, "_run", lambda cases, *a: [])
    monkeypatch.setattr(accuracy_cli, "_task_table", lambda *a: None)
    runner = CliRunner()
    args = ["accuracy", "ruler", "--ctx", "32k", "--n", "100"]
    done = runner.invoke(app, [*args, "--tasks", "niah_single_1,vt"])
    assert done.exit_code == 0, done.output
    assert not fetched and "warning" not in done.output
    done = runner.invoke(app, [*args, "--tasks", "niah_single_1,fwe"])
    assert done.exit_code == 0, done.output
    assert fetched == [1]
    assert not ruler.samples_cached(["vt"], [4096], 100, 0)  # short contexts are not kept


def test_the_methods_of_a_task_share_its_tokenized_prompts(monkeypatch):
    """Tokenizing 50 RULER prompts at 32k takes seconds: once a sample set, not once a
    method; another sample set or another generation length tokenizes again."""
    import santa_bench.accuracy.tasks as accuracy_tasks
    from santa_bench.runners.tasks import TaskRunner

    calls = []

    def fake_prompts(task, tokenizer, items, max_new_tokens):
        calls.append((task, max_new_tokens))
        return [f"{task}/{item}/{max_new_tokens}" for item in items]

    monkeypatch.setattr(accuracy_tasks, "task_prompts", fake_prompts)
    runner = TaskRunner()
    items = ["a", "b"]
    runner._samples = (("ruler-niah_single_2", "m", "32768", "2", "0", "None"), items)
    case = {"task": "ruler-niah_single_2", "max_new_tokens": None}
    first = runner.prompts(case, None, items)
    assert runner.prompts(case, None, items) is first and len(calls) == 1
    assert runner.prompts({**case, "max_new_tokens": 32}, None, items) == [
        "ruler-niah_single_2/a/32", "ruler-niah_single_2/b/32"]
    other = ["c"]
    runner._samples = (("ruler-vt", "m", "32768", "1", "0", "None"), other)
    assert runner.prompts({"task": "ruler-vt"}, None, other) == ["ruler-vt/c/256"]
    assert len(calls) == 3
