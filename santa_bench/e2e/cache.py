"""A static, preallocated KV cache for every layer, contiguous or paged.

Storage is allocated once (zeroed: attention kernels multiply masked rows by zero, so
the padding must hold no NaN) for ``capacity`` tokens per sequence. All layers share
one device ``lengths`` tensor (int32) and, when paged, one page table; a decode step
advances ``lengths`` in place and writes the new token's K/V with index ops from
device positions, so nothing in a step reads a value back to the host. Each layer is
exposed as a :class:`santa_kernels.KVCache` (built once, sharing those tensors), the
object every decode-attention backend takes.
"""

from __future__ import annotations

import torch

from santa_kernels.kv import KVCache
from santa_kernels.validate import InputError

LAYOUTS = ("contiguous", "paged")
CAPACITY_MULTIPLE = 256  # rows per sequence are rounded up to this (tiles, alignment)


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


class StaticKVCache:
    """Per-layer K/V storage with shared device ``lengths`` and page table."""

    def __init__(
        self,
        *,
        num_layers: int,
        batch: int,
        capacity: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        layout: str = "contiguous",
        page_size: int = 16,
        seed: int = 0,
    ) -> None:
        if layout not in LAYOUTS:
            raise InputError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
        if batch <= 0 or capacity <= 0:
            raise InputError(f"cache: batch and capacity must be > 0, got {batch}, {capacity}")
        if layout == "paged" and page_size <= 0:
            raise InputError(f"page_size: must be > 0, got {page_size}")
        self.device = torch.device(device)
        self.layout, self.batch, self.dtype = layout, batch, dtype
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.capacity = round_up(capacity, CAPACITY_MULTIPLE)
        self.lengths = torch.zeros(batch, dtype=torch.int32, device=self.device)
        self._rows = torch.arange(batch, device=self.device)
        self.page_table: torch.Tensor | None = None
        if layout == "contiguous":
            self.page_size = 0
            shape: tuple[int, ...] = (batch, self.capacity, num_kv_heads, head_dim)
        else:
            self.page_size = page_size
            self.capacity = round_up(self.capacity, page_size)
            pages_per_seq = self.capacity // page_size
            gen = torch.Generator().manual_seed(seed)
            # pages of a sequence are scattered over the pool, as in a serving engine
            order = torch.randperm(batch * pages_per_seq, generator=gen)
            self.page_table = order.view(batch, pages_per_seq).to(self.device, torch.int32)
            shape = (batch * pages_per_seq, page_size, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self.layers = [
            KVCache(k=k, v=v, lengths=self.lengths, layout=layout, page_table=self.page_table)
            for k, v in zip(self.k, self.v, strict=True)
        ]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    # ---------------------------------------------------------------- addressing
    def _slots(self, positions: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Index tensors addressing token ``positions`` of sequences ``rows`` in storage."""
        if self.layout == "contiguous":
            return rows, positions
        assert self.page_table is not None
        pages = self.page_table[rows, positions // self.page_size].long()
        return pages, positions % self.page_size

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> None:
        """Writes one token per sequence: ``k``/``v`` ``[B, Hkv, d]`` at ``positions [B]``."""
        index = self._slots(positions, self._rows)
        self.k[layer].index_put_(index, k)
        self.v[layer].index_put_(index, v)

    def write_span(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Writes tokens ``start..start+T-1`` of every sequence: ``k``/``v`` ``[B, T, Hkv, d]``."""
        batch, span = k.shape[:2]
        if self.layout == "contiguous":
            self.k[layer][:, start : start + span] = k
            self.v[layer][:, start : start + span] = v
            return
        positions = torch.arange(start, start + span, device=self.device)
        rows = self._rows[:, None].expand(batch, span)
        index = self._slots(positions[None, :].expand(batch, span), rows)
        self.k[layer].index_put_(index, k)
        self.v[layer].index_put_(index, v)

    def contiguous_view(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Returns the ``[B, capacity, Hkv, d]`` K and V of a contiguous cache (None if paged)."""
        if self.layout != "contiguous":
            return None
        return self.k[layer], self.v[layer]

    def gather(self, layer: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns K and V of positions ``0..n-1`` as ``[B, n, Hkv, d]`` (a copy when paged)."""
        if self.layout == "contiguous":
            return self.k[layer][:, :n], self.v[layer][:, :n]
        positions = torch.arange(n, device=self.device)[None, :].expand(self.batch, n)
        index = self._slots(positions, self._rows[:, None].expand(self.batch, n))
        return self.k[layer][index], self.v[layer][index]

    def set_lengths(self, lengths: torch.Tensor | list[int] | int) -> None:
        """Sets every sequence's valid length in place (the tensor kernels hold stays the same)."""
        if isinstance(lengths, int):
            self.lengths.fill_(lengths)
        else:
            self.lengths.copy_(torch.as_tensor(lengths, dtype=torch.int32))
