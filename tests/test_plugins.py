"""Plugins: a method registered by a module outside the package (named with --plugin, or an
entry point of the santa_bench.plugins group) runs through `list` and `kernel` like a
built-in one. Each run is its own process, so the suite's registries stay untouched."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from santa_bench.results import ResultStore

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--cpu-budget", "0.01"]

PLUGIN = textwrap.dedent('''
    """A researcher's method: S keys drawn uniformly, the softmax taken over them."""

    import torch

    import santa_kernels as sk
    from santa_bench.methods import Method, Param, register


    def subset_reference(q, kv, *, S, seed=None, scale=None, **_):
        gen = torch.Generator().manual_seed(0 if seed is None else seed)
        keep = torch.zeros(kv.batch, kv.max_len, dtype=torch.bool)
        for b, n in enumerate(kv.lengths.tolist()):
            keep[b, torch.randperm(n, generator=gen)[:S]] = True
        k, v, _ = kv.padded()
        sub = sk.KVCache.contiguous(k[:, keep[0]], v[:, keep[0]])
        return sk.attention(q, sub, value="dense", scale=scale)


    @register
    def key_subset() -> Method:
        return Method("key-subset", "santa", "softmax over S uniform keys (a plugin)",
                      (Param("S", 32, int, "keys kept", minimum=1),),
                      reference=subset_reference)
''')


def _cli(*args: str, path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), str(ROOT)]),
           "COLUMNS": "400"}
    env.pop("SANTA_BENCH_PLUGINS", None)
    return subprocess.run([sys.executable, "-m", "santa_bench", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_plugin_method_runs_through_list_and_kernel(tmp_path: Path):
    (tmp_path / "my_methods.py").write_text(PLUGIN)
    listed = _cli("--plugin", "my_methods", "list", path=tmp_path)
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if " key-subset " in line)
    assert " my_methods " in row and "S=32" in row
    store = tmp_path / "results"
    ran = _cli("--plugin", str(tmp_path / "my_methods.py"), "kernel", "--ctx", "256", "--S",
               "16", "--methods", "dense,key-subset", "--results", str(store), *SMALL,
               path=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    frame = ResultStore(store).load()
    assert set(frame["method"]) == {"dense", "key-subset"} and set(frame["status"]) == {"ok"}
    commands = frame.drop_duplicates("method").set_index("method")["command"]
    assert commands["key-subset"].startswith("santa-bench --plugin my_methods kernel ")
    assert commands["dense"].startswith("santa-bench kernel ")
    assert set(frame[frame.method == "key-subset"]["S"]) == {16}
    without = _cli("kernel", "--ctx", "256", "--methods", "key-subset", path=tmp_path)
    assert without.returncode == 2 and "unknown method 'key-subset'" in without.stdout


def test_a_plugin_method_runs_in_a_suite(tmp_path: Path):
    (tmp_path / "my_methods.py").write_text(PLUGIN)
    suite = tmp_path / "suite.yaml"
    suite.write_text(textwrap.dedent("""
        runner: kernel
        fixed: {heads: 4, kv_heads: 2, head_dim: 16, batch: 1, device: cpu, ctx: 256}
        grid: {method: [dense, key-subset], S: [16]}
        options: {cpu_budget: 0.01}
    """))
    store = tmp_path / "results"
    ran = _cli("--plugin", "my_methods", "sweep", str(suite), "--results", str(store),
               path=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert set(ResultStore(store).load()["method"]) == {"dense", "key-subset"}


def test_an_entry_point_plugin_loads_without_the_option(tmp_path: Path):
    (tmp_path / "my_methods.py").write_text(PLUGIN)
    info = tmp_path / "my_methods-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-methods\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[santa_bench.plugins]\nmine = my_methods\n")
    listed = _cli("list", path=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert any(" key-subset " in line and " my_methods " in line
               for line in listed.stdout.splitlines())


def test_a_plugin_that_fails_to_import_is_one_line(tmp_path: Path):
    result = _cli("--plugin", "no_such_plugin_module", "list", path=tmp_path)
    assert result.returncode == 2
    assert "error: --plugin no_such_plugin_module: ModuleNotFoundError" in result.stdout
