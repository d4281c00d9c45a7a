"""LongBench v2 and HELMET-RAG: data, prompts fitted to a context length, scoring.

LongBench v2 (THUDM/LongBench-v2, ``data.json``): 503 multiple-choice questions over
long documents. Prompt: the official ``prompts/0shot.txt``; the prompt is truncated in
the middle to the context length (first and last halves of its tokens, as the official
``pred.py`` does) and sent as a user message (the tokenizer's chat template when it has
one); up to 128 new tokens; the answer is extracted as the official script does
(``The correct answer is (X)``) and compared with ``answer``.

HELMET-RAG (princeton-nlp/HELMET, ``data/kilt``): NQ, TriviaQA, HotpotQA and PopQA
(popularity < 10^3, HELMET's ``kilt_popqa_3``) questions with retrieved passages
(``question``, ``answers``, ``ctxs`` [{title, text}]). As HELMET: the test file with as
many passages as its target length (k = 50, 105, 220, 440, 1000 for 8k..128k), two
demonstrations from the k=3 train file chosen by a hash of the question, no chat
template, the passages cut at the end until the prompt fits ``ctx - 20`` tokens, at
most 20 new tokens up to a newline, metric substring exact match (SubEM) of the raw and
the parsed (after ``Answer:``) output, the best over the gold answers.

Data: ``<data>/longbench-v2/data.json`` and ``<data>/helmet/kilt/*.jsonl`` under the
data directory (``--data-dir``, ``$SANTA_BENCH_DATA``, else the user cache); missing
files are fetched from the Hugging Face hub when ``huggingface_hub`` is importable and
the hub is reachable (``HF_HUB_OFFLINE=1`` forbids it); any local JSONL/JSON/Parquet/CSV
file with the same fields works too.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import string
import tarfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from santa_bench.accuracy.datasets import DataUnavailable, data_dir, read_table
from santa_bench.accuracy.hf_loop import (
    PrefillCache,
    generated_texts,
    greedy_decode,
    newline_ids,
)
from santa_bench.accuracy.registry import TASKS, Task, register_task


# ---------------------------------------------------------------- shared pieces
@dataclass(frozen=True)
class LongSample:
    """A prompt fitted to the context: its tokens, references and generation limits."""

    input_ids: tuple[int, ...]
    references: tuple[str, ...]
    max_new_tokens: int
    stop_newline: bool = False
    sample_id: str = ""


def _encode(tokenizer: Any, text: str, special: bool = True) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=special))


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=True)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _hub_file(repo: str, filename: str, target: Path) -> Path:
    """Downloads ``filename`` of dataset ``repo`` from the Hugging Face hub into ``target``."""
    if _offline():
        raise RuntimeError("HF_HUB_OFFLINE is set")
    from huggingface_hub import hf_hub_download

    target.mkdir(parents=True, exist_ok=True)
    return Path(
        hf_hub_download(repo_id=repo, filename=filename, repo_type="dataset", local_dir=target)
    )


def _fetch(label: str, path: Path, fetcher: Callable[[], None], where: str) -> Path:
    """Returns ``path``, fetching it first when missing; DataUnavailable says where to put it."""
    if path.is_file():
        return path
    try:
        fetcher()
    except Exception as exc:  # ImportError, offline, HTTP errors: all mean "not here"
        raise DataUnavailable(
            f"{label}: {path} not found and not fetched from the Hugging Face hub "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}). "
            f"Put {where} there, or set --data-dir / $SANTA_BENCH_DATA, or pass --file "
            f"with a local JSONL/JSON/Parquet/CSV file."
        ) from None
    if not path.is_file():
        raise DataUnavailable(f"{label}: {path} still missing after the download")
    return path


def _records(path: Path) -> list[dict[str, Any]]:
    if path.suffix.lower() == ".json":
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        return data["data"] if isinstance(data, dict) and "data" in data else list(data)
    return read_table(path).to_dict("records")


def _listish(value: Any) -> list[Any]:
    """A list field as stored in JSON, Parquet (arrays) or CSV (JSON text)."""
    if isinstance(value, str):
        value = value.strip()
        if value.startswith("["):
            return list(json.loads(value))
        return [value]
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return []
    return list(value)


def shuffled(items: list, n: int, seed: int) -> list:
    """A seeded shuffle of ``items``, the first ``n``."""
    items = list(items)
    random.Random(seed).shuffle(items)
    return items[:n]


# ----------------------------------------------------------------- LongBench v2
LONGBENCH_REPO = "THUDM/LongBench-v2"
# prompts/0shot.txt of THUDM/LongBench (the v2 branch), verbatim
LONGBENCH_TEMPLATE = (
    "Please read the following text and answer the question below.\n\n<text>\n$DOC$\n"
    "</text>\n\nWhat is the correct answer to this question: $Q$\nChoices:\n(A) $C_A$\n"
    "(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\nFormat your response as follows: \"The correct "
    'answer is (insert answer here)".'
)
LONGBENCH_NEW_TOKENS = 128  # pred.py, without CoT
LONGBENCH_FIELDS = ("question", "choice_A", "choice_B", "choice_C", "choice_D", "answer", "context")


@dataclass(frozen=True)
class LongBenchItem:
    """One LongBench v2 question (the fields of ``data.json``)."""

    id: str
    domain: str
    sub_domain: str
    difficulty: str
    length: str
    question: str
    choices: tuple[str, str, str, str]
    answer: str  # A, B, C or D
    context: str


def load_longbench_v2(
    directory: str | Path | None = None, file: str | Path | None = None
) -> list[LongBenchItem]:
    """Returns LongBench v2's questions (``file``, else ``<data>/longbench-v2/data.json``)."""
    if file:
        path = Path(file)
        if not path.is_file():
            raise DataUnavailable(f"LongBench v2: {path} not found")
    else:
        folder = data_dir(directory) / "longbench-v2"
        path = _fetch(
            "LongBench v2",
            folder / "data.json",
            lambda: _hub_file(LONGBENCH_REPO, "data.json", folder),
            f"data.json of {LONGBENCH_REPO}",
        )
    items = []
    for row in _records(path):
        missing = [k for k in LONGBENCH_FIELDS if k not in row]
        if missing:
            raise ValueError(f"{path}: LongBench v2 rows need the fields {missing}")
        items.append(
            LongBenchItem(
                str(row.get("_id", len(items))),
                str(row.get("domain", "")),
                str(row.get("sub_domain", "")),
                str(row.get("difficulty", "")),
                str(row.get("length", "")),
                str(row["question"]),
                tuple(str(row[f"choice_{c}"]) for c in "ABCD"),  # type: ignore[arg-type]
                str(row["answer"]).strip(),
                str(row["context"]),
            )
        )
    return items


