"""SANTA++ Triton kernels, stage 0: team storage (:class:`PackedTeams`).

Builds and packs the team index at prefill time: representatives, ``log n``, team tables
and the exact-set bounds, as views of the cache (contiguous teams) or team-major copies
(``kmeans`` teams, ``copy=True``); :func:`time_index_build` times it apart from decode.
The design is in :mod:`santa_kernels.triton_santapp`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from santa_kernels.build_timing import median_build_ms
from santa_kernels.kv import KVCache
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
from santa_kernels.triton_santapp_common import _next_pow2
from santa_kernels.validate import InputError, check_positive_int


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
    (:func:`~santa_kernels.build_timing.median_build_ms`: the median of ``repeats`` builds
    after one warm-up where a build is quick: contiguous teams, and k-means on a GPU;
    otherwise one build)."""
    check_positive_int(repeats, "repeats")
    policy = params.get("policy", "contiguous")
    cheap = (policy == "contiguous" and not params.get("copy")) or (
        policy == "kmeans" and kv.device.type == "cuda")
    return median_build_ms(lambda: build_packed(kv, **params), kv.device,
                           repeats if cheap else 1, warm_up=cheap)
