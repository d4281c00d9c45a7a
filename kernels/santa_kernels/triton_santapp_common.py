"""SANTA++ Triton kernels: constants, Hopper launch parameters and helpers every stage uses.

The design, the stages and the byte model are in :mod:`santa_kernels.triton_santapp`.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

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
    # compact_max_cap; rows with more keys above the bound take the search. Planned only
    # without fused_finish (the fused finisher searches)
    "compact": True,
    # an option of direct selection, off by default (the finisher kernel runs): with it
    # the group's last select program (an acq_rel ticket) finds its heads' kappas and
    # writes their head lists, a team in its first selecting head's list only (the attend
    # programs read it once for the group), or the union; the select kernel then runs
    # select_warps, and no finisher kernel launches. Off: the single program's search is
    # a serial tail, the finisher kernel faster at every M and draw timed (H100, 32/8/128
    # at 32k, per-head M=32: 33.3 -> 18.8 us at B=1, 107.2 -> 66.0 with merge_ticket off
    # at B=8; pooled M=512 159.5 -> 151.2 at B=8;
    # results/h100/2026-12-07-h100-kernels-floor-32k-three-shapes,
    # profile-santapp-plans.md)
    "fused_finish": False,
    # with fused_finish and draw=pooled: the last select program draws the group's teams
    # (no pool kernel) up to this many teams a (sequence, KV head) (its row of keys in the
    # select kernel's warps); the pool kernel above
    "fused_pool_max_teams": 2048,
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
    # above those the merge kernel runs; an option there, off by default: the group's last
    # attend program (an acq_rel ticket) merges the group's partials as the merge kernel
    # would (the same output to the bit; no merge launch). Off: the merge kernel is faster
    # at every M and draw timed (same run as above)
    "merge_ticket": False,
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


# ------------------------------------------------------------- jit dot helpers
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
