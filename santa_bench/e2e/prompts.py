"""Prompts of exactly ``ctx`` tokens per sequence for the decode loop.

With a tokenizer (real weights) each sequence is a fixed English passage repeated to
length, every sequence starting at a different offset (so the batch is not one prompt
copied); without one, seeded random token ids.
"""

from __future__ import annotations

from typing import Any

import torch

from santa_bench.e2e.loop import random_prompt

PASSAGE = (
    "The lighthouse keeper wrote the weather in a ledger every evening: the wind, the "
    "height of the swell, the ships that passed and the ones that did not. Over forty "
    "years the ledger grew into eleven volumes, and the village school used them to teach "
    "arithmetic, because every page held numbers that meant something to the children. "
    "They added the ships of a month, compared the storms of two winters, and learned "
    "that a long column of small numbers can hide a pattern that no single line reveals. "
    "When the light was automated, the keeper gave the ledgers to the library, where "
    "they still sit on the lowest shelf, next to the tide tables and a map of the reef. "
)
OFFSET_STRIDE = 37  # tokens between the starting points of consecutive sequences


def make_prompt(
    batch: int, ctx: int, vocab: int, seed: int, tokenizer: Any | None = None
) -> torch.Tensor:
    """Returns ``[batch, ctx]`` token ids (CPU, int64)."""
    if tokenizer is None:
        return random_prompt(batch, ctx, vocab, seed)
    ids = list(tokenizer(PASSAGE, add_special_tokens=False)["input_ids"])
    if not ids:
        return random_prompt(batch, ctx, vocab, seed)
    bos = getattr(tokenizer, "bos_token_id", None)
    head = [bos] if bos is not None else []
    rows = []
    for b in range(batch):
        start = (b * OFFSET_STRIDE) % len(ids)
        need = ctx - len(head)
        repeats = -(-(need + start) // len(ids))
        rows.append(head + (ids * repeats)[start : start + need])
    return torch.tensor(rows, dtype=torch.int64)
