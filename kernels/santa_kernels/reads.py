"""Read accounting: what a method touched in the KV cache, so byte models come from the method."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ReadCounts:
    """Per (sequence, KV head) read counts of one decode step.

    ``k_rows``: K rows touched; ``k_features``: K elements touched (rows x features;
    ``k_rows * d`` for exact scores); ``v_rows``: unique V rows read for the whole GQA
    group (the union of its heads' samples); ``context``: valid length per sequence.
    """

    k_rows: torch.Tensor  # [B, Hkv] int64
    k_features: torch.Tensor  # [B, Hkv] int64
    v_rows: torch.Tensor  # [B, Hkv] int64
    context: torch.Tensor  # [B] int64
    head_dim: int

    @property
    def dense_rows(self) -> int:
        """Rows one full pass over K (or V) reads, summed over sequences and KV heads."""
        return int(self.context.sum()) * int(self.k_rows.shape[1])

    @property
    def k_read_fraction(self) -> float:
        return float(self.k_features.sum()) / (self.dense_rows * self.head_dim)

    @property
    def v_read_fraction(self) -> float:
        return float(self.v_rows.sum()) / self.dense_rows

    @property
    def kv_read_fraction(self) -> float:
        """Fraction of dense K+V bytes read (K elements plus V rows, GQA union)."""
        read = float(self.k_features.sum()) + float(self.v_rows.sum()) * self.head_dim
        return read / (2 * self.dense_rows * self.head_dim)

    def kv_bytes(self, element_size: int) -> int:
        """Bytes of K and V the method must read at ``element_size`` bytes per element."""
        elements = int(self.k_features.sum()) + int(self.v_rows.sum()) * self.head_dim
        return elements * element_size

    def as_metrics(self) -> dict[str, float]:
        """Returns the read fractions under their metric names."""
        return {
            "k_read_fraction": self.k_read_fraction,
            "v_read_fraction": self.v_read_fraction,
            "kv_read_fraction": self.kv_read_fraction,
        }
