"""Run a Hugging Face model's decode steps through any registry method.

``use_method(model, spec)`` registers an attention function *and* its mask function
with transformers (``AttentionInterface`` / ``AttentionMaskInterface``), so the model's
own code is untouched and sliding-window layers keep their window: prefill (more than
one query token) runs SDPA; every decode step hands the method the KV cache as
transformers keeps it, ``[B, Hkv, N, d]`` without the GQA repeat, restricted to the
positions the layer's mask allows. ``dense_layers`` stay exact. Each call draws fresh
random numbers: the seed advances with every (step, layer) call.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import torch

import santa_kernels as sk
from santa_bench.methods import REGISTRY, parse_method_specs

_names = itertools.count()


def _valid_positions(mask: torch.Tensor | None, batch: int, n: int) -> torch.Tensor:
    """Returns ``[B, N]`` booleans from an SDPA-style decode mask (bool, or additive float)."""
    if mask is None:
        return torch.ones(batch, n, dtype=torch.bool)
    row = mask[:, 0, -1, :n] if mask.dim() == 4 else mask[:, -1, :n]
    allowed = row if row.dtype == torch.bool else torch.isfinite(row) & (row > -1e30)
    return allowed.expand(batch, n).cpu()


def _packed_cache(key: torch.Tensor, value: torch.Tensor, valid: torch.Tensor) -> sk.KVCache:
    """Moves the allowed positions of every sequence to the front (order kept)."""
    k, v = key.transpose(1, 2), value.transpose(1, 2)  # [B, N, Hkv, d]
    lengths = valid.sum(dim=1)
    if bool(valid.all()):
        return sk.KVCache.contiguous(k, v)
    order = torch.argsort((~valid).to(torch.int8), dim=1, stable=True).to(k.device)
    index = order[:, :, None, None].expand_as(k)
    return sk.KVCache.contiguous(
        torch.gather(k, 1, index), torch.gather(v, 1, index), lengths.to(k.device)
    )


def make_attention(
    spec: str, *, seed: int = 0, dense_layers: Iterable[int] = ()
) -> tuple[Any, dict[str, Any]]:
    """Returns ``(attention_forward, info)`` for the method ``spec`` (e.g. ``santa-prop:S=128``).

    ``info`` counts the decode calls that went through the method and collects their
    read fractions.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    (method, overrides), *rest = parse_method_specs(spec, REGISTRY)
    if rest:
        raise ValueError(f"spec: one method per model, got {spec!r}")
    params = method.resolve_params(overrides)
    exact_layers = set(dense_layers)
    info: dict[str, Any] = {
        "method": method.name,
        "params": params,
        "calls": 0,
        "kv_read_fraction": [],
    }
    calls = itertools.count()

    def attention_forward(
        module,
        query,
        key,
        value,
        attention_mask,
        dropout=0.0,
        scaling=None,
        is_causal=None,
        **kwargs,
    ):
        layer = getattr(module, "layer_idx", None)
        if query.shape[2] != 1 or layer in exact_layers:  # prefill, or a layer kept exact
            return sdpa_attention_forward(
                module,
                query,
                key,
                value,
                attention_mask,
                dropout=dropout,
                scaling=scaling,
                is_causal=is_causal,
                **kwargs,
            )
        batch = query.shape[0]
        valid = _valid_positions(attention_mask, batch, key.shape[2])
        kv = _packed_cache(key, value, valid)
        result = method.run_reference(
            query[:, :, 0, :], kv, params, seed=seed + next(calls), scale=scaling
        )
        info["calls"] += 1
        info["kv_read_fraction"].append(result.reads.kv_read_fraction)
        return result.out.to(query.dtype)[:, None, :, :], None

    return attention_forward, info


def use_method(model, spec: str, *, seed: int = 0, dense_layers: Iterable[int] = ()) -> dict:
    """Switches ``model``'s attention to ``spec`` for decode steps; returns the call info."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    forward, info = make_attention(spec, seed=seed, dense_layers=dense_layers)
    name = f"santa_bench_{next(_names)}"
    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    model.set_attn_implementation(name)
    info["attn_implementation"] = name
    return info
