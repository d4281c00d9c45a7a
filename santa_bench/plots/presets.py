"""The presets of `santa-bench plot`: each figure's render function and the command that
produces its rows, and rendering every chosen preset that has data."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from santa_bench.plots import (
    accuracy_latency,
    error,
    kv_reads,
    latency,
    scores,
    speedup,
    stage_times,
    tables,
)
from santa_bench.plots.output import Rendered, save, save_tables
from santa_bench.plots.rows import NoData

FIGURES: dict[str, Callable[[pd.DataFrame, Sequence[dict[str, Any]]], Rendered]] = {
    latency.NAME: latency.latency_vs_ctx,
    speedup.NAME: speedup.speedup_vs_S,
    error.NAME: error.error_vs_S,
    scores.NAME: scores.ruler_vs_budget,
    accuracy_latency.NAME: accuracy_latency.pareto,
    kv_reads.NAME: kv_reads.reads,
    stage_times.NAME: stage_times.stages,
}
PRODUCERS: dict[str, str] = {
    module.NAME: module.PRODUCER
    for module in (latency, speedup, error, scores, accuracy_latency, kv_reads, stage_times,
                   tables)
}
PRESETS: tuple[str, ...] = (*FIGURES, tables.NAME)


def render(name: str, frame: pd.DataFrame, runs: Sequence[dict[str, Any]] = ()) -> Rendered:
    """Return the named figure preset rendered from `frame` (NoData if it has no rows)."""
    if name not in FIGURES:
        raise ValueError(f"unknown figure preset {name!r}; choose from {', '.join(FIGURES)}")
    return FIGURES[name](frame, runs)


@dataclass
class PlotReport:
    """What `plot_all` wrote, and the presets it could not render with their producers."""

    written: dict[str, list[Path]]
    missing: dict[str, str]


def plot_all(
    frame: pd.DataFrame,
    runs: Sequence[dict[str, Any]],
    presets: Sequence[str],
    out: Path,
    announce: Callable[[str], None] | None = None,
) -> PlotReport:
    """Render and save each preset that has data; return what was written and what is missing.

    ``announce`` is told each preset as it starts (``[2/8] speedup-vs-S ...``)."""
    report = PlotReport({}, {})
    for number, name in enumerate(presets, 1):
        if announce is not None:
            announce(f"[{number}/{len(presets)}] {name} ...")
        try:
            if name == tables.NAME:
                report.written[name] = save_tables(tables.render_tables(frame), out)
            else:
                rendered = render(name, frame, runs)
                report.written[name] = save(rendered, out, name)
        except NoData as missing:
            report.missing[name] = missing.command
    return report
