"""Task accuracy through a method: MMLU (choice accuracy) and GSM8K (final number).

Prompts are prefilled densely; MMLU's last prompt token is one decode step through
the method and the answer is the letter with the highest logit; GSM8K generates
greedily, every generated token a decode step through the method.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from santa_bench.accuracy.datasets import (
    Gsm8kProblem,
    MmluQuestion,
    gsm8k_correct,
    gsm8k_prompt,
    mmlu_prompt,
)
from santa_bench.accuracy.integration import use_method


def _letter_ids(tokenizer, count: int) -> list[int]:
    return [
        tokenizer.encode(f" {letter}", add_special_tokens=False)[-1]
        for letter in "ABCDEFGHIJ"[:count]
    ]


def mmlu_correct(
    model,
    tokenizer,
    questions: Sequence[MmluQuestion],
    spec: str,
    *,
    seed: int = 0,
    dense_layers: tuple[int, ...] = (),
) -> list[bool]:
    """Returns per-question correctness of ``spec`` on MMLU questions."""
    use_method(model, spec, seed=seed, dense_layers=dense_layers)
    return mmlu_loop(model, tokenizer, questions)


def mmlu_loop(model, tokenizer, questions: Sequence[MmluQuestion]) -> list[bool]:
    """Per-question correctness with the attention ``model`` currently uses."""
    correct = []
    with torch.no_grad():
        for question in questions:
            ids = tokenizer(mmlu_prompt(question), return_tensors="pt").input_ids
            ids = ids.to(model.device)
            past = model(ids[:, :-1], use_cache=True).past_key_values  # dense prefill
            logits = model(ids[:, -1:], past_key_values=past, use_cache=True).logits[0, -1]
            letters = _letter_ids(tokenizer, len(question.choices))
            correct.append(int(logits[letters].argmax()) == question.answer)
    return correct


def gsm8k_solved(
    model,
    tokenizer,
    problems: Sequence[Gsm8kProblem],
    spec: str,
    *,
    seed: int = 0,
    max_new_tokens: int = 256,
    dense_layers: tuple[int, ...] = (),
) -> list[bool]:
    """Returns per-problem exact-match of the final number, greedy decoding through ``spec``."""
    use_method(model, spec, seed=seed, dense_layers=dense_layers)
    return gsm8k_loop(model, tokenizer, problems, max_new_tokens)


def gsm8k_loop(
    model, tokenizer, problems: Sequence[Gsm8kProblem], max_new_tokens: int
) -> list[bool]:
    """Per-problem exact match with the attention ``model`` currently uses."""
    solved = []
    with torch.no_grad():
        for problem in problems:
            ids = tokenizer(gsm8k_prompt(problem), return_tensors="pt").input_ids
            out = model.generate(
                ids.to(model.device),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.eos_token_id,
            )
            text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
            solved.append(gsm8k_correct(text, problem.answer))
    return solved


def ruler_loop(model, tokenizer, samples: Sequence, task: str) -> tuple[list[float], list[str]]:
    """RULER per-sample scores and predictions with the attention ``model`` currently uses.

    ``prompt + answer_prefix`` is prefilled densely except its last token; that token and
    every generated one (greedy, ``tokens_to_generate``) are decode steps through the method.
    """
    from santa_bench.accuracy.ruler import score

    predictions = []
    with torch.no_grad():
        for sample in samples:
            ids = tokenizer(sample.prompt + sample.answer_prefix, return_tensors="pt").input_ids
            ids = ids.to(model.device)
            past = model(ids[:, :-1], use_cache=True).past_key_values  # dense prefill
            out = model.generate(
                ids,
                past_key_values=past,
                max_new_tokens=sample.tokens_to_generate,
                do_sample=False,
                pad_token_id=tokenizer.eos_token_id,
            )
            predictions.append(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
    return score(task, predictions, [s.outputs for s in samples]), predictions


def retention_ci(
    method: Sequence[bool], dense: Sequence[bool], *, n_boot: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """Returns ``(score_method / score_dense, low, high)``: paired bootstrap 95% interval."""
    if len(method) != len(dense) or not dense:
        raise ValueError("retention needs paired, non-empty per-sample results")
    rng = random.Random(seed)
    n = len(dense)

    def ratio(idx: Sequence[int]) -> float:
        base = sum(dense[i] for i in idx)
        return sum(method[i] for i in idx) / base if base else float("nan")

    point = ratio(range(n))
    draws = sorted(
        r for r in (ratio([rng.randrange(n) for _ in range(n)]) for _ in range(n_boot)) if r == r
    )
    if not draws:
        return point, float("nan"), float("nan")
    return point, draws[int(0.025 * len(draws))], draws[int(0.975 * len(draws)) - 1]
