"""The fused decode step (santa_bench.e2e.fused) against the eager ops of model.py.

Through Triton's interpreter on a CPU, or compiled on a GPU. Results must match the eager
ops to about an ulp: the kernels round where the eager ops round, but exp, the fp32 sum
order and the compiler (which may keep an intermediate in fp32) differ, and the
interpreter casts fp32 to bf16 by truncation (a GPU rounds). Half types are held to two
steps of the largest term (RoPE's sum of two rounded terms can cancel).
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
import torch.nn.functional as F

from santa_bench.e2e import fused
from santa_bench.e2e.attention import LayerRouting, dense_backend
from santa_bench.e2e.configs import NAMED
from santa_bench.e2e.loop import DecodeSession, resolve_rest
from santa_bench.e2e.model import Decoder, _rotate_half, rms_norm
from santa_kernels.validate import InputError

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETED else "cuda"  # compiled kernels take GPU tensors
pytestmark = pytest.mark.skipif(not INTERPRETED and not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 or a GPU")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    step = {torch.bfloat16: 2**-7, torch.float16: 2**-9, torch.float32: 2**-21}[got.dtype]
    atol = step * float(want.abs().max()) if got.dtype != torch.float32 else 1e-6
    torch.testing.assert_close(got.float(), want.float(), rtol=step, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_rounds_as_the_eager_ops(dtype):
    gen = torch.Generator().manual_seed(0)
    x, delta = (torch.randn(3, 96, generator=gen).to(DEVICE, dtype) for _ in range(2))
    weight = (torch.rand(96, generator=gen) + 0.5).to(DEVICE, dtype)
    x_new, h = fused.add_rms_norm(x, delta, weight, 1e-5)
    _close(x_new, x + delta)
    _close(h, rms_norm(x + delta, weight, 1e-5))
    same, h = fused.add_rms_norm(x, None, weight, 1e-5)  # no residual: x itself
    assert same is x
    _close(h, rms_norm(x, weight, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_rounds_as_the_eager_ops(dtype):
    gen = torch.Generator().manual_seed(1)
    gate_up = (torch.randn(3, 2 * 1500, generator=gen) * 3).to(DEVICE, dtype)
    gate, up = gate_up.chunk(2, dim=-1)  # 1500 columns: two blocks, a masked tail
    _close(fused.silu_mul(gate_up), F.silu(gate) * up)


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_write_rotates_and_writes_only_the_new_rows(dtype, layout):
    gen = torch.Generator().manual_seed(2)
    hq, hkv, d, batch = 4, 2, 16, 2
    qkv = torch.randn(batch, (hq + 2 * hkv) * d, generator=gen).to(DEVICE, dtype)
    cos, sin = (torch.randn(64, d, generator=gen).to(DEVICE, dtype) for _ in range(2))
    positions = torch.tensor([7, 37], device=DEVICE)
    page_size, table = 8, None
    if layout == "paged":  # sequence b's page p is pool page table[b, p] (shuffled)
        table = torch.randperm(batch * 8, generator=gen).view(batch, 8).to(DEVICE, torch.int32)
        k_cache = torch.zeros(batch * 8, page_size, hkv, d, dtype=dtype, device=DEVICE)
    else:
        k_cache = torch.zeros(batch, 64, hkv, d, dtype=dtype, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    q = fused.rope_write(qkv, cos, sin, positions, k_cache, v_cache, hq, hkv, d, table,
                         page_size)
    c, s = cos[positions][:, None], sin[positions][:, None]
    q_ref, k_ref, v_ref = qkv.split([hq * d, hkv * d, hkv * d], dim=1)
    q_ref, k_ref = (t.view(batch, -1, d) for t in (q_ref, k_ref))
    _close(q, q_ref * c + _rotate_half(q_ref) * s)
    rows = torch.arange(batch, device=DEVICE)
    if layout == "paged":
        index = (table[rows, positions // page_size].long(), positions % page_size)
    else:
        index = (rows, positions)
    _close(k_cache[index], k_ref * c + _rotate_half(k_ref) * s)
    assert torch.equal(v_cache[index], v_ref.reshape(batch, hkv, d))
    k_cache[index], v_cache[index] = 0, 0  # nothing else written
    assert not k_cache.any() and not v_cache.any()


def test_bad_inputs_are_clear_errors():
    x = torch.randn(2, 8, device=DEVICE)
    with pytest.raises(InputError, match="delta"):
        fused.add_rms_norm(x, torch.randn(2, 4, device=DEVICE), torch.ones(8, device=DEVICE), 1e-5)
    with pytest.raises(InputError, match=r"\[M, 2I\]"):
        fused.silu_mul(torch.randn(2, 7, device=DEVICE))
    cache = torch.zeros(2, 16, 1, 4, device=DEVICE)
    table = torch.ones(16, 4, device=DEVICE)
    with pytest.raises(InputError, match="qkv"):
        fused.rope_write(torch.randn(2, 10, device=DEVICE), table, table,
                         torch.zeros(2, dtype=torch.long, device=DEVICE), cache, cache.clone(),
                         2, 1, 4)


def check_fast_step_matches_eager(rest: str, layout: str, config: str = "tiny") -> None:
    """fp32: the ``rest`` decode step (fused or gemm) gives the eager step's tokens, logits
    (to 1e-5) and K cache."""
    model = Decoder.random(NAMED[config], dtype=torch.float32, std=0.1, device=DEVICE)
    session = DecodeSession(model, batch=2, ctx=40, steps=4, layout=layout, page_size=8)
    session.prefill("dense", None, chunk=16)
    runs = {}
    for mode in ("torch", rest):
        attend = LayerRouting(dense_backend("sdpa", session.scale))
        session.prepare(attend)
        runs[mode] = (session.decode(attend, keep_logits=True, rest=mode, graph=False),
                      [k.clone() for k in session.cache.k])
    (eager, eager_k), (fast, fast_k) = runs["torch"], runs[rest]
    assert torch.equal(fast.tokens, eager.tokens)
    torch.testing.assert_close(fast.logits, eager.logits, rtol=1e-5, atol=1e-5)
    for got, want in zip(fast_k, eager_k, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_fused_decode_matches_the_eager_step(layout):
    check_fast_step_matches_eager("fused", layout)


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRETED, reason="compiled kernels, bf16 on a GPU")
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_gpu_bf16_fused_decode_matches_the_eager_step(layout):
    from santa_bench.e2e.configs import ModelConfig

    config = ModelConfig("gpu-small", "llama", 2, 512, 8, 2, 128, 512, 512, 4096, 10000.0)
    model = Decoder.random(config, device="cuda", dtype=torch.bfloat16, std=0.05)
    session = DecodeSession(model, batch=2, ctx=300, steps=4, layout=layout, page_size=16)
    session.prefill("dense", chunk=128)
    logits = {}
    for rest in ("torch", "fused", "gemm"):
        for graph in (False, True):
            attend = LayerRouting(dense_backend("triton-splitkv", session.scale))
            session.prepare(attend)
            result = session.decode(attend, keep_logits=True, rest=rest, graph=graph)
            logits[rest, graph] = result.logits[0].double()
    want = logits["torch", False]
    for key, got in logits.items():  # bf16 rounding differences only (H200: 1.07e-2 fused;
        # two dense attention backends differ as much, test_e2e.py's 2e-2); fp32 is exact
        assert float((got - want).norm() / want.norm()) < 2e-2, key


@pytest.mark.skipif(not INTERPRETED, reason="the CPU refusal is checked on a CPU")
def test_fused_needs_a_gpu_or_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    ok, why = fused.fused_available(torch.device("cpu"))
    assert not ok and "GPU" in why
    model = Decoder.random(NAMED["tiny"], dtype=torch.float32)
    session = DecodeSession(model, batch=1, ctx=8, steps=2)
    session.prefill("random")
    attend = LayerRouting(dense_backend("sdpa", session.scale))
    session.prepare(attend)
    with pytest.raises(InputError, match="rest=fused"):
        session.decode(attend, rest="fused")
    with pytest.raises(InputError, match="rest"):
        session.decode(attend, rest="fast")
    assert resolve_rest(None, torch.device("cpu")) == "torch"
    assert resolve_rest("auto", torch.device("cuda")) == "gemm"
    assert resolve_rest("auto", torch.device("cuda"), batch=32) == "gemm"
    assert resolve_rest("auto", torch.device("cuda"), batch=33) == "fused"
    with pytest.raises(InputError, match="--rest=fused: the fused step needs"):
        resolve_rest("fused", torch.device("cpu"), "--rest")