def longbench_prompt(item: LongBenchItem, context: str | None = None) -> str:
    """The official 0-shot prompt (``pred.py``: fields stripped, then substituted)."""
    document = item.context if context is None else context
    text = LONGBENCH_TEMPLATE.replace("$DOC$", document.strip())
    text = text.replace("$Q$", item.question.strip())
    for letter, choice in zip("ABCD", item.choices, strict=True):
        text = text.replace(f"$C_{letter}$", choice.strip())
    return text


def extract_answer(response: str) -> str | None:
    """The official ``extract_answer``: ``The correct answer is (X)`` or ``... is X``."""
    response = response.replace("*", "")
    match = re.search(r"The correct answer is \(([A-D])\)", response)
    if match:
        return match.group(1)
    match = re.search(r"The correct answer is ([A-D])", response)
    return match.group(1) if match else None


def longbench_correct(response: str, answer: str) -> bool:
    return extract_answer(response) == answer


def _chat(tokenizer: Any) -> Callable[[str], str] | None:
    """Wraps a user message in the tokenizer's chat template (None without one)."""
    if not getattr(tokenizer, "chat_template", None):
        return None

    def wrap(message: str) -> str:
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
        )

    return wrap


def middle_truncate(ids: Sequence[int], budget: int) -> list[int]:
    """The first and last ``budget // 2`` tokens when longer than ``budget`` (LongBench)."""
    ids = list(ids)
    if len(ids) <= budget:
        return ids
    half = budget // 2
    return ids[:half] + (ids[-half:] if half else [])


