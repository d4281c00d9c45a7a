"""Paper-style figures and anchor tables from the result store (`santa-bench plot`).

Each figure preset reads the tidy rows of `ResultStore.load` and returns a `Rendered`
(the matplotlib Figure and the plotted points as a DataFrame); `save` writes PNG, PDF and
the points' CSV. One module a figure (latency, speedup, error, scores, accuracy_latency,
kv_reads, stage_times), the anchor tables in tables (their anchor numbers read from
santa_bench/data/anchors.yaml), one look for all in style, the rows' selection and
labels in rows. A preset whose rows are absent raises `NoData` carrying the command that
would produce them.
"""

from santa_bench.plots.accuracy_latency import pareto
from santa_bench.plots.command import DEFAULT_OUT, plot_command
from santa_bench.plots.error import error_vs_S
from santa_bench.plots.kv_reads import reads
from santa_bench.plots.latency import latency_vs_ctx
from santa_bench.plots.output import Rendered, save, save_tables
from santa_bench.plots.presets import FIGURES, PRESETS, PRODUCERS, PlotReport, plot_all, render
from santa_bench.plots.rows import NoData, caption
from santa_bench.plots.score_tables import dense_by_task, table_model, uninformative_tasks
from santa_bench.plots.scores import ruler_vs_budget
from santa_bench.plots.speedup import speedup_vs_S
from santa_bench.plots.stage_times import stages
from santa_bench.plots.style import method_colour
from santa_bench.plots.tables import Tables, render_tables

__all__ = [
    "DEFAULT_OUT",
    "FIGURES",
    "PRESETS",
    "PRODUCERS",
    "NoData",
    "PlotReport",
    "Rendered",
    "Tables",
    "caption",
    "dense_by_task",
    "error_vs_S",
    "latency_vs_ctx",
    "method_colour",
    "pareto",
    "plot_all",
    "plot_command",
    "reads",
    "render",
    "render_tables",
    "ruler_vs_budget",
    "save",
    "save_tables",
    "speedup_vs_S",
    "stages",
    "table_model",
    "uninformative_tasks",
]
