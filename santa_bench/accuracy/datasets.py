"""Task data: GSM8K and MMLU-Redux from a data directory or any local file.

The data directory is ``--data-dir``, else ``$SANTA_BENCH_DATA``, else
``<cache>/data`` (``santa_bench.accuracy.models.cache_dir``). Layout: ``gsm8k/test.jsonl``
and ``mmlu-redux/mmlu_<subject>.csv``. Where neither is given and the cache lacks them,
the copies the package ships are read (:data:`PACKAGED_DATA`: GSM8K's test split, MIT,
and MMLU-Redux, CC BY 4.0, each with its licence). A user file (JSONL, Parquet or CSV)
with the same fields works too.
"""

from __future__ import annotations

import ast
import csv
import io
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from santa_bench.accuracy.models import cache_dir


class DataUnavailable(FileNotFoundError):
    """The task's data is not in the data directory (and nothing can fetch it here)."""


PACKAGED_DATA = Path(__file__).resolve().parent.parent / "data" / "tasks"
"""GSM8K (test split) and MMLU-Redux as the package ships them, with their licences."""


def task_path(directory: str | Path | None, relative: str) -> Path:
    """``relative`` under the data directory; with no directory given (neither argument
    nor ``$SANTA_BENCH_DATA``) and none there, the packaged copy when it exists."""
    path = data_dir(directory) / relative
    chosen = directory or os.environ.get("SANTA_BENCH_DATA")
    if not path.exists() and not chosen and (PACKAGED_DATA / relative).exists():
        return PACKAGED_DATA / relative
    return path


def data_dir(explicit: str | Path | None = None) -> Path:
    """Returns the data directory (argument, ``$SANTA_BENCH_DATA`` or the cache)."""
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("SANTA_BENCH_DATA") or cache_dir() / "data")


def read_table(path: Path) -> pd.DataFrame:
    """Reads a JSONL, JSON, Parquet or CSV file into a frame."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return pd.read_json(path, lines=suffix == ".jsonl")
    if suffix == ".parquet":
        return pd.read_parquet(path)
    if suffix == ".csv":
        return _read_csv(path)
    raise ValueError(f"{path}: unsupported data file (use .jsonl, .json, .parquet or .csv)")


def _read_csv(path: Path) -> pd.DataFrame:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:  # mmlu_moral_scenarios.csv is cp1252
        text = raw.decode("cp1252")
    dialect = csv.Sniffer().sniff(text.splitlines()[0], delimiters=",;")
    return pd.read_csv(io.StringIO(text), sep=dialect.delimiter, dtype=str, keep_default_na=False)


# ----------------------------------------------------------------------- GSM8K
@dataclass(frozen=True)
class Gsm8kProblem:
    question: str
    answer: str  # the final number, as written after "####"


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def normalise_number(text: str) -> str:
    """Returns a number without thousands separators or a trailing ``.0``."""
    value = text.replace(",", "").replace("$", "").strip().rstrip(".")
    if re.fullmatch(r"-?\d+\.0+", value):
        value = value.split(".")[0]
    return value


def final_number(text: str) -> str | None:
    """Returns the answer a generation gives: after ``####`` if present, else its last number."""
    if "####" in text:
        found = _NUMBER.findall(text.split("####", 1)[1])
        if found:
            return normalise_number(found[0])
    found = _NUMBER.findall(text)
    return normalise_number(found[-1]) if found else None


def gsm8k_correct(generation: str, answer: str) -> bool:
    """GSM8K's metric: exact match of the final number."""
    predicted = final_number(generation)
    return predicted is not None and predicted == normalise_number(answer)


def load_gsm8k(
    directory: str | Path | None = None, file: str | Path | None = None
) -> list[Gsm8kProblem]:
    """Returns the GSM8K test problems (``question``, final ``answer``)."""
    path = Path(file) if file else task_path(directory, "gsm8k/test.jsonl")
    if not path.exists():
        raise DataUnavailable(f"GSM8K: {path} not found (set --data-dir or $SANTA_BENCH_DATA)")
    frame = read_table(path)
    problems = []
    for question, answer in zip(frame["question"], frame["answer"], strict=True):
        final = str(answer).split("####")[-1].strip()
        problems.append(Gsm8kProblem(str(question), normalise_number(final)))
    return problems


# ------------------------------------------------------------------------- MMLU
@dataclass(frozen=True)
class MmluQuestion:
    subject: str
    question: str
    choices: tuple[str, ...]
    answer: int  # index of the correct choice


def load_mmlu_redux(
    directory: str | Path | None = None,
    subjects: list[str] | None = None,
    disputed: str = "exclude",
) -> list[MmluQuestion]:
    """Returns MMLU-Redux questions; ``disputed``: ``exclude`` (default), ``correct``
    (use the re-annotated ``correct_answer`` where it is a valid index) or ``keep``."""
    if disputed not in ("exclude", "correct", "keep"):
        raise ValueError(f"disputed: expected exclude, correct or keep, got {disputed!r}")
    root = task_path(directory, "mmlu-redux")
    files = sorted(root.glob("mmlu_*.csv"))
    if not files:
        raise DataUnavailable(f"MMLU-Redux: no mmlu_*.csv in {root} (set --data-dir)")
    questions = []
    for path in files:
        subject = path.stem.removeprefix("mmlu_")
        if subjects and subject not in subjects:
            continue
        for row in read_table(path).to_dict("records"):
            choices = tuple(str(c) for c in ast.literal_eval(row["choices"]))
            answer = int(row["answer"])
            if str(row.get("error_type", "ok")).lower() != "ok":
                fixed = str(row.get("correct_answer", "")).strip()
                if disputed == "exclude":
                    continue
                if disputed == "correct":
                    if not fixed.isdigit() or int(fixed) >= len(choices):
                        continue
                    answer = int(fixed)
            questions.append(MmluQuestion(subject, str(row["question"]), choices, answer))
    return questions


def mmlu_prompt(question: MmluQuestion) -> str:
    """The standard zero-shot MMLU prompt, ending at ``Answer:``."""
    subject = question.subject.replace("_", " ")
    letters = "ABCDEFGHIJ"
    lines = [
        f"The following are multiple choice questions (with answers) about {subject}.",
        "",
        question.question,
    ]
    lines += [f"{letters[i]}. {choice}" for i, choice in enumerate(question.choices)]
    lines.append("Answer:")
    return "\n".join(lines)


def gsm8k_prompt(problem: Gsm8kProblem) -> str:
    """A zero-shot GSM8K prompt asking for the final number after ``####``."""
    return (
        f"Question: {problem.question}\nSolve it step by step, then give the final "
        f"answer after '####'.\nAnswer:"
    )
