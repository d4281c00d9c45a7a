"""The kernels' launch choices as options of the objects that launch them: two objects
built with different options in one process launch their own choice, choose the same
tokens or pages, and leave the module defaults as they are (runs under
TRITON_INTERPRET=1 on CPU; the same tests run the compiled kernels on a GPU)."""

import os
import re

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

import pytest
import torch
import triton

import santa_kernels as sk
from conftest import decode_problem, record_launches

ti = pytest.importorskip("santa_kernels.triton_indexed")
tk = pytest.importorskip("santa_kernels.triton_topk")
ts = pytest.importorskip("santa_kernels.triton_selection")
trs = pytest.importorskip("santa_kernels.triton_rest_sample")
tps = ts.triton_page_select
_OK, _WHY = ti.indexed_available()
if not _OK:
    pytest.skip(f"triton-indexed unavailable: {_WHY}", allow_module_level=True)

DEVICE = "cuda" if _WHY == "cuda" else "cpu"
DEFAULTS = (tk.SPREAD_SELECT, tk.SCORE_L2_HINTS, tk.MASS_BLOCK, tps.SELECT,
            ti.PROGRAMS_PER_SM, trs.REST_BLOCK, tk.SELECT_SPAN)


def _defaults() -> tuple:
    return (tk.SPREAD_SELECT, tk.SCORE_L2_HINTS, tk.MASS_BLOCK, tps.SELECT,
            ti.PROGRAMS_PER_SM, trs.REST_BLOCK, tk.SELECT_SPAN)


def _problem(n=900, lengths=(900, 333), seed=2):
    q, kv = decode_problem(batch=2, heads=8, kv_heads=2, n=n, d=16, q_scale=2.0, seed=seed,
                           lengths=list(lengths), dtype=torch.float32)
    kv = sk.KVCache.contiguous(kv.k.to(DEVICE), kv.v.to(DEVICE), kv.lengths.to(DEVICE))
    return q.to(DEVICE), kv


def _recorded(monkeypatch) -> list:
    """Every Triton launch from now on (:func:`conftest.record_launches`)."""
    return record_launches(monkeypatch, tk._mass_hist_kernel)


def _kwarg(launches, kernel, name):
    return [kw[name] for k, kw, *_ in launches if k is kernel]


def test_two_topk_selects_launch_their_own_select_and_choose_the_same_tokens(monkeypatch):
    """spread=False and spread=True built side by side: one program a row against the
    two split launches, the same tokens and threshold; each object's mass block and
    L2 hints reach its launches."""
    q, kv = _problem()
    launches = _recorded(monkeypatch)
    tops = [tk.TopKSelect(q, kv, 40, scale=0.25, spread=False, mass_block=256),
            tk.TopKSelect(q, kv, 40, scale=0.25, spread=True, l2_hints=True)]
    outs = []
    for top in tops:
        out = torch.full((2, 2, 40), 7, dtype=torch.int32, device=DEVICE)
        top.run_scores(q, kv)
        top.run_select(kv, out)
        outs.append(out.cpu())
    kernels = [k for k, *_ in launches]
    assert kernels.count(tk._select_kernel) == 1
    assert kernels.count(tk._second_byte_kernel) == kernels.count(tk._spread_write_kernel) == 1
    assert kernels.index(tk._select_kernel) < kernels.index(tk._second_byte_kernel)
    assert _kwarg(launches, tk._mass_hist_kernel, "BLOCK") == [256, tk.MASS_BLOCK]
    assert _kwarg(launches, tk._score_stats_kernel, "K_EVICTION") == ["", "evict_first"]
    assert _kwarg(launches, tk._score_stats_kernel, "S_EVICTION") == ["", "evict_last"]
    assert torch.equal(outs[0].sort(-1).values, outs[1].sort(-1).values)
    assert torch.equal(tops[0].thr_key.cpu(), tops[1].thr_key.cpu())
    assert torch.equal(tops[0].thr_tok.cpu(), tops[1].thr_tok.cpu())
    assert _defaults() == DEFAULTS


