"""What the Bernoulli qK^T score stage (ALGORITHMS.md section 5) could save on a GPU.

Run anywhere:  python3 scripts/bernoulli_sectors.py [CAPTURE.safetensors]
The score stage reads only the K features some draw selects. HBM serves 32-byte
sectors (16 bf16 features): a sector is read when any of its features is. Per layer and
variant this prints the expected fraction of K *features* read (what the seed reports)
and of K *sectors* read (what the GPU moves), exact expectations over the draws:
feature j of a KV group is read with probability 1 - prod_h (1 - p_hj)^B (per-head
ternary draws, p_hj = |q_hj| / max_j |q_hj|) or 1 - (1 - p_j)^B (mean-group-query,
p_j from the group's mean query); a sector is read unless all its features are skipped.
Inputs: a ``santa-bench capture`` file (post-RoPE queries of real layers) and Gaussian
queries of the Llama-3.1-8B shape (32 heads, 8 KV heads, d=128).
"""

from __future__ import annotations

import sys

import torch

SECTOR_FEATURES = 16  # 32-byte sectors of bf16


def skip_probability(q: torch.Tensor, group: int, draws: int, grouping: str) -> torch.Tensor:
    """``[Hkv, d]`` probability that no draw of the group selects feature j (q: [Hq, d])."""
    hq, d = q.shape
    if grouping == "per-head":
        p = q.abs() / q.abs().amax(dim=-1, keepdim=True)
        skip = (1 - p) ** draws  # [Hq, d]
        return skip.reshape(hq // group, group, d).prod(dim=1)
    q_mean = q.reshape(hq // group, group, d).mean(dim=1)
    p = q_mean.abs() / q_mean.abs().amax(dim=-1, keepdim=True)
    return (1 - p) ** draws


def fractions(q: torch.Tensor, group: int, draws: int, grouping: str) -> tuple[float, float]:
    skip = skip_probability(q.double(), group, draws, grouping)
    feature = float((1 - skip).mean())
    hkv, d = skip.shape
    sector_skip = skip.reshape(hkv, d // SECTOR_FEATURES, SECTOR_FEATURES).prod(dim=-1)
    return feature, float((1 - sector_skip).mean())


def report(name: str, queries: list[torch.Tensor], group: int) -> None:
    for grouping in ("per-head", "mean-group-query"):
        for draws in (1, 4):
            pairs = [fractions(q, group, draws, grouping) for q in queries]
            feature = sum(p[0] for p in pairs) / len(pairs)
            sector = sum(p[1] for p in pairs) / len(pairs)
            print(f"| {name} | {grouping} | {draws} | {feature:.1%} | {sector:.1%} |")


def main() -> None:
    print("| queries | variant | draws B | K features read | K sectors read (32 B) |")
    print("|---|---|---|---|---|")
    if len(sys.argv) > 1:
        from safetensors.torch import load_file

        tensors = load_file(sys.argv[1])
        for name in sorted(k for k in tensors if k.endswith(".query")):
            layer = name.split(".")[0]
            q = tensors[name][0]  # [Hq, d]
            group = q.shape[0] // tensors[f"{layer}.key"].shape[1]
            report(f"captured {layer} (Hq={q.shape[0]}, d={q.shape[1]})", [q], group)
    gen = torch.Generator().manual_seed(0)
    queries = [torch.randn(32, 128, generator=gen) for _ in range(64)]
    report("Gaussian, Llama-3.1-8B shape (64 draws of q)", queries, 4)


if __name__ == "__main__":
    main()
