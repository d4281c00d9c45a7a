"""The safe expression evaluator of suite `where`, `sweep --only` and `plot --where`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from conftest import within
from santa_bench.cli import app
from santa_bench.expressions import Expression, ExpressionError, frame_mask
from santa_bench.results import ResultStore

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "suites" / "smoke-kernel.yaml"
HUGE = ("9**9**9**9", "10**10**7", "2**40 * 2**40", "0.5 ** -1000", "'a' * 10**12")


def _invoke(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize("huge", HUGE)
def test_values_beyond_the_bounds_are_refused(huge):
    expression = Expression.parse(f"S == {huge}")

    def message() -> str:
        try:
            return f"evaluated to {expression({'S': 1})}"
        except ExpressionError as exc:
            return str(exc)

    assert "is refused" in within(5, message)
    assert Expression.parse("S == 2**64 == 2**32 * 2**32 and -2**64 < 0")({"S": 2**64})
    assert Expression.parse("S < 2**64 * 1.5 and ctx % 2 == 0")({"S": 3, "ctx": 4})


@pytest.mark.parametrize(
    ("text", "refused"),
    [("S << 9", "LShift"), ("S.real", "Attribute"), ("abs(S)", "Call"), ("S[0]", "Subscript"),
     ("S @ S", "@"), ("@S", "@ references"), ("lambda: 1", "Lambda"),
     ("[s for s in S]", "ListComp"), ("'%0999999d' % S == ''", None),
     pytest.param("not " * 100000 + "S", "nested too deeply", id="deep")],
)
def test_only_the_documented_syntax_parses(text, refused):
    if refused is None:  # parses; string formatting is refused when evaluated
        with pytest.raises(ExpressionError, match="% takes numbers"):
            Expression.parse(text)({"S": 1})
        return
    with pytest.raises(ExpressionError, match=refused):
        Expression.parse(text)


def test_frame_rows_match_pandas_query_on_the_documented_syntax():
    """Columns with missing values (NaN, None) compare as in pandas: unequal to all."""
    frame = pd.DataFrame({
        "batch": [1, 8, 1, np.nan], "timing": ["graph", "events", "graph", None],
        "gather": [None, "compact", "compact", "x"], "run_id": ["a", "s14f", "s14f", "a"],
        "S": [64.0, np.nan, 128.0, 64.0],
    })
    for text in ("batch == 1 and timing == 'graph'", "timing in ['graph', 'events']",
                 "not (run_id == 's14f' and gather == 'compact')", "gather != 'compact'",
                 "S <= 64 or batch > 1", "run_id not in ['a'] and not S >= 100", "S * 2 == 128"):
        assert list(frame_mask(Expression.parse(text), frame)) == list(
            frame.eval(text, engine="python")
        ), text
    with pytest.raises(ExpressionError, match=r"unknown column\(s\) \['gpu'\]"):
        frame_mask(Expression.parse("gpu == 'h100'"), frame)


# ------------------------------------------------------------ through the commands
def test_a_huge_power_is_refused_quickly_in_sweep_only(tmp_path):
    code, text = within(30, lambda: _invoke("sweep", SMOKE, "--dry-run", "--only",
                                            "S == 9**9**9**9", "--results", tmp_path))
    assert code == 2 and "--only" in text and "a power above 2**64 is refused" in text


@pytest.mark.parametrize("huge", ["9**9**9**9", "10**10**7"])
def test_a_huge_power_is_refused_quickly_in_a_suite_where(tmp_path, huge):
    suite = SMOKE.read_text().replace("  - S <= ctx", f"  - ctx == {huge}")
    (tmp_path / "huge.yaml").write_text(suite)
    code, text = within(30, lambda: _invoke("sweep", tmp_path / "huge.yaml", "--dry-run",
                                            "--results", tmp_path))
    assert code == 2 and "where[0]" in text and "a power above 2**64 is refused" in text


def test_a_huge_power_is_refused_quickly_in_plot_where(tmp_path):
    store = ResultStore(tmp_path / "store")
    run = store.start_run({"device": "cpu", "command": "santa-bench kernel"}, run_id="r")
    run.write_case({"kind": "kernel", "method": "dense", "family": "dense", "ctx": 256,
                    "batch": 1}, [{"metric": "latency", "value": 1.0, "unit": "us"}])
    code, text = within(30, lambda: _invoke("plot", "--results", store.root, "--where",
                                            "batch == 10**10**7", "--out", tmp_path / "p"))
    assert code == 2 and "--where" in text and "a power above 2**64 is refused" in text
    assert not (tmp_path / "p").exists()
