"""`santa-bench kernel --inputs`: kernel cases on a model's captured q, K, V.

The capture file is written here in the capture format (save_capture) from known
tensors, so every batch element, cut and tile can be checked against them.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

import santa_kernels as sk
from santa_bench import cli
from santa_bench.capture import LayerCapture, save_capture
from santa_bench.captured import describe_capture, make_captured_inputs
from santa_bench.methods import parse_method_specs
from santa_bench.results import ResultStore, config_hash
from santa_bench.runners.kernel import KernelGrid, expand_cases, group_key

pytest.importorskip("safetensors")

ROOT = Path(__file__).resolve().parents[1]
LAYERS = (3, 7)
N, HQ, HKV, D, P = 96, 4, 2, 16, 2
LABEL = "captured:tiny:L3,7"
runner = CliRunner()


def _layer(layer: int, n: int = N, hq: int = HQ, hkv: int = HKV, d: int = D) -> LayerCapture:
    gen = torch.Generator().manual_seed(layer)
    key = torch.randn(n, hkv, d, generator=gen)
    key[:4] *= 4  # heavy first keys: the softmax mass sits on a few sinks
    return LayerCapture(layer, torch.randn(P, hq, d, generator=gen) * 2, key,
                        torch.randn(n, hkv, d, generator=gen), scale=0.5 * d**-0.5)


@pytest.fixture()
def capture_file(tmp_path) -> Path:
    return save_capture(tmp_path / "cap.safetensors", [_layer(x) for x in LAYERS],
                        model="tiny", text="ruler-haystack")


def _invoke(*args: str):
    return runner.invoke(cli.app, list(args), catch_exceptions=False)


def test_batch_elements_cycle_the_layers_with_the_last_query(capture_file):
    q, kv = make_captured_inputs(capture_file, batch=3, ctx=N, dtype=torch.float32)
    assert q.shape == (3, HQ, D) and kv.k.shape == (3, N, HKV, D)
    for b, layer in enumerate((3, 7, 3)):  # three elements of two layers: the first again
        c = _layer(layer)
        # the layer's scale becomes the default 1/sqrt(d): q scaled by scale * sqrt(d)
        torch.testing.assert_close(q[b], c.query[-1] * 0.5)
        torch.testing.assert_close(kv.k[b], c.key)
        torch.testing.assert_close(kv.v[b], c.value)
    assert kv.k[0].data_ptr() != kv.k[2].data_ptr()
    # the captured layer's own attention of its last position
    c = _layer(7)
    logits = torch.einsum("hd,nhd->hn", c.query[-1], c.key.repeat_interleave(HQ // HKV, 1))
    expected = torch.einsum("hn,nhd->hd", (logits * c.scale).softmax(-1),
                            c.value.repeat_interleave(HQ // HKV, 1))
    torch.testing.assert_close(sk.dense_attention(q, kv).out[1].float(), expected,
                               atol=1e-5, rtol=1e-4)


def test_a_longer_context_tiles_and_a_shorter_one_cuts(capture_file):
    _, long = make_captured_inputs(capture_file, batch=1, ctx=2 * N + 10, dtype=torch.float32)
    k = _layer(3).key
    assert long.k.shape[1] == 2 * N + 10
    torch.testing.assert_close(long.k[0, N:2 * N], k)
    torch.testing.assert_close(long.k[0, 2 * N:], k[:10])
    _, short = make_captured_inputs(capture_file, batch=1, ctx=40, dtype=torch.float32)
    torch.testing.assert_close(short.k[0], k[:40])
    # a paged cache holds the same attention
    q, paged = make_captured_inputs(capture_file, batch=2, ctx=50, layout="paged", page_size=16,
                                    dtype=torch.float32, seed=1)
    _, flat = make_captured_inputs(capture_file, batch=2, ctx=50, dtype=torch.float32)
    assert paged.layout == "paged"
    torch.testing.assert_close(sk.dense_attention(q, paged).out, sk.dense_attention(q, flat).out)


def test_kernel_runs_on_the_capture_records_inputs_and_resumes(capture_file, tmp_path):
    results = tmp_path / "res"
    args = ["kernel", "--inputs", str(capture_file), "--ctx", "64,96,200", "--batch", "1,3",
            "--S", "16", "--methods", "dense,santa-prop", "--device", "cpu",
            "--cpu-budget", "0.01", "--results", str(results)]
    done = _invoke(*args)
    assert done.exit_code == 0, done.output
    frame = ResultStore(results).load()
    assert frame.case_hash.nunique() == 3 * 2 * 2 and set(frame.status) == {"ok"}
    assert set(frame.inputs) == {LABEL}
    assert set(frame.inputs_digest) == {describe_capture(capture_file).digest}
    assert (set(frame.heads), set(frame.kv_heads), set(frame.head_dim)) == ({HQ}, {HKV}, {D})
    tiled = frame.groupby("ctx").inputs_tiled.agg(set).to_dict()
    assert tiled == {64: {False}, 96: {False}, 200: {True}}
    dense_error = frame[(frame.method == "dense") & (frame.metric == "rel_l2_vs_dense")].value
    assert (dense_error < 1e-6).all()
    # santa-prop on real (peaked) attention: an error, but a bounded one
    prop_error = frame[(frame.method == "santa-prop") & (frame.metric == "rel_l2_vs_dense")]
    assert prop_error.value.between(0, 2).all()
    assert frame.command.str.contains(f"--inputs {capture_file}", regex=False).all()
    # the stored command reproduces its case
    part = frame[frame.method == "santa-prop"].iloc[0]
    again = _invoke(*shlex.split(part.command)[1:], "--results", str(results))
    assert again.exit_code == 0 and "1 of 1 cases already in" in again.output
    resumed = _invoke(*args)
    assert "12 of 12 cases already in" in resumed.output


def test_the_context_defaults_to_the_captured_length(capture_file, tmp_path):
    done = _invoke("kernel", "--inputs", str(capture_file), "--methods", "dense", "--device",
                   "cpu", "--cpu-budget", "0.01", "--results", str(tmp_path))
    assert done.exit_code == 0, done.output
    frame = ResultStore(tmp_path).load()
    assert set(frame.ctx) == {N} and set(frame.inputs_tiled) == {False}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--heads", "32"], "--heads 32: the capture"),
        (["--kv-heads", "8"], "--kv-heads 8: the capture"),
    ],
)
def test_a_shape_that_contradicts_the_file_is_one_line(capture_file, tmp_path, extra, message):
    done = _invoke("kernel", "--inputs", str(capture_file), *extra, "--device", "cpu",
                   "--results", str(tmp_path))
    assert done.exit_code == 2
    assert message in done.output and "Traceback" not in done.output
    assert len(done.output.strip().splitlines()) == 1


def test_a_bad_file_is_one_line(tmp_path):
    from safetensors.torch import save_file

    plain = tmp_path / "plain.safetensors"
    save_file({"x": torch.zeros(2)}, str(plain))
    text = tmp_path / "notes.txt"
    text.write_text("not a capture")
    for path, message in ((tmp_path / "missing.safetensors", "not found"),
                          (text, "is not a safetensors file"),
                          (plain, "was not written by `santa-bench capture`")):
        done = _invoke("kernel", "--inputs", str(path), "--device", "cpu",
                       "--results", str(tmp_path / "res"))
        assert done.exit_code == 2, done.output
        output = " ".join(done.output.split())
        assert "--inputs" in output and message in output and "Traceback" not in output


def test_gaussian_rows_say_so_and_keep_their_case_keys(tmp_path):
    done = _invoke("kernel", "--ctx", "64", "--S", "16", "--methods", "dense,santa-prop",
                   "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--device", "cpu",
                   "--cpu-budget", "0.01", "--results", str(tmp_path))
    assert done.exit_code == 0, done.output
    frame = ResultStore(tmp_path).load()
    assert set(frame.inputs) == {"gaussian"} and "inputs_digest" not in frame
    grid = KernelGrid(methods=parse_method_specs("dense,santa-prop"), ctx=[64], batch=[1],
                      S=[16], heads=4, kv_heads=2, head_dim=16)
    cases = expand_cases(grid)
    assert not any("inputs" in case for case in cases)
    assert {config_hash(c) for c in cases} == set(frame.case_hash)


def test_the_committed_gaussian_runs_are_still_finished(monkeypatch):
    """Each stored command of a committed kernel run expands to its stored case hash, and
    the store counts that case finished under the run's fingerprint (unless it failed)."""
    run_id = "2026-12-04-h200-kernels-model-shapes"
    store = ResultStore(ROOT / "results" / "h200")
    frame = store.load([run_id])
    fingerprint = json.loads((store.root / run_id / "run.json").read_text())["env_fingerprint"]
    finished = store.completed(fingerprint)
    expanded: list[dict] = []

    def capture_cases(cases, *args, **kwargs):
        expanded.extend(cases)
        raise typer.Exit(0)

    monkeypatch.setattr(cli, "run_cases_or_exit", capture_cases)
    monkeypatch.setattr(cli, "_device", lambda requested: requested)  # no GPU here
    parts = frame.drop_duplicates("case_hash")
    # santa-flash has one kernel now: its cases' hashes changed on purpose, and its old
    # options (gather=...) no longer parse
    parts = parts[parts.method != "santa-flash"]
    for part in parts.itertuples():
        expanded.clear()
        words = shlex.split(part.command.replace(",gather=compact", ""))[1:]
        if part.method == "santapp":  # its default draw was head then
            at = words.index("--methods") + 1
            words[at] += ",draw=head"
        done = _invoke(*words)
        assert done.exit_code == 0, done.output
        assert [config_hash(c) for c in expanded] == [part.case_hash], part.command
    failed = set(frame[frame.status == "failed"].case_hash)
    assert set(parts.case_hash) - failed <= finished and len(parts) - len(failed) > 20


