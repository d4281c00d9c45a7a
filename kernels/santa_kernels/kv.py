"""KV-cache layouts accepted by every method: contiguous NHD and paged."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from santa_kernels.validate import InputError, check_finite, check_storage_dtype

Layout = str  # "contiguous" | "paged"


@dataclass(frozen=True)
class KVCache:
    """Keys (post-RoPE) and values of a batch of sequences.

    contiguous: ``k``/``v`` are ``[B, N, Hkv, d]``; ``lengths[b] <= N`` valid rows.
    paged: ``k``/``v`` are ``[num_pages, page_size, Hkv, d]``, ``page_table`` is
    ``[B, max_pages]`` (int), sequence ``b`` token ``i`` lives in page
    ``page_table[b, i // page_size]`` at slot ``i % page_size``.
    """

    k: torch.Tensor
    v: torch.Tensor
    lengths: torch.Tensor
    layout: Layout = "contiguous"
    page_table: torch.Tensor | None = None

    # ----------------------------------------------------------------- builders
    @classmethod
    def contiguous(
        cls, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> KVCache:
        """Returns a contiguous cache; all ``N`` rows are valid unless ``lengths`` says less."""
        _check_kv_pair(k, v, "k", "v")
        batch, n_max = k.shape[0], k.shape[1]
        if n_max < 1:
            raise InputError("k: context length N must be >= 1")
        lengths = _check_lengths(lengths, batch, n_max, k.device)
        return cls(k=k, v=v, lengths=lengths, layout="contiguous")

    @classmethod
    def paged(
        cls,
        k_pages: torch.Tensor,
        v_pages: torch.Tensor,
        page_table: torch.Tensor,
        lengths: torch.Tensor,
    ) -> KVCache:
        """Returns a paged cache over a shared page pool."""
        _check_kv_pair(k_pages, v_pages, "k_pages", "v_pages")
        if page_table.dim() != 2 or page_table.dtype not in (torch.int32, torch.int64):
            raise InputError(
                f"page_table: expected a 2-D int32/int64 tensor [B, max_pages], "
                f"got shape {tuple(page_table.shape)} dtype {page_table.dtype}"
            )
        batch = page_table.shape[0]
        page_size = k_pages.shape[1]
        lengths = _check_lengths(lengths, batch, page_table.shape[1] * page_size, k_pages.device)
        pages_needed = (lengths + page_size - 1) // page_size
        for b in range(batch):
            used = page_table[b, : int(pages_needed[b])]
            if used.numel() and (int(used.min()) < 0 or int(used.max()) >= k_pages.shape[0]):
                raise InputError(
                    f"page_table: sequence {b} points outside the page pool "
                    f"(0..{k_pages.shape[0] - 1})"
                )
        return cls(k=k_pages, v=v_pages, lengths=lengths, layout="paged", page_table=page_table)

    # --------------------------------------------------------------- properties
    @property
    def batch(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def num_kv_heads(self) -> int:
        return int(self.k.shape[2])

    @property
    def head_dim(self) -> int:
        return int(self.k.shape[3])

    @property
    def page_size(self) -> int:
        return int(self.k.shape[1]) if self.layout == "paged" else 0

    @property
    def max_len(self) -> int:
        return int(self.lengths.max())

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    @property
    def device(self) -> torch.device:
        return self.k.device

    # ---------------------------------------------------------------- views
    def padded(
        self, dtype: torch.dtype | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns ``(K, V, valid)``: ``[B, Nmax, Hkv, d]`` tensors and a ``[B, Nmax]`` mask.

        Rows past a sequence's length are zero and ``valid`` is False there.
        """
        n_max = self.max_len
        positions = torch.arange(n_max, device=self.device)
        valid = positions[None, :] < self.lengths[:, None]
        if self.layout == "contiguous":
            k, v = self.k[:, :n_max], self.v[:, :n_max]
        else:
            page_size = self.page_size
            page_idx = self.page_table[:, positions // page_size].long()  # [B, Nmax]
            page_idx = torch.where(valid, page_idx, torch.zeros_like(page_idx))
            slot = (positions % page_size)[None, :].expand_as(page_idx)
            k = self.k[page_idx, slot]
            v = self.v[page_idx, slot]
        if dtype is not None:
            k, v = k.to(dtype), v.to(dtype)
        zero = torch.zeros((), dtype=k.dtype, device=k.device)
        k = torch.where(valid[:, :, None, None], k, zero)
        v = torch.where(valid[:, :, None, None], v, zero)
        return k, v, valid

    def to_paged(self, page_size: int, generator: torch.Generator | None = None) -> KVCache:
        """Returns the same cache in a paged pool (pages shuffled when a generator is given)."""
        if page_size <= 0:
            raise InputError(f"page_size: must be > 0, got {page_size}")
        k, v, _ = self.padded()
        batch, n_max, hkv, d = k.shape
        pages_per_seq = (n_max + page_size - 1) // page_size
        pad = pages_per_seq * page_size - n_max
        if pad:
            k = torch.cat([k, k.new_zeros(batch, pad, hkv, d)], dim=1)
            v = torch.cat([v, v.new_zeros(batch, pad, hkv, d)], dim=1)
        n_pages = batch * pages_per_seq
        k_pages = k.reshape(n_pages, page_size, hkv, d)
        v_pages = v.reshape(n_pages, page_size, hkv, d)
        order = (
            torch.randperm(n_pages, generator=generator)
            if generator is not None
            else torch.arange(n_pages)
        ).to(self.device)
        # logical page j is stored at physical slot order[j]
        k_pool = torch.empty_like(k_pages)
        v_pool = torch.empty_like(v_pages)
        k_pool[order] = k_pages
        v_pool[order] = v_pages
        table = order.reshape(batch, pages_per_seq).to(torch.int32)
        return KVCache.paged(k_pool, v_pool, table, self.lengths.clone())


def _check_kv_pair(k: torch.Tensor, v: torch.Tensor, k_name: str, v_name: str) -> None:
    for name, t in ((k_name, k), (v_name, v)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise InputError(f"{name}: expected 4 dimensions, got shape {tuple(t.shape)}")
        check_storage_dtype(t, name)
    if k.shape != v.shape:
        raise InputError(
            f"{v_name}: shape {tuple(v.shape)} does not match {k_name} {tuple(k.shape)}"
        )
    if k.dtype != v.dtype:
        raise InputError(f"{v_name}: dtype {v.dtype} does not match {k_name} {k.dtype}")
    check_finite(k, k_name)
    check_finite(v, v_name)


def _check_lengths(
    lengths: torch.Tensor | None, batch: int, n_max: int, device: torch.device
) -> torch.Tensor:
    if lengths is None:
        return torch.full((batch,), n_max, dtype=torch.int64, device=device)
    if not isinstance(lengths, torch.Tensor) or lengths.dim() != 1 or lengths.shape[0] != batch:
        raise InputError(f"lengths: expected a 1-D tensor of {batch} sequence lengths")
    if lengths.dtype.is_floating_point:
        raise InputError(f"lengths: expected an integer tensor, got {lengths.dtype}")
    if int(lengths.min()) < 1 or int(lengths.max()) > n_max:
        raise InputError(f"lengths: every length must be in 1..{n_max}, got {lengths.tolist()}")
    return lengths.to(device=device, dtype=torch.int64)
