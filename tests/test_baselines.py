"""Dense baselines: SDPA math against the float64 reference; GPU backends skip cleanly."""

from __future__ import annotations

from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch

import santa_kernels as sk
from santa_bench.baselines import BASELINES, Prepared, Unsupported, get
from santa_bench.timing import measure

GPU_ONLY = ("sdpa-flash", "sdpa-cudnn", "flashinfer-tc", "flashinfer-cuda", "flashinfer-fa3",
            "flash-attn")
B, HQ, HKV, D, N = 3, 8, 2, 16, 37  # GQA group 4


def _inputs(dtype: torch.dtype, lengths: list[int] | None, seed: int, n: int = N):
    gen = torch.Generator().manual_seed(seed)
    q = 3 * torch.randn(B, HQ, D, generator=gen, dtype=dtype)
    k = torch.randn(B, n, HKV, D, generator=gen, dtype=dtype)
    v = torch.randn(B, n, HKV, D, generator=gen, dtype=dtype)
    lens = None if lengths is None else torch.tensor(lengths)
    return q, sk.KVCache.contiguous(k, v, lens)


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def test_registry_lists_every_baseline():
    timed = {name for name, b in BASELINES.items() if b.timed}
    assert timed == {"sdpa-math", *GPU_ONLY, "triton-splitkv"}
    for name, baseline in BASELINES.items():
        assert baseline.name == name and baseline.description
        assert baseline.target or baseline.decode
    assert get("flashinfer-tc").params == {"page_size": 16}
    assert get("flashinfer-fa3").params == {"page_size": 16}
    with pytest.raises(KeyError, match="known"):
        get("nope")


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("lengths", [[37, 20, 5], None])
def test_sdpa_math_matches_dense_reference(layout: str, lengths: list[int] | None):
    for seed, dtype, tol in ((0, torch.float64, 1e-12), (1, torch.float32, 1e-5)):
        q, kv = _inputs(dtype, lengths, seed)
        if layout == "paged":
            kv = kv.to_paged(8, generator=torch.Generator().manual_seed(seed))
        ref = sk.dense_attention(q, kv, compute_dtype=torch.float64).out
        prepared = get("sdpa-math").prepare(q, kv)
        assert isinstance(prepared, Prepared)
        out = prepared()
        assert out.shape == (B, HQ, D) and out.dtype == dtype
        assert _rel_err(out, ref) < tol
        assert prepared.notes["mask"] == (lengths is not None)
        assert ("kv_conversion" in prepared.notes) == (layout == "paged")
        assert prepared.inputs_bytes > 0


def test_sdpa_math_equal_lengths_shorter_than_cache_and_custom_scale():
    q, kv = _inputs(torch.float64, [30, 30, 30], seed=2, n=40)
    ref = sk.dense_attention(q, kv, scale=0.2, compute_dtype=torch.float64).out
    prepared = get("sdpa-math").prepare(q, kv, scale=0.2)
    assert not prepared.notes["mask"]
    assert _rel_err(prepared(), ref) < 1e-12


def test_prepare_rejects_unknown_params_and_bad_inputs():
    q, kv = _inputs(torch.float32, None, seed=3)
    with pytest.raises(ValueError, match="unknown parameter"):
        get("sdpa-math").prepare(q, kv, page_size=16)
    with pytest.raises(ValueError, match="q:"):
        get("sdpa-math").prepare(q[:, :3], kv)


def test_copier_builds_independent_copies_that_agree():
    q, kv = _inputs(torch.float32, [37, 20, 5], seed=4)
    make_copy = get("sdpa-math").copier(q, kv)
    first, second = make_copy(1), make_copy(2)
    torch.testing.assert_close(first(), second())
    assert first.run is not second.run


def test_sdpa_math_times_on_cpu():
    q, kv = _inputs(torch.float32, None, seed=5)
    prepared = get("sdpa-math").prepare(q, kv)
    t = measure(prepared, touched_bytes=prepared.inputs_bytes, l2_bytes=None, make_copy=None,
                device="cpu", warmup_ms=1, budget_ms=5, min_reps=3, max_reps=20)
    assert t.mode == "cpu-wall" and 3 <= t.n <= 20


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answer")
@pytest.mark.parametrize("name", GPU_ONLY)
def test_gpu_only_backends_report_unavailable_on_cpu(name: str):
    ok, reason = get(name).available("cpu")
    assert not ok and reason
    q, kv = _inputs(torch.float32, None, seed=6)
    with pytest.raises(Unsupported):
        get(name).prepare(q, kv)


