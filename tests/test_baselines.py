"""Dense baselines: SDPA math against the float64 reference; GPU backends skip cleanly."""

from __future__ import annotations

import pytest
import torch

import santa_kernels as sk
from santa_bench.baselines import BASELINES, Prepared, Unsupported, get
from santa_bench.timing import measure

GPU_ONLY = ("sdpa-flash", "sdpa-cudnn", "flashinfer-tc", "flashinfer-cuda", "flash-attn")
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
    assert set(BASELINES) == {"sdpa-math", *GPU_ONLY, "triton-splitkv"}
    for name, baseline in BASELINES.items():
        assert baseline.name == name and baseline.description and baseline.target
    assert get("flashinfer-tc").params == {"page_size": 16}
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