@pytest.mark.parametrize("shared", ["group", "head"])
def test_two_quest_steps_launch_their_own_page_select_and_choose_the_same_pages(
        monkeypatch, shared):
    """QuestStep(select="nibbles"), (select="bytes"), (select="spread") and
    (select="resident") built side by side: each launch runs its own select (the fused one
    per group, the row launch per head), the same pages in the same slots and the same
    output."""
    q, kv = _problem(n=600, lengths=(600, 250))
    launches = _recorded(monkeypatch)
    runs = []
    for select in ("nibbles", "bytes", "spread", "resident"):
        step = ts.QuestStep(q, kv, page=8, pages=10, shared=shared, select=select,
                            fused_select=True)
        step.build(kv)
        out = step(q, kv).cpu()
        runs.append((step.chosen.cpu(), step.counts.cpu(), out))
    if shared == "group":
        fused = [kw["SELECT_BY"] for k, kw, *_ in launches
                 if k is ts._quest_bound_kernel and kw["SELECT"]]
        assert fused == ["nibbles", "bytes", "spread", "resident"]
    else:  # the spread select lives in the fused launch: a row launch runs byte-wise
        assert _kwarg(launches, tps._row_topk_kernel, "HOW") == ["nibbles", "bytes", "bytes",
                                                                  "resident"]
    for chosen, counts, out in runs[1:]:
        assert torch.equal(chosen, runs[0][0]) and torch.equal(counts, runs[0][1])
        assert torch.equal(out, runs[0][2])
    assert _defaults() == DEFAULTS


def test_two_quest_steps_select_in_the_bound_kernel_or_their_own_launch(monkeypatch):
    """QuestStep(fused_select=True) selects in the bound kernel's launch,
    (fused_select=False) in triton_page_select's own: the same pages in the same slots,
    the same output, the module default unchanged."""
    q, kv = _problem(n=600, lengths=(600, 250))
    launches = _recorded(monkeypatch)
    runs = []
    for fused in (True, False):
        step = ts.QuestStep(q, kv, page=8, pages=10, fused_select=fused)
        step.build(kv)
        assert step.fused_select is fused
        out = step(q, kv).cpu()
        runs.append((out, step.chosen.cpu(), step.counts.cpu()))
    assert [kw["SELECT"] for k, kw, *_ in launches if k is ts._quest_bound_kernel] == [
        True, False]
    assert len(_kwarg(launches, tps._row_topk_kernel, "HOW")) == 1
    for new, old in zip(runs[1], runs[0], strict=True):
        assert torch.equal(new, old)
    assert ts.QUEST_FUSED_SELECT is False and _defaults() == DEFAULTS


