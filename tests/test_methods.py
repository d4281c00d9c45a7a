"""The method registry: parsing, parameter validation, references and byte models."""

from __future__ import annotations

import pytest
import torch

import santa_kernels as sk
from conftest import decode_problem
from santa_bench.methods import REGISTRY, MethodError, parse_method_specs


def test_every_entry_has_a_family_reference_and_availability():
    for method in REGISTRY:
        ok, reason = method.available()
        assert isinstance(ok, bool) and isinstance(reason, str)
        assert ok or reason
        assert method.reference is not None


def test_parse_specs_with_parameters():
    parsed = parse_method_specs("dense,santa-prop:S=256,tile=32,santa-flash:S=2048")
    assert [(m.name, o) for m, o in parsed] == [
        ("dense", {}),
        ("santa-prop", {"S": 256, "tile": 32}),
        ("santa-flash", {"S": 2048}),
    ]
    prop = parsed[1][0]
    assert prop.resolve_params(parsed[1][1]) == {
        "S": 256, "tile": 32, "alloc": "systematic", "stash": "fp16", "min_ctx": 0,
    }


def test_a_spec_value_a_or_b_sweeps_every_combination():
    parsed = parse_method_specs("dense,santapp:M=32|64,team_size=16|32,policy=kmeans,santa-sys")
    assert [(m.name, o) for m, o in parsed] == [
        ("dense", {}),
        ("santapp", {"M": 32, "team_size": 16, "policy": "kmeans"}),
        ("santapp", {"M": 32, "team_size": 32, "policy": "kmeans"}),
        ("santapp", {"M": 64, "team_size": 16, "policy": "kmeans"}),
        ("santapp", {"M": 64, "team_size": 32, "policy": "kmeans"}),
        ("santa-sys", {}),
    ]
    policies = parse_method_specs("santapp:policy=contiguous|kmeans")
    assert [o for _, o in policies] == [{"policy": "contiguous"}, {"policy": "kmeans"}]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nope", "unknown method 'nope'"),
        ("santapp:M=32|", "santapp: M=.* has an empty alternative"),
        ("santapp:M=32|many", "parameter M expects int, got 'many'"),
        ("S=3", "given before any method name"),
        ("santa-sys:S", "expected key=value"),
        ("santa-sys:S=0", "S must be >= 1"),
        ("santa-sys:S=1.5", "S must be an integer"),
        ("santa-sys:tile=8", "unknown parameter(s) ['tile']"),
        ("santa-prop:alloc=nearest", "alloc must be one of"),
        ("bernoulli:grouping=union", "grouping must be one of"),
        ("", "no method named"),
    ],
)
def test_bad_specs_raise_clear_errors(spec, message):
    with pytest.raises(MethodError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        parsed = parse_method_specs(spec)
        for method, overrides in parsed:
            method.resolve_params(overrides)


def test_byte_model_counts_k_unique_v_rows_and_the_stash():
    q, kv = decode_problem(batch=1, heads=4, kv_heads=2, n=100, d=8, dtype=torch.bfloat16)
    dense = REGISTRY.get("dense")
    out = dense.run_reference(q, kv, {})
    assert dense.bytes_read(out.reads, 2, 4) == 2 * 100 * 2 * 8 * 2  # K and V, 2 KV heads
    prop = REGISTRY.get("santa-prop")
    out = prop.run_reference(q, kv, prop.resolve_params({"S": 4}), seed=0)
    v_rows = int(out.reads.v_rows.sum())
    assert v_rows <= 2 * 8  # at most S per head, union over each group of 2
    kv_bytes = (100 * 2 * 8 + v_rows * 8) * 2
    # the logit stash is written once and read once per (head, token), at its dtype
    assert prop.bytes_read(out.reads, 2, 4) == kv_bytes + 2 * 4 * 4 * 100
    assert prop.bytes_read(out.reads, 2, 4, {"stash": "fp16"}) == kv_bytes + 2 * 2 * 4 * 100


def test_bernoulli_entry_composes_value_stages():
    q, kv = decode_problem(batch=1, heads=2, kv_heads=2, n=64, d=64)
    method = REGISTRY.get("bernoulli")
    for value in ("dense", "sys", "prop"):
        params = method.resolve_params({"value_stage": value, "S": 8})
        out = method.run_reference(q, kv, params, seed=1)
        assert out.reads.k_read_fraction < 1.0


def test_kernel_adapter_honours_the_stash_dtype(monkeypatch):
    """``santa-prop:stash=fp16`` must reach the kernel's workspace (it was once ignored).
    The kernel is stubbed: whether it runs here depends on whether Triton was imported
    in interpreter mode, which depends on the tests run before (tests/test_triton_santa.py
    runs it)."""
    import santa_kernels.triton_santa as ts
    from santa_bench.kernel_adapters import santa_prepare
    from santa_kernels.validate import InputError

    monkeypatch.setattr(ts, "santa_prop", lambda q, kv, S, **kw: (torch.zeros_like(q), None))
    seen = []
    real = ts.SantaWorkspace.for_inputs

    def spy(*args, **kw):
        ws = real(*args, **kw)
        seen.append(ws.stash.dtype)
        return ws

    monkeypatch.setattr(ts.SantaWorkspace, "for_inputs", spy)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 16, generator=gen)
    k, v = torch.randn(2, 1, 40, 2, 16, generator=gen)
    kv = sk.KVCache.contiguous(k, v)
    prepare = santa_prepare("santa_prop")
    prepare(q, kv, S=8, tile=16, stash="fp16").run()
    prepare(q, kv, S=8, tile=16).run()
    assert seen == [torch.float16, torch.float32]
    with pytest.raises(InputError, match="stash"):
        prepare(q, kv, S=8, tile=16, stash="fp8")


