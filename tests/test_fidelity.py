"""Fidelity runner: synthetic patterns and estimator statistics over seeds."""

from __future__ import annotations

import pytest
import torch

import santa_kernels as sk
from santa_bench.accuracy.patterns import PATTERNS, make_pattern
from santa_bench.inputs import DecodeShape
from santa_bench.methods import parse_method_specs
from santa_bench.runners.fidelity import FidelityGrid, FidelityRunner, expand_fidelity_cases

SHAPE = DecodeShape(batch=1, ctx=512, heads=4, kv_heads=2, head_dim=16)


def _top_mass(pattern: str, k: int) -> float:
    q, kv = make_pattern(pattern, SHAPE, dtype=torch.float64)
    weights = sk.dense_attention(q, kv, compute_dtype=torch.float64).weights
    return float(weights.sort(-1, descending=True).values[..., :k].sum(-1).mean())


def test_patterns_put_the_mass_where_their_names_say():
    assert _top_mass("uniform", 1) == pytest.approx(1 / 512)
    assert _top_mass("needle", 1) > 0.5
    assert _top_mass("multi-needle", 4) > 0.5 > _top_mass("multi-needle", 1)
    q, kv = make_pattern("sink-heavy", SHAPE, dtype=torch.float64)
    weights = sk.dense_attention(q, kv, compute_dtype=torch.float64).weights
    assert float(weights[..., :4].sum(-1).mean()) > 0.5
    assert 0.05 < _top_mass("peaked", 1) < 0.9
    with pytest.raises(ValueError, match="pattern: expected one of"):
        make_pattern("zipf", SHAPE)
    assert set(PATTERNS) == {"uniform", "peaked", "needle", "multi-needle", "sink-heavy"}


def _run(spec: str, pattern: str, budgets: list[int], seeds: int = 24) -> dict:
    grid = FidelityGrid(methods=parse_method_specs(spec), patterns=[pattern], S=budgets,
                        ctx=[SHAPE.ctx], heads=4, kv_heads=2, head_dim=16, seeds=seeds)
    runner = FidelityRunner()
    results = {}
    for case in expand_fidelity_cases(grid):
        rows = {r["metric"]: r for r in runner.run(case)}
        results[(case["method"], case.get("S"), case.get("alloc"))] = rows
    return results


def test_unbiased_methods_show_small_z_and_the_released_rounding_shows_bias():
    results = _run("santa-prop,santa-prop:alloc=largest-remainder", "peaked", [8], seeds=64)
    unbiased = results[("santa-prop", 8, "systematic")]
    biased = results[("santa-prop", 8, "largest-remainder")]
    assert unbiased["max_abs_z"]["value"] < 5
    assert biased["max_abs_z"]["value"] > unbiased["max_abs_z"]["value"]


def test_error_falls_with_S_and_reads_grow():
    results = _run("santa-sys", "needle", [4, 64])
    small, large = results[("santa-sys", 4, None)], results[("santa-sys", 64, None)]
    assert large["rel_l2_vs_dense"]["value"] < small["rel_l2_vs_dense"]["value"]
    assert large["v_read_fraction"]["value"] > small["v_read_fraction"]["value"]
    assert small["attention_kl"]["status"] == "skipped"


def test_bernoulli_reports_the_kl_of_its_attention_distribution():
    rows = _run("bernoulli", "peaked", [16], seeds=8)[("bernoulli", 16, "systematic")]
    assert rows["attention_kl"]["status"] == "ok" and rows["attention_kl"]["value"] > 0
    assert rows["k_read_fraction"]["value"] < 1


def test_fidelity_command_writes_rows_and_resumes(tmp_path):
    from typer.testing import CliRunner

    from santa_bench.cli import app
    from santa_bench.results import ResultStore

    args = ["accuracy", "fidelity", "--patterns", "peaked,needle", "--methods",
            "santa-sys,bernoulli", "--S", "8", "--ctx", "256", "--heads", "4", "--kv-heads",
            "2", "--head-dim", "16", "--seeds", "4", "--results", str(tmp_path)]
    first = CliRunner().invoke(app, args, catch_exceptions=False)
    assert first.exit_code == 0, first.output
    frame = ResultStore(tmp_path).load()
    assert frame["case_hash"].nunique() == 4 and set(frame["kind"]) == {"fidelity"}
    assert {"rel_l2_vs_dense", "rel_bias", "max_abs_z", "attention_kl"} <= set(frame.metric)
    assert frame["command"].str.startswith("santa-bench accuracy fidelity").all()
    again = CliRunner().invoke(app, args, catch_exceptions=False)
    assert "4 of 4 cases already" in again.output
    bad = CliRunner().invoke(app, [*args[:2], "--patterns", "zipf"], catch_exceptions=False)
    assert bad.exit_code == 2 and "unknown ['zipf']" in bad.output


def test_fidelity_suite_runs_and_matches_the_command_cases(tmp_path):
    from pathlib import Path

    from typer.testing import CliRunner

    from santa_bench.cli import app
    from santa_bench.results import ResultStore, config_hash
    from santa_bench.runners.fidelity import FidelityGrid, expand_fidelity_cases
    from santa_bench.sweep import load_suite

    path = Path(__file__).resolve().parents[1] / "suites" / "smoke-fidelity.yaml"
    suite = load_suite(path)
    grid = FidelityGrid(methods=parse_method_specs("santa-sys,santa-prop"),
                        patterns=["peaked", "needle"], S=[8, 16], ctx=[256], heads=4,
                        kv_heads=2, head_dim=16, seeds=4)
    assert {config_hash(c) for c in suite.cases} == {
        config_hash(c) for c in expand_fidelity_cases(grid)
    }
    result = CliRunner().invoke(app, ["sweep", str(path), "--results", str(tmp_path)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert ResultStore(tmp_path).load()["case_hash"].nunique() == len(suite.cases) == 8
