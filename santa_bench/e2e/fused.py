"""The decode step outside attention as three Triton kernels, as serving engines fuse it.

Eager, one decoder layer of ``model.py`` is ~39 small kernels besides its four GEMMs and
attention (RMSNorm alone is eight: cast, square, mean, add, rsqrt, scale, cast, weight);
each is a separate launch inside the CUDA graph. On the H200 the rest of an 8B model's
step at 32k B=4 fell from 6.7 to 4.4 ms with these kernels (H200, 2026-11-29:
results/h200/e2e-llama8b-32k-s5/README.md). Fused (the ``rest="fused"`` path of the loop):

- :func:`add_rms_norm`: the residual add and the RMSNorm of its result, one kernel;
- :func:`rope_write`: RoPE of q and k and the K/V write into the cache, one kernel;
- :func:`silu_mul`: ``silu(gate) * up``, one kernel.

A layer is then norm, QKV GEMM, rope_write, attention, O GEMM, norm, gate/up GEMM,
silu_mul, down GEMM. Each kernel rounds where the eager ops do (every eager op returns
the model dtype), so the results match ``model.py``'s to about an ulp (the fp32 sum order
of the RMSNorm statistic, exp, and the compiler may keep an intermediate in fp32). The
kernels run on a GPU or in Triton's interpreter.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from santa_kernels.triton_santa import _pdl_enter
from santa_kernels.validate import InputError


def fused_available(device: torch.device) -> tuple[bool, str]:
    """Returns ``(True, "cuda" | "interpreter")`` or ``(False, why)``."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return True, "interpreter"
    if device.type == "cuda":
        return True, "cuda"
    return False, "the fused step needs a CUDA GPU or TRITON_INTERPRET=1"


def _next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def _pdl_launch(pdl: bool) -> dict:
    """Launch options of a kernel that may start as a programmatic dependent (its PDL
    constexpr makes it wait for the previous kernel before it reads or writes)."""
    return {"PDL": True, "launch_pdl": True} if pdl else {}


