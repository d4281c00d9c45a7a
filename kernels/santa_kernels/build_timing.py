"""The time of a one-time index build (Quest's page bounds, SANTA++'s packed teams), taken
apart from decode: a median after an untimed build, whose first launches (a kernel's, the
allocator's) once put 30 ms into Quest's 1-ms build."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from santa_kernels.validate import check_positive_int


def median_build_ms(build: Callable[[], object], device: torch.device, repeats: int = 3,
                    warm_up: bool = True) -> float:
    """Milliseconds of ``build()``: the median of ``repeats`` calls (after one untimed call
    where ``warm_up``), each between device synchronisations."""
    check_positive_int(repeats, "repeats")

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    if warm_up:
        build()
    times = []
    for _ in range(repeats):
        sync()
        started = time.perf_counter()
        build()
        sync()
        times.append((time.perf_counter() - started) * 1e3)
    return sorted(times)[len(times) // 2]
