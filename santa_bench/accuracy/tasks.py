"""Task accuracy through a method: MMLU (choice accuracy) and GSM8K (final number).

Prompts are prefilled densely; MMLU's last prompt token is one decode step through
the method and the answer is the letter with the highest logit; GSM8K generates
greedily, every generated token a decode step through the method.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch

from santa_bench.accuracy.datasets import (
    Gsm8kProblem,
    MmluQuestion,
    gsm8k_correct,
    gsm8k_prompt,
    mmlu_prompt,
)
from santa_bench.accuracy.hf_loop import (
    PrefillCache,
    _prefill,
    generated_texts,
    greedy_decode,
    newline_ids,
    token_ids,
)
from santa_bench.accuracy.integration import use_method
from santa_bench.accuracy.longcontext import long_context_loop
from santa_bench.accuracy.registry import Task, register_task
from santa_bench.accuracy.ruler import ruler_loop

__all__ = ["PrefillCache", "greedy_decode", "long_context_loop", "newline_ids", "ruler_loop"]


def _lettertoken_ids(tokenizer, count: int) -> list[int]:
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
            letters = _lettertoken_ids(tokenizer, len(question.choices))
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


# ------------------------------------------------------------ engine-driven tasks
# Each task turns its samples into engine prompts and scores the generations; every
# prompt token but the last is prefilled densely, the last one and each generated token
# are decode steps through the method (``santa_bench.accuracy.engine``).
def task_prompts(task: str, tokenizer, items: Sequence, max_new_tokens: int = 256) -> list:
    """Returns the engine prompts of ``items`` of ``task`` (a registered task's name)."""
    from santa_bench.accuracy.registry import TASKS

    return TASKS.get(task).prompts(tokenizer, items, max_new_tokens)


def task_scores(task: str, tokenizer, items: Sequence, generation) -> tuple[list, list[str]]:
    """Returns per-sample correctness (bool) or score (float in [0, 1]) and the outputs."""
    from santa_bench.accuracy.registry import TASKS

    return TASKS.get(task).score(tokenizer, items, generation)


def hf_task_scores(task: Task, model, tokenizer, items: Sequence, case: dict[str, Any],
                   prefills: PrefillCache | None = None) -> list:
    """Per-sample scores of ``task`` through transformers' own loop with the attention
    ``model`` currently uses: each prompt's tokens but the last are prefilled densely,
    then a greedy generation (its first step's logits kept where the task reads them)."""
    prompts = task.prompts(tokenizer, items, int(case.get("max_new_tokens") or 256))
    tokens, logits = [], []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt.ids], dtype=torch.long, device=model.device)
            past = _prefill(model, ids[:, :-1], prefills)
            if task.keep_logits:
                step = model(ids[:, -1:], past_key_values=past, use_cache=True)
                logits.append(step.logits[0, -1].float().cpu())
                tokens.append([int(logits[-1].argmax())])
                continue
            eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
            out = model.generate(ids, past_key_values=past, max_new_tokens=prompt.max_new_tokens,
                                 do_sample=False, pad_token_id=tokenizer.eos_token_id,
                                 eos_token_id=list(dict.fromkeys([*eos, *prompt.stops])) or None)
            tokens.append(out[0, ids.shape[1]:].tolist())
    generation = SimpleNamespace(tokens=tokens, first_logits=logits)
    return task.score(tokenizer, items, generation)[0]


def shuffled_head(items: list, case: dict[str, Any]) -> list:
    """The case's ``n`` first items after a shuffle seeded with its ``seed``."""
    random.Random(case["seed"]).shuffle(items)
    return items[: case["n"]]


# ------------------------------------------------------------------ MMLU and GSM8K
def _mmlu_samples(case: dict[str, Any], tokenizer) -> list:
    from santa_bench.accuracy.datasets import load_mmlu_redux

    return shuffled_head(load_mmlu_redux(case.get("_data_dir")), case)


def _mmlu_prompts(tokenizer, items: Sequence, max_new_tokens: int) -> list:
    from santa_bench.accuracy.engine import Prompt

    return [Prompt(token_ids(tokenizer, mmlu_prompt(q)), 1) for q in items]


def _mmlu_score(tokenizer, items: Sequence, generation) -> tuple[list, list[str]]:
    picks = [int(row[_lettertoken_ids(tokenizer, len(q.choices))].argmax())
             for row, q in zip(generation.first_logits, items, strict=True)]
    return ([p == q.answer for p, q in zip(picks, items, strict=True)],
            ["ABCDEFGHIJ"[p] for p in picks])


def _gsm8k_samples(case: dict[str, Any], tokenizer) -> list:
    from santa_bench.accuracy.datasets import load_gsm8k

    return shuffled_head(load_gsm8k(case.get("_data_dir")), case)


def _gsm8k_prompts(tokenizer, items: Sequence, max_new_tokens: int) -> list:
    from santa_bench.accuracy.engine import Prompt

    return [Prompt(token_ids(tokenizer, gsm8k_prompt(p)), max_new_tokens) for p in items]


def _gsm8k_score(tokenizer, items: Sequence, generation) -> tuple[list, list[str]]:
    texts = generated_texts(tokenizer, generation)
    return [gsm8k_correct(t, p.answer) for t, p in zip(texts, items, strict=True)], texts


PREFILL = "the prompt prefilled densely but its last token (question included)"


@register_task
def mmlu_and_gsm8k() -> tuple[Task, ...]:
    return (
        Task("mmlu", "MMLU-Redux choice accuracy (the answer letter's logit)",
             _mmlu_samples, _mmlu_prompts, _mmlu_score, keep_logits=True, family="MMLU",
             protocol="zero-shot MMLU prompt (subject line, question, lettered choices, "
             "'Answer:'), no chat template; " + PREFILL + "; its last token one decode step "
             "through the method; the choice whose letter has the largest logit",
             command=lambda case: ["accuracy", "mmlu"],
             hf_scores=lambda model, tok, items, case, prefills: mmlu_loop(model, tok, items)),
        Task("gsm8k", "GSM8K exact match of the final number (greedy)",
             _gsm8k_samples, _gsm8k_prompts, _gsm8k_score, generates=True, family="GSM8K",
             protocol="zero-shot prompt (question, 'Solve it step by step, then give the final "
             "answer after ####', 'Answer:'), no chat template; " + PREFILL + "; greedy "
             "through the method up to max_new_tokens; exact match of the final number",
             command=lambda case: ["accuracy", "gsm8k"],
             hf_scores=lambda model, tok, items, case, prefills: gsm8k_loop(
                 model, tok, items, case["max_new_tokens"])),
    )
