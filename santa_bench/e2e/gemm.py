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

import functools
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
            "narrow": (32, 512, 4, 4), "rope": (32, 256, 4, 4)}
WIDE_N = 65536  # an LM head: many programs, narrower K steps
NARROW_N = 4096  # outputs up to here: fewer, longer programs (O, down)
# per (N out, K, silu or "rope"): a launch that replaces the table's (scripts/bench_rest.py)
CONFIG_OVERRIDES: dict[tuple[int, int, bool | str], tuple[int, int, int, int]] = {}


def gemm_config(n_out: int, k: int, silu: bool = False, element_size: int = 2,
                rope: bool = False) -> tuple[int, int, int, int]:
    """Launch of one decode GEMM: ``(BLOCK_N, BLOCK_K, num_warps, num_stages)`` from
    :data:`LAUNCHES` by use and output width (tuned for 16-bit weights; 4-byte weights
    take K steps of the same bytes, so the pipeline fits shared memory), with BLOCK_K
    lowered until it divides ``k`` (the K loop has no mask). ``rope``: the QKV + RoPE
    kernel's launch, whose first entry is the rotation pairs a program holds."""
    key = (n_out, k, "rope" if rope else silu)
    if key in CONFIG_OVERRIDES:
        return CONFIG_OVERRIDES[key]
    use = ("rope" if rope else "silu" if silu else "wide" if n_out >= WIDE_N else
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


@functools.cache
def _pdl_device(device: torch.device) -> bool:
    return pdl_available(device)


def use_pdl(device: torch.device) -> bool:
    """True where the gemm rest's kernels launch as programmatic dependents: :data:`PDL`
    and a GPU where it works (each kernel then overlaps its launch with the previous
    kernel's last wave and waits for it before touching memory)."""
    return PDL and _pdl_device(device)


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
def _stream(x_ptr, w_rows, second, mask_w, M, K, stride_xm, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TWO: tl.constexpr, IEEE: tl.constexpr):
    """The weight stream: ``x [M, K] @ w^T`` for the ``BLOCK_N`` weight rows ``w_rows``
    (and, with TWO, for the rows ``second`` elements further: up rows, RoPE partners),
    fp32 accumulators ``[BLOCK_M, BLOCK_N]``. ``K`` is a multiple of BLOCK_K."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm
    mask_x = (offs_m < M)[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        x = tl.load(x_rows + kk[None, :], mask=mask_x, other=0.0)
        w = tl.load(w_rows + kk[None, :], mask=mask_w[:, None], other=0.0)
        acc = _dot(x, w, acc, IEEE)
        if TWO:
            w2 = tl.load(w_rows + second + kk[None, :], mask=mask_w[:, None], other=0.0)
            acc2 = _dot(x, w2, acc2, IEEE)
    return acc, acc2


@triton.jit
def _inv_rms(stat_ptr, n_stat, M, K, eps, BLOCK_M: tl.constexpr, STAT_PAD: tl.constexpr):
    """``1 / rms`` of each row ``[BLOCK_M]`` from the partial sums of squares ``stat
    [n_stat, M]`` of its ``K`` elements (fp32, as the eager RMSNorm)."""
    offs_p = tl.arange(0, STAT_PAD)
    offs_m = tl.arange(0, BLOCK_M)
    partials = tl.load(stat_ptr + offs_p[:, None] * M + offs_m[None, :],
                       mask=(offs_p < n_stat)[:, None] & (offs_m < M)[None, :], other=0.0)
    return 1.0 / tl.sqrt(tl.sum(partials, axis=0) / K + eps)


@triton.jit
def _decode_linear_kernel(
    x_ptr, w_ptr, bias_ptr, y_ptr, res_ptr, stat_in_ptr, stat_out_ptr,
    M, N, K, stride_xm, stride_wn, n_stat, eps,
    HAS_BIAS: tl.constexpr, SILU: tl.constexpr, NORM: tl.constexpr, RESIDUAL: tl.constexpr,
    STAT_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr = False,
):
    """Program n: output columns ``[n*BLOCK_N, (n+1)*BLOCK_N)`` of every row (module
    docstring). ``K`` is a multiple of BLOCK_K; ``N`` is the output width (``I`` with
    SILU, whose up rows start at ``w_ptr + N * stride_wn``). NORM: the rows of ``x`` are
    RMS-normalised (``1/rms`` from ``stat_in [n_stat, M]``, the norm weight folded into
    ``w``), applied to the accumulators. RESIDUAL: ``y = res + y`` rounded as eager, and
    the program's partial sums of squares of ``y``'s rows go to ``stat_out[n]``. PDL:
    launched as a programmatic dependent (it waits for the previous kernel before any load
    or store)."""
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    _pdl_enter(PDL, True)
    dtype = y_ptr.dtype.element_ty
    offs_m = tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    mask = mask_m[:, None] & mask_n[None, :]
    rows = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    # the epilogue's operands are loaded before the stream, so their latency hides in it
    if NORM:
        inv = _inv_rms(stat_in_ptr, n_stat, M, K, eps, BLOCK_M, STAT_PAD)
    if RESIDUAL:
        res = tl.load(res_ptr + rows, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    acc, acc_up = _stream(x_ptr, w_rows, N * stride_wn, mask_n, M, K, stride_xm, BLOCK_M,
                          BLOCK_N, BLOCK_K, SILU, IEEE)
    if NORM:
        acc = acc * inv[:, None]
        acc_up = acc_up * inv[:, None]
    if HAS_BIAS:
        acc += bias[None, :]
    if SILU:
        gate = acc.to(dtype).to(tl.float32)
        silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        y = (silu * acc_up.to(dtype).to(tl.float32)).to(dtype)
    else:
        y = acc.to(dtype)
    if RESIDUAL:
        y = (res + y.to(tl.float32)).to(dtype)
        yf = tl.where(mask, y.to(tl.float32), 0.0)
        tl.store(stat_out_ptr + pid * M + offs_m, tl.sum(yf * yf, axis=1), mask=mask_m)
    tl.store(y_ptr + rows, y, mask=mask)


@triton.jit
def _qkv_rope_kernel(
    x_ptr, w_ptr, bias_ptr, stat_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, k_ptr, v_ptr,
    table_ptr, M, K, stride_xm, stride_wn, n_stat, eps, stride_kx, stride_ky, stride_kh,
    stride_table, page_size,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    HAS_BIAS: tl.constexpr, NORM: tl.constexpr, PAGED: tl.constexpr, STAT_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, PAIRS: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Program (head, j): rotation pairs ``[j*PAIRS, (j+1)*PAIRS)`` of one head of the
    QKV projection (weight rows ``i`` and ``i + d/2`` of the head, so both halves of each
    pair are in the program's accumulators), every row. Query heads are rotated into
    ``q [M, Hq, d]``; KV heads: k rotated and v as is, written into the cache row of
    sequence m at ``pos[m]``. NORM, HAS_BIAS: as :func:`_decode_linear_kernel`. Rounding
    as eager: the projection to the model dtype, then ``x*cos`` and
    ``rotate_half(x)*sin`` each, then their sum."""
    half: tl.constexpr = HEAD_DIM // 2
    per_head: tl.constexpr = (half + PAIRS - 1) // PAIRS
    head = tl.program_id(0) // per_head
    offs_i = (tl.program_id(0) % per_head) * PAIRS + tl.arange(0, PAIRS)
    mask_i = offs_i < half
    rows_a = head * HEAD_DIM + offs_i
    w_rows = w_ptr + rows_a[:, None].to(tl.int64) * stride_wn
    _pdl_enter(PDL, True)
    dtype = q_ptr.dtype.element_ty
    offs_m = tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    mask = mask_m[:, None] & mask_i[None, :]
    rotate = head < NUM_HEADS + NUM_KV_HEADS  # q or k; v is written as is
    # the epilogue's operands are loaded before the stream, so their latency hides in it
    if NORM:
        inv = _inv_rms(stat_ptr, n_stat, M, K, eps, BLOCK_M, STAT_PAD)
    if HAS_BIAS:
        bias_a = tl.load(bias_ptr + rows_a, mask=mask_i, other=0.0).to(tl.float32)
        bias_b = tl.load(bias_ptr + rows_a + half, mask=mask_i, other=0.0).to(tl.float32)
    pos = tl.load(pos_ptr + offs_m, mask=mask_m, other=0).to(tl.int64)
    table = pos[:, None] * HEAD_DIM + offs_i[None, :]
    mask_rot = mask & ((offs_i * 0 + head) < NUM_HEADS + NUM_KV_HEADS)[None, :]  # q or k
    cos_a = tl.load(cos_ptr + table, mask=mask_rot, other=0.0).to(tl.float32)
    sin_a = tl.load(sin_ptr + table, mask=mask_rot, other=0.0).to(tl.float32)
    cos_b = tl.load(cos_ptr + table + half, mask=mask_rot, other=0.0).to(tl.float32)
    sin_b = tl.load(sin_ptr + table + half, mask=mask_rot, other=0.0).to(tl.float32)
    kvh = (head - NUM_HEADS) % NUM_KV_HEADS  # a k or v head: its cache rows
    if PAGED:
        page = tl.load(table_ptr + offs_m.to(tl.int64) * stride_table + pos // page_size,
                       mask=mask_m & ((offs_m * 0 + head) >= NUM_HEADS), other=0)
        row = page.to(tl.int64) * stride_kx + (pos % page_size) * stride_ky
    else:
        row = offs_m.to(tl.int64) * stride_kx + pos * stride_ky
    row += kvh * stride_kh
    acc_a, acc_b = _stream(x_ptr, w_rows, half * stride_wn, mask_i, M, K, stride_xm,
                           BLOCK_M, PAIRS, BLOCK_K, True, IEEE)
    if NORM:
        acc_a = acc_a * inv[:, None]
        acc_b = acc_b * inv[:, None]
    if HAS_BIAS:
        acc_a += bias_a[None, :]
        acc_b += bias_b[None, :]
    a = acc_a.to(dtype)
    b = acc_b.to(dtype)
    if rotate:
        af = a.to(tl.float32)
        bf = b.to(tl.float32)
        ya = ((af * cos_a).to(dtype).to(tl.float32)
              - (bf * sin_a).to(dtype).to(tl.float32)).to(dtype)
        yb = ((bf * cos_b).to(dtype).to(tl.float32)
              + (af * sin_b).to(dtype).to(tl.float32)).to(dtype)
    else:
        ya = a
        yb = b
    if head < NUM_HEADS:
        q_rows = q_ptr + (offs_m.to(tl.int64) * NUM_HEADS + head) * HEAD_DIM
        tl.store(q_rows[:, None] + offs_i[None, :], ya, mask=mask)
        tl.store(q_rows[:, None] + offs_i[None, :] + half, yb, mask=mask)
    else:
        cache_rows = row[:, None] + offs_i[None, :]
        if rotate:
            tl.store(k_ptr + cache_rows, ya, mask=mask)
            tl.store(k_ptr + cache_rows + half, yb, mask=mask)
        else:
            tl.store(v_ptr + cache_rows, ya, mask=mask)
            tl.store(v_ptr + cache_rows + half, yb, mask=mask)


@triton.jit
def _row_sumsq_kernel(x_ptr, stat_ptr, M, hidden, BLOCK: tl.constexpr,
                      PDL: tl.constexpr = False):
    """``stat[0, m] = sum(x[m]^2)`` (fp32) of one row: the first layer's norm statistic."""
    _pdl_enter(PDL, True)
    m = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + m.to(tl.int64) * hidden + offs, mask=offs < hidden,
                other=0.0).to(tl.float32)
    tl.store(stat_ptr + m, tl.sum(x * x, axis=0))


