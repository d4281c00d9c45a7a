"""triton-page-select's row selects against torch.topk and each other (runs under
TRITON_INTERPRET=1 on CPU; the same tests run the compiled kernels on a GPU)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

import pytest
import torch

import santa_kernels as sk

ti = pytest.importorskip("santa_kernels.triton_indexed")
from santa_kernels import triton_page_select as ps  # noqa: E402 (triton present: no skip)

_OK, _WHY = ti.indexed_available()
if not _OK:
    pytest.skip(f"triton-page-select unavailable: {_WHY}", allow_module_level=True)

import triton  # noqa: E402 (after the skip: triton present)
import triton.language as tl  # noqa: E402

from santa_kernels.triton_page_select import _spread_count, _spread_select_row  # noqa: E402

DEVICE = "cuda" if _WHY == "cuda" else "cpu"
INF = float("inf")


def _select(scores: torch.Tensor, k: int, select: str | None = None,
            hist_block: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    index, counts = ps.row_topk(scores.to(DEVICE), k, select=select, hist_block=hist_block)
    return index.cpu().long(), counts.cpu().long()


def _check_layout(index: torch.Tensor, counts: torch.Tensor) -> None:
    """Ascending positions first, -1 after the ``counts`` taken."""
    for row, n in zip(index, counts.tolist(), strict=True):
        assert (row[n:] == -1).all()
        assert (row[:n] >= 0).all() and (row[:n].diff() > 0).all()


@pytest.mark.parametrize(("width", "k"), [(5, 1), (37, 7), (300, 64), (2 * ps.MAX_BLOCK + 3, 9)])
def test_row_topk_is_torch_topk_on_distinct_scores(width, k):
    """The exact top set (several blocks per row in the last case), negative scores too."""
    gen = torch.Generator().manual_seed(width)
    scores = torch.randn(4, width, generator=gen) * 3.0 - 1.0
    scores[1] = -scores[1].abs()  # every score negative
    index, counts = _select(scores, k)
    _check_layout(index, counts)
    assert counts.tolist() == [min(k, width)] * 4
    expected = scores.topk(min(k, width), dim=-1).indices.sort(-1).values
    assert torch.equal(index[:, :min(k, width)], expected)


def test_row_topk_breaks_ties_by_position():
    """Integer scores: the taken values are torch.topk's, and among the threshold's ties
    the lowest positions go first."""
    gen = torch.Generator().manual_seed(1)
    scores = torch.randint(-3, 4, (6, 200), generator=gen).float()
    scores[5] = 2.0  # all tied
    index, counts = _select(scores, 16)
    _check_layout(index, counts)
    assert counts.tolist() == [16] * 6
    for row, picked in zip(scores, index, strict=True):
        threshold = row.topk(16).values[-1]
        above = (row > threshold).nonzero().flatten()
        ties = (row == threshold).nonzero().flatten()[:16 - len(above)]
        assert torch.equal(picked, torch.cat([above, ties]).sort().values)
        assert torch.equal(row[picked].sort().values, row.topk(16).values.sort().values)


def test_row_topk_takes_fewer_than_k_live_entries_and_always_plus_inf():
    """Ragged rows: -inf (a page past the sequence) is never taken; +inf always is."""
    scores = torch.randn(4, 50, generator=torch.Generator().manual_seed(2))
    scores[0, 3:] = -INF  # 3 live entries of 50
    scores[1, :] = -INF  # none
    scores[2, 20:] = -INF
    scores[2, 19] = INF  # the last page of a ragged sequence
    scores[3, 0] = INF
    scores[3, 1] = -1e30
    index, counts = _select(scores, 8)
    _check_layout(index, counts)
    assert counts.tolist() == [3, 0, 8, 8]
    assert index[0, :3].tolist() == [0, 1, 2]
    assert 19 in index[2].tolist() and (index[2, :8] < 20).all()
    assert torch.equal(index[2], scores[2].topk(8).indices.sort().values)
    assert 0 in index[3].tolist() and 1 not in index[3].tolist()


def test_row_topk_with_k_past_the_width_lists_every_live_entry():
    scores = torch.tensor([[0.5, -INF, 2.0, -1.0]])
    index, counts = _select(scores, 6)
    assert index.tolist() == [[0, 2, 3, -1, -1, -1]] and counts.tolist() == [3]


def test_row_topk_rejects_a_wrong_scores_tensor():
    with pytest.raises(sk.InputError, match="scores: expected an fp32"):
        ps.row_topk(torch.zeros(2, 4, dtype=torch.float64), 2)
    with pytest.raises(sk.InputError, match="k: "):
        ps.row_topk(torch.zeros(2, 4), 0)


def _hard_rows(width: int) -> torch.Tensor:
    """Rows a select can get wrong: distinct, coarse ties, one value, -inf tails, +inf,
    negatives only, and nothing live."""
    gen = torch.Generator().manual_seed(width)
    rows = torch.randn(8, width, generator=gen) * 5.0
    rows[1] = torch.randint(-2, 3, (width,), generator=gen).float()  # few values, many ties
    rows[2] = 1.5
    rows[3, width // 3:] = -INF
    rows[4, -1] = INF
    rows[4, : width // 2] = -INF
    rows[5] = -rows[5].abs() - 1.0
    rows[6] = -INF
    rows[7] = torch.randn(width, generator=gen).to(torch.bfloat16).float()  # bf16 bounds
    return rows


@pytest.mark.parametrize(("width", "k", "hist_block"), [
    (50, 8, None), (300, 64, None), (2048, 64, None), (2048, 256, None), (300, 7, 64),
    (1000, 300, 128)])
def test_byte_wise_select_chooses_what_four_bits_a_pass_chooses(width, k, hist_block):
    """The byte-wise select (4 histogram passes, the row of 2048 pages one block) lists
    the same positions in the same slots as the select four bits a pass, and as the
    reference's top-k where no tie is at stake; several blocks a pass with a small
    ``hist_block``."""
    scores = _hard_rows(width)
    old_index, old_counts = _select(scores, k, "nibbles")
    index, counts = _select(scores, k, "bytes", hist_block)
    _check_layout(index, counts)
    assert torch.equal(index, old_index) and torch.equal(counts, old_counts)
    live = (scores > -INF).sum(-1)
    assert counts.tolist() == torch.minimum(live, torch.tensor(k)).tolist()
    for r in (0, 3, 4, 5):  # distinct live scores: exactly torch.topk's set
        n = int(counts[r])
        expected = scores[r].topk(n).indices.sort().values
        assert torch.equal(index[r, :n], expected)


def test_the_docstrings_step_counts_follow_the_blocks():
    """Four bits a pass over 2048 pages: 8 passes and the write, each ⌈P / block⌉ dependent
    steps (``MAX_BLOCK`` here, ``QUEST_SELECT_BLOCK`` in Quest's fused select); spread:
    two steps over the row and two of the histogram and the candidates."""
    from santa_kernels.triton_selection import QUEST_SELECT_BLOCK

    blocks = 2048 // ps.MAX_BLOCK
    text = " ".join(ps.__doc__.split())
    assert f"8 x {blocks} + {blocks} = {9 * blocks} for 2048 pages" in text
    assert f"{9 * 2048 // QUEST_SELECT_BLOCK} in Quest's fused select" in text
    assert f"``QUEST_SELECT_BLOCK`` = {QUEST_SELECT_BLOCK}" in text
    # spread: the histogram's bucket, the candidates' pass, their rank, the write
    spread = 1 + -(-2048 // ps.HIST_BLOCK) + 1 + -(-2048 // ps.HIST_BLOCK)
    assert f"{spread} for 2048 pages (6 with more candidates" in text


@pytest.mark.parametrize(("width", "k"), [
    (5, 1), (50, 8), (300, 64), (1000, 300), (2048, 64), (2048, 256), (4096, 64)])
def test_resident_select_chooses_what_the_byte_wise_select_chooses(width, k):
    """The resident select (the row loaded once, its four histograms over the held keys,
    the slots from cumulative sums) lists the byte-wise select's positions in the same
    slots, with the same counts, on rows with ties, -inf tails, +inf and nothing live."""
    scores = _hard_rows(width)
    index, counts = _select(scores, k, "resident")
    _check_layout(index, counts)
    old_index, old_counts = _select(scores, k, "bytes")
    assert torch.equal(index, old_index) and torch.equal(counts, old_counts)


def test_resident_select_runs_byte_wise_past_its_widest_row(monkeypatch):
    """Rows needing more than RESIDENT_KEYS scores a thread run byte-wise in blocks,
    choosing the same; the resident select's step is the whole row (2048 pages in Quest's
    4-warp bound kernel, 4096 in a row launch of 8)."""
    assert ps.select_block(300, "resident") == 512 and ps.row_select("resident", 300) == "resident"
    assert ps.row_select("resident", 4096, 8) == "resident"
    assert ps.row_select("resident", 4096, 4) == "bytes"
    assert ps.row_select("resident", 2048, 4) == "resident"
    monkeypatch.setattr(ps, "RESIDENT_KEYS", 1)  # 256 a row of 8 warps
    assert ps.row_select("resident", 300) == "bytes"
    assert ps.row_select("resident", 256) == "resident"
    assert ps.select_block(300, "resident", 64) == 64
    scores = _hard_rows(300)
    index, counts = _select(scores, 20, "resident")
    old_index, old_counts = _select(scores, 20, "bytes", 64)
    assert torch.equal(index, old_index) and torch.equal(counts, old_counts)


# the spread select (Quest's fused group select): a stand-in for the bound kernel counts
# each tile's scores into the row's histogram and its row's last program selects, as
# ``_quest_bound_kernel`` does; the choice is the byte-wise select's and torch's


@triton.jit
def _tiles_then_select_kernel(s_ptr, hist_ptr, cand_ptr, arrive_ptr, out_ptr, count_ptr,
                              width, stride_s, K: tl.constexpr, BLOCK_P: tl.constexpr,
                              BLOCK: tl.constexpr, BLOCK_K: tl.constexpr):
    """The bound kernel's protocol: each tile of ``BLOCK_P`` scores counts its live ones,
    arrives, and the row's last program selects and resets the counter."""
    tile = tl.program_id(0)
    row = tl.program_id(1)
    offs = tile * BLOCK_P + tl.arange(0, BLOCK_P)
    inside = offs < width
    base = s_ptr + row.to(tl.int64) * stride_s
    s = tl.load(base + offs, mask=inside, other=float("-inf"))
    _spread_count(hist_ptr, row, s, inside & (s > float("-inf")))
    tl.debug_barrier()
    arrived = tl.atomic_add(arrive_ptr + row, 1, sem="acq_rel")
    if arrived == tl.num_programs(0) - 1:
        _spread_select_row(base, out_ptr + row.to(tl.int64) * K, count_ptr + row, hist_ptr,
                           cand_ptr, row, width, K, BLOCK, BLOCK_K)
        tl.store(arrive_ptr + row, 0)


