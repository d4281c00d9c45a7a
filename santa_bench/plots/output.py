"""Writing what the presets render: each figure as PNG, PDF and the CSV of its points;
the anchor tables as Markdown, LaTeX and one CSV a table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import matplotlib as mpl
import pandas as pd
from matplotlib.figure import Figure

from santa_bench.plots.style import DPI, STYLE

if TYPE_CHECKING:
    from santa_bench.plots.tables import Tables


class Rendered(NamedTuple):
    """A rendered figure and the points it plots (written as CSV beside it)."""

    figure: Figure
    points: pd.DataFrame


def save(rendered: Rendered, out: Path, name: str) -> list[Path]:
    """Write `<out>/<name>.png`, `.pdf` and `.csv` (the plotted points); return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf", out / f"{name}.csv"]
    with mpl.rc_context(STYLE):
        rendered.figure.savefig(paths[0], dpi=DPI, metadata={"Software": None})
        rendered.figure.savefig(paths[1], metadata={"CreationDate": None, "Creator": None})
    rendered.points.to_csv(paths[2], index=False, float_format="%.6g")
    return paths


def save_tables(tables: Tables, out: Path) -> list[Path]:
    """Write tables.md, tables.tex and one CSV per table; return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "tables.md", out / "tables.tex"]
    paths[0].write_text(tables.markdown)
    paths[1].write_text("% needs \\usepackage{booktabs}\n" + tables.latex + "\n")
    for key, table in tables.frames.items():
        path = out / f"tables-{key}.csv"
        table.to_csv(path, index=False)
        paths.append(path)
    return paths
