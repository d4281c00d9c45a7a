"""Reading a result folder: a missing folder, an empty one and a corrupt part are one-line
errors of pareto, report and plot, not an empty answer or a traceback."""

from __future__ import annotations

import pytest
from test_pareto import DENSE_RATES, ENV, MODEL, _accuracy, _kernel
from typer.testing import CliRunner

from santa_bench.cli import app
from santa_bench.results import ResultStore


def _invoke(*args: str):
    return CliRunner().invoke(app, [*args])


@pytest.fixture()
def store(tmp_path) -> ResultStore:
    """Dense and santa-prop scored, santa-prop timed: a store pareto reads."""
    store = ResultStore(tmp_path / "results")
    acc = store.start_run({**ENV, "command": "santa-bench accuracy ruler"}, "acc")
    _accuracy(acc, "dense", {}, DENSE_RATES, seed=1)
    _accuracy(acc, "santa-prop", {"S": 128}, DENSE_RATES, seed=1)
    kern = store.start_run({**ENV, "command": "santa-bench kernel"}, "kern")
    for batch in (1, 8):
        _kernel(kern, "santa-prop", {"S": 128}, batch, 20.0, 1.5)
    return store


def _one_line_error(result, code: int = 2) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    text = result.output.strip()
    assert text.startswith("error: ") and len(text.splitlines()) == 1, text
    return text


@pytest.mark.parametrize("command", [["report"], ["report", "--matrix"], ["plot"],
                                     ["pareto", "--model", MODEL]])
def test_a_results_folder_that_does_not_exist_is_refused(tmp_path, command):
    missing = tmp_path / "nowhere"
    text = _one_line_error(_invoke(*command, "--results", str(missing)))
    assert f"--results {missing}: no such folder" in text
    assert not missing.exists()


def test_pareto_on_an_empty_folder_is_one_line(tmp_path):
    text = _one_line_error(_invoke("pareto", "--model", MODEL, "--results", str(tmp_path)))
    assert "no result rows" in text


def test_a_corrupt_part_stops_pareto_unless_skipped_and_then_named(store, tmp_path):
    bad = store.root / "acc" / "part-deadbeefdeadbeef.parquet"
    bad.write_bytes(b"PAR1 truncated")
    args = ("pareto", "--model", MODEL, "--results", str(store.root))
    text = _one_line_error(_invoke(*args))
    assert f"unreadable result part {bad}" in text and "--skip-corrupt" in text
    skipped = _invoke(*args, "--skip-corrupt")
    assert skipped.exit_code == 0, skipped.output
    assert f"- Left out, unreadable (`--skip-corrupt`): `{bad}`" in skipped.output
    out = tmp_path / "plots" / "pareto"
    written = _invoke(*args, "--skip-corrupt", "--out", str(out))
    assert written.exit_code == 0 and f"left out, unreadable: {bad}" in written.output
    assert str(bad) in (tmp_path / "plots" / "pareto.md").read_text()