class _Spread:
    """The spread select's workspace for ``rows`` of ``width`` (allocated once)."""

    def __init__(self, rows: int, width: int) -> None:
        self.hist = torch.zeros(rows, ps.KEY_BUCKETS.value, dtype=torch.int32, device=DEVICE)
        self.cand = torch.empty(rows, width, dtype=torch.int32, device=DEVICE)
        self.arrivals = torch.zeros(rows, dtype=torch.int32, device=DEVICE)

    def __call__(self, scores: torch.Tensor, k: int, block: int | None = None,
                 block_p: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        rows, width = scores.shape
        scores = scores.to(DEVICE)
        out = torch.empty(rows, k, dtype=torch.int32, device=DEVICE)
        counts = torch.empty(rows, dtype=torch.int32, device=DEVICE)
        _tiles_then_select_kernel[(triton.cdiv(width, block_p), rows)](
            scores, self.hist, self.cand, self.arrivals, out, counts, width, scores.stride(0),
            K=k, BLOCK_P=block_p, BLOCK=block or ps.select_block(width, "spread"),
            BLOCK_K=triton.next_power_of_2(k))
        return out.cpu().long(), counts.cpu().long()


def _reference(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's top ``k`` live scores (ties at the threshold: the lowest positions), in
    ascending positions, ``-1`` after them, and their number."""
    index = torch.full((scores.shape[0], k), -1, dtype=torch.long)
    counts = torch.zeros(scores.shape[0], dtype=torch.long)
    for r, row in enumerate(scores):
        live = row > -INF
        n = min(k, int(live.sum()))
        if n:
            threshold = row[live].sort(descending=True).values[n - 1]
            above = (row > threshold).nonzero().flatten()
            ties = (row == threshold).nonzero().flatten()[:n - len(above)]
            index[r, :n] = torch.cat([above, ties]).sort().values
        counts[r] = n
    return index, counts


def _candidates(scores: torch.Tensor, k: int) -> list[int]:
    """Per row, the live scores in the bucket (top 12 key bits) of the ``k``-th largest."""
    u = scores.contiguous().view(torch.int32).long() & 0xFFFFFFFF
    key = torch.where(u >= 2**31, ~u & 0xFFFFFFFF, u | 2**31)
    bucket = key >> 20
    out = []
    for row, b in zip(scores, bucket, strict=True):
        live = row > -INF
        n = min(k, int(live.sum()))
        b1 = int(b[live].sort(descending=True).values[n - 1]) if n else -1
        out.append(int((live & (b == b1)).sum()))
    return out


def _rows(kind: str, width: int, seed: int) -> torch.Tensor:
    """Eight rows of one kind, each cut at a ragged length (-inf after it, +inf on its
    last live score as Quest's last page), one row empty, one short."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "gaussian":
        rows = torch.randn(8, width, generator=gen) * 3.0
    elif kind == "peaked":  # a few far above a tight bulk: the bulk shares one bucket
        rows = 50.0 + 1e-3 * torch.randn(8, width, generator=gen)
        spikes = torch.randint(0, width, (8, 5), generator=gen)
        rows.scatter_(1, spikes, 1e4 * torch.rand(8, 5, generator=gen) + 1e3)
    elif kind == "ties":  # few values, many repeats (the last rows: all in one bucket)
        rows = torch.randint(-3, 4, (8, width), generator=gen).float()
        rows[4:] = 1.0 + torch.randint(0, 8, (4, width), generator=gen) / 64
    else:  # bf16 values: close ties among distinct ones
        rows = torch.randn(8, width, generator=gen).to(torch.bfloat16).float()
    lengths = torch.randint(1, width + 1, (8,), generator=gen)
    lengths[0], lengths[1], lengths[2] = width, 0, min(width, 3)
    for r, n in enumerate(lengths.tolist()):
        rows[r, n:] = -INF
        if n and r % 2:
            rows[r, n - 1] = INF
    return rows


@pytest.mark.parametrize("kind", ["gaussian", "peaked", "ties", "bf16"])
@pytest.mark.parametrize(("width", "k", "block"), [(300, 16, None), (300, 64, None),
                                                   (200, 7, 64), (1000, 40, 256)])
def test_spread_select_chooses_what_the_byte_wise_select_and_torch_choose(kind, width, k,
                                                                         block):
    """Many seeds per kind; ragged rows (shorter than ``k``, empty, +inf last); several
    blocks a pass where ``block`` is small; the same positions in the same slots and the
    same counts as the byte-wise select's own launch and the reference."""
    spread = _Spread(8, width)
    for seed in range(4):
        scores = _rows(kind, width, seed * 101 + width + k)
        index, counts = spread(scores, k, block)
        ref_index, ref_counts = _reference(scores, k)
        byte_index, byte_counts = ps.row_topk(scores.to(DEVICE), k, select="bytes")
        assert torch.equal(index, ref_index) and torch.equal(counts, ref_counts)
        assert torch.equal(index, byte_index.cpu().long())
        assert torch.equal(counts, byte_counts.cpu().long())
        assert not spread.hist.any() and not spread.arrivals.any()


def test_spread_select_ranks_few_candidates_and_refines_many():
    """Both ways to the exact threshold: the bucket's candidates ranked by compares (at
    most ``CAND_BLOCK``) and by three histograms (more), ties in position order."""
    scores = torch.cat([_rows("gaussian", 300, 7), _rows("peaked", 300, 7),
                        _rows("ties", 300, 7)])
    cands = _candidates(scores, 32)
    assert min(c for c in cands if c) <= ps.CAND_BLOCK < max(cands)
    index, counts = _Spread(24, 300)(scores, 32)
    ref_index, ref_counts = _reference(scores, 32)
    assert torch.equal(index, ref_index) and torch.equal(counts, ref_counts)


def test_spread_select_leaves_its_workspace_zero_so_calls_repeat():
    """The histogram and the arrival counters are zero after a call: two calls in a row
    (and a different input between) give the same answer."""
    spread = _Spread(8, 300)
    first, other = _rows("gaussian", 300, 1), _rows("ties", 300, 2)
    a = spread(first, 24)
    assert not spread.hist.any() and not spread.arrivals.any()
    b = spread(first, 24)
    spread(other, 24)
    c = spread(first, 24)
    assert torch.equal(a[0], b[0]) and torch.equal(a[0], c[0]) and torch.equal(a[1], c[1])
    assert torch.equal(a[0], _reference(first, 24)[0])


def test_the_per_head_launch_runs_byte_wise_under_the_spread_select():
    """``row_topk`` (per head) has no bound programs to fill a histogram: byte-wise."""
    assert ps.row_select("spread") == "bytes" and ps.row_select("nibbles") == "nibbles"
    with pytest.raises(ps.InputError,
                       match="select: expected one of bytes, nibbles, spread, resident"):
        ps.row_select("fast")
