"""Token-level agreement with dense attention on any text (teacher forcing).

The text is tokenised once; the first ``prefix`` tokens are prefilled densely, then
every following token is fed as one decode step. At every step the method's
next-token distribution is compared with dense decoding of the same tokens: top-1
agreement and KL(dense || method).
"""

from __future__ import annotations

from typing import Any

import torch

from santa_bench.accuracy.integration import use_method


def teacher_forced_logits(model, ids: torch.Tensor, prefix: int) -> torch.Tensor:
    """Returns next-token logits ``[B, steps, vocab]``: dense prefill, then decode steps."""
    with torch.no_grad():
        out = model(ids[:, :prefix], use_cache=True)
        past, logits = out.past_key_values, [out.logits[:, -1]]
        for t in range(prefix, ids.shape[1] - 1):
            out = model(ids[:, t : t + 1], past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits.append(out.logits[:, -1])
    return torch.stack(logits, 1).float()


def agreement(
    model,
    ids: torch.Tensor,
    spec: str,
    *,
    prefix: int,
    seed: int = 0,
    dense_layers: tuple[int, ...] = (),
    reference: torch.Tensor | None = None,
) -> dict[str, Any]:
    """Returns top-1 agreement and mean KL against dense for method ``spec`` on ``ids``."""
    if not 1 <= prefix < ids.shape[1] - 1:
        raise ValueError(f"prefix: must be in 1..{ids.shape[1] - 2}, got {prefix}")
    if reference is None:
        use_method(model, "dense")
        reference = teacher_forced_logits(model, ids, prefix)
    info = use_method(model, spec, seed=seed, dense_layers=dense_layers)
    logits = teacher_forced_logits(model, ids, prefix)
    log_p = torch.log_softmax(reference, -1)
    log_q = torch.log_softmax(logits, -1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    reads = info["kv_read_fraction"]
    return {
        "top1_agreement": float((logits.argmax(-1) == reference.argmax(-1)).float().mean()),
        "kl_vs_dense": float(kl.mean()),
        "steps": int(logits.shape[1]),
        "kv_read_fraction": sum(reads) / len(reads) if reads else 1.0,
        "reference": reference,
    }
