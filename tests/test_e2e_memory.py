"""The memory estimate of an e2e run: its tensors against what a tiny run allocates, a
run's peak memory under it, the CPU defaults, and the refusal up front on a small host."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

from santa_bench.cli import app
from santa_bench.e2e import cli as e2e_cli
from santa_bench.e2e import memory
from santa_bench.e2e.configs import NAMED
from santa_bench.e2e.loop import DecodeSession
from santa_bench.e2e.model import Decoder

ROOT = Path(__file__).resolve().parents[1]


def _invoke(*args):
    e2e_cli.console.width = 200
    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    return result, re.sub(r"\x1b\[[0-9;]*m", "", result.output)


@pytest.mark.parametrize(("name", "layout", "dtype"), [
    ("tiny", "contiguous", torch.float32), ("tiny-qwen", "paged", torch.bfloat16)])
def test_estimate_counts_the_weights_and_cache_a_tiny_run_allocates(name, layout, dtype):
    config = NAMED[name]
    case = {"batch": 3, "ctx": 300, "decode_steps": 5, "layout": layout, "page_size": 16,
            "prefill": "dense", "prefill_chunk": 128, "device": "cpu", "family": "dense"}
    model = Decoder.random(config, dtype=dtype, seed=0)
    session = DecodeSession(model, batch=3, ctx=300, steps=5, layout=layout, page_size=16)
    need = memory.estimate(config, case, dtype.itemsize)
    assert need.weights == model.parameter_bytes()
    assert need.kv_cache == session.cache.nbytes
    rope = (model.cos.numel() + model.sin.numel()) * model.cos.element_size()
    assert need.working > rope  # the RoPE tables and the prefill's working set
    assert need.total == need.weights + need.kv_cache + need.working
    real = memory.estimate(config, {**case, "weights": "real"}, dtype.itemsize)
    assert real.loading > 0 and real.total >= need.total


_PEAK = """
import json, resource, sys
import psutil
from typer.testing import CliRunner
from santa_bench.cli import app
from santa_bench.e2e import configs, memory
from santa_bench.e2e.configs import ModelConfig

configs.NAMED["mem-test"] = ModelConfig("mem-test", "llama", 2, 256, 8, 2, 64, 512, 8192,
                                        16384, 10000.0)
seen = []
largest = memory.largest
memory.largest = lambda cases: seen.append(largest(cases)[0].total) or largest(cases)

def run(ctx, batch, out):
    args = ["e2e", "--config", "mem-test", "--ctx", ctx, "--batch", batch, "--steps", "2",
            "--methods", "santa-prop:S=64", "--device", "cpu", "--results", out]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output

run("64", "1", sys.argv[1] + "/warm")  # imports, the store's writer
base = psutil.Process().memory_info().rss
run("2k", "8", sys.argv[1] + "/run")
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"growth": peak - base, "estimate": seen[-1]}))
"""


def test_e2e_run_stays_under_its_memory_estimate(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1", "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-c", _PEAK, str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    # the run's tensors dominate the growth (the measurement means something) and fit the
    # estimate, up to the allocator's slack: RSS growth of a run this small moved by tens of
    # MB with the machine's load (malloc arenas), which the run's 2 GiB MARGIN covers
    slack = 64 * 2**20
    assert 0.3 * measured["estimate"] < measured["growth"] <= measured["estimate"] + slack


def test_e2e_defaults_on_a_small_cpu_host_refuse_up_front(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda device: 2 * memory.GIB)

    def allocate(*args, **kwargs):
        raise AssertionError("the run allocated a model before refusing")

    monkeypatch.setattr(Decoder, "random", allocate)
    result, text = _invoke("e2e", "--device", "cpu", "--results", tmp_path)
    assert result.exit_code == 2, text
    assert "CPU defaults: --config llama-3.2-1b --ctx 1k --batch 1" in text
    error = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(error) == 1, text  # one line
    assert re.search(r"needs ~\d+\.\d GiB .*2\.0 GiB of host memory is available", error[0])
    assert "lower --ctx or --batch" in error[0]
    assert not list(tmp_path.iterdir())  # no run folder


def test_e2e_cpu_defaults_fit_a_24_gib_host(tmp_path, monkeypatch):
    """The defaults that were killed at 24 GiB are not what a CPU run gets now."""
    monkeypatch.setattr(memory, "available_bytes", lambda device: 22 * memory.GIB)
    ran = []

    def record(cases, *args, **kwargs):
        ran.extend(cases)
        raise typer.Exit(0)  # not running them here

    monkeypatch.setattr("santa_bench.execute.run_cases", record)
    result, text = _invoke("e2e", "--device", "cpu", "--results", tmp_path)
    assert ran, text
    assert {(c["model"], c["ctx"], c["batch"]) for c in ran} == {("llama-3.2-1b", 1024, 1)}
    assert re.search(r"memory: ~\d+\.\d GiB .* 22\.0 GiB of host memory available", text)
    # the GPU defaults are refused on that host
    result, text = _invoke("e2e", "--device", "cpu", "--config", "llama-3.1-8b", "--ctx",
                           "32k", "--batch", "4", "--results", tmp_path)
    assert result.exit_code == 2 and "22.0 GiB of host memory is available" in text
