"""Each runner's case schema is declared once (santa_bench.runners.schema): the suite keys
and defaults, the grids' defaults and the commands' defaults read it, and stored case
hashes do not move."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pandas as pd
import pytest
import typer.main

from santa_bench.cli import app
from santa_bench.e2e.runner import E2EGrid
from santa_bench.results import config_hash
from santa_bench.runners.fidelity import FidelityGrid
from santa_bench.runners.kernel import KernelGrid
from santa_bench.runners.schema import E2E, FIDELITY, KERNEL, SCHEMAS
from santa_bench.sweep import RUNNERS, load_suite, suite_from_dict

ROOT = Path(__file__).resolve().parents[1]


def _suite_digest(name: str) -> str:
    hashes = sorted(config_hash(case) for case in load_suite(ROOT / "suites" / name).cases)
    return hashlib.sha256(",".join(hashes).encode()).hexdigest()[:16]


@pytest.mark.parametrize(("suite", "digest"), [
    ("smoke-kernel.yaml", "ce7fb44738153f83"),
    ("smoke-fidelity.yaml", "2e9dab9ddbf481ba"),
    ("fidelity-error-vs-S.yaml", "80ca4034183630ae"),
    ("santapp-32k.yaml", "f0cb401b04ace5ad"),
    ("e2e-batched-decode.yaml", "fb79fbb1154515a9"),
])
def test_committed_suites_expand_to_the_same_case_hashes(suite, digest):
    assert _suite_digest(suite) == digest


def test_stored_kernel_rows_are_cases_of_their_suite():
    """Case hashes of committed H100 rows (results/h100/2026-12-06-h100-kernels-full)."""
    stored = {"9695d8925c41c293": "sdpa-cudnn", "604b11380dc95d74": "triton-splitkv",
              "1e6168b43348c3dd": "santa-prop", "ad4ab3025ba2c05a": "santa-flash"}
    run = ROOT / "results" / "h100" / "2026-12-06-h100-kernels-full"
    rows = pd.concat(pd.read_parquet(p, columns=["case_hash", "method"])
                     for p in sorted(run.glob("*.parquet")))
    assert set(stored) <= set(rows.case_hash)
    cases = {config_hash(c): c["method"] for c in
             load_suite(ROOT / "suites" / "kernel-latency-vs-S.yaml").cases}
    assert {h: cases.get(h) for h in stored} == stored


def test_suite_keys_and_defaults_are_the_schemas():
    for name, schema in SCHEMAS.items():
        spec = RUNNERS[name]
        assert spec.keys == schema.kinds() and spec.derived == schema.derived
        assert spec.defaults == schema.suite_defaults()


def test_grid_defaults_are_the_schemas():
    def defaults(grid) -> dict:
        return {f.name: f.default for f in dataclasses.fields(grid)
                if f.default is not dataclasses.MISSING}

    kernel = defaults(KernelGrid)
    for key in ("dtype", "layout", "page_size", "seed", "graph"):
        assert kernel[key] == KERNEL.default(key)
    assert kernel["cold_l2"] == KERNEL.default("cold")
    fidelity = defaults(FidelityGrid)
    for key in ("batch", "heads", "kv_heads", "head_dim", "seeds"):
        assert fidelity[key] == FIDELITY.default(key)
    e2e = defaults(E2EGrid)
    assert e2e["steps"] == E2E.default("decode_steps")
    for key in ("layout", "page_size", "prefill", "prefill_chunk", "dtype", "rest"):
        assert e2e[key] == E2E.default(key)


def _option_defaults(*path: str) -> dict:
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    return {p.name: p.default for p in command.params if p.param_type_name == "option"}


def test_command_defaults_are_the_schemas():
    kernel = _option_defaults("kernel")
    assert kernel["S"] == "128" and kernel["batch"] == "1" and kernel["seed"] == 0
    e2e = _option_defaults("e2e")  # None: the schema's on a GPU, smaller ones on a CPU
    assert e2e["batch"] is None and e2e["ctx"] is None
    assert E2E.option_default("batch") == "4" and E2E.option_default("ctx") == "32k"
    assert e2e["steps"] == E2E.default("decode_steps")
    from santa_bench.e2e.cli import DEFAULTS

    assert DEFAULTS["cuda"] == (E2E.option_default("model"), "32k", "4")
    fidelity = _option_defaults("accuracy", "fidelity")
    assert fidelity["S"] == FIDELITY.option_default("S") == "16,64,256"
    assert fidelity["ctx"] == "2k" and fidelity["seeds"] == FIDELITY.default("seeds")


def test_a_suite_that_omits_a_key_gets_the_commands_default(tmp_path):
    fidelity = suite_from_dict({"runner": "fidelity", "fixed": {"pattern": "uniform"},
                                "grid": {"method": ["santa-sys", "dense"]}}, tmp_path / "f")
    budgets = sorted(c["S"] for c in fidelity.cases if c["method"] == "santa-sys")
    assert budgets == [16, 64, 256]
    assert sum(c["method"] == "dense" for c in fidelity.cases) == 1
    e2e = suite_from_dict({"runner": "e2e", "fixed": {"model": "tiny", "weights": "random",
                                                      "ctx": 256, "device": "cpu"},
                           "grid": {"method": ["santa-sys:S=16"]}}, tmp_path / "e")
    assert {c["batch"] for c in e2e.cases} == {4}


def test_the_santapp_kernel_library_defaults_are_the_registrys():
    import inspect

    from santa_bench.methods import REGISTRY
    from santa_bench.methods.santapp import santapp_prepare
    from santa_kernels import santapp as reference
    from santa_kernels import triton_santapp

    params = REGISTRY.get("santapp").resolve_params({})

    def defaults(function) -> dict:
        return {k: v.default for k, v in inspect.signature(function).parameters.items()}

    assert defaults(reference.santapp)["M"] == params["M"]
    for function in (reference.santapp, reference.santapp_attention, santapp_prepare):
        got = defaults(function)
        assert (got["sink"], got["window"]) == (params["sink"], params["window"]), function
    for function in (reference.build_team_index, triton_santapp.build_packed):
        got = defaults(function)
        assert (got["sink"], got["exact_recent"]) == (params["sink"], params["window"]), function


def test_a_suite_method_spec_that_sweeps_says_where_the_values_go(tmp_path):
    from santa_bench.sweep import SuiteError

    with pytest.raises(SuiteError, match=r"a value a\|b sweeps: list the values under grid"):
        suite_from_dict({"runner": "kernel", "grid": {"method": ["santapp:M=32|64"]}},
                        tmp_path / "s")