def test_flash_adapter_runs_the_one_kernel_and_old_options_fail(monkeypatch):
    """``santa-flash`` runs ``triton_santa_flash.santa_flash`` on a workspace split by
    its own rule (``flash_workspace``), and its rows name that function; the options of
    the kernels it had before (gather, passes, pairs) fail with one line naming what to
    drop, in a spec as in the registry; the other SANTA methods never took them."""
    import santa_kernels.triton_santa_flash as tsf
    from santa_bench.kernel_adapters import santa_prepare
    from santa_bench.methods.santa import kernel_function

    assert kernel_function(tsf.santa_flash) == "triton_santa_flash.santa_flash"
    calls = []

    def spy(q, kv, S, **kw):
        calls.append(kw["workspace"].num_splits)
        return torch.zeros_like(q), None

    monkeypatch.setattr(tsf, "santa_flash", spy)
    q = torch.randn(1, 4, 16)
    k, v = torch.randn(2, 1, 40, 2, 16)
    kv = sk.KVCache.contiguous(k, v)
    prepared = santa_prepare("santa_flash")(q, kv, S=8, tile=16)
    prepared.run()
    assert calls == [tsf.flash_workspace(q, kv, 8, 16).num_splits] * 2  # prepare runs once
    assert prepared.kernel_function == "test_methods.spy"  # the rows name what ran
    flash = REGISTRY.get("santa-flash")
    assert flash.resolve_params({"S": 8}) == {"S": 8, "tile": 64, "min_ctx": 0}
    for spec, drop in (("santa-flash:gather=compact", "gather=compact"),
                       ("santa-flash:S=2048,passes=2", "passes=2"),
                       ("santa-flash:pairs=on", "pairs=on"),
                       ("santa-flash:passes=2,gather=inline", "passes=2, gather=inline")):
        (method, overrides), = parse_method_specs(spec)
        with pytest.raises(MethodError) as err:
            method.resolve_params(overrides)
        assert str(err.value) == (
            f"santa-flash has one kernel now (one pass with compact V gathers); drop {drop}")
    with pytest.raises(MethodError, match="unknown parameter"):
        REGISTRY.get("santa-prop").resolve_params({"gather": "compact"})
