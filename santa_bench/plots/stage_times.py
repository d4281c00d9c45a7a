"""stages: stacked time per stage of one decode step (rows ``stage_<name>_us``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import matplotlib as mpl
import numpy as np
import pandas as pd

from santa_bench.plots.output import Rendered
from santa_bench.plots.rows import (
    NoData,
    budget_name,
    caption,
    kernel_rows,
    ok_rows,
    panel_title,
    select,
    unique,
    with_series,
)
from santa_bench.plots.style import family_rank, figure_legend, new_figure, styled
from santa_bench.units import format_size

NAME = "stages"
PRODUCER = (
    "santa-bench kernel --methods <SANTA++ method> --ctx 32k --batch 1,8 "
    "(records stage_*_us rows)"
)
STAGE_METRIC = re.compile(r"^stage_(?P<stage>.+)_us$")


@styled
def stages(frame: pd.DataFrame, runs: Sequence[dict[str, Any]] = ()) -> Rendered:
    """Return stacked per-stage time (rows `stage_<name>_us`) per case, one panel per timing.

    A black tick marks the case's measured end-to-end latency when the store has it.
    """
    data = frame[frame.metric.astype(str).str.match(STAGE_METRIC.pattern)]
    data = with_series(data[(data.status == "ok") & data.value.notna()])
    if data.empty:
        raise NoData(NAME, PRODUCER)
    data["stage"] = data.metric.str.replace(STAGE_METRIC, r"\g<stage>", regex=True)
    stage_names = list(dict.fromkeys(data.stage))
    palette = mpl.colormaps["tab10"]
    totals = ok_rows(kernel_rows(frame), "latency").set_index("case_hash").value
    totals = totals[~totals.index.duplicated()]
    timings = unique(data, "timing")
    ncases = data.case_hash.nunique()
    fig, axes = new_figure(
        1,
        len(timings),
        "Time per stage of one decode step",
        caption(data, runs),
        panel=(max(3.4, 0.55 * ncases + 1.2), 3.0),
    )
    budget = budget_name(data)
    points = []
    for j, timing in enumerate(timings):
        ax = axes[0, j]
        panel = select(data, timing=timing)
        order = (
            (
                panel.drop_duplicates("case_hash")
                .assign(rank=lambda d: d.family.map(family_rank))
                .sort_values(["rank", "method", "budget", "ctx", "batch"], na_position="first")
            )
            if {"ctx", "batch"} <= set(panel.columns)
            else panel.drop_duplicates("case_hash")
        )
        labels = []
        for x, case in enumerate(order.itertuples(index=False)):
            rows = panel[panel.case_hash == case.case_hash].set_index("stage").value
            bottom = 0.0
            for k, stage in enumerate(stage_names):
                if stage not in rows.index:
                    continue
                height = float(rows.loc[[stage]].median())
                ax.bar(x, height, bottom=bottom, width=0.7, color=palette(k % 10), label=stage)
                points.append(
                    {
                        "timing": timing,
                        "case": x,
                        "series": case.series,
                        "budget": case.budget,
                        "ctx": getattr(case, "ctx", None),
                        "batch": getattr(case, "batch", None),
                        "stage": stage,
                        "stage_us": height,
                        "bottom_us": bottom,
                    }
                )
                bottom += height
            if case.case_hash in totals.index:
                ax.plot(
                    [x],
                    [totals.loc[case.case_hash]],
                    marker="_",
                    markersize=14,
                    color="black",
                    linestyle="",
                    label="measured total",
                )
            label = case.series
            if not pd.isna(case.budget):
                label += f"\n{budget}={int(case.budget)}"
            if not pd.isna(getattr(case, "ctx", np.nan)):
                label += f"\n{format_size(int(case.ctx))} B={int(case.batch)}"
            labels.append(label)
        ax.set_xticks(range(len(labels)), labels, fontsize=7)
        ax.grid(axis="x", visible=False)
        ax.set_title(panel_title(timing=timing))
        ax.set_ylabel("time per decode step (µs)")
    figure_legend(fig, axes.flat, "stage")
    return Rendered(fig, pd.DataFrame(points))
