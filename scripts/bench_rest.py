"""The decode step outside attention on the GPU: cuBLAS against the Triton decode GEMMs.

Run on the H200:  python3 scripts/bench_rest.py OUT_DIR [gemm] [step]
Llama-3.1-8B shapes (hidden 4096, 32/8 heads of 128, intermediate 14336, vocab 128256),
bf16, rows M = 4 and 8 (the e2e batches).

- ``gemm``: each GEMM of a layer and the LM head, timed as CUDA-graph replays over enough
  weight copies that a pass reads > 3x the L2 (cold weights): ``F.linear`` (cuBLAS) and
  :func:`santa_bench.e2e.gemm.decode_linear` (gate/up also with SiLU*mul inside) over a
  sweep of launches at M=4, the best launch again at M=8; weight bytes / time is the
  stream rate.
- ``step``: the whole step outside attention (32 layers, embedding to argmax; attention
  replaced by a copy of its query) as one CUDA graph, ``rest=fused`` (three Triton kernels
  and four cuBLAS GEMMs a layer) against ``rest=gemm`` with and without programmatic
  dependent launch, with the launches ``gemm`` found best (the table of gemm.py when
  ``gemm`` did not run).
Rows go to OUT_DIR/rest.csv as they are measured. The CSVs of
results/h200/rest-2026-12-01 were made by this script at the commits its README names
(the norm-prologue sweeps with the code of ``84dfe12``, which had that prologue).
"""

from __future__ import annotations

import csv
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
SHAPES = {  # name: (weight rows, K)
    "qkv": ((HQ + 2 * HKV) * D, HIDDEN),
    "o": (HIDDEN, HQ * D),
    "gate_up": (2 * INTER, HIDDEN),
    "down": (HIDDEN, INTER),
    "lm_head": (VOCAB, HIDDEN),
}
KINDS = {"gate_up": ("plain", "silu")}  # every other shape: plain only
ROWS = (4, 8)
CONFIGS = [(bn, bk, 4, st) for bn in (16, 32, 64) for bk in (256, 512) for st in (3, 4)]
CONFIGS += [(32, 128, 4, 4), (16, 1024, 4, 3), (64, 256, 8, 4), (128, 128, 8, 3)]
FIELDS = ["section", "shape", "rows", "variant", "us", "tbps", "note"]


class Rows:
    def __init__(self, path: Path) -> None:
        self.f = path.open("a", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=FIELDS)
        if path.stat().st_size == 0:
            self.w.writeheader()

    def add(self, section: str, shape: str, rows: int, variant: str, us: float | None,
            nbytes: int, note: str = "") -> None:
        """One row: ``us`` (None: the launch failed, ``note`` says why), ``nbytes / us``."""
        row = {"section": section, "shape": shape, "rows": rows, "variant": variant,
               "us": "" if us is None else f"{us:.2f}",
               "tbps": "" if us is None else f"{nbytes / us / 1e6:.2f}", "note": note}
        self.w.writerow(row)
        self.f.flush()
        print(" | ".join(str(row[k]) for k in FIELDS), flush=True)


class Weights:
    """Cold copies of one shape's weight and its input rows."""

    def __init__(self, name: str, rows: int, device: str = "cuda") -> None:
        w_rows, k = SHAPES[name]
        gen = torch.Generator(device=device).manual_seed(0)
        self.nbytes = w_rows * k * 2
        l2 = torch.cuda.get_device_properties(0).L2_cache_size if device == "cuda" else 0
        copies = max(2, min(8, -(-3 * l2 // self.nbytes)))
        self.weights = [torch.randn(w_rows, k, device=device, generator=gen).bfloat16() * 0.02
                        for _ in range(copies)]
        self.x = torch.randn(rows, k, device=device, generator=gen).bfloat16()

    def calls(self, kind: str, config=None):
        if kind == "cublas":
            return [lambda w=w: F.linear(self.x, w) for w in self.weights]
        return [lambda w=w: gemm.decode_linear(self.x, w, silu=kind == "silu", config=config)
                for w in self.weights]


def gemm_section(rows_out: Rows, best: dict) -> None:
    """Sweeps at M = 4 (M = 8 measured the same in the first sweep), best launch at 8."""
    for name, (w_rows, k) in SHAPES.items():
        for rows in ROWS:
            weights = Weights(name, rows)
            rows_out.add("gemm", name, rows, "cublas", graph_call_us(weights.calls("cublas")),
                         weights.nbytes, "F.linear")
            for kind in KINDS.get(name, ("plain",)):
                key = (w_rows // 2 if kind == "silu" else w_rows, k, kind == "silu")
                sweep = CONFIGS if rows == ROWS[0] else [best[key]] if key in best else []
                results = []
                for config in sweep:
                    if k % config[1]:
                        continue
                    try:
                        us = graph_call_us(weights.calls(kind, config))
                    except Exception as exc:  # out of shared memory etc.: next launch
                        rows_out.add("gemm", name, rows, f"{kind} {config}", None, 0,
                                     type(exc).__name__)
                        continue
                    results.append((us, config))
                    rows_out.add("gemm", name, rows, f"{kind} {config}", us, weights.nbytes)
                if results and rows == ROWS[0]:
                    us, best[key] = min(results)
                    rows_out.add("gemm", name, rows, f"best {kind} {best[key]}", us,
                                 weights.nbytes)
            del weights
            torch.cuda.empty_cache()


def rest_step(model: Decoder, rest: str, ids: torch.Tensor, positions: torch.Tensor,
              caches: list[torch.Tensor]) -> torch.Tensor:
    """One decode step's greedy tokens, attention replaced by a copy of its query."""
    return model.decode_layers(rest, model.embed(ids), positions, caches, caches,
                               lambda _layer, q: q.clone()).argmax(-1)


def step_section(rows_out: Rows, best: dict) -> None:
    model = Decoder.random(NAMED["llama-3.1-8b"], device="cuda", dtype=torch.bfloat16)
    model.ensure_positions(2048)
    c = model.config
    weight_bytes = model.parameter_bytes() - model.embed_weight.numel() * 2
    gemm.CONFIG_OVERRIDES.clear()
    gemm.CONFIG_OVERRIDES.update(best)
    note = f"launches {gemm.CONFIG_OVERRIDES or 'of gemm.LAUNCHES'}"
    for rows in ROWS:
        caches = [torch.zeros(rows, 1024, c.num_kv_heads, c.head_dim, device="cuda",
                              dtype=torch.bfloat16) for _ in range(c.num_layers)]
        args = (torch.randint(0, c.vocab, (rows,), device="cuda"),
                torch.full((rows,), 500, device="cuda", dtype=torch.long), caches)
        want = rest_step(model, "fused", *args)
        for rep in range(2):
            for label, rest, pdl in (("fused", "fused", True), ("gemm", "gemm", True),
                                     ("gemm no-pdl", "gemm", False)):
                gemm.PDL = pdl
                same = bool(torch.equal(rest_step(model, rest, *args), want))
                us = graph_call_us([lambda rest=rest, args=args: rest_step(model, rest, *args)],
                                   budget_ms=300.0)
                rows_out.add("step", "rest of step", rows, label, us, weight_bytes,
                             f"same argmax={same} rep={rep} {note if rest == 'gemm' else ''}")
        del caches, args, want
        torch.cuda.empty_cache()
    gemm.CONFIG_OVERRIDES.clear()
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
