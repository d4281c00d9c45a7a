"""Bernoulli qK^T (docs/algorithms.md section 5) on the GPU, composed with any value stage.

Both groupings of :func:`santa_kernels.scores.bernoulli_scores` estimate the scores by a
linear map of the query, ``s_hat_i = scale * w_h . k_i``, with effective queries

- ``per-head``: ``w_h = max|q_h| * mean_draws(sign(q_h) * beta)``, ``beta_j ~
  Bernoulli(|q_hj| / max|q_h|)`` per head and draw;
- ``mean-group-query``: ``w_h = q_h * mean_draws(beta / pi)``, one draw of ``beta_j ~
  Bernoulli(pi_j)`` per KV head from the group's mean query, ``pi_j = |qbar_j| /
  max|qbar|`` (floored at 1e-12, as the reference).

So the stage is one small kernel, :func:`bernoulli_queries` (one program per sequence
and KV head: the group's draws, ``w [B, Hq, d]`` and the number of features any head or
draw of the group selected), followed by the *exact* score pass of a value-stage kernel
run on ``w``: :func:`bernoulli_decode` with ``value_stage`` ``prop`` / ``sys`` /
``strat`` / ``iid`` / ``flash`` (``triton_santa``) or ``dense`` (``triton_splitkv``).
Randomness: Philox keyed by ``(seed, step, sequence, head, draw, feature)``, the step a
device counter the kernel's last program advances (CUDA-graph replays draw fresh masks;
``uniforms`` overrides it, for tests).

Bytes: those score passes read every feature of K. K is stored token-major (``[token,
head, d]``, 256-byte rows at d=128); HBM serves 32-byte sectors of 16 bf16 features, and
at the feature fractions measured 88-100% of the sectors hold a selected feature
(H200, 2026-12-01: results/h200/kernels-2026-12-01-s6/README.md), so skipping features would save
almost no bytes in this layout. The K-feature fraction is reported (``features``, the
read accounting) as what the estimator needs, not as bytes saved.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from santa_kernels.kv import KVCache
from santa_kernels.scores import BERNOULLI_GROUPING
from santa_kernels.validate import InputError, check_positive_int

VALUE_STAGES = ("dense", "iid", "strat", "sys", "flash", "prop")
_TINY = float(torch.finfo(torch.float32).tiny)
_MIN_INCLUSION = 1e-12


def _check_draw(draws: int, grouping: str) -> None:
    check_positive_int(draws, "draws")
    if grouping not in BERNOULLI_GROUPING:
        raise InputError(f"grouping: expected one of {BERNOULLI_GROUPING}, got {grouping!r}")


@triton.jit
def _bernoulli_query_kernel(
    q_ptr, w_ptr, feat_ptr, uniforms_ptr, rng_ptr, ticket_ptr, seed,
    num_kv_heads, group, head_dim, draws, stride_qb, stride_qh,
    MEAN_GROUP: tl.constexpr, HAS_UNIFORMS: tl.constexpr, G_PAD: tl.constexpr,
    D_PAD: tl.constexpr, TINY: tl.constexpr, MIN_INCLUSION: tl.constexpr,
):
    """Program (b, kvh): the G heads' effective queries and the group's feature count.
    The last program to finish (an acq_rel ticket, after every program read the step)
    advances the step counter: no second launch."""
    pid = tl.program_id(0)
    b = pid // num_kv_heads
    kvh = pid % num_kv_heads
    rows = tl.arange(0, G_PAD)
    mask_g = rows < group
    offs_d = tl.arange(0, D_PAD)
    mask_d = offs_d < head_dim
    mask = mask_g[:, None] & mask_d[None, :]
    heads = kvh * group + rows
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask, other=0.0).to(tl.float32)
    step = tl.load(rng_ptr).to(tl.int64)
    head_rows = b * num_kv_heads * group + heads  # global head index b * Hq + h
    if MEAN_GROUP:
        qbar = tl.sum(q, axis=0) / group
        alpha = tl.maximum(tl.max(tl.abs(qbar), axis=0), TINY)
        inclusion = tl.maximum(tl.abs(qbar) / alpha, MIN_INCLUSION)
        reweight = tl.zeros([D_PAD], dtype=tl.float32)
        selected = tl.zeros([D_PAD], dtype=tl.int32)
        for r in range(draws):
            unit = (pid * draws + r).to(tl.int64) * head_dim + offs_d  # (b, kvh, draw, j)
            if HAS_UNIFORMS:
                u = tl.load(uniforms_ptr + unit, mask=mask_d, other=1.0)
            else:
                u = tl.rand(seed, (step << 32) + unit)
            beta = (u < inclusion) & mask_d
            reweight += tl.where(beta, 1.0 / inclusion, 0.0)
            selected = tl.maximum(selected, beta.to(tl.int32))
        w = q * (reweight / draws)[None, :]
        features = tl.sum(selected, axis=0)
    else:
        alpha = tl.maximum(tl.max(tl.abs(q), axis=1), TINY)
        prob = tl.abs(q) / alpha[:, None]
        sign = tl.where(q > 0, 1.0, tl.where(q < 0, -1.0, 0.0))
        ternary = tl.zeros([G_PAD, D_PAD], dtype=tl.float32)
        selected = tl.zeros([G_PAD, D_PAD], dtype=tl.int32)
        for r in range(draws):
            unit = ((head_rows[:, None] * draws + r).to(tl.int64) * head_dim
                    + offs_d[None, :])  # (b, head, draw, j)
            if HAS_UNIFORMS:
                u = tl.load(uniforms_ptr + unit, mask=mask, other=1.0)
            else:
                u = tl.rand(seed, (step << 32) + unit)
            beta = (u < prob) & mask
            ternary += tl.where(beta, sign, 0.0)
            selected = tl.maximum(selected, beta.to(tl.int32))
        w = alpha[:, None] * (ternary / draws)
        features = tl.sum(tl.max(selected, axis=0), axis=0)
    tl.store(w_ptr + head_rows[:, None] * head_dim + offs_d[None, :],
             w.to(w_ptr.dtype.element_ty), mask=mask)
    tl.store(feat_ptr + pid, features)
    tl.debug_barrier()  # every thread's read of the step is ordered before the ticket
    ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel")
    if ticket == tl.num_programs(0) - 1:
        tl.store(rng_ptr, step + 1)
        tl.store(ticket_ptr, 0)  # ready for the next call (graph replay)


class BernoulliWorkspace:
    """Buffers of :func:`bernoulli_queries` for one query shape (allocated once): the
    effective queries ``w``, the feature counts, the Philox seed and step counter."""

    def __init__(self, q: torch.Tensor, num_kv_heads: int, *, seed: int = 0) -> None:
        batch, hq, d = q.shape
        self.shape = (batch, hq, d, num_kv_heads)
        self.w = torch.empty(batch, hq, d, dtype=q.dtype, device=q.device)
        self.features = torch.zeros(batch, num_kv_heads, dtype=torch.int32, device=q.device)
        self.rng = torch.zeros(1, dtype=torch.int64, device=q.device)
        self.ticket = torch.zeros(1, dtype=torch.int32, device=q.device)
        self.seed = int(seed)

    def reset_rng(self, step: int = 0, seed: int | None = None) -> None:
        """Sets the device step counter (and optionally the seed): replays a run exactly."""
        self.rng.fill_(step)
        self.ticket.zero_()
        if seed is not None:
            self.seed = int(seed)


def bernoulli_queries(
    q: torch.Tensor, num_kv_heads: int, *, draws: int = 4, grouping: str = "per-head",
    workspace: BernoulliWorkspace | None = None, seed: int = 0,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(w [B, Hq, d] in q.dtype, features [B, Hkv] int32)`` (views of the
    workspace): the effective queries of the Bernoulli score estimate (module docstring)
    and the K features any head or draw of each group selected. ``uniforms``: ``[B, Hq,
    draws, d]`` (per-head) or ``[B, Hkv, draws, d]`` (mean-group-query) in [0, 1)
    instead of Philox."""
    _check_draw(draws, grouping)
    if q.dim() != 3 or q.stride(2) != 1:
        raise InputError(f"q: expected [B, Hq, d] with unit-stride rows, got {tuple(q.shape)}")
    batch, hq, d = q.shape
    check_positive_int(num_kv_heads, "num_kv_heads")
    if hq % num_kv_heads:
        raise InputError(f"q: {hq} query heads are not a multiple of {num_kv_heads} KV heads")
    ws = workspace or BernoulliWorkspace(q, num_kv_heads, seed=seed)
    if ws.shape != (batch, hq, d, num_kv_heads) or ws.w.dtype != q.dtype:
        raise InputError(f"workspace: made for {ws.shape} {ws.w.dtype}, not "
                         f"{(batch, hq, d, num_kv_heads)} {q.dtype}")
    mean_group = grouping == "mean-group-query"
    if uniforms is not None:
        want = (batch, num_kv_heads if mean_group else hq, draws, d)
        if tuple(uniforms.shape) != want:
            raise InputError(f"uniforms: expected {want}, got {tuple(uniforms.shape)}")
        uniforms = uniforms.to(device=q.device, dtype=torch.float32).contiguous()
    group = hq // num_kv_heads
    _bernoulli_query_kernel[(batch * num_kv_heads,)](
        q, ws.w, ws.features, uniforms if uniforms is not None else ws.w, ws.rng, ws.ticket,
        ws.seed,
        num_kv_heads, group, d, draws, q.stride(0), q.stride(1),
        MEAN_GROUP=mean_group, HAS_UNIFORMS=uniforms is not None,
        G_PAD=max(2, triton.next_power_of_2(group)), D_PAD=triton.next_power_of_2(d),
        TINY=_TINY, MIN_INCLUSION=_MIN_INCLUSION, num_warps=4,
    )
    return ws.w, ws.features  # the kernel advanced the step: the next call draws afresh


