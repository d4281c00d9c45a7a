"""Triton kernels for SANTA / S²ANTA decode attention (docs/algorithms.md sections 2-4, 8).

Two families share one split-KV skeleton (the same as ``triton_splitkv``):

* ``santa_prop`` / ``santa_sys`` / ``santa_strat`` / ``santa_iid``: two passes.
  Pass 1 ("score") reads every K row exactly once, one program per (split, sequence,
  KV head) serving all ``G`` query heads of the group through ``tl.dot``; it writes
  per tile the log-mass ``m_t + log l_t`` of every head of the group (group-major: one
  vector store a tile) and a stash of local logits ``s_i - m_t``. Pass 2
  ("sample + gather"), one program per (sequence, query head) or several sharing a
  head's samples at small batch (``sample_splits_for``), turns the tile statistics
  into the tile CDF, places the ``S`` thresholds by binary search over the tiles and
  by a local CDF inside each tile, and gathers only the sampled V rows. On Hopper it is
  launched as a programmatic dependent of pass 1 (``pdl_available``): its launch and
  prologue overlap pass 1's last wave, ``griddepcontrol.wait`` precedes its reads.
* ``santa_flash``: one streaming pass (scores, local CDF, per-tile systematic draw,
  compact V gathers, running FlashDecoding merge) and a small merge kernel over the
  splits; it lives in ``triton_santa_flash`` and shares this module's workspace, info
  and loaders.

Nothing in the hot path allocates, synchronises with the host or sorts: every buffer
lives in a reusable :class:`SantaWorkspace`, and the Philox step counter lives on the
device (incremented by the call's kernels) so CUDA-graph replays draw fresh numbers.

Byte model (bf16 K/V, ``E`` = element size, ``Hkv`` KV heads, ``G`` group size,
``N`` valid rows, ``T = ceil(N / tile)``, stash element size ``E_s``):

* prop pass 1: reads ``B*Hkv*N*d*E`` (K once) + Q; writes ``B*Hq*(N*E_s + 4*T)``.
* prop pass 2: reads ``B*Hq*4*T`` (twice, L2) + ``B*Hq*4*T`` (prefix, written and
  searched) + at most ``B*Hq*S*tile*E_s`` stash + ``<= B*Hq*S*d*E`` V rows (HBM traffic
  is the unique rows of each group); writes ``B*Hq*(d*E + 4*S)``.
* flash: see ``triton_santa_flash``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

try:  # host-side tensor descriptors (Hopper's bulk tensor copies; Triton >= 3.4)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton: K loads stay per-thread copies
    TensorDescriptor = None

from santa_kernels.kv import KVCache
from santa_kernels.reads import ReadCounts
from santa_kernels.triton_launch import (
    H200_SM_COUNT,
    _pdl_enter,
    _pdl_trigger,
    _pdl_wait,
    _row_offsets,
    _sm_count,
    pdl_available,
)
from santa_kernels.validate import InputError, check_positive_int

# -------------------------------------------------------------------- configs
# Hopper (H200, 132 SMs) launch configurations per head dim. The score pass is a pure
# HBM stream of K: 4 warps and a 3-4 deep software pipeline keep ~32-48 KB in flight
# per program. The sample pass is latency bound (binary search, gathers): 8 warps and
# one stage; SAMPLE_BLOCK samples are handled per iteration. Each value was chosen by
# timing its alternatives on an H200 (harness calls and the e2e decode loop at 8k-128k);
# the runs that chose them, with their figures and what lost, are the results/h200
# folders named below and their READMEs.
#   stream: (num_warps, num_stages) of the score pass; sample: (num_warps, SAMPLE_BLOCK)
#   subs: tiles per K load in the score pass
#   narrow: the score pass's tail (statistics, exp, stash stores) on the G real query
#     rows instead of the dot's 16 padded rows (kernels-2026-11-29-s3)
#   sample_splits: programs per head in the sample pass (None: sample_splits_for)
#   sample_small_rows / sample_small_warps: the sample pass's warps when B * Hq is at most
#     sample_small_rows
#   pdl: the sample pass is launched as a programmatic dependent of the score pass (its
#     launch and prologue overlap the score pass's last wave; it waits for the score
#     pass's writes with griddepcontrol.wait)
#   stream_large / large_groups: (num_warps, num_stages, programs per SM) of the score
#     pass from large_groups (B * Hkv) on (tune-2026-11-29-s5, e2e-variants-2026-12-01-s9)
#   stash_l2_bytes: calls whose stash (B * Hq * rows * element size) is at most this
#     store and load it with an L2 evict_last policy, so that a stash rewritten at the
#     same addresses by the next call, or the next layer's, can stay in L2 while K streams
#     past (e2e-variants-2026-12-01-s9; kernel timings give each call its own stash:
#     results/h100/timing-2026-12-06-h100)
#   tma: the score pass loads K tiles through a tensor descriptor (bulk tensor copies
#     into shared memory, completing on an mbarrier) where the cache allows one
#     (_k_descriptor); per-thread async copies otherwise (tune-2026-12-01-s10)
#   sample_phased: the sample pass as three loops (tile search; stash rows; V rows
#     pipelined through shared memory, summed by a product with ones) with this many
#     stages, except where sample_phased_skip's (lo, hi) holds B * Hq and the block is
#     under sample_phased_skip_block samples; sample_phased_block: the phased loops'
#     samples a block (tune-2026-12-01-s10, tune-2026-12-02-s16)
#   index_scaled_rows / index_scaled_block: up to this many heads (B * Hq), or from this
#     many samples a block, the row search inside a sampled tile compares the running
#     sums with one rescaled threshold a sample instead of building the tile's CDF
#     (SCALED in _block_index; tune-2026-12-02-s15, -s16)
HOPPER_CONFIGS = {
    64: {"stream": (4, 4), "sample": (8, 256), "subs": 1, "narrow": True,
         "sample_splits": None, "pdl": True},
    128: {"stream": (4, 3), "sample": (8, 128), "subs": 1, "narrow": True,
          "sample_splits": None, "pdl": True, "sample_small_rows": 64, "sample_small_warps": 4,
          "stream_large": (1, 4, 8), "large_groups": 32, "stash_l2_bytes": 12 << 20,
          "tma": True, "sample_phased": 2,
          "sample_phased_skip": (64, 256), "index_scaled_rows": 64,
          "sample_phased_block": 256, "index_scaled_block": 256,
          "sample_phased_skip_block": 256},
    256: {"stream": (8, 2), "sample": (8, 128), "subs": 1, "narrow": True,
          "sample_splits": None, "pdl": True},
}
MAX_PREFIX_IN_REGS = 2048  # tile prefixes up to this length stay in registers in pass 2
PROGRAMS_PER_SM = 4  # target waves of split programs per SM for the streaming passes
MIN_TILES_PER_SPLIT = 4  # fewer tiles per program leave the pipeline empty
MAX_SAMPLE_SPLITS = 8  # programs per head in the sample pass, at most
MAX_DESCRIPTORS = 64  # K tensor descriptors a workspace keeps (one per cache tensor)
SAMPLE_PROGRAMS_PER_SM = 1  # target sample-pass programs per SM
MIN_SAMPLES_PER_PROGRAM = 16
MODES = {"sys": 0, "strat": 1, "iid": 2, "largest-remainder": 3}
_MODE_SYS, _MODE_STRAT, _MODE_IID, _MODE_LR = 0, 1, 2, 3
_STASH_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def santa_triton_available() -> tuple[bool, str]:
    """Returns ``(available, reason)`` for the Triton SANTA kernels on this machine."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return True, "interpreter"
    if torch.cuda.is_available():
        return True, f"cuda ({torch.cuda.get_device_name()})"
    return False, "no CUDA device (set TRITON_INTERPRET=1 to run the kernels on the CPU)"


def _config(head_dim: int) -> dict:
    key = min(HOPPER_CONFIGS, key=lambda d: (abs(d - head_dim), d))
    return HOPPER_CONFIGS[key]


def _stats_rows(group: int, head_dim: int) -> int:
    """Rows the score pass's tail works on (and stats rows a tile): the G real heads
    padded to a power of two >= 2 with ``narrow``, else the dot's G_PAD >= 16 rows."""
    g_pad = max(16, _next_pow2(group))
    return min(g_pad, max(2, _next_pow2(group))) if _config(head_dim).get("narrow") else g_pad


