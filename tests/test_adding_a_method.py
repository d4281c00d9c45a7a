"""docs/adding-a-method.md: its example method and its statistical test, run as written;
and the per-method attributes the registry carries (module, e2e backend, plot style)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # Step 3's kernel runs in the interpreter

import re
import sys
import types
from pathlib import Path

import pytest
import torch

import santa_bench.methods as methods
import santa_kernels as sk
from conftest import decode_problem
from santa_bench.methods import REGISTRY, Method, MethodError, Param, PlotStyle, Registry

DOC = Path(__file__).resolve().parent.parent / "docs" / "adding-a-method.md"
MODULE = "santa_bench.methods.uniform"


def _blocks() -> tuple[str, str]:
    """The doc's example module and its test (the Python blocks after the marker)."""
    text = DOC.read_text()
    module = re.search(r"<!-- example-module: .*?-->\n```python\n(.*?)```", text, re.S)
    test = re.search(r"```python\n(import torch\n.*?def test_.*?)```", text, re.S)
    assert module and test, "the doc's example blocks are missing"
    return module.group(1), test.group(1)


@pytest.fixture
def uniform_module(monkeypatch):
    """The doc's module, imported as santa_bench.methods.uniform; its own ``@register``
    goes to a scratch registry, not the global one."""
    real = methods.register
    scratch = Registry()

    def register(target=None, *, registry=None):
        return real(target, registry=scratch if registry is None else registry)

    monkeypatch.setattr(methods, "register", register)
    module = types.ModuleType(MODULE)
    monkeypatch.setitem(sys.modules, MODULE, module)
    source, _ = _blocks()
    exec(compile(source, f"{DOC}:{MODULE}", "exec"), module.__dict__)
    assert scratch.names() == ["santa-uniform"] and "santa-uniform" not in REGISTRY.names()
    return module, scratch


def test_the_docs_statistical_test_passes(uniform_module):
    _, source = _blocks()
    namespace: dict = {}
    exec(compile(source, f"{DOC}:test", "exec"), namespace)
    namespace["test_santa_uniform_is_unbiased"]()
    assert "santa-uniform" not in REGISTRY.names()


def test_the_example_method_through_the_public_api(uniform_module):
    module, _ = uniform_module
    registry = Registry()
    assert methods.register(registry=registry)(module.santa_uniform) is module.santa_uniform
    method = registry.get("santa-uniform")
    assert method.module == MODULE and method.family == "santa"
    assert method.plot == PlotStyle(colour="#17becf")
    ((parsed, overrides),) = methods.parse_method_specs("santa-uniform:S=32", registry)
    assert parsed is method and method.resolve_params(overrides) == {"S": 32}
    with pytest.raises(MethodError, match="unknown method 'santa-prop'"):
        methods.parse_method_specs("santa-prop", registry)
    # unbiased over seeds on a decode problem with unequal lengths, bf16 cache
    q, kv = decode_problem(batch=2, heads=4, kv_heads=2, n=60, d=8, lengths=[60, 17],
                           dtype=torch.bfloat16)
    dense = sk.attention(q, kv, value="dense", compute_dtype=torch.float64).out
    seeds = 300
    outs = torch.stack([method.run_reference(q, kv, {"S": 8}, seed=s,
                                             compute_dtype=torch.float64).out
                        for s in range(seeds)])
    stderr = outs.std(0) / seeds**0.5
    assert ((outs.mean(0) - dense).abs() <= 5 * stderr + 1e-9).all()
    # reads: every K row, at most S V rows per query head (a GQA group's union)
    reads = method.run_reference(q, kv, {"S": 8}, seed=0).reads
    assert reads.k_read_fraction == 1.0
    assert (reads.v_rows <= 2 * 8).all() and (reads.v_rows >= 1).all()
    assert method.bytes_read(reads, 2, 4) == reads.kv_bytes(2)


def test_every_builtin_method_records_its_module():
    expected = {"dense": "dense", "santa-prop": "santa", "santa-flash": "santa",
                "santapp": "santapp", "bernoulli": "bernoulli", "sdpa-math": "baseline",
                "triton-splitkv": "baseline"}
    for name, module in expected.items():
        assert REGISTRY.get(name).module == f"santa_bench.methods.{module}"
    assert all(m.module.startswith("santa_bench.methods.") for m in REGISTRY)


def test_register_refuses_what_is_not_a_method():
    with pytest.raises(MethodError, match="not a Method"):
        methods.register(registry=Registry())(lambda: "dense")


def test_e2e_dispatch_reads_the_registry():
    from santa_bench.baselines import Unsupported
    from santa_bench.e2e.attention import (
        KERNEL_METHODS,
        DecodeAttention,
        ReferenceDecode,
        backend_label,
        method_backend,
    )

    assert {m.name for m in REGISTRY if m.e2e_backend is not None} == KERNEL_METHODS
    assert {"santa-prop", "santa-flash", "santapp", "bernoulli"} <= KERNEL_METHODS
    built: list = []

    class Fake(DecodeAttention):
        name = "fake"

    def e2e(method, params, scale, seed):
        built.append((method.name, params, scale, seed))
        return Fake()

    with_kernel = Method("toy", "santa", "a toy", (Param("S", 4, int, "S"),),
                         reference=lambda q, kv, **kw: sk.attention(q, kv), e2e_backend=e2e)
    without = Method("toy-ref", "santa", "reference only",
                     reference=lambda q, kv, **kw: sk.attention(q, kv))
    assert isinstance(method_backend(with_kernel, {"S": 4}, device="cuda", scale=0.5, seed=3),
                      Fake)
    assert built == [("toy", {"S": 4}, 0.5, 3)]
    assert backend_label(with_kernel, "cuda") == "triton"
    assert backend_label(with_kernel, "cpu") == backend_label(without, "cuda") == "reference"
    assert isinstance(method_backend(with_kernel, {}, device="cpu", scale=1.0, seed=0),
                      ReferenceDecode)
    with pytest.raises(Unsupported, match="no GPU kernel"):
        method_backend(without, {}, device="cuda", scale=1.0, seed=0)


