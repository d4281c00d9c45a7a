"""The byte floor: floor_us / floor_ratio rows, derived and stored, and Quest's byte model."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

import santa_kernels as sk
from santa_bench.roofline import floor_rows, with_floor
from santa_bench.runners.kernel import KernelRunner, group_key


def test_floor_is_the_bytes_at_the_dense_bandwidth():
    rows = {r["metric"]: r for r in floor_rows(2e6, 4.0, 1000.0, "sdpa-cudnn")}
    # 2 MB at 1000 GB/s (1e3 bytes/ns = 1e6 bytes/us) take 2 us; 4 us is twice the floor
    assert rows["floor_us"]["value"] == pytest.approx(2.0)
    assert rows["floor_ratio"]["value"] == pytest.approx(2.0)
    assert rows["floor_ratio"]["best_dense"] == "sdpa-cudnn"


def test_floor_without_a_dense_bandwidth_is_skipped_with_the_reason():
    rows = floor_rows(2e6, 4.0, None, "")
    assert {r["status"] for r in rows} == {"skipped"}
    assert all(math.isnan(r["value"]) and r["reason"] for r in rows)


def _kernel_rows(run, case, method, latency_us, moved_bytes, **keys):
    base = {"run_id": run, "case_hash": case, "method": method, "status": "ok", **keys}
    return [
        {**base, "metric": "latency", "value": latency_us},
        {**base, "metric": "bandwidth", "value": moved_bytes / (latency_us * 1e3)},
    ]


def test_with_floor_takes_the_fastest_dense_of_the_same_run_and_group():
    rows = [
        *_kernel_rows("r1", "a", "sdpa-cudnn", 10.0, 20e6, batch=8),  # 2000 GB/s
        *_kernel_rows("r1", "b", "sdpa-flash", 20.0, 20e6, batch=8),  # 1000 GB/s
        *_kernel_rows("r1", "c", "quest", 6.0, 4e6, batch=8),  # floor 2 us at 2000 GB/s
        *_kernel_rows("r1", "d", "quest", 6.0, 4e6, batch=1),  # no dense at batch 1
        *_kernel_rows("r2", "e", "sdpa-cudnn", 100.0, 20e6, batch=8),  # another run: slow
        *_kernel_rows("r2", "f", "quest", 6.0, 4e6, batch=8),
    ]
    frame = with_floor(pd.DataFrame(rows), ["batch"])
    ratio = frame[frame.metric == "floor_ratio"].set_index(["run_id", "case_hash"])["value"]
    assert ratio[("r1", "c")] == pytest.approx(3.0)
    assert ratio[("r1", "a")] == pytest.approx(1.0)
    assert ratio[("r1", "b")] == pytest.approx(2.0)
    assert ("r1", "d") not in ratio.index
    # r2's dense moves 200 GB/s: its floor is 20 us, never r1's 2 us
    assert ratio[("r2", "f")] == pytest.approx(6.0 / 20.0)


def test_with_floor_keeps_stored_floor_rows():
    rows = [*_kernel_rows("r1", "a", "sdpa-cudnn", 10.0, 20e6),
            *_kernel_rows("r1", "c", "quest", 6.0, 4e6)]
    rows.append({"run_id": "r1", "case_hash": "c", "method": "quest", "status": "ok",
                 "metric": "floor_us", "value": 1.5})
    frame = with_floor(pd.DataFrame(rows), [])
    assert (frame[frame.case_hash == "c"].metric == "floor_us").sum() == 1


def test_the_runner_floors_a_method_by_the_fastest_baseline_of_its_group():
    runner = KernelRunner()
    case = {"method": "quest", "ctx": 4096, "batch": 8, "heads": 32, "kv_heads": 8,
            "head_dim": 128, "dtype": "bf16", "layout": "contiguous", "page_size": None,
            "device": "cuda", "timing": "graph", "l2": "cold"}
    runner.remember_baseline({**case, "method": "sdpa-flash"}, [20.0], 1000.0)
    runner.remember_baseline({**case, "method": "sdpa-cudnn"}, [10.0], 2000.0)
    runner.remember_baseline({**case, "method": "flashinfer-tc"}, [30.0], 500.0)
    assert runner.dense_bandwidth[group_key(case)] == 2000.0
    rows = {r["metric"]: r for r in runner._floor_rows(case, 4e6, 6.0)}
    assert rows["floor_us"]["value"] == pytest.approx(2.0)
    assert rows["floor_ratio"]["best_dense"] == "sdpa-cudnn"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quest_counts_its_page_bounds_at_their_stored_size(dtype):
    """By construction: the bytes Quest's K side reads are its fp32 bounds tensor's used
    pages plus the chosen rows, at their own sizes."""
    from santa_kernels.selection import quest
    from santa_kernels.triton_selection import QuestStep

    torch.manual_seed(0)
    batch, hq, hkv, d, n, page, pages = 2, 4, 2, 16, 200, 16, 3
    q = torch.randn(batch, hq, d, dtype=dtype)
    kv = sk.KVCache.contiguous(torch.randn(batch, n, hkv, d, dtype=dtype),
                               torch.randn(batch, n, hkv, d, dtype=dtype),
                               torch.tensor([n, 130]))
    reference = quest(q, kv, page=page, pages=pages)
    step = QuestStep(q, kv, page=page, pages=pages)
    used = (kv.lengths.long() + page - 1) // page
    bound_bytes = int(used.sum()) * hkv * 2 * d * step.bounds[0].element_size()
    row_bytes = int(reference.reads.v_rows.sum()) * d * kv.dtype.itemsize  # K rows = V rows
    assert reference.reads.k_features.sum() * kv.dtype.itemsize == bound_bytes + row_bytes
