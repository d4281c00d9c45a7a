"""tables: every anchor table of docs/anchors.md beside our measurements.

The anchor numbers and where they come from are read from santa_bench/data/anchors.yaml
(:mod:`santa_bench.anchors`); ours from the store's kernel and task-score rows.
"""

from __future__ import annotations

from typing import NamedTuple

import pandas as pd

from santa_bench.anchors import Anchors, packaged_anchors
from santa_bench.plots.kernel_tables import dense_table, kernel_table
from santa_bench.plots.rows import NoData, accuracy_rows, kernel_rows
from santa_bench.plots.score_tables import (
    gsm8k_table,
    ruler_table,
    ruler_tasks,
    scores_note,
)
from santa_bench.plots.table_text import latex, markdown
from santa_bench.units import format_size

NAME = "tables"
PRODUCER = (
    "santa-bench kernel --ctx 8k,32k,128k --batch 1,8 --S 128,2048 "
    "--methods santa-prop,santa-flash --baselines auto --no-graph (on a GPU)"
)


class Tables(NamedTuple):
    """The anchor tables as Markdown and LaTeX, and each table's rows."""

    markdown: str
    latex: str
    frames: dict[str, pd.DataFrame]


def table_notes(anchors: Anchors) -> dict[str, tuple[str, str]]:
    """Return each table's title and note: where its anchor figures and ours come from."""

    def source(key: str, extra: str = "") -> str:
        table = anchors[key]
        return f"Anchor: {anchors.document}, '{table.section}' ({table.setup}{extra})."

    ruler, gsm8k = anchors["ruler"], anchors["gsm8k"]
    kernels = " / ".join(anchors["kernels"]["kernels"])
    return {
        "dense": (
            "Dense baselines, median latency (µs)",
            source("dense") + " Ours: kernel rows of the store (cold L2, medians).",
        ),
        "kernels": (
            "Released SANTA kernels vs ours at the same shapes",
            source("kernels") + f" Ours: {kernels} Triton kernels; speedup vs our best dense "
            "baseline of the same run and timing, bootstrap 95% CI.",
        ),
        "ruler": (
            f"RULER {format_size(ruler['ctx'])} ({ruler['model']}), score (%)",
            source("ruler")
            + f" Ours: `score` rows with task {'/'.join(ruler_tasks(anchors))}.",
        ),
        "gsm8k": (
            f"GSM8K ({gsm8k['model']}), accuracy (%)",
            source("gsm8k", f"; SDPA {gsm8k['dense']:.2f} in the first row")
            + " Ours: `score` rows with task gsm8k.",
        ),
    }


def render_tables(frame: pd.DataFrame, anchors: Anchors | None = None) -> Tables:
    """Return every anchor table beside our measurements (Markdown, LaTeX), the anchors
    read from `anchors` (default: the package's data/anchors.yaml).

    Raises NoData when the store has none of the measurements the tables compare.
    """
    anchors = anchors or packaged_anchors()
    kernel = kernel_rows(frame)
    scores = accuracy_rows(frame)
    frames = {
        "dense": dense_table(kernel, anchors),
        "kernels": kernel_table(kernel, anchors),
        "ruler": ruler_table(scores, anchors),
        "gsm8k": gsm8k_table(scores, anchors),
    }
    ours = [c for t in frames.values() for c in t.columns if "ours" in c]
    if all((t[c] == "–").all() for t in frames.values() for c in t.columns if c in ours):
        raise NoData(NAME, PRODUCER)
    notes = table_notes(anchors)
    markdown_parts, latex_parts = [], []
    for key, table in frames.items():
        title, note = notes[key]
        if key in ("ruler", "gsm8k"):
            note += scores_note(scores, key, anchors)
        markdown_parts += [f"### {title}", "", markdown(table), "", f"*{note}*", ""]
        latex_parts += [latex(table, title, note, key), ""]
    markdown_parts.append(
        "Not compared yet: the page-subset floor for SANTA++ (FlashInfer paged decode on a "
        f"random page subset, {anchors.document}) — no SANTA++ kernel rows in the store."
    )
    return Tables("\n".join(markdown_parts) + "\n", "\n".join(latex_parts), frames)