def longbench_samples(
    items: Sequence[LongBenchItem],
    tokenizer: Any,
    ctx: int,
    *,
    max_new_tokens: int = LONGBENCH_NEW_TOKENS,
) -> list[LongSample]:
    """Fits each question's prompt (and chat wrapper) to ``ctx - max_new_tokens`` tokens."""
    wrap = _chat(tokenizer)
    limit = ctx - max_new_tokens
    overhead = len(_encode(tokenizer, wrap(""), special=False)) if wrap else 0
    if limit - overhead < 64:
        raise ValueError(f"longbench-v2: ctx {ctx} is too small (need > {max_new_tokens + 64})")
    out = []
    for item in items:
        prompt = longbench_prompt(item)
        ids = _encode(tokenizer, prompt)
        budget = limit - overhead
        for _ in range(8):  # decoding and re-encoding may change the count a little
            text = prompt
            if len(ids) > budget:
                text = _decode(tokenizer, middle_truncate(ids, budget))
            final = (
                _encode(tokenizer, wrap(text), special=False) if wrap else _encode(tokenizer, text)
            )
            if len(final) <= limit:
                break
            budget -= len(final) - limit
        else:
            raise ValueError(f"longbench-v2 {item.id}: cannot fit the prompt into {limit} tokens")
        out.append(LongSample(tuple(final), (item.answer,), max_new_tokens, False, item.id))
    return out


# ------------------------------------------------------------------- HELMET-RAG
HELMET_REPO = "princeton-nlp/HELMET"
HELMET_ARCHIVE = "data.tar.gz"  # ~11 GB: only the data/kilt files needed are extracted
HELMET_DATASETS: dict[str, tuple[str, str, str]] = {
    # name: (test file with {k}, demo file, HELMET dataset name)
    "nq": ("nq-dev-multikilt_1000_k{k}_dep6.jsonl", "nq-train-multikilt_1000_k3_dep6.jsonl",
           "kilt_nq"),
    "triviaqa": ("triviaqa-dev-multikilt_1000_k{k}_dep6.jsonl",
                 "triviaqa-train-multikilt_1000_k3_dep6.jsonl", "kilt_triviaqa"),
    "hotpotqa": ("hotpotqa-dev-multikilt_1000_k{k}_dep3.jsonl",
                 "hotpotqa-train-multikilt_1000_k3_dep3.jsonl", "kilt_hotpotqa"),
    "popqa": ("popqa_test_1000_k{k}_dep6.jsonl", "popqa_test_1000_k3_dep6.jsonl",
              "kilt_popqa_3"),
}  # fmt: skip
HELMET_K = {8192: 50, 16384: 105, 32768: 220, 65536: 440, 131072: 1000}  # configs/rag*.yaml
HELMET_NEW_TOKENS = 20
HELMET_SHOTS = 2
POPQA_THRESHOLD = 3.0  # kilt_popqa_3: log10(s_pop) < 3
# data.py, load_qa (the templates as HELMET writes them)
HELMET_USER = (
    "Use the given documents to write a concise and short answer to the question. Write your "
    "answer in the following format:\nAnswer: [answer]\n\n{demos}{context}\n\nQuestion: {question}"
)
HELMET_SYSTEM = "Answer:"
HELMET_PROMPT = HELMET_USER + "\n" + HELMET_SYSTEM
HELMET_DEMO = "{documents}\n\nQuestion: {question}\nAnswer: {answer}"
HELMET_PASSAGE = "Document (Title: {title}): {text}"


@dataclass(frozen=True)
class RagItem:
    """One retrieval-augmented question: its passages in the retrieved order."""

    key: str  # ``id``, else the question (HELMET's sample key)
    question: str
    answers: tuple[str, ...]
    passages: tuple[tuple[str, str], ...]  # (title, text)
    popularity: float | None = None  # PopQA's s_pop


def helmet_k(ctx: int) -> int:
    """HELMET's passage count for a target length (the next length at or above ``ctx``)."""
    for length, k in sorted(HELMET_K.items()):
        if ctx <= length:
            return k
    return max(HELMET_K.values())


