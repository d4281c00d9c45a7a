"""Decode GEMMs in Triton (few rows, one weight stream), SiLU*mul fused in.

At decode a layer's GEMMs read their weights once for a handful of rows, so each is a
stream of its weight bytes; the kernels between them move kilobytes, but each is a
launch and a dependent round trip in the step's CUDA graph. :func:`decode_linear` is one
Triton kernel per GEMM (``[M, K] x [N, K]^T``, M <= :data:`MAX_ROWS`, tensor-core dots
over 16 padded rows) with an optional bias (Qwen2's QKV) and, with ``silu``, the
gate/up weight ``[gate | up]`` ``[2I, K]``: a program accumulates gate rows ``n`` and up
rows ``I + n`` and writes ``silu(gate) * up`` ``[M, I]`` (rounded as eager: gate, up and
silu to the model dtype, then the product), so the SiLU*mul kernel of ``fused.py`` goes.

With ``rest="gemm"`` a layer is norm, QKV GEMM, RoPE + K/V write, attention, O GEMM,
norm, gate/up GEMM + SiLU*mul, down GEMM (seven kernels besides attention instead of
eight, none of them cuBLAS), each launched as a programmatic dependent of the one before
(:func:`use_pdl`). Measured and removed (H200, results/h200/rest-2026-12-01; code at
``84dfe12``): the residual add and RMSNorm as the GEMM's prologue, 1.9-3.6x slower
GEMMs (QKV 54.9 us against 15.3, gate/up 103.6 against 55.8, LM head 708 against 234,
each at its best launch; the time scaled with the bytes per program, not with the K
step, and not with registers: ptxas, Triton 3.6, 71-255 a thread, no spills; not
profiled further).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from santa_kernels.triton_santa import _pdl_enter, pdl_available
from santa_kernels.validate import InputError

MAX_ROWS = 32  # decode rows one program holds (the dot's M); larger batches: cuBLAS
# (BLOCK_N, BLOCK_K, num_warps, num_stages) by use. H200, M=4 (scripts/bench_rest.py,
# results/h200/rest-2026-12-01/2-sweep.csv; cuBLAS in brackets): QKV 6144x4096 (64, 256, 4, 4)
# 15.3 us [15.4]; O 4096x4096 (32, 512, 4, 4) 11.5 [13.3]; gate/up 2x14336x4096 with
# SiLU*mul (128, 128, 8, 3) 55.8 [55.1 without it]; down 4096x14336 (32, 512, 4, 4)
# 30.0 [31.6]; LM head 128256x4096 (32, 256, 4, 4) 234.2 [239.9]
LAUNCHES = {"silu": (128, 128, 8, 3), "wide": (32, 256, 4, 4), "mid": (64, 256, 4, 4),
            "narrow": (32, 512, 4, 4)}
WIDE_N = 65536  # an LM head: many programs, narrower K steps
NARROW_N = 4096  # outputs up to here: fewer, longer programs (O, down)
# per (N out, K, silu): a launch that replaces the table's (tuning: scripts/bench_rest.py)
CONFIG_OVERRIDES: dict[tuple[int, int, bool], tuple[int, int, int, int]] = {}


def gemm_config(n_out: int, k: int, silu: bool = False,
                element_size: int = 2) -> tuple[int, int, int, int]:
    """Launch of one decode GEMM: ``(BLOCK_N, BLOCK_K, num_warps, num_stages)`` from
    :data:`LAUNCHES` by use and output width (tuned for 16-bit weights; 4-byte weights
    take K steps of the same bytes, so the pipeline fits shared memory), with BLOCK_K
    lowered until it divides ``k`` (the K loop has no mask)."""
    if (n_out, k, silu) in CONFIG_OVERRIDES:
        return CONFIG_OVERRIDES[n_out, k, silu]
    use = ("silu" if silu else "wide" if n_out >= WIDE_N else
           "narrow" if n_out <= NARROW_N else "mid")
    block_n, block_k, warps, stages = LAUNCHES[use]
    block_k = max(16, block_k * 2 // max(2, element_size))
    block_k = next((b for b in (block_k, 256, 128, 64, 32, 16) if b <= block_k and k % b == 0),
                   0)
    if not block_k:
        raise InputError(f"decode_linear: K = {k} is not a multiple of 16")
    return block_n, block_k, warps, stages


# the gemm rest's kernels launch as programmatic dependents (where available). H200,
# rest of the step (scripts/bench_rest.py step; results/h200/rest-2026-12-01/3-step-pdl.csv): 4126.9
# -> 4017.2 us at B=4, 4155.1 -> 4057.3 at B=8. Measured and removed (code at 6d3b0f6):
# prefetching the first two K steps of weights into L2 before the wait, +20-26 us; and
# (H200, 2026-12-01, code at 5353aa5) the O projection prefetching its whole weight slice before
# its wait on the attention call: +0.03-0.09 ms a step for every attention backend
PDL = True


def use_pdl(device: torch.device) -> bool:
    """True where the gemm rest's kernels launch as programmatic dependents: :data:`PDL`
    and a GPU where it works (each kernel then overlaps its launch with the previous
    kernel's last wave and waits for it before touching memory)."""
    return PDL and pdl_available(device)


def _ieee(dtype: torch.dtype) -> bool:
    """fp32 dots for fp32 data and under the interpreter (its numpy dot has no bf16)."""
    return dtype == torch.float32 or os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _dot(a, w, acc, IEEE: tl.constexpr):
    """``acc + a @ w^T`` (tensor cores for 16-bit operands on the GPU)."""
    if IEEE:
        return tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
    return tl.dot(a, tl.trans(w), acc)


@triton.jit
def _decode_linear_kernel(
    x_ptr, w_ptr, bias_ptr, y_ptr, M, N, K, stride_xm, stride_wn,
    HAS_BIAS: tl.constexpr, SILU: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Program n: output columns ``[n*BLOCK_N, (n+1)*BLOCK_N)`` of every row (module
    docstring). ``K`` is a multiple of BLOCK_K; ``N`` is the output width (``I`` with
    SILU, whose up rows start at ``w_ptr + N * stride_wn``). PDL: launched as a
    programmatic dependent (it waits for the previous kernel before any load or store)."""
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    _pdl_enter(PDL, True)
    dtype = y_ptr.dtype.element_ty
    offs_m = tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    offs_k = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        x = tl.load(x_rows + kk[None, :], mask=mask_m[:, None], other=0.0)
        w = tl.load(w_rows + kk[None, :], mask=mask_n[:, None], other=0.0)
        acc = _dot(x, w, acc, IEEE)
        if SILU:
            w_up = tl.load(w_rows + N * stride_wn + kk[None, :], mask=mask_n[:, None],
                           other=0.0)
            acc_up = _dot(x, w_up, acc_up, IEEE)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    if SILU:
        gate = acc.to(dtype).to(tl.float32)
        silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        y = (silu * acc_up.to(dtype).to(tl.float32)).to(dtype)
    else:
        y = acc.to(dtype)
    out = y_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    tl.store(out, y, mask=mask_m[:, None] & mask_n[None, :])


def decode_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    silu: bool = False,
    config: tuple[int, int, int, int] | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """Returns ``y = x W^T (+ bias)`` for ``x [M, K]`` (``M <= MAX_ROWS``) and ``weight
    [N, K]``; with ``silu`` the weight is ``[gate | up]`` and ``y = silu(x Wg^T) * (x
    Wu^T)`` ``[M, N/2]``. ``config``: ``(BLOCK_N, BLOCK_K, num_warps, num_stages)``
    (default :func:`gemm_config`). ``pdl``: launch as a programmatic dependent of the
    previous kernel (see :func:`use_pdl`).
    """
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise InputError(f"decode_linear: expected x [M, K] and weight [N, K], got "
                         f"{tuple(x.shape)} and {tuple(weight.shape)}")
    rows, k = x.shape
    if not 1 <= rows <= MAX_ROWS:
        raise InputError(f"decode_linear: 1 to {MAX_ROWS} rows, got {rows}")
    if not x.is_contiguous() or not weight.is_contiguous():
        raise InputError("decode_linear: x and weight must be contiguous")
    if weight.dtype != x.dtype:
        raise InputError(f"decode_linear: weight {weight.dtype} does not match x {x.dtype}")
    n_out = weight.shape[0] // 2 if silu else weight.shape[0]
    if silu and weight.shape[0] % 2:
        raise InputError("decode_linear: silu needs a [2I, K] gate/up weight")
    if bias is not None and bias.shape != (n_out,):
        raise InputError(f"decode_linear: bias must be [{n_out}], got {tuple(bias.shape)}")
    block_n, block_k, warps, stages = config or gemm_config(n_out, k, silu,
                                                            weight.element_size())
    if k % block_k:
        raise InputError(f"decode_linear: BLOCK_K {block_k} does not divide K = {k}")
    y = torch.empty(rows, n_out, dtype=x.dtype, device=x.device)
    _decode_linear_kernel[(triton.cdiv(n_out, block_n),)](
        x, weight, bias if bias is not None else x, y, rows, n_out, k, x.stride(0),
        weight.stride(0), HAS_BIAS=bias is not None, SILU=silu,
        BLOCK_M=max(16, 1 << (rows - 1).bit_length()), BLOCK_N=block_n, BLOCK_K=block_k,
        IEEE=_ieee(x.dtype), num_warps=warps, num_stages=stages,
        **({"PDL": True, "launch_pdl": True} if pdl else {}),
    )
    return y
