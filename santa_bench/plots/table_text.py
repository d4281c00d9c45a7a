"""The anchor tables as text: cells, Markdown and LaTeX (booktabs)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

_TEX = {
    "&": r"\&",
    "%": r"\%",
    "_": r"\_",
    "#": r"\#",
    "×": r"$\times$",
    "µ": r"$\mu$",
    "–": "--",
    "²": r"$^2$",
    "'": "'",
}


def fmt(value: float | None, spec: str = ".1f", suffix: str = "") -> str:
    """Return `value` formatted, or "–" when missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:{spec}}{suffix}"


def markdown(table: pd.DataFrame) -> str:
    """Return `table` as a Markdown pipe table."""
    lines = ["| " + " | ".join(map(str, table.columns)) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)


def _tex(text: Any) -> str:
    return "".join(_TEX.get(ch, ch) for ch in str(text))


def latex(table: pd.DataFrame, title: str, note: str, key: str) -> str:
    """Return `table` as a LaTeX table captioned "title. note", labelled tab:anchor-<key>."""
    head = " & ".join(_tex(c) for c in table.columns) + r" \\"
    body = [" & ".join(_tex(v) for v in row) + r" \\" for row in table.itertuples(index=False)]
    return "\n".join(
        [
            r"\begin{table}[t]",
            r"\centering\small",
            rf"\caption{{{_tex(title)}. {_tex(note)}}}",
            rf"\label{{tab:anchor-{key}}}",
            r"\begin{tabular}{" + "l" * len(table.columns) + "}",
            r"\toprule",
            head,
            r"\midrule",
            *body,
            r"\bottomrule",
            r"\end{tabular}",
            r"\end{table}",
        ]
    )
