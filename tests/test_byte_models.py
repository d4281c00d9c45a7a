"""Each fast path's byte model against the loads its kernel issues (Triton's interpreter).

The poison check: run the kernel once and take its read set (the rows it sampled or
selected, as the kernel or its selection reports them), set every K/V row outside that
set to NaN (and every row past a sequence's length), run again on the same random
numbers: a kernel that loads an uncounted row turns its output NaN, so an output that
stays finite and equal shows the kernel reads no row outside the set. The byte model
(:meth:`Method.bytes_read` of the prepared call's ``reads()``) must then count at least
that set: every K element of a method whose score pass reads all of K, the set's V rows
(their union over the GQA group), and the logit stash where the kernel keeps one. A
masked load that the kernel discards unused is not seen by the poison; the counts of
what it cannot observe (the stash, the representatives) are checked by construction.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import dataclasses
import importlib

import pytest
import torch

import santa_kernels as sk
from santa_bench.methods import REGISTRY
from santa_bench.methods import selection as selection_methods
from santa_bench.methods._common import STASH_DTYPES
from santa_bench.methods.santa import santa_kernel
from santa_kernels.reads import ReadCounts
from santa_kernels.triton_indexed import indexed_attention
from santa_kernels.triton_santa import santa_triton_available

pytestmark = [
    pytest.mark.skipif(not santa_triton_available()[0], reason="no Triton backend"),
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET", "0") != "1" and torch.cuda.is_available(),
        reason="CPU tensors: run with TRITON_INTERPRET=1",
    ),
]

BATCH, HQ, HKV, D, N = 2, 4, 2, 16, 96
LENGTHS = (96, 61)
SEED = 7


def make_inputs(seed: int = 0, dtype: torch.dtype = torch.float32
                ) -> tuple[torch.Tensor, sk.KVCache]:
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(BATCH, HQ, D, generator=gen) * 2.0).to(dtype)
    k = torch.randn(BATCH, N, HKV, D, generator=gen).to(dtype)
    v = torch.randn(BATCH, N, HKV, D, generator=gen).to(dtype)
    return q, sk.KVCache.contiguous(k, v, torch.tensor(LENGTHS))


def valid_rows(kv: sk.KVCache) -> torch.Tensor:
    """``[B, Hkv, N]`` bool: the rows before each sequence's length."""
    valid = torch.arange(N)[None, :] < kv.lengths.long()[:, None]
    return valid[:, None, :].expand(-1, HKV, -1)


def rows_of(index: torch.Tensor, kv: sk.KVCache) -> torch.Tensor:
    """``[B, Hkv, N]`` bool of the token ids ``index [B, Hkv, R]`` (-1: none), valid only."""
    index = index.long()
    mask = torch.zeros(BATCH, HKV, N + 1, dtype=torch.bool)
    mask.scatter_(2, torch.where(index >= 0, index, N).clamp(max=N), True)
    return mask[..., :N] & valid_rows(kv)


