"""Why santa-prop's attention is slower inside ``santa-bench e2e`` than in the harness (GPU).

Run on the H200:  python3 scripts/diag_e2e_prop.py [BATCH] [LAYERS] [CTX]
Builds the e2e session (Llama-3.1-8B config, random weights, random K/V prefill, 32k),
sets the prop backend up as the loop does, runs a few decode steps, then times (CUDA
graphs, us per layer call): the loop's attention pass; the same backend on the loop's
last queries, one layer at a time; santa_prop directly on the loop's queries and on
Gaussian x3 queries; split-KV on the same cache. Prints one line per measurement.
"""

from __future__ import annotations

import dataclasses
import sys

import torch

import santa_kernels.triton_santa as ts
from santa_bench.e2e.attention import dense_backend, method_backend
from santa_bench.e2e.configs import resolve_config
from santa_bench.e2e.loop import DecodeSession
from santa_bench.e2e.model import Decoder
from santa_bench.methods import REGISTRY
from santa_bench.timing import graph_call_us


def main() -> None:
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    config = resolve_config("llama-3.1-8b")
    if layers < config.num_layers:
        config = dataclasses.replace(config, num_layers=layers)
    ctx = int(sys.argv[3]) if len(sys.argv) > 3 else 32768
    device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke test only
    model = Decoder.random(config, device=device, dtype=torch.bfloat16, seed=0)
    session = DecodeSession(model, batch=batch, ctx=ctx, steps=8, seed=0)
    session.prefill("random")
    method = REGISTRY.get("santa-prop")
    params = {"S": 128, "tile": 64, "stash": "fp16"}
    attend = method_backend(method, params, device="cuda", scale=session.scale, seed=0)
    session.prepare(attend)
    result = session.decode(attend, graph=True, keep_logits=False)
    n = config.num_layers
    print(f"B={batch} layers={n}: loop step {result.step_ms_median:.3f} ms, attention pass "
          f"{result.attention_ms_median:.3f} ms = {1e3 * result.attention_ms_median / n:.1f} "
          "us/layer", flush=True)
    cache = session.cache
    x = model.embed(session.first_tokens)
    qs = [model.attention_inputs(layer, x, cache.lengths.long())[0].contiguous()
          for layer in range(n)]
    print(f"q: shape {tuple(qs[0].shape)} dtype {qs[0].dtype} strides {qs[0].stride()} "
          f"|q| mean {float(qs[0].float().norm(dim=-1).mean()):.2f}; lengths "
          f"{cache.lengths.tolist()}; capacity {cache.capacity}", flush=True)
    t = graph_call_us([lambda layer=layer: attend(layer, qs[layer]) for layer in range(n)])
    print(f"backend on model q, per layer: {t:.1f} us", flush=True)
    ws = ts.SantaWorkspace.for_inputs(qs[0], cache.layers[0], 128, 64,
                                      stash_dtype=torch.float16)
    t = graph_call_us([lambda layer=layer: ts.santa_prop(
        qs[layer], cache.layers[layer], 128, workspace=ws, stash_dtype=torch.float16)
        for layer in range(n)])  # fmt: skip
    print(f"santa_prop on model q, own workspace: {t:.1f} us (splits {ws.num_splits})",
          flush=True)
    gen = torch.Generator(device=device).manual_seed(1)
    qr = (torch.randn(qs[0].shape, device=device, generator=gen) * 3).bfloat16()
    t = graph_call_us([lambda layer=layer: ts.santa_prop(
        qr, cache.layers[layer], 128, workspace=ws, stash_dtype=torch.float16)
        for layer in range(n)])  # fmt: skip
    print(f"santa_prop on Gaussian x3 q: {t:.1f} us", flush=True)
    t = graph_call_us([lambda layer=layer: ts._score_pass(
        qs[layer], cache.layers[layer], ws, session.scale, 64) for layer in range(n)])
    print(f"score pass alone on model q: {t:.1f} us", flush=True)
    dense = dense_backend("triton-splitkv", session.scale)
    dense.setup(cache, qs[0])
    t = graph_call_us([lambda layer=layer: dense(layer, qs[layer]) for layer in range(n)])
    print(f"split-KV backend: {t:.1f} us", flush=True)


if __name__ == "__main__":
    main()
