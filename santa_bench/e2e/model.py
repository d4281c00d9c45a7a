"""A compact Llama / Qwen2 / Mistral decoder whose parameters are plain tensors.

The forward pass is split at attention so that the decode loop (``loop.py``) owns the
KV cache and hands each layer's query to any decode-attention backend:
``attention_inputs`` (RMSNorm, fused QKV projection, RoPE) -> the loop writes K/V and
runs attention -> ``layer_output`` (output projection, residual, RMSNorm, SwiGLU MLP).
Numerics follow transformers (fp32 RMSNorm statistics, fp32 RoPE tables cast to the
model dtype), so with the same weights the logits match ``LlamaForCausalLM`` /
``Qwen2ForCausalLM``. Random weights are drawn directly on the target device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from santa_bench.e2e.configs import ModelConfig, from_hf_config

INIT_STD = 0.02


@dataclass
class LayerWeights:
    """One decoder layer: norms, fused QKV (and bias), output, fused gate/up, down."""

    ln_attn: torch.Tensor
    w_qkv: torch.Tensor
    b_qkv: torch.Tensor | None
    w_o: torch.Tensor
    ln_mlp: torch.Tensor
    w_gate_up: torch.Tensor
    w_down: torch.Tensor


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Returns ``weight * x / rms(x)`` with fp32 statistics (as transformers computes it)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rope_inv_freq(config: ModelConfig, device: torch.device | str = "cpu") -> torch.Tensor:
    """Returns the fp32 RoPE inverse frequencies ``[d/2]`` (Llama-3 scaled if configured)."""
    d = config.head_dim
    exponents = torch.arange(0, d, 2, dtype=torch.int64).to(device=device, dtype=torch.float)
    inv = 1.0 / (config.rope_theta ** (exponents / d))
    s = config.rope_scaling
    if s is None:
        return inv
    low_wavelen = s.original_max_positions / s.low_freq_factor
    high_wavelen = s.original_max_positions / s.high_freq_factor
    wavelen = 2 * torch.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / s.factor, inv)
    smooth = (s.original_max_positions / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Decoder:
    """The decoder's weights and its forward pieces (see the module docstring)."""

    def __init__(
        self,
        config: ModelConfig,
        embed: torch.Tensor,
        layers: list[LayerWeights],
        norm: torch.Tensor,
        lm_head: torch.Tensor,
        *,
        weights: str,
    ) -> None:
        self.config = config
        self.embed_weight = embed
        self.layers = layers
        self.norm = norm
        self.lm_head = lm_head
        self.weights = weights  # "random" | "real"
        self.cos = self.sin = embed.new_empty(0, config.head_dim)

    @property
    def device(self) -> torch.device:
        return self.embed_weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_weight.dtype

    # ------------------------------------------------------------------ builders
    @classmethod
    def random(
        cls,
        config: ModelConfig,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.bfloat16,
        seed: int = 0,
        std: float = INIT_STD,
    ) -> Decoder:
        """Returns a decoder with N(0, std) weights drawn on ``device`` (norms are 1)."""
        device = torch.device(device)
        gen = torch.Generator(device=device).manual_seed(seed)

        def normal(*shape: int) -> torch.Tensor:
            return torch.empty(*shape, device=device, dtype=dtype).normal_(0.0, std, generator=gen)

        def ones(n: int) -> torch.Tensor:
            return torch.ones(n, device=device, dtype=dtype)

        c = config
        q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        layers = [
            LayerWeights(
                ln_attn=ones(c.hidden),
                w_qkv=normal(q + 2 * kv, c.hidden),
                b_qkv=normal(q + 2 * kv) if c.qkv_bias else None,
                w_o=normal(c.hidden, q),
                ln_mlp=ones(c.hidden),
                w_gate_up=normal(2 * c.intermediate, c.hidden),
                w_down=normal(c.hidden, c.intermediate),
            )
            for _ in range(c.num_layers)
        ]
        embed = normal(c.vocab, c.hidden)
        head = embed if c.tie_embeddings else normal(c.vocab, c.hidden)
        return cls(c, embed, layers, ones(c.hidden), head, weights="random")

    @classmethod
    def from_state_dict(
        cls,
        config: ModelConfig,
        state: dict[str, torch.Tensor],
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        prefix: str = "model.",
    ) -> Decoder:
        """Returns the decoder of a transformers Llama/Qwen2/Mistral state dict."""

        def get(key: str) -> torch.Tensor:
            if key not in state:
                raise KeyError(f"state dict has no {key!r} (is this a Llama-family model?)")
            tensor = state[key]
            return tensor.to(device=device, dtype=dtype or tensor.dtype)

        def cat(*keys: str) -> torch.Tensor:
            return torch.cat([get(k) for k in keys], dim=0).contiguous()

        layers = []
        for i in range(config.num_layers):
            p = f"{prefix}layers.{i}."
            attn = [f"{p}self_attn.{x}_proj" for x in ("q", "k", "v")]
            layers.append(
                LayerWeights(
                    ln_attn=get(p + "input_layernorm.weight"),
                    w_qkv=cat(*(a + ".weight" for a in attn)),
                    b_qkv=cat(*(a + ".bias" for a in attn)) if config.qkv_bias else None,
                    w_o=get(p + "self_attn.o_proj.weight"),
                    ln_mlp=get(p + "post_attention_layernorm.weight"),
                    w_gate_up=cat(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                    w_down=get(p + "mlp.down_proj.weight"),
                )
            )
        embed = get(prefix + "embed_tokens.weight")
        tied = config.tie_embeddings or "lm_head.weight" not in state
        head = embed if tied else get("lm_head.weight")
        return cls(config, embed, layers, get(prefix + "norm.weight"), head, weights="real")

    @classmethod
    def from_hf(
        cls, model: Any, *, device: torch.device | str | None = None,
        dtype: torch.dtype | None = None, name: str | None = None,
    ) -> Decoder:
        """Returns the decoder of a transformers causal LM (its weights, shared or moved)."""
        config = from_hf_config(model.config, name)
        state = dict(model.state_dict())
        if config.tie_embeddings or "lm_head.weight" not in state:
            state.pop("lm_head.weight", None)
        device = device if device is not None else next(model.parameters()).device
        return cls.from_state_dict(config, state, device=device, dtype=dtype)

    # ------------------------------------------------------------------ forward
    def ensure_positions(self, n: int) -> None:
        """Builds the RoPE cos/sin tables for positions ``0..n-1`` (outside any graph)."""
        if self.cos.shape[0] >= n:
            return
        inv = rope_inv_freq(self.config, self.device)
        freqs = torch.arange(n, device=self.device, dtype=torch.float)[:, None] * inv[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Returns the token embeddings ``[..., hidden]``."""
        return F.embedding(ids, self.embed_weight)

    def attention_inputs(
        self, layer: int, x: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns post-RoPE ``q [M, Hq, d]``, ``k [M, Hkv, d]`` and ``v [M, Hkv, d]``.

        ``x`` is ``[M, hidden]`` (M tokens), ``positions`` their ``[M]`` int64 positions.
        """
        c, w = self.config, self.layers[layer]
        h = rms_norm(x, w.ln_attn, c.rms_eps)
        qkv = F.linear(h, w.w_qkv, w.b_qkv)
        nq, nkv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        m = x.shape[0]
        q = qkv[:, :nq].view(m, c.num_heads, c.head_dim)
        k = qkv[:, nq : nq + nkv].view(m, c.num_kv_heads, c.head_dim)
        v = qkv[:, nq + nkv :].view(m, c.num_kv_heads, c.head_dim)
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return q, k, v

    def layer_output(self, layer: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Returns the layer output ``[M, hidden]`` from its input and attention ``[M, Hq, d]``."""
        c, w = self.config, self.layers[layer]
        x = x + F.linear(attn.reshape(x.shape[0], -1), w.w_o)
        h = rms_norm(x, w.ln_mlp, c.rms_eps)
        gate, up = F.linear(h, w.w_gate_up).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, w.w_down)

    # ------------------------------------------------ fused decode step (e2e/fused.py)
    def fused_attention_inputs(
        self, layer: int, x: torch.Tensor, delta: torch.Tensor | None,
        positions: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        page_table: torch.Tensor | None = None, page_size: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode (one token per sequence): returns ``(x + delta, q)`` and writes the
        layer's new K/V at ``positions`` into the cache; ``attention_inputs`` plus the
        cache write and the previous layer's residual add, in three kernels."""
        from santa_bench.e2e import fused

        c, w = self.config, self.layers[layer]
        x, h = fused.add_rms_norm(x, delta, w.ln_attn, c.rms_eps)
        q = fused.rope_write(F.linear(h, w.w_qkv, w.b_qkv), self.cos, self.sin, positions,
                             k_cache, v_cache, c.num_heads, c.num_kv_heads, c.head_dim,
                             page_table, page_size)
        return x, q

    def fused_layer_output(
        self, layer: int, x: torch.Tensor, attn: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns ``(x', delta)`` with ``x' + delta`` = :meth:`layer_output` (the final
        residual add is left to the next layer's norm, as serving engines fuse it)."""
        from santa_bench.e2e import fused

        c, w = self.config, self.layers[layer]
        x, h = fused.add_rms_norm(x, F.linear(attn.reshape(x.shape[0], -1), w.w_o), w.ln_mlp,
                                  c.rms_eps)
        return x, F.linear(fused.silu_mul(F.linear(h, w.w_gate_up)), w.w_down)

    def fused_logits(self, x: torch.Tensor, delta: torch.Tensor | None) -> torch.Tensor:
        """Returns the logits of ``x + delta`` (:meth:`logits` with the last residual add)."""
        from santa_bench.e2e import fused

        return F.linear(fused.add_rms_norm(x, delta, self.norm, self.config.rms_eps)[1],
                        self.lm_head)

    # ------------------------------- decode step on Triton decode GEMMs (e2e/gemm.py)
    def gemm_attention_inputs(
        self, layer: int, x: torch.Tensor, delta: torch.Tensor | None,
        positions: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        page_table: torch.Tensor | None = None, page_size: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`fused_attention_inputs` with the QKV GEMM in Triton, every kernel a
        programmatic dependent of the one before (``gemm.use_pdl``)."""
        from santa_bench.e2e import fused, gemm

        c, w = self.config, self.layers[layer]
        pdl = gemm.use_pdl(x.device)
        x, h = fused.add_rms_norm(x, delta, w.ln_attn, c.rms_eps, pdl=pdl)
        q = fused.rope_write(gemm.decode_linear(h, w.w_qkv, bias=w.b_qkv, pdl=pdl), self.cos,
                             self.sin, positions, k_cache, v_cache, c.num_heads,
                             c.num_kv_heads, c.head_dim, page_table, page_size, pdl=pdl)
        return x, q

    def gemm_layer_output(
        self, layer: int, x: torch.Tensor, attn: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`fused_layer_output` with the Triton decode GEMMs: O; gate/up with SiLU*mul
        inside; down."""
        from santa_bench.e2e import fused, gemm

        c, w = self.config, self.layers[layer]
        pdl = gemm.use_pdl(x.device)
        o = gemm.decode_linear(attn.reshape(x.shape[0], -1), w.w_o, pdl=pdl)
        x, h = fused.add_rms_norm(x, o, w.ln_mlp, c.rms_eps, pdl=pdl)
        act = gemm.decode_linear(h, w.w_gate_up, silu=True, pdl=pdl)
        return x, gemm.decode_linear(act, w.w_down, pdl=pdl)

    def gemm_logits(self, x: torch.Tensor, delta: torch.Tensor | None) -> torch.Tensor:
        """:meth:`fused_logits` with the LM head on the Triton decode GEMM."""
        from santa_bench.e2e import fused, gemm

        pdl = gemm.use_pdl(x.device)
        h = fused.add_rms_norm(x, delta, self.norm, self.config.rms_eps, pdl=pdl)[1]
        return gemm.decode_linear(h, self.lm_head, pdl=pdl)

    def decode_layers(
        self, rest: str, x: torch.Tensor, positions: torch.Tensor,
        k_caches: list[torch.Tensor], v_caches: list[torch.Tensor],
        attend: Callable[[int, torch.Tensor], torch.Tensor],
        page_table: torch.Tensor | None = None, page_size: int = 0,
    ) -> torch.Tensor:
        """Returns the logits of one decode step of embeddings ``x [B, hidden]`` through
        every layer with ``attend(layer, q)`` as attention, the rest of the step as the
        ``fused_*`` or ``gemm_*`` pieces (``rest``); K/V written at ``positions``."""
        inputs, output, logits = (getattr(self, f"{rest}_{piece}") for piece in
                                  ("attention_inputs", "layer_output", "logits"))
        delta = None
        for layer in range(self.config.num_layers):
            x, q = inputs(layer, x, delta, positions, k_caches[layer], v_caches[layer],
                          page_table, page_size)
            x, delta = output(layer, x, attend(layer, q))
        return logits(x, delta)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Returns the next-token logits ``[M, vocab]`` of the last layer's output."""
        return F.linear(rms_norm(x, self.norm, self.config.rms_eps), self.lm_head)

    def parameter_bytes(self) -> int:
        """Returns the bytes of every weight (a tied head counted once)."""
        tensors = [self.embed_weight, self.norm]
        if self.lm_head is not self.embed_weight:
            tensors.append(self.lm_head)
        for w in self.layers:
            tensors += [t for t in vars(w).values() if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)
