"""One look for every figure: family hues, method colours, axes, legends and captions.

A fixed colour per method (`method_colour`: the `plot` style each method's family module
declares in the method registry, else a stable shade of its family's hue), dashed dense
baselines, units on every axis and one legend below the panels.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.colors import to_hex, to_rgb
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator

from santa_bench.units import format_size

DPI = 150
DENSE_FAMILIES = ("dense", "baseline")
FAMILY_ORDER = ("dense", "baseline", "santa", "santapp", "bernoulli", "oracle")
FAMILY_COLOURS = {
    "dense": "#000000",
    "baseline": "#1f4e99",
    "santa": "#d62728",
    "santapp": "#2ca02c",
    "bernoulli": "#9467bd",
    "oracle": "#7f7f7f",
}
FAMILY_MARKERS = {
    "dense": "s",
    "baseline": "s",
    "santa": "o",
    "santapp": "^",
    "bernoulli": "D",
    "oracle": "x",
}
STYLE: dict[str, Any] = {
    "font.size": 8.5,
    "axes.titlesize": 9,
    "axes.labelsize": 8.5,
    "legend.fontsize": 8,
    "figure.titlesize": 10,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.4,
    "lines.markersize": 4.5,
    "errorbar.capsize": 2,
    "pdf.fonttype": 42,
}


@functools.cache
def _method_styles() -> dict[str, Any]:
    """Method name -> its registered :class:`~santa_bench.methods.PlotStyle`."""
    from santa_bench.methods import REGISTRY

    return {method.name: method.plot for method in REGISTRY}


def method_colour(method: str, family: str | None = None) -> str:
    """Return the fixed colour of `method`: its own (its registered plot style), else a
    stable shade of its family's hue."""
    style = _method_styles().get(method)
    if style is not None and style.colour is not None:
        return style.colour
    amount = (zlib.crc32(method.encode()) % 5 - 2) / 6  # -1/3 .. 1/3: darker or lighter
    return shade(FAMILY_COLOURS.get(family or "", "#7f7f7f"), amount)


def line_style(family: str, method: str | None = None) -> dict[str, Any]:
    """Return plot kwargs (marker, linestyle) that mark a family, or the method's own
    (its registered plot style) where it declares them."""
    dense = family in DENSE_FAMILIES
    style = _method_styles().get(method or "")
    marker = style.marker if style is not None and style.marker else None
    linestyle = style.linestyle if style is not None and style.linestyle else None
    return {"marker": marker or FAMILY_MARKERS.get(family, "o"),
            "linestyle": linestyle or ("--" if dense else "-")}


def family_rank(family: str) -> int:
    """Return the family's place in legends and stacks (unknown families last)."""
    return FAMILY_ORDER.index(family) if family in FAMILY_ORDER else len(FAMILY_ORDER)


def shade(colour: str, amount: float) -> str:
    """Return ``colour`` lighter (``amount`` > 0, towards white) or darker (< 0, to black)."""
    rgb = np.array(to_rgb(colour))
    mixed = rgb + amount * (1.0 - rgb) if amount > 0 else rgb * (1.0 + amount)
    return to_hex(np.clip(mixed, 0, 1))


def styled(render_fn: Callable[..., Any]) -> Callable[..., Any]:
    """Return `render_fn` run under STYLE, so every text and line it makes is styled alike."""

    @functools.wraps(render_fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with mpl.rc_context(STYLE):
            return render_fn(*args, **kwargs)

    return wrapper


def new_figure(nrows: int, ncols: int, title: str, caption: str, panel=(3.4, 2.6), **kw):
    """Return (figure, 2-D axes) with constrained layout and the title + caption on top."""
    width = max(panel[0] * ncols, 6.4)  # wide enough for a five-column legend
    height = panel[1] * nrows + 1.2  # title, caption and the legend below the panels
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    fig.suptitle("\n".join([title, *_wrap(caption, int(width * 12))]))
    return fig, axes


def _wrap(caption: str, width: int) -> list[str]:
    """Return the caption's lines, broken only between its " · " parts, each <= width chars."""
    lines: list[str] = []
    for part in caption.split(" · ") if caption else []:
        if lines and len(lines[-1]) + 3 + len(part) <= width:
            lines[-1] += " · " + part
        else:
            lines.append(part)
    return lines


def label_axes(axes: np.ndarray, xlabel: str, ylabel: str) -> None:
    """Label the x axes of the bottom row and the y axes of the first column only."""
    for ax in axes[-1, :]:
        ax.set_xlabel(xlabel)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)


def figure_legend(fig: Figure, axes: Iterable[Axes], title: str | None = None) -> None:
    """Add one legend (unique labels, first-seen order) outside the panels, below them."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if not label.startswith("_"):
                seen.setdefault(label, handle)
    if seen:
        fig.legend(
            list(seen.values()),
            list(seen),
            loc="outside lower center",
            title=title,
            # long variant labels ("santapp team_size=64 reps=int8") in fewer columns
            ncols=min(len(seen), 5 if max(map(len, seen)) <= 20 else 3),
            frameon=False,
        )


def size_axis(
    ax: Axes, values: Iterable[float], axis: str = "x", base: int = 2, tokens: bool = True
) -> None:
    """Put a log axis with ticks at exactly `values`, labelled 8k / 32k (or 2048 if not tokens)."""
    ticks = sorted({float(v) for v in values if not pd.isna(v)})
    if axis == "x":
        ax.set_xscale("log", base=base)
        target = ax.xaxis
    else:
        ax.set_yscale("log", base=base)
        target = ax.yaxis
    target.set_major_locator(FixedLocator(ticks))
    label = format_size if tokens else str
    target.set_major_formatter(FuncFormatter(lambda v, _pos: label(round(v))))
    target.set_minor_locator(NullLocator())


def log_axis(ax: Axes, axis: str = "y") -> None:
    """Make a base-10 log axis with ticks at 1, 2, 5 x 10^k labelled plainly (no minor labels)."""
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    target.set_minor_formatter(NullFormatter())
