"""The selection methods' fast paths on a GPU at real shapes (32k tokens, Qwen2.5-0.5B's
14/2/64 and Llama-3.1-8B's 32/8/128 heads, bf16, contiguous and paged): each against its
reference (deterministic ones output for output, random ones in distribution), CUDA-graph
capture and replay (fresh draws for the random ones, a reset replays a run), and the
kernel runner's adapter. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SHAPES = [(14, 2, 64), (32, 8, 128)]
CTX = 32768


def _inputs(shape, layout, batch=2):
    from santa_bench.inputs import DecodeShape, make_decode_inputs
    from santa_kernels import KVCache

    heads, kv_heads, head_dim = shape
    q, kv = make_decode_inputs(DecodeShape(batch=batch, ctx=CTX, heads=heads,
                                           kv_heads=kv_heads, head_dim=head_dim),
                               device="cuda", seed=1)
    lengths = torch.tensor([CTX, 20000][:batch], device="cuda")
    kv = KVCache.contiguous(kv.k, kv.v, lengths)
    if layout == "paged":
        kv = kv.to_paged(16, torch.Generator().manual_seed(1))
    return q, kv


def _step(name, q, kv, seed=0):
    from santa_bench.methods import REGISTRY
    from santa_bench.methods import selection as module

    params = REGISTRY.get(name).resolve_params(PARAMS[name])
    build = {"oracle-topk": module._oracle_step, "quest": module._quest_step,
             "vattention": module._vattention_step, "topk-santa": module._topk_santa_step}
    step = build[name](q, kv, params, None, seed)
    if hasattr(step, "build"):
        step.build(kv)
    return step, params


PARAMS = {"oracle-topk": {"k": 2048}, "quest": {"pages": 128},
          "vattention": {"epsilon": 0.1, "delta": 0.1}, "topk-santa": {"k": 256, "S": 256}}


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", ["oracle-topk", "quest"])
def test_deterministic_fast_paths_match_their_references(name, shape, layout):
    from santa_bench.methods import REGISTRY

    q, kv = _inputs(shape, layout)
    step, params = _step(name, q, kv)
    out = step(q, kv)
    ref = REGISTRY.get(name).run_reference(q, kv, params)
    assert _rel(out, ref.out) < 2e-2  # bf16 storage; near-ties may swap a boundary token
    reads = step.read_counts(q, kv)
    assert abs(reads.kv_read_fraction - ref.reads.kv_read_fraction) < 0.01


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", ["vattention", "topk-santa"])
def test_random_fast_paths_match_their_references_in_distribution(name, shape):
    import santa_kernels as sk
    from santa_bench.methods import REGISTRY

    q, kv = _inputs(shape, "contiguous")
    dense = sk.dense_attention(q, kv).out
    step, params = _step(name, q, kv, seed=3)
    method = REGISTRY.get(name)
    fast = [_rel(step(q, kv), dense) for _ in range(48)]
    ref = [_rel(method.run_reference(q, kv, params, seed=s).out, dense) for s in range(48)]
    ratio = (sum(fast) / len(fast)) / (sum(ref) / len(ref))
    assert 0.7 < ratio < 1.4, ratio
    assert len(set(fast)) > 40  # fresh numbers every call


@pytest.mark.parametrize("name", ["oracle-topk", "quest", "vattention", "topk-santa"])
def test_graph_capture_replays_fresh_draws_and_a_reset_reproduces(name):
    q, kv = _inputs(SHAPES[0], "paged")
    step, _ = _step(name, q, kv, seed=5)
    eager = step(q, kv).clone()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(q, kv)  # warm the allocator on the capture stream
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        out = step(q, kv)
    step.reset_rng(0)
    graph.replay()
    first = out.clone()
    graph.replay()
    second = out.clone()
    if name in ("vattention", "topk-santa"):
        assert not torch.equal(first, second)
        step.reset_rng(0)
        graph.replay()
        assert torch.equal(out, first)
    else:
        assert torch.equal(first, second) and torch.equal(first, eager)


@pytest.mark.parametrize("name", ["oracle-topk", "quest", "vattention", "topk-santa"])
def test_kernel_adapters_run_and_count_their_reads(name):
    from santa_bench.methods import REGISTRY

    q, kv = _inputs(SHAPES[0], "contiguous", batch=1)
    method = REGISTRY.get(name)
    params = method.resolve_params(PARAMS[name])
    prepared = method.prepare(q, kv, seed=0, **params)
    out = prepared()
    assert out.shape == q.shape and torch.isfinite(out).all()
    reads = prepared.reads()
    assert 0 < reads.kv_read_fraction <= 1.0
    if name == "quest":  # bounds + pages: 2/16 + 128*16/32k of K, 128*16/32k of V
        assert abs(reads.kv_read_fraction - (2 / 16 + 2 * 2048 / CTX) / 2) < 1e-3
        assert prepared.metrics["index_build_ms"][0] > 0


ENGINE_SPECS = ["oracle-topk:k=256", "oracle-topk:k=256,shared=head", "quest:pages=16",
                "quest:pages=16,shared=head", "vattention:sink=64,window=64,topk=64",
                "topk-santa:k=64,S=128"]


@pytest.mark.parametrize("spec", ENGINE_SPECS)
def test_selection_methods_decode_ragged_batches_in_cuda_graphs(spec, monkeypatch):
    """The accuracy engine at Qwen2.5-Coder-0.5B's attention shape (random weights): every
    layer through the fast path, steps captured in a CUDA graph (not the eager fallback),
    sequences of different lengths in one batch."""
    transformers = pytest.importorskip("transformers")
    from santa_bench.accuracy import engine as engine_module
    from santa_bench.methods import parse_method_specs

    captured = []
    capture = engine_module._capture

    def recording(step):
        graph = capture(step)
        captured.append(graph is not None)
        return graph

    monkeypatch.setattr(engine_module, "_capture", recording)
    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=512, hidden_size=896, intermediate_size=1024,
                                      num_hidden_layers=2, num_attention_heads=14,
                                      num_key_value_heads=2, max_position_embeddings=8192,
                                      eos_token_id=511)
    engine = engine_module.Engine(transformers.Qwen2ForCausalLM(config).eval(), device="cuda",
                                  batch=3)
    gen = torch.Generator().manual_seed(0)
    prompts = [engine_module.Prompt(tuple(torch.randint(0, 500, (n,), generator=gen).tolist()),
                                     12) for n in (3000, 2200, 2900, 1800)]
    (method, overrides), = parse_method_specs(spec)
    out = engine.generate(method, method.resolve_params(overrides), prompts, seed=1)
    assert len(out.tokens) == 4 and all(1 <= len(t) <= 12 for t in out.tokens)
    assert out.kv_read_fraction and all(0 < f <= 1.0 for f in out.kv_read_fraction)
    assert captured and all(captured)
