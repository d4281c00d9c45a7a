"""The command line end to end on a CPU: help, list, env, kernel, resume after a kill."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from santa_bench.cli import app
from santa_bench.results import ResultStore

SMALL = ["--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--cpu-budget", "0.01"]
runner = CliRunner()


def _invoke(*args: str):
    result = runner.invoke(app, list(args), catch_exceptions=False)
    return result


def test_help_explains_every_kernel_option():
    result = _invoke("kernel", "--help")
    assert result.exit_code == 0
    for option in ("--ctx", "--S", "--batch", "--methods", "--heads", "--kv-heads", "--head-dim",
                   "--dtype", "--layout", "--page-size", "--seed", "--force", "--results"):
        assert option in result.output


def test_list_shows_every_method_and_availability():
    result = _invoke("list")
    assert result.exit_code == 0
    for name in ("dense", "santa-iid", "santa-strat", "santa-sys", "santa-flash", "santa-prop",
                 "bernoulli"):
        assert name in result.output


def test_env_prints_versions():
    result = _invoke("env")
    assert result.exit_code == 0
    assert "torch" in result.output and "fingerprint" in result.output


def test_kernel_writes_tidy_rows_and_resumes(tmp_path: Path):
    args = ["kernel", "--ctx", "256,300", "--S", "16,32", "--results", str(tmp_path), *SMALL]
    first = _invoke(*args)
    assert first.exit_code == 0, first.output
    frame = ResultStore(tmp_path).load()
    # 2 contexts x (dense + 5 samplers x 2 budgets)
    assert frame["case_hash"].nunique() == 2 * (1 + 5 * 2)
    assert set(frame["status"]) == {"ok"}
    latency = frame[frame.metric == "latency"]
    assert set(latency["timing"]) == {"cpu-wall"} and set(latency["unit"]) == {"us"}
    err = frame[(frame.metric == "rel_l2_vs_dense")].set_index("method")["value"]
    assert err["dense"].max() == 0 and err.drop("dense").min() > 0
    reads = frame[frame.metric == "v_read_fraction"]
    assert ((reads.value > 0) & (reads.value <= 1)).all()
    report = _invoke("report", "--results", str(tmp_path))  # CPU rows: no quartiles
    assert report.exit_code == 0 and "timing: cpu-wall" in report.output
    assert "| 300 | 1 | santa-prop S=32 |" in report.output
    matrix = _invoke("report", "--results", str(tmp_path), "--matrix")
    assert matrix.exit_code == 0 and "| 300 | 1 | santa-prop | - |" in matrix.output
    assert "| S=16 | S=32 |" in matrix.output

    again = _invoke(*args)
    assert "22 of 22 cases already" in again.output
    more = _invoke(*[a if a != "16,32" else "16,32,64" for a in args])
    assert "22 of 32 cases already" in more.output
    assert ResultStore(tmp_path).load()["case_hash"].nunique() == 32
    forced = _invoke(*args, "--force")
    assert "already" not in forced.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ctx", "4q"], "not a size"),
        (["--S", "0"], "--S: every value must be > 0"),
        (["--methods", "santa-magic"], "unknown method 'santa-magic'"),
        (["--methods", "santa-prop:T=3"], "unknown parameter(s) ['T']"),
        (["--methods", "santa-prop:alloc=round"], "alloc must be one of"),
        # a default spelled out, or a spec's S and --S's: one stored case asked twice
        (["--methods", "santa-prop:S=128,santa-prop:S=128,stash=fp16"],
         "santa-prop S=128 ctx=4k B=1 is asked twice"),
        (["--methods", "santa-prop:S=128,santa-prop", "--S", "128,256"],
         "santa-prop S=128 ctx=4k B=1 is asked twice"),
        (["--heads", "6", "--kv-heads", "4"], "--heads 6 is not a multiple of --kv-heads 4"),
        (["--layout", "ragged"], "--layout"),
        (["--dtype", "int8"], "--dtype"),
        (["--batch", "0"], "--batch"),
    ],
)
def test_kernel_rejects_bad_input_with_a_clear_message(tmp_path: Path, args, message):
    result = _invoke("kernel", "--results", str(tmp_path), *args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_budget_larger_than_context_is_not_run(tmp_path: Path):
    result = _invoke("kernel", "--ctx", "64", "--S", "128", "--methods", "santa-sys",
                     "--results", str(tmp_path), *SMALL)
    assert result.exit_code == 2 and "no case to run" in result.output


def test_paged_layout_runs(tmp_path: Path):
    result = _invoke("kernel", "--ctx", "200", "--S", "16", "--layout", "paged", "--page-size",
                     "16", "--methods", "dense,santa-prop", "--results", str(tmp_path), *SMALL)
    assert result.exit_code == 0, result.output
    frame = ResultStore(tmp_path).load()
    assert set(frame["layout"]) == {"paged"} and set(frame["page_size"]) == {16}


def test_killed_run_resumes_with_only_the_unfinished_cases(tmp_path: Path):
    exe = shutil.which("santa-bench") or ""
    command = [exe] if exe else [sys.executable, "-m", "santa_bench"]
    args = [*command, "kernel", "--ctx", "256", "--S", "8,16,32,64", "--results", str(tmp_path),
            "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--cpu-budget", "0.4"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "COLUMNS": "200"})
    deadline = time.time() + 120
    while not list(tmp_path.glob("*/part-*.parquet")) and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = {p.name for p in tmp_path.glob("*/part-*.parquet")}
    assert 1 <= len(done_before) < 21
    before = ResultStore(tmp_path).load()

    out = subprocess.run(args, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(done_before)} of 21 cases already" in " ".join(out.stdout.split())
    after = ResultStore(tmp_path).load()
    assert after["case_hash"].nunique() == 21
    assert not after.duplicated(["case_hash", "metric"]).any()
    # the rows finished before the kill are intact
    kept = after[after.case_hash.isin(before.case_hash)]
    pd.testing.assert_frame_equal(
        before.sort_values(["case_hash", "metric"]).reset_index(drop=True)[before.columns],
        kept.sort_values(["case_hash", "metric"]).reset_index(drop=True)[before.columns],
    )


@pytest.mark.parametrize(("spec", "why", "drop"), [
    # santa-flash's kernel option before it had one kernel
    ("santa-flash:S=16,gather=compact", "santa-flash has one kernel now", "drop gather=compact"),
    # SANTA++'s top teams taken exactly (no gain on RULER, a slower kernel)
    ("santapp:M=2,top=2", "santapp takes no teams exactly", "drop top=2"),
])
def test_retired_options_fail_in_one_line(tmp_path, spec, why, drop):
    """A method option that was removed fails before any case runs, in one line naming
    why and what to drop."""
    result = runner.invoke(app, ["kernel", "--device", "cpu", "--ctx", "64", "--batch", "1",
                                 "--methods", spec, "--results", str(tmp_path), "--run-id", "r"])
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert why in lines[0] and drop in lines[0]
    assert not (tmp_path / "r").exists()
