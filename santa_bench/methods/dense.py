"""Family ``dense``: exact attention, the ground truth every sampled method is scored against.

End-to-end decode runs it on the dense backends (``--dense-backends``), not through
``e2e_backend``.
"""

from __future__ import annotations

from santa_bench.methods._common import value_reference
from santa_bench.methods._core import Method, PlotStyle, register


@register
def dense() -> Method:
    return Method(
        "dense",
        "dense",
        "exact softmax(qK^T)V (the ground truth)",
        reference=value_reference("dense"),
        plot=PlotStyle(colour="#000000"),
    )