def _stat_args(norm_stat: torch.Tensor | None, rows: int, x: torch.Tensor) -> tuple:
    """``(stat tensor, n_stat, STAT_PAD)`` of an optional ``[P, rows]`` fp32 statistic."""
    if norm_stat is None:
        return x, 0, 1
    if (norm_stat.dim() != 2 or norm_stat.shape[1] != rows
            or norm_stat.dtype != torch.float32 or not norm_stat.is_contiguous()):
        raise InputError(f"decode_linear: norm_stat must be contiguous fp32 [P, {rows}], got "
                         f"{tuple(norm_stat.shape)} {norm_stat.dtype}")
    return norm_stat, norm_stat.shape[0], max(1, 1 << (norm_stat.shape[0] - 1).bit_length())


def _check_operands(x: torch.Tensor, weight: torch.Tensor, name: str) -> None:
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise InputError(f"{name}: expected x [M, K] and weight [N, K], got "
                         f"{tuple(x.shape)} and {tuple(weight.shape)}")
    if not 1 <= x.shape[0] <= MAX_ROWS:
        raise InputError(f"{name}: 1 to {MAX_ROWS} rows, got {x.shape[0]}")
    if not x.is_contiguous() or not weight.is_contiguous():
        raise InputError(f"{name}: x and weight must be contiguous")
    if weight.dtype != x.dtype:
        raise InputError(f"{name}: weight {weight.dtype} does not match x {x.dtype}")


