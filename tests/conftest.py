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


def kv_on(kv: sk.KVCache, device: str | torch.device) -> sk.KVCache:
    """The cache ``kv`` (contiguous or paged) with its tensors on ``device``."""
    if kv.layout == "paged":
        return sk.KVCache.paged(kv.k.to(device), kv.v.to(device), kv.page_table.to(device),
                                kv.lengths.to(device))
    return sk.KVCache.contiguous(kv.k.to(device), kv.v.to(device), kv.lengths.to(device))


def dense_num_den(q: torch.Tensor, kv: sk.KVCache, weight: Callable | None = None,
                  top: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``([B, Hq, d + 1], [B, Hq])`` float64: dense attention's numerator
    ``sum_i e^(s_i - max) v_i`` and denominator ``sum_i e^(s_i - max)`` (the sums a
    Horvitz-Thompson estimator targets), and the ``max`` they are shifted by. ``weight``
    (``valid [B, n] -> [B, Hq, n]``) weights each term (an estimator's draw); ``top``
    replaces the ``max``."""
    keys, values, valid = kv.padded(torch.float64)
    group = q.shape[1] // kv.num_kv_heads
    k = keys.repeat_interleave(group, dim=2)
    v = values.repeat_interleave(group, dim=2)
    s = torch.einsum("bhd,bnhd->bhn", q.double(), k) * kv.head_dim**-0.5
    top = s.amax(-1) if top is None else top
    e = torch.exp(s - top[..., None])
    if weight is not None:
        e = weight(valid) * e
    return torch.cat([torch.einsum("bhn,bnhd->bhd", e, v), e.sum(-1)[..., None]], dim=-1), top


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module's statistical loops (many tiny ops: threads cost)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_llama(seed: int = 0, layers: int = 2):
    """A random two-layer Llama (97 tokens, 4 query / 2 KV heads, eos 96) for engine tests."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96,
                                      num_hidden_layers=layers, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=512,
                                      eos_token_id=96)
    return transformers.LlamaForCausalLM(config).eval()


class ModTok:
    """A tokenizer of ``ord(c) % 90`` per character, keeping a prompt's last ``keep``."""

    def __init__(self, keep: int = 90) -> None:
        self.keep = keep

    def __call__(self, text):
        return type("T", (), {"input_ids": [ord(c) % 90 for c in text][-self.keep:]})

    def encode(self, text, add_special_tokens=False):
        return [ord(c) % 90 for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(48 + int(i) % 10) for i in ids)


def load_script(name: str) -> ModuleType:
    """Imports ``scripts/<name>.py`` (the scripts are no package), registered under
    ``name`` so that its dataclasses can look their module up."""
    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def record_launches(monkeypatch: pytest.MonkeyPatch, kernel: Any) -> list:
    """``(kernel, launch keywords, grid, arguments by name)`` of every launch, from now
    on, of a Triton kernel of ``kernel``'s type (compiled or interpreted)."""
    launches = []
    kernel_type = type(kernel)
    launch = kernel_type.__getitem__

    def getitem(self, grid):
        run = launch(self, grid)

        def record(*args, **kwargs):
            launches.append((self, kwargs, grid, dict(zip(self.arg_names, args, strict=False))))
            return run(*args, **kwargs)

        return record

    monkeypatch.setattr(kernel_type, "__getitem__", getitem)
    return launches