class BernoulliDecode:
    """A prepared Bernoulli call (``w`` from :func:`bernoulli_queries`, then the value
    stage's kernel on it), with its workspaces; call it with ``(q, kv)``."""

    def __init__(self, q: torch.Tensor, kv: KVCache, *, draws: int = 4,
                 grouping: str = "per-head", value_stage: str = "dense", S: int = 128,
                 tile: int = 64, alloc: str = "systematic", scale: float | None = None,
                 seed: int = 0, stash_dtype: torch.dtype = torch.float16) -> None:
        if value_stage not in VALUE_STAGES:
            raise InputError(f"value_stage: expected one of {VALUE_STAGES}, got "
                             f"{value_stage!r}")
        _check_draw(draws, grouping)
        self.draws, self.grouping, self.value_stage = draws, grouping, value_stage
        self.bernoulli = BernoulliWorkspace(q, kv.num_kv_heads, seed=seed)
        if value_stage == "dense":
            from santa_kernels.triton_splitkv import SplitKVWorkspace, splitkv_decode

            self.value_ws = SplitKVWorkspace.for_inputs(q, kv)
            self._kernel = splitkv_decode
            self._kw = {"scale": scale, "out": torch.empty_like(q), "workspace": self.value_ws}
            return
        from santa_kernels import triton_santa as ts

        check_positive_int(S, "S")
        flash = value_stage == "flash"
        stash = {} if flash else {"stash_dtype": stash_dtype}
        self.value_ws = ts.SantaWorkspace.for_inputs(q, kv, S, tile, seed=seed + 1, **stash)
        self._kernel = {"prop": ts.santa_prop, "sys": ts.santa_sys, "strat": ts.santa_strat,
                        "iid": ts.santa_iid, "flash": ts.santa_flash}[value_stage]
        self._kw = {"tile": tile, "scale": scale, "workspace": self.value_ws, **stash}
        if value_stage == "prop":
            self._kw["alloc"] = alloc
        self._S = S

    def reset_rng(self, step: int = 0, seed: int | None = None) -> None:
        """Replays a run exactly: both the mask draws and the value stage's samples."""
        self.bernoulli.reset_rng(step, seed)
        if self.value_stage != "dense":
            self.value_ws.reset_rng(step, None if seed is None else seed + 1)

    def __call__(self, q: torch.Tensor, kv: KVCache, uniforms: torch.Tensor | None = None,
                 *, info: bool = False):
        """Returns the output ``[B, Hq, d]`` (and, with ``info``, the value stage's info,
        None for dense values, and the feature counts)."""
        w, features = bernoulli_queries(q, kv.num_kv_heads, draws=self.draws,
                                        grouping=self.grouping, workspace=self.bernoulli,
                                        uniforms=uniforms)
        if self.value_stage == "dense":
            out, value_info = self._kernel(w, kv, **self._kw), None
        else:
            extra = {"return_counts": True} if info and self.value_stage == "flash" else {}
            out, value_info = self._kernel(w, kv, self._S, **self._kw, **extra)
        return (out, value_info, features) if info else out
