"""Suite files, the sweep command and its executors, on a CPU."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from typer.testing import CliRunner

from conftest import within
from santa_bench import execute
from santa_bench import sweep as sweep_module
from santa_bench.cli import app
from santa_bench.methods import parse_method_specs
from santa_bench.results import ResultStore, config_hash
from santa_bench.runners.kernel import KernelGrid, KernelRunner, expand_cases
from santa_bench.sweep import (
    Expression,
    SuiteError,
    load_suite,
    parse_shard,
    select_only,
    shard,
    suite_from_dict,
)

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "suites" / "smoke-kernel.yaml"
TINY = {"heads": 4, "kv_heads": 2, "head_dim": 16, "device": "cpu"}
runner = CliRunner()


def _invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def _text(result) -> str:
    return " ".join(result.output.split())


def _outcome(*args: str) -> tuple[int, str]:
    """The exit code and output of ``santa-bench *args`` (picklable, for ``within``)."""
    result = _invoke(*args)
    return result.exit_code, _text(result)


def _write(tmp_path: Path, suite: dict, name: str = "suite.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(suite))
    return path


# ------------------------------------------------------------------ expansion
def test_grid_zip_where_expand_to_the_kernel_command_cases():
    suite = suite_from_dict(
        {
            "runner": "kernel",
            "fixed": TINY,
            "grid": {"ctx": [256, 512], "method": ["dense", "santa-prop"]},
            "zip": {"S": [16, 300], "tile": [16, 32]},
            "where": ["S <= ctx"],
        }
    )
    got = [(c["ctx"], c["method"], c.get("S"), c.get("tile")) for c in suite.cases]
    assert got == [
        (256, "dense", None, None),
        (256, "santa-prop", 16, 16),
        (512, "dense", None, None),
        (512, "santa-prop", 16, 16),
        (512, "santa-prop", 300, 32),
    ]
    # the same cases as `santa-bench kernel` expands (so the config hashes agree)
    grid = KernelGrid(methods=parse_method_specs("dense,santa-prop:tile=16"), ctx=[256, 512],
                      batch=[1], S=[16], heads=4, kv_heads=2, head_dim=16, device="cpu")
    assert {config_hash(c) for c in expand_cases(grid)} == {
        config_hash(c) for c in suite.cases if c.get("S") != 300
    }


def test_smoke_suite_matches_kernel_command_hashes():
    suite = load_suite(SMOKE)
    grid = KernelGrid(
        methods=parse_method_specs("dense,santa-iid,santa-sys,santa-flash,santa-prop"),
        ctx=[256, 512], batch=[1], S=[16, 32], heads=4, kv_heads=2, head_dim=16, device="cpu",
    )
    assert [config_hash(c) for c in suite.cases] == [config_hash(c) for c in expand_cases(grid)]


def test_h200_suite_hashes_are_the_committed_results():
    suite = load_suite(ROOT / "suites" / "kernel-latency-vs-ctx.yaml")
    # the suite's runs (other runs share the store)
    runs = ["2026-11-29-h200-kernels-graph", "2026-11-29-h200-kernels-events"]
    committed = set(ResultStore(ROOT / "results" / "h200").load(runs)["case_hash"])
    assert {config_hash(c) for c in suite.cases} == committed


def test_ratio_budgets_and_sizes():
    suite = suite_from_dict(
        {
            "runner": "kernel",
            "fixed": {**TINY, "method": "santa-sys", "layout": "paged", "page_size": 16},
            "grid": {"ctx": ["32k", "1k", 1000, 256], "S": ["0.4%", "0.01%"]},
            "where": "ctx % page_size == 0",
        }
    )
    got = [(c["ctx"], c["S"]) for c in suite.cases]
    assert got == [(32768, 131), (32768, 3), (1024, 4), (1024, 1), (256, 1)]
    assert {c["page_size"] for c in suite.cases} == {16}


def test_method_parameters_apply_to_the_methods_that_have_them():
    suite = suite_from_dict(
        {"runner": "kernel", "fixed": {**TINY, "ctx": 256, "S": 16},
         "grid": {"method": ["dense", "bernoulli", "santa-prop:tile=32"], "draws": [1, 2],
                  "tile": [16, 64]}}
    )
    got = [(c["method"], c.get("draws"), c.get("tile")) for c in suite.cases]
    # dense once; bernoulli per (draws, tile); the spec's tile wins over the axis
    assert got == [("dense", None, None), ("bernoulli", 1, 16), ("bernoulli", 1, 64),
                   ("bernoulli", 2, 16), ("bernoulli", 2, 64), ("santa-prop", None, 32)]


@pytest.mark.parametrize(
    ("suite", "where", "message"),
    [
        ({"runner": "kernel", "fixed": {"method": "dense"}, "grid": {"ctxx": [256]}},
         "grid.ctxx", "unknown key for runner 'kernel'; did you mean 'ctx'?"),
        ({"runner": "kernel", "grid": {"method": ["dense", "santa-magic"]}},
         "grid.method[1]", "unknown method 'santa-magic'"),
        ({"runner": "kernel", "fixed": {"method": "santa-prop:T=3"}},
         "fixed.method", "unknown parameter(s) ['T']"),
        ({"runner": "kernel", "fixed": {"method": "dense"}, "grid": {"draws": [1, 2]}},
         "grid.draws", "no method of this suite has a parameter 'draws'"),
        ({"runner": "kernel", "fixed": {"method": "santa-prop"}, "grid": {"alloc": ["round"]}},
         "grid.alloc", "alloc must be one of"),
        ({"runner": "kernel", "fixed": {"method": "dense"}, "methods": ["dense"]},
         "methods", "unknown top-level key"),
        ({"runner": "kernl", "fixed": {"method": "dense"}}, "runner", "expected one of kernel"),
        ({"runner": "kernel", "fixed": {"method": "dense"}, "where": ["S <= ctxx"]},
         "where[0]", "unknown name(s) ['ctxx']"),
        ({"runner": "kernel", "fixed": {"method": "dense"}, "where": "__import__('os')"},
         "where[0]", "Call is not allowed"),
        ({"runner": "kernel", "fixed": {"method": "dense"}, "zip": {"ctx": [1, 2], "S": [1]}},
         "zip", "tied axes need equal lengths"),
        ({"runner": "kernel", "fixed": {"method": "dense", "ctx": [256, 512]}},
         "fixed.ctx", "a fixed key takes one value"),
        ({"runner": "kernel", "fixed": {"method": "dense", "ctx": "4q"}}, "fixed.ctx",
         "not a size"),
        ({"runner": "kernel", "fixed": {"method": "santa-sys"}, "grid": {"S": ["200%"]}},
         "grid.S", "a ratio budget must be in"),
        ({"runner": "kernel", "fixed": {"method": "dense", "ctx": 256},
          "grid": {"ctx": [512]}}, "grid.ctx", "also given in fixed.ctx"),
        ({"runner": "kernel", "fixed": {"method": "dense"}, "options": {"cpu_budgt": 1}},
         "options.cpu_budgt", "unknown option"),
        ({"runner": "kernel", "fixed": {"method": "dense", "heads": 6, "kv_heads": 4}},
         "case", "heads 6 is not a multiple of kv_heads 4"),
        ({"runner": "kernel", "fixed": {"method": "santa-pp"}}, "fixed.method",
         "unknown method 'santa-pp'"),
        ({"runner": "kernel", "fixed": {"method": "santa-flash:gather=compact"}},
         "fixed.method", "santa-flash has one kernel now (one pass with compact V gathers); "
         "drop gather=compact"),
        ({"runner": "kernel", "fixed": {"method": "santa-flash"}, "grid": {"passes": [1, 2]}},
         "grid.passes", "santa-flash has one kernel now (one pass with compact V gathers); "
         "drop passes"),
    ],
)
def test_validation_errors_name_the_file_and_key(tmp_path, suite, where, message):
    path = _write(tmp_path, suite, "bad.yaml")
    with pytest.raises(SuiteError) as caught:
        load_suite(path)
    assert str(caught.value).startswith(f"{path}: {where}")
    assert message in str(caught.value)
    result = _invoke("sweep", path, "--dry-run", "--results", tmp_path / "r")
    assert result.exit_code == 2 and message in _text(result)


def test_where_is_evaluated_without_eval():
    expression = Expression.parse("S <= ctx and method not in ['dense'] or ctx % 2 == 1")
    assert expression({"S": 16, "ctx": 256, "method": "santa-prop"})
    assert not expression({"S": 16, "ctx": 256, "method": "dense"})
    assert expression({"ctx": 256}) and not expression({"ctx": 256}, missing=False)
    for bad in ("ctx.__class__", "open('x')", "[c for c in ctx]", "lambda: 1"):
        with pytest.raises(ValueError, match="not allowed"):
            Expression.parse(bad)


def test_every_suite_file_validates_and_planned_runners_say_so(tmp_path):
    files = sorted((ROOT / "suites").glob("*.yaml"))
    assert len(files) >= 8
    for path in files:
        suite = load_suite(path)
        assert suite.cases, path
        if not suite.implemented:
            result = _invoke("sweep", path, "--results", tmp_path)
            assert result.exit_code == 2
            assert f"runner {suite.runner} not implemented yet" in _text(result)
    assert not list(tmp_path.glob("*/part-*"))


# ------------------------------------------------------------------ selection
def test_dry_run_prints_the_cases_and_runs_nothing(tmp_path):
    result = _invoke("sweep", SMOKE, "--dry-run", "--results", tmp_path)
    assert result.exit_code == 0
    text = _text(result)
    assert "smoke-kernel (kernel): 18 of 18 cases" in text
    for case in load_suite(SMOKE).cases:
        assert config_hash(case) in text
    assert not list(tmp_path.glob("*"))


def test_a_huge_grid_is_refused_quickly_with_its_count(tmp_path):
    grid = {"ctx": list(range(256, 1256)), "S": list(range(1, 1001))}
    path = _write(tmp_path, {"runner": "kernel", "fixed": {**TINY, "method": "santa-prop"},
                             "grid": grid})
    code, text = within(30, lambda: _outcome("sweep", path, "--dry-run", "--results", tmp_path))
    assert code == 2
    assert "grid: 1,000,000 combinations of grid and zip values exceed the limit of 100,000" in text
    assert "--max-cases" in text
    result = _invoke("sweep", SMOKE, "--dry-run", "--max-cases", "19", "--results", tmp_path)
    assert result.exit_code == 2 and "20 combinations" in _text(result)


def test_a_long_expansion_is_announced_and_a_dry_run_lists_its_first_cases(tmp_path,
                                                                         monkeypatch):
    monkeypatch.setattr(sweep_module, "ANNOUNCE_FROM", 20)
    monkeypatch.setattr(sweep_module, "DRY_RUN_ROWS", 5)
    from santa_bench import cli

    monkeypatch.setattr(cli.console, "width", 200)  # the caption on one line, whatever ran before
    result = _invoke("sweep", SMOKE, "--dry-run", "--results", tmp_path)
    assert result.exit_code == 0
    text = _text(result)
    assert text.index("expanding 20 combinations") < text.index("18 of 18 cases")
    assert "the first 5 listed; --only or --shard lists others" in text
    hashes = [config_hash(c) for c in load_suite(SMOKE).cases]
    assert all(h in text for h in hashes[:5]) and not any(h in text for h in hashes[5:])


def test_a_huge_kernel_grid_is_refused_before_it_is_expanded(tmp_path):
    contexts = ",".join(str(c) for c in range(256, 1256))
    budgets = ",".join(str(s) for s in range(1, 1001))
    code, text = within(30, lambda: _outcome(
        "kernel", "--methods", "dense,santa-prop", "--baselines", "none", "--ctx", contexts,
        "--S", budgets, "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
        "--device", "cpu", "--results", tmp_path / "r"))
    assert code == 2 and "1,001,000 cases" in text and "exceed the limit of 100,000" in text
    assert not (tmp_path / "r").exists()


def test_shards_partition_the_suite_and_only_filters():
    cases = load_suite(SMOKE).cases
    hashes = [config_hash(c) for c in cases]
    for count in (1, 2, 3, 5):
        parts = [[config_hash(c) for c in shard(cases, i, count)] for i in range(count)]
        assert sorted(h for p in parts for h in p) == sorted(hashes)
        assert sum(map(len, parts)) == len(hashes)  # disjoint
    assert parse_shard("1/3") == (1, 3)
    for bad in ("3/3", "1", "-1/2", "a/b"):
        with pytest.raises(SuiteError, match="--shard"):
            parse_shard(bad)
    assert {c["method"] for c in select_only(cases, "dense,santa-prop")} == {"dense", "santa-prop"}
    picked = select_only(cases, "ctx == 512 and S <= 16")
    assert [(c["method"], c["S"]) for c in picked] == [
        ("santa-iid", 16), ("santa-sys", 16), ("santa-flash", 16), ("santa-prop", 16)]
    with pytest.raises(SuiteError, match="unknown name"):
        select_only(cases, "ctxx == 1")
    result = _invoke("sweep", SMOKE, "--dry-run", "--shard", "1/4", "--only", "dense",
                     "--results", "unused")
    assert "smoke-kernel (kernel): 1 of 18 cases" in _text(result)  # dense@512 is case 9


# ------------------------------------------------------------------ running
def test_devices_cpu_cpu_runs_two_workers_and_rows_carry_device_ids(tmp_path):
    result = _invoke("sweep", SMOKE, "--devices", "cpu,cpu", "--only", "ctx == 256",
                     "--results", tmp_path)
    assert result.exit_code == 0, result.output
    frame = ResultStore(tmp_path).load()
    assert frame["case_hash"].nunique() == 9 and set(frame["status"]) == {"ok"}
    assert set(frame["device_id"]) <= {"cpu:0", "cpu:1"}
    assert frame.groupby("case_hash")["device_id"].nunique().max() == 1
    assert len(list(tmp_path.glob("*/run.json"))) == 1
    again = _invoke("sweep", SMOKE, "--devices", "cpu,cpu", "--results", tmp_path)
    assert "9 of 18 cases already" in _text(again)
    assert ResultStore(tmp_path).load()["case_hash"].nunique() == 18


def test_a_failing_case_becomes_a_failed_row_and_the_sweep_goes_on(tmp_path, monkeypatch):
    real = KernelRunner.run

    def flaky(self, case):
        if case["method"] == "santa-flash":
            raise RuntimeError("kernel exploded")
        if case["method"] == "santa-iid":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9 GiB")
        return real(self, case)

    monkeypatch.setattr(KernelRunner, "run", flaky)
    result = _invoke("sweep", SMOKE, "--only", "ctx == 256", "--results", tmp_path)
    assert result.exit_code == 1, result.output  # the rows of the others are written
    assert "9 cases: 5 ran, 4 failed" in _text(result)
    assert "4 of 9 cases failed" in _text(result)
    frame = ResultStore(tmp_path).load()
    failed = frame[frame.status == "failed"].set_index("method")["reason"]
    assert set(failed.index) == {"santa-flash", "santa-iid"}
    assert (failed["santa-flash"] == "RuntimeError: kernel exploded").all()
    assert failed["santa-iid"].str.startswith("out of memory: CUDA out of memory").all()
    assert set(frame[frame.status == "ok"]["method"]) == {"dense", "santa-sys", "santa-prop"}
    monkeypatch.setattr(KernelRunner, "run", real)  # failed cases are retried on re-run
    again = _invoke("sweep", SMOKE, "--only", "ctx == 256", "--results", tmp_path)
    assert again.exit_code == 0 and "5 of 9 cases already" in _text(again)
    assert set(ResultStore(tmp_path).load()["status"]) == {"ok"}


def test_the_stored_command_reproduces_the_case(tmp_path):
    result = _invoke("sweep", SMOKE, "--only", "ctx == 512 and method in ['dense', 'santa-prop']",
                     "--results", tmp_path / "sweep")
    assert result.exit_code == 0, result.output
    frame = ResultStore(tmp_path / "sweep").load().drop_duplicates("case_hash")
    assert len(frame) == 3
    for number, (case_hash, command) in enumerate(zip(frame.case_hash, frame.command,
                                                      strict=True)):
        args = shlex.split(command)
        assert args[:2] == ["santa-bench", "kernel"]
        out = tmp_path / f"again{number}"
        rerun = _invoke(*args[1:], "--results", out, "--cpu-budget", "0.01")
        assert rerun.exit_code == 0, rerun.output
        again = ResultStore(out).load()
        assert set(again["case_hash"]) == {case_hash}
        assert set(again["command"]) == {command}


def test_kill_mid_sweep_then_resume(tmp_path):
    suite = yaml.safe_load(SMOKE.read_text())
    suite["options"] = {"cpu_budget": 0.3}
    suite["grid"]["ctx"] = [256]
    path = _write(tmp_path, suite)
    total = len(load_suite(path).cases)
    exe = shutil.which("santa-bench")
    command = [exe] if exe else [sys.executable, "-m", "santa_bench"]
    args = [*command, "sweep", str(path), "--results", str(tmp_path / "r")]
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 120
    while not list(tmp_path.glob("r/*/part-*.parquet")) and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = {p.name for p in tmp_path.glob("r/*/part-*.parquet")}
    assert 1 <= len(done_before) < total
    before = ResultStore(tmp_path / "r").load()

    out = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(done_before)} of {total} cases already" in " ".join(out.stdout.split())
    after = ResultStore(tmp_path / "r").load()
    assert after["case_hash"].nunique() == total
    assert not after.duplicated(["case_hash", "metric"]).any()
    kept = after[after.case_hash.isin(before.case_hash)]
    pd.testing.assert_frame_equal(
        before.sort_values(["case_hash", "metric"]).reset_index(drop=True)[before.columns],
        kept.sort_values(["case_hash", "metric"]).reset_index(drop=True)[before.columns],
    )


def test_bad_executor_requests_are_clear(tmp_path, monkeypatch):
    for args, message in (
        (["--devices", "0,x"], "--devices: expected GPU indices or 'cpu'"),
        (["--executor", "slurm"], "--executor: expected one of"),
        (["--devices", "cpu", "--executor", "ray"], "not with --executor ray"),
    ):
        result = _invoke("sweep", SMOKE, "--results", tmp_path, *args)
        assert result.exit_code == 2 and message in _text(result), result.output
    if not torch.cuda.is_available():
        result = _invoke("sweep", SMOKE, "--results", tmp_path, "--devices", "0")
        assert result.exit_code == 2 and "the cases run on" in _text(result)
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(execute.ExecutorError, match=r"pip install -e '\.\[ray\]'"):
        execute.import_ray()
    result = _invoke("sweep", SMOKE, "--results", tmp_path, "--executor", "ray")
    assert result.exit_code == 2 and "needs Ray: pip install -e '.[ray]'" in _text(result)


def test_ray_executor_runs_a_smoke_suite_on_a_local_cluster(tmp_path):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        result = _invoke("sweep", SMOKE, "--executor", "ray", "--only",
                         "ctx == 256 and method in ['dense', 'santa-prop']",
                         "--results", tmp_path)
    finally:
        ray.shutdown()
    assert result.exit_code == 0, result.output
    frame = ResultStore(tmp_path).load()
    assert frame["case_hash"].nunique() == 3 and set(frame["status"]) == {"ok"}
    assert all(d.startswith("ray:") and d.endswith(":cpu") for d in frame["device_id"])
