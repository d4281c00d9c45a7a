"""Transformers' own decode loop for the accuracy tasks, and what tasks share to prompt.

Model families the suite's decoder does not run decode through ``model.generate``:
every prompt token but the last is prefilled densely (:class:`PrefillCache` shares the
prefill of a sample between methods), the last one and each generated token are decode
steps through the method installed by ``santa_bench.accuracy.integration``.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch


def token_ids(tokenizer, text: str) -> tuple[int, ...]:
    """The token ids of ``text`` (what a task's prompt holds)."""
    return tuple(int(i) for i in tokenizer(text).input_ids)


def generated_texts(tokenizer, generation) -> list[str]:
    """The generated texts of a generation (``generation.tokens``: ids per sample)."""
    return [tokenizer.decode(t, skip_special_tokens=True) for t in generation.tokens]


def _cache_bytes(past: Any) -> int:
    """Bytes of a transformers cache's tensors (0 when its layout is unknown)."""
    total = 0
    for layer in getattr(past, "layers", ()):
        for name in ("keys", "values"):
            tensor = getattr(layer, name, None)
            if isinstance(tensor, torch.Tensor):
                total += tensor.numel() * tensor.element_size()
    return total


class PrefillCache:
    """Dense prefills shared by the methods of a run.

    Every method starts a sample from the same dense (SDPA) prefill, so it is computed
    once per (model, tokens) and each use gets a deep copy (generation appends to it).
    The least recently stored prefills are dropped beyond ``max_bytes``.
    """

    def __init__(self, max_bytes: int = 4 << 30) -> None:
        self.max_bytes = max_bytes
        self._store: OrderedDict[tuple, tuple[Any, int]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def clear(self) -> None:
        self._store.clear()

    def __call__(self, model, ids: torch.Tensor) -> Any:
        """Returns a fresh copy of the dense prefill of ``ids`` [1, n] through ``model``."""
        key = (id(model), ids.shape[-1], ids.cpu().numpy().tobytes())
        if key in self._store:
            self.hits += 1
            self._store.move_to_end(key)
            return copy.deepcopy(self._store[key][0])
        self.misses += 1
        past = model(ids, use_cache=True).past_key_values
        size = _cache_bytes(past)
        if 0 < size <= self.max_bytes:
            self._store[key] = (copy.deepcopy(past), size)
            while sum(v[1] for v in self._store.values()) > self.max_bytes:
                self._store.popitem(last=False)
        return past


def _prefill(model, ids: torch.Tensor, prefills: PrefillCache | None) -> Any:
    """The dense prefill of ``ids`` (from ``prefills`` when given)."""
    if prefills is None:
        return model(ids, use_cache=True).past_key_values
    return prefills(model, ids)


def greedy_decode(
    model,
    tokenizer,
    text: str,
    max_new_tokens: int,
    prefills: PrefillCache | None = None,
    ids: torch.Tensor | None = None,
    stop_ids: Sequence[int] = (),
) -> str:
    """Greedy continuation of ``text`` (or token ``ids``): every token but the last is
    prefilled densely; the last one and each generated token are decode steps.
    ``stop_ids`` end the generation besides the end-of-sequence token."""
    if ids is None:
        ids = tokenizer(text, return_tensors="pt").input_ids
    ids = ids.to(model.device)
    past = _prefill(model, ids[:, :-1], prefills)  # dense prefill
    extra: dict[str, Any] = {}
    if stop_ids:
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        extra["eos_token_id"] = list(dict.fromkeys([*eos, *stop_ids]))
    out = model.generate(
        ids,
        past_key_values=past,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.eos_token_id,
        **extra,
    )
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def newline_ids(tokenizer) -> list[int]:
    """Token ids of a newline (HELMET's stop tokens: \\n, Ċ, ĊĊ, <0x0A>)."""
    convert = getattr(tokenizer, "convert_tokens_to_ids", None)
    if convert is None:
        return []
    unknown = getattr(tokenizer, "unk_token_id", None)
    found = []
    for token in ("\n", "Ċ", "ĊĊ", "<0x0A>"):
        try:
            index = convert(token)
        except (KeyError, ValueError, TypeError):
            continue
        if isinstance(index, int) and index != unknown and index not in found:
            found.append(index)
    return found