def _block_m(rows: int) -> int:
    return max(16, 1 << (rows - 1).bit_length())


def decode_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    silu: bool = False,
    norm_stat: torch.Tensor | None = None,
    eps: float = 1e-5,
    residual: torch.Tensor | None = None,
    config: tuple[int, int, int, int] | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """Returns ``y = x W^T (+ bias)`` for ``x [M, K]`` (``M <= MAX_ROWS``) and ``weight
    [N, K]``; with ``silu`` the weight is ``[gate | up]`` and ``y = silu(x Wg^T) * (x
    Wu^T)`` ``[M, N/2]``. ``norm_stat``: ``[P, M]`` fp32 partial sums of squares of ``x``'s
    rows; ``x`` is then RMS-normalised (``eps``) before the product, the norm weight being
    folded into ``weight`` (``W diag(g)``). ``residual [M, N]``: returns ``residual + y``
    (see :func:`decode_linear_add`, which also returns its statistic). ``config``:
    ``(BLOCK_N, BLOCK_K, num_warps, num_stages)`` (default :func:`gemm_config`). ``pdl``:
    launch as a programmatic dependent of the previous kernel (see :func:`use_pdl`).
    """
    return _linear(x, weight, bias, silu, norm_stat, eps, residual, config, pdl)[0]


