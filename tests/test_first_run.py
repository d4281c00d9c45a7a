"""What a newcomer meets on a first run: default plot output and nested stores, missing
extras, failed runs' exit status, unwritable stores, dropped cases, bad options, output
to a pipe, stored results on a rerun, undefined retention, CPU timing, the test cache."""

from __future__ import annotations

import os
from pathlib import Path

from typer.testing import CliRunner

from santa_bench.cli import app
from santa_bench.results import ResultStore

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--cpu-budget", "0.01"]
FIDELITY = ["accuracy", "fidelity", "--patterns", "uniform", "--methods", "santa-prop",
            "--S", "16", "--ctx", "256", "--seeds", "2", "--heads", "2", "--kv-heads", "1",
            "--head-dim", "16"]
ENV = {"device": "cuda", "gpu_name": "NVIDIA Test GPU", "torch": "2.13.0", "triton": "3.6.0",
       "date": "2026-01-02T03:04:05+00:00", "command": "santa-bench kernel ..."}
SHAPE = {"kind": "kernel", "ctx": 8192, "batch": 1, "timing": "graph", "heads": 32,
         "kv_heads": 8, "head_dim": 128, "dtype": "bf16", "l2": "cold"}
runner = CliRunner()


def _invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def _text(result) -> str:
    return " ".join(result.output.split())


def _write_speedup_run(root: Path, run_id: str = "kernels-a", date: str = ENV["date"]) -> None:
    """A store at ``root`` with one run: a dense baseline and one sampled case."""
    run = ResultStore(root).start_run({**ENV, "date": date}, run_id=run_id)
    run.write_case({"method": "sdpa-cudnn", "family": "baseline", **SHAPE},
                   [{"metric": "latency", "value": 10.0, "unit": "us"}])
    run.write_case({"method": "santa-prop", "family": "santa", "S": 64, "tile": 64, **SHAPE}, [
        {"metric": "latency", "value": 5.0, "unit": "us"},
        {"metric": "speedup_vs_best_dense", "value": 2.0, "unit": "x", "ci_low": 1.9,
         "ci_high": 2.1, "best_dense": "sdpa-cudnn"}])


# --------------------------------------------------------------------- 6: test cache
def test_tests_use_a_temporary_cache_not_the_users(tmp_path_factory):
    from santa_bench.accuracy import datasets
    from santa_bench.accuracy.models import cache_dir

    home = Path(os.path.expanduser("~/.cache")).resolve()
    assert home not in cache_dir().resolve().parents
    assert tmp_path_factory.getbasetemp().resolve() in cache_dir().resolve().parents
    assert "SANTA_BENCH_DATA" not in os.environ
    assert datasets.data_dir() == cache_dir() / "data"