@pytest.mark.parametrize(
    ("capability", "cuda", "why"),
    [((9, 0), "12.4", ""), ((9, 0), "13.0", ""), ((8, 0), "12.4", "Hopper GPU (sm90), this one"),
     ((10, 0), "12.8", "sm100"), ((9, 0), "12.1", "CUDA >= 12.3"), ((9, 0), None, "CUDA >= 12.3")],
)
def test_fa3_needs_hopper_and_cuda_12_3(capability, cuda, why):
    from santa_bench.baselines.flashinfer import fa3_support

    ok, reason = fa3_support(capability, cuda)
    assert ok == (why == "") and why in reason


def test_flashinfer_fa3_entry_says_why_it_cannot_run_on_a_cpu():
    from santa_bench.methods import REGISTRY

    method = REGISTRY.get("flashinfer-fa3")
    assert method.family == "baseline" and method.kernel_kind == "baseline"
    assert method.plot.colour is not None
    ok, reason = method.kernel_available()
    if not torch.cuda.is_available():
        assert not ok and reason.startswith("flashinfer-fa3: ")
        assert "flashinfer not installed" in reason or "needs CUDA" in reason


class _FakeWrapper:
    """Records how the FlashInfer decode wrapper is built, planned and run."""

    made: ClassVar[list[_FakeWrapper]] = []

    def __init__(self, workspace, layout, **kwargs):
        self.layout, self.kwargs, self.plans, self.runs = layout, kwargs, [], []
        _FakeWrapper.made.append(self)

    def plan(self, *args, **kwargs):
        self.plans.append((args, kwargs))

    def run(self, q, pages, out):
        self.runs.append((q, pages))
        return out.fill_(1.0)


def _fake_flashinfer(monkeypatch, wrapper: type) -> None:
    """FlashInfer replaced by ``wrapper``, available on any device (no GPU needed)."""
    from santa_bench.baselines import flashinfer as fi

    monkeypatch.setattr(fi, "flashinfer", SimpleNamespace(
        BatchDecodeWithPagedKVCacheWrapper=wrapper))
    monkeypatch.setattr(fi, "gpu_available", lambda name, device, backend: (True, ""))
    monkeypatch.setattr(fi, "workspace", lambda device: torch.zeros(8, dtype=torch.uint8))


def test_flashinfer_fa3_passes_backend_fa3_and_plans_outside_the_call(monkeypatch):
    _fake_flashinfer(monkeypatch, _FakeWrapper)
    _FakeWrapper.made.clear()
    q, kv = _inputs(torch.bfloat16, [37, 20, 5], seed=10)
    prepared = get("flashinfer-fa3").prepare(q, kv, scale=0.25)
    (wrapper,) = _FakeWrapper.made
    assert wrapper.layout == "NHD"
    assert wrapper.kwargs == {"use_tensor_cores": True, "backend": "fa3"}
    (args, kwargs), = wrapper.plans
    indptr, indices, last_page_len, hq, hkv, d, page_size = args
    assert (hq, hkv, d, page_size) == (HQ, HKV, D, 16)
    assert indptr.tolist() == [0, 3, 5, 6] and last_page_len.tolist() == [5, 4, 5]
    assert indices.numel() == 6
    assert kwargs["q_data_type"] == kwargs["kv_data_type"] == torch.bfloat16
    assert kwargs["sm_scale"] == 0.25 and kwargs["pos_encoding_mode"] == "NONE"
    assert len(wrapper.runs) == 1  # the trial call of prepare
    out = prepared()
    assert len(wrapper.plans) == 1 and len(wrapper.runs) == 2  # no plan() in the timed call
    assert out.shape == (B, HQ, D) and out.dtype == torch.bfloat16
    assert prepared.notes["flashinfer_backend"] == "fa3"
    assert prepared.notes["baseline"] == "flashinfer-fa3"
    k_pages, v_pages = wrapper.runs[-1][1]
    assert k_pages.shape[1:] == (16, HKV, D) and v_pages.shape == k_pages.shape
    # the other paths keep FlashInfer's default backend
    get("flashinfer-tc").prepare(q, kv)
    assert _FakeWrapper.made[-1].kwargs == {"use_tensor_cores": True, "backend": "auto"}
    get("flashinfer-cuda").prepare(q, kv)
    assert _FakeWrapper.made[-1].kwargs == {"use_tensor_cores": False, "backend": "auto"}


