"""Command-line pieces shared by the commands: store options and option parsing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

ResultsDir = Annotated[Path, typer.Option("--results", help="Result store root (Parquet).")]
RunId = Annotated[str | None, typer.Option(help="Name of this run's folder (default: timestamp).")]
Force = Annotated[bool, typer.Option(help="Re-run cases already in the store.")]


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