def _rag_items(path: Path) -> list[RagItem]:
    items = []
    for row in _records(path):
        if "question" not in row or "answers" not in row or "ctxs" not in row:
            raise ValueError(f"{path}: HELMET-RAG rows need question, answers and ctxs")
        passages = []
        for c in _listish(row["ctxs"]):
            c = json.loads(c) if isinstance(c, str) else c
            passages.append((str(c.get("title", "")), str(c.get("text", ""))))
        key = row.get("id")
        popularity = row.get("s_pop")
        items.append(
            RagItem(
                str(key) if key is not None and key == key else str(row["question"]),
                str(row["question"]),
                tuple(str(a) for a in _listish(row["answers"])),
                tuple(passages),
                float(popularity) if popularity is not None else None,
            )
        )
    return items


def _popular(items: list[RagItem]) -> list[RagItem]:
    return [
        i for i in items if i.popularity is None or math.log10(i.popularity) < POPQA_THRESHOLD
    ]


def _helmet_file(folder: Path, name: str) -> Path:
    """``folder/name``, extracted from HELMET's archive on the hub when missing."""

    def fetch() -> None:
        if _offline():
            raise RuntimeError("HF_HUB_OFFLINE is set")
        archive = _hub_file(HELMET_REPO, HELMET_ARCHIVE, folder.parent / "archive")
        with tarfile.open(archive) as tar:
            for member in tar:
                base = member.name.rsplit("/", 1)[-1]
                if member.isfile() and "/kilt/" in member.name and base in _HELMET_FILES:
                    source = tar.extractfile(member)
                    assert source is not None
                    folder.mkdir(parents=True, exist_ok=True)
                    (folder / base).write_bytes(source.read())

    return _fetch("HELMET-RAG", folder / name, fetch, f"HELMET's data/kilt/{name}")


_HELMET_FILES = {
    f.format(k=k) for test, demo, _ in HELMET_DATASETS.values() for f in (test, demo)
    for k in (*HELMET_K.values(), 3)
}  # fmt: skip


def load_helmet_rag(
    dataset: str,
    ctx: int,
    directory: str | Path | None = None,
    file: str | Path | None = None,
    demo_file: str | Path | None = None,
) -> tuple[list[RagItem], list[RagItem]]:
    """Returns ``(test items, demonstration items)`` of a HELMET-RAG dataset at ``ctx``.

    ``file`` (and ``demo_file``, optional: no demonstrations without it, except PopQA
    whose demonstrations come from its own file) replace the data directory.
    """
    if dataset not in HELMET_DATASETS:
        raise ValueError(f"HELMET-RAG dataset {dataset!r}: expected {list(HELMET_DATASETS)}")
    test_name, demo_name, _ = HELMET_DATASETS[dataset]
    if file:
        test_path = Path(file)
        if not test_path.is_file():
            raise DataUnavailable(f"HELMET-RAG: {test_path} not found")
        demo_path = Path(demo_file) if demo_file else (test_path if dataset == "popqa" else None)
    else:
        folder = data_dir(directory) / "helmet" / "kilt"
        test_path = _helmet_file(folder, test_name.format(k=helmet_k(ctx)))
        demo_path = _helmet_file(folder, demo_name)
    items = _rag_items(test_path)
    demos = _rag_items(demo_path) if demo_path else []
    if dataset == "popqa":
        items, demos = _popular(items), _popular(demos)
    return items, demos


def helmet_demos(item: RagItem, demos: Sequence[RagItem], dataset: str, shots: int) -> str:
    """HELMET's demonstrations: ``datasets.shuffle(seed=sha256(key))``, unique keys, first
    ``shots`` (PopQA, one split, leaves the question itself out)."""
    if shots <= 0 or not demos:
        return ""
    pool = [d for d in demos if d.key != item.key] if dataset == "popqa" else list(demos)
    seed = int(hashlib.sha256(item.key.encode("utf-8")).hexdigest(), 16) % 2**31
    order = np.random.default_rng(seed).permutation(len(pool))  # datasets' Dataset.shuffle
    chosen, seen = [], set()
    for index in order:
        demo = pool[int(index)]
        if demo.key not in seen:
            seen.add(demo.key)
            chosen.append(demo)
        if len(chosen) == shots:
            break
    texts = [
        HELMET_DEMO.format(
            documents=_passages(d),
            question=d.question,
            answer=d.answers[0] if d.answers else "",
        )
        for d in chosen
    ]
    return "\n\n".join(texts) + "\n\n"