@pytest.mark.parametrize("fused", [True, False])
def test_quest_bound_pages_split_the_bound_kernel_alike(monkeypatch, fused):
    """QuestStep(bound_pages=N) launches the bound kernel over N pages a program (a grid
    of ceil(pages / N) a row): the same bounds, pages in the same slots and output as the
    default; a bad N is an InputError."""
    q, kv = _problem(n=600, lengths=(600, 250))
    launches = _recorded(monkeypatch)
    runs = []
    for pages in (None, 4, 32):
        step = ts.QuestStep(q, kv, page=8, pages=10, fused_select=fused, bound_pages=pages)
        step.build(kv)
        out = step(q, kv).cpu()
        runs.append((out, step.chosen.cpu(), step.counts.cpu(), step.upper.cpu()))
    grids = [(grid, kw["BLOCK_P"]) for k, kw, grid, *_ in launches
             if k is ts._quest_bound_kernel]
    assert [g for g, _ in grids[1:]] == [((75 + 3) // 4, 4), ((75 + 31) // 32, 4)]
    assert [p for _, p in grids[1:]] == [4, 32]
    for run in runs[1:]:
        for new, old in zip(run, runs[0], strict=True):
            assert torch.equal(new, old)
    assert _defaults() == DEFAULTS
    with pytest.raises(tps.InputError, match="bound_pages"):
        ts.QuestStep(q, kv, page=8, pages=10, bound_pages=24)


@pytest.mark.parametrize("fused", [True, False])
def test_quest_bound_page_loop_scores_alike(monkeypatch, fused):
    """QuestStep(bound_programs_per_sm=N, bound_stages=S): each bound program walks a power
    of two of steps (their rows' steps shared out over N programs an SM, the last program's
    steps past the row masked), its loop staged S deep: the same bounds, pages in the same
    slots and output as one step a program; bad values are InputErrors."""
    q, kv = _problem(n=600, lengths=(600, 250))
    monkeypatch.setattr(ts, "num_sms", lambda device: 4)
    launches = _recorded(monkeypatch)
    runs = []
    for per_sm, stages in ((None, None), (1, 2), (3, None)):
        step = ts.QuestStep(q, kv, page=8, pages=10, fused_select=fused, bound_pages=4,
                            bound_programs_per_sm=per_sm, bound_stages=stages)
        step.build(kv)
        out = step(q, kv).cpu()
        runs.append((out, step.chosen.cpu(), step.counts.cpu(), step.upper.cpu()))
    rows = q.shape[0] * kv.num_kv_heads
    launched = [(grid, kw["TILES"], kw["STAGES"]) for k, kw, grid, *_ in launches
                if k is ts._quest_bound_kernel]
    steps = (75 + 3) // 4
    expect = [1] + [min(triton.next_power_of_2(-(-steps * rows // (4 * n))), 32) for n in (1, 3)]
    assert [tiles for _, tiles, _ in launched] == expect and expect[1] > 1
    assert [stages for *_, stages in launched] == [None, 2, None]
    assert [grid[0] for grid, *_ in launched] == [-(-75 // (4 * n)) for n in expect]
    for run in runs[1:]:
        for new, old in zip(run, runs[0], strict=True):
            assert torch.equal(new, old)
    for name in ("bound_programs_per_sm", "bound_stages"):
        with pytest.raises(tps.InputError, match=name):
            ts.QuestStep(q, kv, page=8, pages=10, **{name: 0})


@pytest.mark.parametrize("fused", [True, False])
def test_quest_hist_block_reaches_its_select(monkeypatch, fused):
    """QuestStep(hist_block=N): the byte-wise select reads N bounds a step, fused in the
    bound kernel or in its own launch (the default HIST_BLOCK untouched); a block that is
    no power of two is an InputError."""
    q, kv = _problem(n=600, lengths=(600, 250))
    launches = _recorded(monkeypatch)
    step = ts.QuestStep(q, kv, page=8, pages=10, select="bytes", fused_select=fused,
                        hist_block=32)
    step.build(kv)
    step(q, kv)
    if fused:
        assert _kwarg(launches, ts._quest_bound_kernel, "SELECT_BLOCK") == [32]
    else:
        assert _kwarg(launches, tps._row_topk_kernel, "BLOCK") == [32]
    assert tps.HIST_BLOCK == 2048
    with pytest.raises(tps.InputError, match="hist_block"):
        ts.QuestStep(q, kv, page=8, pages=10, hist_block=48)


def test_the_steps_pass_their_options_to_what_they_launch(monkeypatch):
    """select_options reach each step's TopKSelect, rest_block its sampler's launches,
    attend_programs_per_sm its attend's split count; the defaults are the constants."""
    q, kv = _problem()
    launches = _recorded(monkeypatch)
    opts = {"spread": False, "l2_hints": True, "mass_block": 1024, "select_span": 2048}
    steps = [ts.OracleTopKStep(q, kv, k=16, select_options=opts, attend_programs_per_sm=64),
             ts.VAttentionStep(q, kv, sink=4, window=4, topk=8, select_options=opts,
                               attend_programs_per_sm=64),
             ts.TopKSantaStep(q, kv, k=8, S=4, select_options=opts, rest_block=128,
                              attend_programs_per_sm=64)]
    for step in steps:
        assert (step.top.spread, step.top.l2_hints, step.top.mass_block,
                step.top.select_span) == (False, True, 1024, 2048)
        assert step.attend_programs_per_sm == 64
    assert steps[2].sampler.block == 128
    assert steps[0].workspace.num_splits == ti.choose_splits(q, kv, 16, programs_per_sm=64)
    steps[2](q, kv)
    assert _kwarg(launches, trs._rest_sum_kernel, "BLOCK") == [128]
    assert _kwarg(launches, trs._systematic_kernel, "BLOCK") == [128]
    plain = ts.TopKSantaStep(q, kv, k=8, S=4)
    assert (plain.top.spread, plain.top.l2_hints, plain.top.mass_block) == DEFAULTS[:3]
    assert plain.top.select_span == DEFAULTS[6]
    assert plain.sampler.block == trs.REST_BLOCK
    assert plain.attend_programs_per_sm == ti.PROGRAMS_PER_SM
    assert plain.workspace.num_splits == ti.choose_splits(q, kv, 8 + 4 * 4)
    assert _defaults() == DEFAULTS


@pytest.mark.parametrize("heads", [8, 6])
def test_vattention_tail_scores_by_token_draw_alike(monkeypatch, heads):
    """tail_scores="token": the score pass also writes each token's group scores side by
    side (the group padded to a power of two with -inf), the plan sets the top-k's to -inf
    there instead of marking them, and the tail's draws read that copy: the same exact
    rows, budget, log-weight, output and read counts as the stash with its marks; the copy
    is counted as a table the call writes; an unknown source is an InputError."""
    q, kv = decode_problem(batch=2, heads=heads, kv_heads=2, n=2000, d=16, q_scale=2.0,
                           seed=4, lengths=[2000, 1300], dtype=torch.float32)
    kv = sk.KVCache.contiguous(kv.k.to(DEVICE), kv.v.to(DEVICE), kv.lengths.to(DEVICE))
    q = q.to(DEVICE)
    launches = _recorded(monkeypatch)
    runs, steps = [], []
    for source in ("stash", "token"):
        step = ts.VAttentionStep(q, kv, sink=16, window=16, topk=40, seed=7,
                                 tail_scores=source)
        out = step(q, kv).cpu()
        step.reset_rng()
        reads = step.read_counts(q, kv)
        runs.append((step.listed.cpu(), step.count.cpu(), step.log_weight.cpu(), out,
                     reads.v_rows, reads.k_features))
        steps.append(step)
    assert _kwarg(launches, ti._indexed_stage1, "TAIL_TOKEN_SCORES")[-1] is True
    assert not any(_kwarg(launches, ti._indexed_stage1, "TAIL_TOKEN_SCORES")[:2])
    assert int(runs[0][1].min()) > 2
    for new, old in zip(runs[1], runs[0], strict=True):
        if new.dtype.is_floating_point:
            torch.testing.assert_close(new, old, rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(new, old)
    token = steps[1]
    group, pad = token.group, token.top.group_pad
    copy = token.top.token_scores.cpu()  # [B, Hkv, N, Gp] after the plan
    stash = token.scores.cpu().view(2, 2, group, -1).transpose(2, 3)
    top = token.listed[..., 32:].cpu().long()
    hit = torch.zeros(2, 2, copy.shape[2], dtype=torch.bool)
    hit.scatter_(2, top.clamp_min(0), top >= 0)
    assert torch.equal(copy[..., :group][~hit], stash[~hit])
    assert bool((copy[..., :group][hit] == float("-inf")).all()) and hit.sum() > 0
    assert bool((copy[..., group:] == float("-inf")).all()) and (pad > group) == (heads == 6)
    assert token.table_bytes() == copy.numel() * 4 and steps[0].table_bytes() == 0
    with pytest.raises(tps.InputError, match="tail_scores"):
        ts.VAttentionStep(q, kv, tail_scores="keys")


def test_a_quest_step_holds_its_bounds_only_where_a_thread_holds_few(monkeypatch):
    """select="resident" runs byte-wise where a row needs more than RESIDENT_KEYS bounds a
    thread: here (one a thread) 150 pages fit a row launch's 8 warps but not the bound
    kernel's 4, and the pages chosen are the same."""
    monkeypatch.setattr(tps, "RESIDENT_KEYS", 1)
    q, kv = _problem(n=600, lengths=(600, 250))
    launches = _recorded(monkeypatch)
    runs = []
    for fused in (True, False):
        step = ts.QuestStep(q, kv, page=4, pages=10, select="resident", fused_select=fused)
        step.build(kv)
        runs.append((step(q, kv).cpu(), step.chosen.cpu()))
    fused_by = [kw["SELECT_BY"] for k, kw, *_ in launches
                if k is ts._quest_bound_kernel and kw["SELECT"]]
    assert fused_by == ["bytes"] and _kwarg(launches, tps._row_topk_kernel, "HOW") == ["resident"]
    assert torch.equal(runs[0][1], runs[1][1]) and torch.equal(runs[0][0], runs[1][0])


def test_a_quest_step_refuses_an_unknown_select():
    q, kv = _problem(n=64, lengths=(64, 30))
    with pytest.raises(tps.InputError, match=r"^select: expected one of bytes, nibbles, "
                                             r"spread, resident, got 'radix'$"):
        ts.QuestStep(q, kv, page=8, pages=4, select="radix")


SELECT_KERNELS = (tk._mass_hist_kernel, tk._second_byte_kernel, tk._spread_write_kernel)


def _select_launches(launches) -> list:
    """Per launch of the mass, second-byte and write kernels: the kernel, its grid, its
    split count and tokens a program, and its splits' padding (the stats' for the mass)."""
    return [(k, grid, args["num_splits"], args["tokens_per_split"], kw.get("SPLITS_PAD"))
            for k, kw, grid, args in launches if k in SELECT_KERNELS]


@pytest.mark.parametrize("per_head", [False, True])
def test_a_select_span_launches_the_select_over_its_own_splits(monkeypatch, per_head):
    """The default launches the mass, second-byte and write kernels split like the score
    pass (its grid, splits, span and padding); select_span=N over ceil(capacity / N)
    programs a row of N tokens (the mass kernel merging the score pass's stats), at most
    the score pass's span; the rest sampler still split like the score pass; the same
    tokens."""
    q, kv = _problem()  # 900 tokens: the score pass's 4 splits of 256
    launches = _recorded(monkeypatch)
    outs = []
    for span in (None, 64, 128, 1024):
        options = {} if span is None else {"select_span": span, "mass_block": 64}
        top = tk.TopKSelect(q, kv, 40, per_head=per_head, scale=0.25, **options)
        out = torch.full((2, 2, 40 * (4 if per_head else 1)), 7, dtype=torch.int32,
                         device=DEVICE)
        top.run_scores(q, kv)
        top.run_select(kv, out)
        outs.append(out.cpu())
    rows = 2 * (8 if per_head else 2)
    score = [(tk._mass_hist_kernel, (4, rows), 4, 256, 4),
             (tk._second_byte_kernel, (4, rows), 4, 256, None),
             (tk._spread_write_kernel, (4, rows), 4, 256, 4)]
    for span, splits, pad in ((64, 15, 16), (128, 8, 8), (256, 4, 4)):  # 1024: capped
        score += [(tk._mass_hist_kernel, (splits, rows), 4, span, 4),
                  (tk._second_byte_kernel, (splits, rows), splits, span, None),
                  (tk._spread_write_kernel, (splits, rows), splits, span, pad)]
    assert _select_launches(launches) == score
    assert all(torch.equal(out, outs[0]) for out in outs[1:])
    assert _defaults() == DEFAULTS


def test_the_rest_sampler_stays_split_like_the_score_pass(monkeypatch):
    q, kv = _problem()
    launches = _recorded(monkeypatch)
    step = ts.TopKSantaStep(q, kv, k=8, S=4, select_options={"select_span": 128,
                                                                "mass_block": 128})
    step.plan(q, kv)
    rest = [(grid, args["num_splits"], args["tokens_per_split"], kw["SPLITS_PAD"])
            for k, kw, grid, args in launches
            if k in (trs._rest_sum_kernel, trs._systematic_kernel)]
    assert rest == [((4, 4), 4, 256, 4)] * 2
    assert _select_launches(launches)[1][1:] == ((8, 4), 8, 128, None)


@pytest.mark.parametrize(("options", "message"), [
    ({"select_span": 300}, "select_span: must be a power of two >= mass_block (512), got 300"),
    ({"select_span": 256}, "select_span: must be a power of two >= mass_block (512), got 256"),
    ({"select_span": 64, "mass_block": 128},
     "select_span: must be a power of two >= mass_block (128), got 64"),
    ({"select_span": 0}, "select_span: must be > 0, got 0"),
    ({"select_span": "1k"}, "select_span: expected an integer, got '1k'"),
])
def test_a_topk_select_refuses_a_bad_select_span(options, message):
    q, kv = _problem(n=64, lengths=(64, 30))
    with pytest.raises(tk.InputError, match=f"^{re.escape(message)}$"):
        tk.TopKSelect(q, kv, 8, scale=0.25, **options)
