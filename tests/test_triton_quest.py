"""Quest's decode step (triton_selection.QuestStep): bounds in the cache dtype, the page
select kernel, the page-block attention (runs under TRITON_INTERPRET=1 on CPU; the same
tests run the compiled kernels on a GPU)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

from functools import partial

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import santa_kernels as sk
from conftest import decode_problem, kv_on
from santa_kernels import selection as sel

ti = pytest.importorskip("santa_kernels.triton_indexed")
ts = pytest.importorskip("santa_kernels.triton_selection")
_OK, _WHY = ti.indexed_available()
if not _OK:
    pytest.skip(f"triton-indexed unavailable: {_WHY}", allow_module_level=True)

DEVICE = "cuda" if _WHY == "cuda" else "cpu"
BF16 = torch.bfloat16

_cpu = partial(kv_on, device="cpu")  # the references run on the CPU


def _problem(batch=2, hkv=2, group=2, n=300, d=16, lengths=(300, 141), q_scale=1.0, seed=0,
             layout="contiguous", dtype=BF16):
    q, kv = decode_problem(batch=batch, heads=hkv * group, kv_heads=hkv, n=n, d=d,
                           q_scale=q_scale, seed=seed, lengths=list(lengths), dtype=dtype)
    kv = sk.KVCache.contiguous(kv.k.to(DEVICE), kv.v.to(DEVICE), kv.lengths.to(DEVICE))
    if layout == "paged":
        kv = kv.to_paged(16, generator=torch.Generator().manual_seed(seed))
    return q.to(DEVICE), kv


def _step(q, kv, **params):
    step = ts.QuestStep(q, kv, **params)
    step.build(kv)
    return step


def _pages(step, q, kv) -> list[set[int]]:
    """Each row's chosen pages (rows: (sequence, KV head) or, per head, query heads)."""
    chosen = step.select(q, kv).cpu().view(-1, step.pages)
    return [{int(p) for p in row if p >= 0} for row in chosen]


def test_quest_bounds_are_the_pages_exact_min_max_in_the_cache_dtype():
    """A page's max and min are keys' values, so the cache dtype holds them exactly (half
    the bytes of fp32)."""
    q, kv = _problem()
    step = _step(q, kv, page=8, pages=4)
    kmin, kmax = sel.quest_bounds(kv, 8, torch.float64)  # [B, P, Hkv, d]
    assert step.bounds[0].dtype == BF16
    expected = torch.cat([kmax, kmin], -1).permute(0, 2, 1, 3).to(BF16)
    assert torch.equal(step.bounds[0].cpu(), expected.cpu())


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_quest_bf16_bounds_extended_token_by_token_equal_a_full_build(layout):
    q, kv = _problem(n=160, lengths=(160, 160), layout=layout)
    kv.lengths.copy_(torch.tensor([100, 33], device=DEVICE))
    step = _step(q, kv, page=8, pages=4)
    for _ in range(30):  # decode steps append one token each (page starts included)
        kv.lengths.add_(1)
        step(q, kv)
    assert torch.equal(step.bounds[0], _step(q, kv, page=8, pages=4).bounds[0])


@pytest.mark.parametrize(("q_scale", "peaky"), [(1.0, False), (4.0, True)])
@pytest.mark.parametrize("shared", ["group", "head"])
def test_quest_pages_from_bf16_bounds_recall_the_fp32_choice(q_scale, peaky, shared):
    """The pages chosen from the bf16 bounds (bf16 query, fp32 sums) against the fp32
    computation of the same bounds and scores: recall >= 0.95 (random and peaky keys)."""
    q, kv = _problem(batch=2, hkv=2, group=4, n=1024, d=64, lengths=(1024, 700),
                     q_scale=q_scale, seed=3)
    if peaky:  # a few loud channels, as real keys have
        kv.k[..., :4] *= 8.0
    step = _step(q, kv, page=16, pages=12, shared=shared)
    kmin, kmax = sel.quest_bounds(kv, 16, torch.float32)
    bound = sel.quest_page_scores(q.float(), kmin, kmax, step.scale)
    ref = sel.quest_page_choice(bound, kv.lengths, 16, 12, step.group, shared).cpu()
    if shared == "group":
        ref = ref[:, ::step.group]
    ref_sets = [set(row.nonzero().flatten().tolist()) for row in ref.flatten(0, 1)]
    got = _pages(step, q, kv)
    hits = sum(len(a & b) for a, b in zip(got, ref_sets, strict=True))
    assert [len(s) for s in got] == [len(s) for s in ref_sets]
    assert hits / sum(len(s) for s in ref_sets) >= 0.95


