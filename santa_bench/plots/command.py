"""`santa-bench plot`: read a result store and render the chosen presets."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from santa_bench.expressions import Expression, ExpressionError, frame_mask
from santa_bench.plots.presets import PRESETS, plot_all
from santa_bench.stores import StoreError, open_results
from santa_bench.units import parse_list

DEFAULT_OUT = Path("plots/local")
"""``plot``'s default output: beside the committed figures of plots/, ignored by git, so
that a local run never overwrites them (``--out plots/`` does, on purpose)."""


def plot_command(
    presets: Annotated[
        list[str] | None,
        typer.Argument(help=f"Presets to render (default: all): {', '.join(PRESETS)}."),
    ] = None,
    results_dir: Annotated[
        Path,
        typer.Option(
            "--results",
            help="Result store root to read, with the stores nested below it "
            "(results/ holds results/h200/, results/smollm2-cpu/, ...).",
        ),
    ] = Path("results"),
    run: Annotated[
        str | None, typer.Option(help="Comma list of run ids to include (default: all).")
    ] = None,
    where: Annotated[
        str | None,
        typer.Option(
            help="Keep the rows where this expression over columns holds, in a suite's "
            "`where` syntax: \"batch == 1 and timing == 'graph'\", `method in [...]`, "
            "comparisons, and/or/not (a missing value equals nothing)."
        ),
    ] = None,
    out: Annotated[
        Path,
        typer.Option(
            help="Folder for PNG, PDF and CSV files. The default is ignored by git; "
            "--out plots/ replaces the committed figures."
        ),
    ] = DEFAULT_OUT,
    all_runs: Annotated[
        bool,
        typer.Option(
            "--all-runs",
            help="Plot every run's rows of a case (median and spread over the runs); "
            "default: of each case only the newest run's rows (after --run and --where).",
        ),
    ] = False,
) -> None:
    """Render paper-style figures (PNG, PDF, CSV of points) and anchor tables from a store.

    With no preset, renders every preset that has data and says, for each that has
    none, which command would produce it.
    """
    chosen = list(presets or PRESETS)
    if unknown := [p for p in chosen if p not in PRESETS]:
        typer.echo(
            f"error: unknown preset(s) {unknown}; choose from {', '.join(PRESETS)}", err=True
        )
        raise typer.Exit(code=2)
    try:
        expression = Expression.parse(where) if where else None
    except ExpressionError as exc:
        typer.echo(f"error: --where: {exc}", err=True)
        raise typer.Exit(code=2) from None
    try:
        store = open_results(results_dir)
    except StoreError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    try:
        frame = store.load(parse_list(run) or None)
        if expression is not None and not frame.empty:
            frame = frame[frame_mask(expression, frame)]
        if not all_runs:
            frame = store.newest_per_case(frame)
    except ExpressionError as exc:
        typer.echo(f"error: --where: {exc}", err=True)
        raise typer.Exit(code=2) from None
    except Exception as exc:  # a bad --run is the user's to fix
        typer.echo(f"error: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(code=2) from exc
    try:
        report = plot_all(frame, store.runs(), chosen, out,
                          announce=lambda line: typer.echo(line, err=True))
    except OSError as exc:
        typer.echo(f"error: --out {out}: cannot write there ({exc.strerror or exc})", err=True)
        raise typer.Exit(code=2) from None
    for name, paths in report.written.items():
        typer.echo(f"{name}: " + ", ".join(str(p) for p in paths))
    for name, command in report.missing.items():
        typer.echo(f"{name}: no data; produce it with: {command}")
