"""The rich console every command prints through (a leaf: imports nothing of santa_bench)."""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console
from rich.markup import escape

PIPE_WIDTH = 200
"""Console width when the output is no terminal (a pipe, a log) and $COLUMNS is unset:
wide enough that tables are not cut at rich's default 80 columns."""


def make_console() -> Console:
    """A rich console: the terminal's width, $COLUMNS, else PIPE_WIDTH for a pipe or log."""
    terminal = sys.stdout is not None and sys.stdout.isatty()
    if terminal or os.environ.get("COLUMNS", "").isdigit():
        return Console()
    return Console(width=PIPE_WIDTH)


def fail(console: Console, message: str, code: int = 2) -> None:
    """Prints ``error: message`` on one line and exits with ``code``."""
    console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code=code)
