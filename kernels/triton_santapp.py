"""Triton kernels for SANTA++ decode attention (docs/algorithms.md sections 6 and 8).

One decode step for ``q [B, Hq, d]`` runs four kernels (one fewer with the atomic
merge), none of which synchronises with
the host, so a call can be captured in a CUDA graph; the Philox step counter lives on
the device (``rng``, advanced by the last kernel) so every replay draws fresh Gumbel
noise.

1. **select** ``(splits, B*Hkv)``: each program scores a block of ``TB`` representatives
   for all ``G`` query heads of its KV head with one ``tl.dot`` (``phi = tau q.r + log n``,
   ``-inf`` for padding teams), adds Gumbel noise (32-bit Philox keyed by ``(seed, step)``,
   counter ``(b, block of 4 heads, team)``, ``rand4x``; ``gumbels=`` overrides it) and
   writes ``phi`` and ``z = phi + Gumbel``. In *local* mode (many teams: ``G * T``
   above ``FINISH_MAX_SCALE *`` :data:`FINISH_CAP`) it also keeps its block's top
   ``M+1`` per head as candidates (threshold found by the search below); in direct
   selection it stores each head's ``j``-th largest ``z`` of its block (``bracket``,
   ``j = ceil((M+1) / splits) <= 3``): the finisher's search bracket.
   **finish** (its own kernel, grid ``(B*Hkv, G)``, one program per query head;
   ``finish_heads=0``: one program per KV group) finds ``kappa`` = the ``(M+1)``-th
   largest ``z`` by a k-ary search on order-preserving integer keys (:func:`_kth_search`:
   4 or 8 thresholds a step, one packed reduction each, ~3-5 dependent steps instead of
   ~11 for bisection; from the select programs' bracket, or from the row's least finite
   and largest key).
   With ``compact`` (the per-head finisher's default in direct selection) the select
   programs leave their split's top ``j`` z: the (M+1)-th largest of those bounds kappa
   from below, and the ~M+5 keys at or above the bound are compacted and ranked by one
   comparison instead (:func:`_compact_finish`; the search where more than ``CAP`` lie
   there). With ``head_lists`` (the per-head finisher's default) each program writes
   its head's selected teams (``z > kappa``, team order) to that head's ``M`` slots of
   the list; otherwise the group's last finishing program (an acq_rel ticket) writes the
   compact union over the group (team order, or in local mode a team belongs to the
   first head that selected it) and its count. The call at 32k B=1: 23.8 us with
   the earlier finisher, 21.6 with lists and bracket, 20.7 with the compaction (H200,
   2026-12-01: results/h200/tune-2026-12-01-s11, tune-2026-12-01-s12).
2. **attend** ``(B*Hkv, chunks + exact programs)``: a team program loads ``TPB`` teams of
   the list (``SLOT`` rows each; with head lists a slot counts only in the list of the
   first head that selected its team; otherwise programs past the device-side union
   count read nothing; empty programs write an empty partial, so the merge needs no count),
   K once for the whole group (``tl.dot`` with ``[G_PAD, d]`` queries), the weight
   ``w_{h,g} = 1/pi_{h,g}`` (``pi = 1 - exp(-exp(phi - kappa))``; 0 where head ``h`` did
   not select ``g``), and V; it keeps the weighted online softmax
   ``p = w e^{s - m}`` and writes a partial ``(m, l, acc)`` per head. Exact programs walk
   the exact set ``E`` (tokens in no team: the first ``sink`` and ``[team_end, length)``)
   with weight 1. With ``merge_atomic`` (the default up to 16 (sequence, KV head)
   groups) each program also adds its partial scaled by ``e^{m - kappa}`` into per-head
   fp32 sums (scaled to one reference per head the partials are additive; ``1/pi``
   keeps a selected team's term near ``e^{s - phi}``, so the sums stay in range) and the
   group's last program (an acq_rel ticket) writes ``sum_o / sum_l``, or merges the
   partials as below where a sum left [2^-64, 2^64]; it advances ``rng``. No merge kernel
   runs then (20.7 -> 18.1 us at 32k B=1; not bitwise reproducible: the adds' order).
3. **merge** ``(B*Hq)``: log-sum-exp merge of every partial as triton_splitkv's stage 2
   (max first, then one weighted sum over up to 64 partials a step; about one attend
   program per SM keeps B=1 at 33 partials per head), ``out = num / den`` in q's dtype
   (the self-normalised Horvitz-Thompson ratio of section 6); advances ``rng``.

Team storage (:class:`PackedTeams`): representatives ``[B, Hkv, T, d]`` in the cache dtype,
``log n_g`` (``-inf`` for padding), team start/length tables and the exact-set bounds.
``contiguous`` teams are *views* of the cache: team ``g`` is the rows
``start_g .. start_g + n_g - 1`` of the cache (contiguous or paged; paged rows are looked
up in the page table), nothing is copied. ``kmeans`` teams (or ``copy=True``) are copied
team-major into ``[B, Hkv, R, d]`` K/V buffers so each team is one contiguous read. Index
build + pack is prefill-time work: :func:`build_packed` does both, :func:`time_index_build`
times it apart from decode.

Limits: head dim >= 16 (any; padded to a power of two); team sizes >= 1, no power of two
needed (a team is read in chunks of ``SLOT = next_pow2(longest team)`` rows, at most 128,
32 for ``d > 128``, halved for fp32); group size <= 64; K/V in bf16, fp16 or fp32;
``gumbel-topk`` only (multinomial and ``mix`` are reference-only and raise);
``1 <= M <=`` the fewest teams of any (sequence, KV head).

Byte model (element size ``E``, ``T`` teams per (b, kv head), union ``U`` teams of the
group, ``n_u`` their members, ``X`` exact rows):

* select: reads ``B*Hkv*T*(d*E + 4)`` (representatives, ``log n``) + q; writes
  ``2*B*Hq*T*4`` (``phi``, ``z``; L2-resident) + local candidates ``B*Hq*splits*(M+1)*8``;
  the finishers re-read ``z`` (or the candidates) from L2.
* attend: reads ``Σ (n_u + X) * 2 * d * E`` (K and V rows, union per group) + ``U*G*8``
  (``z``, ``phi``); writes ``B*Hq*(chunks used + exact programs)*(d + 2)*4``.
* merge: reads those partials, writes ``B*Hq*d*E`` (atomic merge: each attend program
  adds ``(d + 1)`` fp32 a head of its group; the group's last program reads the sums
  once).

At Llama-3.1-8B shape (Hq=32, Hkv=8, d=128, bf16), 32k tokens, P=16, M=32, B=1: the
representatives are 8 x 2048 x 256 B = 4.2 MB and the teams at most 8 x 128 x 16 rows x
512 B = 8.4 MB, against 134 MB of dense K+V (<= 9.4%). The KV read fraction reported
excludes the representatives (union rows + exact rows); the read-equivalent adds them
as K rows. With ``reps=int8`` (:func:`quantize_packed`) a representative is d int8 codes
and one fp32 scale: 8 x 2048 x 132 B = 2.2 MB at that shape.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from santa_kernels.kv import KVCache
from santa_kernels.reads import ReadCounts
from santa_kernels.santapp import (
    DEFAULT_SINK,
    DEFAULT_WINDOW,
    REPS_FORMATS,
    TeamIndex,
    _check_kv,
    build_team_index,
    kmeans_groups,
    kmeans_team_ids,
    quantize_reps,
    team_end_of,
)
from santa_kernels.triton_santa import (
    _pdl_enter,
    _pdl_trigger,
    _pdl_wait,
    _row_offsets,
    _sm_count,
    pdl_available,
)
from santa_kernels.validate import InputError, check_positive_int, check_scale

# -------------------------------------------------------------------- constants
KEY_NEG_INF = -2139095041  # order-preserving int32 key of -inf (bits 0xFF800000 ^ 0x7FFFFFFF)
KEY_PAD = -2147483648  # below every real key: slots that hold no team
FINISH_CAP = 8192  # heads x candidates a finishing program of 8 warps keeps in registers
# direct selection while its union step holds up to this many x FINISH_CAP keys (a GQA
# group of 7 at 32k: 128 select programs a KV head instead of local selection's one, the
# call 10.5x faster at B=1; 8 finishing warps beat 16 and 32; H100, 2026-12-06,
# results/h100/tune-2026-12-06-h100-santapp-direct)
FINISH_MAX_SCALE = 2
MAX_TEAMS_PER_SPLIT = 1024  # representatives one select program scores (local mode)
MAX_GROUP = 64
H200_SM_COUNT = 132
PROGRAMS_PER_SM = 2  # select/attend grids aim for about this many programs per SM
KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_REPS_AS = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}  # int8 codes
STAGES = ("select", "attend", "merge")
# Hopper launch parameters. Every kernel here is latency bound at B=1 (a few KB per
# program): 4 warps, one stage; the finisher needs 8 warps when it holds more than 2048
# keys (select_warps_*, the finisher's default). Each value was chosen by timing its
# alternatives on an H200 (harness calls and the e2e decode loop at 32k-128k); the runs
# that chose them, with their figures, are the tune-* and e2e-variants-* folders of
# results/h200 and their READMEs.
HOPPER = {
    "select_warps_small": 4,
    "select_warps_large": 8,
    # from many_groups (sequence, KV head) groups on, direct selection (not local) scores
    # at most select_teams_many representatives a program with score_warps_many warps
    # (the finisher keeps its own)
    "many_groups": 32,
    "select_teams_many": 128,
    "score_warps_many": 4,
    # the select kernel's warps where there are fewer groups (the finisher keeps
    # select_warps)
    "score_warps_few": 4,
    # the finisher's kth search tests 8 thresholds a step (~4 steps) while each thread
    # holds at most this many keys, else 4 (~6 steps): the compares cost per key
    "search_8way_keys_per_thread": 16,
    "attend_warps": 4,
    # rows of K/V a team program loads per chunk, by head dim (lowered where there would
    # be fewer programs than SMs)
    "attend_rows": {64: 64, 128: 64, 256: 32},
    # a team program walks 2x more tiles of the list while the grid keeps at least
    # attend_loop_programs_per_sm programs per SM (0: one tile a program), up to
    # attend_max_loops tiles, unpipelined (attend_stages)
    "attend_loop_programs_per_sm": 2,
    "attend_max_loops": 4,
    "attend_stages": 1,
    # one team a tile (teams_per_block = 1): the program's list entries, team rows and
    # weights are loaded before its tile loop, which then loads only K/V from addresses
    # in registers, pipelined attend_preload_stages deep (two K/V buffers at 3 stages:
    # 74 KB of shared memory, 3 programs an SM on sm_90), up to attend_preload_max_loops
    # tiles; walks of up to attend_preload_deep_max_loops tiles take
    # attend_preload_deep_stages (three buffers, 2 programs an SM). Tiles of several teams
    # keep the unpreloaded walk (their z/phi loads would be staged too).
    "attend_preload": True,
    "attend_preload_max_loops": 32,
    "attend_preload_stages": 3,
    "attend_preload_deep_stages": 4,
    "attend_preload_deep_max_loops": 4,
    "exact_rows": {64: 64, 128: 64, 256: 32},
    # heads per finishing program: 0 = one program per KV group finds every head's kappa
    # and writes the union; h > 0 = G/h programs per group, the last writes the union
    "finish_heads": 1,
    # the finisher's search starts from a bracket the select programs leave (each split's
    # j-th largest z, j = ceil((M+1) / splits) <= 3; direct selection) instead of the
    # row's least finite and largest key: fewer steps and no opening reduction
    "bracket": True,
    # the per-head finishers write each head's selected teams to its own M slots of the
    # list (no ticket, no union step over the group's z); a team selected by several heads
    # is then loaded by several attend programs and counted in its first head's slot only
    "head_lists": True,
    # the per-head finisher finds kappa without the search where it can: the select
    # programs leave each split's top BRACKET z (not only the BRACKET-th); the (M+1)-th
    # largest of those bounds kappa from below, the finisher compacts the few keys at or
    # above that bound (~M+5 of 2048 on Gumbel-perturbed rows) and ranks them by one
    # [CAP, CAP] comparison (CAP = next_pow2(compact_slack * (M+1))), up to
    # compact_max_cap; rows with more keys above the bound take the search
    "compact": True,
    "compact_slack": 1.5,
    "compact_max_cap": 64,
    # the attend programs add their partials, scaled to the head's kappa (a reference
    # every program knows, near the selected teams' log-masses: w e^{s - kappa} ~ e^{s -
    # phi}), into per-head fp32 sums with atomics; the group's last program (an acq_rel
    # ticket) divides, so no merge kernel runs. Where a head's sum leaves [2^-64, 2^64]
    # (a log-mass 44 above kappa) that program merges the head's partials by their
    # maxima instead. Not bitwise reproducible: the sums' order is the arrival order.
    # Up to merge_atomic_max_groups (sequence, KV head) groups (more: the merge kernel,
    # faster inside the e2e decode loop there)
    "merge_atomic": True,
    "merge_atomic_max_groups": 16,
    "merge_warps": 4,  # 8 when a merge step holds >= 4096 partial elements
    "merge_block": 64,  # partials merged per step (fewer when there are fewer)
    # every kernel after the first is launched as a programmatic dependent of the one
    # before (its launch overlaps the previous kernel's last wave; griddepcontrol.wait
    # before it reads anything): where pdl_available() and B * Hkv <= pdl_max_groups
    "pdl": True,
    "pdl_max_groups": 16,
    # above pdl_max_groups: select, finish and attend still programmatic dependents (only
    # the merge launched after the attend grid has finished): True, False, or "int8" (with
    # int8 representatives only)
    "pdl_before_merge": "int8",
}


def santapp_triton_available() -> tuple[bool, str]:
    """Returns ``(available, reason)`` for the SANTA++ Triton kernels here."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return True, "interpreter"
    if torch.cuda.is_available():
        return True, f"cuda ({torch.cuda.get_device_name()})"
    return False, "no CUDA device (set TRITON_INTERPRET=1 to run the kernels on the CPU)"


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _dot_precision(dtype: torch.dtype) -> str:
    """'ieee' for fp32 data and for bf16/fp16 under the interpreter (whose numpy dot has no
    16-bit floats); else 'tf32' (ignored for 16-bit inputs: tensor cores)."""
    if dtype == torch.float32 or _interpreted():
        return "ieee"
    return "tf32"