def test_flashinfer_plan_failure_is_unsupported(monkeypatch):
    class Broken(_FakeWrapper):
        def plan(self, *args, **kwargs):
            raise RuntimeError("no kernel for head_dim 16")

    _fake_flashinfer(monkeypatch, Broken)
    q, kv = _inputs(torch.bfloat16, None, seed=11)
    with pytest.raises(Unsupported, match="flashinfer-fa3: RuntimeError: no kernel"):
        get("flashinfer-fa3").prepare(q, kv)


def test_triton_splitkv_availability_does_not_crash():
    ok, reason = get("triton-splitkv").available("cpu")
    assert isinstance(ok, bool) and isinstance(reason, str)
    assert ok or reason
    if ok:  # Triton's interpreter (TRITON_INTERPRET=1): check the values too
        q, kv = _inputs(torch.float32, [37, 20, 5], seed=9)
        ref = sk.dense_attention(q, kv, compute_dtype=torch.float64).out
        assert _rel_err(get("triton-splitkv").prepare(q, kv)(), ref) < 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", [*GPU_ONLY, "sdpa-math", "triton-splitkv"])
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("lengths", [[1000, 777, 64, 1], [1000, 1000, 1000, 1000]])
def test_gpu_backends_match_reference(name: str, layout: str, lengths: list[int]):
    baseline = get(name)
    ok, reason = baseline.available("cuda")
    if not ok:
        pytest.skip(reason)
    gen = torch.Generator().manual_seed(7)
    batch, n = 4, 1000
    q = (3 * torch.randn(batch, 32, 128, generator=gen)).to("cuda", torch.bfloat16)
    k = torch.randn(batch, n, 8, 128, generator=gen).to("cuda", torch.bfloat16)
    v = torch.randn(batch, n, 8, 128, generator=gen).to("cuda", torch.bfloat16)
    kv = sk.KVCache.contiguous(k, v, torch.tensor(lengths, device="cuda"))
    if layout == "paged":
        kv = kv.to_paged(16, generator=torch.Generator().manual_seed(8))
    ref = sk.dense_attention(q.cpu(), _to_cpu(kv), compute_dtype=torch.float64).out
    try:
        prepared = baseline.prepare(q, kv)
    except Unsupported as exc:
        pytest.skip(str(exc))
    out = prepared()
    torch.cuda.synchronize()
    assert out.shape == (batch, 32, 128)
    assert _rel_err(out.cpu(), ref) < 2e-2


def _to_cpu(kv: sk.KVCache) -> sk.KVCache:
    if kv.layout == "paged":
        return sk.KVCache.paged(kv.k.cpu(), kv.v.cpu(), kv.page_table.cpu(), kv.lengths.cpu())
    return sk.KVCache.contiguous(kv.k.cpu(), kv.v.cpu(), kv.lengths.cpu())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", [*GPU_ONLY, "triton-splitkv"])
def test_gpu_backends_time_cold_in_both_modes(name: str):
    baseline = get(name)
    ok, reason = baseline.available("cuda")
    if not ok:
        pytest.skip(reason)
    q = torch.randn(1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 8192, 8, 128, device="cuda", dtype=torch.bfloat16)
    kv = sk.KVCache.contiguous(k, torch.randn_like(k))
    try:
        prepared = baseline.prepare(q, kv)
    except Unsupported as exc:
        pytest.skip(str(exc))
    for graph in (True, False):
        t = measure(prepared, touched_bytes=prepared.inputs_bytes, l2_bytes=None,
                    make_copy=baseline.copier(q, kv), graph=graph, device="cuda",
                    budget_ms=50)
        assert t.l2_state == "cold" and t.n_copies > 1 and t.median_us > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("hq", "hkv", "d"), [(14, 2, 64), (32, 8, 128)])