def test_plot_colours_come_from_the_registry():
    from santa_bench import plots
    from santa_bench.plots.style import line_style

    for method in REGISTRY:
        if method.plot.colour is not None:
            assert plots.method_colour(method.name, method.family) == method.plot.colour
    assert plots.method_colour("santa-prop") == "#d62728"
    assert plots.method_colour("dense") == "#000000"
    assert line_style("baseline", "sdpa-math") == {"marker": "s", "linestyle": "--"}
    assert line_style("santa", "santa-prop") == {"marker": "o", "linestyle": "-"}


def test_list_shows_each_methods_module(monkeypatch):
    from typer.testing import CliRunner

    from santa_bench import cli

    monkeypatch.setattr(cli.console, "_width", 400)  # no cell folded
    result = CliRunner().invoke(cli.app, ["list"])
    assert result.exit_code == 0 and "module" in result.output
    for method in REGISTRY:
        row = next(line for line in result.output.splitlines() if f" {method.name} " in line)
        assert f" {method.module} " in row


def _kernel_blocks() -> tuple[str, str]:
    """Step 3's kernel file and the builder that replaces Step 1's."""
    text = DOC.read_text()
    kernel = re.search(r"<!-- example-kernel: .*?-->\n```python\n(.*?)```", text, re.S)
    builder = re.search(r"<!-- example-kernel-methods: .*?-->\n```python\n(.*?)```", text, re.S)
    assert kernel and builder, "the doc's kernel blocks are missing"
    return kernel.group(1), builder.group(1)


@pytest.fixture
def uniform_with_kernel(monkeypatch, tmp_path):
    """Step 3 as the page says: the kernel as santa_kernels.uniform (Triton's interpreter,
    which reads the kernel's source file: no GPU here), Step 1's module with its builder
    replaced; registered in a scratch registry."""
    import importlib.util

    pytest.importorskip("triton")
    kernel_source, builder = _kernel_blocks()
    path = tmp_path / "uniform.py"
    path.write_text(kernel_source)
    spec = importlib.util.spec_from_file_location("santa_kernels.uniform", path)
    kernel = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "santa_kernels.uniform", kernel)
    spec.loader.exec_module(kernel)
    if type(kernel._uniform_kernel).__name__ != "InterpretedFunction":
        pytest.skip("Triton was imported before TRITON_INTERPRET=1 was set (no GPU here)")
    real = methods.register
    scratch = Registry()
    monkeypatch.setattr(methods, "register",
                        lambda target=None, *, registry=None: real(target, registry=scratch))
    source, _ = _blocks()
    source = source[: source.index("\n\n@register\n")] + "\n\n" + builder
    module = types.ModuleType(MODULE)
    monkeypatch.setitem(sys.modules, MODULE, module)
    exec(compile(source, f"{DOC}:{MODULE}", "exec"), module.__dict__)
    return scratch.get("santa-uniform")


def test_the_docs_kernel_is_unbiased_and_draws_fresh_numbers(uniform_with_kernel):
    method = uniform_with_kernel
    assert method.kernel_kind == "triton" and method.kernel_available() == (True, "")
    q, kv = decode_problem(batch=1, heads=2, kv_heads=1, n=40, d=16, lengths=[37],
                           dtype=torch.float32)
    prepared = method.prepare(q, kv, seed=0, **method.resolve_params({"S": 8}))
    calls = 40
    outs = torch.stack([prepared().clone() for _ in range(calls)]).double()
    dense = sk.attention(q, kv, value="dense", compute_dtype=torch.float64).out
    stderr = outs.std(0) / calls**0.5
    assert ((outs.mean(0) - dense).abs() <= 5 * stderr + 1e-6).all()
    assert not torch.equal(outs[0], outs[1])  # each call draws anew


def test_the_docs_decode_backend_runs_the_kernel(uniform_with_kernel):
    from santa_bench.e2e.attention import backend_label, method_backend
    from santa_bench.e2e.cache import StaticKVCache

    method = uniform_with_kernel
    assert backend_label(method, "cuda") == "triton"
    cache = StaticKVCache(num_layers=2, batch=1, capacity=64, num_kv_heads=1, head_dim=16,
                          dtype=torch.float32, device="cpu")
    q, kv = decode_problem(batch=1, heads=2, kv_heads=1, n=40, d=16, dtype=torch.float32)
    for layer in range(2):
        cache.k[layer][:, :40] = kv.k
        cache.v[layer][:, :40] = kv.v
    cache.lengths.fill_(40)
    backend = method_backend(method, {"S": 8}, device="cuda", scale=0.25, seed=3)
    backend.setup(cache, q)
    first = backend(0, q).clone()
    assert torch.isfinite(first).all() and not torch.equal(first, backend(1, q))
    backend.reset()
    assert torch.equal(backend(0, q), first)  # a reset replays the draws
    # the adapter's trial call draws with seed 2, so its first timed call draws with 3
    prepared = method.prepare(q, cache.layers[0], seed=2, S=8, scale=0.25)
    assert torch.equal(prepared(), first)  # the backend runs what the harness times