def group_rows(counts: torch.Tensor) -> torch.Tensor:
    """``[B, Hkv, N]`` bool: rows any head of the group sampled (``counts [B, Hq, N]``)."""
    return (counts > 0).reshape(BATCH, HKV, HQ // HKV, -1).any(2)[..., :N]


def poisoned(kv: sk.KVCache, keep_k: torch.Tensor, keep_v: torch.Tensor) -> sk.KVCache:
    """A copy of ``kv`` with NaN in every K row outside ``keep_k`` and V row outside
    ``keep_v`` (``[B, Hkv, N]`` bool); written after the cache's own finiteness check."""
    dirty = sk.KVCache.contiguous(kv.k.clone(), kv.v.clone(), kv.lengths.clone())
    dirty.k[~keep_k.permute(0, 2, 1)] = float("nan")
    dirty.v[~keep_v.permute(0, 2, 1)] = float("nan")
    return dirty


def assert_same(clean: torch.Tensor, dirty: torch.Tensor) -> None:
    assert torch.isfinite(dirty).all(), "the kernel read a row outside its counted set"
    assert torch.equal(clean, dirty)


def assert_counts_cover(reads: ReadCounts, keep_k: torch.Tensor, keep_v: torch.Tensor,
                        all_k: bool) -> None:
    """The read counts hold the observed set: its V rows exactly, and every K element
    (``all_k``) or its K rows."""
    assert torch.equal(reads.v_rows, keep_v.sum(-1))
    k_rows = valid_rows_count(reads) if all_k else keep_k.sum(-1)
    assert (reads.k_features >= k_rows * D).all()


def valid_rows_count(reads: ReadCounts) -> torch.Tensor:
    return reads.context[:, None].expand(-1, HKV)


# ------------------------------------------------------------------ SANTA, S2ANTA
def tile_of(method) -> dict:
    """A small tile where the method takes one (the others run their kernel's 64)."""
    return {"tile": 16} if any(p.name == "tile" for p in method.params) else {}


F32, BF16 = torch.float32, torch.bfloat16
SANTA = [("santa-iid", {}, F32), ("santa-strat", {}, F32), ("santa-sys", {}, F32),
         ("santa-prop", {}, F32), ("santa-prop", {}, BF16),
         ("santa-prop", {"alloc": "largest-remainder", "stash": "bf16"}, F32),
         ("santa-flash", {}, F32), ("santa-flash", {}, BF16)]


@pytest.mark.parametrize(("name", "extra", "dtype"), SANTA)
def test_santa_reads_no_value_row_it_does_not_count(name, extra, dtype):
    """All of K (the score pass) and the group's sampled V rows: the kernel's own sample
    indices (flash: its per-row counts) are the read set; V rows outside it are NaN."""
    method = REGISTRY.get(name)
    params = method.resolve_params({"S": 16, **tile_of(method), **extra})
    tile = params.get("tile", 64)
    q, kv = make_inputs(dtype=dtype)
    prepared = method.prepare(q, kv, seed=SEED, **params)
    prepared.reset_rng(0)
    reads = prepared.reads()

    function = name.replace("-", "_")
    stash = {"stash_dtype": STASH_DTYPES[params.get("stash", "fp32")]}
    kernel, workspace = santa_kernel(function, q, kv, 16, tile, seed=SEED, **stash)
    kwargs = {"tile": tile, "workspace": workspace}
    if function != "santa_flash":
        kwargs.update(stash)
    if "alloc" in params:
        kwargs["alloc"] = params["alloc"]
    extra_out = {"return_counts": True} if function == "santa_flash" else {}
    workspace.reset_rng(0)
    clean, info = kernel(q, kv, 16, **kwargs, **extra_out)
    clean = clean.clone()
    keep_v = group_rows(info.row_counts()) & valid_rows(kv)
    keep_k = valid_rows(kv)
    workspace.reset_rng(0)
    dirty, _ = kernel(q, poisoned(kv, keep_k, keep_v), 16, **kwargs)
    assert_same(clean, dirty)
    assert 0 < int(keep_v.sum()) < int(keep_k.sum())  # the poison reaches some valid rows
    assert_counts_cover(reads, keep_k, keep_v, all_k=True)
    assert method.bytes_read(reads, q.element_size(), HQ, params) >= (
        int(keep_k.sum()) + int(keep_v.sum())) * D * q.element_size()


@pytest.mark.parametrize("stash", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("name", ["santa-iid", "santa-strat", "santa-sys", "santa-prop"])
def test_santa_stash_bytes_are_one_write_and_one_read_of_every_logit(name, stash):
    """By construction: the score pass writes each valid (query head, token) logit to the
    stash once at the stash's dtype and the sample pass reads it back once (the
    interpreter does not expose the stash's loads)."""
    method = REGISTRY.get(name)
    params = method.resolve_params({"S": 16, **tile_of(method), "stash": stash})
    q, kv = make_inputs()
    _, workspace = santa_kernel(name.replace("-", "_"), q, kv, 16, params.get("tile", 64),
                                seed=SEED, stash_dtype=STASH_DTYPES[stash])
    reads = method.prepare(q, kv, seed=SEED, **params).reads()
    stash_bytes = method.bytes_read(reads, q.element_size(), HQ, params) - reads.kv_bytes(
        q.element_size())
    assert stash_bytes == 2 * workspace.stash.element_size() * HQ * sum(LENGTHS)


# ------------------------------------------------------------------ Bernoulli
@pytest.mark.parametrize("value_stage", ["prop", "flash", "dense"])
def test_bernoulli_reads_no_value_row_it_does_not_count(value_stage):
    """Its score pass reads every K feature; the value stage's sampled V rows (dense:
    every row) are the read set."""
    method = REGISTRY.get("bernoulli")
    params = method.resolve_params({"S": 16, "tile": 16, "value_stage": value_stage})
    q, kv = make_inputs()
    prepared = method.prepare(q, kv, seed=SEED, **params)
    call = prepared.reset_rng.__self__  # the prepared BernoulliDecode
    call.reset_rng(0)
    clean, info, _ = call(q, kv, info=True)
    clean = clean.clone()
    keep_k = valid_rows(kv)
    keep_v = keep_k if info is None else group_rows(info.row_counts()) & keep_k
    call.reset_rng(0)
    assert_same(clean, call(q, poisoned(kv, keep_k, keep_v)))
    call.reset_rng(0)
    assert_counts_cover(prepared.reads(), keep_k, keep_v, all_k=True)


@pytest.mark.parametrize(("value_stage", "stash", "size"),
                         [("prop", None, 2), ("sys", "fp32", 4), ("flash", None, 0),
                          ("dense", None, 0)])
def test_bernoulli_counts_its_value_stage_stash(value_stage, stash, size):
    """By construction: a stash value stage (prop, sys, strat, iid) writes and reads back
    every logit at the stash dtype (fp16 unless named), as the SANTA methods count it."""
    method = REGISTRY.get("bernoulli")
    overrides = {"S": 16, "tile": 16, "value_stage": value_stage}
    if stash:
        overrides["stash"] = stash
    params = method.resolve_params(overrides)
    q, kv = make_inputs()
    prepared = method.prepare(q, kv, seed=SEED, **params)
    call = prepared.reset_rng.__self__
    reads = prepared.reads()
    extra = method.bytes_read(reads, q.element_size(), HQ, params) - reads.kv_bytes(
        q.element_size())
    if size:
        assert call.value_ws.stash.element_size() == size
    assert extra == 2 * size * HQ * sum(LENGTHS)


# ------------------------------------------------------------------ selection methods
def _step(name: str, params: dict, q: torch.Tensor, kv: sk.KVCache):
    build = {"oracle-topk": selection_methods._oracle_step,
             "quest": selection_methods._quest_step,
             "vattention": selection_methods._vattention_step,
             "topk-santa": selection_methods._topk_santa_step}[name]
    step = build(q, kv, params, None, SEED)
    if hasattr(step, "build"):
        step.build(kv)
    return step


@pytest.mark.parametrize(("shared", "dtype"), [("group", F32), ("head", F32), ("group", BF16)])
def test_oracle_topk_reads_no_value_row_it_does_not_count(shared, dtype):
    """All of K (the scores); the selected rows' V (``select``)."""
    params = REGISTRY.get("oracle-topk").resolve_params({"k": 12, "shared": shared})
    q, kv = make_inputs(dtype=dtype)
    step = _step("oracle-topk", params, q, kv)
    keep_k = valid_rows(kv)
    keep_v = rows_of(step.select(q, kv), kv)
    clean = step(q, kv).clone()
    assert_same(clean, step(q, poisoned(kv, keep_k, keep_v)))
    assert_counts_cover(step.read_counts(q, kv), keep_k, keep_v, all_k=True)


@pytest.mark.parametrize(("shared", "dtype"), [("group", F32), ("head", F32), ("group", BF16)])
def test_quest_reads_no_row_outside_its_pages(shared, dtype):
    """The chosen pages' K and V rows (``select``); the page bounds, built before, are
    counted by construction at their fp32 size."""
    method = REGISTRY.get("quest")
    params = method.resolve_params({"page": 8, "pages": 3, "shared": shared})
    q, kv = make_inputs(dtype=dtype)
    step = _step("quest", params, q, kv)
    pages = step.select(q, kv).long()
    tokens = pages[..., None] * 8 + torch.arange(8)
    keep = rows_of(torch.where(pages[..., None] >= 0, tokens, -1).flatten(2), kv)
    clean = step(q, kv).clone()
    assert_same(clean, step(q, poisoned(kv, keep, keep)))
    reads = step.read_counts(q, kv)
    assert_counts_cover(reads, keep, keep, all_k=False)
    used = (kv.lengths.long() + 7) // 8
    bounds = used[:, None] * 2 * D * step.bounds[0].element_size()
    rows = keep.sum(-1) * D * q.element_size()
    assert torch.equal(reads.k_features * q.element_size(), rows + bounds)


def test_vattention_reads_no_value_row_it_does_not_count():
    """All of K; the listed rows (sink, window, top-k) and the uniform tail the indexed
    kernel draws (its ``samples`` output)."""
    params = REGISTRY.get("vattention").resolve_params(
        {"sink": 4, "window": 8, "topk": 8, "base_rate": 0.2})
    q, kv = make_inputs()
    step = _step("vattention", params, q, kv)
    step.reset_rng(0)
    listed, tail = step.plan(q, kv)
    samples = torch.full((BATCH * HKV, step.capacity), -1, dtype=torch.int32)
    clean = indexed_attention(q, kv, listed, tail=tail, scale=step.scale,
                              workspace=step.workspace, samples=samples).clone()
    drawn = samples.view(BATCH, HKV, -1)
    keep_k = valid_rows(kv)
    keep_v = rows_of(torch.cat([listed.long(), drawn.long()], -1), kv)
    assert int(drawn.ge(0).sum()) > 0  # the tail is drawn
    step.reset_rng(0)
    assert_same(clean, step(q, poisoned(kv, keep_k, keep_v)))
    step.reset_rng(0)
    assert_counts_cover(step.read_counts(q, kv), keep_k, keep_v, all_k=True)


def test_topk_santa_reads_no_value_row_it_does_not_count():
    """All of K; the top-k rows and the samples of non-zero weight (``plan``)."""
    params = REGISTRY.get("topk-santa").resolve_params({"k": 6, "S": 8})
    q, kv = make_inputs()
    step = _step("topk-santa", params, q, kv)
    step.reset_rng(0)
    rows = step.plan(q, kv).long()
    live = (step.log_weights.view(BATCH, HKV, HQ // HKV, -1) > float("-inf")).any(2)
    keep_k = valid_rows(kv)
    keep_v = rows_of(torch.where(live, rows, -1), kv)
    clean = indexed_attention(q, kv, rows.int(), log_weights=step.log_weights,
                              scale=step.scale, workspace=step.workspace).clone()
    step.reset_rng(0)
    assert_same(clean, step(q, poisoned(kv, keep_k, keep_v)))
    step.reset_rng(0)
    assert_counts_cover(step.read_counts(q, kv), keep_k, keep_v, all_k=True)


# ------------------------------------------------------------------ SANTA++
@pytest.mark.parametrize(("policy", "reps"),
                         [("contiguous", "model"), ("contiguous", "int8"), ("kmeans", "model")])
def test_santapp_reads_no_row_outside_its_teams_and_exact_set(policy, reps):
    """The K and V rows of the teams the group's union holds (``info.members()``; from
    the cache, or k-means' team-major packed copy) and of the exact set (the sink and the
    tail after the teams, from the cache); the representatives are checked by
    construction: ``bytes_read_tables`` is the packed tables' bytes."""
    method = REGISTRY.get("santapp")
    params = method.resolve_params({"M": 3, "team_size": 8, "leaders": 2, "sink": 4,
                                    "window": 8, "policy": policy, "reps": reps})
    q, kv = make_inputs()
    prepared = method.prepare(q, kv, seed=SEED, **params)
    prepared.reset_rng(0)
    reads = prepared.reads()
    workspace = prepared.reset_rng.__self__
    module = importlib.import_module("santa_kernels.triton_santapp")
    packed = module.build_packed(
        kv, policy=policy, team_size=8, leaders=2, representative=params["representative"],
        sink=4, exact_recent=8, reps=reps)
    workspace.reset_rng(0)
    clean, info = module.santapp_decode(q, kv, packed, 3, workspace=workspace)
    clean = clean.clone()
    start, length = packed.team_start.long(), packed.team_len.long()
    span = N if packed.packed_k is None else packed.packed_k.shape[2]
    slots = torch.arange(span)
    inside = (slots >= start[..., None]) & (slots < (start + length)[..., None])
    teams = (inside & info.members()[..., None]).any(2)  # [B, Hkv, span]
    positions = torch.arange(N)
    end = packed.team_end.long()[:, None, None]
    exact = ((positions < torch.minimum(end, torch.tensor(4))) | (positions >= end)
             ) & valid_rows(kv)
    if packed.packed_k is None:  # teams are spans of the cache
        keep, dirty_packed = teams[..., :N] & valid_rows(kv) | exact, packed
        read = int(keep.sum())
    else:  # the cache's exact rows, the packed copy's team spans
        keep = exact
        copy_k, copy_v = packed.packed_k.clone(), packed.packed_v.clone()
        copy_k[~teams], copy_v[~teams] = float("nan"), float("nan")
        dirty_packed = dataclasses.replace(packed, packed_k=copy_k, packed_v=copy_v)
        read = int(keep.sum()) + int(teams.sum())
    assert read < int(valid_rows(kv).sum())  # some teams are left unread
    workspace.reset_rng(0)
    dirty, _ = module.santapp_decode(q, poisoned(kv, keep, keep), dirty_packed, 3,
                                     workspace=workspace)
    assert_same(clean, dirty)
    assert int(reads.v_rows.sum()) == read and int(reads.k_features.sum()) == read * D
    tables = [packed.reps, packed.log_n] + (
        [packed.reps_scale] if packed.reps_scale is not None else [])
    assert prepared.metrics["bytes_read_tables"][0] == sum(
        t.numel() * t.element_size() for t in tables)

@pytest.mark.parametrize(("name", "overrides"), [
    ("oracle-topk", {"k": 12}), ("vattention", {"sink": 4, "window": 8, "topk": 8}),
    ("topk-santa", {"k": 6, "S": 8})])
def test_selection_counts_the_scores_it_writes_and_reads_back(name, overrides):
    """By construction: the score pass writes every valid (query head, token) score to
    the step's fp32 ``scores`` and the selection reads it back (at least once), a logit
    stash as SANTA's; Quest scores pages (its bounds are counted instead)."""
    method = REGISTRY.get(name)
    params = method.resolve_params(overrides)
    q, kv = make_inputs()
    step = _step(name, params, q, kv)
    reads = step.read_counts(q, kv)
    extra = method.bytes_read(reads, q.element_size(), HQ, params) - reads.kv_bytes(
        q.element_size())
    assert extra == 2 * step.scores.element_size() * HQ * sum(LENGTHS)
