"""The time of a one-time index build (Quest's page bounds, SANTA++'s packed teams), taken
apart from decode: a median after an untimed build, whose first launches (a kernel's, the
allocator's) once put 30 ms into Quest's 1-ms build."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import torch

from santa_kernels.validate import check_positive_int

T = TypeVar("T")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_build_ms(build: Callable[[], T], device: torch.device, repeats: int = 3,
                    warm_up: bool = True) -> tuple[T, float]:
    """Returns ``(built, milliseconds)``: the last call's ``build()`` and the median of
    ``repeats`` calls (after one untimed call where ``warm_up``), each between device
    synchronisations."""
    check_positive_int(repeats, "repeats")
    if warm_up:
        build()
    times = []
    for _ in range(repeats):
        _sync(device)
        started = time.perf_counter()
        built = build()
        _sync(device)
        times.append((time.perf_counter() - started) * 1e3)
    return built, sorted(times)[len(times) // 2]
