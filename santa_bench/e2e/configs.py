"""Decoder shapes for end-to-end runs: named configs, or read from a Hugging Face config.

A :class:`ModelConfig` is everything the compact decoder (``model.py``) needs: layer
count, widths, heads, RoPE (plain or Llama-3 scaled), norms, biases, tied embeddings.
Named configs let a speed-only run build a random model without downloading anything
(weights do not change speed); their Hugging Face ids are accepted as aliases.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from santa_kernels.validate import InputError

FAMILIES = ("llama", "qwen2", "mistral")


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 RoPE frequency scaling (``rope_type: llama3``)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_positions: int


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a Llama / Qwen2 / Mistral-family decoder."""

    name: str
    family: str
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int
    rope_theta: float
    rope_scaling: RopeScaling | None = None
    rms_eps: float = 1e-5
    qkv_bias: bool = False
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        for key in ("num_layers", "hidden", "num_heads", "num_kv_heads", "head_dim",
                    "intermediate", "vocab", "max_positions"):
            if getattr(self, key) <= 0:
                raise InputError(f"config {self.name}: {key} must be > 0")
        if self.num_heads % self.num_kv_heads:
            raise InputError(f"config {self.name}: {self.num_heads} query heads is not a "
                             f"multiple of {self.num_kv_heads} KV heads")
        if self.head_dim % 2:
            raise InputError(f"config {self.name}: RoPE needs an even head dim")
        if self.family not in FAMILIES:
            raise InputError(f"config {self.name}: family must be one of {FAMILIES}")

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads

    def num_parameters(self) -> int:
        """Returns the parameter count (embeddings counted once when tied)."""
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attn = self.hidden * (q + 2 * kv) + q * self.hidden
        attn += (q + 2 * kv) if self.qkv_bias else 0
        mlp = 3 * self.hidden * self.intermediate
        per_layer = attn + mlp + 2 * self.hidden
        head = 0 if self.tie_embeddings else self.vocab * self.hidden
        return self.num_layers * per_layer + self.vocab * self.hidden + head + self.hidden

    def kv_bytes_per_token(self, element_size: int = 2) -> int:
        """Returns the K+V bytes one token occupies over all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element_size

    def describe(self) -> dict[str, Any]:
        return asdict(self)


_LLAMA3_8K = RopeScaling(8.0, 1.0, 4.0, 8192)

NAMED: dict[str, ModelConfig] = {
    c.name: c
    for c in (
        ModelConfig("llama-3.1-8b", "llama", 32, 4096, 32, 8, 128, 14336, 128256, 131072,
                    500000.0, _LLAMA3_8K, 1e-5),
        ModelConfig("llama-3.2-1b", "llama", 16, 2048, 32, 8, 64, 8192, 128256, 131072,
                    500000.0, RopeScaling(32.0, 1.0, 4.0, 8192), 1e-5, tie_embeddings=True),
        ModelConfig("qwen2.5-7b", "qwen2", 28, 3584, 28, 4, 128, 18944, 152064, 32768,
                    1000000.0, None, 1e-6, qkv_bias=True),
        # for tests: two layers, Llama-3 scaling that bites at short contexts
        ModelConfig("tiny", "llama", 2, 64, 4, 2, 16, 128, 256, 4096, 10000.0,
                    RopeScaling(4.0, 1.0, 4.0, 64), 1e-6),
        ModelConfig("tiny-qwen", "qwen2", 2, 64, 4, 2, 16, 96, 256, 4096, 1000000.0, None,
                    1e-6, qkv_bias=True, tie_embeddings=True),
    )
}
ALIASES = {
    "meta-llama/llama-3.1-8b": "llama-3.1-8b",
    "meta-llama/llama-3.1-8b-instruct": "llama-3.1-8b",
    "meta-llama/meta-llama-3.1-8b-instruct": "llama-3.1-8b",
    "meta-llama/llama-3.2-1b": "llama-3.2-1b",
    "meta-llama/llama-3.2-1b-instruct": "llama-3.2-1b",
    "qwen/qwen2.5-7b": "qwen2.5-7b",
    "qwen/qwen2.5-7b-instruct": "qwen2.5-7b",
}


def named_config(name: str) -> ModelConfig | None:
    """Returns the named config (or the one a known Hugging Face id aliases), else None."""
    key = str(name).strip().lower()
    return NAMED.get(key) or NAMED.get(ALIASES.get(key, ""))


def resolve_config(name: str) -> ModelConfig:
    """Returns the named config ``name``; InputError listing the names when unknown."""
    config = named_config(name)
    if config is None:
        raise InputError(f"unknown config {name!r}; named configs: {', '.join(NAMED)} "
                         "(or pass a Hugging Face model id/path with --model)")
    return config


def from_hf_config(hf: Any, name: str | None = None) -> ModelConfig:
    """Returns the :class:`ModelConfig` of a transformers Llama/Qwen2/Mistral config."""
    family = getattr(hf, "model_type", None)
    if family not in FAMILIES:
        raise InputError(f"model type {family!r} is not supported by the e2e decoder "
                         f"(supported: {', '.join(FAMILIES)})")
    window = getattr(hf, "sliding_window", None)
    if window and getattr(hf, "use_sliding_window", family == "mistral"):
        raise InputError(f"{name or family}: sliding-window attention ({window}) is not "
                         "supported by the e2e decoder")
    rope = dict(getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {})
    theta = float(rope.get("rope_theta", getattr(hf, "rope_theta", 10000.0)))
    kind = rope.get("rope_type", rope.get("type", "default"))
    scaling = None
    if kind == "llama3":
        scaling = RopeScaling(float(rope["factor"]), float(rope["low_freq_factor"]),
                              float(rope["high_freq_factor"]),
                              int(rope["original_max_position_embeddings"]))
    elif kind != "default":
        raise InputError(f"{name or family}: rope_type {kind!r} is not supported "
                         "(default, llama3)")
    if float(rope.get("partial_rotary_factor", 1.0)) != 1.0:
        raise InputError(f"{name or family}: partial rotary embeddings are not supported")
    heads = int(hf.num_attention_heads)
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
    bias = family == "qwen2" or bool(getattr(hf, "attention_bias", False))
    if getattr(hf, "mlp_bias", False):
        raise InputError(f"{name or family}: MLP biases are not supported")
    return ModelConfig(
        name=name or getattr(hf, "_name_or_path", "") or family,
        family=family,
        num_layers=int(hf.num_hidden_layers),
        hidden=int(hf.hidden_size),
        num_heads=heads,
        num_kv_heads=int(getattr(hf, "num_key_value_heads", None) or heads),
        head_dim=int(head_dim),
        intermediate=int(hf.intermediate_size),
        vocab=int(hf.vocab_size),
        max_positions=int(hf.max_position_embeddings),
        rope_theta=theta,
        rope_scaling=scaling,
        rms_eps=float(hf.rms_norm_eps),
        qkv_bias=bias,
        tie_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
    )


def hf_config(config: ModelConfig) -> Any:
    """Returns the transformers config of ``config`` (needs transformers; used by tests)."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    rope: dict[str, Any] = {"rope_theta": config.rope_theta, "rope_type": "default"}
    if config.rope_scaling is not None:
        s = config.rope_scaling
        rope.update(rope_type="llama3", factor=s.factor, low_freq_factor=s.low_freq_factor,
                    high_freq_factor=s.high_freq_factor,
                    original_max_position_embeddings=s.original_max_positions)
    common = dict(
        vocab_size=config.vocab, hidden_size=config.hidden,
        intermediate_size=config.intermediate, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim, max_position_embeddings=config.max_positions,
        rms_norm_eps=config.rms_eps, tie_word_embeddings=config.tie_embeddings,
        rope_parameters=rope,
    )
    if config.family == "qwen2":
        return Qwen2Config(**common)
    if config.family == "mistral":
        return MistralConfig(**common, sliding_window=None)
    return LlamaConfig(**common, attention_bias=config.qkv_bias)
