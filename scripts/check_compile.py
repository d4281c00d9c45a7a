"""Compiles Triton kernels for sm_90 without a GPU (frontend + LLVM; catches the errors the
interpreter cannot see, e.g. a variable whose type differs between branches).

Run anywhere:  python3 scripts/check_compile.py   (the kernel groups in up to 2 processes)
Registers and spills: TRITON_DUMP_PTXAS_LOG=1 TRITON_CACHE_DIR=$(mktemp -d) before it
(ptxas's report above each kernel's line; a cached kernel prints none).
A kernel's static cost, to compare variants before any GPU run: ``--sass`` prints above
each kernel's line its SASS instruction count and the counts of the instructions that
set a program's serial latency (barriers, shuffles and warp reductions, shared and global
atomics, global and shared loads and stores, asynchronous copies, tensor-core
instructions; nvdisasm from the Triton wheel); ``--only
quest,topk`` compiles those groups alone.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import santa_kernels.triton_indexed as tix
import santa_kernels.triton_page_select as tps
import santa_kernels.triton_rest_sample as trs
import santa_kernels.triton_santa as ts
import santa_kernels.triton_santa_flash as tsf
import santa_kernels.triton_santapp_attend as tsp_attend
import santa_kernels.triton_santapp_merge as tsp_merge
import santa_kernels.triton_santapp_pack as tsp_pack
import santa_kernels.triton_santapp_pool as tsp_pool
import santa_kernels.triton_santapp_select as tsp_select
import santa_kernels.triton_selection as tsel
import santa_kernels.triton_topk as ttk
from santa_kernels.triton_splitkv import MIN_BLOCK_H, choose_num_splits

TARGET = GPUTarget("cuda", 90, 32)
H100_SHARED = 232448  # shared memory one program may use on sm_90 (227 KiB)
H100_SMS = 132
CTX = 32768  # the selection methods' shapes: ctx 32k, B = 8, page size 16
BATCH = 8
PAGE_SIZE = 16
SASS_ENV = "CHECK_COMPILE_SASS"  # "1": each compiled kernel's SASS summary (--sass)
# the SASS opcodes a summary counts: barriers, shuffles and warp reductions, shared and
# global atomics and reductions, global and shared loads and stores, asynchronous copies
# (cp.async, TMA), tensor-core instructions
SASS_OPS = ("BAR", "SHFL", "REDUX", "ATOMS", "ATOMG", "RED", "LDG", "STG", "LDS", "STS",
            "LDGSTS", "UTMALDG", "HMMA", "HGMMA")


def compile_kernel(fn, types: list[str], consts: dict, options: dict | None = None,
                   divisible: tuple[str, ...] = (), pipelined: bool = False,
                   staged: tuple[str, ...] = (), max_shared: int | None = None,
                   require: str | None = None) -> str | None:
    """Returns None when ``fn`` compiles, else the error. ``types``: the non-constexpr
    arguments in order; ``consts``: every constexpr argument by name; ``options``: launch
    options (num_warps, num_stages). ``divisible``: integer arguments to specialise as
    multiples of 16, as a launch does for such values (pointers always are: torch's
    allocations are aligned); without the hint loads are not vectorised and Triton's
    pipeliner skips them. ``pipelined``: also fail unless the pipeliner staged a load
    through shared memory (async copies); ``staged``: element types (``"i16"``,
    ``"bf16"``) every one of whose loads it must have staged (a synchronous load of that
    type left in the loop exposes its latency every iteration); ``max_shared``: fail when
    the kernel needs more shared memory a program than this (bytes); ``require``: fail
    unless the TTGIR holds this text (e.g. an op name)."""
    runtime = [name for name in fn.arg_names if name not in consts]
    if len(runtime) != len(types):  # e.g. a new constexpr missing from consts
        return (f"{len(types)} types for {len(runtime)} non-constexpr arguments "
                f"({', '.join(runtime[len(types):] or runtime[-1:])} ...): list every "
                f"constexpr in consts and one type per other argument")
    it = iter(types)
    sig = {name: "constexpr" if name in consts else next(it) for name in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if divisible and name not in consts and (sig[name].startswith("*")
                                                      or name in divisible)}
    src = ASTSource(
        fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()},
        attrs=attrs,
    )
    try:
        kernel = triton.compile(src, target=TARGET, options=options)
    except Exception as exc:  # report the frontend's message
        return f"{type(exc).__name__}: {exc}"
    if os.environ.get(SASS_ENV) == "1":
        print(f"  {sass_summary(kernel.asm['cubin'])}")
    ttgir = kernel.asm["ttgir"]
    if max_shared is not None and kernel.metadata.shared > max_shared:
        return f"needs {kernel.metadata.shared} bytes of shared memory (> {max_shared})"
    if require is not None and require not in ttgir:
        return f"no {require} in the TTGIR"
    if pipelined and "async_copy_global_to_local" not in ttgir:
        return "not pipelined: no load staged through shared memory"
    for ty in staged:
        if re.search(rf"tt\.load %[\w.]+(, [^:]*)?: tensor<[0-9x]+x!tt\.ptr<{ty}>", ttgir):
            return f"a {ty} load is not staged through shared memory"
    return None


def sass_summary(cubin: bytes) -> str:
    """``sass: N instructions (BAR b, ...)``: the kernel's SASS instructions (nvdisasm of
    the Triton wheel) and the count of each of ``SASS_OPS`` present."""
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                            "nvdisasm")
    if not os.path.exists(nvdisasm):
        return "sass: no nvdisasm in the Triton wheel"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        done = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True,
                              check=False)
    if done.returncode:
        return f"sass: nvdisasm failed: {done.stderr.strip()[:200]}"
    ops = collections.Counter(
        m.group(1).split(".")[0] for m in
        re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", done.stdout))
    counts = ", ".join(f"{op} {ops[op]}" for op in SASS_OPS if ops[op])
    return f"sass: {sum(ops.values())} instructions ({counts})"


def check_finish() -> int:
    """The SANTA++ finishers."""
    failures = 0
    finish_types = ["*fp32", "*fp32", "*i32", "*i32", "*fp32", "*i32", "*i32", "*i32", "*i32",
                    "*i32"] + ["i32"] * 6
    for local, h_rows, compact in ((False, 1, 0), (False, 2, 0), (False, 4, 0), (True, 1, 0),
                                   (True, 2, 0), (True, 4, 0), (False, 1, 64),
                                   (False, 1, 128)):
        consts = {"NUM_KV_HEADS": 8, "GROUP": 4, "G_ROWS": 4, "H_ROWS": h_rows,
                  "C_PAD": 2048, "S_PAD": 32, "LOCAL": local, "WAYS": 8, "PDL": local,
                  "WRITE_UNION": h_rows != 2, "SEARCH": h_rows != 4,
                  "BRACKET": 0 if local else (h_rows % 3 + 1 if not compact else 2),
                  "HEAD_LISTS": h_rows == 1, "COMPACT": compact, "TOPS_PAD": 64}
        err = compile_kernel(tsp_select._finish_heads_kernel, finish_types, consts,
                             {"num_warps": 8})
        print(f"_finish_heads_kernel local={local} h_rows={h_rows} "
              f"bracket={consts['BRACKET']} compact={compact}: {err or 'ok'}")
        failures += err is not None
    return failures


def check_score() -> int:
    """The prop score and sample passes, the reps kernel."""
    failures = 0
    score_types = ["*bf16", "*bf16", "*i32", "*i32", "*fp32", "*fp16", "*i64", "fp32"]
    score_types += ["i32"] * 13 + ["i32"]  # ..., page_size; seq_rows (k_desc: None)
    for group, g_rows, subs, stores in ((4, 4, 1, 2), (4, 4, 2, 2), (4, 0, 1, 2), (1, 2, 1, 2),
                                        (8, 8, 1, 2), (4, 4, 1, 0)):
        consts = {"head_dim": 128, "PAGED": False, "TILE": 64, "SUBS": subs, "G_PAD": 16,
                  "D_PAD": 128, "DOT_PRECISION": "tf32", "G_ROWS": g_rows, "STORES": stores,
                  "PDL": group in (4, 8), "ENTRY_PDL": group == 8,
                  "STASH_EVICT": "", "k_desc": None, "TMA": False}
        err = compile_kernel(ts._score_pass_kernel, score_types, consts)
        print(f"_score_pass_kernel G={group} G_ROWS={g_rows} SUBS={subs} STORES={stores}: "
              f"{err or 'ok'}")
        failures += err is not None
    warps, stages, _ = ts.HOPPER_CONFIGS[128]["stream_large"]  # B * Hkv >= large_groups
    consts = {"head_dim": 128, "PAGED": False, "TILE": 64, "SUBS": 1, "G_PAD": 16,
              "D_PAD": 128, "DOT_PRECISION": "tf32", "G_ROWS": 4, "STORES": 2, "PDL": True,
              "ENTRY_PDL": True,  # as the e2e chain launches it
              "STASH_EVICT": "evict_last", "k_desc": None, "TMA": False}
    err = compile_kernel(ts._score_pass_kernel, score_types, consts,
                         {"num_warps": warps, "num_stages": stages}, pipelined=True,
                         divisible=("stash_stride", "stats_stride", "stride_qb", "stride_qh",
                                    "stride_kx", "stride_ky", "stride_kh"))
    print(f"_score_pass_kernel stream_large ({warps} warps, {stages} stages): {err or 'ok'}")
    failures += err is not None
    # K through a tensor descriptor (tma): bulk tensor copies, pipelined by Triton
    tma_types = [*score_types[:21], "tensordesc<bf16[64, 128]>", "i32"]
    for launch in (ts.HOPPER_CONFIGS[128]["stream"], (warps, stages)):
        tma_consts = {k: v for k, v in consts.items() if k != "k_desc"}
        err = compile_kernel(ts._score_pass_kernel, tma_types, {**tma_consts, "TMA": True},
                             {"num_warps": launch[0], "num_stages": launch[1]},
                             divisible=("stash_stride", "stats_stride", "stride_qb",
                                        "stride_qh"),
                             require="ttng.async_tma_copy_global_to_local")
        print(f"_score_pass_kernel TMA ({launch[0]} warps, {launch[1]} stages): {err or 'ok'}")
        failures += err is not None
    sample_types = ["*bf16", "*i32", "*i32", "*fp32", "*fp16", "*fp32", "*i32", "*bf16",
                    "*fp32", "*i64", "i32", "*fp32", "*i32", "i32"] + ["i32"] * 17
    for mode, splits in ((0, 1), (0, 8), (1, 4), (3, 2)):
        consts = {"head_dim": 128, "MODE": mode, "HAS_UNIFORMS": False, "PAGED": False,
                  "TILE": 64, "BLOCK_T": 512, "SAMPLE_BLOCK": 16, "PREFIX_IN_REGS": True,
                  "D_PAD": 128, "SAMPLE_SPLITS": splits, "PROFILE": 0, "PDL": splits > 1,
                  "STASH_EVICT": "evict_last" if splits == 8 else "", "PHASED": False,
                  "SCALED": splits == 8}
        err = compile_kernel(ts._sample_pass_kernel, sample_types, consts,
                             {"num_warps": 8, "num_stages": 1})
        print(f"_sample_pass_kernel MODE={mode} SAMPLE_SPLITS={splits}: {err or 'ok'}")
        failures += err is not None
        # the phased loops: the V rows (and their indices) staged through shared memory
        err = compile_kernel(ts._sample_pass_kernel, sample_types,
                             {**consts, "SAMPLE_BLOCK": 64, "PHASED": True,
                              "SCALED": mode != 1},
                             {"num_warps": 8, "num_stages": 3},
                             divisible=("sample_stride", "stride_vx", "stride_vy", "stride_vh"),
                             staged=("bf16",))
        print(f"_sample_pass_kernel MODE={mode} SAMPLE_SPLITS={splits} PHASED: {err or 'ok'}")
        failures += err is not None
    # the H200 default at one program a head from S=256 (HOPPER_CONFIGS[128]): 256 samples a
    # block, the scaled row search
    err = compile_kernel(ts._sample_pass_kernel, sample_types,
                         {**consts, "MODE": 0, "SAMPLE_SPLITS": 1, "SAMPLE_BLOCK": 256,
                          "PHASED": True, "SCALED": True, "PDL": True, "STASH_EVICT": ""},
                         {"num_warps": 8, "num_stages": 2},
                         divisible=("sample_stride", "stride_vx", "stride_vy", "stride_vh"),
                         staged=("bf16",))
    print(f"_sample_pass_kernel PHASED SAMPLE_BLOCK=256 SCALED: {err or 'ok'}")
    failures += err is not None
    for profile in (1, 2, 3):  # timing-only flags (tune_h200.py sample), both loop forms
        for phased in (False, True):
            err = compile_kernel(ts._sample_pass_kernel, sample_types,
                                 {**consts, "SAMPLE_BLOCK": 64, "PHASED": phased,
                                  "PROFILE": profile}, {"num_warps": 8, "num_stages": 2})
            print(f"_sample_pass_kernel PROFILE={profile} PHASED={phased}: {err or 'ok'}")
            failures += err is not None
    reps_types = ["*bf16", "*bf16", "*i32", "i32", "i32"] + ["i32"] * 6
    for team_size, mean in ((16, False), (64, True), (4, False)):
        consts = {"NUM_KV_HEADS": 8, "P": team_size, "HEAD_DIM": 128, "D_PAD": 128,
                  "TB": max(1, tsp_pack.REPS_KERNEL_ELEMENTS // (team_size * 128)), "MEAN": mean}
        err = compile_kernel(tsp_pack._contiguous_reps_kernel, reps_types, consts)
        print(f"_contiguous_reps_kernel P={team_size} MEAN={mean}: {err or 'ok'}")
        failures += err is not None
    return failures


def check_attend() -> int:
    """The SANTA++ attend kernel over the union list or the per-head lists, contiguous or
    paged; the merge kernel."""
    failures = 0
    types = ["*bf16"] * 5 + ["*i32", "*i32", "*i32", "*i32", "*i32", "*fp32", "*fp32",
                             "*fp32", "*i32", "*i32", "*fp32", "*fp32", "*fp32", "*fp32",
                             "*fp32", "*fp32", "*i32", "*bf16", "*i64", "fp32"]
    types += ["i32"] * 18
    # the merge: the merge kernel, the atomic sums or (ticket) the group's last program
    for lists, paged, atomic, ticket in ((False, False, False, False),
                                         (True, False, False, False), (True, True, False, True),
                                         (True, False, True, False), (True, True, True, False),
                                         (False, False, False, True)):
        consts = {"NUM_KV_HEADS": 8, "GROUP": 4, "HEAD_DIM": 128, "D_PAD": 128, "G_PAD": 16,
                  "TPB": 4, "SLOT": 16, "CHUNKS": 1, "BLOCK_E": 64, "PACKED": False,
                  "PAGED": paged, "REGULAR": True, "DOT_PRECISION": "tf32", "PDL": True,
                  "HEAD_LISTS": lists, "MERGE_ATOMIC": atomic, "BLOCK_S": 64,
                  "LET_NEXT": atomic, "LOOPS": 1, "ATTEND_STAGES": 1, "PRELOAD": False,
                  "L_PAD": 1, "POOLED": False,
                  "MERGE_TICKET": ticket}
        err = compile_kernel(tsp_attend._attend_kernel, types, consts, {"num_warps": 4})
        print(f"_attend_kernel head_lists={lists} paged={paged} atomic={atomic} "
              f"ticket={ticket}: {err or 'ok'}")
        failures += err is not None
    # team programs walking several tiles, pipelined (K/V staged through shared memory:
    # with num_stages=1 only the tile loop can be), 2 chunks of 64-row slots (P = 128),
    # the atomic merge
    for paged, stages in ((False, 2), (False, 3), (True, 2)):
        consts = {"NUM_KV_HEADS": 8, "GROUP": 4, "HEAD_DIM": 128, "D_PAD": 128, "G_PAD": 16,
                  "TPB": 1, "SLOT": 64, "CHUNKS": 2, "BLOCK_E": 64, "PACKED": False,
                  "PAGED": paged, "REGULAR": True, "DOT_PRECISION": "tf32", "PDL": True,
                  "HEAD_LISTS": True, "MERGE_ATOMIC": True, "BLOCK_S": 64,
                  "LET_NEXT": True, "LOOPS": 4, "ATTEND_STAGES": stages, "PRELOAD": False,
                  "L_PAD": 4, "POOLED": False,
                  "MERGE_TICKET": False}
        # as launched: num_stages=1 for the kernel (the exact-set loop), the tile loop's own
        err = compile_kernel(tsp_attend._attend_kernel, types, consts,
                             {"num_warps": 4, "num_stages": 1},
                             divisible=("stride_kx", "stride_ky", "stride_kh"), pipelined=True,
                             max_shared=H100_SHARED)
        print(f"_attend_kernel loops=4 stages={stages} paged={paged}: {err or 'ok'}")
        failures += err is not None
    # one team a tile, its entries, rows and weights preloaded: the loop loads only K/V,
    # stages - 1 buffers of 64 x 128 rows each (1 with the team id loaded in the loop);
    # teams of 2 chunks, the union list
    for tpb, slot, chunks, loops, stages, lists in (
        (1, 64, 1, 32, 3, True), (1, 64, 1, 4, 4, True), (1, 64, 2, 4, 3, False),
    ):
        consts = {"NUM_KV_HEADS": 8, "GROUP": 4, "HEAD_DIM": 128, "D_PAD": 128, "G_PAD": 16,
                  "TPB": tpb, "SLOT": slot, "CHUNKS": chunks, "BLOCK_E": 64, "PACKED": False,
                  "PAGED": False, "REGULAR": True, "DOT_PRECISION": "tf32", "PDL": True,
                  "HEAD_LISTS": lists, "MERGE_ATOMIC": False, "BLOCK_S": 64,
                  "LET_NEXT": False, "LOOPS": loops, "ATTEND_STAGES": stages, "PRELOAD": True,
                  "L_PAD": loops, "POOLED": False,
                  "MERGE_TICKET": False}
        err = compile_kernel(tsp_attend._attend_kernel, types, consts,
                             {"num_warps": 4, "num_stages": 1},
                             divisible=("stride_kx", "stride_ky", "stride_kh"), pipelined=True,
                             max_shared=H100_SHARED,
                             require=f"{stages - 1}x{tpb * slot}x128xbf16")
        print(f"_attend_kernel preload tpb={tpb} loops={loops} stages={stages} "
              f"chunks={chunks} lists={lists}: {err or 'ok'}")
        failures += err is not None
    # draw=pooled: the group's list of M teams and their shared 1/pi, as the plan gives it
    # at 32k B=8 M=512 (32/8/128: 4 tiles of 4 teams a program, the merge kernel after it,
    # or with merge_ticket the last program merging; 12/2/128: the atomic merge), and one
    # team a tile preloaded, pipelined (either merge)
    for group, tpb, stages, preload, atomic, ticket in (
        (4, 4, 1, False, False, True), (4, 4, 1, False, False, False),
        (6, 4, 1, False, True, False), (4, 1, 3, True, False, True),
        (4, 1, 3, True, False, False),
    ):
        consts = {"NUM_KV_HEADS": 8 if group == 4 else 2, "GROUP": group, "HEAD_DIM": 128,
                  "D_PAD": 128, "G_PAD": 16, "TPB": tpb, "SLOT": 16 if tpb == 4 else 64,
                  "CHUNKS": 1, "BLOCK_E": 64, "PACKED": False, "PAGED": False,
                  "REGULAR": True, "DOT_PRECISION": "tf32", "PDL": True, "HEAD_LISTS": False,
                  "MERGE_ATOMIC": atomic, "BLOCK_S": 64, "LET_NEXT": atomic, "LOOPS": 4,
                  "ATTEND_STAGES": stages, "PRELOAD": preload, "L_PAD": 4, "POOLED": True,
                  "MERGE_TICKET": ticket}
        err = compile_kernel(tsp_attend._attend_kernel, types, consts,
                             {"num_warps": 4, "num_stages": 1},
                             divisible=("stride_kx", "stride_ky", "stride_kh"),
                             pipelined=preload, max_shared=H100_SHARED)
        print(f"_attend_kernel pooled G={group} tpb={tpb} preload={preload} "
              f"atomic={atomic} ticket={ticket}: {err or 'ok'}")
        failures += err is not None
    consts = {"NUM_KV_HEADS": 8, "GROUP": 4, "HEAD_DIM": 128, "D_PAD": 128, "BLOCK_S": 64,
              "PDL": True, "LET_NEXT": False}
    err = compile_kernel(tsp_merge._merge_kernel, ["*fp32"] * 3 + ["*bf16", "*i64"] + ["i32"] * 3,
                         consts, {"num_warps": 8})
    print(f"_merge_kernel: {err or 'ok'}")
    failures += err is not None
    return failures


def _select_types(reps: str) -> list[str]:
    """The select kernel's non-constexpr argument types, its representatives ``*reps``."""
    return ["*bf16", f"*{reps}", "*fp32", "*fp32", "*fp32", "*i64", "i32", "*fp32", "*fp32",
            "*fp32", "*i32", "*i32", "*i32", "*fp32", "*i32", "*i32", "*fp32", "*fp32",
            "fp32"] + ["i32"] * 7