@triton.jit
def _add_rms_norm_kernel(x_ptr, delta_ptr, w_ptr, x_out_ptr, h_ptr, hidden, eps,
                         HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """One row: ``x += delta`` (rounded to the model dtype, stored), then
    ``h = w * (x * rsqrt(mean(x^2) + eps))`` with fp32 statistics, rounded as eager.
    PDL: launched as a programmatic dependent (waits for the previous kernel first)."""
    _pdl_enter(PDL, True)
    row = tl.program_id(0).to(tl.int64) * hidden
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    dtype = h_ptr.dtype.element_ty
    x = tl.load(x_ptr + row + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_DELTA:
        delta = tl.load(delta_ptr + row + offs, mask=mask, other=0.0).to(tl.float32)
        x = (x + delta).to(dtype).to(tl.float32)
        tl.store(x_out_ptr + row + offs, x.to(dtype), mask=mask)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / hidden + eps)
    normed = (x * inv).to(dtype).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(h_ptr + row + offs, (w * normed).to(dtype), mask=mask)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                 eps: float, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(x + delta, rms_norm(x + delta))`` for ``x [M, hidden]`` (``delta`` None:
    ``(x, rms_norm(x))``), each in ``x``'s dtype. ``pdl``: launch as a programmatic
    dependent of the previous kernel (a GPU with :func:`pdl_available`)."""
    if x.dim() != 2 or not x.is_contiguous():
        raise InputError(f"add_rms_norm: expected a contiguous [M, hidden] x, got "
                         f"{tuple(x.shape)}")
    if delta is not None and (delta.shape != x.shape or delta.dtype != x.dtype):
        raise InputError(f"add_rms_norm: delta {tuple(delta.shape)} {delta.dtype} does not "
                         f"match x {tuple(x.shape)} {x.dtype}")
    rows, hidden = x.shape
    block = _next_pow2(hidden)
    x_out = torch.empty_like(x) if delta is not None else x
    h = torch.empty_like(x)
    _add_rms_norm_kernel[(rows,)](
        x, delta.contiguous() if delta is not None else x, weight, x_out, h, hidden, float(eps),
        HAS_DELTA=delta is not None, BLOCK=block, num_warps=4 if block <= 4096 else 8,
        **_pdl_launch(pdl),
    )
    return x_out, h


@triton.jit
def _rope_write_kernel(
    qkv_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, k_ptr, v_ptr, table_ptr,
    stride_qkv, stride_kx, stride_ky, stride_kh, stride_table, page_size,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    PAGED: tl.constexpr, PDL: tl.constexpr = False,
):
    """Program (m, h): query head h (h < NUM_HEADS) rotated into ``q [M, Hq, d]``, or KV
    head ``h - NUM_HEADS``: k rotated and v copied into the cache row of sequence m at
    position ``pos[m]``. Rotation as eager: ``x*cos`` and ``rotate_half(x)*sin`` each
    rounded to the model dtype, then their sum."""
    _pdl_enter(PDL, True)
    m = tl.program_id(0)
    h = tl.program_id(1)
    half: tl.constexpr = HEAD_DIM // 2
    offs = tl.arange(0, D_PAD)
    mask = offs < HEAD_DIM
    dtype = q_ptr.dtype.element_ty
    pos = tl.load(pos_ptr + m).to(tl.int64)
    row = qkv_ptr + m.to(tl.int64) * stride_qkv + h * HEAD_DIM
    x = tl.load(row + offs, mask=mask, other=0.0).to(tl.float32)
    swapped = tl.where(offs < half, offs + half, offs - half)
    rot = tl.load(row + swapped, mask=mask, other=0.0).to(tl.float32)
    rot = tl.where(offs < half, -rot, rot)
    cos = tl.load(cos_ptr + pos * HEAD_DIM + offs, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + pos * HEAD_DIM + offs, mask=mask, other=0.0).to(tl.float32)
    y = ((x * cos).to(dtype).to(tl.float32) + (rot * sin).to(dtype).to(tl.float32)).to(dtype)
    if h < NUM_HEADS:
        tl.store(q_ptr + (m.to(tl.int64) * NUM_HEADS + h) * HEAD_DIM + offs, y, mask=mask)
    else:
        kvh = h - NUM_HEADS
        if PAGED:
            page = tl.load(table_ptr + m.to(tl.int64) * stride_table + pos // page_size)
            dest = page.to(tl.int64) * stride_kx + (pos % page_size) * stride_ky
        else:
            dest = m.to(tl.int64) * stride_kx + pos * stride_ky
        dest += kvh * stride_kh
        tl.store(k_ptr + dest + offs, y, mask=mask)
        num_kv_heads = tl.num_programs(1) - NUM_HEADS
        v = tl.load(row + num_kv_heads * HEAD_DIM + offs, mask=mask, other=0.0)
        tl.store(v_ptr + dest + offs, v, mask=mask)


def rope_write(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               positions: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               num_heads: int, num_kv_heads: int, head_dim: int,
               page_table: torch.Tensor | None = None, page_size: int = 0,
               pdl: bool = False) -> torch.Tensor:
    """Returns the rotated queries ``[B, Hq, d]`` of ``qkv [B, (Hq + 2 Hkv) d]`` (one token
    per sequence) and writes the rotated k and the v of sequence b at ``positions[b]`` into
    the cache: contiguous ``[B, N, Hkv, d]`` or paged ``[pages, page_size, Hkv, d]`` with
    ``page_table [B, pages per sequence]``. ``cos``/``sin``: ``[positions, d]`` tables."""
    batch, width = qkv.shape[0], (num_heads + 2 * num_kv_heads) * head_dim
    if qkv.dim() != 2 or qkv.shape[1] != width:
        raise InputError(f"rope_write: expected qkv [B, {width}], got {tuple(qkv.shape)}")
    if head_dim % 2 or qkv.stride(1) != 1:
        raise InputError("rope_write: needs an even head_dim and unit-stride qkv rows")
    if positions.shape != (batch,):
        raise InputError(f"rope_write: expected positions [{batch}], got {tuple(positions.shape)}")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(3) != 1:
        raise InputError("rope_write: K and V caches need the same strides, unit-stride rows")
    q = torch.empty(batch, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    paged = page_table is not None
    table = page_table if paged else positions
    _rope_write_kernel[(batch, num_heads + num_kv_heads)](
        qkv, cos, sin, positions, q, k_cache, v_cache, table,
        qkv.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        table.stride(0) if paged else 0, page_size if paged else 1,
        NUM_HEADS=num_heads, HEAD_DIM=head_dim, D_PAD=_next_pow2(head_dim), PAGED=paged,
        num_warps=1, **_pdl_launch(pdl),
    )
    return q


@triton.jit
def _silu_mul_kernel(gate_up_ptr, out_ptr, inter, BLOCK: tl.constexpr):
    """``out = silu(gate) * up`` of one row block (``gate_up = [gate | up]``), rounded as
    eager: silu to the model dtype, then the product."""
    m = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    dtype = out_ptr.dtype.element_ty
    row = gate_up_ptr + m * 2 * inter
    gate = tl.load(row + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(row + inter + offs, mask=mask, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    tl.store(out_ptr + m * inter + offs, (silu * up).to(dtype), mask=mask)


SILU_BLOCK = 1024


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """Returns ``silu(gate) * up`` ``[M, I]`` of a contiguous ``gate_up [M, 2I]``."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or not gate_up.is_contiguous():
        raise InputError(f"silu_mul: expected a contiguous [M, 2I] gate_up, got "
                         f"{tuple(gate_up.shape)}")
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, inter, dtype=gate_up.dtype, device=gate_up.device)
    block = min(SILU_BLOCK, _next_pow2(inter))
    _silu_mul_kernel[(rows, triton.cdiv(inter, block))](gate_up, out, inter, BLOCK=block,
                                                        num_warps=4)
    return out
