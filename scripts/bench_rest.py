"""The decode step outside attention on the GPU: cuBLAS against the Triton decode GEMMs.

Run on the H200:  python3 scripts/bench_rest.py OUT_DIR [gemm] [step]
Llama-3.1-8B shapes (hidden 4096, 32/8 heads of 128, intermediate 14336, vocab 128256),
bf16, rows M = 4 and 8 (the e2e batches).

- ``gemm``: each GEMM of a layer and the LM head, timed as CUDA-graph replays over enough
  weight copies that a pass reads > 3x the L2 (cold weights): ``F.linear`` (cuBLAS) and
  :func:`santa_bench.e2e.gemm.decode_linear` with its own prologue/epilogue (the QKV
  and LM-head GEMMs with the residual add and RMSNorm, gate/up with them and SiLU*mul)
  over a sweep of launches; the weight bytes over the time is the stream rate.
- ``step``: the whole step outside attention (32 layers, embedding to argmax; attention
  replaced by its query, a copy) as one CUDA graph, ``rest=fused`` (three Triton kernels
  and four cuBLAS GEMMs a layer) against ``rest=gemm`` (Triton GEMMs, SiLU*mul inside
  gate/up) with and without programmatic dependent launch, with the launches ``gemm``
  found best (the table of gemm.py when ``gemm`` did not run).
Rows go to OUT_DIR/rest.csv as they are measured.
"""

from __future__ import annotations

import csv
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

from santa_bench.e2e import gemm
from santa_bench.e2e.configs import NAMED
from santa_bench.e2e.model import Decoder
from santa_bench.timing import graph_call_us

HIDDEN, INTER, VOCAB, HQ, HKV, D = 4096, 14336, 128256, 32, 8, 128
# name: (N out, K, weight rows, variant)
SHAPES = {
    "qkv": ((HQ + 2 * HKV) * D, HIDDEN, (HQ + 2 * HKV) * D, "norm"),
    "o": (HIDDEN, HQ * D, HIDDEN, "plain"),
    "gate_up": (INTER, HIDDEN, 2 * INTER, "silu"),
    "down": (HIDDEN, INTER, HIDDEN, "plain"),
    "lm_head": (VOCAB, HIDDEN, VOCAB, "norm"),
}
ROWS = (4, 8)
CONFIGS = [(bn, bk, 4, st) for bn in (16, 32, 64) for bk in (256, 512) for st in (3, 4)]
CONFIGS += [(32, 128, 4, 4), (16, 1024, 4, 3), (64, 256, 8, 4), (128, 128, 8, 3)]
NORM_CONFIGS = [(64, 64, 4, 8), (64, 128, 4, 6), (128, 64, 4, 8), (128, 64, 8, 8),
                (128, 128, 8, 4), (64, 128, 8, 6)]
if os.environ.get("BENCH_SHAPES"):  # e.g. BENCH_SHAPES=qkv,gate_up BENCH_KINDS=fused,fused-s
    SHAPES = {k: v for k, v in SHAPES.items() if k in os.environ["BENCH_SHAPES"].split(",")}
# kernel variants: plain (no prologue), silu (epilogue only), fused (the shape's own:
# residual add + RMSNorm for qkv and lm_head, and SiLU*mul for gate_up)
KINDS = {"qkv": ("plain", "fused"), "o": ("plain",), "gate_up": ("plain", "silu", "fused"),
         "down": ("plain",), "lm_head": ("plain", "fused")}
if os.environ.get("BENCH_KINDS"):  # fused-s (gone at db32fdc): the statistic's own loads
    KINDS = {k: tuple(os.environ["BENCH_KINDS"].split(",")) for k in KINDS}
FIELDS = ["section", "shape", "rows", "variant", "us", "tbps", "note"]


class Rows:
    def __init__(self, path: Path) -> None:
        self.f = path.open("a", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=FIELDS)
        if path.stat().st_size == 0:
            self.w.writeheader()

    def add(self, **row) -> None:
        self.w.writerow(row)
        self.f.flush()
        print(" | ".join(f"{row.get(k, '')}" for k in FIELDS), flush=True)