def _passages(item: RagItem) -> str:
    return "\n\n".join(HELMET_PASSAGE.format(title=t, text=x) for t, x in item.passages)


def helmet_samples(
    dataset: str,
    items: Sequence[RagItem],
    demos: Sequence[RagItem],
    tokenizer: Any,
    ctx: int,
    *,
    shots: int = HELMET_SHOTS,
) -> list[LongSample]:
    """HELMET's prompts, the passages cut at the end so that prompt + 20 tokens fit ``ctx``."""
    limit = ctx - HELMET_NEW_TOKENS
    out = []
    for item in items:
        fields = {
            "demos": helmet_demos(item, demos, dataset, shots),
            "context": _passages(item),
            "question": item.question,
        }
        ids = _encode(tokenizer, HELMET_PROMPT.format(**fields))
        for _ in range(8):  # HELMET's model_utils.tokenize: drop the context's last tokens
            if len(ids) <= limit:
                break
            context_ids = _encode(tokenizer, fields["context"], special=False)
            excess = len(ids) - limit
            if excess >= len(context_ids):
                raise ValueError(f"helmet-rag-{dataset}: ctx {ctx} is too small for the prompt")
            fields["context"] = _decode(tokenizer, context_ids[:-excess])
            ids = _encode(tokenizer, HELMET_PROMPT.format(**fields))
        else:
            raise ValueError(f"helmet-rag-{dataset} {item.key}: cannot fit {limit} tokens")
        out.append(LongSample(tuple(ids), item.answers, HELMET_NEW_TOKENS, True, item.key))
    return out


def normalize_answer(text: str) -> str:
    """SQuAD/DensePhrases normalisation: lower, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def parse_output(output: str, prefix: str = HELMET_SYSTEM) -> str | None:
    """HELMET's ``parse_output``: the text after ``prefix`` (else the first line)."""
    patterns = [
        re.compile(f"(?:{prefix})(.*)(?:\n|$)", flags=re.IGNORECASE),
        re.compile(r"(?:^)(.*)(?:\n|$)"),
    ]
    for pattern in patterns:
        match = pattern.search(output)
        if match is not None:
            found = match[1].strip()  # chat models may repeat the prefix
            return re.sub(f"^{re.escape(prefix)}", "", found, flags=re.IGNORECASE).strip()
    return None


def sub_em(output: str, answers: Sequence[str]) -> float:
    """HELMET's SubEM: a normalised gold answer is a substring of the normalised output
    (raw, or parsed after ``Answer:``), best over the answers."""
    if not answers:
        return 0.0
    candidates = [output]
    parsed = parse_output(output)
    if parsed is not None:
        candidates.append(parsed)
    return float(
        any(normalize_answer(a) in normalize_answer(c) for c in candidates for a in answers)
    )


# ------------------------------------------------------------------ the task registry
def long_context_loop(
    model, tokenizer, samples: Sequence, task: str, prefills: PrefillCache | None = None
) -> tuple[list, list[str]]:
    """LongBench v2 (correct: bool) or HELMET-RAG (SubEM: float) per sample, and the outputs.

    Each sample's tokens are fitted to the context already; all but the last are
    prefilled densely, the rest are decode steps through the method.
    """
    stops = newline_ids(tokenizer)
    scores: list = []
    predictions = []
    with torch.no_grad():
        for sample in samples:
            ids = torch.tensor([sample.input_ids], dtype=torch.long)
            text = greedy_decode(
                model,
                tokenizer,
                "",
                sample.max_new_tokens,
                prefills,
                ids=ids,
                stop_ids=stops if sample.stop_newline else (),
            )
            if sample.stop_newline:
                text = text.split("\n", 1)[0]
            predictions.append(text)
            if task == "longbench-v2":
                scores.append(longbench_correct(text, sample.references[0]))
            else:
                scores.append(sub_em(text, sample.references))
    return scores, predictions