def _next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------- packed teams
@dataclass(frozen=True)
class PackedTeams:
    """A team index laid out for the kernels (device tensors unless noted).

    ``reps [B, Hkv, T, d]`` (cache dtype), ``log_n [B, Hkv, T]`` (fp32, ``-inf`` for
    padding teams), ``team_start``/``team_len [B, Hkv, T]`` (int32): team ``g`` is rows
    ``team_start .. team_start + team_len - 1`` of the packed K/V (``packed_k`` set) or
    of the cache (positions; ``packed_k`` None). ``regular``: ``team_start = sink + g*P``
    and ``team_len = min(P, team_end - team_start)`` for every team (the kernel then
    computes them). ``team_end [B]`` (int32): the exact set is ``[0, min(sink, team_end))``
    and ``[team_end, length)``. Host values: ``num_teams [B, Hkv]``, ``lengths [B]`` at
    pack time, ``max_team_len``, ``exact_max`` (exact rows at pack time).

    ``reps_scale [B, Hkv, T]`` (fp32): set when the representatives are stored as int8
    codes (``reps`` int8, :func:`santa_kernels.santapp.quantize_reps`; half the select
    kernel's bytes at 16-bit caches), ``kv_element_size`` then the cache's element size.
    """

    policy: str
    team_size: int
    sink: int
    exact_recent: int
    reps: torch.Tensor
    log_n: torch.Tensor
    team_start: torch.Tensor
    team_len: torch.Tensor
    team_end: torch.Tensor
    packed_k: torch.Tensor | None
    packed_v: torch.Tensor | None
    regular: bool
    max_team_len: int
    exact_max: int
    num_teams: torch.Tensor
    lengths: torch.Tensor
    reps_scale: torch.Tensor | None = None
    kv_element_size: int = 0

    @property
    def reps_format(self) -> str:
        """``model`` (the cache dtype) or ``int8`` (codes and a per-team scale)."""
        return "model" if self.reps_scale is None else "int8"

    @property
    def kv_itemsize(self) -> int:
        """Bytes of one K/V element of the cache the index was built on."""
        return self.kv_element_size or self.reps.element_size()

    @property
    def batch(self) -> int:
        return int(self.reps.shape[0])

    @property
    def num_kv_heads(self) -> int:
        return int(self.reps.shape[1])

    @property
    def max_teams(self) -> int:
        """Padded team count ``T`` of the tables."""
        return int(self.reps.shape[2])

    @property
    def head_dim(self) -> int:
        return int(self.reps.shape[3])

    @property
    def min_teams(self) -> int:
        return int(self.num_teams.min())

    @property
    def team_valid(self) -> torch.Tensor:
        return self.team_len > 0

    @property
    def nbytes(self) -> int:
        """Bytes of the index the kernels read (tables, representatives, packed K/V)."""
        tensors = [self.reps, self.log_n, self.team_start, self.team_len, self.team_end]
        tensors += [t for t in (self.packed_k, self.packed_v, self.reps_scale) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    def what_is_read(self) -> str:
        """One line: where the kernel reads team rows from."""
        if self.packed_k is not None:
            return "team-major packed K/V copy [B, Hkv, R, d] (one contiguous span per team)"
        return "the cache itself (contiguous spans; paged: rows looked up in the page table)"


def build_packed(
    kv: KVCache,
    *,
    policy: str = "contiguous",
    team_size: int = 16,
    leaders: int = 4,
    representative: str = "mean",
    seed: int = 0,
    sink: int = DEFAULT_SINK,
    exact_recent: int = DEFAULT_WINDOW,
    copy: bool = False,
    index_dtype: torch.dtype | None = None,
    reps_kernel: bool | None = None,
    reps: str = "model",
) -> PackedTeams:
    """Builds the team index of ``kv`` and packs it (prefill-time work).

    ``contiguous`` (without ``copy``) and ``kmeans`` are built on the cache's device
    directly (means, leaders and representatives in ``index_dtype``: fp64 on a CPU, fp32 on
    a GPU; k-means for every (sequence, KV head) at once, :func:`_kmeans_packed`); a
    contiguous index with ``copy`` goes through
    :func:`santa_kernels.santapp.build_team_index` (CPU, fp64) and :func:`pack_teams`.
    ``reps_kernel`` (``contiguous``): the representatives by one Triton kernel (one read
    of K) or by a torch loop over sequences; ``None``: the kernel on a GPU, the loop on a
    CPU. ``reps``: the representatives in the cache dtype (``model``) or as int8 codes
    with a per-team scale (``int8``,
    :func:`quantize_packed`).
    """
    kv = _check_kv(kv)
    if reps not in REPS_FORMATS:
        raise InputError(f"reps: expected one of {REPS_FORMATS}, got {reps!r}")
    if reps == "int8":
        return quantize_packed(build_packed(
            kv, policy=policy, team_size=team_size, leaders=leaders,
            representative=representative, seed=seed, sink=sink, exact_recent=exact_recent,
            copy=copy, index_dtype=index_dtype, reps_kernel=reps_kernel))
    if policy == "contiguous" and not copy:
        return _contiguous_packed(kv, team_size, representative, sink, exact_recent, index_dtype,
                                  reps_kernel)
    if policy == "kmeans":
        return _kmeans_packed(kv, team_size, leaders, representative, seed, sink, exact_recent,
                              index_dtype)
    index = build_team_index(
        kv,
        policy=policy,
        team_size=team_size,
        leaders=leaders,
        representative=representative,
        seed=seed,
        exact_recent=exact_recent,
        sink=sink,
    )
    return pack_teams(kv, index, copy=copy)


def quantize_packed(packed: PackedTeams) -> PackedTeams:
    """``packed`` with its representatives as int8 codes and a per-team fp32 scale
    (:func:`santa_kernels.santapp.quantize_reps`: the select kernel reads d + 4 bytes a
    team instead of 2d at 16-bit caches; the estimator stays unbiased, its phi being that
    of the rounded representatives)."""
    if packed.reps_scale is not None:
        return packed
    codes, scale = quantize_reps(packed.reps)
    return dataclasses.replace(packed, reps=codes.contiguous(), reps_scale=scale.contiguous(),
                               kv_element_size=packed.reps.element_size())


@triton.jit
def _contiguous_reps_kernel(
    k_ptr, reps_ptr, team_end_ptr, t_cap, sink,
    stride_kb, stride_kn, stride_kh, stride_rb, stride_rh, stride_rt,
    NUM_KV_HEADS: tl.constexpr, P: tl.constexpr, HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr, TB: tl.constexpr, MEAN: tl.constexpr,
):
    """Representatives of TB contiguous teams ``[sink + tP, sink + (t+1)P)`` of one
    (sequence, KV head): the members' mean (MEAN) or the leader, the member nearest the
    mean (the lowest position on ties), as ``_contiguous_packed``'s torch loop computes
    them (fp32; teams without members get zeros). K is read once."""
    bkv = tl.program_id(0)
    b = bkv // NUM_KV_HEADS
    h = bkv % NUM_KV_HEADS
    teams = tl.program_id(1) * TB + tl.arange(0, TB)
    slots = tl.arange(0, P)
    offs_d = tl.arange(0, D_PAD)
    end = tl.load(team_end_ptr + b)
    pos = sink + teams[:, None] * P + slots[None, :]  # [TB, P]
    member = (pos < end) & (teams[:, None] < t_cap)
    keys = tl.load(k_ptr + b.to(tl.int64) * stride_kb + pos[:, :, None].to(tl.int64) * stride_kn
                   + h * stride_kh + offs_d[None, None, :],
                   mask=member[:, :, None] & (offs_d < HEAD_DIM)[None, None, :],
                   other=0.0).to(tl.float32)  # [TB, P, D_PAD]
    count = tl.maximum(tl.sum(member.to(tl.float32), axis=1), 1.0)
    mean = tl.sum(keys, axis=1) / count[:, None]  # [TB, D_PAD]
    if MEAN:
        rep = mean
    else:
        diff = keys - mean[:, None, :]
        dist = tl.where(member, tl.sum(diff * diff, axis=2), float("inf"))  # [TB, P]
        nearest = tl.min(dist, axis=1)
        leader = tl.min(tl.where(dist == nearest[:, None], slots[None, :], P), axis=1)
        rep = tl.sum(tl.where((slots[None, :] == leader[:, None])[:, :, None], keys, 0.0),
                     axis=1)
    tl.store(reps_ptr + b.to(tl.int64) * stride_rb + h * stride_rh
             + teams[:, None].to(tl.int64) * stride_rt + offs_d[None, :],
             rep.to(reps_ptr.dtype.element_ty),
             mask=(teams < t_cap)[:, None] & (offs_d < HEAD_DIM)[None, :])


REPS_KERNEL_ELEMENTS = 8192  # [TB, P, d] keys per program (fp32 registers at 4 warps)


def _contiguous_reps_on_device(kv: KVCache, reps: torch.Tensor, team_end: torch.Tensor,
                               t_cap: int, team_size: int, sink: int, mean: bool) -> bool:
    """Fills ``reps [B, Hkv, T, d]`` with ``_contiguous_reps_kernel`` (one read of K) where
    it applies: a contiguous cache, power-of-two teams small enough for one program.
    Returns False (reps untouched) where it does not."""
    d_pad = _next_pow2(kv.head_dim)
    per_team = team_size * d_pad
    if kv.layout != "contiguous" or team_size & (team_size - 1) or per_team > REPS_KERNEL_ELEMENTS:
        return False  # (rows past a sequence's team end are never loaded: masked)
    tb = max(1, min(_next_pow2(t_cap), REPS_KERNEL_ELEMENTS // per_team))
    k = kv.k
    grid = (kv.batch * kv.num_kv_heads, -(-t_cap // tb))
    _contiguous_reps_kernel[grid](
        k, reps, team_end.to(device=k.device, dtype=torch.int32), t_cap, sink,
        k.stride(0), k.stride(1), k.stride(2), reps.stride(0), reps.stride(1), reps.stride(2),
        NUM_KV_HEADS=kv.num_kv_heads, P=team_size, HEAD_DIM=kv.head_dim, D_PAD=d_pad,
        TB=tb, MEAN=mean, num_warps=4,
    )
    return True


def _index_dtype(kv: KVCache, index_dtype: torch.dtype | None, team_size: int,
                 representative: str, **counts: int) -> torch.dtype:
    """Checks a device build's parameters (``counts``: integers >= 0) and returns the dtype
    its means and representatives are computed in: ``index_dtype``, or fp64 on a CPU and
    fp32 on a GPU."""
    check_positive_int(team_size, "team_size")
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(f"{name}: expected an integer >= 0, got {value!r}")
    if representative not in ("leader", "mean"):
        raise InputError(f"representative: expected 'leader' or 'mean', got {representative!r}")
    return index_dtype or (torch.float64 if kv.device.type == "cpu" else torch.float32)


def _contiguous_packed(
    kv: KVCache,
    team_size: int,
    representative: str,
    sink: int,
    exact_recent: int,
    index_dtype: torch.dtype | None,
    reps_kernel: bool | None = None,
) -> PackedTeams:
    """Contiguous teams ``[sink + gP, sink + (g+1)P)`` built on the device (no copy of K/V).
    ``reps_kernel``: representatives by ``_contiguous_reps_kernel`` (one read of K)
    instead of the torch loop over sequences (``None``: on a GPU)."""
    device, dtype = kv.device, _index_dtype(kv, index_dtype, team_size, representative,
                                            sink=sink, exact_recent=exact_recent)
    lengths = kv.lengths.cpu()
    team_end = team_end_of(lengths, sink, exact_recent)
    lo = torch.minimum(torch.full_like(team_end, sink), team_end)
    n_teams = (team_end - lo + team_size - 1) // team_size
    batch, hkv, d = kv.batch, kv.num_kv_heads, kv.head_dim
    t_cap = max(1, int(n_teams.max()))
    reps = torch.zeros(batch, hkv, t_cap, d, dtype=kv.dtype, device=device)
    slots = torch.arange(team_size, device=device)
    starts = sink + torch.arange(t_cap, device=device) * team_size  # [T]
    if reps_kernel is None:  # the kernel computes in fp32: an fp64 index takes the loop
        reps_kernel = device.type == "cuda" and dtype == torch.float32
    on_device = reps_kernel and _contiguous_reps_on_device(
        kv, reps, team_end, t_cap, team_size, sink, representative == "mean")
    for b in range(0 if on_device else batch):
        if int(n_teams[b]) == 0:
            continue
        pos = starts[:, None] + slots[None, :]  # [T, P]
        member = pos < int(team_end[b])
        if kv.layout == "contiguous" and sink + t_cap * team_size <= kv.k.shape[1]:
            keys = kv.k[b, sink : sink + t_cap * team_size].to(dtype)  # a slice, no gather
        else:
            keys = _rows(kv, b, pos.clamp_max(int(lengths[b]) - 1).reshape(-1)).to(dtype)
        keys = keys.reshape(t_cap, team_size, hkv, d)
        keys = torch.where(member[:, :, None, None], keys, 0)
        count = member.sum(dim=1).clamp_min(1).to(dtype)  # [T]
        mean = keys.sum(dim=1) / count[:, None, None]  # [T, Hkv, d]
        if representative == "mean":
            reps[b] = mean.transpose(0, 1).to(kv.dtype)
            continue
        dist = ((keys - mean[:, None]) ** 2).sum(dim=-1)  # [T, P, Hkv]
        dist = torch.where(member[:, :, None], dist, math.inf)
        leader = dist.argmin(dim=1)  # [T, Hkv]: first (lowest position) on ties
        chosen = torch.gather(keys, 1, leader[:, None, :, None].expand(-1, 1, -1, d))[:, 0]
        reps[b] = chosen.transpose(0, 1).to(kv.dtype)
    start = starts.to(torch.int32).expand(batch, hkv, t_cap)
    end = team_end.to(device=device, dtype=torch.int32)
    length = (end[:, None, None] - start).clamp(0, team_size).to(torch.int32).contiguous()
    start = torch.where(length > 0, start, 0).contiguous()  # padding teams: 0, as pack_teams
    log_n = torch.where(length > 0, length.float().clamp_min(1).log(), -math.inf)
    return PackedTeams(
        policy="contiguous",
        team_size=team_size,
        sink=sink,
        exact_recent=exact_recent,
        reps=reps.contiguous(),
        log_n=log_n.contiguous(),
        team_start=start.contiguous(),
        team_len=length,
        team_end=end,
        packed_k=None,
        packed_v=None,
        regular=True,
        max_team_len=max(1, int(length.max())),
        exact_max=int((lo + lengths - team_end).max()),
        num_teams=n_teams[:, None].expand(batch, hkv).clone(),
        lengths=lengths.clone(),
    )


def _kmeans_packed(
    kv: KVCache,
    team_size: int,
    leaders: int,
    representative: str,
    seed: int,
    sink: int,
    exact_recent: int,
    index_dtype: torch.dtype | None,
) -> PackedTeams:
    """k-means teams built and packed on the cache's device: the teams, leaders and
    representatives of :func:`santa_kernels.santapp.build_team_index` with
    :func:`pack_teams` (the same random draws, so the same teams up to rounding), with
    every (sequence, KV head) clustered at once instead of one after another. K and V are
    copied team-major into ``[B, Hkv, R, d]``."""
    check_positive_int(leaders, "leaders")
    device, dtype = kv.device, _index_dtype(kv, index_dtype, team_size, representative,
                                            sink=sink, exact_recent=exact_recent, seed=seed)
    lengths = kv.lengths.cpu()
    team_end = team_end_of(lengths, sink, exact_recent)
    spans = [(min(sink, int(end)), int(end)) for end in team_end]
    keys, values, _ = kv.padded()
    groups, counts = kmeans_groups(keys.to(dtype), spans)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    team_of, _ = kmeans_team_ids(groups, counts, team_size, leaders, gen)  # [G, n]
    batch, hkv, d = kv.batch, kv.num_kv_heads, kv.head_dim
    n_groups = batch * hkv
    t_cap = max(1, int(team_of.max()) + 1)
    valid = team_of >= 0
    group = torch.arange(n_groups, device=device)
    seg = (group[:, None] * t_cap + team_of)[valid]  # flat (group, team) of every member
    sizes = torch.bincount(seg, minlength=n_groups * t_cap)
    members = groups[valid]  # [rows, d], group-major, positions ascending
    mean = torch.zeros(n_groups * t_cap, d, dtype=dtype, device=device).index_put_(
        (seg,), members, accumulate=True) / sizes.clamp_min(1)[:, None].to(dtype)
    if representative == "mean":
        reps = mean
    else:  # the member nearest its team's mean, the lowest position on ties
        dist = ((members - mean[seg]) ** 2).sum(-1)
        best = torch.full((n_groups * t_cap,), math.inf, dtype=dtype, device=device)
        best = best.scatter_reduce(0, seg, dist, "amin")
        rows = torch.arange(members.shape[0], device=device)
        cand = torch.where(dist == best[seg], rows, members.shape[0])
        nearest = torch.full((n_groups * t_cap,), members.shape[0], dtype=torch.int64,
                             device=device).scatter_reduce(0, seg, cand, "amin")
        reps = torch.where((sizes > 0)[:, None], members[nearest.clamp_max(
            max(0, members.shape[0] - 1))], 0)
    sizes = sizes.view(batch, hkv, t_cap)
    # team-major rows per group: a stable sort by team id keeps positions ascending inside
    order = torch.argsort(torch.where(valid, team_of, t_cap), dim=1, stable=True)
    width = max(1, max(counts, default=0))
    lo = torch.tensor([spans[g // hkv][0] for g in range(n_groups)], device=device)
    pos = (order[:, :width] + lo[:, None]).clamp_max(max(0, keys.shape[1] - 1))
    head = (group % hkv)[:, None]
    filled = torch.arange(width, device=device)[None, :] < torch.tensor(
        counts, device=device)[:, None]
    b_of = (group // hkv)[:, None]
    packed_k = torch.where(filled[..., None], keys[b_of, pos, head], 0).view(batch, hkv, width, d)
    packed_v = torch.where(filled[..., None], values[b_of, pos, head], 0).view(
        batch, hkv, width, d)
    start = torch.cumsum(sizes, dim=-1) - sizes
    lo_b = torch.minimum(torch.full_like(team_end, sink), team_end)
    log_n = torch.where(sizes > 0, sizes.double().clamp_min(1).log(), -math.inf)
    return PackedTeams(
        policy="kmeans",
        team_size=team_size,
        sink=sink,
        exact_recent=exact_recent,
        reps=reps.view(batch, hkv, t_cap, d).to(kv.dtype).contiguous(),
        log_n=log_n.to(torch.float32).contiguous(),
        team_start=start.to(torch.int32).contiguous(),
        team_len=sizes.to(torch.int32).contiguous(),
        team_end=team_end.to(device=device, dtype=torch.int32),
        packed_k=packed_k.contiguous(),
        packed_v=packed_v.contiguous(),
        regular=False,
        max_team_len=max(1, int(sizes.max())),
        exact_max=int((lo_b + lengths - team_end).max()),
        num_teams=(sizes > 0).sum(dim=-1).cpu(),
        lengths=lengths.clone(),
    )


def _rows(kv: KVCache, b: int, pos: torch.Tensor) -> torch.Tensor:
    """K rows ``[len(pos), Hkv, d]`` of sequence ``b`` at positions ``pos``."""
    if kv.layout == "paged":
        page = kv.page_table[b, pos // kv.page_size].long()
        return kv.k[page, pos % kv.page_size]
    return kv.k[b, pos]


def pack_teams(kv: KVCache, index: TeamIndex, *, copy: bool = False) -> PackedTeams:
    """Returns ``index`` laid out for the kernels.

    Teams that are contiguous spans of positions (``contiguous`` policy, also after
    :func:`~santa_kernels.santapp.extend`) stay views of the cache unless ``copy``;
    otherwise (``kmeans``) K and V are copied team-major into ``[B, Hkv, R, d]``.
    The exact set is the index's: tokens in no team (``sink`` first tokens, and from
    ``team_end`` on).
    """
    kv = _check_kv(kv)
    if not isinstance(index, TeamIndex):
        raise InputError(f"index: expected a TeamIndex, got {type(index).__name__}")
    if index.batch != kv.batch or index.num_kv_heads != kv.num_kv_heads:
        raise InputError(
            f"index: built for {index.batch} sequences x {index.num_kv_heads} KV heads, "
            f"the cache has {kv.batch} x {kv.num_kv_heads}"
        )
    if index.rep_keys.shape[-1] != kv.head_dim:
        raise InputError("index: head dim does not match the cache's")
    lengths = kv.lengths.cpu()
    if bool((lengths < index.length).any()):
        raise InputError(f"index: covers {index.length.tolist()} tokens, more than the cache's")
    device = kv.device
    batch, hkv, t_cap, width = index.members.shape
    sizes = index.sizes
    members = index.members
    first = members[..., 0].clamp_min(0)
    slot = torch.arange(width)
    in_team = slot[None, None, None, :] < sizes[..., None]
    spans = bool(((members == first[..., None] + slot) | ~in_team).all())
    team_end = index.team_end.clone()
    if spans and not copy:
        start = torch.where(sizes > 0, first, 0)
        packed_k = packed_v = None
        expect = index.sink + torch.arange(t_cap) * index.team_size  # team g at sink + gP
        expect_len = (team_end[:, None, None] - expect).clamp(0, index.team_size)
        regular = torch.equal(sizes, expect_len.expand_as(sizes)) and bool(
            ((start == expect) | (sizes == 0)).all()
        )
    else:
        regular = False
        start = torch.cumsum(sizes, dim=-1) - sizes  # team-major rows per (b, h)
        rows = max(1, int(sizes.sum(dim=-1).max()))
        keys, values, _ = kv.padded()
        packed_k = torch.zeros(batch, hkv, rows, kv.head_dim, dtype=kv.dtype, device=device)
        packed_v = torch.zeros_like(packed_k)
        for b in range(batch):
            for h in range(hkv):
                pos = members[b, h][in_team[b, h]].to(device)  # team-major, ascending inside
                n = pos.numel()
                packed_k[b, h, :n] = keys[b, pos, h]
                packed_v[b, h, :n] = values[b, pos, h]
    lo = torch.minimum(torch.full_like(team_end, index.sink), team_end)
    log_n = torch.where(sizes > 0, sizes.double().clamp_min(1).log(), -math.inf)
    return PackedTeams(
        policy=index.policy,
        team_size=index.team_size,
        sink=index.sink,
        exact_recent=index.exact_recent,
        reps=index.rep_keys.to(device=device, dtype=kv.dtype).contiguous(),
        log_n=log_n.to(device=device, dtype=torch.float32).contiguous(),
        team_start=start.to(device=device, dtype=torch.int32).contiguous(),
        team_len=sizes.to(device=device, dtype=torch.int32).contiguous(),
        team_end=team_end.to(device=device, dtype=torch.int32),
        packed_k=packed_k,
        packed_v=packed_v,
        regular=regular,
        max_team_len=max(1, int(sizes.max())),
        exact_max=int((lo + lengths - team_end).max()),
        num_teams=index.num_teams.clone(),
        lengths=lengths.clone(),
    )


def time_index_build(kv: KVCache, *, repeats: int = 3, **params) -> tuple[PackedTeams, float]:
    """Returns ``(packed, milliseconds)``: :func:`build_packed` timed apart from decode
    (median of ``repeats`` builds after one warm-up where a build is quick: contiguous
    teams, and k-means on a GPU; otherwise one build)."""
    check_positive_int(repeats, "repeats")
    policy = params.get("policy", "contiguous")
    cheap = (policy == "contiguous" and not params.get("copy")) or (
        policy == "kmeans" and kv.device.type == "cuda")
    if cheap:
        build_packed(kv, **params)  # warm-up: allocator, kernels' first launch
    times = []
    packed = None
    for _ in range(repeats if cheap else 1):
        _sync(kv.device)
        t0 = time.perf_counter()
        packed = build_packed(kv, **params)
        _sync(kv.device)
        times.append((time.perf_counter() - t0) * 1e3)
    assert packed is not None
    return packed, sorted(times)[len(times) // 2]


# --------------------------------------------------------------------- planning
@dataclass(frozen=True)
class SantaPPPlan:
    """Launch geometry of one call shape (everything static: no device values)."""

    batch: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    max_teams: int
    M: int
    group: int
    g_pad: int  # dot rows (>= 16)
    g_rows: int  # finisher rows (next_pow2(G))
    teams_per_split: int  # TB
    num_splits: int
    local: bool  # candidates per split (True) or the finisher reads every z (False)
    n_cand: int  # candidates per head the finisher reads
    c_pad: int
    m1_pad: int
    s_pad: int
    slot: int  # rows per team per chunk (power of two)
    chunks: int  # chunks per team
    teams_per_block: int  # TPB teams per attend program
    union_cap: int
    team_programs: int  # attend programs per (b, kv head) over the union list
    exact_programs: int
    exact_rows: int  # BLOCK_E
    num_parts: int
    select_warps: int  # the finisher's warps unless finish_warps is given
    score_warps: int  # the select kernel's warps
    search_ways: int  # thresholds per step of the finisher's kth-largest search (4 or 8)
    bracket: int  # j > 0: select programs leave each split's j-th largest z (search bracket)
    head_lists: bool  # the per-head finisher writes M slots a head, no union step
    compact: int  # CAP > 0: the finisher ranks <= CAP compacted keys instead of searching
    tops_pad: int  # next_pow2(bracket * splits): the split tops the compact finisher reads
    finish_heads: int  # heads per finishing program (0: one program per KV group)
    h_rows: int  # rows of a per-head finishing program (next_pow2(finish_heads))
    finish_parts: int  # finishing programs per KV group (per-head finisher)
    finish_warps: int
    finish_ways: int
    merge_block: int  # partials per merge step
    merge_warps: int
    merge_atomic: bool = False  # the attend programs merge (atomic sums + ticket)
    loops: int = 1  # tiles of TPB teams per team program
    attend_stages: int = 1  # software-pipeline depth of a team program's tile loop (loops > 1)
    attend_preload: bool = False  # a team program loads its list entries before its loop


def make_plan(
    batch: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    max_teams: int,
    M: int,
    max_team_len: int,
    exact_max: int,
    sms: int = H200_SM_COUNT,
    *,
    teams_per_split: int | None = None,
    local: bool | None = None,
    teams_per_block: int | None = None,
    exact_programs: int | None = None,
    finish_heads: int | None = None,
    finish_warps: int | None = None,
    bracket: bool | None = None,
    head_lists: bool | None = None,
    compact: bool | None = None,
    merge_atomic: bool | None = None,
    attend_loops: int | None = None,
    attend_stages: int | None = None,
    attend_preload: bool | None = None,
    kv_element_size: int = 2,
) -> SantaPPPlan:
    """Plans the grids (keyword overrides are for tests and tuning). K/V tiles keep their
    byte size: 4-byte K/V and d > 128 halve the rows a program loads at once."""
    group = num_q_heads // num_kv_heads
    g_rows = max(2, _next_pow2(group))
    if batch * num_q_heads * max_teams >= 2**31:
        raise InputError("q: B * Hq * teams must stay below 2**31 (int32 offsets)")
    bkv = batch * num_kv_heads
    m1 = M + 1
    target = PROGRAMS_PER_SM * sms
    if local is None:  # the direct finisher's union step holds G_ROWS x next_pow2(T) keys
        local = g_rows * _next_pow2(max_teams) > FINISH_MAX_SCALE * FINISH_CAP
    if teams_per_split is None:
        if not local:
            wanted = max(1, -(-target // bkv))
            cap = HOPPER["select_teams_many"] if bkv >= HOPPER["many_groups"] else 256
            teams_per_split = min(cap, max(16, _next_pow2(-(-max_teams // wanted))))
        else:
            teams_per_split = max(64, _next_pow2(2 * m1))
            while (
                teams_per_split < MAX_TEAMS_PER_SPLIT
                and g_rows * _next_pow2(-(-max_teams // teams_per_split) * m1) > FINISH_CAP
            ):
                teams_per_split *= 2
    tb = teams_per_split
    if tb < 16 or tb & (tb - 1):
        raise InputError(f"teams_per_split: must be a power of two >= 16, got {tb}")
    if local and tb < m1:
        raise InputError(f"teams_per_split: {tb} is below M+1 = {m1} (local mode)")
    splits = -(-max_teams // tb)
    n_cand = splits * m1 if local else max_teams
    shrink = max(1, kv_element_size // 2)
    rows_cap = (128 if head_dim <= 128 else 32) // shrink
    slot = min(_next_pow2(max_team_len), rows_cap)
    chunks = -(-max_team_len // slot)
    union_cap = min(group * M, max_teams)
    block_rows = HOPPER["attend_rows"][min(HOPPER["attend_rows"], key=lambda k: abs(k - head_dim))]
    block_rows = max(16, block_rows // shrink)
    if teams_per_block is None:
        tpb = max(1, block_rows // slot)
        least = max(1, 16 // slot)  # tl.dot needs >= 16 rows
        while tpb > least and bkv * -(-union_cap // tpb) < sms:  # >= 1 program per SM
            tpb //= 2
        teams_per_block = max(tpb, least)
    if teams_per_block * slot < 16 or teams_per_block & (teams_per_block - 1):
        raise InputError(
            f"teams_per_block: must be a power of two with teams_per_block * {slot} >= 16"
        )
    exact_rows = HOPPER["exact_rows"][min(HOPPER["exact_rows"], key=lambda k: abs(k - head_dim))]
    exact_rows = max(16, exact_rows // shrink)
    if exact_programs is None:
        exact_programs = min(8, max(1, -(-exact_max // exact_rows)))
    check_positive_int(exact_programs, "exact_programs")
    if attend_preload is None:
        attend_preload = HOPPER["attend_preload"]
    # one team a tile only: with several, z/phi stay in the loop, staged too (94 KB), and
    # the preload measured slower (32k B=8 P=16 58.6 -> 68.7-220 us; H200, 2026-12-04,
    # results/h200/tune-2026-12-04-s26)
    attend_preload = bool(attend_preload) and teams_per_block == 1
    if attend_preload and slot > block_rows:
        # a pipelined K/V tile keeps its byte size (two 128-row buffers: one program an SM)
        slot = block_rows
        chunks = -(-max_team_len // slot)
    max_loops = HOPPER["attend_preload_max_loops" if attend_preload else "attend_max_loops"]
    if attend_loops is None:  # fewer, longer team programs while the grid stays full
        per_sm = HOPPER["attend_loop_programs_per_sm"]
        attend_loops = 1
        while (per_sm and attend_loops < max_loops
               and bkv * (-(-union_cap // (teams_per_block * attend_loops * 2)) + exact_programs)
               >= per_sm * sms):
            attend_loops *= 2
    check_positive_int(attend_loops, "attend_loops")
    team_programs = -(-union_cap // (teams_per_block * attend_loops))
    if attend_stages is None:
        attend_stages = HOPPER["attend_stages"]
        if attend_preload and attend_loops > 1:  # deeper for short walks
            short = attend_loops <= HOPPER["attend_preload_deep_max_loops"]
            attend_stages = HOPPER["attend_preload_deep_stages" if short
                                   else "attend_preload_stages"]
    check_positive_int(attend_stages, "attend_stages")
    c_pad = _next_pow2(n_cand)
    select_warps = (
        HOPPER["select_warps_large"] if g_rows * c_pad > 2048 else HOPPER["select_warps_small"]
    )
    keys_per_thread = g_rows * c_pad // (32 * select_warps)
    search_ways = 8 if keys_per_thread <= HOPPER["search_8way_keys_per_thread"] else 4
    if finish_heads is None:
        finish_heads = HOPPER["finish_heads"]
    if finish_heads < 0:
        raise InputError(f"finish_heads: must be >= 0, got {finish_heads}")
    h_rows = _next_pow2(min(finish_heads, group)) if finish_heads else g_rows
    finish_parts = -(-group // h_rows) if finish_heads else 1
    if finish_warps is None:
        finish_warps = select_warps  # the union step holds G x C_PAD keys either way
    check_positive_int(finish_warps, "finish_warps")
    finish_ways = (
        8 if h_rows * c_pad // (32 * finish_warps) <= HOPPER["search_8way_keys_per_thread"]
        else 4
    )
    if bracket is None:
        bracket = HOPPER["bracket"]
    rank = -(-m1 // splits)  # j * splits >= M+1 > (j - 1) * splits
    bracket_rank = rank if bracket and not local and rank <= 3 and max_teams >= m1 else 0
    if head_lists is None:
        head_lists = HOPPER["head_lists"]
    head_lists = bool(head_lists) and finish_heads > 0 and union_cap == group * M
    if compact is None:
        compact = HOPPER["compact"]
    compact_cap = 0
    if compact and bracket_rank and head_lists and h_rows == 1:
        compact_cap = max(16, _next_pow2(math.ceil(HOPPER["compact_slack"] * m1)))
        compact_cap = compact_cap if compact_cap <= HOPPER["compact_max_cap"] else 0
    num_parts = team_programs + exact_programs
    merge_block = min(HOPPER["merge_block"], max(2, _next_pow2(num_parts)))
    merge_warps = HOPPER["merge_warps"] * (2 if merge_block * _next_pow2(head_dim) >= 4096 else 1)
    return SantaPPPlan(
        batch=batch,
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        max_teams=max_teams,
        M=M,
        group=group,
        g_pad=max(16, _next_pow2(group)),
        g_rows=g_rows,
        teams_per_split=tb,
        num_splits=splits,
        local=local,
        n_cand=n_cand,
        c_pad=c_pad,
        m1_pad=_next_pow2(m1),
        s_pad=max(2, _next_pow2(splits)),
        slot=slot,
        chunks=chunks,
        teams_per_block=teams_per_block,
        union_cap=union_cap,
        team_programs=team_programs,
        exact_programs=exact_programs,
        exact_rows=exact_rows,
        num_parts=num_parts,
        select_warps=select_warps,
        score_warps=(HOPPER["score_warps_many"] if not local and bkv >= HOPPER["many_groups"]
                     else HOPPER["score_warps_few"]),
        search_ways=search_ways,
        bracket=bracket_rank,
        head_lists=head_lists,
        compact=compact_cap,
        tops_pad=max(2, _next_pow2(bracket_rank * splits)),
        finish_heads=finish_heads,
        h_rows=h_rows,
        finish_parts=finish_parts,
        finish_warps=finish_warps,
        finish_ways=finish_ways,
        merge_block=merge_block,
        merge_warps=merge_warps,
        merge_atomic=bool(
            HOPPER["merge_atomic"] and bkv <= HOPPER["merge_atomic_max_groups"]
            if merge_atomic is None else merge_atomic
        ),
        loops=attend_loops,
        attend_stages=attend_stages,
        attend_preload=attend_preload,
    )


# -------------------------------------------------------------------- workspace
class SantaPPWorkspace:
    """Every buffer one SANTA++ call needs, allocated once for a :class:`SantaPPPlan`.

    Holds the Philox ``seed`` and the device step counter ``rng`` (advanced by the call's
    last kernel). Outputs are views of the workspace: the next call overwrites them.
    """

    def __init__(
        self, plan: SantaPPPlan, *, device: torch.device | str = "cuda", seed: int = 0
    ) -> None:
        self.plan = plan
        self.device = torch.device(device)
        self.seed = int(seed)
        p = plan
        rows = p.batch * p.num_q_heads
        bkv = p.batch * p.num_kv_heads
        f32 = {"dtype": torch.float32, "device": self.device}
        i32 = {"dtype": torch.int32, "device": self.device}
        self.phi = torch.empty(rows, p.max_teams, **f32)
        self.z = torch.empty(rows, p.max_teams, **f32)
        cand = rows * p.n_cand if p.local else 1
        self.cand_z = torch.empty(cand, **f32)
        self.cand_id = torch.empty(cand, **i32)
        # the splits' BRACKET-th largest z (plane 0); with compact also their larger ones
        planes = p.bracket if p.compact else 1
        self.split_kth = torch.empty(
            rows * p.num_splits * planes if p.local or p.bracket else 1, **i32
        )
        self.scratch_key = torch.empty(max(1, rows * p.compact), **i32)  # compacted keys
        self.scratch_id = torch.empty(max(1, rows * p.compact), **i32)
        self.ticket = torch.zeros(bkv, **i32)
        # the atomic merge's per-head sums and per-group tickets (zeroed by each group's
        # last attend program for the next call)
        self.sum_l = torch.zeros(rows if p.merge_atomic else 1, **f32)
        self.sum_o = torch.zeros(rows * p.head_dim if p.merge_atomic else 1, **f32)
        self.attend_ticket = torch.zeros(bkv if p.merge_atomic else 1, **i32)
        self.kappa = torch.empty(rows, **f32)
        self.union = torch.zeros(bkv, p.union_cap, **i32)  # entries always team ids
        self.count = torch.zeros(bkv, **i32)
        self.part_m = torch.empty(rows * p.num_parts, **f32)
        self.part_l = torch.empty(rows * p.num_parts, **f32)
        self.part_o = torch.empty(rows * p.num_parts * p.head_dim, **f32)
        self.rng = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._out: dict[torch.dtype, torch.Tensor] = {}

    @classmethod
    def for_inputs(
        cls, q: torch.Tensor, kv: KVCache, packed: PackedTeams, M: int, *, seed: int = 0, **plan_kw
    ) -> SantaPPWorkspace:
        """Returns a workspace planned for exactly this call shape."""
        plan = _plan_for(q, kv, packed, M, **plan_kw)
        return cls(plan, device=q.device, seed=seed)

    def reset_rng(self, step: int = 0, seed: int | None = None) -> None:
        """Sets the device step counter (and optionally the seed): replays a run exactly."""
        self.rng.fill_(step)
        self.ticket.zero_()
        self.attend_ticket.zero_()
        self.sum_l.zero_()
        self.sum_o.zero_()
        if seed is not None:
            self.seed = int(seed)

    def out(self, dtype: torch.dtype) -> torch.Tensor:
        if dtype not in self._out:
            p = self.plan
            self._out[dtype] = torch.empty(
                p.batch, p.num_q_heads, p.head_dim, dtype=dtype, device=self.device
            )
        return self._out[dtype]


def teams_selected(M: int, packed: PackedTeams) -> int:
    """The ``M`` a call plans for: at most the tables' team count ``T``. A (sequence, KV
    head) with ``M`` teams or fewer reads every one of them (``pi = 1``: exact there), so
    ``M`` above ``T`` selects what ``T`` does."""
    return min(M, packed.max_teams)


def reads_every_team(M: int, packed: PackedTeams) -> bool:
    """Whether a call with ``M`` reads every team of every (sequence, KV head): ``M`` at or
    above the tables' team count. Such a call is dense attention (exact everywhere), which a
    dense decode kernel computes faster than the selection's kernels; callers that want
    the output alone may run one instead."""
    return packed.max_teams <= M


def _plan_for(q, kv, packed: PackedTeams, M: int, **plan_kw) -> SantaPPPlan:
    M = teams_selected(M, packed)
    sms = _sm_count(q.device)
    return make_plan(
        q.shape[0],
        q.shape[1],
        kv.num_kv_heads,
        kv.head_dim,
        packed.max_teams,
        M,
        packed.max_team_len,
        packed.exact_max,
        sms,
        kv_element_size=kv.k.element_size(),
        **plan_kw,
    )


# ------------------------------------------------------------------ jit helpers
@triton.jit
def _key(z):
    """Order-preserving int32 key of fp32 ``z`` (no NaNs)."""
    bits = z.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def _unkey(key):
    bits = tl.where(key >= 0, key, key ^ 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _add2(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _add4(a0, a1, a2, a3, b0, b1, b2, b3):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3


@triton.jit
def _count_min_max(n0, lo0, hi0, n1, lo1, hi1):
    return n0 + n1, tl.minimum(lo0, lo1), tl.maximum(hi0, hi1)


@triton.jit
def _count_min(n0, lo0, n1, lo1):
    return n0 + n1, tl.minimum(lo0, lo1)


# Triton's interpreter runs a tl.reduce combine function element by element (Python calls:
# ~90% of the kth-search tests' time); under it the row reductions below are taken one at
# a time, with the same integer results. Compiled kernels keep the packed reductions.
_REDUCE_APART = tl.constexpr(_interpreted())


@triton.jit
def _row_sums2(a, b):
    """Row sums (axis 1) of two integer tensors, in one packed reduction."""
    if _REDUCE_APART:
        sa = tl.sum(a, axis=1)
        sb = tl.sum(b, axis=1)
    else:
        sa, sb = tl.reduce((a, b), 1, _add2)
    return sa, sb


@triton.jit
def _row_sums4(a, b, c, d):
    """Row sums (axis 1) of four integer tensors, in one packed reduction."""
    if _REDUCE_APART:
        sa = tl.sum(a, axis=1)
        sb = tl.sum(b, axis=1)
        sc = tl.sum(c, axis=1)
        sd = tl.sum(d, axis=1)
    else:
        sa, sb, sc, sd = tl.reduce((a, b, c, d), 1, _add4)
    return sa, sb, sc, sd


@triton.jit
def _row_count_min(n, v):
    """Per row (axis 1): the sum of ``n`` and the least ``v``, in one reduction."""
    if _REDUCE_APART:
        count = tl.sum(n, axis=1)
        least = tl.min(v, axis=1)
    else:
        count, least = tl.reduce((n, v), 1, _count_min)
    return count, least


@triton.jit
def _row_count_min_max(n, v, w):
    """Per row (axis 1): the sum of ``n``, the least ``v`` and the largest ``w``."""
    if _REDUCE_APART:
        count = tl.sum(n, axis=1)
        least = tl.min(v, axis=1)
        top = tl.max(w, axis=1)
    else:
        count, least, top = tl.reduce((n, v, w), 1, _count_min_max)
    return count, least, top


@triton.jit
def _threshold(lo, hi, lo_v, hi_v, J: tl.constexpr, WAYS: tl.constexpr):
    """Threshold ``J`` of ``WAYS`` (int32 keys ``[R]``) for the bracket ``[lo, hi)`` (int64).
    The last is the key-space midpoint (the bracket at least halves every step); the
    others split the bracket evenly in value space, or in key space where that gives no
    key strictly inside it (infinite or adjacent ends). Any key is a correct threshold:
    the choice only decides how fast the bracket shrinks."""
    if J == WAYS - 1:
        t = lo + (hi - lo) // 2
    else:
        t = _key(lo_v + (hi_v - lo_v) * ((J + 1) / WAYS)).to(tl.int64)
        t = tl.where((t > lo) & (t < hi), t, lo + (hi - lo) * (J + 1) // WAYS)
    return t.to(tl.int32)


@triton.jit
def _pair(key, ta, tb):
    """Per key, ``[key >= ta] + 65536 [key >= tb]``: two counts packed in one int32
    (rows hold at most FINISH_CAP < 65536 keys)."""
    return tl.where(key >= ta[:, None], 1, 0) + tl.where(key >= tb[:, None], 65536, 0)


@triton.jit
def _narrow(K, lo, hi, t, c):
    """Folds threshold ``t`` with ``c`` keys at or above it into the bracket."""
    t = t.to(tl.int64)
    lo = tl.where((c >= K) & (t > lo), t, lo)
    hi = tl.where((c < K) & (t < hi), t, hi)
    return lo, hi


@triton.jit
def _narrow4(K, lo, hi, t0, t1, t2, t3, s01, s23):
    """Folds four thresholds (counts packed in ``s01``, ``s23``) into the bracket; also
    returns whether one has exactly ``K`` keys at or above it."""
    c0, c1, c2, c3 = s01 & 0xFFFF, s01 >> 16, s23 & 0xFFFF, s23 >> 16
    lo, hi = _narrow(K, lo, hi, t0, c0)
    lo, hi = _narrow(K, lo, hi, t1, c1)
    lo, hi = _narrow(K, lo, hi, t2, c2)
    lo, hi = _narrow(K, lo, hi, t3, c3)
    return lo, hi, (c0 == K) | (c1 == K) | (c2 == K) | (c3 == K)


@triton.jit
def _kth_search(key, K, lo, hi, WAYS: tl.constexpr):
    """Per row of ``key [R, C]`` (int32; KEY_PAD: no entry), the ``K``-th largest key, or
    KEY_NEG_INF where the row has fewer than ``K`` entries, inside a bracket: ``lo [R]``
    has at least ``K`` keys at or above it (or is KEY_NEG_INF), ``hi [R]`` fewer than ``K``.

    ``WAYS``-ary search (4 or 8): each step counts the keys at or above ``WAYS`` thresholds
    inside ``[lo, hi)`` with one packed reduction and keeps the tightest bracket. A row is
    done when a threshold has exactly ``K`` keys at or above it (it becomes ``lo``) or at
    ``hi = lo + 1``; a closing reduction then finds the least key at or above ``lo``.
    Value-space thresholds finish Gumbel-perturbed scores in ~3-5 steps (bisection:
    ~10-12); the key-space midpoint bounds any input (ties, infinities) by 33 steps.
    (Finding each threshold's least key inside the steps instead, with no closing
    reduction, measured 3.4 us slower at 32k B=1: results/h200/tune-2026-12-01-s11.)"""
    lo = lo.to(tl.int64)
    hi = hi.to(tl.int64)
    active = hi - lo > 1
    steps = 0
    while (tl.max(active.to(tl.int32), axis=0) > 0) & (steps < 40):
        lo_v = _unkey(lo.to(tl.int32))
        hi_v = _unkey(hi.to(tl.int32))  # max key + 1 <= 0x7F800001: fits
        t0 = _threshold(lo, hi, lo_v, hi_v, 0, WAYS)
        t1 = _threshold(lo, hi, lo_v, hi_v, 1, WAYS)
        t2 = _threshold(lo, hi, lo_v, hi_v, 2, WAYS)
        t3 = _threshold(lo, hi, lo_v, hi_v, 3, WAYS)
        if WAYS == 8:
            t4 = _threshold(lo, hi, lo_v, hi_v, 4, WAYS)
            t5 = _threshold(lo, hi, lo_v, hi_v, 5, WAYS)
            t6 = _threshold(lo, hi, lo_v, hi_v, 6, WAYS)
            t7 = _threshold(lo, hi, lo_v, hi_v, 7, WAYS)
            s01, s23, s45, s67 = _row_sums4(_pair(key, t0, t1), _pair(key, t2, t3),
                                            _pair(key, t4, t5), _pair(key, t6, t7))
            new_lo, new_hi, hit = _narrow4(K, lo, hi, t0, t1, t2, t3, s01, s23)
            new_lo, new_hi, hit2 = _narrow4(K, new_lo, new_hi, t4, t5, t6, t7, s45, s67)
            hit = hit | hit2
        else:
            s01, s23 = _row_sums2(_pair(key, t0, t1), _pair(key, t2, t3))
            new_lo, new_hi, hit = _narrow4(K, lo, hi, t0, t1, t2, t3, s01, s23)
        # a threshold with exactly K keys above it makes the largest such the new lo
        lo = new_lo
        hi = new_hi
        active = active & ~hit & (hi - lo > 1)
        steps += 1
    lo32 = lo.to(tl.int32)
    above = key >= lo32[:, None]
    count, kth = _row_count_min(above.to(tl.int32), tl.where(above, key, 2147483647))
    return tl.where(count >= K, kth, -2139095041)


@triton.jit
def _kth_largest(key, K, lo, WAYS: tl.constexpr):
    """:func:`_kth_search` without a bracket: ``lo [R]`` is a key with at least ``K``
    entries at or above it (or KEY_NEG_INF); one reduction first finds the row's largest
    key and, where at least ``K`` are finite, its smallest finite key (a tighter lo)."""
    finite = key > -2139095041
    n_fin, least, top = _row_count_min_max(finite.to(tl.int32),
                                           tl.where(finite, key, 2147483647), key)
    lo = tl.where((n_fin >= K) & (least > lo), least, lo)
    return _kth_search(key, K, lo, top.to(tl.int64) + 1, WAYS)  # nothing at or above hi


@triton.jit
def _top_kth(a1, a2, a3, b1, b2, b3):
    """Merges two descending triples (the three largest of two sets)."""
    return (tl.maximum(a1, b1), tl.maximum(tl.minimum(a1, b1), tl.maximum(a2, b2)),
            tl.maximum(tl.maximum(a3, b3), tl.maximum(tl.minimum(a1, b2), tl.minimum(a2, b1))))


@triton.jit
def _top3(z):
    """Per row of ``z [R, C]`` (fp32), its three largest entries, descending (a multiset)."""
    ninf = tl.full(z.shape, float("-inf"), tl.float32)
    return tl.reduce((z, ninf, ninf), 1, _top_kth)


@triton.jit
def _tops_plane(groups, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, num_splits):
    """Entries a plane of ``split_kth`` holds: B * Hq * splits (``groups`` = B * Hkv)."""
    return (groups // NUM_KV_HEADS) * NUM_KV_HEADS * GROUP * num_splits


@triton.jit
def _scores(q, k, DOT_PRECISION: tl.constexpr):
    """``q [R, D] @ k[N, D]^T`` in fp32 (tensor cores for 16-bit K on the GPU)."""
    if DOT_PRECISION == "ieee":
        return tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    return tl.dot(q.to(k.dtype), tl.trans(k))


@triton.jit
def _weighted_values(p, v, DOT_PRECISION: tl.constexpr):
    """``p [R, N] @ v [N, D]`` in fp32 (p rounded to V's 16-bit dtype on tensor cores)."""
    if DOT_PRECISION == "ieee":
        return tl.dot(p, v.to(tl.float32), input_precision="ieee")
    return tl.dot(p.to(v.dtype), v)


@triton.jit
def _inclusion_weight(z, phi, kappa):
    """``1/pi`` where ``z > kappa`` (the team was selected), else 0; ``pi = 1 - e^{-x}``,
    ``x = e^{phi - kappa}``, by its series for small ``x`` (fp32 has no expm1)."""
    x = tl.exp(phi - kappa)  # kappa = -inf: x = inf, pi = 1
    series = x * (1.0 - x * (0.5 - x * (1.0 / 6.0 - x * (1.0 / 24.0 - x * (1.0 / 120.0)))))
    pi = tl.where(x < 0.1, series, 1.0 - tl.exp(-x))
    return tl.where(z > kappa, 1.0 / tl.where(z > kappa, pi, 1.0), 0.0)


@triton.jit
def _selection_keys(
    z_ptr, cand_z_ptr, cand_id_ptr, split_kth_ptr, head_rows, mask_h, num_splits, n_cand,
    t_cap, C_PAD: tl.constexpr, S_PAD: tl.constexpr, LOCAL: tl.constexpr,
):
    """Per head row: the int32 keys of its candidates ``[R, C_PAD]`` (KEY_PAD: none), their
    team ids, which are real, and a key ``lo [R]`` with at least M+1 keys at or above it."""
    offs_c = tl.arange(0, C_PAD)
    inside = mask_h[:, None] & (offs_c < n_cand)[None, :]
    if LOCAL:
        cand = head_rows[:, None] * n_cand + offs_c[None, :]
        z = tl.load(cand_z_ptr + cand, mask=inside, other=float("-inf"), cache_modifier=".cg")
        ids = tl.load(cand_id_ptr + cand, mask=inside, other=-1, cache_modifier=".cg")
        real = inside & (ids >= 0)
        offs_s = tl.arange(0, S_PAD)
        kth_s = tl.load(split_kth_ptr + head_rows[:, None] * num_splits + offs_s[None, :],
                        mask=mask_h[:, None] & (offs_s < num_splits)[None, :],
                        other=-2139095041, cache_modifier=".cg")
        lo = tl.max(kth_s, axis=1)  # that split alone holds M+1 keys at or above it
    else:
        ids = offs_c[None, :] + (head_rows * 0).to(tl.int32)[:, None]
        z = tl.load(z_ptr + head_rows[:, None] * t_cap + ids, mask=inside, other=float("-inf"),
                    cache_modifier=".cg")
        real = inside
        lo = (head_rows * 0 - 2139095041).to(tl.int32)
    key = tl.where(real, _key(z), -2147483648)
    return key, ids, real, lo


@triton.jit
def _split_bracket(key, split_kth_ptr, head_rows, mask_h, K, num_splits, S_PAD: tl.constexpr,
                   BRACKET: tl.constexpr):
    """A search bracket per head row from the select programs' ``BRACKET``-th largest key
    of each split (direct selection; the plan makes ``BRACKET * splits >= K >
    (BRACKET - 1) * splits``): at least ``K`` keys lie at or above the least of them
    (``BRACKET`` in each split), fewer than ``K`` above the largest (only the ``BRACKET -
    1`` above it in each split). Where the splits whose key is finite cannot account
    for ``K`` keys (short sequences: splits past their teams hold ``-inf``), the row
    takes its least finite key instead (one reduction, only when some row needs it)."""
    offs_s = tl.arange(0, S_PAD)
    sk = tl.load(split_kth_ptr + head_rows[:, None] * num_splits + offs_s[None, :],
                 mask=mask_h[:, None] & (offs_s < num_splits)[None, :], other=-2147483648,
                 cache_modifier=".cg")
    finite = sk > -2139095041
    n_ok, least, top = _row_count_min_max(finite.to(tl.int32),
                                          tl.where(finite, sk, 2147483647), sk)
    hi = top.to(tl.int64) + 1
    enough = n_ok * BRACKET >= K
    lo = tl.where(enough, least, -2139095041)
    if tl.max((mask_h & ~enough).to(tl.int32), axis=0) > 0:  # short rows: the old bracket
        fin = key > -2139095041
        n_fin, least_key = _row_count_min(fin.to(tl.int32), tl.where(fin, key, 2147483647))
        lo = tl.where(enough | (n_fin < K), lo, least_key)
    return lo, hi


@triton.jit
def _rows_kappa(
    z_ptr, cand_z_ptr, cand_id_ptr, split_kth_ptr, head_rows, mask_h, M, num_splits, n_cand,
    t_cap, C_PAD: tl.constexpr, S_PAD: tl.constexpr, LOCAL: tl.constexpr, WAYS: tl.constexpr,
    SEARCH: tl.constexpr = True, BRACKET: tl.constexpr = 0,
):
    """Per head row: its candidates (keys, team ids, real), the (M+1)-th largest key and
    kappa (its value; -inf where the row has at most M candidates). Without ``SEARCH``
    (profiling only: wrong kappas) the search is skipped and kth is the lower bound.
    ``BRACKET`` (direct selection only): the select programs left a bracket per split."""
    key, ids, real, lo = _selection_keys(z_ptr, cand_z_ptr, cand_id_ptr, split_kth_ptr,
                                         head_rows, mask_h, num_splits, n_cand, t_cap,
                                         C_PAD, S_PAD, LOCAL)
    if BRACKET > 0:
        lo, hi = _split_bracket(key, split_kth_ptr, head_rows, mask_h, M + 1, num_splits,
                                S_PAD, BRACKET)
        kth = _kth_search(key, M + 1, lo, hi, WAYS) if SEARCH else lo
    else:
        kth = _kth_largest(key, M + 1, lo, WAYS) if SEARCH else lo
    kappa = tl.where(kth > -2139095041, _unkey(kth), float("-inf"))
    return key, ids, real, kth, kappa


@triton.jit
def _write_union(
    z_ptr, union_ptr, count_ptr, key, ids, real, kth, b, kvh, bkv, t_cap, union_cap,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, G_ROWS: tl.constexpr, C_PAD: tl.constexpr,
    LOCAL: tl.constexpr,
):
    """The compact union of the group's selected teams (rows = the G heads)."""
    hq = NUM_KV_HEADS * GROUP
    offs_h = tl.arange(0, G_ROWS)
    selected = real & (key > kth[:, None])
    if LOCAL:
        # candidates differ per head: a team selected by several heads belongs to the
        # first of them (section 6: GQA union), found by reading the others' z
        kappa = tl.where(kth > -2139095041, _unkey(kth), float("-inf"))
        taken = selected & (offs_h[:, None] < 0)
        for other in tl.static_range(GROUP):
            kappa_o = tl.sum(tl.where(offs_h == other, kappa, 0.0), axis=0)
            ask = selected & (offs_h[:, None] > other)
            z_o = tl.load(z_ptr + (b * hq + kvh * GROUP + other).to(tl.int64) * t_cap + ids,
                          mask=ask, other=float("-inf"), cache_modifier=".cg")
            taken = taken | (ask & (z_o > kappa_o))
        owned = (selected & ~taken).to(tl.int32)
        per_head = tl.sum(owned, axis=1)
        first = tl.cumsum(per_head, axis=0) - per_head
        slot = first[:, None] + tl.cumsum(owned, axis=1) - 1
        tl.store(union_ptr + bkv.to(tl.int64) * union_cap + slot, ids, mask=owned > 0)
        tl.store(count_ptr + bkv, tl.sum(per_head, axis=0))
    else:
        # column c is team c for every head: the union is the teams any head selected,
        # in team order (one scan over the teams)
        chosen = tl.max(selected.to(tl.int32), axis=0)  # [C_PAD]
        slot = tl.cumsum(chosen, axis=0) - 1
        tl.store(union_ptr + bkv.to(tl.int64) * union_cap + slot, tl.arange(0, C_PAD),
                 mask=chosen > 0)
        tl.store(count_ptr + bkv, tl.sum(chosen, axis=0))


@triton.jit
def _finish_selection(
    z_ptr, cand_z_ptr, cand_id_ptr, split_kth_ptr, kappa_ptr, union_ptr, count_ptr,
    b, kvh, bkv, M, num_splits, n_cand, t_cap, union_cap,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, G_ROWS: tl.constexpr,
    C_PAD: tl.constexpr, S_PAD: tl.constexpr, LOCAL: tl.constexpr, WAYS: tl.constexpr,
    BRACKET: tl.constexpr,
):
    """kappa per head of the group and the compact union of the selected teams."""
    hq = NUM_KV_HEADS * GROUP
    offs_h = tl.arange(0, G_ROWS)
    mask_h = offs_h < GROUP
    head_rows = (b * hq + kvh * GROUP + offs_h).to(tl.int64)
    key, ids, real, kth, kappa = _rows_kappa(z_ptr, cand_z_ptr, cand_id_ptr, split_kth_ptr,
                                             head_rows, mask_h, M, num_splits, n_cand, t_cap,
                                             C_PAD, S_PAD, LOCAL, WAYS, True, BRACKET)
    _write_union(z_ptr, union_ptr, count_ptr, key, ids, real, kth, b, kvh, bkv, t_cap,
                 union_cap, NUM_KV_HEADS, GROUP, G_ROWS, C_PAD, LOCAL)
    tl.store(kappa_ptr + head_rows, kappa, mask=mask_h)


# ---------------------------------------------------------------- kernel 1: select
@triton.jit
def _select_kernel(
    q_ptr, reps_ptr, log_n_ptr, reps_scale_ptr, gumbel_ptr, rng_ptr, seed,
    phi_ptr, z_ptr, cand_z_ptr, cand_id_ptr, split_kth_ptr, union_ptr,
    scale, M, num_splits, n_cand, t_cap, union_cap, stride_qb, stride_qh,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr, G_PAD: tl.constexpr, G_ROWS: tl.constexpr, TB: tl.constexpr,
    M1_PAD: tl.constexpr, LOCAL: tl.constexpr, HAS_GUMBELS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, PDL: tl.constexpr = False,
    ENTRY_PDL: tl.constexpr = False, REPS_AS: tl.constexpr = "", BRACKET: tl.constexpr = 0,
    HEAD_LISTS: tl.constexpr = False, TOPS: tl.constexpr = False,
):
    _pdl_enter(PDL, False)  # the next kernel may launch as this grid's last wave starts
    split = tl.program_id(0)
    bkv = tl.program_id(1)
    b = bkv // NUM_KV_HEADS
    kvh = bkv % NUM_KV_HEADS
    hq = NUM_KV_HEADS * GROUP
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D_PAD)
    mask_d = offs_d < HEAD_DIM
    offs_t = split * TB + tl.arange(0, TB)
    mask_t = offs_t < t_cap
    # the representatives and team sizes are fixed after the prefill: with ENTRY_PDL (the
    # call launched as a programmatic dependent of the step's previous kernel) they load
    # while that kernel finishes, and only the query waits for it
    team_rows = bkv * t_cap + offs_t
    reps = tl.load(reps_ptr + team_rows.to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :],
                   mask=mask_t[:, None] & mask_d[None, :], other=0.0)
    log_n = tl.load(log_n_ptr + team_rows, mask=mask_t, other=float("-inf"))
    if REPS_AS != "":  # int8 codes (exact in 16-bit floats) in the cache dtype; * scale below
        rep_scale = tl.load(reps_scale_ptr + team_rows, mask=mask_t, other=0.0)
        reps = reps.to(tl.float32)  # (int8 -> bf16 directly is wrong in the interpreter)
        if REPS_AS == "bf16":
            reps = reps.to(tl.bfloat16)
        elif REPS_AS == "fp16":
            reps = reps.to(tl.float16)
    _pdl_wait(ENTRY_PDL)
    # section 6: phi_g = tau q.r_g + log n_g for the G heads of the group, one dot
    q = tl.load(q_ptr + b * stride_qb + (kvh * GROUP + offs_g)[:, None] * stride_qh
                + offs_d[None, :], mask=(offs_g < GROUP)[:, None] & mask_d[None, :], other=0.0)
    s = _scores(q, reps, DOT_PRECISION)  # [G_PAD, TB]; the padding rows of q are zero
    if G_PAD > G_ROWS:  # keep G_ROWS rows: adding the zero rows is exact
        s = tl.sum(tl.reshape(s, [G_PAD // G_ROWS, G_ROWS, TB]), axis=0)
    if REPS_AS != "":
        s = s * rep_scale[None, :]
    offs_h = tl.arange(0, G_ROWS)
    mask_h = offs_h < GROUP
    head_rows = b * hq + kvh * GROUP + offs_h
    phi = s * scale + log_n[None, :]
    valid = mask_h[:, None] & mask_t[None, :]
    cells = head_rows[:, None] * t_cap + offs_t[None, :]  # < 2**31 (checked by the plan)
    if HAS_GUMBELS:
        gumbel = tl.load(gumbel_ptr + cells, mask=valid, other=0.0)
    else:
        # section 8: Philox keyed by (seed, step) (the step lives on the device), counter
        # (b, head block of 4, team): rand4x serves four heads per counter
        key = (tl.load(rng_ptr) << 32) + seed
        u = tl.zeros([G_ROWS, TB], dtype=tl.float32)
        for block in tl.static_range((G_ROWS + 3) // 4):
            counter = (b * hq + kvh * GROUP + 4 * block) * t_cap + offs_t
            u0, u1, u2, u3 = tl.rand4x(key, counter)
            row = offs_h[:, None] - 4 * block
            u = tl.where(row == 0, u0[None, :], u)
            u = tl.where(row == 1, u1[None, :], u)
            u = tl.where(row == 2, u2[None, :], u)
            u = tl.where(row == 3, u3[None, :], u)
        gumbel = -tl.log(-tl.log(tl.maximum(u, 1e-12)))
    z = tl.where(valid, phi + gumbel, float("-inf"))
    tl.store(phi_ptr + cells, phi, mask=valid)
    tl.store(z_ptr + cells, z, mask=valid)
    if LOCAL:
        # this block's top M+1 per head: every global top-(M+1) team is among them
        keys = tl.where(valid, _key(z), -2147483648)
        kth = _kth_largest(keys, M + 1, tl.full([G_ROWS], -2139095041, tl.int32), 8)
        keep = valid & (keys >= kth[:, None])
        rank = tl.cumsum(keep.to(tl.int32), axis=1) - 1
        keep = keep & (rank < M + 1)
        base = head_rows[:, None] * n_cand + split * (M + 1)
        tl.store(cand_z_ptr + base + rank, z, mask=keep)
        tl.store(cand_id_ptr + base + rank, offs_t[None, :] + 0 * offs_h[:, None], mask=keep)
        kept = tl.sum(keep.to(tl.int32), axis=1)
        offs_m = tl.arange(0, M1_PAD)
        empty = mask_h[:, None] & (offs_m[None, :] >= kept[:, None]) & (offs_m < M + 1)[None, :]
        tl.store(cand_id_ptr + base + offs_m[None, :], -1 + 0 * offs_m[None, :], mask=empty)
        tl.store(split_kth_ptr + head_rows * num_splits + split, kth, mask=mask_h)
    elif BRACKET > 0:
        # the finisher's search bracket: this block's BRACKET-th largest z in plane 0;
        # with TOPS (the compact finisher) the larger ones in the planes after it
        v1, v2, v3 = _top3(z)
        plane = _tops_plane(tl.num_programs(1), NUM_KV_HEADS, GROUP, num_splits)
        at = split_kth_ptr + head_rows * num_splits + split
        if BRACKET == 1:
            tl.store(at, _key(v1), mask=mask_h)
        elif BRACKET == 2:
            tl.store(at, _key(v2), mask=mask_h)
            if TOPS:
                tl.store(at + plane, _key(v1), mask=mask_h)
        else:
            tl.store(at, _key(v3), mask=mask_h)
            if TOPS:
                tl.store(at + plane, _key(v2), mask=mask_h)
                tl.store(at + 2 * plane, _key(v1), mask=mask_h)
    if HEAD_LISTS:  # noqa: SIM102 (constexpr)  the finishers write only their chosen slots
        if split == 0:
            offs_l = tl.arange(0, M1_PAD)[None, :]
            tl.store(union_ptr + bkv.to(tl.int64) * union_cap + offs_h[:, None] * M + offs_l,
                     -1 + 0 * offs_l, mask=mask_h[:, None] & (offs_l < M))


@triton.jit
def _finish_kernel(
    z_ptr, cand_z_ptr, cand_id_ptr, split_kth_ptr, kappa_ptr, union_ptr, count_ptr,
    M, num_splits, n_cand, t_cap, union_cap,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, G_ROWS: tl.constexpr,
    C_PAD: tl.constexpr, S_PAD: tl.constexpr, LOCAL: tl.constexpr, WAYS: tl.constexpr,
    PDL: tl.constexpr = False, BRACKET: tl.constexpr = 0,
):
    _pdl_enter(PDL, True)  # launched early: wait for the previous kernel
    bkv = tl.program_id(0)
    _finish_selection(z_ptr, cand_z_ptr, cand_id_ptr, split_kth_ptr, kappa_ptr, union_ptr,
                      count_ptr, bkv // NUM_KV_HEADS, bkv % NUM_KV_HEADS, bkv, M, num_splits,
                      n_cand, t_cap, union_cap, NUM_KV_HEADS, GROUP, G_ROWS, C_PAD, S_PAD,
                      LOCAL, WAYS, BRACKET)


@triton.jit
def _at_least(c, keys):
    """Per entry of ``c [N]``, how many of ``keys [P]`` are at or above it (one [N, P]
    comparison)."""
    return tl.sum((keys[None, :] >= c[:, None]).to(tl.int32), axis=1)


@triton.jit
def _compact_finish(
    z_ptr, split_kth_ptr, scratch_key_ptr, scratch_id_ptr, kappa_ptr, list_ptr, head_rows,
    mask_h, M, num_splits, t_cap,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
    C_PAD: tl.constexpr, S_PAD: tl.constexpr, TOPS_PAD: tl.constexpr, CAP: tl.constexpr,
    WAYS: tl.constexpr, BRACKET: tl.constexpr,
):
    """kappa and the head list of one head row (``head_rows [1]``) without the search where
    the keys allow. The splits' top ``BRACKET`` keys (plane ``i`` of ``split_kth``: each
    split's ``(BRACKET - i)``-th largest, :func:`_tops_plane` entries a plane) hold at
    least M+1 keys at or above their own (M+1)-th largest ``lo``, so kappa >= lo; the keys
    at or above ``lo`` (~M+5 of 2048 on Gumbel-perturbed rows) are compacted in team
    order through ``scratch`` and, where at most CAP, kappa is the largest of them with at
    least M+1 at or above it (one [CAP, CAP] comparison; a multiset rank, so ties and -inf
    go as in the search). Rows with more keys above ``lo`` take the bracketed search over all keys.
    Writes the row's kappa and its selected teams, in team order, to ``list_ptr`` (M
    slots)."""
    K = M + 1
    key, ids, real, _lo = _selection_keys(z_ptr, z_ptr, z_ptr, split_kth_ptr, head_rows, mask_h,
                                          num_splits, t_cap, t_cap, C_PAD, S_PAD, False)
    row = tl.max(head_rows, axis=0)
    offs_p = tl.arange(0, TOPS_PAD)
    plane = _tops_plane(tl.num_programs(0), NUM_KV_HEADS, GROUP, num_splits)
    tops = tl.load(split_kth_ptr + (offs_p // num_splits) * plane + row * num_splits
                   + offs_p % num_splits, mask=offs_p < BRACKET * num_splits,
                   other=-2147483648, cache_modifier=".cg")
    finite = tops > -2139095041
    lo = tl.max(tl.where(finite & (_at_least(tops, tops) >= K), tops, -2139095041), axis=0)
    key1 = tl.max(key, axis=0)  # the one row as [C_PAD]
    ids1 = tl.max(ids, axis=0)
    cand = (tl.max(real.to(tl.int32), axis=0) > 0) & (key1 >= lo)
    pos = tl.cumsum(cand.to(tl.int32), axis=0) - 1
    n = tl.sum(cand.to(tl.int32), axis=0)
    keep = cand & (pos < CAP)
    tl.store(scratch_key_ptr + row * CAP + pos, key1, mask=keep)
    tl.store(scratch_id_ptr + row * CAP + pos, ids1, mask=keep)
    if n <= CAP:
        tl.debug_barrier()  # the compacted keys, stored by every thread, visible to all
        offs_k = tl.arange(0, CAP)
        inside = offs_k < n
        ck = tl.load(scratch_key_ptr + row * CAP + offs_k, mask=inside, other=-2147483648)
        cid = tl.load(scratch_id_ptr + row * CAP + offs_k, mask=inside, other=0)
        kth = tl.max(tl.where(inside & (_at_least(ck, ck) >= K), ck, -2139095041), axis=0)
        ranked = inside & (ck > kth)  # (names differ by branch: their shapes do)
        tl.store(list_ptr + tl.cumsum(ranked.to(tl.int32), axis=0) - 1, cid, mask=ranked)
    else:
        lo_b, hi_b = _split_bracket(key, split_kth_ptr, head_rows, mask_h, K, num_splits,
                                    S_PAD, BRACKET)
        kth = tl.max(_kth_search(key, K, tl.maximum(lo_b, lo), hi_b, WAYS), axis=0)
        searched = cand & (key1 > kth)  # kth >= lo: every chosen key is a candidate
        tl.store(list_ptr + tl.cumsum(searched.to(tl.int32), axis=0) - 1, ids1, mask=searched)
    kappa = tl.where(kth > -2139095041, _unkey(kth), float("-inf"))
    tl.store(kappa_ptr + row, kappa)


@triton.jit
def _finish_heads_kernel(
    z_ptr, cand_z_ptr, cand_id_ptr, split_kth_ptr, kappa_ptr, union_ptr, count_ptr, ticket_ptr,
    scratch_key_ptr, scratch_id_ptr,
    M, num_splits, n_cand, t_cap, union_cap, finish_parts,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, G_ROWS: tl.constexpr,
    H_ROWS: tl.constexpr, C_PAD: tl.constexpr, S_PAD: tl.constexpr, LOCAL: tl.constexpr,
    WAYS: tl.constexpr, PDL: tl.constexpr = False, WRITE_UNION: tl.constexpr = True,
    SEARCH: tl.constexpr = True, BRACKET: tl.constexpr = 0, HEAD_LISTS: tl.constexpr = False,
    COMPACT: tl.constexpr = 0, TOPS_PAD: tl.constexpr = 2,
):
    """Grid ``(B * Hkv, finish_parts)``: each program finds kappa for ``H_ROWS`` heads of
    the group (the kth search spread over the group's heads instead of one program per
    group); the last of the group's programs to finish (an acq_rel ticket) writes the
    union from the group's kappas (not with WRITE_UNION False: profiling only, the call's
    output is then wrong; nor is it without SEARCH, which skips the kth search and the
    union: kappa = -inf would select more teams than the union holds). With HEAD_LISTS
    there is no union step: each program writes its heads' selected teams, in team order,
    to their own ``M`` slots of the list (-1 past them) and the attend programs skip a
    team in every slot but its first selecting head's."""
    _pdl_enter(PDL, True)  # launched early: wait for the previous kernel
    bkv = tl.program_id(0)
    part = tl.program_id(1)
    b = bkv // NUM_KV_HEADS
    kvh = bkv % NUM_KV_HEADS
    hq = NUM_KV_HEADS * GROUP
    offs_h = part * H_ROWS + tl.arange(0, H_ROWS)
    mask_h = offs_h < GROUP
    head_rows = (b * hq + kvh * GROUP + offs_h).to(tl.int64)
    if COMPACT > 0:  # one head a program (H_ROWS = 1), head lists, a bracket
        _compact_finish(z_ptr, split_kth_ptr, scratch_key_ptr, scratch_id_ptr, kappa_ptr,
                        union_ptr + bkv.to(tl.int64) * union_cap + part * M, head_rows, mask_h,
                        M, num_splits, t_cap, NUM_KV_HEADS, GROUP, C_PAD, S_PAD, TOPS_PAD,
                        COMPACT, WAYS, BRACKET)
        return
    keys, ids, real, kth, kappa = _rows_kappa(
        z_ptr, cand_z_ptr, cand_id_ptr, split_kth_ptr, head_rows, mask_h, M, num_splits,
        n_cand, t_cap, C_PAD, S_PAD, LOCAL, WAYS, SEARCH, BRACKET)  # fmt: skip
    tl.store(kappa_ptr + head_rows, kappa, mask=mask_h)
    if not WRITE_UNION or not SEARCH:  # without the search every team would be selected
        return
    if HEAD_LISTS:  # at most M keys lie above the (M+1)-th largest
        # (the select kernel set every slot to -1: slots past the chosen stay so)
        chosen = real & (keys > kth[:, None]) & mask_h[:, None]
        slot = tl.cumsum(chosen.to(tl.int32), axis=1) - 1
        lists = union_ptr + bkv.to(tl.int64) * union_cap + offs_h[:, None] * M
        tl.store(lists + slot, ids, mask=chosen)
        return
    # every thread's kappa store is ordered before the ticket (barrier + acq_rel atomic)
    tl.debug_barrier()
    ticket = tl.atomic_add(ticket_ptr + bkv, 1, sem="acq_rel")
    if ticket == finish_parts - 1:
        offs_g = tl.arange(0, G_ROWS)
        mask_g = offs_g < GROUP
        rows = (b * hq + kvh * GROUP + offs_g).to(tl.int64)
        key_g, ids_g, real_g, _lo_g = _selection_keys(z_ptr, cand_z_ptr, cand_id_ptr,
                                                  split_kth_ptr, rows, mask_g, num_splits,
                                                  n_cand, t_cap, C_PAD, S_PAD, LOCAL)
        kappa_g = tl.load(kappa_ptr + rows, mask=mask_g, other=float("-inf"),
                          cache_modifier=".cg")
        _write_union(z_ptr, union_ptr, count_ptr, key_g, ids_g, real_g, _key(kappa_g), b,
                     kvh, bkv, t_cap, union_cap, NUM_KV_HEADS, GROUP, G_ROWS, C_PAD, LOCAL)
        tl.store(ticket_ptr + bkv, 0)  # ready for the next call (graph replay)


# ---------------------------------------------------------------- kernel 2: attend
@triton.jit
def _online_update(q, k, v, w, s_ok, m_i, l_i, acc, scale, DOT_PRECISION: tl.constexpr):
    """Folds rows with weights ``w [G_PAD, N]`` (0: not read) into the running (m, l, acc)."""
    s = _scores(q, k, DOT_PRECISION) * scale
    s = tl.where(s_ok & (w > 0), s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)
    alpha = tl.exp(m_i - m_ref)
    p = w * tl.exp(s - m_ref[:, None])  # HT-weighted: p = w e^{s - m}
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + _weighted_values(p, v, DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _team_tile(member, bkv, head_rows, mask_g, union_ptr, count_ptr, team_start_ptr,
               team_len_ptr, sink, team_size, team_end, t_cap, union_cap,
               HEAD_LISTS: tl.constexpr, REGULAR: tl.constexpr):
    """The teams at list positions ``member`` (one per row of the tile): their ids, which
    are real, first rows, lengths, and z/phi cells ``[G_PAD, N]`` with their mask."""
    # head lists: head member // list_len's list, -1 marks no team
    team = tl.load(union_ptr + bkv.to(tl.int64) * union_cap + member,
                   mask=member < union_cap, other=-1 if HEAD_LISTS else 0)
    if HEAD_LISTS:
        mask_u = team >= 0
        team = tl.maximum(team, 0)
    else:
        mask_u = member < tl.load(count_ptr + bkv)
    if REGULAR:
        start = sink + team * team_size
        n_g = tl.minimum(team_size, team_end - start)
    else:
        table = bkv.to(tl.int64) * t_cap + team
        start = tl.load(team_start_ptr + table, mask=mask_u, other=0)
        n_g = tl.load(team_len_ptr + table, mask=mask_u, other=0)
    cell = head_rows[:, None] * t_cap + team[None, :]
    hw = mask_g[:, None] & mask_u[None, :]
    return team, mask_u, start, n_g, cell, hw


@triton.jit
def _team_kv(pos, ok, bkv, b, offs_d, mask_d, k_head, v_head, pk_ptr, pv_ptr, page_table_ptr,
             packed_rows, stride_kx, stride_ky, stride_pt, page_size,
             HEAD_DIM: tl.constexpr, PACKED: tl.constexpr, PAGED: tl.constexpr):
    """K and V rows ``[N, D_PAD]`` at cache positions ``pos`` (team-major packed storage,
    or the cache itself); rows where ``ok`` is false read nothing (zeros)."""
    if PACKED:
        rows = (bkv.to(tl.int64) * packed_rows + pos) * HEAD_DIM
        k = tl.load(pk_ptr + rows[:, None] + offs_d[None, :],
                    mask=ok[:, None] & mask_d[None, :], other=0.0)
        v = tl.load(pv_ptr + rows[:, None] + offs_d[None, :],
                    mask=ok[:, None] & mask_d[None, :], other=0.0)
    else:
        rows = _row_offsets(page_table_ptr, b, pos, stride_kx, stride_ky, stride_pt,
                           page_size, PAGED)
        k = tl.load(k_head + rows[:, None] + offs_d[None, :],
                    mask=ok[:, None] & mask_d[None, :], other=0.0)
        v = tl.load(v_head + rows[:, None] + offs_d[None, :],
                    mask=ok[:, None] & mask_d[None, :], other=0.0)
    return k, v


@triton.jit
def _team_chunk(chunk, offs_n, offs_d, offs_g, mask_d, mask_g, member, team, mask_u, start,
                n_g, cell, hw, bkv, b, q, k_head, v_head, pk_ptr, pv_ptr, z_ptr, phi_ptr,
                kappa_ptr, head_rows, page_table_ptr, packed_rows, list_len, stride_kx,
                stride_ky, stride_pt, page_size, m_i, l_i, acc, scale,
                HEAD_DIM: tl.constexpr, G_PAD: tl.constexpr, SLOT: tl.constexpr,
                PACKED: tl.constexpr, PAGED: tl.constexpr, HEAD_LISTS: tl.constexpr,
                DOT_PRECISION: tl.constexpr):
    """Folds rows ``chunk * SLOT + [0, SLOT)`` of the tile's teams, HT-weighted, into the
    running (m, l, acc)."""
    r = chunk * SLOT + offs_n % SLOT
    ok = mask_u & (r < n_g)
    k, v = _team_kv(tl.where(ok, start + r, 0), ok, bkv, b, offs_d, mask_d, k_head, v_head,
                    pk_ptr, pv_ptr, page_table_ptr, packed_rows, stride_kx, stride_ky,
                    stride_pt, page_size, HEAD_DIM, PACKED, PAGED)
    # loaded after K/V are requested so both round trips overlap
    w = _team_weights(cell, hw, member, offs_g, mask_g, head_rows, z_ptr, phi_ptr, kappa_ptr,
                      list_len, G_PAD, HEAD_LISTS)
    return _online_update(q, k, v, w, ok[None, :], m_i, l_i, acc, scale, DOT_PRECISION)


@triton.jit
def _team_weights(cell, hw, member, offs_g, mask_g, head_rows, z_ptr, phi_ptr, kappa_ptr,
                  list_len, G_PAD: tl.constexpr, HEAD_LISTS: tl.constexpr):
    """``w [G_PAD, N]``: w_{h,g} = 1/pi_{h,g} for the heads that selected team g (the
    entry at list position ``member``), 0 for the others."""
    z = tl.load(z_ptr + cell, mask=hw, other=float("-inf"))
    phi = tl.load(phi_ptr + cell, mask=hw, other=float("-inf"))
    kappa = tl.load(kappa_ptr + head_rows, mask=mask_g, other=0.0)
    w = _inclusion_weight(z, phi, kappa[:, None])
    if HEAD_LISTS:  # a team counts once: in its first selecting head's list
        first = tl.min(tl.where(w > 0, offs_g[:, None], G_PAD), axis=0)
        w = tl.where((first == member // list_len)[None, :], w, 0.0)
    return w


@triton.jit
def _attend_kernel(
    q_ptr, k_ptr, v_ptr, pk_ptr, pv_ptr, lengths_ptr, page_table_ptr,
    team_start_ptr, team_len_ptr, team_end_ptr,
    z_ptr, phi_ptr, kappa_ptr, union_ptr, count_ptr,
    part_m_ptr, part_l_ptr, part_o_ptr, sum_l_ptr, sum_o_ptr, ticket_ptr, out_ptr, rng_ptr,
    scale, sink, team_size, t_cap, union_cap, packed_rows, num_parts, team_programs,
    exact_programs, list_len,
    stride_qb, stride_qh, stride_kx, stride_ky, stride_kh, stride_pt, page_size,
    stride_ob, stride_oh,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr, G_PAD: tl.constexpr, TPB: tl.constexpr, SLOT: tl.constexpr,
    CHUNKS: tl.constexpr, BLOCK_E: tl.constexpr,
    PACKED: tl.constexpr, PAGED: tl.constexpr, REGULAR: tl.constexpr,
    DOT_PRECISION: tl.constexpr, PDL: tl.constexpr = False, HEAD_LISTS: tl.constexpr = False,
    MERGE_ATOMIC: tl.constexpr = False, BLOCK_S: tl.constexpr = 64,
    LET_NEXT: tl.constexpr = False, LOOPS: tl.constexpr = 1, ATTEND_STAGES: tl.constexpr = 1,
    PRELOAD: tl.constexpr = False, L_PAD: tl.constexpr = 1,
):
    """Grid ``(B * Hkv, num_parts)``: team programs (LOOPS tiles of TPB teams of the list
    each) and
    exact-set programs; each writes its heads' partial (m, l, o). With MERGE_ATOMIC the
    programs also add it, scaled to kappa, into the heads' sums, and the group's last
    program writes the output (and advances the step counter): no merge kernel.
    LET_NEXT (MERGE_ATOMIC): the kernel after the call may launch once every program has
    added its partial (not as they start: its programs would wait on SMs this grid needs)."""
    _pdl_wait(PDL)  # launched early: wait for the previous kernel
    if not MERGE_ATOMIC:
        _pdl_trigger(PDL)  # the merge kernel may launch as this grid's last wave starts
    BLOCK_N: tl.constexpr = TPB * SLOT
    bkv = tl.program_id(0)
    c = tl.program_id(1)
    b = bkv // NUM_KV_HEADS
    kvh = bkv % NUM_KV_HEADS
    hq = NUM_KV_HEADS * GROUP
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D_PAD)
    mask_g = offs_g < GROUP
    mask_d = offs_d < HEAD_DIM
    head_rows = (b * hq + kvh * GROUP + offs_g).to(tl.int64)
    q = tl.load(q_ptr + b * stride_qb + (kvh * GROUP + offs_g)[:, None] * stride_qh
                + offs_d[None, :], mask=mask_g[:, None] & mask_d[None, :], other=0.0)
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], dtype=tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], dtype=tl.float32)
    team_end = tl.load(team_end_ptr + b)
    k_head = k_ptr + kvh * stride_kh
    v_head = v_ptr + kvh * stride_kh
    exact = c >= team_programs
    if c < team_programs:
        # rows of TPB teams of the union list, SLOT rows each. No branch on the device-side
        # count: the union entries load with it (the list is zero-initialised, so entries
        # past the count are valid team ids) and programs past the count read nothing
        # and write an empty partial (m = -inf), so the merge never reads the count.
        offs_n = tl.arange(0, BLOCK_N)
        if LOOPS == 1:  # one tile of the list a program
            member = c * TPB + offs_n // SLOT
            team, mask_u, start, n_g, cell, hw = _team_tile(
                member, bkv, head_rows, mask_g, union_ptr, count_ptr, team_start_ptr,
                team_len_ptr, sink, team_size, team_end, t_cap, union_cap, HEAD_LISTS, REGULAR)
            for chunk in range(CHUNKS):  # a loop, not unrolled: one chunk of K/V live at a time
                m_i, l_i, acc = _team_chunk(
                    chunk, offs_n, offs_d, offs_g, mask_d, mask_g, member, team, mask_u,
                    start, n_g, cell, hw, bkv, b, q, k_head, v_head, pk_ptr, pv_ptr, z_ptr,
                    phi_ptr, kappa_ptr, head_rows, page_table_ptr, packed_rows, list_len,
                    stride_kx, stride_ky, stride_pt, page_size, m_i, l_i, acc, scale,
                    HEAD_DIM, G_PAD, SLOT, PACKED, PAGED, HEAD_LISTS, DOT_PRECISION)
        elif PRELOAD and TPB == 1:
            # LOOPS consecutive teams a program: their list entries, rows and weights
            # [G_PAD, L_PAD] before the loop, which then loads only K/V (addresses from
            # registers: a pipelined loop can stage them ATTEND_STAGES - 1 tiles ahead)
            offs_l = tl.arange(0, L_PAD)
            member_l = c * LOOPS + offs_l
            _, mask_l, start_l, n_l, cell_l, hw_l = _team_tile(
                member_l, bkv, head_rows, mask_g, union_ptr, count_ptr, team_start_ptr,
                team_len_ptr, sink, team_size, team_end, t_cap, union_cap, HEAD_LISTS, REGULAR)
            # no rows for entries past the list (their weights are 0: this saves the reads);
            # the L_PAD - LOOPS last columns are never picked
            n_l = tl.where(mask_l, n_l, 0)
            w_l = _team_weights(cell_l, hw_l, member_l, offs_g, mask_g, head_rows, z_ptr,
                                phi_ptr, kappa_ptr, list_len, G_PAD, HEAD_LISTS)
            for step in tl.range(0, LOOPS * CHUNKS, num_stages=ATTEND_STAGES):
                here = offs_l == step // CHUNKS
                r = (step % CHUNKS) * SLOT + offs_n
                ok = r < tl.sum(tl.where(here, n_l, 0))
                k, v = _team_kv(tl.where(ok, tl.sum(tl.where(here, start_l, 0)) + r, 0), ok,
                                bkv, b, offs_d, mask_d, k_head, v_head, pk_ptr, pv_ptr,
                                page_table_ptr, packed_rows, stride_kx, stride_ky, stride_pt,
                                page_size, HEAD_DIM, PACKED, PAGED)
                w = tl.sum(tl.where(here[None, :], w_l, 0.0), axis=1)
                m_i, l_i, acc = _online_update(q, k, v, w[:, None], ok[None, :], m_i, l_i, acc,
                                               scale, DOT_PRECISION)
        else:  # LOOPS consecutive tiles a program, their loads pipelined ATTEND_STAGES deep
            for step in tl.range(0, LOOPS * CHUNKS, num_stages=ATTEND_STAGES):
                member = (c * LOOPS + step // CHUNKS) * TPB + offs_n // SLOT
                team, mask_u, start, n_g, cell, hw = _team_tile(
                    member, bkv, head_rows, mask_g, union_ptr, count_ptr, team_start_ptr,
                    team_len_ptr, sink, team_size, team_end, t_cap, union_cap, HEAD_LISTS,
                    REGULAR)
                m_i, l_i, acc = _team_chunk(
                    step % CHUNKS, offs_n, offs_d, offs_g, mask_d, mask_g, member, team,
                    mask_u, start, n_g, cell, hw, bkv, b, q, k_head, v_head, pk_ptr, pv_ptr,
                    z_ptr, phi_ptr, kappa_ptr, head_rows, page_table_ptr, packed_rows,
                    list_len, stride_kx, stride_ky, stride_pt, page_size, m_i, l_i, acc,
                    scale, HEAD_DIM, G_PAD, SLOT, PACKED, PAGED, HEAD_LISTS, DOT_PRECISION)
    if exact:
        # exact set E: [0, min(sink, team_end)) and [team_end, length), weight 1
        length = tl.load(lengths_ptr + b)
        n_head = tl.minimum(sink, team_end)
        n_exact = n_head + tl.maximum(length - team_end, 0)
        e = c - team_programs
        offs_e = tl.arange(0, BLOCK_E)
        ones = tl.full([G_PAD, BLOCK_E], 1.0, tl.float32)
        for r0 in range(e * BLOCK_E, n_exact, exact_programs * BLOCK_E):
            r = r0 + offs_e
            ok = r < n_exact
            pos = tl.where(ok, tl.where(r < n_head, r, team_end + r - n_head), 0)
            k, v = _team_kv(pos, ok, bkv, b, offs_d, mask_d, k_head, v_head, pk_ptr, pv_ptr,
                            page_table_ptr, packed_rows, stride_kx, stride_ky, stride_pt,
                            page_size, HEAD_DIM, False, PAGED)
            m_i, l_i, acc = _online_update(q, k, v, ones, ok[None, :], m_i, l_i, acc, scale,
                                           DOT_PRECISION)
    part = head_rows * num_parts + c  # every program writes a (possibly empty) partial
    tl.store(part_m_ptr + part, m_i, mask=mask_g)
    tl.store(part_l_ptr + part, l_i, mask=mask_g)
    tl.store(part_o_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], acc,
             mask=mask_g[:, None] & mask_d[None, :])
    if MERGE_ATOMIC:
        _merge_atomic(part_m_ptr, part_l_ptr, part_o_ptr, sum_l_ptr, sum_o_ptr, ticket_ptr,
                      out_ptr, rng_ptr, kappa_ptr, m_i, l_i, acc, head_rows, offs_g, offs_d,
                      mask_g, mask_d, b, kvh, bkv, num_parts, stride_ob, stride_oh, GROUP,
                      HEAD_DIM, D_PAD, BLOCK_S, LET_NEXT)


@triton.jit
def _merge_atomic(part_m_ptr, part_l_ptr, part_o_ptr, sum_l_ptr, sum_o_ptr, ticket_ptr,
                  out_ptr, rng_ptr, kappa_ptr, m_i, l_i, acc, head_rows, offs_g, offs_d,
                  mask_g, mask_d, b, kvh, bkv, num_parts, stride_ob, stride_oh,
                  GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                  BLOCK_S: tl.constexpr, LET_NEXT: tl.constexpr):
    """Adds an attend program's partial, scaled by ``e^{m - kappa}``, to its heads' sums;
    the group's last program to arrive (an acq_rel ticket) stores ``sum_o / sum_l``, or
    merges the partials by their maxima for a group where a sum left [2^-64, 2^64], and
    zeroes the sums and the ticket for the next call. Partials scaled to one reference
    per head are additive: the self-normalised estimate is their sum's ratio."""
    ref = tl.load(kappa_ptr + head_rows, mask=mask_g, other=0.0)
    ref = tl.where(ref > float("-inf"), ref, 0.0)  # kappa = -inf: every team selected
    live = mask_g & (m_i > float("-inf"))  # empty partials add nothing
    factor = tl.exp(tl.where(live, m_i - ref, float("-inf")))
    cells = head_rows[:, None] * HEAD_DIM + offs_d[None, :]
    tl.atomic_add(sum_l_ptr + head_rows, l_i * factor, mask=live, sem="relaxed")
    tl.atomic_add(sum_o_ptr + cells, acc * factor[:, None],
                  mask=live[:, None] & mask_d[None, :], sem="relaxed")
    _pdl_trigger(LET_NEXT)  # the kernel after the call waits for this grid's end anyway
    # every thread's adds are ordered before the ticket (barrier + acq_rel atomic)
    tl.debug_barrier()
    ticket = tl.atomic_add(ticket_ptr + bkv, 1, sem="acq_rel")
    if ticket == num_parts - 1:
        mask_o = mask_g[:, None] & mask_d[None, :]
        den = tl.load(sum_l_ptr + head_rows, mask=mask_g, other=1.0, cache_modifier=".cg")
        num = tl.load(sum_o_ptr + cells, mask=mask_o, other=0.0, cache_modifier=".cg")
        heads = kvh * GROUP + offs_g
        out_rows = out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
        ok = (den > 5.421010862427522e-20) & (den < 1.8446744073709552e19)
        if tl.sum((mask_g & ~ok).to(tl.int32), axis=0) == 0:
            tl.store(out_rows, (num / den[:, None]).to(out_ptr.dtype.element_ty), mask=mask_o)
        else:  # a sum under- or overflowed its range: the partials, by their maxima
            row0 = tl.min(head_rows, axis=0)  # the group's first head
            for g in range(GROUP):
                out = _merge_head(part_m_ptr, part_l_ptr, part_o_ptr, row0 + g, num_parts,
                                  offs_d, mask_d, HEAD_DIM, D_PAD, BLOCK_S, ".cg")
                tl.store(out_ptr + b * stride_ob + (kvh * GROUP + g) * stride_oh + offs_d,
                         out.to(out_ptr.dtype.element_ty), mask=mask_d)
        tl.store(sum_l_ptr + head_rows, tl.zeros_like(den), mask=mask_g)
        tl.store(sum_o_ptr + cells, tl.zeros_like(num), mask=mask_o)
        tl.store(ticket_ptr + bkv, 0)  # ready for the next call (graph replay)
        if bkv == 0:  # the call's last kernel advances the step counter (section 8)
            tl.store(rng_ptr, tl.load(rng_ptr) + 1)


# ----------------------------------------------------------------- kernel 3: merge
@triton.jit
def _merge_head(part_m_ptr, part_l_ptr, part_o_ptr, row, num_parts, offs_d, mask_d,
                HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_S: tl.constexpr,
                CACHE: tl.constexpr):
    """Head ``row``'s output ``[D_PAD]`` (fp32) from its ``num_parts`` partials (m, l, o):
    the max over every partial first, then one weighted sum (no running rescale)."""
    base = row * num_parts
    offs_s = tl.arange(0, BLOCK_S)
    m_lanes = tl.full([BLOCK_S], float("-inf"), tl.float32)
    for s0 in range(0, num_parts, BLOCK_S):
        m = tl.load(part_m_ptr + base + s0 + offs_s, mask=s0 + offs_s < num_parts,
                    other=float("-inf"), cache_modifier=CACHE)
        m_lanes = tl.maximum(m_lanes, m)
    m_max = tl.max(m_lanes, axis=0)
    m_ref = tl.where(m_max > float("-inf"), m_max, 0.0)
    l_lanes = tl.zeros([BLOCK_S], dtype=tl.float32)
    acc = tl.zeros([BLOCK_S, D_PAD], dtype=tl.float32)
    for s0 in range(0, num_parts, BLOCK_S):
        mask_s = s0 + offs_s < num_parts
        rows = base + s0 + offs_s
        m = tl.load(part_m_ptr + rows, mask=mask_s, other=float("-inf"), cache_modifier=CACHE)
        l_s = tl.load(part_l_ptr + rows, mask=mask_s, other=0.0, cache_modifier=CACHE)
        o = tl.load(part_o_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=mask_s[:, None] & mask_d[None, :], other=0.0, cache_modifier=CACHE)
        w = tl.exp(m - m_ref)  # empty partials: 0
        l_lanes += w * l_s
        acc += w[:, None] * o
    return tl.sum(acc, axis=0) / tl.sum(l_lanes, axis=0)


@triton.jit
def _merge_kernel(
    part_m_ptr, part_l_ptr, part_o_ptr, out_ptr, rng_ptr,
    num_parts, stride_ob, stride_oh,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr = False,
    LET_NEXT: tl.constexpr = False,
):
    """Log-sum-exp merge of one head's partials, as triton_splitkv's stage 2: the max
    over every partial first, then one weighted sum (no running rescale). Every attend
    program wrote its partial (empty ones hold m = -inf: weight 0), so nothing here
    waits on the device-side union count; ``BLOCK_S >= num_parts`` at B=1 (one step).
    LET_NEXT (without PDL): the kernel after the call may launch as this one starts."""
    _pdl_enter(PDL, True)  # launched early: wait for the previous kernel
    _pdl_trigger(LET_NEXT)
    pid = tl.program_id(0)
    hq = NUM_KV_HEADS * GROUP
    offs_d = tl.arange(0, D_PAD)
    mask_d = offs_d < HEAD_DIM
    out = _merge_head(part_m_ptr, part_l_ptr, part_o_ptr, pid.to(tl.int64), num_parts,
                      offs_d, mask_d, HEAD_DIM, D_PAD, BLOCK_S, "")
    tl.store(out_ptr + (pid // hq) * stride_ob + (pid % hq) * stride_oh + offs_d,
             out.to(out_ptr.dtype.element_ty), mask=mask_d)
    if pid == 0:  # the call's last kernel advances the step counter (section 8)
        tl.store(rng_ptr, tl.load(rng_ptr) + 1)


# -------------------------------------------------------------------- host side
@dataclass(frozen=True)
class SantaPPInfo:
    """What one call selected (views into the workspace; read off the hot path).

    ``z``/``phi [B, Hq, T]``, ``kappa [B, Hq]``, ``union [B, Hkv, U]`` with ``count [B, Hkv]``
    valid entries (team ids); with ``head_lists`` the union holds ``U / M`` lists of ``M``
    slots, one per head of the group (team ids, -1: none; a team may sit in several) and
    ``count`` is not written.
    """

    M: int
    packed: PackedTeams
    z: torch.Tensor
    phi: torch.Tensor
    kappa: torch.Tensor
    union: torch.Tensor
    count: torch.Tensor
    lengths: torch.Tensor
    head_lists: bool = False

    def selected(self) -> torch.Tensor:
        """``[B, Hq, T]`` bool: the teams each head selected (``z > kappa``)."""
        return self.z > self.kappa[..., None]

    def team_weights(self) -> torch.Tensor:
        """``[B, Hq, T]`` float64: ``1/pi`` of each selected team, 0 elsewhere."""
        z, phi, kappa = self.z.double(), self.phi.double(), self.kappa.double()[..., None]
        pi = -torch.expm1(-torch.exp(phi - kappa))
        chosen = z > kappa
        return torch.where(chosen, 1 / torch.where(chosen, pi, 1), 0)

    def members(self) -> torch.Tensor:
        """``[B, Hkv, T]`` bool: the teams the attend programs read (the group's union)."""
        union = self.union.long().cpu()
        slots = torch.arange(union.shape[-1])
        if self.head_lists:
            used = union >= 0
        else:
            used = slots[None, None, :] < self.count.long().cpu()[..., None]
        members = torch.zeros(*union.shape[:2], self.z.shape[-1] + 1, dtype=torch.bool)
        members.scatter_(2, torch.where(used, union, members.shape[-1] - 1), True)
        return members[..., :-1]

    def union_sets(self) -> list[list[set[int]]]:
        """The union of every (sequence, KV head) as Python sets."""
        members = self.members()
        return [[set(torch.nonzero(row).flatten().tolist()) for row in seq] for seq in members]

    def read_counts(self) -> ReadCounts:
        """K/V rows read per (sequence, KV head): the union's members plus the exact set."""
        packed = self.packed
        members = self.members()
        team_len = packed.team_len.long().cpu()
        lengths = self.lengths.long().cpu()
        team_end = packed.team_end.long().cpu()
        n_exact = torch.minimum(torch.full_like(team_end, packed.sink), team_end)
        n_exact = n_exact + (lengths - team_end).clamp_min(0)
        rows = torch.where(members, team_len[..., : members.shape[-1]], 0).sum(-1)
        rows = rows + n_exact[:, None]
        d = packed.head_dim
        return ReadCounts(
            k_rows=rows, k_features=rows * d, v_rows=rows.clone(), context=lengths, head_dim=d
        )

    @property
    def representatives_read(self) -> torch.Tensor:
        return self.packed.num_teams.clone()

    def bytes_moved(self, q: torch.Tensor) -> int:
        """HBM bytes of the call by the module's byte model: representatives and ``log n``
        of every (sequence, KV head), the K/V rows read, q and the output (the L2-resident
        workspace traffic is left out)."""
        packed = self.packed
        tables = packed.reps.numel() * packed.reps.element_size() + packed.log_n.numel() * 4
        if packed.reps_scale is not None:
            tables += packed.reps_scale.numel() * 4
        rows = self.read_counts().kv_bytes(packed.kv_itemsize)
        return tables + rows + 2 * q.numel() * q.element_size()

    def read_equivalent(self) -> float:
        """KV read fraction with every representative counted as one K row (int8 codes and
        their scale: as the share of a K row's bytes they take)."""
        reads = self.read_counts()
        d = reads.head_dim
        read = float(reads.k_features.sum()) + float(reads.v_rows.sum()) * d
        share = 1.0
        if self.packed.reps_scale is not None:
            share = (d * self.packed.reps.element_size() + 4) / (d * self.packed.kv_itemsize)
        read += float(self.representatives_read.sum()) * d * share
        return read / (2 * reads.dense_rows * d)


def check_scheme(scheme: str = "gumbel-topk", mix: float = 0.0) -> None:
    """Raises unless the kernel implements this selection (gumbel-topk without mixing)."""
    if scheme != "gumbel-topk":
        raise InputError(
            f"scheme: the SANTA++ kernel implements 'gumbel-topk' only, got {scheme!r} "
            "(multinomial is reference-only: santa_kernels.santapp)"
        )
    if mix:
        raise InputError(
            f"mix: the SANTA++ kernel has no defensive mixing, got {mix!r} "
            "(use santa_kernels.santapp for mix > 0)"
        )


def _check_call(q, kv, packed, M, workspace) -> int:
    """Validates a call; returns the ``M`` it plans for (:func:`teams_selected`)."""
    if not isinstance(kv, KVCache):
        raise InputError(f"kv: expected a santa_kernels.KVCache, got {type(kv).__name__}")
    if not isinstance(packed, PackedTeams):
        raise InputError(f"packed: expected a PackedTeams, got {type(packed).__name__}")
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise InputError("q: expected a tensor [B, Hq, d]")
    batch, hq, d = q.shape
    if batch != kv.batch or d != kv.head_dim or hq % kv.num_kv_heads:
        raise InputError(
            f"q: shape {tuple(q.shape)} does not fit the cache "
            f"(B={kv.batch}, Hkv={kv.num_kv_heads}, d={kv.head_dim})"
        )
    if q.dtype not in KERNEL_DTYPES or kv.dtype not in KERNEL_DTYPES:
        raise InputError(
            f"q/kv: dtypes {q.dtype}/{kv.dtype} not supported by the kernel "
            "(bf16, fp16, fp32; use santa_kernels.santapp for float64)"
        )
    if d < 16:
        raise InputError(f"q: head dim must be >= 16 for the kernel, got {d}")
    if hq // kv.num_kv_heads > MAX_GROUP:
        raise InputError(f"q: GQA group of {hq // kv.num_kv_heads} heads (at most {MAX_GROUP})")
    if q.stride(-1) != 1 or kv.k.stride(-1) != 1 or kv.k.stride() != kv.v.stride():
        raise InputError("q/k/v: the head dim must be contiguous and K, V share strides")
    if q.device != kv.device:
        raise InputError(f"q: on {q.device}, the cache is on {kv.device}")
    if (packed.batch, packed.num_kv_heads, packed.head_dim) != (kv.batch, kv.num_kv_heads, d):
        raise InputError(
            f"packed: built for B={packed.batch}, Hkv={packed.num_kv_heads}, "
            f"d={packed.head_dim}; the cache has B={kv.batch}, Hkv={kv.num_kv_heads}, d={d}"
        )
    reps_dtype = kv.dtype if packed.reps_scale is None else torch.int8
    if packed.reps.device != kv.device or packed.reps.dtype != reps_dtype:
        raise InputError("packed: not on the cache's device or in its dtype (pack it again)")
    M = teams_selected(check_positive_int(M, "M"), packed)
    if workspace is not None:
        if not isinstance(workspace, SantaPPWorkspace):
            raise InputError("workspace: expected a SantaPPWorkspace")
        p = workspace.plan
        shape = (p.batch, p.num_q_heads, p.num_kv_heads, p.head_dim, p.max_teams, p.M)
        if shape != (batch, hq, kv.num_kv_heads, d, packed.max_teams, M):
            raise InputError(
                f"workspace: planned for (B, Hq, Hkv, d, T, M) = {shape}, got "
                f"{(batch, hq, kv.num_kv_heads, d, packed.max_teams, M)}"
            )
        if workspace.device != q.device:
            raise InputError(f"workspace: on {workspace.device}, inputs on {q.device}")
        if p.slot * p.chunks < packed.max_team_len:
            raise InputError("workspace: planned for shorter teams (pack changed)")
    return M


def _launch(q, kv, packed, M, ws, tau, seed, gumbels, stages,
            pdl_chain: bool = False) -> torch.Tensor:
    """Launches the call's kernels (``stages``: a subset of :data:`STAGES`, for profiling;
    the output is only meaningful with all of them; ``("score",)`` runs the select kernel
    without finishing the selection; ``"no-union"`` added: the finisher does not write the
    union (or the head lists), ``"no-search"``: nor does it search kappa (profiling: wrong
    outputs); ``pdl_chain``: see
    :func:`santapp_decode`). Returns the output buffer."""
    p = ws.plan
    batch, hq, d = q.shape
    hkv = kv.num_kv_heads
    precision = _dot_precision(kv.dtype)
    d_pad = _next_pow2(d)
    can_pdl = pdl_available(q.device)
    pdl = can_pdl and bool(HOPPER.get("pdl")) and batch * hkv <= HOPPER["pdl_max_groups"]
    dep = {"launch_pdl": True} if pdl else {}  # kernels after the first
    # select -> finish -> attend as programmatic dependents even where the merge is not
    before_merge = HOPPER.get("pdl_before_merge")
    if before_merge == "int8":
        before_merge = packed.reps_format == "int8"
    early = pdl or (can_pdl and bool(before_merge))
    dep_early = {"launch_pdl": True} if early else {}
    chain = pdl_chain and can_pdl
    lists = p.head_lists and "score" not in stages
    # the profiling stages "no-union" / "no-search" time the search's parts
    stages_full = "no-union" not in stages and "no-search" not in stages
    if "score" in stages:  # profiling: the select kernel alone, without its finisher
        stages = (*stages, "select")
    if "select" in stages:
        _select_kernel[(p.num_splits, batch * hkv)](
            q, packed.reps, packed.log_n,
            packed.reps_scale if packed.reps_scale is not None else packed.log_n,
            gumbels if gumbels is not None else ws.phi, ws.rng,
            (ws.seed if seed is None else int(seed)) & 0xFFFFFFFF,
            ws.phi, ws.z, ws.cand_z, ws.cand_id, ws.split_kth, ws.union,
            tau, M, p.num_splits, p.n_cand, p.max_teams, p.union_cap, q.stride(0), q.stride(1),
            NUM_KV_HEADS=hkv, GROUP=p.group, HEAD_DIM=d, D_PAD=d_pad, G_PAD=p.g_pad,
            G_ROWS=p.g_rows, TB=p.teams_per_split, M1_PAD=p.m1_pad,
            LOCAL=p.local, HAS_GUMBELS=gumbels is not None,
            DOT_PRECISION=precision, PDL=early, ENTRY_PDL=chain,
            REPS_AS=_REPS_AS[kv.dtype] if packed.reps_scale is not None else "",
            BRACKET=p.bracket, HEAD_LISTS=lists, TOPS=lists and p.compact > 0, num_stages=1,
            num_warps=p.score_warps,
            **({"launch_pdl": True} if chain else {}),
        )  # fmt: skip
    if "select" in stages and "score" not in stages and p.finish_heads:
        _finish_heads_kernel[(batch * hkv, p.finish_parts)](
            ws.z, ws.cand_z, ws.cand_id, ws.split_kth, ws.kappa, ws.union, ws.count, ws.ticket,
            ws.scratch_key, ws.scratch_id,
            M, p.num_splits, p.n_cand, p.max_teams, p.union_cap, p.finish_parts,
            NUM_KV_HEADS=hkv, GROUP=p.group, G_ROWS=p.g_rows, H_ROWS=p.h_rows, C_PAD=p.c_pad,
            S_PAD=p.s_pad, LOCAL=p.local, WAYS=p.finish_ways, PDL=early,
            num_warps=p.finish_warps, num_stages=1, WRITE_UNION="no-union" not in stages,
            SEARCH="no-search" not in stages, BRACKET=p.bracket, HEAD_LISTS=lists,
            COMPACT=p.compact if lists and stages_full else 0, TOPS_PAD=p.tops_pad,
            **dep_early,
        )  # fmt: skip
    elif "select" in stages and "score" not in stages:
        _finish_kernel[(batch * hkv,)](
            ws.z, ws.cand_z, ws.cand_id, ws.split_kth, ws.kappa, ws.union, ws.count,
            M, p.num_splits, p.n_cand, p.max_teams, p.union_cap,
            NUM_KV_HEADS=hkv, GROUP=p.group, G_ROWS=p.g_rows, C_PAD=p.c_pad, S_PAD=p.s_pad,
            LOCAL=p.local, WAYS=p.search_ways, PDL=early, BRACKET=p.bracket,
            num_warps=p.finish_warps, num_stages=1, **dep_early,
        )  # fmt: skip
    paged = kv.layout == "paged"
    table = kv.page_table if paged else kv.lengths
    packed_k = packed.packed_k if packed.packed_k is not None else kv.k
    packed_v = packed.packed_v if packed.packed_v is not None else kv.v
    packed_rows = int(packed.packed_k.shape[2]) if packed.packed_k is not None else 0
    out = ws.out(q.dtype)
    atomic = p.merge_atomic and "merge" in stages  # the attend programs merge
    if "attend" in stages:
        _attend_kernel[(batch * hkv, p.num_parts)](
            q, kv.k, kv.v, packed_k, packed_v, kv.lengths, table,
            packed.team_start, packed.team_len, packed.team_end,
            ws.z, ws.phi, ws.kappa, ws.union, ws.count,
            ws.part_m, ws.part_l, ws.part_o, ws.sum_l, ws.sum_o, ws.attend_ticket, out, ws.rng,
            tau, packed.sink, packed.team_size, p.max_teams, p.union_cap, packed_rows,
            p.num_parts, p.team_programs, p.exact_programs, M,
            q.stride(0), q.stride(1), kv.k.stride(0), kv.k.stride(1), kv.k.stride(2),
            table.stride(0) if paged else 0, kv.page_size if paged else 1,
            out.stride(0), out.stride(1),
            NUM_KV_HEADS=hkv, GROUP=p.group, HEAD_DIM=d, D_PAD=d_pad, G_PAD=p.g_pad,
            TPB=p.teams_per_block, SLOT=p.slot, CHUNKS=p.chunks, BLOCK_E=p.exact_rows,
            PACKED=packed.packed_k is not None, PAGED=paged, REGULAR=packed.regular,
            DOT_PRECISION=precision, PDL=early, HEAD_LISTS=lists,
            MERGE_ATOMIC=atomic, BLOCK_S=p.merge_block, LET_NEXT=atomic and chain,
            **({"LOOPS": p.loops, "ATTEND_STAGES": p.attend_stages,
                "PRELOAD": p.attend_preload, "L_PAD": _next_pow2(p.loops)}
               if p.loops > 1 else {}),
            num_warps=HOPPER["attend_warps"], num_stages=1,
            **dep_early,
        )  # fmt: skip
    if "merge" in stages and not atomic:
        _merge_kernel[(batch * hq,)](
            ws.part_m, ws.part_l, ws.part_o, out, ws.rng,
            p.num_parts, out.stride(0), out.stride(1),
            NUM_KV_HEADS=hkv, GROUP=p.group, HEAD_DIM=d, D_PAD=d_pad,
            BLOCK_S=p.merge_block, PDL=pdl, LET_NEXT=chain and not pdl,
            num_warps=p.merge_warps, **dep,
        )  # fmt: skip
    return out


def santapp_decode(
    q: torch.Tensor,
    kv: KVCache,
    packed: PackedTeams,
    M: int,
    *,
    scale: float | None = None,
    seed: int | None = None,
    gumbels: torch.Tensor | None = None,
    workspace: SantaPPWorkspace | None = None,
    pdl_chain: bool = False,
) -> tuple[torch.Tensor, SantaPPInfo]:
    """Returns ``(out [B, Hq, d] in q.dtype, info)``: one SANTA++ decode step (section 6,
    gumbel-topk, exact set = the pack's). ``gumbels [B, Hq, T]`` replaces the Philox
    Gumbel noise (tests). With a ``workspace`` the call allocates nothing
    and never synchronises (CUDA-graph capturable). ``pdl_chain``: the call sits between
    kernels that launch as programmatic dependents (the e2e step's gemm rest): where
    :func:`pdl_available`, its first kernel launches as a dependent of the kernel before
    and loads the representatives before waiting for it, and its last lets the next kernel
    launch early (no effect elsewhere)."""
    M = _check_call(q, kv, packed, M, workspace)  # at most the tables' team count
    ws = workspace or SantaPPWorkspace.for_inputs(q, kv, packed, M)
    p = ws.plan
    batch, hq, d = q.shape
    hkv = kv.num_kv_heads
    tau = check_scale(scale, d)
    if gumbels is not None:
        if tuple(gumbels.shape) != (batch, hq, p.max_teams):
            raise InputError(
                f"gumbels: expected shape {(batch, hq, p.max_teams)}, got {tuple(gumbels.shape)}"
            )
        gumbels = gumbels.to(device=q.device, dtype=torch.float32).contiguous()
    out = _launch(q, kv, packed, M, ws, tau, seed, gumbels, STAGES, pdl_chain)
    info = SantaPPInfo(
        M=M,
        packed=packed,
        z=ws.z.view(batch, hq, p.max_teams),
        phi=ws.phi.view(batch, hq, p.max_teams),
        kappa=ws.kappa.view(batch, hq),
        union=ws.union.view(batch, hkv, p.union_cap),
        count=ws.count.view(batch, hkv),
        lengths=kv.lengths,
        head_lists=p.head_lists,
    )
    return out, info


__all__ = [
    "PackedTeams",
    "SantaPPInfo",
    "SantaPPPlan",
    "SantaPPWorkspace",
    "build_packed",
    "check_scheme",
    "make_plan",
    "pack_teams",
    "reads_every_team",
    "santapp_decode",
    "santapp_triton_available",
    "time_index_build",
]
