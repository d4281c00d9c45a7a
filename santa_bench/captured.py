"""Kernel decode inputs from a `santa-bench capture` file: a model's real q, K and V.

A batch element is a captured layer: element ``b`` takes layer ``layers[b % L]`` (the
layers cycle when the batch is larger than the ``L`` captured), the query of the last
captured position and the layer's K/V. At the captured context that is the query
attending to its whole causal prefix. A larger ``ctx`` tiles the captured K/V along the
sequence (the same keys repeated; rows say ``inputs_tiled``); a smaller one keeps the
first ``ctx`` keys with the same query (the attention sinks stay, the query's local
window does not: capture at the context you time for the model's own distribution).
The query is rescaled so that the kernels' default softmax scale is the layer's.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import santa_kernels as sk

GAUSSIAN = "gaussian"
"""The ``inputs`` of a kernel case on Gaussian noise (santa_bench.inputs)."""

SHAPE_OPTIONS = ("heads", "kv_heads", "head_dim")


@dataclass(frozen=True)
class Capture:
    """A capture file as the kernel runner uses it."""

    path: str
    digest: str  # the first 12 hex digits of its sha256: which capture a case ran on
    model: str
    layers: tuple[int, ...]
    ctx: int
    heads: int
    kv_heads: int
    head_dim: int

    @property
    def label(self) -> str:
        """``captured:<model>:L<layers>``, the rows' ``inputs``."""
        from santa_bench.capture import CAPTURED_PREFIX

        return f"{CAPTURED_PREFIX}{self.model}:L{','.join(map(str, self.layers))}"

    def case_keys(self, ctx: int) -> dict[str, Any]:
        """The keys a kernel case at ``ctx`` on this capture carries (``_inputs``, the path,
        is kept out of the case hash)."""
        return {
            "inputs": self.label,
            "inputs_digest": self.digest,
            "inputs_tiled": ctx > self.ctx,
            "_inputs": self.path,
        }


@functools.lru_cache(maxsize=16)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    from santa_bench.capture import file_digest

    return file_digest(path)


def describe_capture(path: str | Path, *, digest: bool = True) -> Capture:
    """Returns the capture file's description (ValueError naming --inputs if it is not one;
    ``digest=False`` skips hashing the file and leaves ``digest`` empty)."""
    from santa_bench.capture import read_metadata

    meta = read_metadata(path)
    try:
        layers = tuple(int(x) for x in meta["layers"].split(","))
        shape = {k: int(meta[k]) for k in ("ctx", *SHAPE_OPTIONS)}
    except (KeyError, ValueError) as exc:
        raise ValueError(f"--inputs: {path}: incomplete capture metadata ({exc})") from None
    _check_tensors(path, layers, shape)
    stat = Path(path).stat()
    return Capture(
        path=str(path),
        digest=_digest(str(path), stat.st_size, stat.st_mtime_ns) if digest else "",
        model=meta["model"],
        layers=layers,
        **shape,
    )


def _check_tensors(path: str | Path, layers: tuple[int, ...], shape: dict[str, int]) -> None:
    """ValueError naming --inputs when a layer's K and V do not both hold ``ctx`` positions
    of ``kv_heads x head_dim`` (the kernels would tile them independently)."""
    from safetensors import safe_open

    want = [shape["ctx"], shape["kv_heads"], shape["head_dim"]]
    with safe_open(str(path), framework="pt") as handle:
        names = set(handle.keys())
        for layer in layers:
            found = {part: list(handle.get_slice(f"L{layer}.{part}").get_shape())
                     for part in ("key", "value") if f"L{layer}.{part}" in names}
            if found.get("key") != want or found.get("value") != want:
                raise ValueError(
                    f"--inputs: {path}: layer {layer} holds K {found.get('key')} and V "
                    f"{found.get('value')}, expected both {want} (ctx, kv_heads, head_dim): "
                    "capture the file again")


def capture_shape(
    capture: Capture, given: dict[str, int | None], option: Callable[[str], str] = str
) -> dict[str, int]:
    """Returns the capture's ``heads``, ``kv_heads``, ``head_dim``; ValueError when a value
    in ``given`` (None: not given) contradicts it."""
    found = {name: getattr(capture, name) for name in SHAPE_OPTIONS}
    for name, value in given.items():
        if value is not None and value != found[name]:
            raise ValueError(
                f"{option(name)} {value}: the capture {capture.path} has {name} {found[name]} "
                f"({capture.model}: {capture.heads}/{capture.kv_heads}/{capture.head_dim}); "
                f"leave {option(name)} out to take the file's"
            )
    return found


def captured_sequence(tensor: torch.Tensor, ctx: int) -> torch.Tensor:
    """Returns ``tensor [N, ...]`` cut to its first ``ctx`` rows, or tiled to ``ctx``."""
    n = tensor.shape[0]
    if ctx <= n:
        return tensor[:ctx]
    return tensor.repeat(math.ceil(ctx / n), *([1] * (tensor.dim() - 1)))[:ctx]


def make_captured_inputs(
    path: str | Path,
    *,
    batch: int,
    ctx: int,
    dtype: torch.dtype = torch.bfloat16,
    layout: str = "contiguous",
    page_size: int = 16,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> tuple[torch.Tensor, sk.KVCache]:
    """Returns ``(q [B, Hq, d], kv)`` from the capture (see the module docstring); a paged
    cache shuffles its pages with ``seed``, as the Gaussian inputs' does."""
    from santa_bench.capture import read_layer

    if layout not in ("contiguous", "paged"):
        raise ValueError(f"layout: expected 'contiguous' or 'paged', got {layout!r}")
    capture = describe_capture(path, digest=False)
    layers = [read_layer(path, layer, dtype=torch.float32) for layer in capture.layers]
    chosen = [layers[b % len(layers)] for b in range(batch)]
    q = torch.stack([query[-1] for query, _, _ in chosen])
    k = torch.stack([captured_sequence(key, ctx) for _, key, _ in chosen])
    v = torch.stack([captured_sequence(value, ctx) for _, _, value in chosen])
    q, k, v = (t.to(device=device, dtype=dtype) for t in (q, k, v))
    kv = sk.KVCache.contiguous(k, v)
    if layout == "paged":
        kv = kv.to_paged(page_size, generator=torch.Generator(device="cpu").manual_seed(seed))
    return q, kv