def _long_prompts(tokenizer: Any, items: Sequence[LongSample], max_new_tokens: int) -> list:
    """Engine prompts of fitted samples (HELMET's newline stops where a sample asks)."""
    from santa_bench.accuracy.engine import Prompt

    stops = tuple(newline_ids(tokenizer))
    return [Prompt(tuple(s.input_ids), s.max_new_tokens, stops if s.stop_newline else ())
            for s in items]


def _outputs(tokenizer: Any, items: Sequence[LongSample], generation: Any) -> list[str]:
    texts = generated_texts(tokenizer, generation)
    return [t.split("\n", 1)[0] if s.stop_newline else t
            for t, s in zip(texts, items, strict=True)]


def _hf_scores(task: str) -> Callable[..., list]:
    def run(model: Any, tokenizer: Any, items: Sequence, case: dict, prefills: Any) -> list:
        return long_context_loop(model, tokenizer, items, task, prefills)[0]

    return run


def _longbench_samples(case: dict[str, Any], tokenizer: Callable[[], Any]) -> list:
    # the data first: a missing file fails before the model loads
    items = load_longbench_v2(case.get("_data_dir"), case.get("_data_file"))
    return longbench_samples(shuffled(items, case["n"], case["seed"]), tokenizer(),
                             int(case["ctx"]))


def _longbench_score(tokenizer: Any, items: Sequence[LongSample], generation: Any) -> tuple:
    outputs = _outputs(tokenizer, items, generation)
    return [longbench_correct(t, s.references[0])
            for t, s in zip(outputs, items, strict=True)], outputs


def _helmet_task(dataset: str) -> Task:
    def samples(case: dict[str, Any], tokenizer: Callable[[], Any]) -> list:
        ctx = int(case["ctx"])
        tests, demos = load_helmet_rag(dataset, ctx, case.get("_data_dir"),
                                       case.get("_data_file"), case.get("_demo_file"))
        return helmet_samples(dataset, shuffled(tests, case["n"], case["seed"]), demos,
                              tokenizer(), ctx)

    def score(tokenizer: Any, items: Sequence[LongSample], generation: Any) -> tuple:
        outputs = _outputs(tokenizer, items, generation)
        return [sub_em(t, s.references) for t, s in zip(outputs, items, strict=True)], outputs

    name = f"helmet-rag-{dataset}"
    return Task(
        name, f"HELMET-RAG {dataset} SubEM (passages fitted to the case's context)",
        samples, _long_prompts, score, long_context=True,
        protocol="HELMET's RAG prompt: passages and two demonstrations fitted to the context, "
        "no chat template; the prompt prefilled densely but its last token; greedy through "
        "the method, up to 20 tokens to a newline; SubEM against the references",
        command=lambda case: ["accuracy", "helmet-rag", "--datasets", dataset, "--ctx",
                              str(case["ctx"])],
        hf_scores=_hf_scores(name), budget=20)


@register_task
def long_context_tasks() -> list[Task]:
    longbench = Task(
        "longbench-v2", "LongBench v2 multiple choice (0-shot, middle truncation to ctx)",
        _longbench_samples, _long_prompts, _longbench_score, long_context=True,
        protocol="LongBench v2's official 0-shot prompt, the document cut in the middle to "
        "the context, the tokenizer's chat template where it has one; the prompt prefilled "
        "densely but its last token; greedy through the method, up to 128 tokens; the answer "
        "letter extracted as the official script does",
        command=lambda case: ["accuracy", "longbench-v2", "--ctx", str(case["ctx"])],
        hf_scores=_hf_scores("longbench-v2"), budget=128)
    return [longbench, *(_helmet_task(d) for d in HELMET_DATASETS)]


# HELMET's RAG category is the mean of its four datasets: ``helmet-rag`` stands for all four.
TASKS.register_group("helmet-rag", [f"helmet-rag-{d}" for d in HELMET_DATASETS])