def decode_linear_add(
    x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, *,
    config: tuple[int, int, int, int] | None = None, pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(residual + x W^T, stat)``, the sum rounded as eager (product, then sum, in
    the model dtype), and ``stat [P, M]`` fp32 partial sums of squares of its rows: the
    ``norm_stat`` of the next :func:`decode_linear` or :func:`qkv_rope`."""
    y, stat = _linear(x, weight, None, False, None, 0.0, residual, config, pdl)
    return y, stat


def _linear(x, weight, bias, silu, norm_stat, eps, residual, config, pdl):
    _check_operands(x, weight, "decode_linear")
    rows, k = x.shape
    n_out = weight.shape[0] // 2 if silu else weight.shape[0]
    if silu and weight.shape[0] % 2:
        raise InputError("decode_linear: silu needs a [2I, K] gate/up weight")
    if bias is not None and bias.shape != (n_out,):
        raise InputError(f"decode_linear: bias must be [{n_out}], got {tuple(bias.shape)}")
    if residual is not None and (residual.shape != (rows, n_out) or residual.dtype != x.dtype
                                 or not residual.is_contiguous()):
        raise InputError(f"decode_linear: residual must be contiguous [{rows}, {n_out}] "
                         f"{x.dtype}, got {tuple(residual.shape)} {residual.dtype}")
    stat_in, n_stat, stat_pad = _stat_args(norm_stat, rows, x)
    block_n, block_k, warps, stages = config or gemm_config(n_out, k, silu,
                                                            weight.element_size())
    if k % block_k:
        raise InputError(f"decode_linear: BLOCK_K {block_k} does not divide K = {k}")
    grid = triton.cdiv(n_out, block_n)
    y = torch.empty(rows, n_out, dtype=x.dtype, device=x.device)
    stat_out = (torch.empty(grid, rows, dtype=torch.float32, device=x.device)
                if residual is not None else None)
    _decode_linear_kernel[(grid,)](
        x, weight, bias if bias is not None else x, y,
        residual if residual is not None else x, stat_in,
        stat_out if stat_out is not None else stat_in, rows, n_out, k, x.stride(0),
        weight.stride(0), n_stat, float(eps), HAS_BIAS=bias is not None, SILU=silu,
        NORM=norm_stat is not None, RESIDUAL=residual is not None, STAT_PAD=stat_pad,
        BLOCK_M=_block_m(rows), BLOCK_N=block_n, BLOCK_K=block_k, IEEE=_ieee(x.dtype),
        num_warps=warps, num_stages=stages,
        **({"PDL": True, "launch_pdl": True} if pdl else {}),
    )
    return y, stat_out


def rope_pairs(head_dim: int, pairs: int) -> int:
    """Rotation pairs a :func:`qkv_rope` program holds: ``pairs`` (a power of two >= 16, the
    dot's width), lowered to the smallest such power covering ``head_dim / 2``."""
    return max(16, min(pairs, 1 << (head_dim // 2 - 1).bit_length()))


def qkv_rope(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
    norm_stat: torch.Tensor | None, eps: float, cos: torch.Tensor, sin: torch.Tensor,
    positions: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    num_heads: int, num_kv_heads: int, head_dim: int,
    page_table: torch.Tensor | None = None, page_size: int = 0, *,
    config: tuple[int, int, int, int] | None = None, pdl: bool = False,
) -> torch.Tensor:
    """The QKV projection, RoPE and the K/V cache write in one kernel: returns the rotated
    queries ``[M, Hq, d]`` of ``x [M, K]`` (one token per sequence, RMS-normalised with
    ``norm_stat`` as :func:`decode_linear`; ``weight [(Hq + 2 Hkv) d, K]``) and writes the
    rotated k and the v of sequence m at ``positions[m]`` into the cache (contiguous ``[B,
    N, Hkv, d]`` or paged ``[pages, page_size, Hkv, d]`` with ``page_table``), as
    :func:`santa_bench.e2e.fused.rope_write` does after a projection. ``config``:
    ``(pairs, BLOCK_K, num_warps, num_stages)``, default ``LAUNCHES["rope"]``."""
    _check_operands(x, weight, "qkv_rope")
    rows, k = x.shape
    width = (num_heads + 2 * num_kv_heads) * head_dim
    if weight.shape[0] != width or head_dim % 2:
        raise InputError(f"qkv_rope: expected an even head_dim and weight [{width}, K], got "
                         f"{tuple(weight.shape)} (head_dim {head_dim})")
    if bias is not None and bias.shape != (width,):
        raise InputError(f"qkv_rope: bias must be [{width}], got {tuple(bias.shape)}")
    if positions.shape != (rows,):
        raise InputError(f"qkv_rope: expected positions [{rows}], got {tuple(positions.shape)}")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(3) != 1:
        raise InputError("qkv_rope: K and V caches need the same strides, unit-stride rows")
    stat, n_stat, stat_pad = _stat_args(norm_stat, rows, x)
    pairs, block_k, warps, stages = config or gemm_config(width, k, rope=True,
                                                          element_size=weight.element_size())
    pairs = rope_pairs(head_dim, pairs)
    if k % block_k:
        raise InputError(f"qkv_rope: BLOCK_K {block_k} does not divide K = {k}")
    q = torch.empty(rows, num_heads, head_dim, dtype=x.dtype, device=x.device)
    paged = page_table is not None
    table = page_table if paged else positions
    per_head = triton.cdiv(head_dim // 2, pairs)
    _qkv_rope_kernel[((num_heads + 2 * num_kv_heads) * per_head,)](
        x, weight, bias if bias is not None else x, stat, cos, sin, positions, q, k_cache,
        v_cache, table, rows, k, x.stride(0), weight.stride(0), n_stat, float(eps),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        table.stride(0) if paged else 0, page_size if paged else 1,
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        HAS_BIAS=bias is not None, NORM=norm_stat is not None, PAGED=paged,
        STAT_PAD=stat_pad, BLOCK_M=_block_m(rows), PAIRS=pairs, BLOCK_K=block_k,
        IEEE=_ieee(x.dtype), num_warps=warps, num_stages=stages,
        **({"PDL": True, "launch_pdl": True} if pdl else {}),
    )
    return q


def row_sumsq(x: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """Returns ``[1, M]`` fp32 sums of squares of the rows of ``x [M, hidden]``: the
    ``norm_stat`` of the first layer's projection (later ones come from
    :func:`decode_linear_add`)."""
    if x.dim() != 2 or not x.is_contiguous() or not 1 <= x.shape[0] <= MAX_ROWS:
        raise InputError(f"row_sumsq: expected a contiguous [M <= {MAX_ROWS}, hidden] x, got "
                         f"{tuple(x.shape)}")
    stat = torch.empty(1, x.shape[0], dtype=torch.float32, device=x.device)
    _row_sumsq_kernel[(x.shape[0],)](
        x, stat, x.shape[0], x.shape[1], BLOCK=1 << (x.shape[1] - 1).bit_length(),
        num_warps=4 if x.shape[1] <= 4096 else 8,
        **({"PDL": True, "launch_pdl": True} if pdl else {}),
    )
    return stat
