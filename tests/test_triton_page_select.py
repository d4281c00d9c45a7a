"""triton-page-select's row select against torch.topk (runs under TRITON_INTERPRET=1 on CPU;
the same tests run the compiled kernel on a GPU)."""

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

DEVICE = "cuda" if _WHY == "cuda" else "cpu"
INF = float("inf")


def _select(scores: torch.Tensor, k: int,
            select: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    index, counts = ps.row_topk(scores.to(DEVICE), k, select=select)
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
def test_byte_wise_select_chooses_what_four_bits_a_pass_chooses(width, k, hist_block,
                                                                 monkeypatch):
    """The byte-wise select (4 histogram passes, the row of 2048 pages one block) lists
    the same positions in the same slots as the select four bits a pass, and as the
    reference's top-k where no tie is at stake; several blocks a pass with a small
    ``HIST_BLOCK``."""
    if hist_block is not None:
        monkeypatch.setattr(ps, "HIST_BLOCK", hist_block)
    scores = _hard_rows(width)
    old_index, old_counts = _select(scores, k, "nibbles")
    index, counts = _select(scores, k, "bytes")
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