def _large_stream(cfg: dict, groups: int) -> bool:
    """Whether the score pass over ``groups`` = B * Hkv uses ``stream_large``."""
    return "stream_large" in cfg and groups >= cfg["large_groups"]


def _stash_evict(cfg: dict, rows: int, capacity: int, stash: torch.Tensor) -> str:
    """The stash's L2 eviction policy for a call of ``rows`` = B * Hq heads: the
    config's ``stash_evict`` if set, else ``"evict_last"`` for a stash of at most
    ``stash_l2_bytes``."""
    if "stash_evict" in cfg:
        return cfg["stash_evict"]
    fits = rows * capacity * stash.element_size() <= cfg.get("stash_l2_bytes", 0)
    return "evict_last" if fits else ""


def num_splits_for(batch_kv: int, n_tiles: int, sm_count: int = H200_SM_COUNT,
                   programs_per_sm: int | None = None) -> int:
    """Returns the split count: ~``programs_per_sm`` (default PROGRAMS_PER_SM) programs
    per SM, >= MIN_TILES_PER_SPLIT tiles each."""
    per_sm = PROGRAMS_PER_SM if programs_per_sm is None else programs_per_sm
    wanted = max(1, -(-per_sm * sm_count // batch_kv))
    most = max(1, -(-n_tiles // MIN_TILES_PER_SPLIT))
    splits = min(wanted, most)
    per_split = -(-n_tiles // splits)
    return -(-n_tiles // per_split)


def sample_splits_for(rows: int, S: int, sm_count: int = H200_SM_COUNT) -> int:
    """Programs per head of the sample pass: a power of two, ~SAMPLE_PROGRAMS_PER_SM
    programs per SM, >= MIN_SAMPLES_PER_PROGRAM samples each, <= MAX_SAMPLE_SPLITS."""
    splits = 1
    while (splits < MAX_SAMPLE_SPLITS
           and 2 * rows * splits <= SAMPLE_PROGRAMS_PER_SM * sm_count
           and S // (2 * splits) >= MIN_SAMPLES_PER_PROGRAM):
        splits *= 2
    return splits


# ------------------------------------------------------------------- workspace
class SantaWorkspace:
    """Every buffer one SANTA call needs, allocated once and reused across calls.

    Sized by the largest call: ``batch``, ``num_q_heads``, ``num_kv_heads``,
    ``max_len`` (stash rows per head), ``head_dim``, ``S`` and ``tile``. Holds the
    Philox ``seed`` and the device step counter (``rng[0]``; ``rng[1]`` is the step a
    running prop call uses). Outputs returned by the kernels are views of this
    workspace: they are overwritten by the next call.
    """

    def __init__(
        self,
        batch: int,
        num_q_heads: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        S: int,
        tile: int = 64,
        *,
        device: torch.device | str = "cuda",
        stash_dtype: torch.dtype = torch.float32,
        num_splits: int | None = None,
        seed: int = 0,
    ) -> None:
        for name, value in (("batch", batch), ("num_q_heads", num_q_heads),
                            ("num_kv_heads", num_kv_heads), ("max_len", max_len),
                            ("head_dim", head_dim), ("S", S), ("tile", tile)):
            check_positive_int(value, name)
        if tile < 16 or tile & (tile - 1):
            raise InputError(f"tile: must be a power of two >= 16, got {tile}")
        if stash_dtype not in _STASH_DTYPES:
            raise InputError(f"stash_dtype: expected one of {_STASH_DTYPES}, got {stash_dtype}")
        device = torch.device(device)
        self.batch, self.num_q_heads, self.num_kv_heads = batch, num_q_heads, num_kv_heads
        self.max_len, self.head_dim, self.S, self.tile = max_len, head_dim, S, tile
        self.max_tiles = -(-max_len // tile)
        self.device, self.seed = device, int(seed)
        if num_splits is None:
            num_splits = num_splits_for(batch * num_kv_heads, self.max_tiles, _sm_count(device))
        self.num_splits = check_positive_int(num_splits, "num_splits")
        rows = batch * num_q_heads
        f32 = {"dtype": torch.float32, "device": device}
        # prop's tile log-masses m_t + log l_t, group-major [B * Hkv, T, stats_rows]
        self.stats_rows = _stats_rows(max(1, num_q_heads // num_kv_heads), head_dim)
        self.tile_lse = torch.empty(batch * num_kv_heads * self.max_tiles * self.stats_rows,
                                    **f32)
        self.prefix = torch.empty(rows, self.max_tiles, **f32)  # S * C_t
        # s_i - m_t; rows padded to whole 512-column blocks (+ one load of SUBS tiles) so
        # that the score pass stores whole tiles without a column mask (vector stores)
        stash_width = -(-max_len // 512) * 512 + 4 * tile
        self.stash = torch.empty(rows, stash_width, dtype=stash_dtype, device=device)
        self.sample_index = torch.empty(rows, S, dtype=torch.int32, device=device)
        self.part_m = torch.empty(rows, self.num_splits, **f32)
        self.part_l = torch.empty(rows, self.num_splits, **f32)
        self.part_o = torch.empty(rows, self.num_splits, head_dim, **f32)
        self.rng = torch.zeros(2, dtype=torch.int64, device=device)
        # the sample pass's per-program partial sums and per-head tickets (zero between calls)
        self.sample_part = torch.empty(rows, MAX_SAMPLE_SPLITS, _next_pow2(head_dim), **f32)
        self.sample_ticket = torch.zeros(rows, dtype=torch.int32, device=device)
        self._out: dict[torch.dtype, torch.Tensor] = {}
        self._k_descriptors: dict[tuple, object] = {}

    @classmethod
    def for_inputs(
        cls, q: torch.Tensor, kv: KVCache, S: int, tile: int = 64, **kw
    ) -> SantaWorkspace:
        """Returns a workspace that fits exactly this ``q`` and cache."""
        return cls(q.shape[0], q.shape[1], kv.num_kv_heads, _capacity(kv), kv.head_dim, S,
                   tile, device=q.device, **kw)

    def reset_rng(self, step: int = 0, seed: int | None = None) -> None:
        """Sets the device step counter (and optionally the seed): replays a run exactly."""
        self.rng.fill_(step)
        if seed is not None:
            self.seed = int(seed)

    def k_descriptor(self, kv: KVCache, rows: int):
        """:func:`_k_descriptor` of ``kv``, built once per cache tensor (about 6 us of host
        time a call otherwise); the last MAX_DESCRIPTORS caches are kept (the e2e loop
        has one a layer)."""
        k = kv.k
        key = (k.data_ptr(), tuple(k.shape), tuple(k.stride()), k.dtype, kv.layout, rows)
        if key not in self._k_descriptors:
            if len(self._k_descriptors) >= MAX_DESCRIPTORS:
                self._k_descriptors.pop(next(iter(self._k_descriptors)))
            self._k_descriptors[key] = _k_descriptor(kv, rows)
        return self._k_descriptors[key]

    def out(self, dtype: torch.dtype) -> torch.Tensor:
        """Returns the ``[batch, Hq, d]`` output buffer for ``dtype`` (allocated on first use)."""
        if dtype not in self._out:
            self._out[dtype] = torch.empty(self.batch, self.num_q_heads, self.head_dim,
                                           dtype=dtype, device=self.device)
        return self._out[dtype]

    def check(self, q: torch.Tensor, kv: KVCache, S: int, tile: int) -> None:
        """Raises unless a call with these inputs fits the workspace."""
        if q.shape[0] > self.batch or q.shape[1] != self.num_q_heads:
            raise InputError(f"workspace: sized for batch {self.batch} x {self.num_q_heads} "
                             f"heads, got q {tuple(q.shape)}")
        if kv.num_kv_heads != self.num_kv_heads or kv.head_dim != self.head_dim:
            raise InputError("workspace: KV heads / head dim differ from the workspace's")
        if _capacity(kv) > self.max_len:
            raise InputError(f"workspace: sized for {self.max_len} rows, cache holds "
                             f"{_capacity(kv)}")
        if S > self.S or tile != self.tile:
            raise InputError(f"workspace: sized for S <= {self.S}, tile {self.tile}; "
                             f"got S={S}, tile={tile}")
        if q.device != self.device:
            raise InputError(f"workspace: on {self.device}, inputs on {q.device}")


@dataclass(frozen=True)
class SantaInfo:
    """What a SANTA call sampled, for read accounting (views into the workspace).

    ``sample_index [B, Hq, S]`` (prop/sys/strat/iid): the sequence position of every
    sample. ``counts [B, Hq, Nmax]`` (flash with ``return_counts``): samples per row.
    """

    method: str
    S: int
    tile: int
    lengths: torch.Tensor
    num_kv_heads: int
    max_len: int
    sample_index: torch.Tensor | None = None
    counts: torch.Tensor | None = None

    def row_counts(self) -> torch.Tensor:
        """Returns samples per row ``[B, Hq, Nmax]`` (int64)."""
        if self.counts is not None:  # rows past a sequence's length hold stale values
            positions = torch.arange(self.counts.shape[-1], device=self.counts.device)
            valid = positions[None, None, :] < self.lengths.to(positions.device)[:, None, None]
            return torch.where(valid, self.counts.long(), 0)
        if self.sample_index is None:
            raise InputError("info: this call stored neither sample indices nor counts")
        idx = self.sample_index.long()
        counts = torch.zeros(*idx.shape[:2], self.max_len, dtype=torch.int64, device=idx.device)
        return counts.scatter_add_(-1, idx, torch.ones_like(idx))

    def read_counts(self, head_dim: int) -> ReadCounts:
        """Returns the per (sequence, KV head) reads: all K rows, the group's unique V rows."""
        counts = self.row_counts()
        batch, hq, n = counts.shape
        group = hq // self.num_kv_heads
        v_rows = (counts > 0).reshape(batch, self.num_kv_heads, group, n).any(dim=2).sum(-1)
        lengths = self.lengths.long()
        k_rows = lengths[:, None].expand(-1, self.num_kv_heads).contiguous()
        return ReadCounts(k_rows=k_rows.cpu(), k_features=(k_rows * head_dim).cpu(),
                          v_rows=v_rows.cpu(), context=lengths.cpu(), head_dim=head_dim)


# --------------------------------------------------------------- jit helpers
@triton.jit
def _group_queries(q_ptr, b, kvh, group, head_dim, stride_qb, stride_qh,
                   G_PAD: tl.constexpr, D_PAD: tl.constexpr):
    """Loads the G query heads of KV head ``kvh`` as a [G_PAD, D_PAD] block (zero-padded)."""
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D_PAD)
    mask_g = offs_g < group
    heads = kvh * group + offs_g
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_g[:, None] & (offs_d[None, :] < head_dim), other=0.0)
    return q, heads, mask_g


@triton.jit
def _tile_scores(q, k_ptr, page_table_ptr, b, kvh, t, length, head_dim, scale,
                 stride_kx, stride_ky, stride_kh, stride_pt, page_size,
                 PAGED: tl.constexpr, TILE: tl.constexpr, D_PAD: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, k_desc=None, seq_rows=0,
                 TMA: tl.constexpr = False):
    """Returns (s [G_PAD, TILE] with -inf on invalid rows, offs_n, mask_n) for tile ``t``.
    ``TMA``: K comes through ``k_desc``, a [X * seq_rows, Hkv * d] tensor descriptor of
    the contiguous cache (Hopper's bulk tensor copies; rows past ``length`` are read and
    masked, rows past the tensor's end arrive as zeros)."""
    offs_n = t * TILE + tl.arange(0, TILE)
    offs_d = tl.arange(0, D_PAD)
    mask_n = offs_n < length
    if TMA:
        k = k_desc.load([b * seq_rows + t * TILE, kvh * D_PAD])
    else:
        if PAGED:
            rows = _row_offsets(page_table_ptr, b, tl.where(mask_n, offs_n, 0), stride_kx,
                                stride_ky, stride_pt, page_size, PAGED)
            k_tile = k_ptr + rows[:, None] + kvh * stride_kh
        else:
            # one int64 tile base and int32 row offsets: cheaper address math on the hot path
            base = (tl.cast(b, tl.int64) * stride_kx + tl.cast(t * TILE, tl.int64) * stride_ky
                    + kvh * stride_kh)
            k_tile = k_ptr + base + (tl.arange(0, TILE) * stride_ky)[:, None]
        mask_k = mask_n[:, None]
        if head_dim != D_PAD:  # else no head-dim mask: full-width vector loads
            mask_k = mask_k & (offs_d[None, :] < head_dim)
        k = tl.load(k_tile + offs_d[None, :], mask=mask_k, other=0.0)
    # all G heads of the group against one K tile: K is read once per group (section 4)
    if DOT_PRECISION == "ieee":  # fp32 inputs (and bf16 under the CPU interpreter)
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:  # 16-bit K: tensor cores, fp32 accumulation
        s = tl.dot(q.to(k.dtype), tl.trans(k))
    s = s * scale
    s = tl.where(mask_n[None, :], s, float("-inf"))
    return s, offs_n, mask_n


# ------------------------------------------------------ prop pass 1: scores
@triton.jit
def _score_pass_kernel(
    q_ptr, k_ptr, lengths_ptr, page_table_ptr,
    tile_lse_ptr, stash_ptr, rng_ptr,
    scale, num_kv_heads, num_q_heads, group, head_dim: tl.constexpr, tiles_per_split,
    stash_stride, stats_stride,
    stride_qb, stride_qh, stride_kx, stride_ky, stride_kh, stride_pt, page_size,
    PAGED: tl.constexpr, TILE: tl.constexpr, SUBS: tl.constexpr, G_PAD: tl.constexpr,
    D_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr, G_ROWS: tl.constexpr = 0,
    STORES: tl.constexpr = 2, PDL: tl.constexpr = False, ENTRY_PDL: tl.constexpr = False,
    STASH_EVICT: tl.constexpr = "", k_desc=None, seq_rows=0, TMA: tl.constexpr = False,
):
    # TMA: K tiles through the tensor descriptor k_desc (see _tile_scores)
    # ENTRY_PDL: launched as a programmatic dependent of the kernel before the call (the
    # e2e chain, which writes this step's K row): wait for it before any read
    _pdl_wait(ENTRY_PDL)
    # the sample pass may launch as this grid's last wave starts (letting it launch only
    # after the loop instead: +0.4 to +1 us a layer in the e2e loop at 32k B=4, code at
    # 37d7eed)
    _pdl_trigger(PDL)
    # STASH_EVICT: the stash stores' L2 eviction policy ("evict_last": the stash, rewritten
    # at the same addresses by every layer, may stay in L2 while K streams past it)
    # STORES (profiling only): 2 = statistics and stash (the kernel), 1 = statistics only,
    # 0 = neither (the K stream and the scores alone)
    # K is loaded SUBS * TILE rows at a time (one load, one tl.dot); the statistics stay
    # per TILE rows, the granularity pass 2 samples at
    split = tl.program_id(0)
    pid_bkv = tl.program_id(1)
    b = pid_bkv // num_kv_heads
    kvh = pid_bkv % num_kv_heads
    if (split == 0) & (pid_bkv == 0):
        # section 8: snapshot the call's step for pass 2, then advance the counter
        step = tl.load(rng_ptr)
        tl.store(rng_ptr + 1, step)
        tl.store(rng_ptr, step + 1)
    LOAD: tl.constexpr = TILE * SUBS
    length = tl.load(lengths_ptr + b)
    n_blocks = tl.cdiv(length, LOAD).to(tl.int32)
    n_tiles = tl.cdiv(length, TILE).to(tl.int32)
    t_begin = split * tiles_per_split
    t_end = tl.minimum(t_begin + tiles_per_split, n_blocks)
    q, heads, mask_g = _group_queries(q_ptr, b, kvh, group, head_dim, stride_qb, stride_qh,
                                      G_PAD, D_PAD)
    ROWS: tl.constexpr = G_PAD if G_ROWS == 0 else G_ROWS
    if ROWS < G_PAD:
        # statistics and stash on the G real rows only: the dot needs >= 16 rows, the
        # rest of the tail (exp, reductions, masked stores) does not
        heads = kvh * group + tl.arange(0, ROWS)
        mask_g = tl.arange(0, ROWS) < group
    head_rows = (b * num_q_heads + heads).to(tl.int64)
    # statistics group-major, [B * Hkv, T, ROWS]: a tile's log-masses of the group's heads
    # are ROWS contiguous floats, one vector store (not G scattered ones a tile)
    offs_r = tl.arange(0, ROWS)
    stat_base = pid_bkv.to(tl.int64) * stats_stride * ROWS + offs_r
    for t in range(t_begin, t_end):
        s, offs_n, _ = _tile_scores(q, k_ptr, page_table_ptr, b, kvh, t, length, head_dim,
                                         scale, stride_kx, stride_ky, stride_kh, stride_pt,
                                         page_size, PAGED, LOAD, D_PAD, DOT_PRECISION,
                                         k_desc, seq_rows, TMA)
        if ROWS < G_PAD:  # the padding rows of q are zero (or -inf past the end): exact
            s = tl.sum(tl.reshape(s, [G_PAD // ROWS, ROWS, LOAD]), axis=0)
        # section 4: local max m_t and local mass l_t of every head on each TILE rows,
        # stored as one log-mass m_t + log l_t (pass 2 needs only the tiles' masses: the
        # stash is relative to m_t and the local CDF is normalised in the tile)
        if SUBS == 1:
            m_t = tl.max(s, axis=1)
            local = s - m_t[:, None]
            lse = m_t + tl.log(tl.sum(tl.exp(local), axis=1))
            keep = mask_g & (lse == 12345.0) if STORES == 0 else mask_g  # 0: kept live only
            tl.store(tile_lse_ptr + stat_base + t * ROWS, lse, mask=keep)
        else:
            s3 = tl.reshape(s, [ROWS, SUBS, TILE])
            m3 = tl.max(s3, axis=2)
            m3 = tl.where(m3 == float("-inf"), 0.0, m3)  # a sub-tile past the end: no NaN
            local3 = s3 - m3[:, :, None]
            l3 = tl.sum(tl.exp(local3), axis=2)
            local = tl.reshape(local3, [ROWS, LOAD])
            offs_sub = t * SUBS + tl.arange(0, SUBS)
            mask_sub = mask_g[:, None] & (offs_sub[None, :] < n_tiles)
            tl.store(tile_lse_ptr + stat_base[:, None] + offs_sub[None, :] * ROWS,
                     m3 + tl.log(l3), mask=mask_sub)
        # stash local logits s_i - m_t (<= 0): pass 2 rebuilds the local CDF from them
        if STORES == 2:
            # whole tiles (columns past the length hold -inf; the stash rows are padded):
            # without a column mask each thread's columns go out as one vector store
            tl.store(stash_ptr + head_rows[:, None] * stash_stride + offs_n[None, :],
                     local.to(stash_ptr.dtype.element_ty), mask=mask_g[:, None],
                     eviction_policy=STASH_EVICT)


@triton.jit
def _block_x(s0, s_hi, S, seed, rng_base, uniforms_ptr, head_row, uniform_stride,
             MODE: tl.constexpr, HAS_UNIFORMS: tl.constexpr, SAMPLE_BLOCK: tl.constexpr):
    """Samples ``[s0, s0 + SAMPLE_BLOCK)`` of a head (masked at ``s_hi``): their offsets,
    mask, index ``j`` and threshold ``x_j`` on the S*F scale (largest-remainder: the
    tile's own offset comes with the tile, :func:`_tile_bounds`)."""
    offs_s = s0 + tl.arange(0, SAMPLE_BLOCK)
    mask_s = offs_s < s_hi
    j = offs_s.to(tl.float32)
    # thresholds x_j on the S*F scale; sample j lands on the first row with S*F_i > x_j
    if MODE == 0:  # sys (section 3): one offset a per (b, head): x_j = j + 1 - a
        if HAS_UNIFORMS:
            u = tl.load(uniforms_ptr + head_row + 0 * offs_s)
        else:
            u = tl.rand(seed, rng_base + 0 * offs_s)
        x = j + 1.0 - u
    elif MODE == 1:  # strat: x_j = j + U_j
        if HAS_UNIFORMS:
            u = tl.load(uniforms_ptr + head_row * uniform_stride + offs_s, mask=mask_s,
                        other=0.0)
        else:
            u = tl.rand(seed, rng_base + offs_s)
        x = j + u
    elif MODE == 2:  # iid (section 2): x_j = S * U_j
        if HAS_UNIFORMS:
            u = tl.load(uniforms_ptr + head_row * uniform_stride + offs_s, mask=mask_s,
                        other=0.0)
        else:
            u = tl.rand(seed, rng_base + offs_s)
        x = S * u
    else:  # largest-remainder: prefix holds integer budgets; find the tile of sample j
        x = j + 0.5
    return offs_s, mask_s, j, x


@triton.jit
def _block_search(x, offs_s, S, prefix_ptr, stats, n_tiles, search_iters, prefix_regs,
                  SAMPLE_BLOCK: tl.constexpr, PREFIX_IN_REGS: tl.constexpr,
                  PROFILE: tl.constexpr):
    """Each sample's tile: binary search for the first t with Q_t > x (Q nondecreasing);
    with the prefix held in registers every step is a register gather, not a dependent
    round trip to L2."""
    lo = tl.zeros([SAMPLE_BLOCK], dtype=tl.int32)
    hi = lo + (n_tiles - 1).to(tl.int32)
    if PROFILE == 1:
        lo = (offs_s * n_tiles // S).to(tl.int32)
        hi = lo
    for _ in range(search_iters):
        active = lo < hi
        mid = (lo + hi) // 2
        if PREFIX_IN_REGS:
            q_mid = tl.gather(prefix_regs, mid, 0)
        else:
            q_mid = tl.load(prefix_ptr + stats + mid)
        go_left = q_mid > x
        hi = tl.where(active & go_left, mid, hi)
        lo = tl.where(active & ~go_left, mid + 1, lo)
    return lo


@triton.jit
def _tile_bounds(tile_idx, x, j, seed, rng_base, uniforms_ptr, head_row, uniform_stride,
                 prefix_ptr, stats, prefix_regs, MODE: tl.constexpr,
                 HAS_UNIFORMS: tl.constexpr, PREFIX_IN_REGS: tl.constexpr):
    """The tiles' CDF bounds ``(Q_{t-1}, Q_t]`` and the thresholds (largest-remainder:
    each tile systematic with its own offset a_t, the released code's allocation)."""
    if PREFIX_IN_REGS:
        q_prev = tl.where(tile_idx > 0,
                          tl.gather(prefix_regs, tl.maximum(tile_idx - 1, 0), 0), 0.0)
        q_tile = tl.gather(prefix_regs, tile_idx, 0)
    else:
        q_prev = tl.load(prefix_ptr + stats + tile_idx - 1, mask=tile_idx > 0, other=0.0)
        q_tile = tl.load(prefix_ptr + stats + tile_idx)
    if MODE == 3:
        if HAS_UNIFORMS:
            u = tl.load(uniforms_ptr + head_row * uniform_stride + tile_idx)
        else:
            u = tl.rand(seed, rng_base + tile_idx)
        x = j + 1.0 - u
    return q_prev, q_tile, x


@triton.jit
def _block_tiles(s0, s_hi, S, seed, rng_base, uniforms_ptr, head_row, uniform_stride,
                 prefix_ptr, stats, n_tiles, search_iters, prefix_regs, MODE: tl.constexpr,
                 HAS_UNIFORMS: tl.constexpr, SAMPLE_BLOCK: tl.constexpr,
                 PREFIX_IN_REGS: tl.constexpr, PROFILE: tl.constexpr):
    """Samples ``[s0, s0 + SAMPLE_BLOCK)`` of a head (masked at ``s_hi``): their thresholds
    ``x`` on the S*F scale, their tiles (binary search over the scaled tile CDF) and the
    tiles' CDF bounds ``(Q_{t-1}, Q_t]``."""
    offs_s, mask_s, j, x = _block_x(s0, s_hi, S, seed, rng_base, uniforms_ptr, head_row,
                                    uniform_stride, MODE, HAS_UNIFORMS, SAMPLE_BLOCK)
    tile_idx = _block_search(x, offs_s, S, prefix_ptr, stats, n_tiles, search_iters,
                             prefix_regs, SAMPLE_BLOCK, PREFIX_IN_REGS, PROFILE)
    q_prev, q_tile, x = _tile_bounds(tile_idx, x, j, seed, rng_base, uniforms_ptr, head_row,
                                     uniform_stride, prefix_ptr, stats, prefix_regs, MODE,
                                     HAS_UNIFORMS, PREFIX_IN_REGS)
    return offs_s, mask_s, x, tile_idx, q_prev, q_tile


@triton.jit
def _block_stash(stash_ptr, head_row, stash_stride, tile_idx, mask_s, length,
                 TILE: tl.constexpr, PROFILE: tl.constexpr, STASH_EVICT: tl.constexpr):
    """The stashed local logits ``[SAMPLE_BLOCK, TILE]`` of each sample's tile (-inf past
    the length and on masked samples)."""
    offs_n = tl.arange(0, TILE)
    rows = tile_idx[:, None] * TILE + offs_n[None, :]
    mask_rows = (rows < length) & mask_s[:, None]
    if PROFILE == 2:
        return tl.where(mask_rows, 0.0, float("-inf"))
    return tl.load(stash_ptr + head_row * stash_stride + rows, mask=mask_rows,
                   other=float("-inf"), eviction_policy=STASH_EVICT).to(tl.float32)


@triton.jit
def _block_index(local, x, tile_idx, q_prev, q_tile, mask_s, length, TILE: tl.constexpr,
                 SCALED: tl.constexpr = False):
    """Each sample's row: the local CDF from the stashed logits, the tile spanning
    ``(Q_{t-1}, Q_t]`` on the S*F scale."""
    weight = tl.exp(local)
    cum = tl.cumsum(weight, axis=1)
    total = tl.sum(weight, axis=1)
    if SCALED:
        # Q_{t-1} + span * cum_i / total <= x  <=>  cum_i <= (x - Q_{t-1}) / span * total:
        # one threshold a sample instead of a CDF entry a row. No row mask: the stash holds
        # -inf past the length, so cum stays flat there and the count is clamped below
        span = q_tile - q_prev
        thr = tl.where(span > 0, (x - q_prev) / span, 0.0) * total
        below = cum <= thr[:, None]
    else:
        offs_n = tl.arange(0, TILE)
        rows = tile_idx[:, None] * TILE + offs_n[None, :]
        mask_rows = (rows < length) & mask_s[:, None]
        total = tl.where(total > 0, total, 1.0)
        cdf = q_prev[:, None] + (q_tile - q_prev)[:, None] * (cum / total[:, None])
        below = (cdf <= x[:, None]) & mask_rows
    n_valid = tl.minimum(length - tile_idx * TILE, TILE).to(tl.int32)
    row = tl.minimum(tl.sum(below.to(tl.int32), axis=1), n_valid - 1)
    return tile_idx * TILE + row


@triton.jit
def _block_rows_v(v_ptr, page_table_ptr, b, kvh, index, mask_s, offs_d, mask_d, stride_vx,
                  stride_vy, stride_vh, stride_pt, page_size, PAGED: tl.constexpr,
                  PROFILE: tl.constexpr):
    """The sampled V rows ``[SAMPLE_BLOCK, D_PAD]`` (zeros on masked samples; with PROFILE
    3 their offsets instead, timing only)."""
    v_rows = _row_offsets(page_table_ptr, b, index, stride_vx, stride_vy, stride_pt,
                          page_size, PAGED)
    if PROFILE == 3:  # in V's dtype: both returns must agree (the phased loops' dot)
        return (v_rows.to(tl.float32)[:, None]
                + 0.0 * offs_d[None, :]).to(v_ptr.dtype.element_ty)
    return tl.load(v_ptr + v_rows[:, None] + kvh * stride_vh + offs_d[None, :],
                   mask=mask_s[:, None] & mask_d[None, :], other=0.0)


@triton.jit
def _block_values(v_ptr, page_table_ptr, b, kvh, index, mask_s, offs_d, mask_d, stride_vx,
                  stride_vy, stride_vh, stride_pt, page_size, PAGED: tl.constexpr,
                  PROFILE: tl.constexpr):
    """The sum of the sampled V rows ``[D_PAD]`` (fp32; each has weight 1/S, section 2)."""
    v = _block_rows_v(v_ptr, page_table_ptr, b, kvh, index, mask_s, offs_d, mask_d,
                      stride_vx, stride_vy, stride_vh, stride_pt, page_size, PAGED, PROFILE)
    return tl.sum(v.to(tl.float32), axis=0)


# ----------------------------------------------- prop pass 2: sample + gather
# Grid (B * Hq), one program per query head: at B=1 the B*Hkv grid would leave 8 of
# 132 SMs busy on a latency-bound pass (binary search, gathers); the group's heads run
# concurrently, so V rows shared inside a group are served from L2, and HBM sees
# roughly the union the read accounting reports.
@triton.jit
def _sample_pass_kernel(
    v_ptr, lengths_ptr, page_table_ptr,
    tile_lse_ptr, stash_ptr, prefix_ptr, sample_index_ptr, out_ptr,
    uniforms_ptr, rng_ptr, seed, part_ptr, ticket_ptr, samples_per_program,
    S, sample_stride, num_q_heads, group, head_dim: tl.constexpr, stash_stride, stats_stride,
    stats_rows, search_iters,
    uniform_stride, rng_stride,
    stride_vx, stride_vy, stride_vh, stride_pt, page_size, stride_ob, stride_oh,
    MODE: tl.constexpr, HAS_UNIFORMS: tl.constexpr, PAGED: tl.constexpr,
    TILE: tl.constexpr, BLOCK_T: tl.constexpr, SAMPLE_BLOCK: tl.constexpr,
    PREFIX_IN_REGS: tl.constexpr,
    D_PAD: tl.constexpr, SAMPLE_SPLITS: tl.constexpr = 1, PROFILE: tl.constexpr = 0,
    PDL: tl.constexpr = False, STASH_EVICT: tl.constexpr = "", PHASED: tl.constexpr = False,
    SCALED: tl.constexpr = False,
):
    # PROFILE (timing only, wrong outputs): 1 skips the binary search, 2 the stash load,
    # 3 the V gather
    # SAMPLE_SPLITS programs share one head's samples (program_id(1) takes samples
    # [s_lo, s_lo + samples_per_program)); each rebuilds the head's tile prefix, the last
    # to finish (an acq_rel ticket) adds the partial sums in a fixed order
    pid = tl.program_id(0)
    s_lo = tl.program_id(1) * samples_per_program
    s_hi = tl.minimum(s_lo + samples_per_program, S)
    b = pid // num_q_heads
    h = pid % num_q_heads
    kvh = h // group
    head_row = pid.to(tl.int64)  # == b * num_q_heads + h
    length = tl.load(lengths_ptr + b)
    n_tiles = tl.cdiv(length, TILE).to(tl.int32)
    stats = head_row * stats_stride
    # the head's tile log-masses in the score pass's group-major [B * Hkv, T, stats_rows]
    lse_base = (head_row // group) * stats_stride * stats_rows + head_row % group
    _pdl_enter(PDL, True)  # launched early: the score pass's writes come next
    step = tl.load(rng_ptr + 1)
    rng_base = (step << 32) + head_row * rng_stride  # section 8: (step, b, head, sample)

    prefix_regs = tl.zeros([2], dtype=tl.float32)  # replaced below where it is used
    if PREFIX_IN_REGS:
        # every tile's statistics fit one block: a single load, the prefix stays in
        # registers and the binary search below gathers from it
        offs_t = tl.arange(0, BLOCK_T)
        mask_t = offs_t < n_tiles
        if MODE != 3:
            # section 4: W_t = e^{m_t - m*} l_t / Z = e^{lse_t - max lse} / Z; scaled tile
            # CDF Q_t = S * C_t (no sort)
            lse = tl.load(tile_lse_ptr + lse_base + offs_t * stats_rows, mask=mask_t,
                          other=float("-inf"))
            mass = tl.exp(lse - tl.max(lse, axis=0))
            w_t = mass / tl.sum(mass, axis=0)
            prefix_regs = tl.where(mask_t, S * tl.cumsum(w_t, axis=0), float("inf"))
        else:  # largest-remainder budgets arrive precomputed in prefix_ptr
            prefix_regs = tl.load(prefix_ptr + stats + offs_t, mask=mask_t, other=float("inf"))
    elif MODE != 3:
        # section 4: normaliser Z = sum_t e^{lse_t - max lse} (online)
        m_star = tl.full((), float("-inf"), tl.float32)
        z = tl.full((), 0.0, tl.float32)
        for t0 in range(0, n_tiles, BLOCK_T):
            offs_t = t0 + tl.arange(0, BLOCK_T)
            mask_t = offs_t < n_tiles
            lse = tl.load(tile_lse_ptr + lse_base + offs_t * stats_rows, mask=mask_t,
                          other=float("-inf"))
            m_new = tl.maximum(m_star, tl.max(lse, axis=0))
            z = z * tl.exp(m_star - m_new) + tl.sum(tl.exp(lse - m_new), axis=0)
            m_star = m_new
        # scaled tile CDF Q_t = S * C_t by tl.cumsum (no sort): tile t spans (Q_{t-1}, Q_t]
        carry = tl.full((), 0.0, tl.float32)
        for t0 in range(0, n_tiles, BLOCK_T):
            offs_t = t0 + tl.arange(0, BLOCK_T)
            mask_t = offs_t < n_tiles
            lse = tl.load(tile_lse_ptr + lse_base + offs_t * stats_rows, mask=mask_t,
                          other=float("-inf"))
            w_t = tl.exp(lse - m_star) / z
            tl.store(prefix_ptr + stats + offs_t, S * (carry + tl.cumsum(w_t, axis=0)),
                     mask=mask_t)
            carry += tl.sum(w_t, axis=0)
        tl.debug_barrier()  # the binary search below reads other threads' prefix entries

    offs_d = tl.arange(0, D_PAD)
    mask_d = offs_d < head_dim
    acc = tl.zeros([D_PAD], dtype=tl.float32)
    # PHASED: three loops over the head's samples instead of one. (1) the tile search, in
    # registers, writing each sample's tile to sample_index; (2) the stash rows of those
    # tiles and the row inside each, overwriting sample_index; (3) the V rows. Loops 2 and 3
    # read their addresses back from memory, so Triton's pipeliner (num_stages >= 2) can
    # keep several blocks of stash or V rows in flight through shared memory, where one
    # loop holds one block's rows in registers.
    if PHASED:
        base_index = sample_index_ptr + head_row * sample_stride
        for s0 in range(s_lo, s_hi, SAMPLE_BLOCK):
            offs_s, mask_s, j, x = _block_x(s0, s_hi, S, seed, rng_base, uniforms_ptr,
                                            head_row, uniform_stride, MODE, HAS_UNIFORMS,
                                            SAMPLE_BLOCK)
            tile_idx = _block_search(x, offs_s, S, prefix_ptr, stats, n_tiles, search_iters,
                                     prefix_regs, SAMPLE_BLOCK, PREFIX_IN_REGS, PROFILE)
            tl.store(base_index + offs_s, tile_idx, mask=mask_s)
        tl.debug_barrier()  # every thread's tiles are stored before any is read back
        for s0 in range(s_lo, s_hi, SAMPLE_BLOCK):
            offs_s, mask_s, j, x = _block_x(s0, s_hi, S, seed, rng_base, uniforms_ptr,
                                            head_row, uniform_stride, MODE, HAS_UNIFORMS,
                                            SAMPLE_BLOCK)
            tile_idx = tl.load(base_index + offs_s, mask=mask_s, other=0)
            q_prev, q_tile, x = _tile_bounds(tile_idx, x, j, seed, rng_base, uniforms_ptr,
                                             head_row, uniform_stride, prefix_ptr, stats,
                                             prefix_regs, MODE, HAS_UNIFORMS, PREFIX_IN_REGS)
            local = _block_stash(stash_ptr, head_row, stash_stride, tile_idx, mask_s, length,
                                 TILE, PROFILE, STASH_EVICT)
            index = _block_index(local, x, tile_idx, q_prev, q_tile, mask_s, length, TILE,
                                 SCALED)
            tl.store(base_index + offs_s, index, mask=mask_s)
        tl.debug_barrier()  # every thread's rows are stored before any is read back
        # the sum over samples as a tensor-core product with ones (exact: fp32 sums of
        # the bf16 rows), which lets the pipeliner stage the index -> V row chain
        ones = tl.full([16, SAMPLE_BLOCK], 1.0, dtype=v_ptr.dtype.element_ty)
        acc16 = tl.zeros([16, D_PAD], dtype=tl.float32)
        for s0 in range(s_lo, s_hi, SAMPLE_BLOCK):
            offs_s = s0 + tl.arange(0, SAMPLE_BLOCK)
            mask_s = offs_s < s_hi
            index = tl.load(base_index + offs_s, mask=mask_s, other=0)
            v = _block_rows_v(v_ptr, page_table_ptr, b, kvh, index, mask_s, offs_d, mask_d,
                              stride_vx, stride_vy, stride_vh, stride_pt, page_size, PAGED,
                              PROFILE)
            if v_ptr.dtype.element_ty == tl.float32:  # fp32 rows: no tf32 rounding
                acc16 = tl.dot(ones, v, acc16, input_precision="ieee")
            else:
                acc16 = tl.dot(ones, v.to(ones.dtype), acc16)
        acc += tl.sum(tl.where(tl.arange(0, 16)[:, None] == 0, acc16, 0.0), axis=0)
    else:
        for s0 in range(s_lo, s_hi, SAMPLE_BLOCK):
            offs_s, mask_s, x, tile_idx, q_prev, q_tile = _block_tiles(
                s0, s_hi, S, seed, rng_base, uniforms_ptr, head_row, uniform_stride,
                prefix_ptr, stats, n_tiles, search_iters, prefix_regs, MODE, HAS_UNIFORMS,
                SAMPLE_BLOCK, PREFIX_IN_REGS, PROFILE)
            local = _block_stash(stash_ptr, head_row, stash_stride, tile_idx, mask_s, length,
                                 TILE, PROFILE, STASH_EVICT)
            index = _block_index(local, x, tile_idx, q_prev, q_tile, mask_s, length, TILE,
                                 SCALED)
            tl.store(sample_index_ptr + head_row * sample_stride + offs_s, index, mask=mask_s)
            acc += _block_values(v_ptr, page_table_ptr, b, kvh, index, mask_s, offs_d, mask_d,
                                 stride_vx, stride_vy, stride_vh, stride_pt, page_size, PAGED,
                                 PROFILE)
    if SAMPLE_SPLITS == 1:
        tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d,
                 (acc / S).to(out_ptr.dtype.element_ty), mask=mask_d)
    else:
        part = head_row * SAMPLE_SPLITS
        tl.store(part_ptr + (part + tl.program_id(1)) * D_PAD + offs_d, acc)
        # every thread's partial is ordered before the ticket (barrier + acq_rel atomic)
        tl.debug_barrier()
        ticket = tl.atomic_add(ticket_ptr + head_row, 1, sem="acq_rel")
        if ticket == SAMPLE_SPLITS - 1:
            offs_p = tl.arange(0, SAMPLE_SPLITS)
            parts = tl.load(part_ptr + (part + offs_p)[:, None] * D_PAD + offs_d[None, :],
                            cache_modifier=".cg")
            tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d,
                     (tl.sum(parts, axis=0) / S).to(out_ptr.dtype.element_ty), mask=mask_d)
            tl.store(ticket_ptr + head_row, 0)  # ready for the next call (graph replay)


# ------------------------------------------------------------------ host side
def _capacity(kv: KVCache) -> int:
    """Rows addressable per sequence, known without a device sync."""
    if kv.layout == "paged":
        return int(kv.page_table.shape[1]) * kv.page_size
    return int(kv.k.shape[1])


def _tile_count(kv: KVCache, tile: int) -> int:
    """Tiles of ``tile`` rows covering every addressable row: the bound ``T`` of a call."""
    return -(-_capacity(kv) // tile)


def _dot_precision(dtype: torch.dtype) -> str:
    """Returns 'ieee' (fp32 dot) for fp32 data, and for bf16 under the interpreter (whose
    numpy dot has no bf16); else 'tf32' (ignored for 16-bit inputs: tensor cores)."""
    interpreted = os.environ.get("TRITON_INTERPRET", "0") == "1"
    if dtype == torch.float32 or (interpreted and dtype == torch.bfloat16):
        return "ieee"
    return "tf32"


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _prepare(q, kv, S, tile, scale, workspace, new_workspace=None, **ws_kw):
    """Checks the inputs; returns ``(workspace, scale)``. Without ``workspace``, one for
    these inputs from ``new_workspace(q, kv, S, tile, **ws_kw)`` (default
    ``SantaWorkspace.for_inputs``: a kernel with its own split rule passes its own)."""
    if not isinstance(kv, KVCache):
        raise InputError(f"kv: expected a santa_kernels.KVCache, got {type(kv).__name__}")
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise InputError("q: expected a tensor [B, Hq, d]")
    check_positive_int(S, "S")
    check_positive_int(tile, "tile")
    batch, hq, d = q.shape
    if batch != kv.batch or d != kv.head_dim or hq % kv.num_kv_heads:
        raise InputError(f"q: shape {tuple(q.shape)} does not fit the cache "
                         f"(B={kv.batch}, Hkv={kv.num_kv_heads}, d={kv.head_dim})")
    if q.stride(-1) != 1 or kv.k.stride(-1) != 1 or kv.v.stride(-1) != 1:
        raise InputError("q/k/v: the head dim must be contiguous")
    if workspace is None:
        new_workspace = new_workspace or SantaWorkspace.for_inputs
        workspace = new_workspace(q, kv, S, tile, **ws_kw)
    workspace.check(q, kv, S, tile)
    scale = d**-0.5 if scale is None else float(scale)
    return workspace, scale


def _cache_args(kv: KVCache):
    """(page_table, PAGED, page_size, stride_pt) for the kernels."""
    if kv.layout == "paged":
        table = kv.page_table
        return table, True, kv.page_size, table.stride(0)
    return kv.lengths, False, 1, 0  # lengths stands in for the unused page table


def _check_uniforms(uniforms, shape, name="uniforms"):
    if uniforms is None:
        return None
    if tuple(uniforms.shape) != tuple(shape):
        raise InputError(f"{name}: expected shape {tuple(shape)}, got {tuple(uniforms.shape)}")
    return uniforms.to(torch.float32).contiguous()


def _score_pass(q, kv, ws: SantaWorkspace, scale: float, tile: int, stores: int = 2,
                pdl: bool = False, entry_pdl: bool = False,
                stash_evict: str | None = None) -> None:
    """Runs pass 1 (the call's tile bound is :func:`_tile_count`). ``stores`` < 2 skips the
    stash (1) or every store (0): profiling only. ``pdl``: let the next kernel (the sample
    pass, launched as a programmatic dependent) start early. ``entry_pdl``: launch this
    pass itself as a programmatic dependent of the kernel before it (it waits first).
    ``stash_evict``: the stash stores' L2 policy (None: :func:`_stash_evict`)."""
    batch, hq, d = q.shape
    hkv = kv.num_kv_heads
    cfg = _config(d)
    if stash_evict is None:
        stash_evict = _stash_evict(cfg, batch * hq, _capacity(kv), ws.stash)
    subs = cfg.get("subs", 1)
    n_blocks = -(-_capacity(kv) // (tile * subs))  # K loads of subs * tile rows
    warps, stages = cfg["stream"]
    splits = ws.num_splits
    if _large_stream(cfg, batch * hkv):
        # the statistics are per tile, not per split: the split count is the pass's own
        warps, stages, per_sm = cfg["stream_large"]
        splits = cfg.get("large_splits") or num_splits_for(batch * hkv, n_blocks,
                                                           _sm_count(q.device), per_sm)
    per_split = -(-n_blocks // splits)
    table, paged, page_size, stride_pt = _cache_args(kv)
    grid = (-(-n_blocks // per_split), batch * hkv)
    k_desc = ws.k_descriptor(kv, tile * subs) if cfg.get("tma") else None
    _score_pass_kernel[grid](
        q, kv.k, kv.lengths, table, ws.tile_lse, ws.stash, ws.rng,
        scale, hkv, hq, hq // hkv, d, per_split, ws.stash.stride(0), ws.max_tiles,
        q.stride(0), q.stride(1), kv.k.stride(0), kv.k.stride(1), kv.k.stride(2),
        stride_pt, page_size,
        PAGED=paged, TILE=tile, SUBS=subs, G_PAD=max(16, _next_pow2(hq // hkv)),
        D_PAD=_next_pow2(d), DOT_PRECISION=_dot_precision(kv.k.dtype), G_ROWS=ws.stats_rows,
        STORES=stores, PDL=pdl, ENTRY_PDL=entry_pdl, STASH_EVICT=stash_evict,
        k_desc=k_desc, seq_rows=kv.k.shape[1], TMA=k_desc is not None,
        num_warps=warps, num_stages=stages,
        **({"launch_pdl": True} if entry_pdl else {}),
    )


def _k_descriptor(kv: KVCache, rows: int):
    """A tensor descriptor of the contiguous cache's K as [X * Y, Hkv * d] with blocks of
    ``rows`` x d (one KV head's tile), or None where the layout does not allow one (paged,
    heads or sequences not packed, an unaligned base or a head dim that is not a power of
    two) or Triton lacks descriptors."""
    if TensorDescriptor is None or kv.layout == "paged":
        return None
    k = kv.k
    x, y, hkv, d = k.shape
    size = k.element_size()
    if (k.stride(3) != 1 or k.stride(2) != d or k.stride(0) != y * k.stride(1)
            or d != _next_pow2(d) or k.data_ptr() % 16 or (k.stride(1) * size) % 16):
        return None
    return TensorDescriptor(k, shape=[x * y, hkv * d], strides=[k.stride(1), 1],
                            block_shape=[rows, d])


def _block_samples(block: int, per_program: int) -> int:
    """Samples a block of the sample pass: ``block``, at most the power of two covering a
    program's samples, and at least 16."""
    return min(block, max(16, _next_pow2(max(per_program, 1))))


def _scaled_search(cfg: dict, rows: int, sample_block: int) -> bool:
    """Whether the sample pass finds rows inside tiles by the scaled search (SCALED in
    _block_index): up to ``index_scaled_rows`` heads, or blocks of at least
    ``index_scaled_block`` samples."""
    return (rows <= cfg.get("index_scaled_rows", 0)
            or sample_block >= cfg.get("index_scaled_block", 1 << 62))


@dataclass(frozen=True)
class SampleLaunch:
    """How the sample pass runs: phased loops or one, its stages, warps, samples a block
    and the row search (SCALED)."""

    phased: bool
    stages: int
    warps: int
    block: int
    scaled: bool


def _sample_launch(cfg: dict, rows: int, per_program: int) -> SampleLaunch:
    """The sample pass's launch for ``rows`` = B * Hq heads and ``per_program`` samples a
    program. The phased loops, pipelined ``sample_phased`` stages deep, from
    ``sample_phased_rows`` heads on and outside the open interval ``sample_phased_skip``,
    which applies only where their block would hold fewer than ``sample_phased_skip_block``
    samples; else one loop, one stage. ``sample_small_warps`` up to ``sample_small_rows``
    heads; the row search as :func:`_scaled_search` picks for the block."""
    warps, block = cfg["sample"]
    if rows <= cfg.get("sample_small_rows", 0):
        warps = cfg["sample_small_warps"]
    stages = cfg.get("sample_phased")
    lo, hi = cfg.get("sample_phased_skip", (0, 0))
    phased_block = _block_samples(cfg.get("sample_phased_block", block), per_program)
    skipped = lo < rows < hi and phased_block < cfg.get("sample_phased_skip_block", 1 << 62)
    phased = bool(stages) and rows >= cfg.get("sample_phased_rows", 0) and not skipped
    block = phased_block if phased else _block_samples(block, per_program)
    return SampleLaunch(phased, int(stages) if phased else 1, warps, block,
                        _scaled_search(cfg, rows, block))


def _largest_remainder_prefix(ws: SantaWorkspace, kv: KVCache, batch: int, hq: int,
                              n_tiles: int, S: int, tile: int) -> None:
    """Writes cumulative largest-remainder budgets into ``ws.prefix`` (torch ops, no sync)."""
    rows, hkv = batch * hq, kv.num_kv_heads
    lse = ws.tile_lse[: batch * hkv * ws.max_tiles * ws.stats_rows].view(
        batch, hkv, ws.max_tiles, ws.stats_rows)[:, :, :n_tiles, : hq // hkv]
    lse = lse.permute(0, 1, 3, 2).reshape(rows, n_tiles)
    tiles_per_seq = (kv.lengths + tile - 1) // tile
    valid = (torch.arange(n_tiles, device=lse.device)[None, :]
             < tiles_per_seq.repeat_interleave(hq)[:, None])
    lse = torch.where(valid, lse, float("-inf"))
    mass = torch.exp(lse - lse.amax(-1, keepdim=True))
    mass = mass / mass.sum(-1, keepdim=True)
    raw = S * mass.double()
    floor = torch.floor(raw)
    missing = S - floor.sum(-1, keepdim=True)
    order = torch.argsort(raw - floor, dim=-1, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(n_tiles, device=order.device).expand_as(order))
    budgets = floor + (rank < missing).to(floor.dtype)
    ws.prefix[:rows, :n_tiles].copy_(torch.cumsum(budgets, dim=-1))


def _sample(q, kv, S, *, mode, tile, scale, seed, uniforms, workspace, stash_dtype,
            pdl_chain=False):
    """Pass 1 + pass 2 for the global-CDF samplers (prop/sys/strat/iid). ``pdl_chain``:
    the call sits between kernels that launch as programmatic dependents (the e2e gemm
    rest): the score pass launches as a dependent of the kernel before (and waits for
    it), and the sample pass, which lets the next kernel launch once its programs run."""
    ws, scale = _prepare(q, kv, S, tile, scale, workspace, stash_dtype=stash_dtype)
    batch, hq, d = q.shape
    cfg = _config(d)
    pdl = bool(cfg.get("pdl")) and mode != _MODE_LR and pdl_available(q.device)
    # the chain only where the score pass streams in several waves of small programs
    # (measured in the e2e loop, 32k B=4, with the one-wave 4-warp stream: +2.8 us a
    # layer, s9; not profiled: likely the early-launched grid placed unevenly over SMs
    # the previous kernel still holds)
    chain = (bool(pdl_chain) and pdl_available(q.device)
             and _large_stream(cfg, batch * kv.num_kv_heads))
    stash_evict = _stash_evict(cfg, batch * hq, _capacity(kv), ws.stash)
    n_tiles = _tile_count(kv, tile)
    expected = {_MODE_SYS: (batch, hq), _MODE_STRAT: (batch, hq, S), _MODE_IID: (batch, hq, S),
                _MODE_LR: (batch, hq, n_tiles)}[mode]
    uniforms = _check_uniforms(uniforms, expected)  # before any launch
    _score_pass(q, kv, ws, scale, tile, pdl=pdl, entry_pdl=chain, stash_evict=stash_evict)
    if mode == _MODE_LR:
        _largest_remainder_prefix(ws, kv, batch, hq, n_tiles, S, tile)
    table, paged, page_size, stride_pt = _cache_args(kv)
    out = ws.out(q.dtype)
    prefix_in_regs = n_tiles <= MAX_PREFIX_IN_REGS
    splits = cfg.get("sample_splits") or sample_splits_for(batch * hq, S, _sm_count(q.device))
    splits = min(splits, MAX_SAMPLE_SPLITS) if prefix_in_regs else 1
    per_program = -(-S // splits)
    launch = _sample_launch(cfg, batch * hq, per_program)
    _sample_pass_kernel[(batch * hq, splits)](
        kv.v, kv.lengths, table, ws.tile_lse, ws.stash, ws.prefix,
        ws.sample_index, out, uniforms if uniforms is not None else ws.prefix, ws.rng,
        ws.seed if seed is None else int(seed), ws.sample_part, ws.sample_ticket, per_program,
        S, ws.S, hq, hq // kv.num_kv_heads, d, ws.stash.stride(0), ws.max_tiles,
        ws.stats_rows, max(0, math.ceil(math.log2(n_tiles))) if n_tiles > 1 else 0,
        expected[-1] if len(expected) == 3 else 1, max(S, ws.max_tiles),
        kv.v.stride(0), kv.v.stride(1), kv.v.stride(2), stride_pt, page_size,
        out.stride(0), out.stride(1),
        MODE=mode, HAS_UNIFORMS=uniforms is not None, PAGED=paged, TILE=tile,
        BLOCK_T=min(MAX_PREFIX_IN_REGS, _next_pow2(n_tiles)), SAMPLE_BLOCK=launch.block,
        PREFIX_IN_REGS=prefix_in_regs, SAMPLE_SPLITS=splits,
        PROFILE=cfg.get("sample_profile", 0), PDL=pdl, STASH_EVICT=stash_evict,
        PHASED=launch.phased, SCALED=launch.scaled,
        D_PAD=_next_pow2(d), num_warps=launch.warps, num_stages=launch.stages,
        **({"launch_pdl": True} if pdl else {}),
    )
    info = SantaInfo(method={_MODE_SYS: "prop", _MODE_STRAT: "strat", _MODE_IID: "iid",
                             _MODE_LR: "prop-largest-remainder"}[mode],
                     S=S, tile=tile, lengths=kv.lengths, num_kv_heads=kv.num_kv_heads,
                     max_len=_capacity(kv), sample_index=ws.sample_index[: batch * hq, :S].view(
                         batch, hq, S))
    return out[:batch], info


# ------------------------------------------------------------------ public API
def santa_prop(
    q: torch.Tensor, kv: KVCache, S: int, *, tile: int = 64, alloc: str = "systematic",
    scale: float | None = None, seed: int | None = None, uniforms: torch.Tensor | None = None,
    workspace: SantaWorkspace | None = None, stash_dtype: torch.dtype = torch.float32,
    pdl_chain: bool = False,
) -> tuple[torch.Tensor, SantaInfo]:
    """Returns ``(out [B, Hq, d] in q.dtype, info)`` of S²ANTA-prop (section 4).

    ``alloc="systematic"`` (default): global systematic sampling, one offset per
    (sequence, head) (``uniforms [B, Hq]`` overrides Philox). ``"largest-remainder"``:
    the released code's tile budgets, one offset per tile (``uniforms [B, Hq, T]``).
    ``pdl_chain``: inside a chain of programmatic dependents (the e2e gemm rest).
    """
    if alloc not in ("systematic", "largest-remainder"):
        raise InputError(f"alloc: expected 'systematic' or 'largest-remainder', got {alloc!r}")
    mode = _MODE_SYS if alloc == "systematic" else _MODE_LR
    return _sample(q, kv, S, mode=mode, tile=tile, scale=scale, seed=seed, uniforms=uniforms,
                   workspace=workspace, stash_dtype=stash_dtype, pdl_chain=pdl_chain)


def santa_sys(q: torch.Tensor, kv: KVCache, S: int, **kw) -> tuple[torch.Tensor, SantaInfo]:
    """Returns S²ANTA-sys (section 3): identical to prop with global systematic allocation."""
    return santa_prop(q, kv, S, alloc="systematic", **kw)


def santa_strat(
    q: torch.Tensor, kv: KVCache, S: int, *, tile: int = 64, scale: float | None = None,
    seed: int | None = None, uniforms: torch.Tensor | None = None,
    workspace: SantaWorkspace | None = None, stash_dtype: torch.dtype = torch.float32,
    pdl_chain: bool = False,
) -> tuple[torch.Tensor, SantaInfo]:
    """Returns S²ANTA-strat (section 3): thresholds ``(j + U_j)/S`` (``uniforms [B, Hq, S]``)."""
    return _sample(q, kv, S, mode=_MODE_STRAT, tile=tile, scale=scale, seed=seed,
                   uniforms=uniforms, workspace=workspace, stash_dtype=stash_dtype,
                   pdl_chain=pdl_chain)


def santa_iid(
    q: torch.Tensor, kv: KVCache, S: int, *, tile: int = 64, scale: float | None = None,
    seed: int | None = None, uniforms: torch.Tensor | None = None,
    workspace: SantaWorkspace | None = None, stash_dtype: torch.dtype = torch.float32,
    pdl_chain: bool = False,
) -> tuple[torch.Tensor, SantaInfo]:
    """Returns SANTA (section 2): ``S`` i.i.d. samples from softmax (``uniforms [B, Hq, S]``)."""
    return _sample(q, kv, S, mode=_MODE_IID, tile=tile, scale=scale, seed=seed,
                   uniforms=uniforms, workspace=workspace, stash_dtype=stash_dtype,
                   pdl_chain=pdl_chain)


def santa_flash(q: torch.Tensor, kv: KVCache, S: int, **kw) -> tuple[torch.Tensor, SantaInfo]:
    """Returns S²ANTA-flash (section 4): :func:`santa_kernels.triton_santa_flash.santa_flash`
    (its own module: one streaming pass with compact V gathers and the split merge)."""
    from santa_kernels.triton_santa_flash import santa_flash as flash

    return flash(q, kv, S, **kw)