@pytest.mark.parametrize("fused", [True, False])
def test_quest_select_lists_pages_ascending_counts_them_and_keeps_the_last(fused):
    """In the bound kernel (its last program per row, the arrival counters back at 0 for
    the next call or graph replay) or in triton_page_select's own launch."""
    q, kv = _problem(lengths=(300, 45))  # 6 pages of 8 in the second sequence
    step = _step(q, kv, page=8, pages=10, fused_select=fused)
    chosen = step.select(q, kv).cpu()
    assert not step.arrivals.any()
    counts = step.counts.cpu().view(2, 2)
    assert counts.tolist() == [[10, 10], [6, 6]]
    assert torch.equal(step.select(q, kv).cpu(), chosen)
    for b, last in ((0, 37), (1, 5)):
        for g in range(2):
            row, n = chosen[b, g], int(counts[b, g])
            assert (row[:n].diff() > 0).all() and (row[n:] == -1).all()
            assert last in row.tolist() and int(row.max()) == last


def _dense_over_pages(q, kv, pages: torch.Tensor, page: int, shared: str) -> torch.Tensor:
    """Exact softmax attention of each head over its chosen pages' tokens (float64)."""
    k, v, _ = kv.padded(torch.float64)
    batch, _, hkv, d = k.shape
    hq = q.shape[1]
    group = hq // hkv
    lists = pages.cpu().long().view(batch, hkv, -1, pages.shape[-1] // (
        group if shared == "head" else 1))
    out = torch.empty(batch, hq, d, dtype=torch.float64)
    for b in range(batch):
        for h in range(hq):
            g = h // group
            mine = lists[b, g, h % group if shared == "head" else 0]
            mine = mine[mine >= 0]
            tokens = (mine[:, None] * page + torch.arange(page)).flatten()
            tokens = tokens[tokens < int(kv.lengths[b])]
            s = k[b, tokens, g] @ q[b, h].double().cpu() * d**-0.5
            out[b, h] = torch.softmax(s, 0) @ v[b, tokens, g]
    return out


@pytest.mark.parametrize(("layout", "group", "d", "shared"), [
    ("contiguous", 1, 16, "group"), ("paged", 4, 64, "group"), ("contiguous", 8, 32, "head"),
    ("paged", 2, 16, "head"), ("paged", 3, 128, "group")])
def test_quest_page_attention_is_dense_softmax_over_the_chosen_pages(layout, group, d,
                                                                      shared):
    q, kv = _problem(group=group, d=d, layout=layout, lengths=(300, 141), q_scale=2.0)
    step = _step(q, kv, page=16, pages=5, shared=shared, fused_select=d != 64)  # both
    out = step(q, kv).cpu().double()
    ref = _dense_over_pages(q.cpu(), kv, step.select(q, kv), 16, shared)
    assert float((out - ref).norm() / ref.norm()) < 2e-2


def _chosen_lists(step) -> list[list[int]]:
    """Each row's chosen pages, in their slots, up to its count."""
    rows = step.chosen.cpu().view(-1, step.pages)
    return [row[:n].tolist() for row, n in zip(rows, step.counts.cpu().tolist(), strict=True)]


@pytest.mark.parametrize(("layout", "shared", "fused", "page", "n", "hist_block"), [
    ("contiguous", "group", True, 16, 1024, None), ("paged", "group", True, 16, 1024, None),
    ("paged", "group", False, 16, 1024, None), ("contiguous", "head", False, 16, 1024, None),
    ("contiguous", "group", True, 2, 4096, None),  # 2048 pages a row, as 32k tokens of 16
    ("paged", "group", True, 4, 1024, 32)])  # a row of 256 pages in 8 blocks
