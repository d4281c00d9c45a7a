"""The Triton decode GEMMs (santa_bench.e2e.gemm), SiLU*mul inside gate/up.

Through Triton's interpreter on a CPU, or compiled on a GPU, against float64 references
of the ops they replace: the projection (and bias), SiLU*mul. fp32 is held to float
rounding; 16-bit types to a few steps of their rounding (the interpreter casts to bf16
by truncation).
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
import torch.nn.functional as F
from test_e2e_fused import check_fast_step_matches_eager

from santa_bench.e2e import fused, gemm
from santa_bench.e2e.attention import LayerRouting, dense_backend
from santa_bench.e2e.gemm import (
    MAX_ROWS,
    decode_linear,
    decode_linear_add,
    gemm_config,
    qkv_rope,
    row_sumsq,
)
from santa_bench.e2e.loop import DecodeSession, resolve_rest
from santa_bench.e2e.model import Decoder, _fold_norm, rms_norm
from santa_kernels.validate import InputError

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETED else "cuda"
pytestmark = pytest.mark.skipif(not INTERPRETED and not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 or a GPU")
TOL = {torch.float32: 1e-6, torch.float16: 4e-3, torch.bfloat16: 3e-2}
CONFIG = (16, 32, 4, 2)  # small blocks: several programs, several K steps, an N tail


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    assert torch.isfinite(got).all()
    return float((got.double() - want).norm() / want.norm())


def _inputs(rows: int, k: int, n: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen).to(DEVICE, dtype)
    weight = (torch.randn(n, k, generator=gen) / k**0.5).to(DEVICE, dtype)
    bias = torch.randn(n, generator=gen).to(DEVICE, dtype)
    return x, weight, bias


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 17])
def test_plain_and_biased_projection(dtype, rows):
    x, weight, bias = _inputs(rows, 96, 40, dtype, 0)  # 40 columns: a masked tail
    y = decode_linear(x, weight, config=CONFIG)
    assert y.shape == (rows, 40) and y.dtype == dtype
    assert _rel(y, x.double() @ weight.double().T) < TOL[dtype]
    y = decode_linear(x, weight, bias=bias, config=CONFIG)
    assert _rel(y, x.double() @ weight.double().T + bias.double()) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_inside(dtype):
    x, weight, _ = _inputs(2, 64, 2 * 24, dtype, 2)
    y = decode_linear(x, weight, silu=True, config=CONFIG)
    gate, up = (x.double() @ weight.double().T).chunk(2, dim=-1)
    assert y.shape == (2, 24)
    assert _rel(y, F.silu(gate) * up) < TOL[dtype]


def test_every_written_column_and_nothing_more():
    """Each of the N columns written, from the right weight rows."""
    x, weight, _ = _inputs(2, 64, 35, torch.float32, 3)
    weight[7] = 0.0
    y = decode_linear(x, weight, config=(16, 16, 4, 2))
    assert torch.isfinite(y).all() and not y[:, 7].any() and y[:, 8].abs().sum() > 0


def test_four_byte_weights_take_k_steps_of_the_same_bytes():
    # the bf16 launches at fp32 needed 295 KB of shared memory (scripts/check_compile.py)
    for n_out, k, silu in ((4096, 4096, False), (14336, 4096, True), (128256, 4096, False)):
        bf16, fp32 = gemm_config(n_out, k, silu, 2), gemm_config(n_out, k, silu, 4)
        assert fp32[1] * 4 == bf16[1] * 2 and fp32[0] == bf16[0]


def test_bad_inputs_are_clear_errors():
    x, weight, bias = _inputs(2, 64, 32, torch.float32, 4)
    with pytest.raises(InputError, match=r"x \[M, K\]"):
        decode_linear(x, weight[:, :32])
    with pytest.raises(InputError, match="rows"):
        decode_linear(torch.randn(MAX_ROWS + 1, 64, device=DEVICE), weight)
    with pytest.raises(InputError, match="bias"):
        decode_linear(x, weight, bias=bias[:5])
    with pytest.raises(InputError, match="does not match"):
        decode_linear(x, weight.double())
    with pytest.raises(InputError, match="gate/up"):
        decode_linear(x, weight[:31], silu=True)
    with pytest.raises(InputError, match="multiple of 16"):
        gemm_config(32, 72)
    with pytest.raises(InputError, match="rest=gemm"):
        resolve_rest("gemm", torch.device(DEVICE), batch=MAX_ROWS + 1)
    assert resolve_rest("fused", torch.device(DEVICE), batch=MAX_ROWS + 1) == "fused"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_residual_add_inside_and_its_norm_statistic(dtype):
    x, weight, _ = _inputs(3, 64, 40, dtype, 5)
    residual = torch.randn(3, 40, generator=torch.Generator().manual_seed(6)).to(DEVICE, dtype)
    y, stat = decode_linear_add(x, weight, residual, config=CONFIG)
    assert y.shape == (3, 40) and y.dtype == dtype and stat.shape == (3, 3)  # 3 programs
    assert _rel(y, residual.double() + x.double() @ weight.double().T) < TOL[dtype]
    # the statistic is of the rounded sum, as the eager RMSNorm sees it
    torch.testing.assert_close(stat.sum(0).double(), y.double().pow(2).sum(-1), rtol=1e-5,
                               atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("silu", [False, True])
def test_rms_norm_by_its_statistic_with_the_weight_folded_in(dtype, silu):
    x, weight, _ = _inputs(2, 64, 48, dtype, 7)
    g = (1 + 0.3 * torch.randn(64, generator=torch.Generator().manual_seed(8))).to(DEVICE, dtype)
    want = rms_norm(x.double(), g.double(), 1e-5) @ weight.double().T
    if silu:
        gate, up = want.chunk(2, dim=-1)
        want = F.silu(gate) * up
    split = torch.stack([x[:, :40].double().pow(2).sum(-1), x[:, 40:].double().pow(2).sum(-1)])
    for stat in (row_sumsq(x), split.float().contiguous()):  # one partial, or two
        y = decode_linear(x, _fold_norm(weight, g), silu=silu, norm_stat=stat, eps=1e-5,
                          config=CONFIG)
        assert _rel(y, want) < 2 * TOL[dtype]


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim, bias", [(16, True), (64, False), (80, True)])
def test_qkv_rope_is_the_projection_then_rope_write(head_dim, bias, dtype, layout):
    """One kernel against its two (decode_linear with the norm, fused.rope_write): the
    same q and cache rows, nothing else written. head_dim 16: half a program's pairs
    masked; 64: two programs a head (pairs=16); 80: a masked second program."""
    gen = torch.Generator().manual_seed(9)
    hq, hkv, batch, k = 4, 2, 3, 64
    width = (hq + 2 * hkv) * head_dim
    x = torch.randn(batch, k, generator=gen).to(DEVICE, dtype)
    weight = (torch.randn(width, k, generator=gen) / k**0.5).to(DEVICE, dtype)
    b = torch.randn(width, generator=gen).to(DEVICE, dtype) if bias else None
    cos, sin = (torch.randn(64, head_dim, generator=gen).to(DEVICE, dtype) for _ in range(2))
    positions = torch.tensor([7, 37, 12], device=DEVICE)
    page_size, table = 8, None
    if layout == "paged":
        table = torch.randperm(batch * 8, generator=gen).view(batch, 8).to(DEVICE, torch.int32)
        shape = (batch * 8, page_size, hkv, head_dim)
    else:
        shape = (batch, 64, hkv, head_dim)
    caches = {key: [torch.zeros(shape, dtype=dtype, device=DEVICE) for _ in range(2)]
              for key in ("one", "two")}
    stat = row_sumsq(x)
    q = qkv_rope(x, weight, b, stat, 1e-5, cos, sin, positions, *caches["one"], hq, hkv,
                 head_dim, table, page_size, config=(16, 32, 4, 2))
    qkv = decode_linear(x, weight, bias=b, norm_stat=stat, eps=1e-5, config=CONFIG)
    want = fused.rope_write(qkv, cos, sin, positions, *caches["two"], hq, hkv, head_dim,
                            table, page_size)
    step = 1e-6 if dtype == torch.float32 else 2**-6  # one rounding of the projection apart
    torch.testing.assert_close(q.float(), want.float(), rtol=step,
                               atol=step * float(want.abs().max()))
    for got, ref in zip(caches["one"], caches["two"], strict=True):
        torch.testing.assert_close(got.float(), ref.float(), rtol=step,
                                   atol=step * float(ref.abs().max()))
        assert torch.equal(got != 0, ref != 0)  # the same rows written, nothing else


def test_qkv_rope_bad_inputs_are_clear_errors():
    x, weight, _ = _inputs(2, 64, 8 * 16, torch.float32, 10)
    cache = torch.zeros(2, 8, 2, 16, device=DEVICE)
    pos = torch.tensor([1, 2], device=DEVICE)
    args = (None, None, 1e-5, cache[0, :, 0], cache[0, :, 0], pos, cache, cache)
    with pytest.raises(InputError, match="weight"):
        qkv_rope(x, weight[:100], *args, 4, 2, 16)
    with pytest.raises(InputError, match="positions"):
        qkv_rope(x, weight, *args[:5], pos[:1], cache, cache, 4, 2, 16)
    with pytest.raises(InputError, match="norm_stat"):
        qkv_rope(x, weight, None, torch.ones(1, 3, device=DEVICE), *args[2:], 4, 2, 16)
    with pytest.raises(InputError, match="residual"):
        decode_linear_add(x, weight, torch.zeros(2, 5, device=DEVICE))


@pytest.mark.parametrize("config", ["tiny", "tiny-qwen"])  # qwen: the QKV bias, tied head
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_gemm_decode_matches_the_eager_step(layout, config):
    check_fast_step_matches_eager("gemm", layout, config)


@pytest.mark.parametrize("config", ["tiny", "tiny-qwen"])
def test_gemm_decode_folds_real_norm_weights(config):
    check_fast_step_matches_eager("gemm", "contiguous", config, norm_weights=True)


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRETED, reason="programmatic dependent launch: compiled, on a GPU")
def test_gpu_pdl_launches_change_nothing(monkeypatch):
    """Each kernel of the gemm rest waits for the one before it: with and without PDL
    (graph replays, bf16) the same deterministic kernels give the same bits."""
    from santa_bench.e2e.configs import ModelConfig

    config = ModelConfig("gpu-small", "llama", 2, 512, 8, 2, 128, 1024, 512, 4096, 10000.0)
    model = Decoder.random(config, device="cuda", dtype=torch.bfloat16, std=0.05)
    session = DecodeSession(model, batch=4, ctx=300, steps=6)
    session.prefill("dense", chunk=128)
    runs = {}
    for pdl in (True, False):
        monkeypatch.setattr(gemm, "PDL", pdl)
        assert gemm.use_pdl(torch.device("cuda")) == (pdl and gemm.pdl_available(
            torch.device("cuda")))
        attend = LayerRouting(dense_backend("triton-splitkv", session.scale))
        session.prepare(attend)
        runs[pdl] = session.decode(attend, keep_logits=True, rest="gemm", graph=True)
    assert torch.equal(runs[True].tokens, runs[False].tokens)
    assert torch.equal(runs[True].logits, runs[False].logits)
