"""santa-bench pareto and report with kernel rows on Gaussian and on captured inputs."""

from __future__ import annotations

import pandas as pd
import pytest
from test_pareto import ENV, MODEL, _accuracy

from santa_bench import pareto, verdict_output
from santa_bench.report import kernel_table, speedup_matrix
from santa_bench.results import ResultStore
from santa_bench.stores import StoreSet

LABEL = f"captured:{MODEL}:L3,9,15,21"
RATES = {"niah_single_1": 0.95, "niah_multikey_1": 0.8, "vt": 0.6, "qa_1": 0.05}


def _kernel(run, method: str, params: dict, batch: int, latency: float, speedup: float,
            inputs: str | None = None, tiled: bool = False) -> None:
    case = {"kind": "kernel", "method": method, "ctx": 32768, "batch": batch, "heads": 14,
            "kv_heads": 2, "head_dim": 64, "device": "cuda", "timing": "graph", "l2": "cold",
            **params}
    if inputs is not None:
        case |= {"inputs": inputs, "inputs_digest": "0123456789ab", "inputs_tiled": tiled,
                 "_inputs": "/data/qwen-32k.safetensors"}
    command = "santa-bench kernel --ctx 32k" + (
        " --inputs /data/qwen-32k.safetensors" if inputs else "")
    rows = [
        {"metric": "latency", "value": latency, "unit": "us"},
        {"metric": "kv_read_fraction", "value": 0.3 if inputs else 0.5},
    ]
    if params.get("family") != "baseline":
        rows.append({"metric": "speedup_vs_best_dense", "value": speedup,
                     "ci_low": speedup * 0.98, "ci_high": speedup * 1.02,
                     "best_dense": "sdpa-cudnn"})
    run.write_case(case, [{**r, "inputs": inputs or "gaussian"} for r in rows], command=command)


def _store(root, captured: bool, gaussian_column: bool = True) -> StoreSet:
    results = ResultStore(root)
    acc = results.start_run({**ENV, "command": "santa-bench accuracy ruler"}, "acc")
    _accuracy(acc, "dense", {}, RATES, seed=1)
    _accuracy(acc, "santa-prop", {"S": 128}, RATES, seed=1)
    _accuracy(acc, "santapp", {"M": 32, "draw": "pooled"},
              {t: r * 0.5 for t, r in RATES.items()}, seed=2)
    kern = results.start_run({**ENV, "command": "santa-bench kernel"}, "kern")
    for batch, dense_us in ((1, 30.0), (8, 150.0)):
        for method, params, speedup in (("santa-prop", {"S": 128}, 1.5),
                                        ("santapp", {"M": 32, "draw": "pooled"}, 2.5),
                                        ("sdpa-cudnn", {"family": "baseline"}, 1.0)):
            _kernel(kern, method, params, batch, dense_us / speedup, speedup)
    if not gaussian_column:  # rows written before kernel rows named their inputs
        for part in (root / "kern").glob("part-*.parquet"):
            frame = pd.read_parquet(part)
            frame.drop(columns="inputs").to_parquet(part, index=False)
    if captured:  # a newer run: on the model's attention, santa-prop only
        newer = results.start_run({**ENV, "command": "santa-bench kernel --inputs"}, "kern2")
        for batch, speedup in ((1, 1.2), (8, 1.4)):
            _kernel(newer, "santa-prop", {"S": 128}, batch, 25.0, speedup, LABEL)
            _kernel(newer, "sdpa-cudnn", {"family": "baseline"}, batch, 31.0, 1.0, LABEL)
            # another model's capture at the same shape: not this model's attention
            _kernel(newer, "santa-prop", {"S": 128}, batch, 1.0, 9.0, "captured:other:L1")
    return StoreSet(root)


