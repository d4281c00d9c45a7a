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

from santa_bench.e2e import gemm
from santa_bench.e2e.attention import LayerRouting, dense_backend
from santa_bench.e2e.gemm import MAX_ROWS, decode_linear, gemm_config
from santa_bench.e2e.loop import DecodeSession, resolve_rest
from santa_bench.e2e.model import Decoder
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


@pytest.mark.parametrize("config", ["tiny", "tiny-qwen"])  # qwen: the QKV bias, tied head
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_gemm_decode_matches_the_eager_step(layout, config):
    check_fast_step_matches_eager("gemm", layout, config)


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRETED, reason="programmatic dependent launch: compiled, on a GPU")
@pytest.mark.parametrize("backend", ["triton-splitkv", "triton-splitkv merge-pdl", "santapp",
                                     "santapp batch 9", "santapp int8 batch 9",
                                     "santapp atomic", "santapp atomic int8 batch 9",
                                     "santa-prop batch 16"])
def test_gpu_pdl_launches_change_nothing(monkeypatch, backend):
    """Each kernel of the gemm rest waits for the one before it, and so does the attention
    call inside that chain (its first kernel a programmatic dependent, its last letting the
    O GEMM launch early): with and without PDL (graph replays, bf16) the same deterministic
    kernels give the same bits. SANTA++ at batch 4 (8 KV groups) and 9 (18, above
    ``HOPPER["pdl_max_groups"]``): its chain with and without PDL between its own kernels;
    with int8 representatives the run without PDL also launches select, the finisher and
    attend one after the other (``pdl_before_merge`` off). santa-prop: its score pass a
    dependent of the K/V write, its sample pass letting the O GEMM launch early (from 32 KV
    groups, where its score pass streams in several waves: 16 x 2 here). SANTA++ merges with
    the merge kernel (bitwise reproducible) except for "atomic": the atomic merge, whose
    sums' order varies, so the logits agree to bf16 rounding of the last layers' outputs
    there."""
    import santa_kernels.triton_santapp as tsp
    import santa_kernels.triton_splitkv as tsk
    from santa_bench.e2e.configs import ModelConfig
    from santa_bench.methods import REGISTRY
    from santa_bench.methods.santa import TritonSampledDecode
    from santa_bench.methods.santapp import TritonSantaPPDecode

    config = ModelConfig("gpu-small", "llama", 2, 512, 8, 2, 128, 1024, 512, 4096, 10000.0)
    model = Decoder.random(config, device="cuda", dtype=torch.bfloat16, std=0.05)
    batch = int(backend.split("batch ")[1]) if "batch " in backend else 4
    session = DecodeSession(model, batch=batch, ctx=300, steps=6)
    session.prefill("dense", chunk=128)
    monkeypatch.setattr(tsk, "MERGE_PDL", backend.endswith("merge-pdl"))
    params = {p.name: p.default for p in REGISTRY.get("santapp").params} | {"M": 4}
    if "int8" in backend:  # int8 representatives: select -> finish -> attend as dependents
        params["reps"] = "int8"
    atomic = "atomic" in backend
    params["merge"] = "atomic" if atomic else "kernel"
    runs = {}
    for pdl in (True, False):
        monkeypatch.setattr(gemm, "PDL", pdl)
        monkeypatch.setitem(tsp.HOPPER, "pdl_before_merge", "int8" if pdl else False)
        assert gemm.use_pdl(torch.device("cuda")) == (pdl and gemm.pdl_available(
            torch.device("cuda")))
        if backend.startswith("santapp"):
            main = TritonSantaPPDecode(params, session.scale, seed=3)
        elif backend.startswith("santa-prop"):
            prop = REGISTRY.get("santa-prop")
            main = TritonSampledDecode(prop, {p.name: p.default for p in prop.params}
                                       | {"S": 16}, session.scale, seed=3)
        else:
            main = dense_backend("triton-splitkv", session.scale)
        attend = LayerRouting(main)
        session.prepare(attend)
        runs[pdl] = session.decode(attend, keep_logits=True, rest="gemm", graph=True)
        assert main.pdl_chain == (pdl and gemm.pdl_available(torch.device("cuda")))
    if atomic:  # the first step's logits within the sums' rounding (later steps may
        # feed different greedy tokens where two logits nearly tie)
        first = runs[True].logits[0].float(), runs[False].logits[0].float()
        torch.testing.assert_close(*first, rtol=0.02, atol=0.02)
        return
    assert torch.equal(runs[True].tokens, runs[False].tokens)
    assert torch.equal(runs[True].logits, runs[False].logits)