def check_select() -> int:
    """The SANTA++ select kernel: bf16 or int8 representatives, direct or local selection,
    launched as a programmatic dependent (ENTRY_PDL) or not."""
    failures = 0
    for reps, local, entry in (("bf16", False, False), ("i8", False, True),
                               ("i8", True, True), ("bf16", True, False)):
        types = _select_types(reps)
        consts = {"NUM_KV_HEADS": 8, "GROUP": 4, "HEAD_DIM": 128, "D_PAD": 128, "G_PAD": 16,
                  "G_ROWS": 4, "TB": 128, "M1_PAD": 64, "LOCAL": local, "HAS_GUMBELS": False,
                  "DOT_PRECISION": "tf32", "PDL": True, "ENTRY_PDL": entry,
                  "REPS_AS": "bf16" if reps == "i8" else "",
                  "BRACKET": 0 if local else (2 if reps == "bf16" else 3),
                  "HEAD_LISTS": reps == "i8", "TOPS": reps == "i8" and not local,
                  "POOLED": False,
                  "FINISH": False, "C_PAD": 2, "S_PAD": 2, "WAYS": 8}
        err = compile_kernel(tsp_select._select_kernel, types, consts, {"num_warps": 4})
        print(f"_select_kernel reps={reps} local={local} entry_pdl={entry} "
              f"bracket={consts['BRACKET']}: {err or 'ok'}")
        failures += err is not None
    # the group's last program finishing the selection at 32k (2048 teams, 8 warps): head
    # lists by the bracketed search (M=32, bracket 2; M=64, bracket 3; B=1: 64 teams a
    # program), the union by the search from the row's keys (M=512, B=8)
    for bracket, m1_pad, tb, lists in ((2, 64, 64, True), (3, 128, 64, True),
                                       (0, 1024, 128, False)):
        consts = {"NUM_KV_HEADS": 8, "GROUP": 4, "HEAD_DIM": 128, "D_PAD": 128, "G_PAD": 16,
                  "G_ROWS": 4, "TB": tb, "M1_PAD": m1_pad, "LOCAL": False,
                  "HAS_GUMBELS": False, "DOT_PRECISION": "tf32", "PDL": True,
                  "ENTRY_PDL": False, "REPS_AS": "", "BRACKET": bracket, "HEAD_LISTS": lists,
                  "TOPS": False, "POOLED": False, "FINISH": True, "C_PAD": 2048,
                  "S_PAD": 2048 // tb, "WAYS": 4}
        err = compile_kernel(tsp_select._select_kernel, _select_types("bf16"), consts,
                             {"num_warps": 8})
        print(f"_select_kernel finishing bracket={bracket} head_lists={lists}: "
              f"{err or 'ok'}")
        failures += err is not None
    # draw=pooled: phi only, for the pool kernel (GQA 4 and 6, bf16 and int8 reps), which
    # holds a group's 2048 teams (32k) or 16384 (its most)
    # (and G=4 again with the group's last program drawing: no pool kernel)
    for reps, group, fused in (("bf16", 4, False), ("i8", 6, False), ("bf16", 4, True)):
        types = _select_types(reps)
        consts = {"NUM_KV_HEADS": 8, "GROUP": group, "HEAD_DIM": 128, "D_PAD": 128,
                  "G_PAD": 16, "G_ROWS": _pad(group), "TB": 128, "M1_PAD": 1024,
                  "LOCAL": False, "HAS_GUMBELS": False, "DOT_PRECISION": "tf32", "PDL": True,
                  "ENTRY_PDL": False, "REPS_AS": "bf16" if reps == "i8" else "",
                  "BRACKET": 0, "HEAD_LISTS": False, "TOPS": False, "POOLED": True,
                  "FINISH": fused, "C_PAD": 2048 if fused else 2, "S_PAD": 16 if fused else 2,
                  "WAYS": 8}
        err = compile_kernel(tsp_select._select_kernel, types, consts, {"num_warps": 4})
        print(f"_select_kernel pooled reps={reps} G={group} fused={fused}: {err or 'ok'}")
        failures += err is not None
    pool_types = ["*fp32", "*fp32", "*i64", "i32", "*fp32", "*fp32", "*i32", "*i32", "*fp32",
                  "i32", "i32", "i32"]
    for group, c_pad, warps, ways, gumbels in ((4, 2048, 4, 8, False), (6, 2048, 4, 8, True),
                                               (8, 16384, 8, 4, False)):
        consts = {"NUM_KV_HEADS": 8, "GROUP": group, "G_ROWS": _pad(group), "C_PAD": c_pad,
                  "HAS_GUMBELS": gumbels, "WAYS": ways, "PDL": True}
        err = compile_kernel(tsp_pool._pool_kernel, pool_types, consts, {"num_warps": warps})
        print(f"_pool_kernel G={group} C_PAD={c_pad} gumbels={gumbels}: {err or 'ok'}")
        failures += err is not None
    return failures


def check_bernoulli() -> int:
    """The Bernoulli stage's effective-query kernel, both groupings, Philox and uniforms."""
    import santa_kernels.triton_bernoulli as tb

    failures = 0
    types = ["*bf16", "*bf16", "*i32", "*fp32", "*i64", "*i32", "i32"] + ["i32"] * 6
    for mean_group, uniforms in ((False, False), (True, False), (False, True)):
        consts = {"MEAN_GROUP": mean_group, "HAS_UNIFORMS": uniforms, "G_PAD": 4,
                  "D_PAD": 128, "TINY": tb._TINY, "MIN_INCLUSION": tb._MIN_INCLUSION}
        err = compile_kernel(tb._bernoulli_query_kernel, types, consts, {"num_warps": 4})
        print(f"_bernoulli_query_kernel mean_group={mean_group} uniforms={uniforms}: "
              f"{err or 'ok'}")
        failures += err is not None
    return failures


def check_decode_linear() -> int:
    """The e2e decode GEMM (santa_bench.e2e.gemm) in each of its uses: its weight loads
    must be staged through shared memory (a weight stream with nothing in flight is slow)."""
    from santa_bench.e2e import gemm

    failures = 0
    for bias, silu, dtype in ((False, False, "bf16"), (True, False, "bf16"),
                              (False, True, "bf16"), (False, False, "fp32"),
                              (False, True, "fp32")):
        types = [f"*{dtype}"] * 4 + ["i32"] * 5
        size = 4 if dtype == "fp32" else 2
        block_n, block_k, warps, stages = gemm.gemm_config(4096, 4096, silu, size)
        consts = {"HAS_BIAS": bias, "SILU": silu, "BLOCK_M": 16, "BLOCK_N": block_n,
                  "BLOCK_K": block_k, "IEEE": dtype == "fp32", "PDL": True}
        err = compile_kernel(gemm._decode_linear_kernel, types, consts,
                             {"num_warps": warps, "num_stages": stages},
                             divisible=("K", "stride_xm", "stride_wn"), pipelined=True,
                             staged=() if bias else (dtype,),  # the bias: after the loop
                             max_shared=H100_SHARED)
        print(f"_decode_linear_kernel bias={bias} silu={silu} {dtype}: {err or 'ok'}")
        failures += err is not None
    return failures


def check_flash() -> int:
    """santa-flash's kernel (triton_santa_flash) with the constexprs and launch its host
    picks by shape: K through a tensor descriptor (bulk tensor copies) or pointer loads
    (paged); pairs with compares and V loaded twice (P < CLOSED_MIN_SAMPLES) or the closed
    form and V once; one tile a draw (a large group, or P > 8: unpacked columns); the
    2-warp launch of many groups; the split merge as a programmatic dependent."""
    failures = 0
    divisible = ("stride_qb", "stride_qh", "stride_kx", "stride_ky", "stride_kh", "stride_vx",
                 "stride_vy", "stride_vh")
    # (head dim, group, sequences x KV heads, paged, P)
    for d, group, groups, paged, samples in (
            (128, 4, 8, False, 4), (128, 4, 8, False, 1), (128, 1, 8, True, 4),
            (64, 8, 16, False, 1), (256, 3, 16, True, 16), (128, 8, 8, False, 4),
            (128, 16, 64, False, 2), (128, 4, 64, False, 8), (128, 7, 32, False, 4)):
        packed = samples <= 8
        draw_tiles = tsf.default_draw_tiles(group, samples) if packed else 1
        closed = samples >= tsf.CLOSED_MIN_SAMPLES
        warps, stages = tsf.flash_config(d, groups, pairs=draw_tiles == 2, heads=group)
        options = {"num_warps": warps, "num_stages": stages}
        if draw_tiles == 2 and tsf.PAIR_MAXNREG.get(warps):
            options["maxnreg"] = tsf.PAIR_MAXNREG[warps]
        rows = max(2, ts._next_pow2(group))
        table = "*i32" if paged else "*i64"
        types = ["*bf16"] * 3 + ["*i64", table] + ["*fp32"] * 5 + ["*i64", "i32", "fp32"]
        types += ["i32"] * 19
        consts = {"head_dim": d, "PAGED": paged, "TILE": 64, "G_PAD": max(16, rows),
                  "ROWS": rows, "D_PAD": d, "P": samples,
                  "GR": max(16, draw_tiles * rows * samples), "HAS_UNIFORMS": False,
                  "STORE_COUNTS": False, "DOT_PRECISION": "tf32", "W_BITS": tsf.W_BITS,
                  "TMA": not paged, "HALVES": 2, "PACKED": packed, "DRAW_TILES": draw_tiles,
                  "V_TWICE": not closed, "CLOSED_COLUMNS": closed,
                  "LET_MERGE": groups < tsf.LARGE_GROUPS}
        if paged:
            consts["k_desc"] = None
            types += ["i32"]
        else:
            types += [f"tensordesc<bf16[64, {d}]>", "i32"]
        err = compile_kernel(tsf._flash_kernel, types, consts, options, divisible,
                             require=None if paged else "ttng.async_tma_copy_global_to_local")
        print(f"_flash_kernel d={d} G={group} groups={groups} paged={paged} P={samples} "
              f"draw_tiles={draw_tiles} ({warps}, {stages}): {err or 'ok'}")
        failures += err is not None
    for pdl in (False, True):
        err = compile_kernel(tsf._merge_kernel, ["*fp32"] * 3 + ["*bf16", "*i64"] + ["i32"] * 5,
                             {"head_dim": 128, "SPLIT_PAD": 64, "D_PAD": 128, "PDL": pdl},
                             {"num_warps": tsf.MERGE_WARPS})
        print(f"flash _merge_kernel PDL={pdl}: {err or 'ok'}")
        failures += err is not None
    return failures


def _topk_splits(d: int, num_kv_heads: int) -> int:
    """The splits of triton_topk's score pass at ``CTX`` and ``BATCH`` (as TopKSelect
    computes them)."""
    block_n = tix.SCORE_BLOCK_N[d]
    tiles = -(-CTX // block_n)
    splits = choose_num_splits(BATCH * num_kv_heads, CTX, block_n, H100_SMS,
                               ttk.SCORE_PROGRAMS_PER_SM)
    return -(-tiles // -(-tiles // splits))


# the selection kernels' integer arguments (besides strides) that are multiples of 16 at
# CTX and BATCH: capacities, page counts, list widths, split spans
ALIGNED = ("capacity", "tokens_per_split", "page_cap", "width", "idx_cap", "tail_stride",
           "draw_stride")


def _aligned(fn) -> tuple[str, ...]:
    """``fn``'s integer arguments a launch at ``CTX`` and ``BATCH`` specialises as
    multiples of 16: its strides (a 0 stride too) and those of ``ALIGNED``."""
    return tuple(a for a in fn.arg_names if a.startswith("stride_") or a in ALIGNED)


def _pad(n: int) -> int:
    return triton.next_power_of_2(n)


def check_topk() -> int:
    """triton_topk's score pass, mass + histogram and radix select; triton_rest_sample's
    rest sums and systematic samples (top-k + S²ANTA), at the GQA groups, head dims and
    layouts the selection methods launch them with."""
    failures = 0
    # (head dim, group, KV heads, paged)
    for d, group, hkv, paged in ((128, 4, 8, False), (128, 8, 4, True), (64, 7, 2, False),
                                 (64, 1, 8, True)):
        splits = _topk_splits(d, hkv)
        types = ["*bf16", "*bf16", "*i64", "*i32" if paged else "*i64", "*fp32", "*fp32",
                 "*fp32", "*i64", "*fp32", "fp32"] + ["i32"] * 11
        consts = {"NUM_KV_HEADS": hkv, "GROUP": group, "HEAD_DIM": d,
                  "BLOCK_H": max(MIN_BLOCK_H, _pad(group)), "BLOCK_N": tix.SCORE_BLOCK_N[d],
                  "PAGED": paged, "PAGE_SIZE": PAGE_SIZE if paged else 1,
                  "DOT_PRECISION": "tf32", "WIDEN_BF16": False, "BUMP": not paged,
                  # the L2-hinted loads and stores, and the plain ones
                  "K_EVICTION": "evict_first" if d == 128 else "",
                  "S_EVICTION": "evict_last" if d == 128 else "",
                  # vAttention's token-major copy of the scores (its tail's draws read it)
                  "TOKEN_COPY": group in (4, 7), "GROUP_PAD": _pad(group)}
        err = compile_kernel(ttk._score_stats_kernel, types, consts,
                             {"num_warps": ttk.NUM_WARPS},
                             max_shared=H100_SHARED, divisible=_aligned(ttk._score_stats_kernel))
        print(f"_score_stats_kernel d={d} G={group} paged={paged} splits={splits}: "
              f"{err or 'ok'}")
        failures += err is not None
    # (group, KV heads, head dim, per head, sink, window): oracle top-k, vAttention's middle
    for group, hkv, d, per_head, sink, window in (
            (4, 8, 128, False, 0, 0), (1, 8, 128, False, 128, 128), (7, 2, 64, False, 0, 0),
            (2, 8, 128, False, 0, 0), (4, 8, 128, True, 0, 0)):
        splits = _topk_splits(d, hkv)
        types = ["*fp32"] * 3 + ["*i64"] + ["*fp32"] * 2 + ["*i32"] + ["i32"] * 5
        consts = {"NUM_SEL": hkv * group if per_head else hkv, "GROUP": group,
                  "BLOCK_G": _pad(group), "SPLITS_PAD": max(2, _pad(splits)),
                  "BLOCK": ttk.MASS_BLOCK, "PER_HEAD": per_head, "SINK": sink,
                  "WINDOW": window, "NUM_BINS": ttk.HIST_BINS}
        err = compile_kernel(ttk._mass_hist_kernel, types, consts,
                             {"num_warps": ttk.NUM_WARPS},
                             max_shared=H100_SHARED, divisible=_aligned(ttk._mass_hist_kernel))
        print(f"_mass_hist_kernel G={group} per_head={per_head} splits={splits} "
              f"sink={sink}: {err or 'ok'}")
        failures += err is not None
    # (k, group, KV heads, per head, sink, window)
    for k, group, hkv, per_head, sink, window in (
            (4096, 4, 8, False, 0, 0), (1024, 4, 8, True, 0, 0), (2048, 7, 2, False, 128, 128),
            (64, 1, 8, False, 0, 0)):
        types = ["*fp32", "*i32", "*i64"] + ["*i32"] * 4 + ["i32"] * 5
        consts = {"K": k, "NUM_SEL": hkv * group if per_head else hkv, "GROUP": group,
                  "PER_HEAD": per_head, "SINK": sink, "WINDOW": window,
                  "NUM_BINS": ttk.HIST_BINS, "BLOCK": ttk.SELECT_BLOCK}
        err = compile_kernel(ttk._select_kernel, types, consts,
                             {"num_warps": ttk.SELECT_WARPS},
                             max_shared=H100_SHARED, divisible=_aligned(ttk._select_kernel))
        print(f"topk _select_kernel K={k} G={group} per_head={per_head} sink={sink}: "
              f"{err or 'ok'}")
        failures += err is not None
        # the spread select (SPREAD_SELECT), split like the score pass
        splits = _topk_splits(128, hkv)
        tiles = -(-CTX // tix.SCORE_BLOCK_N[128])
        span = -(-tiles // splits) * tix.SCORE_BLOCK_N[128]
        block = min(ttk.SPREAD_BLOCK, _pad(span))
        spread = {"K": k, "NUM_SEL": consts["NUM_SEL"], "SINK": sink, "WINDOW": window,
                  "NUM_BINS": ttk.HIST_BINS, "BLOCK": block}
        err = compile_kernel(ttk._second_byte_kernel, ["*fp32"] + ["*i32"] * 2 + ["*i64"]
                             + ["*i32"] * 2 + ["i32"] * 5, spread,
                             {"num_warps": ttk.NUM_WARPS}, max_shared=H100_SHARED,
                             divisible=_aligned(ttk._second_byte_kernel))
        print(f"topk _second_byte_kernel K={k} G={group} per_head={per_head} sink={sink}: "
              f"{err or 'ok'}")
        failures += err is not None
        spread.update(GROUP=group, PER_HEAD=per_head, SPLITS_PAD=max(2, _pad(splits)))
        for finish_here in (True, False):  # the tail in the last program, or its own launch
            err = compile_kernel(ttk._spread_write_kernel, ["*fp32"] + ["*i32"] * 2 + ["*i64"]
                                 + ["*i32"] * 7 + ["i32"] * 7,
                                 {**spread, "FINISH_HERE": finish_here},
                                 {"num_warps": ttk.NUM_WARPS}, max_shared=H100_SHARED,
                                 divisible=_aligned(ttk._spread_write_kernel))
            print(f"topk _spread_write_kernel K={k} G={group} per_head={per_head} "
                  f"sink={sink} finish_here={finish_here}: {err or 'ok'}")
            failures += err is not None
        finish = {key: spread[key] for key in ("K", "NUM_SEL", "GROUP", "PER_HEAD",
                                               "NUM_BINS", "SPLITS_PAD", "BLOCK")}
        err = compile_kernel(ttk._spread_finish_kernel, ["*fp32"] + ["*i32"] * 8
                             + ["i32"] * 6, finish, {"num_warps": ttk.NUM_WARPS},
                             max_shared=H100_SHARED,
                             divisible=_aligned(ttk._spread_finish_kernel))
        print(f"topk _spread_finish_kernel K={k} G={group} per_head={per_head}: {err or 'ok'}")
        failures += err is not None
    # (k, S, group, KV heads, head dim): k = 0 (no top set) samples every token
    heads = ["*fp32"] * 3 + ["*i64", "*fp32", "*i32", "*i32", "*fp32", "*i32", "*fp32"]
    for k, samples, group, hkv, d in ((2048, 256, 4, 8, 128), (64, 128, 7, 2, 64),
                                      (0, 128, 1, 8, 128), (64, 100, 2, 8, 128)):
        consts = {"NUM_KV_HEADS": hkv, "GROUP": group, "BLOCK_G": _pad(group),
                  "SPLITS_PAD": max(2, _pad(_topk_splits(d, hkv))), "K": k, "S": samples,
                  # the rest's splits at 1024 tokens a program (a rest span finer than the
                  # score pass's)
                  "REST_PAD": max(2, _pad(-(-CTX // 1024))),
                  "BLOCK": trs.REST_BLOCK, "HAS_TOP": k > 0}
        err = compile_kernel(trs._rest_sum_kernel, heads + ["i32"] * 10,
                             {**consts, "BLOCK_S": min(128, _pad(samples))},
                             {"num_warps": trs.NUM_WARPS}, max_shared=H100_SHARED,
                             divisible=_aligned(trs._rest_sum_kernel))
        print(f"_rest_sum_kernel k={k} S={samples} G={group}: {err or 'ok'}")
        failures += err is not None
        err = compile_kernel(trs._systematic_kernel, heads + ["*i64", "i32"] + ["i32"] * 10,
                             consts, {"num_warps": trs.NUM_WARPS},
                             max_shared=H100_SHARED, divisible=_aligned(trs._systematic_kernel))
        print(f"_systematic_kernel k={k} S={samples} G={group}: {err or 'ok'}")
        failures += err is not None
    return failures


def check_quest() -> int:
    """Quest's bound kernel (bf16 bounds; the fused row select of shared=group, the
    per-head bounds) and the row select of triton_page_select."""
    failures = 0
    page = 16
    page_cap = CTX // page
    # (head dim, group, paged, per head, update, select, pages, how, steps a program, their
    # pipeline stages): shared=group selects in the bound kernel (its page_bounds without),
    # byte-wise, four bits a pass, spread or resident; shared=head selects with
    # _row_topk_kernel
    for d, group, paged, per_head, update, select, pages, how, tiles, stages in (
            *((128, 4, False, False, True, False, 64, "resident", n, s)
              for n, s in ((8, 3), (4, 3), (8, 4), (16, 2))),  # page loops
            (128, 4, False, False, True, True, 256, "bytes", 1, None),
            (128, 4, True, False, True, True, 64, "bytes", 1, None),
            (128, 8, False, False, True, True, 64, "nibbles", 1, None),
            (128, 4, False, False, True, True, 64, "spread", 1, None),
            (128, 4, False, False, True, True, 64, "resident", 1, None),
            (128, 8, True, False, True, True, 256, "resident", 1, None),
            (128, 8, True, False, True, True, 256, "spread", 1, None),
            (64, 1, True, False, False, True, 64, "spread", 1, None),
            (64, 7, False, True, True, False, 64, "bytes", 1, None),
            (64, 1, True, False, False, True, 64, "bytes", 1, None),
            (128, 8, True, True, True, False, 256, "bytes", 1, None),
            (128, 4, False, False, True, False, 64, "bytes", 1, None)):
        types = ["*bf16", "*bf16", "*i64", "*i32" if paged else "*i64", "*bf16", "*fp32",
                 "*i32", "*i32", "*i32", "*i32", "*i32", "fp32"] + ["i32"] * 12
        consts = {"NUM_KV_HEADS": 8, "GROUP": group, "HEAD_DIM": d,
                  "BLOCK_H": max(MIN_BLOCK_H, _pad(group)),
                  # bf16 bounds: twice fp32's pages (a page loop: fp32's pages a step)
                  "BLOCK_P": tsel.QUEST_BLOCK_P[d] * (1 if tiles > 1 else 2),
                  "TILES": tiles, "STAGES": stages,
                  "PAGE": page, "PAGED": paged, "PAGE_SIZE": PAGE_SIZE if paged else 1,
                  "PER_HEAD": per_head, "UPDATE": update, "DOT_PRECISION": "tf32",
                  "WIDEN_BF16": False, "SELECT": select, "PAGES": pages,
                  "SELECT_BLOCK": (tsel.QUEST_SELECT_BLOCK if how == "nibbles"
                                   else tps.select_block(page_cap, how)),
                  "SELECT_BLOCK_K": min(1024, _pad(pages)), "SELECT_BY": how}
        err = compile_kernel(tsel._quest_bound_kernel, types, consts, {"num_warps": 4},
                             max_shared=H100_SHARED, divisible=_aligned(tsel._quest_bound_kernel))
        print(f"_quest_bound_kernel d={d} G={group} paged={paged} per_head={per_head} "
              f"update={update} select={select} pages={pages} select_by={how} "
              f"steps={tiles} stages={stages}: "
              f"{err or 'ok'}")
        failures += err is not None
    # shared=head: a row a head
    for pages, how in ((64, "bytes"), (256, "bytes"), (64, "nibbles"), (64, "resident")):
        consts = {"K": pages, "BLOCK": tps.select_block(page_cap, how),
                  "BLOCK_K": min(1024, _pad(pages)), "HOW": how}
        err = compile_kernel(tps._row_topk_kernel, ["*fp32", "*i32", "*i32"] + ["i32"] * 3,
                             consts, {"num_warps": tps.NUM_WARPS},
                             max_shared=H100_SHARED, divisible=_aligned(tps._row_topk_kernel))
        print(f"_row_topk_kernel K={pages} BLOCK={consts['BLOCK']} how={how}: "
              f"{err or 'ok'}")
        failures += err is not None
    return failures


def check_indexed() -> int:
    """triton_indexed's attention over listed rows (each selection method's use of it),
    its split merge and its score pass; vAttention's plan kernel; the counter uniforms."""
    failures = 0
    # (method, head dim, group, paged, splits > 1)
    for method, d, group, paged, split in (
            ("oracle", 128, 4, False, True), ("oracle-head", 128, 4, True, True),
            ("quest", 128, 8, True, True), ("quest-head", 64, 7, False, True),
            ("vattention", 128, 4, False, True), ("vattention-reads", 64, 1, True, True),
            ("vattention-capped", 128, 4, False, True),
            ("vattention-128-rows", 128, 4, False, True),
            ("vattention-5-stages", 128, 4, False, True),
            ("vattention-token", 128, 4, False, True), ("vattention-token", 128, 7, False, True),
            ("topk-santa", 128, 4, True, True), ("topk-santa", 64, 1, False, True),
            ("oracle", 64, 2, False, False)):
        tail = method.startswith("vattention")
        lw = method in ("oracle-head", "quest-head", "topk-santa")
        count = method == "quest"
        samples = method == "vattention-reads"
        table = "*i32" if paged else "*i64"
        types = ["*bf16"] * 3 + ["*i64", table, "*i32", "*i32" if count else "*i64",
                                 "*fp32" if lw else "*i64"]
        types += (["*i32"] * 3 + ["*fp32", "*u8", "*i64"] if tail else ["*i64"] * 6)
        stash = not method.startswith("quest")  # the token methods' score stash
        token = method == "vattention-token"  # the tail's scores from the token-major copy
        types += ["*i32" if samples else "*i64", "*fp32" if stash else "*i64",
                  "*fp32" if token else "*i64", "*bf16"]
        types += ["*fp32"] * 3 if split else ["*bf16"] * 3
        types += ["fp32"] + ["i32"] * 20
        consts = {"NUM_KV_HEADS": 8, "GROUP": group, "HEAD_DIM": d,
                  "BLOCK_H": max(MIN_BLOCK_H, _pad(group)),
                  "CHUNK": 128 if method.endswith("128-rows") else tix.CHUNK[d],
                  "BLOCK": 16 if method.startswith("quest") else 1, "PAGED": paged,
                  "PAGE_SIZE": PAGE_SIZE if paged else 1, "HAS_INDEX": True,
                  "HAS_COUNT": count, "HAS_LW": lw, "LW_PER_HEAD": lw and group > 1,
                  "HAS_TAIL": tail, "HAS_EXCLUDE": tail and not token,
                  "EXCLUDE_WORDS": tail and not token,
                  "TAIL_TOKEN_SCORES": token, "GROUP_PAD": _pad(group) if token else 1,
                  "STORE_SAMPLES": samples,
                  "WRITE_OUT": not split, "HAS_SCORES": stash,
                  "DOT_PRECISION": "tf32", "WIDEN_BF16": False}
        # vAttention's step caps the attend's registers and sets its pipeline's stages
        # (attend_max_registers, attend_stages: Triton's by default, 5 as an option)
        options = {"num_warps": tix.NUM_WARPS}
        stages = 5 if method.endswith("5-stages") else tsel.VATTENTION_STAGES
        if method.startswith("vattention-"):
            options["maxnreg"] = tsel.VATTENTION_MAX_REGISTERS
            if stages is not None:
                options["num_stages"] = stages
        # a row loop given its stages: every mark, score and index load staged (no load
        # waited for in the loop but the pipeline's)
        staged = (("i8", "i32", "f32") if method.startswith("vattention-") and stages
                  else ())
        err = compile_kernel(tix._indexed_stage1, types, consts, options, staged=staged,
                             max_shared=H100_SHARED, divisible=_aligned(tix._indexed_stage1))
        print(f"_indexed_stage1 {method} d={d} G={group} paged={paged} split={split}: "
              f"{err or 'ok'}")
        failures += err is not None
    for d, splits in ((128, 6), (64, 16)):
        consts = {"NUM_Q_HEADS": 32, "HEAD_DIM": d,
                  "BLOCK_S": min(tix.MERGE_BLOCK_S, _pad(splits))}
        err = compile_kernel(tix._indexed_merge, ["*fp32"] * 3 + ["*bf16"] + ["i32"] * 3,
                             consts, {"num_warps": tix.NUM_WARPS},
                             max_shared=H100_SHARED, divisible=_aligned(tix._indexed_merge))
        print(f"_indexed_merge d={d} BLOCK_S={consts['BLOCK_S']}: {err or 'ok'}")
        failures += err is not None
    for d, group, paged in ((128, 4, False), (64, 7, True)):
        types = ["*bf16", "*bf16", "*i64", "*i32" if paged else "*i64", "*fp32", "fp32"]
        types += ["i32"] * 9
        consts = {"NUM_KV_HEADS": 8, "GROUP": group, "HEAD_DIM": d,
                  "BLOCK_H": max(MIN_BLOCK_H, _pad(group)), "BLOCK_N": tix.SCORE_BLOCK_N[d],
                  "PAGED": paged, "PAGE_SIZE": PAGE_SIZE if paged else 1,
                  "DOT_PRECISION": "tf32", "WIDEN_BF16": False}
        err = compile_kernel(tix._scores_kernel, types, consts, {"num_warps": tix.NUM_WARPS},
                             max_shared=H100_SHARED, divisible=_aligned(tix._scores_kernel))
        print(f"_scores_kernel d={d} G={group} paged={paged}: {err or 'ok'}")
        failures += err is not None
    # (group, top-k, rows a step, the token-major copy): the defaults, the 32k budget, no
    # top-k (a placeholder pointer), larger steps, the copy's -inf and draws
    for group, topk, block, token in ((4, 256, tsel.VATTENTION_BLOCK, False),
                                      (7, 2048, tsel.VATTENTION_BLOCK, False),
                                      (1, 0, tsel.VATTENTION_BLOCK, False), (4, 256, 512, False),
                                      (4, 256, tsel.VATTENTION_BLOCK, True),
                                      (7, 256, 512, True)):
        types = ["*fp32", "*fp32", "*i32", "*i64", "*u8", "*i32", "*i32", "*fp32", "*i32",
                 "*i32", "*i64", "*fp32", "i32", "fp32", "fp32"] + ["i32"] * 5
        consts = {"NUM_KV_HEADS": 8, "GROUP": group, "BLOCK_H": max(MIN_BLOCK_H, _pad(group)),
                  "SINK": 128, "WINDOW": 128, "TOPK": topk, "BLOCK": block,
                  "TOKEN_COPY": token, "GROUP_PAD": _pad(group)}
        err = compile_kernel(tsel._vattention_plan_kernel, types, consts, {"num_warps": 4},
                             max_shared=H100_SHARED,
                             divisible=_aligned(tsel._vattention_plan_kernel))
        print(f"_vattention_plan_kernel G={group} topk={topk} block={block} token={token}: "
              f"{err or 'ok'}")
        failures += err is not None
    err = compile_kernel(tsel._uniform_kernel, ["*fp32", "*i64", "i32", "i32"],
                         {"BLOCK": tsel.UNIFORM_BLOCK})
    print(f"_uniform_kernel: {err or 'ok'}")
    failures += err is not None
    return failures


def _captured(check: Callable[[], int]) -> tuple[int, str]:
    """Runs one check group: ``(failures, what it printed)``."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        failures = check()
    return failures, out.getvalue()


CHECKS = (check_score, check_finish, check_attend, check_select, check_flash,
          check_decode_linear, check_bernoulli, check_topk, check_quest, check_indexed)
GROUPS = {check.__name__.removeprefix("check_"): check for check in CHECKS}


def main(argv: list[str] | None = None, jobs: int | None = None) -> int:
    """Compiles every group (or ``--only``'s), ``jobs`` processes at a time (default: up
    to 2 CPUs); 1 on any failure, 2 on a bad option."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sass", action="store_true",
                        help="print each kernel's SASS instruction and barrier counts")
    parser.add_argument("--only", default="",
                        help=f"comma-separated groups to compile ({', '.join(GROUPS)}; "
                             f"default: all)")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in GROUPS]
    if unknown:
        parser.error(f"--only: unknown group {unknown[0]!r} (expected one of "
                     f"{', '.join(GROUPS)})")
    if args.sass:  # the spawned workers inherit it
        os.environ[SASS_ENV] = "1"
    checks = [GROUPS[n] for n in names] or list(CHECKS)
    jobs = jobs or min(2, os.cpu_count() or 1, len(checks))
    if jobs == 1:
        results = [_captured(check) for check in checks]
    else:  # spawned workers: each imports Triton afresh (no forked compiler state)
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(jobs, mp_context=context) as pool:
            results = list(pool.map(_captured, checks))
    for _, text in results:
        print(text, end="")
    return 1 if sum(failures for failures, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main())
