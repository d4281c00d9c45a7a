"""What a newcomer meets on a first run: default plot output and nested stores, missing
extras, failed runs' exit status, unwritable stores, dropped cases, bad options, output
to a pipe, stored results on a rerun, undefined retention, CPU timing, the test cache."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from santa_bench import cli_options
from santa_bench.cli import app
from santa_bench.execute import Outcome
from santa_bench.results import ResultStore
from santa_bench.stores import StoreSet, discover

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


# ------------------------------------------------------------------ 1: plot's defaults
def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True)
    return done.stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_plot_with_no_arguments_reads_nested_stores_and_keeps_git_clean(tmp_path, monkeypatch):
    """A checkout with committed figures under plots/ and a committed store one folder
    deeper (results/h200/): `santa-bench plot` finds the runs and leaves git status clean."""
    repo = tmp_path / "clone"
    (repo / "plots").mkdir(parents=True)
    shutil.copy(ROOT / ".gitignore", repo / ".gitignore")
    (repo / "plots" / "speedup-vs-S.png").write_bytes(b"committed figure")
    _write_speedup_run(repo / "results" / "h200")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "clone")
    monkeypatch.chdir(repo)
    result = _invoke("plot")
    assert result.exit_code == 0, result.output
    assert "speedup-vs-S: no data" not in result.output
    assert (repo / "plots" / "local" / "speedup-vs-S.png").stat().st_size > 0
    assert (repo / "plots" / "speedup-vs-S.png").read_bytes() == b"committed figure"
    assert _git(repo, "status", "--porcelain") == ""


def test_store_set_reads_local_runs_and_nested_stores(tmp_path):
    _write_speedup_run(tmp_path / "h200", "kernels-a", "2026-01-01T00:00:00+00:00")
    _write_speedup_run(tmp_path / "cpu" / "deeper", "kernels-b", "2026-01-03T00:00:00+00:00")
    _write_speedup_run(tmp_path, "20260105-local", "2026-01-05T00:00:00+00:00")
    assert discover(tmp_path) == [tmp_path, tmp_path / "cpu" / "deeper", tmp_path / "h200"]
    stores = StoreSet(tmp_path)
    frame = stores.load()
    assert set(frame.run_id) == {"kernels-a", "kernels-b", "20260105-local"}
    assert set(stores.newest_per_case(frame).run_id) == {"20260105-local"}
    assert set(stores.load(["kernels-a", "kernels-b"]).run_id) == {"kernels-a", "kernels-b"}
    with pytest.raises(ValueError, match="unknown runs"):
        stores.load(["nope"])
    report = _invoke("report", "--results", str(tmp_path), "--run", "kernels-b")
    assert report.exit_code == 0 and "santa-prop" in report.output


# ------------------------------------------------ 2: missing extra, every case failed
def test_accuracy_without_the_extra_stops_at_once_with_the_install_line(tmp_path, monkeypatch):
    import santa_bench.accuracy.ruler as ruler

    def no_download(*args, **kwargs):
        raise AssertionError("RULER data fetched although the model cannot load")

    monkeypatch.setitem(sys.modules, "gguf", None)  # not importable
    monkeypatch.setattr(ruler, "fetch_ruler_data", no_download)
    result = _invoke("accuracy", "ruler", "--results", str(tmp_path / "r"))
    assert result.exit_code == 2
    assert "gguf>=0.10" in result.output and "pip install -e '.[accuracy]'" in _text(result)
    mmlu = _invoke("accuracy", "mmlu", "--model", str(tmp_path / "model.gguf"), "--data-dir",
                   str(tmp_path), "--results", str(tmp_path / "r"))
    assert mmlu.exit_code == 2 and "pip install -e '.[accuracy]'" in _text(mmlu)
    assert not (tmp_path / "r").exists()  # no run started


def test_accuracy_run_whose_every_case_fails_exits_non_zero(tmp_path):
    result = _invoke("accuracy", "mmlu", "--model", str(tmp_path / "no-model"), "--n", "2",
                     "--data-dir", str(tmp_path / "no-data"), "--results", str(tmp_path / "r"))
    assert result.exit_code == 1, result.output
    assert "2 failed" in result.output and "every case failed" in result.output


def test_kernel_run_whose_every_case_fails_exits_non_zero(tmp_path, monkeypatch):
    from santa_bench.runners.kernel import KernelRunner

    def broken(self, case):
        raise RuntimeError("broken kernel")

    monkeypatch.setattr(KernelRunner, "run", broken)
    result = _invoke("kernel", "--ctx", "256", "--S", "16", "--methods", "dense,santa-prop",
                     "--results", str(tmp_path), *SMALL)
    assert result.exit_code == 1 and "every case failed" in result.output


# ------------------------------------------------------------ 3: unwritable results
def test_results_folder_that_is_not_a_folder_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    target = blocker / "results"
    result = _invoke("kernel", "--ctx", "256", "--S", "16", "--methods", "dense",
                     "--results", str(target), *SMALL)
    assert result.exit_code == 2
    assert f"--results {target}: cannot write results there" in _text(result)
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", [["kernel", "--ctx", "256", "--S", "16", "--methods",
                                      "dense", *SMALL], FIDELITY])
def test_read_only_results_folder_is_one_line(tmp_path, monkeypatch, command):
    def read_only(self, env, run_id=None):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self.root))

    monkeypatch.setattr(ResultStore, "start_run", read_only)
    result = _invoke(*command, "--results", str(tmp_path / "ro"))
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if "error:" in line]
    assert len(lines) == 1
    assert f"{tmp_path / 'ro'}" in lines[0] and "Read-only file system" in lines[0]


def test_plot_into_a_folder_that_cannot_be_written_is_one_line(tmp_path):
    _write_speedup_run(tmp_path / "store")
    (tmp_path / "file").write_text("not a folder")
    out = tmp_path / "file" / "plots"
    result = runner.invoke(app, ["plot", "speedup-vs-S", "--results", str(tmp_path / "store"),
                                 "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert not isinstance(result.exception, OSError)
    assert f"--out {out}: cannot write there" in _text(result)


def test_sweep_into_a_read_only_folder_is_one_line(tmp_path, monkeypatch):
    def read_only(self, env, run_id=None):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self.root))

    monkeypatch.setattr(ResultStore, "start_run", read_only)
    result = _invoke("sweep", str(ROOT / "suites" / "smoke-kernel.yaml"), "--only", "dense",
                     "--results", str(tmp_path / "ro"))
    assert result.exit_code == 2 and "Read-only file system" in result.output


# ------------------------------------------------------ 4: dropped cases, bad options
def test_cases_dropped_for_a_budget_above_the_context_are_named(tmp_path):
    result = _invoke("kernel", "--ctx", "1", "--results", str(tmp_path), *SMALL)
    assert result.exit_code == 0, result.output
    text = _text(result)
    assert "5 case(s) dropped" in text and "S=128 > ctx=1" in text
    assert "santa-prop" in text.split("dropped")[1]


def test_kernel_help_shows_no_option_of_one_method_family():
    import typer.main

    from santa_bench.methods import REGISTRY
    from santa_bench.runners.schema import KERNEL

    command = typer.main.get_command(app).commands["kernel"]
    shown = {name.lstrip("-").replace("-", "_") for p in command.params
             if p.param_type_name == "option" and not p.hidden for name in p.opts}
    assert {"S", "batch", "methods"} <= shown
    families = {}
    for method in REGISTRY:
        for param in method.params:
            families.setdefault(param.name, set()).add(method.family)
    # a case key of the runner (the layout's page_size) is no method's option
    one_family = {name for name in shown
                  if len(families.get(name, ())) == 1 and name not in KERNEL.kinds()}
    assert not one_family, f"kernel options of one method family: {sorted(one_family)}"
    help_text = _text(_invoke("kernel", "--help"))
    assert "--team-size" not in help_text and "--M " not in help_text


def test_kernel_sweeps_a_method_parameter_through_its_spec(tmp_path):
    result = _invoke("kernel", "--ctx", "256", "--methods", "santapp:M=2|4,team_size=16",
                     "--results", str(tmp_path), *SMALL)
    assert result.exit_code == 0, result.output
    rows = ResultStore(tmp_path).load()
    assert sorted(rows.loc[rows.metric == "latency", "M"].astype(int)) == [2, 4]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--S", "abc"], "--S: expected an integer, got 'abc'"),
        (["--batch", "1,x"], "--batch: expected an integer, got 'x'"),
        (["--M", "32,64"], "--M is gone: give it in the method spec, --methods "
                           "'santapp:M=32|64'"),
        (["--team-size", "16"], "--team-size is gone: give it in the method spec, --methods "
                                "'santapp:team_size=16'"),
        (["--team-policy", "kmeans"], "--team-policy is gone: give it in the method spec, "
                                      "--methods 'santapp:policy=kmeans'"),
        (["--ctx", "4q"], "--ctx: not a size"),
        (["--head-dim", "7"], "--head-dim: must be a multiple of 8 and at least 16"),
        (["--head-dim", "12"], "--head-dim: must be a multiple of 8"),
    ],
)
def test_bad_kernel_options_are_named(tmp_path, args, message):
    result = _invoke("kernel", "--results", str(tmp_path), *args)
    assert result.exit_code == 2, result.output
    assert message in _text(result)
    assert not any(tmp_path.iterdir())


def test_bad_fidelity_budget_is_named(tmp_path):
    result = _invoke("accuracy", "fidelity", "--S", "16,abc", "--results", str(tmp_path))
    assert result.exit_code == 2 and "--S: expected an integer, got 'abc'" in _text(result)


# ------------------------------------------------------------ 5: output and tables
def test_tables_are_not_cut_when_output_goes_to_a_pipe(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    done = subprocess.run(
        [sys.executable, "-m", "santa_bench", "kernel", "--ctx", "256", "--S", "16",
         "--batch", "64", "--results", str(tmp_path), *SMALL],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    table = [line for line in done.stdout.splitlines() if line.startswith(" santa-prop S=")]
    assert table and "…" not in done.stdout
    assert all(line.rstrip().endswith("%") for line in table)  # through the KV read cell


def test_make_console_is_wide_off_a_terminal(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert cli_options.make_console().width == cli_options.PIPE_WIDTH
    monkeypatch.setenv("COLUMNS", "123")
    assert cli_options.make_console().width == 123


def test_rerun_that_skips_every_case_prints_the_stored_results(tmp_path):
    args = ["kernel", "--ctx", "256", "--S", "16", "--methods", "dense,santa-prop",
            "--results", str(tmp_path), *SMALL]
    assert _invoke(*args).exit_code == 0
    again = _invoke(*args)
    assert again.exit_code == 0 and "2 of 2 cases already" in again.output
    assert "kernel summary" in again.output
    assert any("santa-prop" in line and "16" in line for line in again.output.splitlines())
    fidelity = [*FIDELITY, "--results", str(tmp_path / "f")]
    assert _invoke(*fidelity).exit_code == 0
    stored = _invoke(*fidelity)
    assert "already" in stored.output and "fidelity vs dense" in stored.output


def test_retention_against_a_dense_score_of_zero_is_undefined(monkeypatch):
    from rich.console import Console

    from santa_bench.accuracy import cli as accuracy_cli

    monkeypatch.setattr(accuracy_cli, "console", Console(width=200))  # no folded cells

    case = {"task": "mmlu", "method": "santa-prop", "S": 16}
    rows = [
        {"metric": "score", "value": 0.0, "ci_low": -2.7755575615628914e-17, "ci_high": 0.43},
        {"metric": "retention", "value": float("nan"), "ci_low": float("nan"),
         "ci_high": float("nan")},
        {"metric": "decode_kv_read_fraction", "value": 0.25},
    ]
    outcome = Outcome(total=1, skipped=0, results=[(case, rows)])
    with accuracy_cli.console.capture() as captured:
        accuracy_cli._task_table(outcome, "mmlu", keys=("method", "S"))
    text = captured.get()
    assert "undefined: dense scored 0" in text
    assert "nan" not in text and "-0.000" not in text
    assert "0.000 [0.000, 0.430]" in text


# ----------------------------------------------------------------- 8: CPU timings
def test_cpu_kernel_summary_says_times_are_not_kernel_speed(tmp_path):
    result = _invoke("kernel", "--ctx", "256", "--S", "16", "--methods", "dense,santa-prop",
                     "--results", str(tmp_path), *SMALL)
    assert result.exit_code == 0
    assert "not kernel speed" in _text(result) and "CPU wall" not in result.output


# --------------------------------------------------------------------- 6: test cache
def test_tests_use_a_temporary_cache_not_the_users(tmp_path_factory):
    from santa_bench.accuracy import datasets
    from santa_bench.accuracy.models import cache_dir

    home = Path(os.path.expanduser("~/.cache")).resolve()
    assert home not in cache_dir().resolve().parents
    assert tmp_path_factory.getbasetemp().resolve() in cache_dir().resolve().parents
    assert "SANTA_BENCH_DATA" not in os.environ
    assert datasets.data_dir() == cache_dir() / "data"
