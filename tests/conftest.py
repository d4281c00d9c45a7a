"""Shared fixtures: small decode problems with fixed seeds; a temporary santa-bench cache."""

from __future__ import annotations

import importlib.util
import multiprocessing
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

import santa_kernels as sk


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A santa-bench cache for the whole test session (of one pytest-xdist worker): what
    the tests fetch (RULER's data, ~54 MB) lands here once, never in the user's cache."""
    return tmp_path_factory.mktemp("santa-bench-cache")


@pytest.fixture(autouse=True)
def _temporary_cache(session_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Points $SANTA_BENCH_CACHE at the session's cache and drops $SANTA_BENCH_DATA, so
    that no test reads or writes the user's data folders (a test may set them again)."""
    monkeypatch.setenv("SANTA_BENCH_CACHE", str(session_cache))
    monkeypatch.delenv("SANTA_BENCH_DATA", raising=False)


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """``fn()`` in a forked process: its (picklable) value, or a test failure once it has
    run ``seconds`` (the process is killed; a C-level loop holding the GIL cannot hang
    the test)."""
    receive, send = multiprocessing.Pipe(duplex=False)

    def child() -> None:
        try:
            send.send((True, fn()))
        except BaseException as exc:  # reported by the parent
            send.send((False, f"{type(exc).__name__}: {exc}"))

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    try:
        if not receive.poll(seconds):
            pytest.fail(f"still running after {seconds} s")
        done, value = receive.recv()
        assert done, value
        return value
    finally:
        process.kill()
        process.join()


def decode_problem(
    *,
    batch: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    n: int = 200,
    d: int = 8,
    q_scale: float = 1.0,
    seed: int = 0,
    lengths: list[int] | None = None,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, sk.KVCache]:
    """Returns ``(q, kv)`` with Gaussian entries; larger ``q_scale`` peaks the softmax."""
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(batch, heads, d, generator=gen, dtype=torch.float64) * q_scale).to(dtype)
    k = torch.randn(batch, n, kv_heads, d, generator=gen, dtype=torch.float64).to(dtype)
    v = torch.randn(batch, n, kv_heads, d, generator=gen, dtype=torch.float64).to(dtype)
    lens = None if lengths is None else torch.tensor(lengths)
    return q, sk.KVCache.contiguous(k, v, lens)


def load_script(name: str) -> ModuleType:
    """Imports ``scripts/<name>.py`` (the scripts are no package), registered under
    ``name`` so that its dataclasses can look their module up."""
    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
