"""Exact PyTorch reference of SANTA++: sampling teams through representative keys.

docs/algorithms.md section 6. A :class:`TeamIndex` groups each (sequence, KV head)'s keys into
teams (``contiguous`` spans or ``kmeans`` parents split by farthest-first leaders) and
stores one representative key per team. At decode, a query scores the representatives
(team logit ``phi_g = tau q.r_g + log n_g``), selects ``M`` teams (``gumbel-topk`` without
replacement or ``multinomial`` with replacement), attends exactly inside them, and
reweights each selected team by its Horvitz-Thompson (or Hansen-Hurwitz) weight; an exact
set ``E`` (growth tail, sinks, recent window) is always attended. The output is the
self-normalised ratio ``num / den`` of the two weighted sums (no ``1/M`` factor).

Decisions where section 6 is silent (see also the docstrings):

- ``sink``/``window`` tokens that belong to a team stay members (the team's size ``n_g``
  in ``phi_g``, and its representative, are unchanged) but are masked out of the team's
  weighted sums and added once, with weight 1, to the exact set: no token is counted
  twice. The index can instead leave them out of the teams (``build_team_index(sink=,
  exact_recent=)``), as the registry entry does.
- k-means assignments are computed in fp32, means, leaders and representatives in fp64.
- Reads: ``reads`` counts K and V rows of the selected teams (all members, GQA union)
  and of ``E``; representatives are reported apart (``representatives_read``) and only
  ``read_equivalent`` adds them, as K rows, so the registry byte model follows the
  "KV read fraction" convention.
- Tokens of the cache past the index (not yet added by :func:`extend`) are exact.
- :func:`extend` grows both policies the same way: tokens wait in the exact tail until
  ``team_size`` of them (beyond the ``exact_recent`` most recent) are there, then the
  oldest ``team_size`` form one new contiguous team (k-means is not re-run).
- ``M`` may not exceed the team count of any (sequence, KV head); where it equals it,
  every team is selected with ``pi = 1`` (gumbel-topk), so the output is exact.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from santa_kernels.kv import KVCache
from santa_kernels.reads import ReadCounts
from santa_kernels.reference import COMPUTE_DTYPES, AttentionOutput, make_generator
from santa_kernels.validate import InputError, check_positive_int, check_query, check_scale

POLICIES = ("contiguous", "kmeans")
SCHEMES = ("gumbel-topk", "multinomial")
# how a GQA group's query heads draw their teams: each its own (head), one draw per KV
# head from the heads' mean probabilities (pooled), or each its own with every head
# weighting the group's union by the union's inclusion probability (union)
DRAWS = ("head", "pooled", "union")
KERNEL_DRAWS = ("head", "pooled")  # the draws the Triton kernel implements (triton_santapp)
REPRESENTATIVES = ("leader", "mean")
KMEANS_ITERS = 10
# the defaults of the santa-bench registry entry (``santapp``), where they are explained
DEFAULT_M = 512
DEFAULT_SINK = 4
DEFAULT_WINDOW = 64
KMEANS_BATCH = 1024
_INDEX_DTYPE = torch.float64  # the index (means, distances, representatives) is built in fp64


@dataclass(frozen=True)
class TeamIndex:
    """Teams of one cache, per (sequence, KV head), padded to ``T`` teams of ``L`` slots.

    ``team_of [B, Hkv, Nidx]``: team id of each indexed token (-1: not in a team, i.e.
    exact). ``members [B, Hkv, T, L]``: member positions (-1 padding), ``sizes``
    ``[B, Hkv, T]``: ``n_g`` (0 for padding teams), ``team_valid [B, Hkv, T]``,
    ``leaders [B, Hkv, T]``: k-means farthest-first leader (the key nearest the team mean
    for contiguous/grown teams), ``rep_pos [B, Hkv, T]``: position of the representative
    key (-1 for ``mean``), ``rep_keys [B, Hkv, T, d]`` (float64). ``length [B]``: tokens
    covered; ``team_end [B]``: tokens at or past it form the growth tail.
    """

    policy: str
    team_size: int
    leaders_per_parent: int
    representative: str
    seed: int
    sink: int
    exact_recent: int
    team_of: torch.Tensor
    members: torch.Tensor
    sizes: torch.Tensor
    team_valid: torch.Tensor
    leaders: torch.Tensor
    rep_pos: torch.Tensor
    rep_keys: torch.Tensor
    length: torch.Tensor
    team_end: torch.Tensor

    @property
    def num_teams(self) -> torch.Tensor:
        """Teams per (sequence, KV head), ``[B, Hkv]`` int64."""
        return self.team_valid.sum(dim=-1)

    @property
    def batch(self) -> int:
        return int(self.team_of.shape[0])

    @property
    def num_kv_heads(self) -> int:
        return int(self.team_of.shape[1])


@dataclass(frozen=True)
class SantaPPOutput(AttentionOutput):
    """A SANTA++ decode step: ``out``, ``reads`` (selected teams' members + exact rows,
    GQA union), ``weights [B, Hq, N]`` (normalised token weights, ``out = sum w_i v_i``),
    ``representatives_read [B, Hkv]`` (K rows of representatives scored), the HT/HH sums
    ``num [B, Hq, d]`` and ``den [B, Hq]`` taken relative to ``shift [B, Hq]`` (the largest
    read score), and ``team_weights [B, Hq, T]`` (``1/pi_g`` or ``c_g/(M p_g)``, 0 if not
    selected)."""

    representatives_read: torch.Tensor
    num: torch.Tensor
    den: torch.Tensor
    shift: torch.Tensor
    team_weights: torch.Tensor

    @property
    def kv_read_fraction(self) -> float:
        """Fraction of dense K+V bytes read, union per GQA group, representatives excluded."""
        return self.reads.kv_read_fraction

    @property
    def read_equivalent(self) -> float:
        """Like ``kv_read_fraction`` with every representative counted as one K row."""
        reads = self.reads
        d = reads.head_dim
        read = float(reads.k_features.sum()) + float(reads.v_rows.sum()) * d
        read += float(self.representatives_read.sum()) * d
        return read / (2 * reads.dense_rows * d)


# ------------------------------------------------------------------ validation
def _check_choice(value: object, name: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise InputError(f"{name}: expected one of {choices}, got {value!r}")
    return value  # type: ignore[return-value]


def _check_count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"{name}: expected an integer >= 0, got {value!r}")
    return value


def _check_kv(kv: object) -> KVCache:
    if not isinstance(kv, KVCache):
        raise InputError(f"kv: expected a santa_kernels.KVCache, got {type(kv).__name__}")
    return kv


def team_end_of(lengths: torch.Tensor, sink: int, exact_recent: int) -> torch.Tensor:
    """Per sequence, where the teams end and the exact recent tail (growth) begins."""
    end = torch.maximum(lengths - exact_recent, torch.full_like(lengths, sink))
    return end.clamp_max(lengths)


# ------------------------------------------------------------------ index
def build_team_index(
    kv: KVCache,
    policy: str = "contiguous",
    team_size: int = 16,
    leaders: int = 4,
    representative: str = "mean",
    seed: int = 0,
    exact_recent: int = DEFAULT_WINDOW,
    sink: int = DEFAULT_SINK,
) -> TeamIndex:
    """Builds the team index of ``kv`` from its post-RoPE keys (docs/algorithms.md section 6).

    ``contiguous``: spans of ``team_size`` tokens from ``sink`` on (the last may be
    shorter). ``kmeans``: mini-batch k-means (``KMEANS_ITERS`` iterations, seeded) into
    ``ceil(n / team_size)`` parents, then ``leaders`` farthest-first leaders per parent
    (first: the member nearest the parent mean); members join their nearest leader.
    The first ``sink`` and last ``exact_recent`` tokens are left out of every team.
    """
    kv = _check_kv(kv)
    _check_choice(policy, "policy", POLICIES)
    _check_choice(representative, "representative", REPRESENTATIVES)
    check_positive_int(team_size, "team_size")
    check_positive_int(leaders, "leaders")
    _check_count(exact_recent, "exact_recent")
    _check_count(sink, "sink")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InputError(f"seed: expected an integer, got {seed!r}")
    keys, _, _ = kv.padded(_INDEX_DTYPE)
    lengths = kv.lengths.cpu()
    team_end = team_end_of(lengths, sink, exact_recent)
    keys = keys.cpu()
    n_max = keys.shape[1]
    team_of = torch.full((kv.batch, kv.num_kv_heads, n_max), -1, dtype=torch.int64)
    lead: list[list[torch.Tensor | None]] = [[None] * kv.num_kv_heads for _ in range(kv.batch)]
    spans = [(min(sink, int(end)), int(end)) for end in team_end]
    if policy == "contiguous":
        for b, (lo, hi) in enumerate(spans):
            team_of[b, :, lo:hi] = torch.arange(max(0, hi - lo)) // team_size
    else:
        groups, counts = kmeans_groups(keys, spans)
        gen = torch.Generator(device="cpu").manual_seed(seed)
        ids, leader_pos = kmeans_team_ids(groups, counts, team_size, leaders, gen)
        for g, count in enumerate(counts):
            b, h = divmod(g, kv.num_kv_heads)
            lo = spans[b][0]
            if count:
                team_of[b, h, lo : lo + count] = ids[g, :count]
                lead[b][h] = leader_pos[g][leader_pos[g] >= 0] + lo
    return _pack(
        policy,
        team_size,
        leaders,
        representative,
        seed,
        sink,
        exact_recent,
        team_of,
        lead,
        keys,
        lengths,
        team_end,
    )


def extend(index: TeamIndex, kv: KVCache) -> TeamIndex:
    """Returns ``index`` grown to ``kv.lengths``: new tokens wait in the exact tail until
    ``team_size`` of them lie before the ``exact_recent`` most recent, then the oldest
    ``team_size`` form one new contiguous team (both policies; section 6 "extended
    during decode")."""
    kv = _check_kv(kv)
    _check_index(index, kv)
    keys, _, _ = kv.padded(_INDEX_DTYPE)
    lengths = kv.lengths.cpu()
    n_max = keys.shape[1]
    team_of = torch.full((kv.batch, kv.num_kv_heads, n_max), -1, dtype=torch.int64)
    team_of[:, :, : index.team_of.shape[2]] = index.team_of
    team_end = index.team_end.clone()
    size = index.team_size
    lead: list[list[torch.Tensor | None]] = []
    for b in range(kv.batch):
        start = max(int(team_end[b]), index.sink)
        grown = max(0, (int(lengths[b]) - index.exact_recent - start) // size)
        team_end[b] = start + grown * size
        row: list[torch.Tensor | None] = []
        for h in range(kv.num_kv_heads):
            first_new = int(index.num_teams[b, h])
            span = torch.arange(grown * size)
            team_of[b, h, start : start + grown * size] = first_new + span // size
            old = index.leaders[b, h, :first_new]
            row.append(torch.cat([old, torch.full((grown,), -1, dtype=torch.int64)]))
        lead.append(row)
    return _pack(
        index.policy,
        size,
        index.leaders_per_parent,
        index.representative,
        index.seed,
        index.sink,
        index.exact_recent,
        team_of,
        lead,
        keys,
        lengths,
        team_end,
    )


def _check_index(index: object, kv: KVCache) -> TeamIndex:
    if not isinstance(index, TeamIndex):
        raise InputError(f"index: expected a TeamIndex, got {type(index).__name__}")
    if index.batch != kv.batch or index.num_kv_heads != kv.num_kv_heads:
        raise InputError(
            f"index: built for {index.batch} sequences x {index.num_kv_heads} KV heads, "
            f"the cache has {kv.batch} x {kv.num_kv_heads}"
        )
    if index.rep_keys.shape[-1] != kv.head_dim:
        raise InputError(
            f"index: head dim {index.rep_keys.shape[-1]} does not match the cache's {kv.head_dim}"
        )
    if bool((kv.lengths.cpu() < index.length).any()):
        raise InputError(
            f"index: covers {index.length.tolist()} tokens, more than the cache's "
            f"{kv.lengths.tolist()}"
        )
    return index


def _segment_sum(x: torch.Tensor, seg: torch.Tensor, n_seg: int) -> torch.Tensor:
    """Sums the rows of ``x [n, d]`` per segment id ``seg [n]``: ``[n_seg, d]``."""
    out = torch.zeros((n_seg, x.shape[1]), dtype=x.dtype, device=x.device)
    return out.index_put_((seg,), x, accumulate=True)


def _segment_argbest(values: torch.Tensor, seg: torch.Tensor, n_seg: int, op: str) -> torch.Tensor:
    """Index (into ``values``) of each segment's ``amin``/``amax``; ties: the lowest index.
    Segments without a member get ``len(values)``."""
    start = math.inf if op == "amin" else -math.inf
    device = values.device
    best = torch.full((n_seg,), start, dtype=values.dtype, device=device)
    best = best.scatter_reduce(0, seg, values, op)
    n = values.shape[0]
    cand = torch.where(values == best[seg], torch.arange(n, device=device), n)
    return torch.full((n_seg,), n, dtype=torch.int64, device=device).scatter_reduce(
        0, seg, cand, "amin")


def _kmeans_draws(
    counts: list[int], gen: torch.Generator
) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """The random draws of the k-means, group after group from one CPU generator: each
    group's initial centres (a permutation) and its mini-batches (``KMEANS_ITERS`` draws of
    ``min(n, KMEANS_BATCH)`` keys with replacement)."""
    perms, batches = [], []
    for n in counts:
        perms.append(torch.randperm(n, generator=gen) if n else torch.zeros(0, dtype=torch.long))
        batches.append([torch.randint(n, (min(n, KMEANS_BATCH),), generator=gen)
                        for _ in range(KMEANS_ITERS if n else 0)])
    return perms, batches


def _nearest(x: torch.Tensor, centers: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per group, the nearest valid centre of each row: ``x [G, n, d]``, ``centers
    [G, C, d]``, ``valid [G, C]`` -> ``[G, n]`` (squared Euclidean distance, fp32)."""
    cross = torch.bmm(x, centers.transpose(1, 2))
    dist = (x * x).sum(-1)[:, :, None] - 2 * cross + (centers * centers).sum(-1)[:, None, :]
    return torch.where(valid[:, None, :], dist, math.inf).argmin(dim=-1)


def kmeans_groups(
    keys: torch.Tensor, spans: list[tuple[int, int]]
) -> tuple[torch.Tensor, list[int]]:
    """The keys the k-means clusters, one group per (sequence, KV head) in that order:
    ``keys [B, N, Hkv, d]``, ``spans[b] = (lo, hi)`` the rows of sequence ``b`` in teams ->
    ``([B * Hkv, n, d], counts)`` with group ``g``'s rows first."""
    batch, _, hkv, d = keys.shape
    width = max([1] + [hi - lo for lo, hi in spans])
    groups = keys.new_zeros(batch, hkv, width, d)
    counts = []
    for b, (lo, hi) in enumerate(spans):
        n = max(0, hi - lo)
        groups[b, :, :n] = keys[b, lo:hi].transpose(0, 1)
        counts += [n] * hkv
    return groups.view(batch * hkv, width, d), counts


def kmeans_team_ids(
    keys: torch.Tensor, counts: list[int], team_size: int, leaders: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """k-means teams of many groups of keys at once, on the keys' device.

    ``keys [G, n, d]``: group ``g``'s keys are its first ``counts[g]`` rows. Mini-batch
    k-means (``KMEANS_ITERS`` iterations, per-centre learning rates ``1/count``, in fp32)
    into ``ceil(n_g / team_size)`` parents; empty parents are dropped; then up to
    ``leaders`` farthest-first leaders per parent (the first: the member nearest the parent
    mean; distances in the keys' dtype) and every member joins its nearest leader.
    Returns ``(team_of [G, n] int64, leader_pos [G, T] int64)``: a row's team id (-1 past
    ``counts[g]``; teams numbered parent by parent, leader by leader) and each team's
    leader row (-1 for padding teams). The random draws come from ``gen`` (CPU) group by
    group, so a group's teams do not depend on the others'.
    """
    groups, n_max, d = keys.shape
    device = keys.device
    perms, batches = _kmeans_draws(counts, gen)
    count_t = torch.tensor(counts, dtype=torch.int64, device=device)
    parents = [min(n, math.ceil(n / team_size)) for n in counts]
    p_max = max([1, *parents])
    xf = keys.float()
    row_ok = torch.arange(n_max, device=device)[None, :] < count_t[:, None]  # [G, n]
    centre_ok = torch.arange(p_max, device=device)[None, :] < torch.tensor(
        parents, device=device)[:, None]
    init = torch.zeros(groups, p_max, dtype=torch.int64)
    for g, (perm, k) in enumerate(zip(perms, parents, strict=True)):
        init[g, :k] = perm[:k]
    init = init.to(device)
    centers = torch.gather(xf, 1, init[:, :, None].expand(-1, -1, d))
    seen = torch.zeros(groups, p_max, device=device)
    flat_centre = torch.arange(groups, device=device)[:, None] * p_max
    for it in range(KMEANS_ITERS):
        size = max([1] + [len(b[it]) for b in batches if b])
        pick = torch.zeros(groups, size, dtype=torch.int64)
        used = torch.zeros(groups, size, dtype=torch.bool)
        for g, draws in enumerate(batches):
            if draws:
                pick[g, : len(draws[it])] = draws[it]
                used[g, : len(draws[it])] = True
        pick, used = pick.to(device), used.to(device)
        batch = torch.gather(xf, 1, pick[:, :, None].expand(-1, -1, d))  # [G, size, d]
        nearest = _nearest(batch, centers, centre_ok)
        seg = (flat_centre + nearest)[used]  # flat (group, centre) ids of the used draws
        hits = torch.bincount(seg, minlength=groups * p_max).float().view(groups, p_max)
        seen += hits
        rate = (hits / seen.clamp_min(1))[..., None]
        sums = _segment_sum(batch[used], seg, groups * p_max).view(groups, p_max, d)
        means = sums / hits.clamp_min(1)[..., None]
        centers = torch.where(hits[..., None] > 0, centers + rate * (means - centers), centers)
    chunk = max(256, (1 << 28) // (groups * p_max))  # distance blocks of <= 2^28 entries
    parent = torch.cat([_nearest(xf[:, i : i + chunk], centers, centre_ok)
                        for i in range(0, n_max, chunk)], dim=1)  # [G, n]
    # drop empty parents: renumber the used ones 0.. in centre order, per group
    flat = (flat_centre + parent)[row_ok]
    sizes = torch.bincount(flat, minlength=groups * p_max).view(groups, p_max)
    renumber = torch.cumsum(sizes > 0, dim=1) - 1
    parent = torch.gather(renumber, 1, parent)
    n_par = (sizes > 0).sum(dim=1)  # [G]
    par_max = max(1, int(n_par.max()))
    seg = (torch.arange(groups, device=device)[:, None] * par_max + parent)[row_ok]  # [rows]
    x = keys[row_ok]  # [rows, d]: every valid key, group-major, in the keys' dtype
    rows = x.shape[0]
    members = torch.bincount(seg, minlength=groups * par_max)  # [G * par_max]
    mean = _segment_sum(x, seg, groups * par_max) / members.clamp_min(1)[:, None].to(x.dtype)
    first = _segment_argbest(((x - mean[seg]) ** 2).sum(-1), seg, groups * par_max, "amin")
    has = members > 0
    first = torch.where(has, first, 0)
    lead = [first]
    min_dist = ((x - x[first[seg]]) ** 2).sum(-1)
    taken = torch.zeros(rows, dtype=torch.bool, device=device)
    taken[first[has]] = True
    r_max = min(leaders, int(members.max())) if rows else 1
    for r in range(1, r_max):  # farthest first among the members not yet leaders
        score = torch.where(taken, -math.inf, min_dist)
        best = _segment_argbest(score, seg, groups * par_max, "amax")
        nxt = torch.where(members > r, best, first)
        lead.append(nxt)
        taken[nxt[members > r]] = True
        min_dist = torch.minimum(min_dist, ((x - x[nxt[seg]]) ** 2).sum(-1))
    lead_idx = torch.stack(lead, dim=1)  # [G * par_max, R]: flat row of each leader
    lead_ok = torch.arange(r_max, device=device)[None, :] < members.clamp_max(r_max)[:, None]
    to_lead = torch.stack([((x - x[lead_idx[seg, r]]) ** 2).sum(-1) for r in range(r_max)], 1)
    join = torch.where(lead_ok[seg], to_lead, math.inf).argmin(dim=1)
    for r in range(r_max):  # every leader is a member of its own team (ties, duplicate keys)
        join[lead_idx[:, r][lead_ok[:, r]]] = r
    n_lead = lead_ok.sum(dim=1).view(groups, par_max)
    offset = (torch.cumsum(n_lead, dim=1) - n_lead).view(-1)  # first team id of each parent
    team_flat = offset[seg] + join
    team_of = torch.full((groups, n_max), -1, dtype=torch.int64, device=device)
    team_of[row_ok] = team_flat
    # leader rows, as positions within their group, in team-id order
    row_start = torch.cumsum(count_t, 0) - count_t  # flat index of each group's row 0
    n_teams = n_lead.sum(dim=1)
    t_max = max(1, int(n_teams.max()))
    leader_pos = torch.full((groups, t_max), -1, dtype=torch.int64, device=device)
    group_of_parent = torch.arange(groups, device=device).repeat_interleave(par_max)
    for r in range(r_max):
        ok = lead_ok[:, r]
        g = group_of_parent[ok]
        leader_pos[g, offset[ok] + r] = lead_idx[ok, r] - row_start[g]
    return team_of, leader_pos


def _pack(
    policy: str,
    team_size: int,
    leaders: int,
    representative: str,
    seed: int,
    sink: int,
    exact_recent: int,
    team_of: torch.Tensor,
    lead: list[list[torch.Tensor | None]],
    keys: torch.Tensor,
    lengths: torch.Tensor,
    team_end: torch.Tensor,
) -> TeamIndex:
    """Packs per-token team ids into padded member lists, sizes and representatives."""
    batch, hkv, _ = team_of.shape
    d = keys.shape[-1]
    counts = [
        torch.bincount(team_of[b, h][team_of[b, h] >= 0]) for b in range(batch) for h in range(hkv)
    ]
    t_max = max([1] + [c.numel() for c in counts])
    l_max = max([1] + [int(c.max()) for c in counts if c.numel()])
    members = torch.full((batch, hkv, t_max, l_max), -1, dtype=torch.int64)
    sizes = torch.zeros((batch, hkv, t_max), dtype=torch.int64)
    lead_out = torch.full((batch, hkv, t_max), -1, dtype=torch.int64)
    rep_pos = torch.full((batch, hkv, t_max), -1, dtype=torch.int64)
    rep_keys = torch.zeros((batch, hkv, t_max, d), dtype=_INDEX_DTYPE)
    for b in range(batch):
        for h in range(hkv):
            ids = team_of[b, h]
            pos = torch.nonzero(ids >= 0).flatten()
            if pos.numel() == 0:
                continue
            tid = ids[pos]
            n_t = int(tid.max()) + 1
            cnt = torch.bincount(tid, minlength=n_t)
            order = torch.argsort(tid, stable=True)  # positions ascending within a team
            slot = torch.arange(pos.numel()) - (torch.cumsum(cnt, 0) - cnt)[tid[order]]
            members[b, h, tid[order], slot] = pos[order]
            sizes[b, h, :n_t] = cnt
            keys_bh = keys[b, :, h].cpu()
            k = keys_bh[pos]
            mean = _segment_sum(k, tid, n_t) / cnt[:, None].to(_INDEX_DTYPE)
            dist = ((k - mean[tid]) ** 2).sum(-1)
            nearest = pos[_segment_argbest(dist, tid, n_t, "amin")]  # lowest position on ties
            given = lead[b][h]
            lead_out[b, h, :n_t] = (
                nearest if given is None else torch.where(given >= 0, given, nearest)
            )
            if representative == "leader":
                rep_pos[b, h, :n_t] = nearest
                rep_keys[b, h, :n_t] = keys_bh[nearest]
            else:
                rep_keys[b, h, :n_t] = mean
    return TeamIndex(
        policy=policy,
        team_size=team_size,
        leaders_per_parent=leaders,
        representative=representative,
        seed=seed,
        sink=sink,
        exact_recent=exact_recent,
        team_of=team_of,
        members=members,
        sizes=sizes,
        team_valid=sizes > 0,
        leaders=lead_out,
        rep_pos=rep_pos,
        rep_keys=rep_keys,
        length=lengths.clone(),
        team_end=team_end,
    )


# ------------------------------------------------------------------ selection
def _gumbel_noise(
    phi: torch.Tensor, generator: torch.Generator | None, gumbels: torch.Tensor | None
) -> torch.Tensor:
    """Standard Gumbel noise of ``phi``'s shape and dtype (``gumbels`` where given)."""
    if gumbels is not None:
        if tuple(gumbels.shape) != tuple(phi.shape):
            raise InputError(
                f"gumbels: expected shape {tuple(phi.shape)}, got {tuple(gumbels.shape)}"
            )
        gumbel = gumbels.to(device=phi.device, dtype=torch.float64)
    else:
        u = torch.rand(phi.shape, generator=generator, dtype=torch.float64).to(phi.device)
        gumbel = -torch.log(-torch.log(u.clamp(min=1e-300, max=1 - 2**-53)))
    return gumbel.to(phi.dtype)


def gumbel_topk_select(
    phi: torch.Tensor,
    M: int,
    generator: torch.Generator | None,
    gumbels: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(selected, pi)`` for logits ``phi [..., T]`` (-inf: no team).

    ``z = phi + Gumbel``; the top ``M`` are selected; ``pi_g = 1 - exp(-exp(phi_g - kappa))``
    with ``kappa`` the ``(M+1)``-th largest ``z`` (``pi = 1`` where a row has at most ``M``
    teams): the inclusion probability of ``g`` given the other teams' ``z``; ``pi`` is 0 where not
    selected. ``E[1{g selected} / pi_g] = 1`` for every team (section 6). ``gumbels`` (shape
    of ``phi``) replaces the drawn noise, so a kernel can be checked on the same draw.
    """
    z = phi + _gumbel_noise(phi, generator, gumbels)
    n_teams = torch.isfinite(phi).sum(dim=-1, keepdim=True)
    k = min(M + 1, phi.shape[-1])
    top = torch.topk(z, k, dim=-1)
    selected = torch.zeros_like(phi, dtype=torch.bool).scatter(-1, top.indices[..., :M], True)
    selected &= torch.isfinite(phi)
    everything = n_teams <= M
    kappa = top.values[..., -1:] if k > M else torch.full_like(z[..., :1], -math.inf)
    kappa = torch.where(everything, torch.full_like(kappa, -math.inf), kappa)
    pi = -torch.expm1(-torch.exp(phi - kappa))
    pi = torch.where(everything, torch.ones_like(pi), pi)
    return selected, torch.where(selected, pi, torch.zeros_like(pi))


def _mixed_log_probs(phi: torch.Tensor, mix: float) -> torch.Tensor:
    """``log((1 - mix) softmax(phi) + mix / n)`` over the finite entries of ``phi``."""
    if mix == 0:
        return phi
    n = torch.isfinite(phi).sum(dim=-1, keepdim=True).to(phi.dtype)
    p = (1 - mix) * torch.softmax(phi, dim=-1) + mix / n
    return torch.where(torch.isfinite(phi), p.log(), phi)


def _by_group(x: torch.Tensor, group: int) -> torch.Tensor:
    """``[B, Hq, T]`` -> ``[B, Hkv, group, T]`` (the query heads of each KV head)."""
    return x.reshape(x.shape[0], -1, group, x.shape[-1])


def _multinomial_counts(log_p: torch.Tensor, M: int, gen: torch.Generator | None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(probs, counts)``: ``M`` draws with replacement per row of ``softmax(log_p)``."""
    probs = torch.softmax(log_p, dim=-1)
    flat = probs.reshape(-1, probs.shape[-1]).to(device="cpu", dtype=torch.float64)
    draws = torch.multinomial(flat, M, replacement=True, generator=gen)
    ones = torch.ones_like(draws, dtype=flat.dtype)
    counts = torch.zeros_like(flat).scatter_add_(1, draws, ones)
    return probs, counts.reshape(probs.shape).to(device=log_p.device, dtype=log_p.dtype)


def _pooled_log_probs(log_p: torch.Tensor, group: int) -> torch.Tensor:
    """``log p_g`` per KV head, ``p_g`` the mean over its query heads of each head's
    (mixed) probabilities ``softmax(log_p)``: ``[B, Hq, T]`` -> ``[B, Hkv, T]``."""
    finite = torch.isfinite(log_p)
    own = torch.where(finite, torch.log_softmax(log_p, dim=-1), -math.inf)
    return torch.logsumexp(_by_group(own, group), dim=2) - math.log(group)


def _union_gumbel_pi(log_p: torch.Tensor, M: int, group: int, gen: torch.Generator | None,
                     gumbels: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every head's own Gumbel top-``M`` draw; returns the group's union ``[B, Hkv, T]``
    and its inclusion probability ``pi^U_g = 1 - prod_h (1 - pi_{h,g})`` (0 off the union),
    ``pi_{h,g} = 1 - exp(-exp(log p_{h,g} - kappa_{h,g}))`` with ``kappa_{h,g}`` the
    ``M``-th largest perturbed logit of head ``h``'s other teams (the heads draw
    independently, so ``E[1{g in U} / pi^U_g] = 1``)."""
    z = log_p + _gumbel_noise(log_p, gen, gumbels)
    n_teams = torch.isfinite(log_p).sum(dim=-1, keepdim=True)
    everything = n_teams <= M  # [B, Hq, 1]: every team selected, pi = 1
    if log_p.shape[-1] <= M:
        selected = torch.isfinite(log_p)
        pi = torch.ones_like(log_p)
    else:
        top = torch.topk(z, M + 1, dim=-1)
        selected = torch.zeros_like(z, dtype=torch.bool).scatter(-1, top.indices[..., :M], True)
        selected &= torch.isfinite(log_p)
        # the M-th largest of the others: the (M+1)-th if g is in the top M, else the M-th
        kappa = torch.where(selected, top.values[..., M:], top.values[..., M - 1 : M])
        rate = torch.exp(log_p - kappa)
        rate = torch.where(everything, math.inf, rate)
        pi = -torch.expm1(-_by_group(rate, group).sum(dim=2))
    union = _by_group(selected, group).any(dim=2)
    if pi.shape != union.shape:
        pi = _by_group(pi, group)[:, :, 0]
    return union, torch.where(union, pi, torch.zeros_like(pi))


def _select_teams(log_p: torch.Tensor, M: int, scheme: str, draw: str, group: int,
                  gen: torch.Generator | None, gumbels: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(selected, team_w)``, both ``[B, Hq, T]``: the teams each query head weights and
    their HT/HH weights, for ``log_p [B, Hq, T]`` (``draw``: see :data:`DRAWS`)."""
    if draw == "pooled":
        pooled = _pooled_log_probs(log_p, group)  # [B, Hkv, T]
        if scheme == "gumbel-topk":
            selected, pi = gumbel_topk_select(pooled, M, gen, gumbels)
            team_w = torch.where(selected, 1 / torch.where(selected, pi, 1), 0)
        else:
            probs, counts = _multinomial_counts(pooled, M, gen)
            selected = counts > 0
            team_w = torch.where(selected, counts / (M * probs), 0)
        return selected.repeat_interleave(group, 1), team_w.repeat_interleave(group, 1)
    if draw == "union":
        if scheme == "gumbel-topk":
            union, pi = _union_gumbel_pi(log_p, M, group, gen, gumbels)
        else:
            probs, counts = _multinomial_counts(log_p, M, gen)
            union = _by_group(counts > 0, group).any(dim=2)
            # P(a head draws g at least once) = 1 - (1 - p)^M, the heads independent
            missed = M * torch.log1p(-probs.clamp_max(1.0))
            pi = torch.where(union, -torch.expm1(_by_group(missed, group).sum(dim=2)), 0)
        team_w = torch.where(union, 1 / torch.where(union, pi, 1), 0)
        return union.repeat_interleave(group, 1), team_w.repeat_interleave(group, 1)
    if scheme == "gumbel-topk":
        selected, pi = gumbel_topk_select(log_p, M, gen, gumbels)
        return selected, torch.where(selected, 1 / torch.where(selected, pi, 1), 0)
    probs, counts = _multinomial_counts(log_p, M, gen)
    selected = counts > 0
    return selected, torch.where(selected, counts / (M * probs), 0)


# ------------------------------------------------------------------ decode
def santapp_attention(
    q: torch.Tensor,
    kv: KVCache,
    index: TeamIndex,
    M: int,
    *,
    scheme: str = "gumbel-topk",
    mix: float = 0.0,
    sink: int = DEFAULT_SINK,
    window: int = DEFAULT_WINDOW,
    scale: float | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    compute_dtype: torch.dtype = torch.float32,
    gumbels: torch.Tensor | None = None,
    draw: str = "head",
) -> SantaPPOutput:
    """One SANTA++ decode step for ``q [B, Hq, d]`` over ``kv`` and its ``index`` (section 6).

    Every query head scores the representatives (``phi_g = tau q.r_g + log n_g``), selects
    ``M`` teams by ``scheme`` from ``(1 - mix) softmax(phi) + mix / n_teams`` (gumbel-topk:
    every team, ``pi = 1``, where a (sequence, KV head) has ``M`` or fewer; the Gumbel
    trick on the log of the mixed probabilities; weights ``1/pi_g``;
    multinomial: ``M`` draws, weights ``c_g / (M p_g)``), and returns
    ``num / den`` with ``num = sum_sel w_g sum_{i in g \\ E} e^{s_i-m} v_i +
    sum_{j in E} e^{s_j-m} v_j`` (``den`` likewise). ``E``: tokens in no team, the first
    ``sink`` and the last ``window`` tokens (masked out of their teams' sums).
    ``gumbels [B, Hq, T]`` (gumbel-topk only; ``[B, Hkv, T]`` with ``draw=pooled``)
    replaces the drawn Gumbel noise.

    ``draw`` (how a GQA group's query heads draw): ``head``, each its own ``M`` teams,
    weighted by its own ``pi_{h,g}``; ``pooled``, one draw of ``M`` teams per (sequence, KV
    head) from ``p_g = mean_h p_{h,g}`` (the heads' mixed probabilities), every head
    weighting the same teams by the shared ``pi_g`` (``M`` teams read a KV head);
    ``union``, each head its own draw, every head weighting the group's union of teams by
    ``pi^U_g = 1 - prod_h (1 - pi_{h,g})`` (``head``'s reads). Multinomial: ``pooled`` is
    Hansen-Hurwitz on ``p_g``; ``union`` HT with ``pi_{h,g} = 1 - (1 - p_{h,g})^M``.
    """
    kv = _check_kv(kv)
    group = check_query(q, kv.batch, kv.num_kv_heads, kv.head_dim)
    _check_index(index, kv)
    check_positive_int(M, "M")
    _check_choice(scheme, "scheme", SCHEMES)
    _check_choice(draw, "draw", DRAWS)
    if isinstance(mix, bool) or not isinstance(mix, (int, float)) or not 0 <= mix < 1:
        raise InputError(f"mix: expected a number in [0, 1), got {mix!r}")
    _check_count(sink, "sink")
    _check_count(window, "window")
    if compute_dtype not in COMPUTE_DTYPES:
        raise InputError(f"compute_dtype: expected float32 or float64, got {compute_dtype}")
    tau = check_scale(scale, kv.head_dim)
    gen = make_generator(seed, generator)
    device = kv.device

    keys, values, valid = kv.padded(compute_dtype)
    batch, n_max, hkv, d = keys.shape
    hq = q.shape[1]
    query = q.to(compute_dtype)
    head_kv = torch.arange(hq, device=device) // group
    # per KV head, its group's queries at once (no copy of K or V per query head)
    grouped = query.reshape(batch, hkv, group, d)
    scores = tau * torch.einsum("bkgd,bnkd->bkgn", grouped, keys).reshape(batch, hq, n_max)

    # team of every token per query head (-1: none), exact set E per KV head
    team_of = torch.full((batch, hkv, n_max), -1, dtype=torch.int64)
    width = min(n_max, index.team_of.shape[2])
    team_of[:, :, :width] = index.team_of[:, :, :width]
    team_of = team_of.to(device)
    pos = torch.arange(n_max, device=device)
    lengths = kv.lengths.to(device)
    forced = (pos[None, :] < sink) | (pos[None, :] >= lengths[:, None] - window)
    exact = valid[:, None, :] & ((team_of < 0) | forced[:, None, :])  # [B, Hkv, N]
    in_team = valid[:, None, :] & (team_of >= 0) & ~forced[:, None, :]

    # team logits and selection per query head
    rep = index.rep_keys.to(device=device, dtype=compute_dtype)[:, head_kv]  # [B, Hq, T, d]
    team_valid = index.team_valid.to(device)[:, head_kv]
    log_n = index.sizes.to(device=device, dtype=compute_dtype).clamp_min(1).log()[:, head_kv]
    phi = tau * torch.einsum("bhd,bhtd->bht", query, rep) + log_n
    phi = torch.where(team_valid, phi, torch.full_like(phi, -math.inf))
    log_p = _mixed_log_probs(phi, float(mix))
    if gumbels is not None and scheme != "gumbel-topk":
        raise InputError(f"gumbels: only for scheme 'gumbel-topk', got {scheme!r}")
    selected, team_w = _select_teams(log_p, M, scheme, draw, group, gen, gumbels)

    # token weights: HT/HH weight of the token's team, 1 on E, 0 elsewhere
    tok_team = team_of[:, head_kv]  # [B, Hq, N]
    gathered = torch.gather(team_w, 2, tok_team.clamp_min(0))
    token_w = torch.where(in_team[:, head_kv], gathered, 0)
    token_w = torch.where(exact[:, head_kv], 1, token_w).to(compute_dtype)
    read = token_w > 0
    shift = torch.where(read, scores, -math.inf).amax(dim=-1)  # the largest score read
    unnorm = token_w * torch.exp(torch.where(read, scores - shift[..., None], -math.inf))
    den = unnorm.sum(dim=-1)
    num = torch.einsum("bkgn,bnkd->bkgd", unnorm.reshape(batch, hkv, group, n_max), values)
    num = num.reshape(batch, hq, d)
    out = num / den[..., None]
    weights = unnorm / den[..., None]

    # reads: members of the group's selected teams (all of them) + exact rows, GQA union
    sel_group = selected.reshape(batch, hkv, group, -1).any(dim=2)  # [B, Hkv, T]
    member_sel = torch.gather(sel_group, 2, team_of.clamp_min(0)) & (team_of >= 0)
    rows = ((member_sel & valid[:, None, :]) | exact).sum(dim=-1).long().cpu()
    reads = ReadCounts(
        k_rows=rows,
        k_features=rows * d,
        v_rows=rows.clone(),
        context=kv.lengths.cpu(),
        head_dim=d,
    )
    return SantaPPOutput(
        out=out,
        reads=reads,
        weights=weights,
        representatives_read=index.num_teams.clone(),
        num=num,
        den=den,
        shift=shift,
        team_weights=team_w,
    )


REPS_FORMATS = ("model", "int8")


def quantize_reps(reps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8 of representatives ``[..., d]``: ``(codes int8 [..., d],
    scale fp32 [...])`` with ``scale = max |r| / 127`` (1 for a zero row) and ``codes =
    round(r / scale)``, all in fp32 (the kernel's index and the reference agree bit for
    bit). The estimator stays unbiased with any representative: the selection and the
    inclusion probabilities both use the same ``phi`` (docs/algorithms.md section 6)."""
    r = reps.float()
    amax = r.abs().amax(dim=-1)
    # a tensor divisor: CUDA divides by a Python scalar as a product with its reciprocal,
    # which rounds differently from the CPU's division (then a code can flip at .5)
    scale = torch.where(amax > 0, amax / torch.full_like(amax, 127.0), torch.ones_like(amax))
    codes = torch.round(r / scale[..., None]).clamp(-127, 127).to(torch.int8)
    return codes, scale


def dequantize_reps(codes: torch.Tensor, scale: torch.Tensor,
                    dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The representatives ``codes * scale`` that :func:`quantize_reps` stands for."""
    return codes.to(dtype) * scale.to(dtype)[..., None]


def with_reps_format(index: TeamIndex, reps: str, dtype: torch.dtype) -> TeamIndex:
    """``index`` with its representatives as the kernel stores them: ``model`` (rounded to
    the cache ``dtype``: unchanged here, the estimator rounds at use) or ``int8`` (rounded
    to ``dtype``, then :func:`quantize_reps`)."""
    if reps not in REPS_FORMATS:
        raise InputError(f"reps: expected one of {REPS_FORMATS}, got {reps!r}")
    if reps == "model":
        return index
    codes, scale = quantize_reps(index.rep_keys.to(dtype))
    return dataclasses.replace(index, rep_keys=dequantize_reps(codes, scale, _INDEX_DTYPE))


def santapp(
    q: torch.Tensor,
    kv: KVCache,
    *,
    M: int = DEFAULT_M,
    team_size: int = 16,
    leaders: int = 4,
    policy: str = "contiguous",
    representative: str = "mean",
    scheme: str = "gumbel-topk",
    mix: float = 0.0,
    sink: int = DEFAULT_SINK,
    window: int = DEFAULT_WINDOW,
    index_seed: int = 0,
    reps: str = "model",
    merge: str = "auto",
    **kw: object,
) -> SantaPPOutput:
    """Builds the index (``sink`` and ``window`` tokens left out of the teams) and decodes
    one step (section 6); ``kw`` goes to :func:`santapp_attention` (seed, scale, ...).
    ``reps``: the representatives as the kernel stores them (:func:`with_reps_format`);
    ``merge``: the kernel's (how its partials combine), nothing here."""
    del merge
    index = build_team_index(
        kv,
        policy=policy,
        team_size=team_size,
        leaders=leaders,
        representative=representative,
        seed=index_seed,
        exact_recent=window,
        sink=sink,
    )
    index = with_reps_format(index, reps, kv.dtype)
    return santapp_attention(
        q,
        kv,
        index,
        M,
        scheme=scheme,
        mix=mix,
        sink=sink,
        window=window,
        **kw,  # type: ignore[arg-type]
    )


__all__ = [
    "DRAWS",
    "KERNEL_DRAWS",
    "POLICIES",
    "REPRESENTATIVES",
    "REPS_FORMATS",
    "SCHEMES",
    "SantaPPOutput",
    "TeamIndex",
    "build_team_index",
    "dequantize_reps",
    "extend",
    "gumbel_topk_select",
    "kmeans_groups",
    "kmeans_team_ids",
    "quantize_reps",
    "santapp",
    "santapp_attention",
    "with_reps_format",
]
