"""The accuracy engine on a GPU: every kernel method in every layer, CUDA graphs, ragged
batches, at the attention shape of Qwen2.5-Coder-0.5B (14 query / 2 KV heads, d=64)."""

from __future__ import annotations

import pytest
import torch

from santa_bench.accuracy.engine import Engine, Prompt
from santa_bench.methods import REGISTRY, parse_method_specs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
transformers = pytest.importorskip("transformers")

# the configurations of the committed GPU accuracy runs
SPECS = [
    "santa-prop:S=128", "santa-prop:S=256", "santa-flash:S=2048",
    "santa-flash:S=256", "santa-sys:S=128", "santa-strat:S=128",
    "santa-iid:S=128", "santapp:M=32", "santapp:M=32,sink=4,window=64",
    "santapp:M=64,team_size=32,policy=kmeans", "bernoulli:value_stage=prop,S=128",
    "santapp", "santapp:M=32,draw=head",
]


@pytest.fixture(scope="module")
def engine():
    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=512, hidden_size=896, intermediate_size=1024,
                                      num_hidden_layers=2, num_attention_heads=14,
                                      num_key_value_heads=2, max_position_embeddings=8192,
                                      eos_token_id=511)
    model = transformers.Qwen2ForCausalLM(config).eval()
    return Engine(model, device="cuda", batch=3)


def _prompts(lengths=(3000, 2200, 2900, 1800)) -> list[Prompt]:
    gen = torch.Generator().manual_seed(0)
    return [Prompt(tuple(torch.randint(0, 500, (n,), generator=gen).tolist()), 12)
            for n in lengths]


@pytest.mark.parametrize("spec", SPECS)
def test_every_kernel_method_decodes_ragged_batches(engine, spec):
    (method, overrides), = parse_method_specs(spec)
    params = method.resolve_params(overrides)
    prompts = _prompts()
    out = engine.generate(method, params, prompts, seed=1)
    assert len(out.tokens) == 4 and all(1 <= len(t) <= 12 for t in out.tokens)
    assert out.kv_read_fraction and all(0 < f <= 1.0 + 1e-6 for f in out.kv_read_fraction)


def test_a_reference_only_method_decodes_through_its_reference(engine):
    """MagicPIG has no kernel: the engine runs its PyTorch reference on the GPU (each
    layer's prompt hashed once after the prefill), without --reference."""
    method = REGISTRY.get("magicpig")
    out = engine.generate(method, method.resolve_params({}), _prompts(), seed=1)
    assert len(out.tokens) == 4 and all(1 <= len(t) <= 12 for t in out.tokens)
    calls = len(out.kv_read_fraction)  # one per sequence, layer and step
    assert calls and all(0 < f <= 1.0 for f in out.kv_read_fraction)
    print(f"magicpig reference decode: {out.decode_s:.2f} s for {calls} per-sequence calls "
          f"({1e3 * out.decode_s / calls:.2f} ms each, at 1.8k-3k tokens)")


def test_a_near_exact_budget_follows_dense(engine):
    prompts = [Prompt(p.ids, 1) for p in _prompts((1500, 1200))]
    dense = engine.generate(REGISTRY.get("dense"), {}, prompts, keep_logits=True)
    prop = REGISTRY.get("santa-prop")
    wide = engine.generate(prop, prop.resolve_params({"S": 8192}), prompts, keep_logits=True)
    cos = torch.nn.functional.cosine_similarity(dense.first_logits, wide.first_logits, dim=-1)
    assert bool((cos > 0.99).all()), cos


def test_kernels_and_references_agree_on_dense_like_budgets(engine):
    prompts = [Prompt(p.ids, 1) for p in _prompts((1400, 1000))]
    prop = REGISTRY.get("santa-prop")
    params = prop.resolve_params({"S": 8192})
    kernel = engine.generate(prop, params, prompts, keep_logits=True)
    reference = engine.generate(prop, params, prompts, keep_logits=True, backend="reference")
    cos = torch.nn.functional.cosine_similarity(kernel.first_logits, reference.first_logits,
                                                dim=-1)
    assert bool((cos > 0.99).all()), cos