def test_quest_byte_wise_select_chooses_the_pages_of_the_old_select_and_the_reference(
        layout, shared, fused, page, n, hist_block):
    """The byte-wise select (fused in the bound kernel, or triton_page_select's own
    launch) lists the same pages in the same slots as the select four bits a pass, so
    the step's output is the same to the bit; both are the reference's page choice on
    the kernel's bounds, and its attention within fp tolerance."""
    q, kv = _problem(batch=2, hkv=2, group=4, n=n, d=16, lengths=(n, n * 7 // 10), seed=5,
                     layout=layout, q_scale=2.0)
    runs = {}
    for histogram in (False, True):
        step = _step(q, kv, page=page, pages=12, shared=shared, fused_select=fused,
                     select="bytes" if histogram else "nibbles", hist_block=hist_block)
        out = step(q, kv).clone()
        runs[histogram] = (_chosen_lists(step), step.counts.clone(), out)
    assert not step.arrivals.any()
    (old, old_counts, old_out), (new, counts, out) = runs[False], runs[True]
    assert new == old and torch.equal(counts, old_counts) and torch.equal(out, old_out)
    # the reference's choice on the kernel's own bounds (a row's group max, or per head)
    bound = step.upper.cpu().double()
    if shared == "group":
        bound = bound.repeat_interleave(step.group, 1)
    ref = sel.quest_page_choice(bound, kv.lengths.cpu(), page, 12, step.group, shared)
    if shared == "group":
        ref = ref[:, ::step.group]
    assert new == [row.nonzero().flatten().tolist() for row in ref.flatten(0, 1)]
    expected = sel.quest(q.cpu(), _cpu(kv), page=page, pages=12, shared=shared,
                         compute_dtype=torch.float64).out
    assert float((out.cpu().double() - expected).norm() / expected.norm()) < 2e-2


@pytest.mark.parametrize(("layout", "page", "n", "lengths", "q_scale", "seeds"), [
    ("contiguous", 16, 1024, (1024, 700), 2.0, 3),
    ("paged", 4, 1024, (1024, 37), 0.5, 3),  # 10 pages in the second: fewer than 12
    ("paged", 16, 512, (150, 512), 8.0, 3),  # peaked bounds
    ("contiguous", 2, 4096, (4096, 2500), 2.0, 1)])  # 2048 pages a row, as 32k of 16
def test_quest_spread_select_chooses_the_byte_wise_pages_and_the_reference(
        layout, page, n, lengths, q_scale, seeds):
    """The spread select (the bound programs' histogram, the last program's candidates)
    lists the byte-wise select's pages in the same slots, so the step's output is the
    same to the bit, and the reference's choice; its histogram and arrival counters are
    zero after each call, so a second call chooses the same."""
    for seed in range(seeds):
        q, kv = _problem(batch=2, hkv=2, group=4, n=n, d=16, lengths=lengths, seed=seed,
                         layout=layout, q_scale=q_scale)
        steps = {select: _step(q, kv, page=page, pages=12, select=select, fused_select=True)
                 for select in ("bytes", "spread")}
        runs = []
        for select in ("bytes", "spread", "spread"):
            step = steps[select]
            out = step(q, kv).clone()
            runs.append((_chosen_lists(step), step.counts.clone(), out))
            assert not step.hist.any() and not step.arrivals.any()
        (old, old_counts, old_out), (new, counts, out), again = runs
        assert new == old and torch.equal(counts, old_counts) and torch.equal(out, old_out)
        assert again[0] == new and torch.equal(again[2], out)
        bound = step.upper.cpu().double().repeat_interleave(step.group, 1)
        ref = sel.quest_page_choice(bound, kv.lengths.cpu(), page, 12, step.group, "group")
        assert new == [row.nonzero().flatten().tolist() for row in ref[:, ::step.group]
                       .flatten(0, 1)]


@pytest.mark.parametrize(("layout", "page", "n", "lengths", "fused"), [
    ("contiguous", 16, 1024, (1024, 700), True),
    ("paged", 4, 1024, (1024, 37), False),  # 10 pages in the second: fewer than 12
    ("contiguous", 2, 4096, (4096, 2500), True)])  # 2048 pages a row, as 32k of 16
def test_quest_resident_select_chooses_the_byte_wise_pages(layout, page, n, lengths, fused):
    """The resident select (the row of bounds held in registers), fused in the bound
    kernel or in its own launch, lists the byte-wise select's pages in the same slots, so
    the step's output is the same to the bit."""
    q, kv = _problem(batch=2, hkv=2, group=4, n=n, d=16, lengths=lengths, seed=n,
                     layout=layout, q_scale=2.0)
    runs = []
    for select in ("bytes", "resident"):
        step = _step(q, kv, page=page, pages=12, select=select, fused_select=fused)
        out = step(q, kv).clone()
        runs.append((_chosen_lists(step), step.counts.clone(), out))
    (old, old_counts, old_out), (new, counts, out) = runs
    assert new == old and torch.equal(counts, old_counts) and torch.equal(out, old_out)


class _TorchOps(TorchDispatchMode):
    """The names of the torch ops run inside the mode."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


# what the Triton interpreter does to stage a kernel's tensors (none on a GPU)
INTERPRETER_OPS = {"set_", "empty", "new_empty", "copy_", "empty_strided", "detach", "alias"}


@pytest.mark.parametrize(("shared", "select", "fused"), [
    ("group", "bytes", True), ("head", "bytes", True), ("group", "spread", True),
    ("head", "spread", True), ("group", "resident", False), ("head", "resident", False)])
def test_quest_step_runs_kernels_only(shared, select, fused, monkeypatch):
    """No torch op of its own (topk, index building, casts, the spread select's
    histogram zeroing), views aside: the bound kernel (with the page select, per group
    when fused), the select (per head, or in its own launch), the indexed kernel and its
    merge; graph-capturable."""
    q, kv = _problem(group=4)
    step = _step(q, kv, page=8, pages=4, shared=shared, select=select, fused_select=fused)
    step(q, kv)
    launches = []
    kernel_type = type(ts._quest_bound_kernel)
    launch = kernel_type.__getitem__
    monkeypatch.setattr(kernel_type, "__getitem__",
                        lambda self, grid: launches.append(self) or launch(self, grid))
    with _TorchOps() as mode:
        step(q, kv)
    assert mode.ops - INTERPRETER_OPS - {"view"} == set()
    merge = step.workspace.num_splits > 1
    assert len(launches) == 2 + (shared == "head" or not fused) + merge
