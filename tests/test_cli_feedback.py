"""What the command line says back: one-line errors instead of tracebacks, inputs it
refuses instead of running something else, and feedback on interrupted, partly failed,
downloading and long runs (run ids, budgets, --methods, --dense-layers, captured K/V,
Ctrl-C, rows written, agreement's store, RULER's download, plot's progress, the install
line)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from santa_bench import results
from santa_bench.cli import app
from santa_bench.results import ResultStore

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--ctx", "256", "--S", "16", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
         "--cpu-budget", "0.01"]
FIDELITY = ["accuracy", "fidelity", "--patterns", "uniform", "--methods", "santa-prop",
            "--S", "16", "--ctx", "256", "--seeds", "2", "--heads", "2", "--kv-heads", "1",
            "--head-dim", "16"]
runner = CliRunner()


def _invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def _one_error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    return lines[0]


# ------------------------------------------------------------------------ run ids
@pytest.mark.parametrize("run_id", ["../escape", "/tmp/absolute", "two\nlines", "*", ".hidden",
                                    "-dash", ""])
def test_a_run_id_that_is_no_plain_folder_name_is_one_line_error(tmp_path, run_id):
    result = _invoke("kernel", "--methods", "dense", "--run-id", run_id,
                     "--results", str(tmp_path / "r"), *SMALL)
    assert result.exit_code == 2
    assert "--run-id" in _one_error_line(result)
    assert not (tmp_path / "r").exists() and not (tmp_path / "escape").exists()


def test_run_ids_are_checked_in_one_place_for_reading_too(tmp_path):
    name = "kernels-2026-12-06-h100.full_2"
    assert results.check_run_id(name) == name
    with pytest.raises(ValueError, match="run id"):
        ResultStore(tmp_path).start_run({"device": "cpu"}, run_id="a/b")
    with pytest.raises(ValueError, match="run id"):
        ResultStore(tmp_path).load(["*"])
    ResultStore(tmp_path).start_run({"device": "cpu"}, run_id="kept")
    result = _invoke("report", "--results", str(tmp_path), "--run", "*")
    assert result.exit_code == 2 and "expected letters, digits" in _one_error_line(result)


def test_committed_run_ids_are_valid():
    for run in (ROOT / "results").glob("**/run.json"):
        results.check_run_id(run.parent.name)


# ------------------------------------------------------------ capture, unknown model
def test_capture_of_a_model_that_cannot_load_is_one_line_error(tmp_path, monkeypatch):
    import santa_bench.accuracy.models as models

    def missing(name, **kwargs):
        raise OSError(f"{name} is not a local folder and is not a valid model identifier\n"
                      "more detail")

    monkeypatch.setattr(models, "load_model", missing)
    result = _invoke("capture", "--model", "no-such/model", "--out", str(tmp_path / "c"))
    assert result.exit_code == 2
    assert "--model no-such/model: cannot load it" in _one_error_line(result)


# --------------------------------------------------------------- refused inputs
def test_empty_methods_are_refused_not_replaced_by_the_defaults(tmp_path):
    result = _invoke("kernel", "--methods", "", "--results", str(tmp_path), *SMALL)
    assert result.exit_code == 2 and "no method named" in _one_error_line(result)
    assert not list(tmp_path.glob("*/part-*"))


@pytest.mark.parametrize(("option", "value"), [
    ("--cpu-budget", "-1"), ("--cpu-budget", "nan"), ("--cpu-budget", "inf"),
    ("--cpu-budget", "0"), ("--gpu-budget-ms", "-5"), ("--gpu-budget-ms", "nan")])
def test_budgets_must_be_finite_and_positive(tmp_path, option, value):
    result = _invoke("kernel", "--methods", "dense", "--results", str(tmp_path), *SMALL,
                     option, value)
    assert result.exit_code == 2 and option in _one_error_line(result)


@pytest.mark.parametrize("option", ["--batch", "--heads", "--kv-heads", "--head-dim"])
def test_fidelity_shape_options_must_be_positive(tmp_path, option):
    result = _invoke(*FIDELITY, option, "0", "--results", str(tmp_path))
    assert result.exit_code == 2 and f"{option}: must be > 0" in _one_error_line(result)
    assert not tmp_path.exists() or not list(tmp_path.iterdir())


@pytest.mark.parametrize("budget", [float("nan"), float("inf"), -1.0])
def test_a_suite_budget_must_be_finite_and_positive(tmp_path, budget):
    import yaml

    from santa_bench.sweep import SuiteError, load_suite

    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"runner": "kernel", "fixed": {"method": "dense"},
                                    "options": {"gpu_budget_ms": budget}}))
    with pytest.raises(SuiteError, match=r"options\.gpu_budget_ms: expected a finite number > 0"):
        load_suite(path)


def test_dense_layers_beyond_the_model_are_refused(tmp_path):
    for layers, said in (("999", "smollm2-135m has layers 0..29, got 999"),
                         ("0,x", "expected layer indices")):
        result = _invoke("accuracy", "mmlu", "--dense-layers", layers, "--n", "2",
                         "--results", str(tmp_path))
        assert result.exit_code == 2 and said in _one_error_line(result)


def test_gsm8k_needs_tokens_to_generate(tmp_path):
    result = _invoke("accuracy", "gsm8k", "--max-new-tokens", "0", "--results", str(tmp_path))
    assert result.exit_code == 2 and "max_new_tokens: must be > 0" in _one_error_line(result)


def test_dense_layers_of_a_model_known_once_loaded_fail_the_case():
    from santa_bench.runners.tasks import check_dense_layers, parse_dense_layers

    assert parse_dense_layers(" 0, 2,") == (0, 2)
    check_dense_layers((0, 1), 2, "tiny")
    with pytest.raises(ValueError, match=r"tiny has layers 0\.\.1, got 2"):
        check_dense_layers((2,), 2, "tiny")


def test_a_capture_whose_k_and_v_lengths_differ_is_refused(tmp_path):
    from santa_bench.capture import LayerCapture, save_capture

    gen = torch.Generator().manual_seed(0)
    layer = LayerCapture(3, torch.randn(2, 4, 16, generator=gen),
                         torch.randn(64, 2, 16, generator=gen),
                         torch.randn(48, 2, 16, generator=gen), scale=0.25)
    path = save_capture(tmp_path / "cap.safetensors", [layer], model="tiny", text="t")
    result = _invoke("kernel", "--inputs", str(path), "--methods", "dense", "--S", "16",
                     "--cpu-budget", "0.01", "--results", str(tmp_path / "r"))
    assert result.exit_code == 2
    assert "layer 3 holds K [64, 2, 16] and V [48, 2, 16]" in _one_error_line(result)
    from santa_bench.capture import read_layer

    with pytest.raises(ValueError, match="holds K"):  # fidelity --inputs reads layers so
        read_layer(path, 3)


# ------------------------------------------------------------ failed and interrupted runs
def test_a_run_where_some_cases_failed_exits_non_zero_after_writing_the_rest(tmp_path,
                                                                              monkeypatch):
    from santa_bench.runners.kernel import KernelRunner

    works = KernelRunner.run

    def half_broken(self, case):
        if case["method"] == "santa-prop":
            raise RuntimeError("broken kernel")
        return works(self, case)

    monkeypatch.setattr(KernelRunner, "run", half_broken)
    result = _invoke("kernel", "--methods", "dense,santa-prop", "--results", str(tmp_path),
                     *SMALL)
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert "1 of 2 cases failed" in text and "a rerun of the same command retries them" in text
    assert set(ResultStore(tmp_path).load().method) == {"dense", "santa-prop"}


def test_ctrl_c_says_what_was_kept_and_that_a_rerun_resumes(tmp_path, monkeypatch):
    from santa_bench.runners.kernel import KernelRunner

    works = KernelRunner.run

    def interrupted(self, case):
        if case["method"] == "santa-prop":
            raise KeyboardInterrupt
        return works(self, case)

    monkeypatch.setattr(KernelRunner, "run", interrupted)
    args = ["kernel", "--methods", "dense,santa-prop", "--results", str(tmp_path), *SMALL]
    result = _invoke(*args)
    assert result.exit_code == 130
    text = " ".join(result.output.split())
    run = next(tmp_path.iterdir())
    assert f"the rows of 1 finished case(s) are written to {run}, 1 case(s) not run" in text
    assert "rerun the same command to resume" in text
    monkeypatch.setattr(KernelRunner, "run", works)
    again = _invoke(*args)
    assert again.exit_code == 0 and "1 of 2 cases already in" in again.output


def test_ctrl_c_before_any_case_ran_says_nothing_was_written(tmp_path, monkeypatch):
    from santa_bench import environment

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(environment, "environment_fingerprint", interrupted)
    result = _invoke("kernel", "--methods", "dense", "--results", str(tmp_path), *SMALL)
    assert result.exit_code == 130 and "nothing written" in result.output


# ------------------------------------------------------------------ accuracy feedback
def test_accuracy_commands_say_where_their_rows_went(tmp_path):
    result = _invoke(*FIDELITY, "--results", str(tmp_path), "--run-id", "fid")
    assert result.exit_code == 0, result.output
    assert f"rows written to {tmp_path / 'fid'}" in " ".join(result.output.split())


def test_agreement_writes_its_rows_to_the_store(tmp_path, monkeypatch):
    import santa_bench.accuracy.agreement as agreement_mod
    import santa_bench.accuracy.models as models

    class Tokens:
        def __call__(self, text, return_tensors):
            return type("Encoded", (), {"input_ids": torch.arange(20).unsqueeze(0)})()

    monkeypatch.setattr(models, "load_model", lambda name: (object(), Tokens()))
    monkeypatch.setattr(agreement_mod, "agreement", lambda model, ids, spec, **kw: {
        "top1_agreement": 0.75, "kl_vs_dense": 0.01, "kv_read_fraction": 0.5, "steps": 9,
        "reference": None})
    text = tmp_path / "text.txt"
    text.write_text("some text")
    result = _invoke("accuracy", "agreement", "--text", str(text), "--model", "tiny/model",
                     "--methods", "santa-prop:S=16", "--results", str(tmp_path / "r"),
                     "--run-id", "agree")
    assert result.exit_code == 0, result.output
    assert f"rows written to {tmp_path / 'r' / 'agree'}" in " ".join(result.output.split())
    rows = ResultStore(tmp_path / "r").load(["agree"])
    assert dict(zip(rows.metric, rows.value, strict=True)) == {
        "top1_agreement": 0.75, "kl_vs_dense": 0.01, "kv_read_fraction": 0.5}
    assert set(rows.kind) == {"agreement"} and set(rows.S) == {16}


def test_ruler_data_download_is_announced_with_its_size_and_place(tmp_path, monkeypatch):
    import santa_bench.accuracy.ruler as ruler

    events: list[str] = []
    monkeypatch.setenv("SANTA_BENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SANTA_BENCH_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(ruler, "_download", lambda *args: events.append("download"))
    ruler.fetch_ruler_data(announce=events.append)
    assert len(events) == 2 and events[1] == "download"
    assert "about 19 MB" in events[0] and str(tmp_path / "cache" / "data" / "ruler") in events[0]


def test_a_catalog_model_download_is_announced(tmp_path, monkeypatch):
    from santa_bench.accuracy.models import download_notice

    monkeypatch.setenv("SANTA_BENCH_CACHE", str(tmp_path))
    notice = download_notice("smollm2-135m")
    assert notice is not None and "about 93 MB" in notice
    assert str(tmp_path / "models" / "smollm2-135m") in notice
    assert download_notice("some/hub-model") is None


# ------------------------------------------------------------------------ plot progress
def test_plot_announces_each_preset_as_it_starts(tmp_path):
    from santa_bench.plots.presets import PRESETS, plot_all

    said: list[str] = []
    empty = ResultStore(tmp_path / "none").load()
    plot_all(empty, [], list(PRESETS), tmp_path, announce=said.append)
    assert said == [f"[{i}/{len(PRESETS)}] {name} ..." for i, name in enumerate(PRESETS, 1)]


# ------------------------------------------------------------------------ install line
def _readme_install() -> str:
    block = re.search(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S)
    assert block is not None
    return block.group(1).split(" && santa-bench")[0]


def _extras(line: str) -> set[str]:
    found = re.search(r"pip install -e '\.\[([^\]]*)\]'", line)
    assert found is not None, line
    return set(found.group(1).split(","))


def test_the_install_line_of_readme_and_ci_is_one_and_installs_what_the_quick_start_uses():
    install = _readme_install()
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.startswith("pip install")]
    assert ci == [install]
    quick = (ROOT / "README.md").read_text().split("## Quick start", 1)[1].split("```", 2)[1]
    needed = {"dev"}
    for line in quick.splitlines():
        words = shlex.split(line.split("#")[0])
        if words[:2] in (["santa-bench", "accuracy"], ["santa-bench", "capture"]):
            needed.add("accuracy")
        if "--executor" in words and words[words.index("--executor") + 1] == "ray":
            needed.add("ray")
    assert "accuracy" in _extras(install)
    assert needed <= _extras(install)
