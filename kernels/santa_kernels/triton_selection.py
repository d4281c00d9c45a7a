"""Fast paths of the selection methods (docs/algorithms.md section 10): the selection in
Triton kernels on the device, the attention through ``triton_indexed``.

Each method is a *step* object, built once for a query and cache shape (buffers,
workspace, splits, the seed) and then called as ``step(q, kv, layer=0)`` for one decode
step of one layer: no host-device sync, static shapes (the cache's capacity, never its
valid lengths), so a decode loop can capture it in a CUDA graph. Random numbers are
counter-based, keyed by the seed and a device step counter that every call advances
first (``rng``, in its first launch; ``reset_rng`` replays a run), so layers, steps and
graph replays draw fresh numbers (Philox, ``tl.rand``, in the kernels):

- :class:`OracleTopKStep`: the score pass and the exact top-``k`` select of
  ``triton_topk`` (by the group's summed probability, or per head by score), indexed
  attention.
- :class:`QuestStep`: per layer, the pages' key bounds ``[B, Hkv, P, 2d]`` (max, then
  min; in the cache dtype, which holds them exactly: a page's max and min are keys'
  values), built after the prefill (:meth:`QuestStep.build`). A decode step is three
  launches (``shared="group"``; four per head): one Triton kernel folds the newest
  token's key into its page (the last page's bounds, not the whole cache), writes every
  page's score bound ``τ (q⁺·max + q⁻·min)`` (the group's largest; the products exact,
  fp32 sums), and its last program of each row picks the row's top pages by a radix
  select (``triton_page_select``, the one its ``select`` names, ``SELECT`` by default;
  per head, its own launch, byte-wise or four bits a pass); the indexed kernel attends
  to the chosen pages in blocks (split-KV, then its merge, skipped with one split).
- :class:`VAttentionStep`: the score pass, ``triton_topk``'s select of the middle
  range, then one Triton kernel per (sequence, KV head) lists the sink/window/top-k
  rows, draws the base sample and writes the CLT budget, and the indexed kernel draws
  the uniform tail itself (Philox).
- :class:`TopKSantaStep`: the score pass, the group's top-k select, each head's
  systematic samples of the rest (``triton_rest_sample``: rest sums per split, then the
  samples and their per-head log-weights), so that one indexed call attends to both.

The three token methods' indexed attention takes the rows' scores from the score pass's
stash (``scores``), so it reads the chosen or drawn V rows and no key a second time.

``read_counts`` (untimed, syncs) returns what a call reads, for the byte model.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from santa_kernels import triton_page_select
from santa_kernels.kv import KVCache
from santa_kernels.reads import ReadCounts
from santa_kernels.selection import normal_quantile
from santa_kernels.triton_indexed import (
    PROGRAMS_PER_SM,
    IndexedWorkspace,
    UniformTail,
    _static_for,
    check_chunk,
    choose_splits,
    indexed_attention,
)
from santa_kernels.triton_page_select import (
    _select_row,
    _spread_count,
    _spread_select_row,
    row_topk,
    select_block,
)
from santa_kernels.triton_rest_sample import REST_BLOCK, REST_SPAN, RestSampler
from santa_kernels.triton_splitkv import _mma, kv_capacity, num_sms
from santa_kernels.triton_topk import TopKSelect
from santa_kernels.validate import InputError, check_positive_int, check_scale

UNIFORM_KEY = 0x5BD1E995  # the tensor-side uniforms' Philox key differs from the kernels'
UNIFORM_BLOCK = 1024
# VAttentionStep's tail_scores default: its tail's draws read each token's group scores from
# the stash (G floats, one sector each) and its exclusion mark ("stash"), or from a
# token-major copy the score pass also writes, -inf on the top-k ("token": one sector; the
# step 529.5 -> 496.5 us at 32/8/128, 32k, B=8, 391.4 -> 382.0 at 28/4/128, 124.9 -> 113.2
# at 32/8/128 B=1 on an H100, 2026-12-07: profile-topk-variants.md in
# results/h100/2026-12-07-h100-kernels-floor-32k-12x2-791444b)
VATTENTION_TAIL_SCORES = "token"
TAIL_SCORES = ("stash", "token")


@triton.jit
def _uniform_kernel(out_ptr, rng_ptr, seed, count, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    step = tl.load(rng_ptr)
    u = tl.rand(seed, (step << 32) + offs.to(tl.int64))
    tl.store(out_ptr + offs, u, mask=offs < count)


def counter_uniform(seed: int, step: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``shape`` fp32 uniforms in ``[0, 1)``: Philox keyed by ``seed`` and the device step
    counter ``step`` ([1] int64) and counting the elements; one kernel, no generator
    state, graph-safe."""
    count = math.prod(shape)
    out = torch.empty(shape, dtype=torch.float32, device=step.device)
    _uniform_kernel[(max(1, -(-count // UNIFORM_BLOCK)),)](
        out, step, (seed ^ UNIFORM_KEY) & 0x7FFFFFFF, count, BLOCK=UNIFORM_BLOCK)
    return out


def _unique_rows(tokens: torch.Tensor, lengths: torch.Tensor, capacity: int) -> torch.Tensor:
    """``[B, Hkv]``: distinct valid tokens among ``tokens [B, Hkv, R]``."""
    ok = (tokens >= 0) & (tokens < lengths[:, None, None])
    slot = torch.where(ok, tokens, torch.full_like(tokens, capacity)).long()
    mark = torch.zeros(*tokens.shape[:2], capacity + 1, dtype=torch.bool, device=tokens.device)
    mark.scatter_(2, slot, True)
    return mark[..., :capacity].sum(-1)


class _Step:
    """Shapes, seed, step counter and output buffer of a selection fast path."""

    def __init__(self, q: torch.Tensor, kv: KVCache, scale: float | None, seed: int) -> None:
        if not isinstance(kv, KVCache):
            raise InputError(f"kv: expected a santa_kernels.KVCache, got {type(kv).__name__}")
        self.batch, self.num_q_heads, self.head_dim = q.shape
        self.num_kv_heads = kv.num_kv_heads
        if self.num_q_heads % self.num_kv_heads:
            raise InputError(f"q: {self.num_q_heads} query heads is not a multiple of "
                             f"{self.num_kv_heads} KV heads")
        self.group = self.num_q_heads // self.num_kv_heads
        self.capacity = kv_capacity(kv)
        self.scale = check_scale(scale, self.head_dim)
        self.seed = int(seed)
        self.device = q.device
        self.rng = torch.zeros(1, dtype=torch.int64, device=q.device)
        self.out = torch.empty_like(q)

    def reset_rng(self, step: int = 0) -> None:
        """Sets the device step counter: a run replays exactly."""
        self.rng.fill_(step)

    def _workspace(self, q: torch.Tensor, kv: KVCache, rows: int,
                   programs_per_sm: int = PROGRAMS_PER_SM,
                   chunk: int | None = None) -> IndexedWorkspace:
        """The indexed attend's workspace, its splits aimed at ``programs_per_sm``
        programs an SM for ``rows`` rows in ``chunk``-row steps."""
        check_positive_int(programs_per_sm, "attend_programs_per_sm")
        self.attend_programs_per_sm = programs_per_sm
        splits = choose_splits(q, kv, rows, programs_per_sm, chunk)
        return IndexedWorkspace(self.batch, self.num_q_heads, self.head_dim, splits,
                                device=q.device)

    def _own_segments(self, width: int) -> torch.Tensor:
        """``[B, Hq, G * width]`` fp32: 0 on each head's own segment of a group list made
        of the heads' lists one after the other, -inf elsewhere."""
        own = torch.full((self.group, self.group, width), float("-inf"), device=self.device)
        own[torch.arange(self.group), torch.arange(self.group)] = 0.0
        own = own.reshape(1, 1, self.group, self.group * width)
        return own.expand(self.batch, self.num_kv_heads, -1, -1).reshape(
            self.batch, self.num_q_heads, self.group * width).contiguous()

    def _reads(self, kv: KVCache, v_rows: torch.Tensor,
               k_features: torch.Tensor | None = None) -> ReadCounts:
        lengths = kv.lengths.long()
        k_rows = lengths[:, None].expand(-1, self.num_kv_heads).contiguous()
        if k_features is None:
            k_features = k_rows * self.head_dim
        return ReadCounts(k_rows=k_rows.cpu(), k_features=k_features.long().cpu(),
                          v_rows=v_rows.long().cpu(), context=lengths.cpu(),
                          head_dim=self.head_dim)


# ------------------------------------------------------------------ oracle top-k
class OracleTopKStep(_Step):
    """Oracle top-``k`` (``shared="group"`` or ``"head"``): the score pass and the radix
    select of ``triton_topk``, then indexed attention."""

    def __init__(self, q: torch.Tensor, kv: KVCache, *, k: int, shared: str = "group",
                 scale: float | None = None, seed: int = 0,
                 select_options: dict | None = None,
                 attend_programs_per_sm: int = PROGRAMS_PER_SM) -> None:
        """``select_options``: :class:`TopKSelect`'s launch options (``spread``,
        ``l2_hints``, ``mass_block``, ``select_span``); ``attend_programs_per_sm``: the
        indexed attend's programs an SM its splits aim at."""
        super().__init__(q, kv, scale, seed)
        check_positive_int(k, "k")
        if shared not in ("group", "head"):
            raise InputError(f"shared: expected group or head, got {shared!r}")
        self.k, self.shared = min(k, self.capacity), shared
        self.top = TopKSelect(q, kv, self.k, per_head=shared == "head", scale=self.scale,
                              **(select_options or {}))
        self.scores = self.top.scores
        rows = self.k if shared == "group" else self.group * self.k
        self.rows = torch.empty(self.batch, self.num_kv_heads, rows, dtype=torch.int32,
                                device=q.device)
        self.log_weights = self._own_segments(self.k) if shared == "head" else None
        self.workspace = self._workspace(q, kv, rows, attend_programs_per_sm)

    def select(self, q: torch.Tensor, kv: KVCache) -> torch.Tensor:
        """``[B, Hkv, R]`` int32 chosen tokens (-1: none)."""
        self.top.run_scores(q, kv)
        return self.top.run_select(kv, self.rows)

    def __call__(self, q: torch.Tensor, kv: KVCache, layer: int = 0) -> torch.Tensor:
        return indexed_attention(q, kv, self.select(q, kv), log_weights=self.log_weights,
                                 scale=self.scale, out=self.out, workspace=self.workspace,
                                 scores=self.scores)

    def read_counts(self, q: torch.Tensor, kv: KVCache) -> ReadCounts:
        """Every key, and the chosen value rows (their union over the group)."""
        return self._reads(kv, _unique_rows(self.select(q, kv).long(), kv.lengths.long(),
                                            self.capacity))


# ------------------------------------------------------------------ Quest
# QuestStep's default fused_select: with shared="group" the bound kernel's last program per
# row selects (True), or triton_page_select's own launch after it (False: with the resident
# select, Quest's step 71.7 -> 59.6 us at 32/8/128, 32k, B=8 and 33.5 -> 25.3 at B=1 on an
# H100, profile-quest.md of results/h100/2026-12-07-h100-kernels-floor-32k-every-method-c373426)
QUEST_FUSED_SELECT = False
# QuestStep's default attend_programs_per_sm: its indexed attend's programs an SM (16: its
# step 1% faster than at PROGRAMS_PER_SM's 8 in the same profile, within its noise)
QUEST_PROGRAMS_PER_SM = 16
# the bound kernel's programs an SM (QuestStep's bound_programs_per_sm): each program walks
# ceil(rows x pages / (SMs x this)) pages (a power of two) in steps of QUEST_BLOCK_P's, its
# loads pipelined QUEST_BOUND_STAGES deep; None: one step a program (a program a step of
# pages, the loads of one step in flight). 8 programs, 2 stages, 64-page steps: Quest's
# step 56.2 -> 55.2 us at 32/8/128, 32k, B=8 (39.0 -> 37.7 at 28/4/128; B=1 within 0.3 us)
# on an H100, 2026-12-07, against one 128-page step a program (profile-quest-bound-loops.md
# in results/h100/2026-12-07-h100-kernels-floor-32k-12x2-791444b)
QUEST_BOUND_PROGRAMS_PER_SM = 8
QUEST_BOUND_STAGES = 2  # the bound kernel's page loop's pipeline stages (None: Triton's)


class QuestStep(_Step):
    """Quest with per-layer page bounds (see the module docstring)."""

    def __init__(self, q: torch.Tensor, kv: KVCache, *, page: int = 16, pages: int = 64,
                 shared: str = "group", scale: float | None = None, seed: int = 0,
                 num_layers: int = 1, select: str = triton_page_select.SELECT,
                 fused_select: bool = QUEST_FUSED_SELECT,
                 bound_pages: int | None = None, hist_block: int | None = None,
                 attend_programs_per_sm: int = QUEST_PROGRAMS_PER_SM,
                 bound_programs_per_sm: int | None = QUEST_BOUND_PROGRAMS_PER_SM,
                 bound_stages: int | None = QUEST_BOUND_STAGES) -> None:
        """``select``: the page select its launches run (one of
        ``triton_page_select.SELECTS``, kept as ``select_by``); ``fused_select``: with
        ``shared="group"``, select in the bound kernel's last program per row (else in
        ``triton_page_select``'s own launch); ``bound_pages``: pages a step of the bound
        kernel's programs scores (a power of two; None: ``QUEST_BLOCK_P``'s for the head
        dim, twice that for 16-bit bounds); ``bound_programs_per_sm``: the bound programs
        an SM its steps are shared out to (each program a power of two of them; None: one
        step a program); ``bound_stages``: the pipeline stages of a bound program's page
        loop (None: Triton's); ``hist_block``: the bounds a byte-wise or spread select
        step reads (``triton_page_select.select_block``; None: ``HIST_BLOCK``);
        ``attend_programs_per_sm``: the indexed attend's programs an SM its splits aim
        at."""
        super().__init__(q, kv, scale, seed)
        if bound_pages is not None:
            check_positive_int(bound_pages, "bound_pages")
            if bound_pages & (bound_pages - 1):
                raise InputError(f"bound_pages: expected a power of two, got {bound_pages}")
        self.bound_pages = bound_pages
        for name, value in (("bound_programs_per_sm", bound_programs_per_sm),
                            ("bound_stages", bound_stages)):
            if value is not None:
                check_positive_int(value, name)
        self.bound_programs_per_sm, self.bound_stages = bound_programs_per_sm, bound_stages
        self.hist_block = hist_block
        triton_page_select.check_hist_block(hist_block)
        self.fused_select = bool(fused_select)
        if select not in triton_page_select.SELECTS:
            raise InputError(f"select: expected one of "
                             f"{', '.join(triton_page_select.SELECTS)}, got {select!r}")
        self.select_by = select
        check_positive_int(page, "page")
        check_positive_int(pages, "pages")
        if shared not in ("group", "head"):
            raise InputError(f"shared: expected group or head, got {shared!r}")
        self.page, self.shared = page, shared
        self.page_cap = -(-self.capacity // page)
        self.pages = min(pages, self.page_cap)
        shape = (self.batch, self.num_kv_heads, self.page_cap, 2 * self.head_dim)
        # the cache dtype: a page's max and min are keys, so the bounds are exact
        self.bounds = [torch.zeros(shape, dtype=kv.k.dtype, device=q.device)
                       for _ in range(num_layers)]
        self.rows = torch.arange(self.batch, device=q.device)
        heads = self.num_kv_heads if shared == "group" else self.num_q_heads
        self.upper = torch.empty(self.batch, heads, self.page_cap, dtype=torch.float32,
                                 device=q.device)
        self.chosen = torch.empty(self.batch * heads, self.pages, dtype=torch.int32,
                                  device=q.device)
        self.counts = torch.empty(self.batch * heads, dtype=torch.int32, device=q.device)
        self.arrivals = torch.zeros(self.batch * self.num_kv_heads, dtype=torch.int32,
                                    device=q.device)  # the fused select's, 0 between calls
        # the spread select's row histograms (0 between calls) and its candidates' keys
        fused_rows = self.batch * self.num_kv_heads if shared == "group" else 1
        self.hist = torch.zeros(fused_rows, triton_page_select.KEY_BUCKETS, dtype=torch.int32,
                                device=q.device)
        self.cand = torch.empty(fused_rows, self.page_cap, dtype=torch.int32, device=q.device)
        self.log_weights = self._own_segments(self.pages) if shared == "head" else None
        rows = self.pages * page * (1 if shared == "group" else self.group)
        self.workspace = self._workspace(q, kv, rows, attend_programs_per_sm)

    def _keys(self, kv: KVCache, positions: torch.Tensor) -> torch.Tensor:
        """Keys at token ``positions [B, T]``: ``[B, T, Hkv, d]``."""
        if kv.layout == "contiguous":
            return kv.k[self.rows[:, None], positions]
        pages = kv.page_table[self.rows[:, None], positions // kv.page_size].long()
        return kv.k[pages, positions % kv.page_size]

    def build(self, kv: KVCache, layer: int = 0) -> None:
        """Computes every page's bounds from the cache (after the prefill)."""
        span = self.page_cap * self.page
        positions = torch.arange(span, device=self.device).clamp(max=self.capacity - 1)
        keys = self._keys(kv, positions[None, :].expand(self.batch, span))  # [B, span, H, d]
        valid = (torch.arange(span, device=self.device)[None, :]
                 < kv.lengths[:, None])[:, :, None, None]
        shape = (self.batch, self.page_cap, self.page, self.num_kv_heads, self.head_dim)
        kmax = keys.masked_fill(~valid, float("-inf")).view(shape).amax(2)
        kmin = keys.masked_fill(~valid, float("inf")).view(shape).amin(2)
        used = valid.view(self.batch, self.page_cap, self.page, 1, 1).any(2)
        zero = torch.zeros((), dtype=keys.dtype, device=self.device)
        both = torch.cat([torch.where(used, kmax, zero), torch.where(used, kmin, zero)], -1)
        self.bounds[layer].copy_(both.permute(0, 2, 1, 3))

    def page_bounds(self, q: torch.Tensor, kv: KVCache, layer: int = 0,
                    update: bool = True) -> torch.Tensor:
        """``[B, Hkv, P]`` (``shared="group"``: the group's largest) or ``[B, Hq, P]``
        fp32 score bounds, ``-inf`` past the used pages and ``+inf`` on the last one. With
        ``update``, first folds each sequence's newest key (at ``length − 1``) into its
        page's bounds (a page's first token resets them); repeating it changes nothing."""
        return self._bounds(q, kv, layer, update, select=False)

    def _bounds(self, q: torch.Tensor, kv: KVCache, layer: int, update: bool,
                select: bool) -> torch.Tensor:
        """Launches the bound kernel (with ``select``, choosing the pages as well)."""
        st = _static_for(q, kv)
        out = self.upper
        page_table = kv.page_table if st.paged else kv.lengths
        k_strides = kv.k.stride()
        bounds = self.bounds[layer]
        block_p, tiles = self._bound_steps(bounds.element_size(), q.device)
        _quest_bound_kernel[(-(-self.page_cap // (block_p * tiles)),
                             self.batch * self.num_kv_heads)](
            q, kv.k, kv.lengths, page_table, bounds, out, self.arrivals, self.chosen,
            self.counts, self.hist, self.cand, self.scale, self.page_cap,
            q.stride(0), q.stride(1), k_strides[0], k_strides[1], k_strides[2],
            page_table.stride(0) if st.paged else 0,
            bounds.stride(0), bounds.stride(1), bounds.stride(2), out.stride(0), out.stride(1),
            NUM_KV_HEADS=self.num_kv_heads, GROUP=self.group, HEAD_DIM=self.head_dim,
            BLOCK_H=st.block_h, BLOCK_P=block_p, TILES=tiles, STAGES=self.bound_stages,
            PAGE=self.page, PAGED=st.paged,
            PAGE_SIZE=st.page_size, PER_HEAD=self.shared == "head", UPDATE=update,
            DOT_PRECISION=st.precision, WIDEN_BF16=st.widen_bf16, SELECT=select,
            PAGES=self.pages, SELECT_BLOCK=self._select_block(),
            SELECT_BLOCK_K=min(1024, triton.next_power_of_2(self.pages)),
            SELECT_BY=triton_page_select.held_select(self.select_by, self.page_cap,
                                                     QUEST_BOUND_WARPS),
            num_warps=QUEST_BOUND_WARPS,
        )  # fmt: skip
        return out

    def _bound_steps(self, bound_size: int, device: torch.device) -> tuple[int, int]:
        """Pages a step of a bound program and its steps: ``bound_pages`` or
        ``QUEST_BLOCK_P``'s (16-bit bounds: twice the pages of fp32 in a step); with
        ``bound_programs_per_sm``, the steps of every row shared out over that many
        programs an SM (a power of two of steps a program)."""
        block_p = self.bound_pages or (QUEST_BLOCK_P[self.head_dim] * max(1, 4 // bound_size))
        steps = -(-self.page_cap // block_p)
        if self.bound_programs_per_sm is None or steps == 1:
            return block_p, 1
        programs = num_sms(device) * self.bound_programs_per_sm
        per_program = -(-steps * self.batch * self.num_kv_heads // programs)
        return block_p, min(triton.next_power_of_2(per_program), triton.next_power_of_2(steps))

    def _select_block(self) -> int:
        """Bounds a step of the fused select reads (byte-wise or spread: the row of up to
        ``HIST_BLOCK`` pages at once; resident: the whole row)."""
        if self.select_by == "nibbles":
            return QUEST_SELECT_BLOCK
        how = "resident" if self.select_by == "resident" else "bytes"  # spread steps as byte-wise
        return select_block(self.page_cap, how, self.hist_block, QUEST_BOUND_WARPS)

    def select(self, q: torch.Tensor, kv: KVCache, layer: int = 0,
               update: bool = False) -> torch.Tensor:
        """``[B, Hkv, R]`` int32 chosen pages, ascending (each query head's run of
        ``pages`` one after the other with ``shared="head"``), -1 after the chosen ones:
        the top ``pages`` bounds of each row (``triton_page_select``), never a page past
        the sequence, always its last one."""
        if self.shared == "group" and self.fused_select:  # one launch for both
            self._bounds(q, kv, layer, update, select=True)
        else:  # per head: a program per row rather than G rows in a bound program
            upper = self.page_bounds(q, kv, layer, update)
            row_topk(upper.view(-1, self.page_cap), self.pages, out=self.chosen,
                     counts=self.counts, select=self.select_by, hist_block=self.hist_block)
        return self.chosen.view(self.batch, self.num_kv_heads, -1)

    def __call__(self, q: torch.Tensor, kv: KVCache, layer: int = 0) -> torch.Tensor:
        chosen = self.select(q, kv, layer, update=True)
        counts = self.counts if self.shared == "group" else None  # skip the -1 tail
        return indexed_attention(q, kv, chosen, counts=counts, block=self.page,
                                 log_weights=self.log_weights, scale=self.scale,
                                 out=self.out, workspace=self.workspace)

    def read_counts(self, q: torch.Tensor, kv: KVCache, layer: int = 0) -> ReadCounts:
        """The bounds (``2 x used pages x d`` values per KV head, at their stored size in
        cache elements), the chosen pages' K and V rows (their union over the group)."""
        chosen = self.select(q, kv, layer).long()
        tokens = chosen[..., None] * self.page + torch.arange(self.page, device=self.device)
        tokens = torch.where(chosen[..., None] >= 0, tokens, torch.full_like(tokens, -1))
        rows = _unique_rows(tokens.flatten(2), kv.lengths.long(), self.capacity)
        used = (kv.lengths.long() + self.page - 1) // self.page
        # the bounds at their own dtype, in elements of the cache dtype
        per_bound = max(1, self.bounds[0].element_size() // kv.dtype.itemsize)
        return self._reads(kv, rows, (2 * per_bound * used[:, None] + rows) * self.head_dim)



# ------------------------------------------------------------------ Quest's page bounds
# pages a step of a bound program scores (fp32 bounds; twice that many 16-bit ones): one
# step of 128 16-bit pages a program at head dim 128 ran Quest's step 71.7 -> 69.1 us at
# 32/8/128, 32k, B=8 on an H100 (32 pages: 76.4; 64: 71.7); in the page loop of
# QUEST_BOUND_PROGRAMS_PER_SM's programs, 64-page steps (see there)
QUEST_BLOCK_P = {16: 64, 32: 64, 64: 64, 128: 32, 256: 16}
QUEST_SELECT_BLOCK = 256  # scores the fused select counts at a time, four bits a pass
QUEST_BOUND_WARPS = 4  # warps a program of the bound kernel (and its fused select) runs


@triton.jit
def _quest_bound_kernel(
    q_ptr, k_ptr, lengths_ptr, page_table_ptr, bounds_ptr, out_ptr,
    arrive_ptr, chosen_ptr, count_ptr, hist_ptr, cand_ptr, tau, page_cap,
    stride_qb, stride_qh, stride_kblk, stride_kn, stride_kh, stride_ptb,
    stride_bb, stride_bh, stride_bp, stride_ob, stride_oh,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_P: tl.constexpr, TILES: tl.constexpr,
    STAGES: tl.constexpr, PAGE: tl.constexpr, PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr, PER_HEAD: tl.constexpr, UPDATE: tl.constexpr,
    DOT_PRECISION: tl.constexpr, WIDEN_BF16: tl.constexpr,
    SELECT: tl.constexpr, PAGES: tl.constexpr, SELECT_BLOCK: tl.constexpr,
    SELECT_BLOCK_K: tl.constexpr, SELECT_BY: tl.constexpr,
):
    """Quest's score bounds of ``TILES`` steps of ``BLOCK_P`` pages of one (sequence, KV
    head) for its ``G`` query heads, ``τ (q⁺·max + q⁻·min)``: one product of the query's
    two signed halves ``[q⁺, q⁻]`` with a page's stored row ``[max, min]`` (the loads of
    the page loop pipelined ``STAGES`` deep); the program holding the sequence's last
    page first folds the newest key into that page's bounds (its bound is +inf anyway).
    With ``SELECT`` (the group's bound), the row's last program to finish (an arrival
    counter, reset after) picks its top ``PAGES`` pages (``triton_page_select``, the
    select ``SELECT_BY`` names; ``"spread"``: every program first adds its live pages to
    the row's key histogram at ``hist_ptr``, the candidates listed at ``cand_ptr``)."""
    first = tl.program_id(0) * (TILES * BLOCK_P)  # the program's first page
    pid = tl.program_id(1)
    b = pid // NUM_KV_HEADS
    kv_head = pid % NUM_KV_HEADS
    offs_d = tl.arange(0, HEAD_DIM)
    offs_h = tl.arange(0, BLOCK_H)
    mask_h = offs_h < GROUP
    heads = kv_head * GROUP + offs_h
    n = tl.load(lengths_ptr + b).to(tl.int32)
    used = tl.cdiv(n, PAGE)
    last_page = used - 1
    b_base = bounds_ptr + b.to(tl.int64) * stride_bb + kv_head * stride_bh
    if UPDATE:  # noqa: SIM102 (a compile-time branch around a run-time one)
        if (n > 0) & (last_page >= first) & (last_page < first + TILES * BLOCK_P):
            t = n - 1
            if PAGED:
                phys = tl.load(page_table_ptr + b * stride_ptb + t // PAGE_SIZE).to(tl.int64)
                k_row = k_ptr + phys * stride_kblk + (t % PAGE_SIZE) * stride_kn
            else:
                k_row = k_ptr + b.to(tl.int64) * stride_kblk + t.to(tl.int64) * stride_kn
            # fp32 compares (the interpreter compares 16-bit floats' bits), exact stores
            key = tl.load(k_row + kv_head * stride_kh + offs_d).to(tl.float32)
            row = b_base + last_page.to(tl.int64) * stride_bp
            kmax = tl.load(row + offs_d).to(tl.float32)
            kmin = tl.load(row + HEAD_DIM + offs_d).to(tl.float32)
            fresh = (offs_d * 0 + t % PAGE) == 0  # the page's first token: reset
            bound_ty = bounds_ptr.dtype.element_ty
            tl.store(row + offs_d, tl.where(fresh, key, tl.maximum(kmax, key)).to(bound_ty))
            tl.store(row + HEAD_DIM + offs_d,
                     tl.where(fresh, key, tl.minimum(kmin, key)).to(bound_ty))
    # the query in the cache dtype, as the attention reads it: with a 16-bit cache each
    # product q_j · bound_j is exact in fp32 (tensor cores), only the sums round; its
    # positive half meets the pages' max, its negative half their min
    offs_b = tl.arange(0, 2 * HEAD_DIM)  # a bound row: max, then min
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh
                + (offs_b % HEAD_DIM)[None, :],
                mask=mask_h[:, None], other=0.0).to(bounds_ptr.dtype.element_ty).to(tl.float32)
    q = tl.where((offs_b < HEAD_DIM)[None, :], tl.maximum(q, 0.0), tl.minimum(q, 0.0))
    q = q.to(bounds_ptr.dtype.element_ty)
    for step in tl.range(0, TILES, num_stages=STAGES):
        offs_p = first + step * BLOCK_P + tl.arange(0, BLOCK_P)
        mask_p = offs_p < page_cap
        bound = tl.load(b_base + offs_p[:, None].to(tl.int64) * stride_bp + offs_b[None, :],
                        mask=mask_p[:, None], other=0.0)
        upper = _mma(q, tl.trans(bound), None, DOT_PRECISION, WIDEN_BF16) * tau
        upper = tl.where((offs_p >= used)[None, :], float("-inf"), upper)
        upper = tl.where((offs_p == last_page)[None, :], float("inf"), upper)
        if PER_HEAD:
            tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_p[None, :],
                     upper, mask=mask_h[:, None] & mask_p[None, :])
        else:
            group_max = tl.max(tl.where(mask_h[:, None], upper, float("-inf")), axis=0)
            tl.store(out_ptr + b * stride_ob + kv_head * stride_oh + offs_p, group_max,
                     mask=mask_p)
            if SELECT and SELECT_BY == "spread":  # the row's histogram, a page at a time
                _spread_count(hist_ptr, pid, group_max, mask_p & (group_max > float("-inf")))
    if not PER_HEAD and SELECT:
        # the semaphore pattern: every thread's stores, a CTA barrier, one thread's
        # release; its acquire (then the barrier that shares its result) orders the
        # select's loads after every program's stores of the row
        tl.debug_barrier()
        arrived = tl.atomic_add(arrive_ptr + pid, 1, sem="acq_rel")
        if arrived == tl.num_programs(0) - 1:  # the row's bounds are all written
            row_at = out_ptr + b * stride_ob + kv_head * stride_oh
            chosen_at = chosen_ptr + pid.to(tl.int64) * PAGES
            if SELECT_BY == "spread":
                _spread_select_row(row_at, chosen_at, count_ptr + pid, hist_ptr, cand_ptr,
                                   pid, page_cap, PAGES, SELECT_BLOCK, SELECT_BLOCK_K)
            else:
                _select_row(row_at, chosen_at, count_ptr + pid, page_cap, PAGES,
                            SELECT_BLOCK, SELECT_BLOCK_K, SELECT_BY)
            tl.store(arrive_ptr + pid, 0)  # the next call counts afresh

# ------------------------------------------------------------------ vAttention
VATTENTION_BLOCK = 128  # rows of the exact set or draws a step of the plan kernel
# the attend's programs an SM (VAttentionStep's attend_programs_per_sm): its tail, up to
# the whole sampled range of drawn rows a (sequence, KV head), waits on its gathers, so
# it is split over more programs than the listed methods' few hundred rows
VATTENTION_PROGRAMS_PER_SM = 8
# the registers a thread of its attend (attend_max_registers): compiled for sm_90 at
# d = 128 the row programs take 148, three programs an SM; 128 fit four (a spill of 16
# bytes a thread); uncapped ran the same (626.0 against 624.5 us at 5 stages, the H100
# profile named below)
VATTENTION_MAX_REGISTERS = 128
# its attend's software pipeline stages (attend_stages; None: Triton's): 5 stages the V
# rows and scores of two row steps in shared memory, yet its step took 624.5 us against
# 534.5 with Triton's at 32/8/128, 32k, B=8 on an H100 (profile-topk.md of
# results/h100/2026-12-07-h100-kernels-floor-32k-every-method)
VATTENTION_STAGES = None


@triton.jit
def _ceil_int(x, cap):
    """``⌈min(x, cap)⌉`` as int32 for ``x >= 0`` (``tl.ceil`` is not in every Triton)."""
    x = tl.minimum(x, cap)
    whole = x.to(tl.int32)
    return tl.where(whole.to(tl.float32) < x, whole + 1, whole)


@triton.jit
def _draw_tokens(j, take, seed, base, lo, width):
    """Tokens ``lo + ⌊u · width⌋`` of draws ``j`` (Philox at ``base + j``)."""
    u = tl.rand(seed, base + j)
    pick = tl.minimum((u * width.to(tl.float32)).to(tl.int32), width - 1)
    return tl.where(take, lo + tl.maximum(pick, 0), 0)


@triton.jit
def _base_draws(j, draws, seed, rng_base, lo, width, exclude_row, s_rows, lse, mask_h,
                token_row, offs_h, GROUP_PAD: tl.constexpr, TOKEN_COPY: tl.constexpr):
    """Probabilities ``[BLOCK_H, BLOCK]`` of the base sample's draws ``j`` (0 for a draw
    that hits an exact token or lies past ``draws``), and which draws are taken: from
    the stash and the exclusion marks, or (``TOKEN_COPY``) the token-major copy, -inf on
    the exact tokens."""
    take = j < draws
    tok = _draw_tokens(j, take, seed, rng_base, lo, width)
    if TOKEN_COPY:
        s = tl.load(token_row + tok[None, :].to(tl.int64) * GROUP_PAD + offs_h[:, None],
                    mask=mask_h[:, None] & take[None, :], other=float("-inf"))
    else:
        # both loads at once (the scores' does not wait for the mark): one round trip a block
        s = tl.load(s_rows + tok[None, :], mask=mask_h[:, None] & take[None, :],
                    other=float("-inf"))
        hit = tl.load(exclude_row + tok, mask=take, other=1)
        s = tl.where((hit == 0)[None, :], s, float("-inf"))
    return tl.exp(s - lse[:, None]), take


@triton.jit
def _vattention_plan_kernel(
    scores_ptr, lse_ptr, top_ptr, lengths_ptr, exclude_ptr,
    listed_ptr, count_ptr, log_weight_ptr, lo_ptr, hi_ptr, rng_ptr, token_ptr,
    seed, base_rate, z_over_eps, draw_stride, exclude_stride, stride_sb, stride_sh,
    token_stride,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, BLOCK_H: tl.constexpr,
    SINK: tl.constexpr, WINDOW: tl.constexpr, TOPK: tl.constexpr, BLOCK: tl.constexpr,
    TOKEN_COPY: tl.constexpr, GROUP_PAD: tl.constexpr,
):
    """One (sequence, KV head) of a vAttention step: lists the exact rows (sink, window,
    top-k), marks the top-k as excluded from the tail (clearing the previous call's
    marks, so ``exclude`` needs no clearing launch), sums the exact set's
    probabilities per head, draws the base sample (two passes over the same Philox
    draws: mean, then spread), and writes the tail's CLT budget (the group's largest,
    within ``[b₀, n_s]``) and its log-weight ``log(n_s / b)``. With ``TOKEN_COPY`` the
    top-k tokens get ``-inf`` in the score pass's token-major copy instead of marks (the
    copy is rewritten every call: nothing to clear), and the base draws read the copy."""
    pid = tl.program_id(0)
    b = pid // NUM_KV_HEADS
    kv_head = pid % NUM_KV_HEADS
    offs_h = tl.arange(0, BLOCK_H)
    offs = tl.arange(0, BLOCK)
    mask_h = offs_h < GROUP
    heads = kv_head * GROUP + offs_h
    n = tl.load(lengths_ptr + b).to(tl.int32)
    lo = tl.minimum(n, SINK)
    hi = tl.maximum(n - WINDOW, lo)
    width = hi - lo
    if kv_head == 0:
        tl.store(lo_ptr + b, lo)
        tl.store(hi_ptr + b, hi)
    lse = tl.load(lse_ptr + b * NUM_KV_HEADS * GROUP + heads, mask=mask_h, other=0.0)
    s_rows = scores_ptr + b.to(tl.int64) * stride_sb + heads[:, None] * stride_sh
    exclude_row = exclude_ptr + pid.to(tl.int64) * exclude_stride
    listed = listed_ptr + pid.to(tl.int64) * (SINK + WINDOW + TOPK)
    token_row = token_ptr + pid.to(tl.int64) * token_stride
    if not TOKEN_COPY:
        for j0 in range(0, TOPK, BLOCK):  # the previous call's exclusions, cleared
            j = j0 + offs
            inside = j < TOPK
            old = tl.load(listed + SINK + WINDOW + j, mask=inside, other=-1)
            tl.store(exclude_row + old, tl.zeros([BLOCK], tl.uint8), mask=inside & (old >= 0))
        tl.debug_barrier()  # cleared before this call's marks
    exact = tl.zeros([BLOCK_H], tl.float32)
    for j0 in range(0, SINK, BLOCK):
        j = j0 + offs
        inside = j < SINK
        ok = inside & (j < lo)
        tl.store(listed + j, tl.where(ok, j, -1), mask=inside)
        s = tl.load(s_rows + j[None, :], mask=mask_h[:, None] & ok[None, :],
                    other=float("-inf"))
        exact += tl.sum(tl.exp(s - lse[:, None]), axis=1)
    for j0 in range(0, WINDOW, BLOCK):
        j = j0 + offs
        inside = j < WINDOW
        tok = hi + j
        ok = inside & (tok < n)
        tl.store(listed + SINK + j, tl.where(ok, tok, -1), mask=inside)
        s = tl.load(s_rows + tok[None, :], mask=mask_h[:, None] & ok[None, :],
                    other=float("-inf"))
        exact += tl.sum(tl.exp(s - lse[:, None]), axis=1)
    for j0 in range(0, TOPK, BLOCK):
        j = j0 + offs
        inside = j < TOPK
        tok = tl.load(top_ptr + pid.to(tl.int64) * TOPK + j, mask=inside, other=-1).to(tl.int32)
        ok = inside & (tok >= 0)
        tl.store(listed + SINK + WINDOW + j, tl.where(ok, tok, -1), mask=inside)
        s = tl.load(s_rows + tok[None, :], mask=mask_h[:, None] & ok[None, :],
                    other=float("-inf"))
        exact += tl.sum(tl.exp(s - lse[:, None]), axis=1)
        if TOKEN_COPY:  # the tail's draws find -inf on the top-k (after its sum above)
            tl.store(token_row + tok[None, :].to(tl.int64) * GROUP_PAD + offs_h[:, None],
                     tl.full([BLOCK_H, BLOCK], float("-inf"), tl.float32),
                     mask=(offs_h < GROUP_PAD)[:, None] & ok[None, :])
        else:
            tl.store(exclude_row + tok, tl.full([BLOCK], 1, tl.uint8), mask=ok)
    tl.debug_barrier()  # the exclusions are visible to the draws below

    population = width.to(tl.float32)
    base_count = tl.maximum(_ceil_int(base_rate * population, population + 2.0), 2)
    draws = tl.where(width > 0, base_count, 0)
    rng_base = (tl.load(rng_ptr) << 32) + pid.to(tl.int64) * draw_stride
    # two passes over the same draws (mean, then spread about it): the one-pass sum of
    # squares loses the spread of small probabilities to cancellation
    total = tl.zeros([BLOCK_H], tl.float32)
    for j0 in range(0, draws, BLOCK):
        p, _ = _base_draws(j0 + offs, draws, seed, rng_base, lo, width, exclude_row, s_rows,
                           lse, mask_h, token_row, offs_h, GROUP_PAD, TOKEN_COPY)
        total += tl.sum(p, axis=1)
    mean = total / base_count.to(tl.float32)
    spread = tl.zeros([BLOCK_H], tl.float32)
    for j0 in range(0, draws, BLOCK):
        p, take = _base_draws(j0 + offs, draws, seed, rng_base, lo, width, exclude_row,
                              s_rows, lse, mask_h, token_row, offs_h, GROUP_PAD, TOKEN_COPY)
        centred = tl.where(take[None, :], p - mean[:, None], 0.0)
        spread += tl.sum(centred * centred, axis=1)
    sigma = tl.sqrt(spread / (base_count - 1).to(tl.float32))
    den = exact + population * mean
    need = z_over_eps * population * sigma / tl.maximum(den, 1e-30)
    need = tl.where(mask_h, need * need, 0.0)
    budget = tl.maximum(_ceil_int(tl.max(need, axis=0), population), base_count)
    budget = tl.where(width > 0, tl.minimum(budget, width), 0)
    tl.store(count_ptr + pid, budget)
    tl.store(log_weight_ptr + pid,
             tl.log(population / tl.maximum(budget, 1).to(tl.float32)))


class VAttentionStep(_Step):
    """vAttention with the denominator budget (see the module docstring)."""

    def __init__(self, q: torch.Tensor, kv: KVCache, *, sink: int = 128, window: int = 128,
                 topk: int = 256, epsilon: float = 0.05, delta: float = 0.05,
                 base_rate: float = 0.01, mode: str = "denominator",
                 scale: float | None = None, seed: int = 0,
                 select_options: dict | None = None,
                 attend_programs_per_sm: int = VATTENTION_PROGRAMS_PER_SM,
                 attend_chunk: int | None = None,
                 attend_max_registers: int | None = VATTENTION_MAX_REGISTERS,
                 attend_stages: int | None = VATTENTION_STAGES,
                 tail_scores: str = VATTENTION_TAIL_SCORES) -> None:
        """``select_options``: as :class:`OracleTopKStep`'s; ``attend_programs_per_sm``:
        the indexed attend's programs an SM its splits aim at, for the exact rows and
        the largest tail (the whole sampled range); ``attend_chunk``: the attend's rows
        a step (``triton_indexed.CHUNK``'s for the head dim when None; kept as
        ``chunk``); ``attend_max_registers``: the registers a thread of its row programs
        (None: the compiler's choice; kept as ``max_registers``); ``attend_stages``: its
        row loop's pipeline stages (None: Triton's default; kept as ``stages``);
        ``tail_scores``: where the tail's
        draws read their scores (one of ``TAIL_SCORES``: ``"stash"``, with the top-k's
        exclusion marks; ``"token"``, a token-major copy of the scores that the score pass
        also writes and the plan sets to -inf on the top-k, kept as ``tail_scores``). None
        of them changes the draws."""
        super().__init__(q, kv, scale, seed)
        self.chunk = check_chunk(attend_chunk, self.head_dim)
        for name, value in (("attend_max_registers", attend_max_registers),
                            ("attend_stages", attend_stages)):
            if value is not None:
                check_positive_int(value, name)
        self.max_registers, self.stages = attend_max_registers, attend_stages
        if tail_scores not in TAIL_SCORES:
            raise InputError(f"tail_scores: expected one of {', '.join(TAIL_SCORES)}, got "
                             f"{tail_scores!r}")
        self.tail_scores = tail_scores
        if mode != "denominator":
            raise InputError(f"mode={mode}: the GPU path computes the denominator budget "
                             "only (mode=output runs the reference)")
        for name, value in (("sink", sink), ("window", window), ("topk", topk)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InputError(f"{name}: expected an integer >= 0, got {value!r}")
        if not (0 < epsilon < 1 and 0 < delta < 1 and 0 < base_rate <= 1):
            raise InputError("epsilon, delta: in (0, 1); base_rate: in (0, 1]")
        self.sink, self.window = min(sink, self.capacity), min(window, self.capacity)
        self.topk = min(topk, self.capacity)
        self.base_rate = float(base_rate)
        self.z_over_eps = normal_quantile(1.0 - delta / 2.0) / epsilon
        self.block_h = _static_for(q, kv).block_h
        batch, hkv = self.batch, self.num_kv_heads
        self.top = TopKSelect(q, kv, max(self.topk, 1), scale=self.scale,
                              token_copy=tail_scores == "token", **(select_options or {}))
        self.scores = self.top.scores
        self.top_rows = torch.empty(batch, hkv, max(self.topk, 1), dtype=torch.int32,
                                    device=q.device)
        # whole 4-byte words a row, so the attend reads the marks a word at a time (none
        # with the token-major copy, whose -inf leaves the top-k out)
        self.exclude = (torch.zeros(batch, hkv, -(-(self.capacity + 1) // 4) * 4,
                                    dtype=torch.uint8, device=q.device)
                        if tail_scores == "stash" else None)
        width = self.sink + self.window + self.topk
        # -1: no earlier call's top-k to clear from exclude
        self.listed = torch.full((batch, hkv, width), -1, dtype=torch.int32, device=q.device)
        self.count = torch.empty(batch, hkv, dtype=torch.int32, device=q.device)
        self.log_weight = torch.empty(batch, hkv, dtype=torch.float32, device=q.device)
        self.lo = torch.empty(batch, dtype=torch.int32, device=q.device)
        self.hi = torch.empty(batch, dtype=torch.int32, device=q.device)
        # the tail draws at most the whole range [sink, capacity - window)
        tail_rows = max(self.capacity - self.sink - self.window, 0)
        self.workspace = self._workspace(q, kv, width + tail_rows, attend_programs_per_sm,
                                         self.chunk)

    def plan(self, q: torch.Tensor, kv: KVCache) -> tuple[torch.Tensor, UniformTail]:
        """The exact rows ``[B, Hkv, R]`` and the uniform tail of one call."""
        scores = self.top.run_scores(q, kv, rng=self.rng)
        top = self.lo  # a placeholder pointer without a top-k
        if self.topk:  # the middle range's top-k; writes lse too
            top = self.top.run_select(kv, self.top_rows, self.sink, self.window)
            lse = self.top.lse
        else:
            lse = torch.logsumexp(scores, dim=-1)  # [B, Hq]
        copy = self.top.token_scores
        _vattention_plan_kernel[(self.batch * self.num_kv_heads,)](
            scores, lse, top, kv.lengths,
            self.exclude if self.exclude is not None else self.lo,
            self.listed, self.count, self.log_weight, self.lo, self.hi, self.rng,
            copy if copy is not None else scores,
            (self.seed ^ UNIFORM_KEY) & 0x7FFFFFFF, self.base_rate, self.z_over_eps,
            self.capacity, self.exclude.stride(1) if self.exclude is not None else 0,
            scores.stride(0), scores.stride(1), copy.stride(1) if copy is not None else 0,
            NUM_KV_HEADS=self.num_kv_heads, GROUP=self.group, BLOCK_H=self.block_h,
            SINK=self.sink, WINDOW=self.window, TOPK=self.topk, BLOCK=VATTENTION_BLOCK,
            TOKEN_COPY=copy is not None, GROUP_PAD=self.top.group_pad, num_warps=4,
        )  # fmt: skip
        tail = UniformTail(self.count, self.lo, self.hi, self.log_weight, self.exclude,
                           self.rng, self.seed, self.capacity, copy)
        return self.listed, tail

    def __call__(self, q: torch.Tensor, kv: KVCache, layer: int = 0) -> torch.Tensor:
        listed, tail = self.plan(q, kv)
        return indexed_attention(q, kv, listed, tail=tail, scale=self.scale, out=self.out,
                                 workspace=self.workspace, scores=self.scores,
                                 chunk=self.chunk, max_registers=self.max_registers,
                                 stages=self.stages)

    def table_bytes(self) -> int:
        """Bytes a call writes besides the cache and the stash: the token-major copy of
        the scores (with ``tail_scores="token"``)."""
        copy = self.top.token_scores
        return 0 if copy is None else copy.numel() * copy.element_size()

    def read_counts(self, q: torch.Tensor, kv: KVCache) -> ReadCounts:
        """Every key; the value rows of the exact set and of the drawn tail."""
        listed, tail = self.plan(q, kv)
        samples = torch.full((self.batch * self.num_kv_heads, self.capacity), -1,
                             dtype=torch.int32, device=self.device)
        indexed_attention(q, kv, listed, tail=tail, scale=self.scale, out=self.out,
                          workspace=self.workspace, samples=samples, scores=self.scores,
                          chunk=self.chunk, max_registers=self.max_registers,
                          stages=self.stages)
        drawn = samples.view(self.batch, self.num_kv_heads, -1).long()
        # a draw on a top-k token counts 0 (its value row is the top-k's)
        top = listed[..., self.sink + self.window:].long()
        mark = torch.zeros(self.batch, self.num_kv_heads, self.capacity + 1, dtype=torch.bool,
                           device=self.device)
        mark.scatter_(2, torch.where(top >= 0, top, self.capacity), True)
        hit = mark.gather(2, drawn.clamp_min(0))
        drawn = torch.where(hit, torch.full_like(drawn, -1), drawn)
        tokens = torch.cat([listed.long(), drawn], -1)
        return self._reads(kv, _unique_rows(tokens, kv.lengths.long(), self.capacity))


# ------------------------------------------------------------------ top-k + S²ANTA
class TopKSantaStep(_Step):
    """Top-``k`` exact plus S²ANTA-sys samples of the rest (see the module docstring)."""

    def __init__(self, q: torch.Tensor, kv: KVCache, *, k: int = 64, S: int = 128,
                 scale: float | None = None, seed: int = 0,
                 select_options: dict | None = None, rest_block: int = REST_BLOCK,
                 rest_span: int | None = REST_SPAN,
                 attend_programs_per_sm: int = PROGRAMS_PER_SM) -> None:
        """``select_options``, ``attend_programs_per_sm``: as :class:`OracleTopKStep`'s;
        ``rest_block``, ``rest_span``: the rest sampler's tokens a step and at most a
        program (``RestSampler``'s ``block`` and ``span``)."""
        super().__init__(q, kv, scale, seed)
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise InputError(f"k: expected an integer >= 0, got {k!r}")
        check_positive_int(S, "S")
        self.k, self.S = min(k, self.capacity), S
        self.top = TopKSelect(q, kv, max(self.k, 1), scale=self.scale,
                              **(select_options or {}))
        self.scores = self.top.scores
        self.sampler = RestSampler(self.top, self.k, S, block=rest_block, span=rest_span)
        self.rows = torch.empty(self.batch, self.num_kv_heads, self.k + self.group * S,
                                dtype=torch.int32, device=q.device)
        # log-weights: 0 on the top-k rows, each head's own samples after them
        self.log_weights = torch.cat([
            torch.zeros(self.batch, self.num_q_heads, self.k, device=q.device),
            self._own_segments(S)], -1).contiguous()
        self.workspace = self._workspace(q, kv, self.k + self.group * S,
                                         attend_programs_per_sm)

    def plan(self, q: torch.Tensor, kv: KVCache) -> torch.Tensor:
        """The rows ``[B, Hkv, k + G S]`` of one call (their log-weights written): the
        score pass, the top-k select, the rest's sums and systematic samples."""
        self.top.run_scores(q, kv, rng=self.rng)
        if self.k:
            self.top.run_select(kv, self.rows)
        self.sampler.run(kv, self.rows, self.log_weights, self.rng,
                         (self.seed ^ UNIFORM_KEY) & 0x7FFFFFFF)
        return self.rows

    def __call__(self, q: torch.Tensor, kv: KVCache, layer: int = 0) -> torch.Tensor:
        return indexed_attention(q, kv, self.plan(q, kv), log_weights=self.log_weights,
                                 scale=self.scale, out=self.out, workspace=self.workspace,
                                 scores=self.scores)

    def read_counts(self, q: torch.Tensor, kv: KVCache) -> ReadCounts:
        """Every key; the value rows of the top-k and of the samples (a head's sample of
        zero weight, when its rest has no mass, is not read)."""
        rows = self.plan(q, kv).long()
        live = self.log_weights.view(self.batch, self.num_kv_heads, self.group, -1)
        live = (live > float("-inf")).any(2)
        rows = torch.where(live, rows, torch.full_like(rows, -1))
        return self._reads(kv, _unique_rows(rows, kv.lengths.long(), self.capacity))