def test_captured_rows_give_a_second_speedup_beside_the_gaussian_one(tmp_path):
    store = _store(tmp_path / "results", captured=True)
    result = pareto.verdict(store.load(), store.runs(), MODEL)
    points = {p.config: p for p in result.points}
    prop, pp = points["santa-prop:S=128"], points["santapp:M=32"]
    # the Gaussian speedups are not replaced by the newer captured rows
    assert prop.timings[1].speedup == pytest.approx(1.5) and prop.timings[1].inputs == "gaussian"
    assert prop.captured[1].speedup == pytest.approx(1.2)
    assert prop.captured[8].speedup == pytest.approx(1.4) and prop.captured[8].inputs == LABEL
    assert pp.captured == {} and result.captured_inputs == [LABEL]
    assert result.captured_dense_latency[1] == ("sdpa-cudnn", 31.0)
    assert result.dense_latency[1] == ("sdpa-cudnn", 30.0)
    assert sorted(result.kernel_runs) == ["kern", "kern2"]
    missing = [m for m in result.missing if m[0] == "santapp:M=32"]
    assert len(missing) == 1 and missing[0][1] == "kernel rows on captured inputs at B=1,8"
    assert missing[0][2].endswith("--methods santapp:M=32 --baselines auto "
                                  "--inputs /data/qwen-32k.safetensors")

    md = verdict_output.markdown(result)
    header = next(line for line in md.splitlines() if line.startswith("| config | retention"))
    assert "speedup B=1 [95%] | speedup B=8 [95%] | speedup B=1 (captured) [95%] | " \
        "speedup B=8 (captured) [95%] | KV read (Gaussian inputs) | KV read (captured)" in header
    line = next(x for x in md.splitlines() if x.startswith("| `santa-prop:S=128`"))
    assert "1.50x [1.47, 1.53] | 1.50x [1.47, 1.53] | 1.20x [1.18, 1.22] | 1.40x" in line
    assert "| 50.0% | 30.0% |" in line
    assert f"Captured inputs: `{LABEL}`" in md and "Every missing kernel row on captured" in md
    assert "captured inputs 1.20x [1.18, 1.22]" in md.split("## Every configuration")[0]
    assert "9.00x" not in md  # the other model's capture
    csv = verdict_output.table_frame(result)
    assert csv.set_index("config").loc["santa-prop:S=128", "speedup_b8_captured"] == \
        pytest.approx(1.4)
    assert verdict_output.figure(result, tmp_path / "f.png").stat().st_size > 10_000


def test_gaussian_rows_print_as_before_with_or_without_their_inputs_column(tmp_path):
    named = _store(tmp_path / "a", captured=False)
    unnamed = _store(tmp_path / "b", captured=False, gaussian_column=False)
    assert "inputs" not in unnamed.load()
    texts = [verdict_output.markdown(pareto.verdict(s.load(), s.runs(), MODEL))
             for s in (named, unnamed)]
    assert texts[0] == texts[1]
    assert "captured" not in texts[0].lower() and "| KV read (kernel inputs) |" in texts[0]
    frames = [verdict_output.table_frame(pareto.verdict(s.load(), s.runs(), MODEL))
              for s in (named, unnamed)]
    assert list(frames[0].columns) == list(frames[1].columns)
    assert not any("captured" in c for c in frames[0].columns)


def test_report_tables_keep_the_inputs_apart(tmp_path):
    gaussian = _store(tmp_path / "a", captured=False, gaussian_column=False).load()
    assert "inputs:" not in kernel_table(gaussian) + speedup_matrix(gaussian)
    both = _store(tmp_path / "b", captured=True).load()
    table = kernel_table(both)
    titles = [line for line in table.splitlines() if line.startswith("**")]
    assert titles == ["**timing: graph, L2: cold, inputs: gaussian**",
                      "**timing: graph, L2: cold, inputs: captured:other:L1**",
                      f"**timing: graph, L2: cold, inputs: {LABEL}**"]
    captured_part = table.split(f"inputs: {LABEL}**")[1]
    assert "1.20x" in captured_part and "1.50x" not in captured_part
    matrix = speedup_matrix(both)
    part = matrix.split(f"inputs: {LABEL}**")[1]
    assert "sdpa-cudnn 31.0 us" in part and "25.0 us, 1.20x" in part


def test_the_fastest_dense_line_comes_from_the_kernel_runs_the_speedups_come_from(tmp_path):
    """A faster dense row in a run no point's speedup comes from is not the header's."""
    root = tmp_path / "results"
    _store(root, captured=False)
    other = ResultStore(root).start_run({**ENV, "command": "santa-bench kernel"}, "dense-only")
    _kernel(other, "sdpa-cudnn", {"family": "baseline"}, 1, 20.0, 1.0)
    store = StoreSet(root)
    result = pareto.verdict(store.load(), store.runs(), MODEL)
    assert result.kernel_runs == ["kern"]
    assert result.dense_latency[1] == ("sdpa-cudnn", 30.0)  # not dense-only's 20.0
    assert "Fastest dense at B=1 in these kernel runs: sdpa-cudnn, 30.0 us" in \
        verdict_output.markdown(result)
