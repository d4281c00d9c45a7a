"""A store holding kernel rows of two GPUs: speed is never joined across them (pareto,
report), accuracy rows may come from either (and the verdict says which)."""

from __future__ import annotations

import pytest
from test_pareto import DENSE_RATES, ENV, MODEL, _accuracy, _kernel
from typer.testing import CliRunner

from santa_bench import pareto
from santa_bench.cli import app
from santa_bench.results import ResultStore
from santa_bench.stores import StoreSet

H200 = ENV
H100 = {**ENV, "gpu_name": "NVIDIA H100 80GB HBM3", "date": "2026-12-06T10:00:00+00:00"}
# santa-prop's speedup per GPU and batch: dense wins on the H200 at B=1, not on the H100
SPEEDUP = {"NVIDIA H200": {1: 0.96, 8: 1.6}, "NVIDIA H100 80GB HBM3": {1: 1.08, 8: 1.3}}
DENSE_US = {"NVIDIA H200": {1: 30.0, 8: 150.0}, "NVIDIA H100 80GB HBM3": {1: 27.0, 8: 160.0}}
MODE = {"timing": "graph", "l2": "cold"}


def _invoke(*args: str):
    return CliRunner().invoke(app, [*args])


@pytest.fixture()
def two_gpus(tmp_path):
    """Accuracy runs on both GPUs (dense and santa-prop on the H200, santapp on the H100),
    kernel runs on both (the H100's newer)."""
    results = ResultStore(tmp_path / "results")
    acc = results.start_run({**H200, "command": "santa-bench accuracy ruler"}, "acc-h200")
    _accuracy(acc, "dense", {}, DENSE_RATES, seed=1)
    _accuracy(acc, "santa-prop", {"S": 128}, DENSE_RATES, seed=1)
    acc100 = results.start_run({**H100, "command": "santa-bench accuracy ruler"}, "acc-h100")
    _accuracy(acc100, "santapp", {"M": 32}, DENSE_RATES, seed=1)
    for env, run_id in ((H200, "kern-h200"), (H100, "kern-h100")):
        kern = results.start_run({**env, "command": "santa-bench kernel"}, run_id)
        for batch, dense_us in DENSE_US[env["gpu_name"]].items():
            speed = SPEEDUP[env["gpu_name"]][batch]
            _kernel(kern, "santa-prop", {"S": 128, **MODE}, batch, dense_us / speed, speed)
            _kernel(kern, "sdpa-cudnn", {"family": "baseline", **MODE}, batch, dense_us, 1.0)
    return tmp_path / "results"


def test_pareto_gives_one_verdict_per_gpu_of_the_kernel_rows(two_gpus):
    result = _invoke("pareto", "--model", MODEL, "--results", str(two_gpus))
    assert result.exit_code == 0, result.output
    assert "on any GPU" not in result.output
    sections = result.output.split("# Speed and accuracy: ")[1:]
    assert [s.splitlines()[0] for s in sections] == [
        f"{MODEL} at 32k on NVIDIA H100 80GB HBM3", f"{MODEL} at 32k on NVIDIA H200"]
    for section, gpu, kernel_run in zip(sections, ("NVIDIA H100 80GB HBM3", "NVIDIA H200"),
                                        ("kern-h100", "kern-h200"), strict=True):
        speed = SPEEDUP[gpu]
        assert f"- Speed (kernel rows): {gpu}\n" in section
        assert "- Accuracy rows from: NVIDIA H100 80GB HBM3, NVIDIA H200\n" in section
        assert f"- Kernel runs: {kernel_run}\n" in section
        line = next(row for row in section.splitlines() if row.startswith("| `santa-prop"))
        assert f"{speed[1]:.2f}x" in line and f"{speed[8]:.2f}x" in line


def test_a_verdict_of_one_gpu_joins_only_its_kernel_rows(two_gpus):
    store = StoreSet(two_gpus)
    frame, runs = store.load(), store.runs()
    with pytest.raises(pareto.ParetoError, match="--gpu NAME"):
        pareto.verdict(frame, runs, MODEL)
    result = pareto.verdict(frame, runs, MODEL, gpu="NVIDIA H200")
    assert result.gpu == "NVIDIA H200" and result.kernel_runs == ["kern-h200"]
    assert result.accuracy_gpus == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    prop = next(p for p in result.points if p.config == "santa-prop:S=128")
    assert {b: t.speedup for b, t in prop.timings.items()} == SPEEDUP["NVIDIA H200"]
    assert result.fastest("all", 1).timings[1].low < 1.0  # dense wins on the H200 at B=1
    one = _invoke("pareto", "--model", MODEL, "--results", str(two_gpus),
                  "--gpu", "NVIDIA H100 80GB HBM3")
    assert one.exit_code == 0 and one.output.count("# Speed and accuracy") == 1


def test_pareto_out_writes_a_verdict_per_gpu(two_gpus, tmp_path):
    out = tmp_path / "plots" / "pareto"
    result = _invoke("pareto", "--model", MODEL, "--results", str(two_gpus), "--out", str(out))
    assert result.exit_code == 0, result.output
    for slug, gpu in (("nvidia-h100-80gb-hbm3", "NVIDIA H100 80GB HBM3"),
                      ("nvidia-h200", "NVIDIA H200")):
        md = (tmp_path / "plots" / f"pareto-{slug}.md").read_text()
        assert md.startswith(f"# Speed and accuracy: {MODEL} at 32k on {gpu}\n")


@pytest.mark.parametrize("command", ["pareto", "report"])
def test_a_gpu_without_rows_is_refused_naming_the_gpus_present(two_gpus, command):
    args = ["--model", MODEL] if command == "pareto" else []
    result = _invoke(command, *args, "--results", str(two_gpus), "--gpu", "RTX 9090")
    assert result.exit_code == 2
    assert "--gpu 'RTX 9090': no rows of that GPU" in result.output
    assert "'NVIDIA H100 80GB HBM3', 'NVIDIA H200'" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_report_names_each_rows_gpu_and_keeps_tables_apart(two_gpus):
    table = _invoke("report", "--results", str(two_gpus))
    assert table.exit_code == 0, table.output
    lines = [line for line in table.output.splitlines() if line.startswith("| 32k")]
    assert len(lines) == 8
    assert all(line.endswith((" | NVIDIA H200 | kern-h200 |",
                              " | NVIDIA H100 80GB HBM3 | kern-h100 |")) for line in lines)
    titles = [line for line in table.output.splitlines() if line.startswith("**")]
    assert titles == ["**GPU: NVIDIA H100 80GB HBM3, timing: graph, L2: cold**",
                      "**GPU: NVIDIA H200, timing: graph, L2: cold**"]
    one = _invoke("report", "--results", str(two_gpus), "--gpu", "NVIDIA H200")
    assert one.exit_code == 0 and "H100" not in one.output


def test_report_matrix_takes_best_dense_within_one_gpu(two_gpus):
    matrix = _invoke("report", "--results", str(two_gpus), "--matrix")
    assert matrix.exit_code == 0, matrix.output
    text = matrix.output
    h100, h200 = text.split("**GPU: NVIDIA H200")
    assert "| 32k | 1 | santa-prop | sdpa-cudnn 27.0 us | 25.0 us, 1.08x |" in h100
    assert "| 32k | 1 | santa-prop | sdpa-cudnn 30.0 us | 31.2 us, 0.96x |" in h200
