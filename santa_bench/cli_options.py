"""Command-line options shared by the commands that write to the result store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

ResultsDir = Annotated[Path, typer.Option("--results", help="Result store root (Parquet).")]
RunId = Annotated[str | None, typer.Option(help="Name of this run's folder (default: timestamp).")]
Force = Annotated[bool, typer.Option(help="Re-run cases already in the store.")]
