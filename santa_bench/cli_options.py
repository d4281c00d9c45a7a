"""Command-line pieces shared by the commands: store options, the console, option parsing,
running cases with one-line errors, and the exit status of a run."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from santa_bench.console import PIPE_WIDTH, fail, make_console  # noqa: F401 (re-exported)
from santa_bench.extras import (  # noqa: F401 (re-exported)
    ACCURACY_INSTALL,
    missing_model_packages,
    require_model_packages,
)


def _run_id_option(value: str | None) -> str | None:
    """Typer callback of ``--run-id``: a run id that is no plain folder name ends the
    command with one line (exit 2) before anything runs."""
    from santa_bench.results import check_run_id

    if value is not None:
        try:
            check_run_id(value)
        except ValueError as exc:
            fail(make_console(), f"--run-id: {exc}")
    return value


ResultsDir = Annotated[Path, typer.Option("--results", help="Result store root (Parquet).")]
RunId = Annotated[str | None, typer.Option(
    help="Name of this run's folder (default: timestamp): letters, digits, '.', '_', '-'.",
    callback=_run_id_option)]
Force = Annotated[bool, typer.Option(help="Re-run cases already in the store.")]



def positive_number(option: str, value: float) -> float:
    """Returns ``value``; ValueError naming ``option`` unless it is a finite number > 0."""
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{option}: expected a finite number > 0, got {value}")
    return value


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


# ------------------------------------------------------------------------- running cases
INTERRUPTED = 130
"""Exit status after Ctrl-C (128 + SIGINT), as shells report it."""


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
    except KeyboardInterrupt as exc:
        console.print(interrupted_message(getattr(exc, "outcome", None)), soft_wrap=True)
        raise typer.Exit(code=INTERRUPTED) from None


def interrupted_message(outcome: Any) -> str:
    """What a run stopped by Ctrl-C kept, and how to resume it."""
    if outcome is None or outcome.run_path is None:
        return "interrupted before any case ran: nothing written"
    return (
        f"interrupted: the rows of {len(outcome.results)} finished case(s) are written to "
        f"{outcome.run_path}, {len(outcome.not_run)} case(s) not run; rerun the same command "
        "to resume (finished cases are skipped)"
    )


def exit_if_cases_failed(outcome: Any, console: Console) -> None:
    """Exits with code 1 when a case failed (after its rows and the others' were written),
    saying how many and that a rerun retries them."""
    if failed := len(outcome.failed):
        ran = len(outcome.results)
        count = f"every case failed ({ran} of them)" if failed == ran else (
            f"{failed} of {ran} cases failed (the others' rows are written)")
        console.print(
            f"[bold red]{count}[/]: the failed cases table says why; a rerun of the same "
            "command retries them",
            soft_wrap=True,
        )
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