class Weights:
    """Cold copies of one shape's weight and its inputs (made once per shape and rows)."""

    def __init__(self, name: str, rows: int) -> None:
        _, k, w_rows, _ = SHAPES[name]
        gen = torch.Generator(device="cuda").manual_seed(0)
        self.nbytes = w_rows * k * 2
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        copies = max(2, min(8, -(-3 * l2 // self.nbytes)))
        self.weights = [torch.randn(w_rows, k, device="cuda", generator=gen).bfloat16() * 0.02
                        for _ in range(copies)]
        self.x = torch.randn(rows, k, device="cuda", generator=gen).bfloat16()
        self.delta = torch.randn(rows, k, device="cuda", generator=gen).bfloat16()
        self.norm = torch.ones(k, device="cuda", dtype=torch.bfloat16)

    def calls(self, kind: str, variant: str, config=None):
        if kind == "cublas":
            return [lambda w=w: F.linear(self.x, w) for w in self.weights]
        kw = {"config": config}
        if kind == "silu" or (kind.startswith("fused") and variant == "silu"):
            kw["silu"] = True
        if kind.startswith("fused"):
            kw.update(norm=self.norm, delta=self.delta, eps=1e-5)
        return [lambda w=w: gemm.decode_linear(self.x, w, **kw) for w in self.weights]


def _silu(kind: str, variant: str) -> bool:
    return kind == "silu" or (kind.startswith("fused") and variant == "silu")


def gemm_section(rows_out: Rows, best: dict) -> None:
    """Sweeps at M = 4 (M = 8 measured the same in the first sweep), best launch at 8."""
    for name, (n_out, k, w_rows, variant) in SHAPES.items():
        weights = Weights(name, 4)
        us = graph_call_us(weights.calls("cublas", variant))
        rows_out.add(section="gemm", shape=name, rows=4, variant="cublas", us=f"{us:.2f}",
                     tbps=f"{weights.nbytes / us / 1e6:.2f}", note="F.linear")
        for kind in KINDS[name]:
            silu = _silu(kind, variant)
            results = []
            configs = CONFIGS + (NORM_CONFIGS if kind.startswith("fused") else [])
            if os.environ.get("BENCH_CONFIGS") == "norm":  # the norm prologue's sweep only
                configs = [*NORM_CONFIGS, (64, 512, 4, 3), (64, 256, 4, 4), (128, 128, 8, 3)]
            for config in configs:
                if k % config[1]:
                    continue
                try:
                    us = graph_call_us(weights.calls(kind, variant, config))
                except Exception as exc:  # out of shared memory etc.: next launch
                    rows_out.add(section="gemm", shape=name, rows=4, variant=f"{kind} {config}",
                                 us="", tbps="", note=f"{type(exc).__name__}"[:80])
                    continue
                results.append((us, config))
                rows_out.add(section="gemm", shape=name, rows=4, variant=f"{kind} {config}",
                             us=f"{us:.2f}", tbps=f"{weights.nbytes / us / 1e6:.2f}", note="")
            if not results:
                continue
            us, config = min(results)
            key = (n_out if silu else w_rows, k, silu, kind.startswith("fused"))
            best[key] = config
            rows_out.add(section="gemm", shape=name, rows=4, variant=f"best {kind} {config}",
                         us=f"{us:.2f}", tbps=f"{weights.nbytes / us / 1e6:.2f}", note="")
        del weights
        weights = Weights(name, 8)
        us = graph_call_us(weights.calls("cublas", variant))
        rows_out.add(section="gemm", shape=name, rows=8, variant="cublas", us=f"{us:.2f}",
                     tbps=f"{weights.nbytes / us / 1e6:.2f}", note="F.linear")
        for kind in KINDS[name]:
            silu = _silu(kind, variant)
            config = best.get((n_out if silu else w_rows, k, silu, kind.startswith("fused")))
            if config:
                us = graph_call_us(weights.calls(kind, variant, config))
                rows_out.add(section="gemm", shape=name, rows=8, variant=f"{kind} {config}",
                             us=f"{us:.2f}", tbps=f"{weights.nbytes / us / 1e6:.2f}", note="")
        del weights
        torch.cuda.empty_cache()


def _use(best: dict, fuse_norm: bool, cublas: set) -> str:
    """Sets gemm's launches for one step variant; returns them as a note."""
    gemm.CONFIG_OVERRIDES.clear()
    for exact in (True, False):  # the variant's own launches first, then the plain ones
        for (n, k, silu, fused), config in best.items():
            if (fused == fuse_norm) if exact else not (silu or fused):
                gemm.CONFIG_OVERRIDES.setdefault((n, k, silu), config)
    gemm.FUSE_NORM = fuse_norm
    gemm.CUBLAS.clear()
    gemm.CUBLAS.update(cublas)
    return f"{gemm.CONFIG_OVERRIDES} cublas={sorted(cublas)}"


def step_section(rows_out: Rows, best: dict) -> None:
    model = Decoder.random(NAMED["llama-3.1-8b"], device="cuda", dtype=torch.bfloat16)
    model.ensure_positions(2048)
    c = model.config
    weight_bytes = model.parameter_bytes() - model.embed_weight.numel() * 2
    variants = {  # label: (FUSE_NORM, CUBLAS shapes, PDL)
        "gemm": (False, set(), True),
        "gemm no-pdl": (False, set(), False),
    }
    for rows in ROWS:
        caches = [(torch.zeros(rows, 1024, c.num_kv_heads, c.head_dim, device="cuda",
                               dtype=torch.bfloat16),) * 2 for _ in range(c.num_layers)]
        positions = torch.full((rows,), 500, device="cuda", dtype=torch.long)
        ids = torch.randint(0, c.vocab, (rows,), device="cuda")

        def fused_step(ids=ids, caches=caches, positions=positions):
            x, delta = model.embed(ids), None
            for layer in range(c.num_layers):
                x, q = model.fused_attention_inputs(layer, x, delta, positions, *caches[layer])
                x, delta = model.fused_layer_output(layer, x, q.clone())
            return model.fused_logits(x, delta).argmax(-1)

        def gemm_step(ids=ids, caches=caches, positions=positions):
            x, delta = model.embed(ids), None
            for layer in range(c.num_layers):
                x, q = model.gemm_attention_inputs(layer, x, delta, positions, *caches[layer])
                x, delta = model.gemm_layer_output(layer, x, q.clone())
            return model.gemm_logits(x, delta).argmax(-1)

        want = fused_step()
        for rep in range(2):
            us = graph_call_us([fused_step], budget_ms=300.0)
            rows_out.add(section="step", shape="rest of step", rows=rows, variant="fused",
                         us=f"{us:.1f}", tbps=f"{weight_bytes / us / 1e6:.2f}", note=f"rep={rep}")
            for label, (fuse_norm, cublas, pdl) in variants.items():
                note = _use(best, fuse_norm, cublas)
                gemm.PDL = pdl
                same = bool(torch.equal(gemm_step(), want))
                us = graph_call_us([gemm_step], budget_ms=300.0)
                rows_out.add(section="step", shape="rest of step", rows=rows, variant=label,
                             us=f"{us:.1f}", tbps=f"{weight_bytes / us / 1e6:.2f}",
                             note=f"same argmax={same} rep={rep} {note}")
        del caches
        torch.cuda.empty_cache()
    _use({}, False, set())
    gemm.PDL = True


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "rest")
    out.mkdir(parents=True, exist_ok=True)
    sections = sys.argv[2:] or ["gemm", "step"]
    rows = Rows(out / "rest.csv")
    best: dict = {}
    t0 = time.time()
    for name in sections:
        try:
            {"gemm": gemm_section, "step": step_section}[name](rows, best)
        except Exception:
            traceback.print_exc()
        print(f"-- {name} done at {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
