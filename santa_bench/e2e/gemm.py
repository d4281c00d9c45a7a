"""Decode GEMMs in Triton (few rows, one weight stream), with small ops fused in.

At decode a layer's GEMMs read their weights once for a handful of rows, so each is a
stream of its weight bytes; the kernels between them move kilobytes, but each is a
launch and a dependent round trip in the step's CUDA graph. :func:`decode_linear` is one
Triton kernel per GEMM (``[M, K] x [N, K]^T``, M <= :data:`MAX_ROWS`, tensor-core dots
over 16 padded rows) that can take in:

- ``silu``: the weight is ``[gate | up]`` ``[2I, K]``; a program accumulates gate rows
  ``n`` and up rows ``I + n`` and writes ``silu(gate) * up`` ``[M, I]`` (rounded as
  eager: gate, up and silu to the model dtype, then the product) — the SiLU*mul kernel
  of ``fused.py`` disappears;
- ``norm`` (and ``delta``): the residual add ``x' = x + delta`` (stored once, the residual
  stream) and RMSNorm of ``x'`` as a prologue: each chunk of ``x'`` scaled by the norm
  weight, ``sum(x'^2)`` accumulated in the same K loop, ``1 / rms`` applied to the fp32
  accumulator at the end (exact in real arithmetic; eager rounds ``x / rms`` first).
  Measured 1.9-3.6x slower than the plain GEMM on the H200, so off by default
  (:data:`FUSE_NORM`): the norm stays ``fused.add_rms_norm``;
- an optional bias (Qwen2's QKV).

With ``rest="gemm"`` a layer is norm, QKV GEMM, RoPE + K/V write, attention, O GEMM,
norm, gate/up GEMM + SiLU*mul, down GEMM (seven kernels besides attention instead of
eight, none of them cuBLAS), each launched as a programmatic dependent of the one before
(:func:`use_pdl`). More than :data:`MAX_ROWS` rows are a matrix product, not a stream:
``project`` hands them to cuBLAS.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
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
# the residual add and RMSNorm inside the GEMM (True) or as fused.add_rms_norm before it.
# H200 (same CSV): inside, the GEMMs ran 1.9-3.6x slower (QKV 54.9 us, gate/up 103.6,
# LM head 708, each at its best launch), so the norm stays its own kernel. The time
# scaled with the bytes per program, not with BLOCK_K (QKV 52.5-57 us for BLOCK_K 64-512
# at 64 columns, 90-100 us at 128): not the K steps, and not registers (ptxas, sm_90a,
# Triton 3.6: 255 a thread at BLOCK_K 256, 71 at 64, no spills at either; the plain
# kernel 118); the statistic from its own loads (code at db32fdc) was no faster. Not
# profiled further (no hardware counters were read)
FUSE_NORM = False
CUBLAS: set[tuple[int, int]] = set()  # (N, K) weights a plain projection leaves to cuBLAS


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
# prefetching the first two K steps of weights into L2 before the wait, +20-26 us
PDL = True


def use_pdl(device: torch.device) -> bool:
    """True where the gemm rest's kernels launch as programmatic dependents: :data:`PDL`
    and a GPU where it works (each kernel then overlaps its launch with the previous
    kernel's last wave and waits for it before touching memory)."""
    return PDL and pdl_available(device)


def project(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
            pdl: bool = False) -> torch.Tensor:
    """``h W^T (+ bias)``: :func:`decode_linear`, or ``F.linear`` for :data:`CUBLAS` shapes
    and more than :data:`MAX_ROWS` rows."""
    if tuple(weight.shape) in CUBLAS or h.shape[0] > MAX_ROWS:
        return F.linear(h, weight, bias)
    return decode_linear(h, weight, bias=bias, pdl=pdl)[0]


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
    x_ptr, delta_ptr, norm_ptr, x_out_ptr, w_ptr, bias_ptr, y_ptr,
    M, N, K, eps, stride_xm, stride_wn,
    NORM: tl.constexpr, HAS_DELTA: tl.constexpr, HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    IEEE: tl.constexpr, PDL: tl.constexpr = False,
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
    sq = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)  # sum(x'^2), reduced after the loop
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        x = tl.load(x_rows + kk[None, :], mask=mask_m[:, None], other=0.0)
        if HAS_DELTA:
            d = tl.load(delta_ptr + offs_m[:, None].to(tl.int64) * stride_xm + kk[None, :],
                        mask=mask_m[:, None], other=0.0)
            x = (x.to(tl.float32) + d.to(tl.float32)).to(dtype)
            # program i stores chunk i of the residual stream (grids have >= K/BLOCK_K)
            tl.store(x_out_ptr + offs_m[:, None].to(tl.int64) * stride_xm + kk[None, :],
                     x, mask=mask_m[:, None] & ((kk - offs_k) == pid * BLOCK_K)[None, :])
        if NORM:
            xf = x.to(tl.float32)
            sq += xf * xf
            g = tl.load(norm_ptr + kk).to(tl.float32)
            a = (xf * g[None, :]).to(dtype)
        else:
            a = x.to(dtype)
        w = tl.load(w_rows + kk[None, :], mask=mask_n[:, None], other=0.0)
        acc = _dot(a, w, acc, IEEE)
        if SILU:
            w_up = tl.load(w_rows + N * stride_wn + kk[None, :], mask=mask_n[:, None],
                           other=0.0)
            acc_up = _dot(a, w_up, acc_up, IEEE)
    if NORM:
        inv = 1.0 / tl.sqrt(tl.sum(sq, axis=1) / K + eps)
        acc = acc * inv[:, None]
        acc_up = acc_up * inv[:, None]
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
    norm: torch.Tensor | None = None,
    eps: float = 1e-6,
    delta: torch.Tensor | None = None,
    silu: bool = False,
    config: tuple[int, int, int, int] | None = None,
    pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(y, x')`` for ``x [M, K]`` (``M <= MAX_ROWS``) and ``weight [N, K]``.

    ``x' = x + delta`` (``x`` itself without ``delta``); ``y = h W^T (+ bias)`` with
    ``h = rms_norm(x', norm, eps)`` when ``norm`` is given, else ``h = x'``; with
    ``silu`` the weight is ``[gate | up]`` and ``y = silu(h Wg^T) * (h Wu^T)`` ``[M, N/2]``.
    ``config``: ``(BLOCK_N, BLOCK_K, num_warps, num_stages)`` (default :func:`gemm_config`).
    ``pdl``: launch as a programmatic dependent of the previous kernel (see :func:`use_pdl`).
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
    if delta is not None and (delta.shape != x.shape or delta.dtype != x.dtype
                              or not delta.is_contiguous()):
        raise InputError(f"decode_linear: delta {tuple(delta.shape)} {delta.dtype} does not "
                         f"match x {tuple(x.shape)} {x.dtype}")
    if delta is not None and norm is None:
        raise InputError("decode_linear: delta (the residual add) needs norm")
    if norm is not None and norm.shape != (k,):
        raise InputError(f"decode_linear: norm must be [{k}], got {tuple(norm.shape)}")
    n_out = weight.shape[0] // 2 if silu else weight.shape[0]
    if silu and weight.shape[0] % 2:
        raise InputError("decode_linear: silu needs a [2I, K] gate/up weight")
    if bias is not None and bias.shape != (n_out,):
        raise InputError(f"decode_linear: bias must be [{n_out}], got {tuple(bias.shape)}")
    block_n, block_k, warps, stages = config or gemm_config(n_out, k, silu,
                                                            weight.element_size())
    if k % block_k:
        raise InputError(f"decode_linear: BLOCK_K {block_k} does not divide K = {k}")
    grid = triton.cdiv(n_out, block_n)
    if delta is not None and grid * block_k < k:
        raise InputError(f"decode_linear: {grid} programs cannot store the {k // block_k} "
                         "chunks of x + delta (a smaller BLOCK_N or a larger BLOCK_K)")
    y = torch.empty(rows, n_out, dtype=x.dtype, device=x.device)
    x_out = torch.empty_like(x) if delta is not None else x
    _decode_linear_kernel[(grid,)](
        x, delta if delta is not None else x, norm if norm is not None else x, x_out,
        weight, bias if bias is not None else x, y,
        rows, n_out, k, float(eps), x.stride(0), weight.stride(0),
        NORM=norm is not None, HAS_DELTA=delta is not None, HAS_BIAS=bias is not None,
        SILU=silu, BLOCK_M=max(16, 1 << (rows - 1).bit_length()), BLOCK_N=block_n,
        BLOCK_K=block_k, IEEE=_ieee(x.dtype), num_warps=warps, num_stages=stages,
        **({"PDL": True, "launch_pdl": True} if pdl else {}),
    )
    return y, x_out
