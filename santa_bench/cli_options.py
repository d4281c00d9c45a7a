"""Command-line pieces shared by the commands: store options, the console, option parsing,
running cases with one-line errors, and the exit status of a run."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from santa_bench.console import PIPE_WIDTH, make_console  # noqa: F401 (re-exported)

ResultsDir = Annotated[Path, typer.Option("--results", help="Result store root (Parquet).")]
RunId = Annotated[str | None, typer.Option(help="Name of this run's folder (default: timestamp).")]
Force = Annotated[bool, typer.Option(help="Re-run cases already in the store.")]

ACCURACY_INSTALL = "pip install -e '.[accuracy]'"


def fail(console: Console, message: str, code: int = 2) -> None:
    """Prints ``error: message`` on one line and exits with ``code``."""
    console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code=code)


def option_list(option: str, text: str | None, parse: Callable[[str], Any] = int) -> list:
    """Parses the comma list of ``option``; a bad item raises ValueError naming the option."""
    from santa_bench.units import parse_list

    def one(item: str) -> Any:
        try:
            return parse(item)
        except ValueError:
            kind = "an integer" if parse is int else "a valid value"
            raise ValueError(f"{option}: expected {kind}, got {item!r}") from None

    return parse_list(text, one)


# ------------------------------------------------------------------- packages of an extra
def _installed(module: str, minimum: tuple[int, ...] = ()) -> bool:
    if importlib.util.find_spec(module) is None:
        return False
    if not minimum:
        return True
    try:
        version = importlib.metadata.version(module)
    except importlib.metadata.PackageNotFoundError:
        return True  # importable but not installed as a distribution: trust it
    numbers = tuple(int(p) for p in version.split(".")[: len(minimum)] if p.isdigit())
    return numbers >= minimum


def _needs_gguf(model: str) -> bool:
    from santa_bench.accuracy.models import CATALOG

    return model in CATALOG or model.endswith(".gguf")


def missing_model_packages(models: Iterable[str]) -> list[str]:
    """The packages of the ``accuracy`` extra that loading ``models`` needs and that are
    not importable here (transformers always; gguf >= 0.10 for catalog/GGUF models)."""
    models = list(models)
    missing = [name for name in ("torch", "transformers") if not _installed(name)]
    if any(_needs_gguf(m) for m in models) and not _installed("gguf", (0, 10)):
        missing.append("gguf>=0.10")
    return missing


def require_model_packages(console: Console, models: Iterable[str]) -> None:
    """Exits (code 2) with the install line when a model of ``models`` could not load."""
    models = list(models)
    if models and (missing := missing_model_packages(models)):
        fail(console, f"loading a model needs {', '.join(missing)}: {ACCURACY_INSTALL}")


# ------------------------------------------------------------------------- running cases
def run_cases_or_exit(
    cases: list[dict[str, Any]],
    store: Any,
    env: dict[str, Any] | None,
    options: Any,
    *,
    console: Console,
    title: str,
) -> Any:
    """:func:`santa_bench.execute.run_cases` for a command: a case that loads a model
    checks the accuracy extra first, and a bad executor request or a result folder that
    cannot be written ends the command with one line (exit 2). Returns the Outcome."""
    from santa_bench import execute

    require_model_packages(
        console, dict.fromkeys(str(c["model"]) for c in cases if c.get("kind") == "accuracy")
    )
    try:
        return execute.run_cases(cases, store, env, options, console=console, title=title)
    except execute.ExecutorError as exc:
        fail(console, str(exc))
        raise  # not reached: fail exits


def exit_if_every_case_failed(outcome: Any, console: Console) -> None:
    """Exits with code 1 when cases ran and every one of them failed."""
    if outcome.results and len(outcome.failed) == len(outcome.results):
        console.print(f"[bold red]every case failed[/] ({len(outcome.results)} of them)")
        raise typer.Exit(code=1)


# ------------------------------------------------------------------------ table cells
def _number(value: float, spec: str) -> str:
    text = format(value, spec)
    return text[1:] if text.startswith("-") and float(text) == 0 else text  # no "-0.000"


def metric_cell(metric: str, row: dict[str, Any] | None) -> str:
    """A table cell for one metric row: ``-`` when absent, the status when not ok,
    ``value [low, high]`` with an interval; a retention against a dense score of 0 says
    so instead of printing ``nan``."""
    if row is None:
        return "-"
    if row.get("status", "ok") != "ok":
        return str(row.get("status", ""))
    value = row["value"]
    if metric == "retention" and isinstance(value, float) and math.isnan(value):
        return "undefined: dense scored 0"
    if "ci_low" in row and "ci_high" in row:
        low, high = row["ci_low"], row["ci_high"]
        return f"{_number(value, '.3f')} [{_number(low, '.3f')}, {_number(high, '.3f')}]"
    return _number(value, ".3g")