def test_a_kernel_suite_with_inputs_builds_the_command_cases(capture_file):
    from santa_bench.sweep import suite_from_dict

    suite = suite_from_dict({
        "runner": "kernel",
        "fixed": {"inputs": str(capture_file), "device": "cpu"},
        "grid": {"method": ["dense", "santa-prop"], "batch": [1, 3]},
        "zip": {"S": [16]},
    })
    grid = KernelGrid(methods=parse_method_specs("dense,santa-prop"), ctx=[N], batch=[1, 3],
                      S=[16], heads=HQ, kv_heads=HKV, head_dim=D, inputs=str(capture_file))
    assert sorted(config_hash(c) for c in suite.cases) == sorted(
        config_hash(c) for c in expand_cases(grid))
    assert {c["inputs"] for c in suite.cases} == {LABEL}
    with pytest.raises(ValueError, match="heads 32: the capture"):
        suite_from_dict({"runner": "kernel", "fixed": {"inputs": str(capture_file),
                                                      "heads": 32, "method": "dense"}})


def test_captured_and_gaussian_cases_compare_against_their_own_baselines(capture_file):
    from santa_bench.execute import work_units

    methods = parse_method_specs("sdpa-math,santa-prop")
    shape = {"heads": HQ, "kv_heads": HKV, "head_dim": D, "ctx": [N], "batch": [1], "S": [16],
             "device": "cuda"}
    gaussian = expand_cases(KernelGrid(methods=methods, **shape))
    captured = expand_cases(KernelGrid(methods=methods, **shape, inputs=str(capture_file)))
    assert group_key(gaussian[0]) == group_key(gaussian[1])
    assert group_key(captured[0]) == group_key(captured[1]) != group_key(gaussian[0])
    # a stored gaussian row (no inputs columns, or empty ones) joins the gaussian group
    stored = {**gaussian[0], "inputs": float("nan"), "inputs_digest": float("nan")}
    assert group_key(stored) == group_key(gaussian[0])
    units = work_units(gaussian + captured)
    assert sorted(map(sorted, units)) == [[0, 1], [2, 3]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_kernels_time_captured_inputs_against_a_baseline_of_the_same_inputs(tmp_path):
    # Qwen2.5-Coder-0.5B's attention shape, 4k captured keys tiled to 32k
    layers = [_layer(x, n=4096, hq=14, hkv=2, d=64) for x in LAYERS]
    capture_file = save_capture(tmp_path / "qwen-shape.safetensors", layers, model="tiny",
                                text="ruler-haystack", dtype="bf16")
    args = ["kernel", "--inputs", str(capture_file), "--ctx", "32k", "--batch", "1,4", "--S",
            "128", "--methods", "santa-prop,santa-flash", "--baselines", "sdpa-flash,sdpa-math",
            "--device", "cuda", "--gpu-budget-ms", "50", "--results", str(tmp_path)]
    done = _invoke(*args)
    assert done.exit_code == 0, done.output
    frame = ResultStore(tmp_path).load()
    assert set(frame.inputs) == {LABEL} and set(frame.inputs_tiled) == {True}
    assert set(frame.heads) == {14} and set(frame.head_dim) == {64}
    speedups = frame[frame.metric == "speedup_vs_best_dense"]
    assert len(speedups) == 4 and set(speedups.status) == {"ok"}
    assert set(speedups.best_dense) <= {"sdpa-flash", "sdpa-math"}
    latency = frame[(frame.metric == "latency") & (frame.method == "santa-prop")]
    assert set(latency.l2_state) == {"cold"}