def test_gpu_flashinfer_fa3_matches_sdpa_at_32k(hq: int, hkv: int, d: int):
    """FlashInfer's FA3 decode against fp32 SDPA at 32k: two sequences of unequal length."""
    import torch.nn.functional as F

    baseline = get("flashinfer-fa3")
    ok, reason = baseline.available("cuda")
    if not ok:
        pytest.skip(reason)
    gen = torch.Generator().manual_seed(12)
    n, lengths = 32768, [32768, 20000]
    q = (3 * torch.randn(2, hq, d, generator=gen)).to("cuda", torch.bfloat16)
    k = torch.randn(2, n, hkv, d, generator=gen).to("cuda", torch.bfloat16)
    v = torch.randn(2, n, hkv, d, generator=gen).to("cuda", torch.bfloat16)
    kv = sk.KVCache.contiguous(k, v, torch.tensor(lengths, device="cuda"))
    out = baseline.prepare(q, kv)().float()
    for b, length in enumerate(lengths):
        keys = k[b, :length].float().transpose(0, 1).repeat_interleave(hq // hkv, dim=0)
        values = v[b, :length].float().transpose(0, 1).repeat_interleave(hq // hkv, dim=0)
        ref = F.scaled_dot_product_attention(q[b].float()[:, None], keys, values)[:, 0]
        assert _rel_err(out[b], ref) < 2e-2, (b, _rel_err(out[b], ref))


def test_one_registry_serves_timing_and_decoding():
    """The e2e dense backends are the registry's baselines with a decode backend, under
    the names stored rows carry; the timed ones are the methods of the baseline family."""
    from santa_bench.baselines import decode_names
    from santa_bench.e2e import attention
    from santa_bench.methods import REGISTRY

    assert set(decode_names()) == {"sdpa", "triton-splitkv", "flashinfer-tc",
                                   "flashinfer-cuda", "flashinfer-fa3", "flash-attn"}
    assert set(attention.DENSE_BACKENDS) == set(decode_names())
    assert {m.name for m in REGISTRY if m.family == "baseline"} == {
        name for name, b in BASELINES.items() if b.timed}
    made = {name: attention.dense_backend(name, 0.5) for name in decode_names()}
    assert isinstance(made["sdpa"], attention.SdpaDecode)
    assert isinstance(made["triton-splitkv"], attention.TritonSplitKVDecode)
    assert [made[n].name for n in ("flashinfer-tc", "flashinfer-cuda", "flashinfer-fa3")] == [
        "flashinfer-tc", "flashinfer-cuda", "flashinfer-fa3"]
    assert made["flashinfer-fa3"].backend == "fa3" and not made["flashinfer-cuda"].use_tensor_cores
    with pytest.raises(ValueError, match="unknown dense backend 'sdpa-math'"):
        attention.dense_backend("sdpa-math", 0.5)  # timed only


def test_a_plugin_baseline_is_timed_and_decodes(monkeypatch):
    from santa_bench import baselines, methods
    from santa_bench.methods import REGISTRY, Registry
    from santa_bench.methods._core import register as real_register

    scratch = Registry(REGISTRY)  # the global method registry stays untouched
    monkeypatch.setattr(methods.baseline, "register",
                        lambda build: real_register(build, registry=scratch))
    entry = baselines.Baseline("my-dense", "a plugin's exact kernel", {},
                               "santa_bench.baselines.sdpa:MATH",
                               "santa_bench.e2e.attention:SdpaDecode")
    try:
        _check_plugin_baseline(entry, scratch)
    finally:
        BASELINES.pop("my-dense", None)


def _check_plugin_baseline(entry, scratch) -> None:
    from santa_bench import baselines, methods
    from santa_bench.e2e import attention
    from santa_bench.e2e.runner import E2EGrid, expand_cases
    from santa_bench.methods import REGISTRY

    assert methods.register_baseline(entry) is entry
    method = scratch.get("my-dense")
    assert method.family == "baseline" and method.module == "santa_bench.baselines.sdpa"
    q, kv = _inputs(torch.float64, [37, 20, 5], 0)
    dense = sk.attention(q, kv, value="dense", compute_dtype=torch.float64).out
    assert torch.allclose(method.prepare(q, kv)(), dense)
    assert "my-dense" in baselines.decode_names()
    assert isinstance(attention.dense_backend("my-dense", 0.5), attention.SdpaDecode)
    grid = E2EGrid(model="tiny", weights="random", methods=[(REGISTRY.get("dense"), {})],
                   ctx=[64], batch=[1], device="cuda", rest="torch", dense_backends=None)
    assert "my-dense" in {case["backend"] for case in expand_cases(grid)}
    with pytest.raises(ValueError, match="registered twice"):
        baselines.register_baseline(entry)
