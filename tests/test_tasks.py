"""Task data loaders, scorers and the task loops (tiny random model, stub tokenizer)."""

from __future__ import annotations

import pytest
import torch

from santa_bench.accuracy.datasets import (
    PACKAGED_DATA,
    DataUnavailable,
    MmluQuestion,
    final_number,
    gsm8k_correct,
    load_gsm8k,
    load_mmlu_redux,
    mmlu_prompt,
)
from santa_bench.accuracy.tasks import retention_ci

SHARED_DATA = PACKAGED_DATA  # the copies the package ships


def test_gsm8k_loads_the_full_test_split_with_final_answers():
    problems = load_gsm8k(SHARED_DATA)
    assert len(problems) == 1319
    assert problems[0].answer == "18"
    assert all(p.answer and "," not in p.answer for p in problems)


def test_mmlu_redux_loads_57_subjects_and_handles_disputed_keys():
    kept = load_mmlu_redux(SHARED_DATA, disputed="keep")
    assert len(kept) == 5700 and len({q.subject for q in kept}) == 57
    clean = load_mmlu_redux(SHARED_DATA)
    assert 0 < len(clean) < len(kept)
    assert all(0 <= q.answer < len(q.choices) for q in clean)
    assert any(q.subject == "moral_scenarios" for q in clean)  # the cp1252 file


def test_missing_data_names_the_path(tmp_path):
    with pytest.raises(DataUnavailable, match="SANTA_BENCH_DATA"):
        load_gsm8k(tmp_path)
    with pytest.raises(DataUnavailable, match="mmlu-redux"):
        load_mmlu_redux(tmp_path)


@pytest.mark.parametrize(
    ("generation", "answer", "correct"),
    [
        ("so she makes 9 * 2 = 18 dollars.\n#### 18", "18", True),
        ("The answer is 1,200.", "1200", True),
        ("It is 18.0", "18", True),
        ("#### 17", "18", False),
        ("no number here", "3", False),
        ("first 5 then -3", "-3", True),
    ],
)
def test_gsm8k_exact_match_of_the_final_number(generation, answer, correct):
    assert gsm8k_correct(generation, answer) is correct
    assert final_number("nothing") is None


def test_mmlu_prompt_is_the_standard_format():
    q = MmluQuestion("high_school_physics", "What is g?", ("1", "9.8", "3", "4"), 1)
    prompt = mmlu_prompt(q)
    assert prompt.startswith("The following are multiple choice questions (with answers) "
                             "about high school physics.")
    assert "\nB. 9.8\n" in prompt and prompt.endswith("Answer:")


def test_retention_interval_contains_the_point_and_is_paired():
    dense = [True] * 80 + [False] * 20
    method = [True] * 72 + [False] * 28
    point, low, high = retention_ci(method, dense)
    assert point == pytest.approx(0.9) and low <= point <= high < 1.01
    same, low, high = retention_ci(dense, dense)
    assert same == low == high == 1.0
    with pytest.raises(ValueError):
        retention_ci([True], [])


class _CharTokenizer:
    """Maps characters to ids below the vocabulary size (enough to drive a model)."""

    eos_token_id = 0

    def encode(self, text, add_special_tokens=False):
        return [1 + ord(c) % 90 for c in text]

    def __call__(self, text, return_tensors="pt"):
        return type("Enc", (), {"input_ids": torch.tensor([self.encode(text)])})

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(48 + int(i) % 10) for i in ids)


def test_task_loops_run_through_a_method():
    transformers = pytest.importorskip("transformers")
    from santa_bench.accuracy.datasets import Gsm8kProblem
    from santa_bench.accuracy.tasks import gsm8k_solved, mmlu_correct

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=512)
    model = transformers.LlamaForCausalLM(config).eval()
    questions = [MmluQuestion("anatomy", f"Question {i}?", ("a", "b", "c", "d"), i % 4)
                 for i in range(4)]
    dense = mmlu_correct(model, _CharTokenizer(), questions, "dense")
    again = mmlu_correct(model, _CharTokenizer(), questions, "dense")
    assert dense == again and len(dense) == 4
    solved = gsm8k_solved(model, _CharTokenizer(), [Gsm8kProblem("1+1?", "2")], "santa-sys:S=4",
                          max_new_tokens=4)
    assert solved in ([True], [False])


def test_the_packaged_data_is_read_when_no_directory_is_given(monkeypatch, tmp_path):
    monkeypatch.delenv("SANTA_BENCH_DATA", raising=False)
    monkeypatch.setenv("SANTA_BENCH_CACHE", str(tmp_path))  # an empty cache
    assert len(load_gsm8k()) == 1319
    assert len(load_mmlu_redux(disputed="keep")) == 5700
    with pytest.raises(DataUnavailable):  # a directory the user names is never replaced
        load_gsm8k(tmp_path)
