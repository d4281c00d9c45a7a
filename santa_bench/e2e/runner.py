"""The e2e runner: cases of batched decode, their rows, and the commands that rerun them.

A case is one (model, weights, batch, ctx, method or dense backend, layout, prefill,
steps, ...) decode run. Rows: ``step_ms_median`` (with the raw samples), ``step_ms_p90``,
``tokens_per_s`` (batch / median step), ``attention_ms_median`` and
``attention_share`` (the attention-only pass over the step), ``speedup_vs_best_dense``
(the fastest dense backend of the same group, with a bootstrap interval) and, with real
weights, ``token_agreement`` / ``token_agreement_prefix`` against the first dense
backend's greedy tokens (overall fraction equal; mean fraction before the first
divergence). The runner keeps one model and one prefilled session per group, so a sweep
over methods prefills once.
"""

from __future__ import annotations

import gc
import json
import math
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from santa_bench.baselines import Unsupported, decode_names
from santa_bench.e2e.attention import (
    CPU_AUTO_DENSE,
    LayerRouting,
    backend_label,
    dense_backend,
    method_backend,
)
from santa_bench.e2e.configs import ModelConfig, from_hf_config, named_config
from santa_bench.e2e.loop import resolve_rest
from santa_bench.inputs import parse_dtype
from santa_bench.methods import REGISTRY, Method, Registry
from santa_bench.runners.schema import E2E
from santa_kernels.validate import InputError

WEIGHTS = ("random", "real")
GROUP_KEYS = ("model", "weights", "batch", "ctx", "decode_steps", "layout", "page_size",
              "prefill", "prefill_chunk", "dtype", "seed", "device", "rest", "timing")


@dataclass(frozen=True)
class E2EGrid:
    """What ``santa-bench e2e`` sweeps: methods x contexts x batches on one model."""

    model: str
    weights: str
    methods: list[tuple[Method, dict[str, Any]]]
    ctx: list[int]
    batch: list[int]
    steps: int = E2E.default("decode_steps")
    dense_backends: list[str] | None = None  # None: every one for the device ("auto")
    layout: str = E2E.default("layout")
    page_size: int = E2E.default("page_size")
    dense_layers: str = E2E.default("dense_layers")
    prefill: str = E2E.default("prefill")
    prefill_chunk: int = E2E.default("prefill_chunk")
    dtype: str = E2E.default("dtype")
    seed: int = E2E.default("seed")
    device: str = "cpu"  # resolved (schema: auto)
    graph: bool = E2E.default("graph")
    rest: str = E2E.default("rest")  # fused | gemm | torch | auto (gemm on a GPU)


def parse_layers(text: str | Iterable[int] | None) -> tuple[int, ...]:
    """Returns sorted unique layer indices of ``"0,1"``; ValueError on a bad item."""
    if text is None:
        return ()
    items = str(text).split(",") if isinstance(text, str) else list(text)
    layers = set()
    for item in items:
        item = str(item).strip()
        if not item:
            continue
        if not item.isdigit():
            raise ValueError(f"dense_layers: expected layer indices like 0,1, got {item!r}")
        layers.add(int(item))
    return tuple(sorted(layers))


def model_config(model: str, weights: str) -> ModelConfig | None:
    """Returns the config of a named model when known without loading anything."""
    return named_config(model) if weights == "random" else None


def check_grid(grid: E2EGrid, option=lambda name: "--" + name.replace("_", "-")) -> None:
    """Raises ValueError for a grid the runner cannot run (``option`` spells the keys)."""
    if grid.weights not in WEIGHTS:
        raise ValueError(f"{option('weights')}: expected random or real, got {grid.weights!r}")
    for name in ("batch", "ctx"):
        values = getattr(grid, name)
        if not values or min(values) <= 0:
            raise ValueError(f"{option(name)}: every value must be > 0")
    if grid.steps < 2:
        raise ValueError(f"{option('steps')}: need at least 2 decode steps, got {grid.steps}")
    if grid.layout not in ("contiguous", "paged"):
        raise ValueError(f"{option('layout')}: expected contiguous or paged, got {grid.layout!r}")
    if grid.page_size <= 0:
        raise ValueError(f"{option('page_size')}: must be > 0")
    if grid.prefill not in ("dense", "random"):
        raise ValueError(f"{option('prefill')}: expected dense or random, got {grid.prefill!r}")
    if grid.prefill_chunk <= 0:
        raise ValueError(f"{option('prefill_chunk')}: must be > 0")
    if grid.weights == "real" and grid.prefill == "random":
        raise ValueError(f"{option('prefill')} random: real weights need the dense prefill "
                         "(random K/V is for speed-only runs with random weights)")
    parse_dtype(grid.dtype)
    for batch in grid.batch:
        resolve_rest(grid.rest, torch.device(grid.device), option("rest"), batch=batch)
    layers = parse_layers(grid.dense_layers)
    known = decode_names()
    for name in grid.dense_backends or []:
        if name not in known:
            raise ValueError(f"{option('dense_backends')}: unknown backend {name!r}; "
                             f"known: {', '.join(known)}")
    for method, _ in grid.methods:
        if method.family == "baseline":
            raise ValueError(f"method {method.name!r} is a kernel baseline; name 'dense' and "
                             f"pick its backends with {option('dense_backends')}")
    config = named_config(grid.model)
    if grid.weights == "random" and config is None and "/" not in grid.model:
        from santa_bench.e2e.configs import resolve_config

        resolve_config(grid.model)  # raises: unknown config, with the names
    if config is not None:
        most = config.max_positions - grid.steps
        if max(grid.ctx) > most:
            raise ValueError(f"{option('ctx')} {max(grid.ctx)}: {config.name} has "
                             f"{config.max_positions} positions, so ctx <= {most} with "
                             f"{grid.steps} decode steps")
        if layers and max(layers) >= config.num_layers:
            raise ValueError(f"{option('dense_layers')}: {config.name} has layers "
                             f"0..{config.num_layers - 1}, got {max(layers)}")


def timing_label(device: str, graph: bool) -> str:
    if device != "cuda":
        return "cpu-wall"
    return "graph" if graph else "events"


def expand_cases(grid: E2EGrid) -> list[dict[str, Any]]:
    """Returns one case per (ctx, batch, method); ``dense`` gives one per dense backend.

    Dense cases come first in each (ctx, batch) group: later cases report their speedup
    against the fastest of them.
    """
    backends = grid.dense_backends
    if backends is None:
        backends = decode_names() if grid.device == "cuda" else list(CPU_AUTO_DENSE)
    layers = ",".join(map(str, parse_layers(grid.dense_layers)))
    ordered = sorted(grid.methods, key=lambda m: m[0].name != "dense")
    cases = []
    for ctx in grid.ctx:
        for batch in grid.batch:
            common = {
                "model": grid.model, "weights": grid.weights, "batch": batch, "ctx": ctx,
                "decode_steps": grid.steps, "layout": grid.layout,
                "page_size": grid.page_size if grid.layout == "paged" else 0,
                "prefill": grid.prefill,
                "prefill_chunk": grid.prefill_chunk if grid.prefill == "dense" else 0,
                "dtype": grid.dtype, "seed": grid.seed, "device": grid.device,
                "rest": resolve_rest(grid.rest, torch.device(grid.device), batch=batch),
                "timing": timing_label(grid.device, grid.graph),
            }
            for method, overrides in ordered:
                resolved = method.resolve_params(overrides)
                head = {"kind": "e2e", "method": method.name, "family": method.family,
                        **resolved}
                if method.name == "dense":
                    cases += [{**head, "backend": name, **common, "dense_layers": ""}
                              for name in backends]
                else:
                    backend = backend_label(method, grid.device)
                    cases.append({**head, "backend": backend, **common, "dense_layers": layers})
    return cases


def case_command(case: dict[str, Any], registry: Registry = REGISTRY) -> str:
    """Returns the ``santa-bench e2e`` command line that runs exactly ``case``."""
    from santa_bench.units import format_size

    method = registry.get(case["method"])
    params = [f"{p.name}={case[p.name]}" for p in method.params if case.get(p.name) is not None]
    spec = method.name + (":" + ",".join(params) if params else "")
    source = "--config" if case["weights"] == "random" and named_config(case["model"]) else (
        "--model")
    args = ["santa-bench", "e2e", source, case["model"]]
    if source == "--model" and case["weights"] == "random":
        args.append("--random-weights")
    args += ["--ctx", format_size(int(case["ctx"])), "--batch", str(case["batch"]),
             "--methods", spec, "--steps", str(case["decode_steps"])]
    if case["method"] == "dense":
        args += ["--dense-backends", case["backend"]]
    args += ["--layout", case["layout"]]
    if case["layout"] == "paged":
        args += ["--page-size", str(case["page_size"])]
    if case.get("dense_layers"):
        args += ["--dense-layers", str(case["dense_layers"])]
    args += ["--prefill", case["prefill"]]
    if case["prefill"] == "dense":
        args += ["--prefill-chunk", str(case["prefill_chunk"])]
    args += ["--dtype", case["dtype"], "--seed", str(case["seed"]), "--device", case["device"]]
    if case.get("rest"):
        args += ["--rest", case["rest"]]
    if case["device"] == "cuda":
        args.append("--graph" if case["timing"] == "graph" else "--no-graph")
    return shlex.join(args)


def agreement(tokens: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    """Returns ``(overall, prefix)``: the fraction of equal tokens, and the mean fraction
    of each sequence's steps before its first divergence from ``reference``."""
    equal = tokens == reference
    overall = float(equal.float().mean())
    steps = equal.shape[1]
    first = torch.where(equal.all(1), steps, (~equal).float().argmax(1))
    return overall, float(first.float().mean() / steps)


def _row(metric: str, value: float, unit: str, status: str = "ok", reason: str = "",
         **extra: Any) -> dict[str, Any]:
    return {"metric": metric, "value": float(value), "unit": unit, "status": status,
            "reason": reason, **extra}


def skipped(reason: str) -> list[dict[str, Any]]:
    return [_row("step_ms_median", math.nan, "ms", status="skipped", reason=reason)]


@dataclass
class _Loaded:
    key: tuple
    model: Any
    tokenizer: Any = None


@dataclass
class E2ERunner:
    """Runs e2e cases, keeping the model and the prefilled session of the last group."""

    registry: Registry = REGISTRY
    dense_samples: dict[tuple, dict[str, list[float]]] = field(default_factory=dict)
    dense_tokens: dict[tuple, torch.Tensor] = field(default_factory=dict)
    _fresh_reference: set[tuple] = field(default_factory=set)
    _loaded: _Loaded | None = None
    _session_key: tuple | None = None
    _session: Any = None

    # ------------------------------------------------------------ resources
    def model(self, case: dict[str, Any]):
        """Returns the case's decoder (random on the device, or loaded real weights)."""
        from santa_bench.e2e.model import Decoder

        key = (case["model"], case["weights"], case["dtype"], case["device"], case["seed"])
        if self._loaded is not None and self._loaded.key == key:
            return self._loaded.model
        self._release(model=True)
        dtype, device = parse_dtype(case["dtype"]), case["device"]
        tokenizer = None
        if case["weights"] == "random":
            config = named_config(case["model"])
            if config is None:
                from transformers import AutoConfig

                config = from_hf_config(AutoConfig.from_pretrained(case["model"]), case["model"])
            self._check_memory(config, case)
            model = Decoder.random(config, device=device, dtype=dtype, seed=case["seed"])
        else:
            from santa_bench.accuracy.models import load_model

            hf, tokenizer = load_model(case["model"], dtype=str(dtype).split(".")[-1],
                                       device="cpu")
            config = from_hf_config(hf.config, case["model"])
            on_host = case["device"] != "cuda"  # the checkpoint is freed once converted
            self._check_memory(config, case, loaded=_module_bytes(hf) if on_host else 0)
            model = Decoder.from_hf(hf, device=device, dtype=dtype, name=case["model"])
            del hf
        self._loaded = _Loaded(key, model, tokenizer)
        return model

    def _check_memory(self, config: ModelConfig, case: dict[str, Any], loaded: int = 0) -> None:
        """Raises Unsupported when the case's group will not fit the memory available
        (the model held now, and ``loaded`` bytes about to be freed, count as available)."""
        from santa_bench.e2e.memory import MARGIN, available_bytes, estimate, size

        held = self._loaded.model.parameter_bytes() if self._loaded else 0
        free = available_bytes(case["device"]) + held + loaded
        need = estimate(config, case, parse_dtype(case["dtype"]).itemsize)
        if need.total + MARGIN > free:
            where = "device" if case["device"] == "cuda" else "host"
            raise Unsupported(f"needs {need.describe()} of {where} memory, {size(free)} "
                              "available")

    def session(self, case: dict[str, Any]):
        """Returns the prefilled session of the case's group (built on first use)."""
        from santa_bench.e2e.loop import DecodeSession
        from santa_bench.e2e.prompts import make_prompt

        key = tuple(case[k] for k in GROUP_KEYS if k not in ("rest", "timing"))
        if self._session_key == key:
            return self._session
        self._release(model=False)
        model = self.model(case)
        config = model.config
        if case["ctx"] + case["decode_steps"] > config.max_positions:
            raise InputError(f"ctx {case['ctx']} + {case['decode_steps']} steps exceeds "
                             f"{config.name}'s {config.max_positions} positions")
        self._check_memory(config, case)
        session = DecodeSession(model, batch=case["batch"], ctx=case["ctx"],
                                steps=case["decode_steps"], layout=case["layout"],
                                page_size=case["page_size"] or 16, seed=case["seed"])
        prompt = None
        if case["prefill"] == "dense":
            tokenizer = self._loaded.tokenizer if self._loaded else None
            prompt = make_prompt(case["batch"], case["ctx"], config.vocab, case["seed"],
                                 tokenizer)
        session.prefill(case["prefill"], prompt, chunk=case["prefill_chunk"] or 1024)
        self._session_key, self._session = key, session
        return session

    def _release(self, model: bool) -> None:
        self._session_key, self._session = None, None
        if model:
            self._loaded = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # ------------------------------------------------------------ store recall
    def recall(self, frame, fingerprint: str) -> None:
        """Loads finished dense results (samples, tokens) of this environment from the store."""
        needed = {"kind", "family", "metric", "status", "env_fingerprint", "samples_ms",
                  *GROUP_KEYS}
        if frame.empty or not needed <= set(frame.columns):
            return
        rows = frame[(frame.kind == "e2e") & (frame.family == "dense")
                     & (frame.metric == "step_ms_median") & (frame.status == "ok")
                     & (frame.env_fingerprint == fingerprint) & frame.samples_ms.notna()]
        for record in rows.to_dict("records"):
            key = tuple(record[k] for k in GROUP_KEYS)
            self._remember_dense(key, record["backend"], json.loads(record["samples_ms"]))
            if isinstance(record.get("tokens"), str) and key not in self.dense_tokens:
                self.dense_tokens[key] = torch.tensor(json.loads(record["tokens"]))

    def _remember_dense(self, key: tuple, backend: str, samples: list[float]) -> None:
        """Records a dense backend's step samples (a re-run replaces the stored ones)."""
        self.dense_samples.setdefault(key, {})[backend] = list(samples)

    def best_dense(self, key: tuple) -> tuple[str, list[float]] | None:
        """Returns ``(backend, samples)`` of the fastest dense backend of a group."""
        import statistics

        runs = self.dense_samples.get(key)
        if not runs:
            return None
        name = min(runs, key=lambda n: statistics.median(runs[n]))
        return name, runs[name]

    # ------------------------------------------------------------ run
    def run(self, case: dict[str, Any]) -> list[dict[str, Any]]:
        """Returns the case's rows (one ``skipped`` row when it cannot run here)."""
        method = self.registry.get(case["method"])
        if case["device"] == "cuda" and not torch.cuda.is_available():
            return skipped("needs a CUDA device")
        try:
            session = self.session(case)
            attend = self._backend(case, method, session)
            session.prepare(attend)
        except Unsupported as exc:
            return skipped(str(exc))
        result = session.decode(attend, graph=case["timing"] == "graph",
                                rest=case.get("rest") or "torch")
        return self._rows(case, method, session, result)

    def _backend(self, case: dict[str, Any], method: Method, session) -> LayerRouting:
        scale = session.scale
        if method.name == "dense":
            return LayerRouting(dense_backend(case["backend"], scale))
        params = {p.name: case[p.name] for p in method.params if p.name in case}
        main = method_backend(method, params, device=case["device"], scale=scale,
                              seed=case["seed"])
        layers = parse_layers(case.get("dense_layers"))
        if layers and max(layers) >= session.model.config.num_layers:
            raise InputError(f"dense_layers: the model has layers "
                             f"0..{session.model.config.num_layers - 1}")
        exempt = dense_backend(exempt_backend(case["device"]), scale) if layers else None
        return LayerRouting(main, exempt, layers)

    def _rows(self, case, method, session, result) -> list[dict[str, Any]]:
        from santa_bench.timing import bootstrap_ratio_ci

        key = tuple(case[k] for k in GROUP_KEYS)
        median = result.step_ms_median
        extra: dict[str, Any] = {
            "samples_ms": json.dumps([round(s, 4) for s in result.step_ms]),
            "timing_mode": result.timing,
            "warmup_steps": result.warmup_steps,
        }
        if case.get("dense_layers"):
            extra["exempt_backend"] = exempt_backend(case["device"])
        real = case["weights"] == "real"
        if real:
            extra["tokens"] = json.dumps(result.tokens.tolist())
        attention = result.attention_ms_median
        rows = [
            _row("step_ms_median", median, "ms", **extra),
            _row("step_ms_p90", result.step_ms_p90, "ms"),
            _row("tokens_per_s", case["batch"] / (median / 1e3), "tok/s"),
            _row("attention_ms_median", attention, "ms"),
            _row("attention_share", attention / median, "ratio"),
        ]
        if method.name == "dense":
            self._remember_dense(key, case["backend"], result.step_ms)
        else:
            best = self.best_dense(key)
            if best is None:
                rows.append(_row("speedup_vs_best_dense", math.nan, "x", status="skipped",
                                 reason="no dense backend decoded this group in this run"))
            else:
                ratio, low, high = bootstrap_ratio_ci(best[1], result.step_ms)
                rows.append(_row("speedup_vs_best_dense", ratio, "x", ci_low=low, ci_high=high,
                                 best_dense=best[0]))
        if real:
            reference = self.dense_tokens.get(key)
            if method.name == "dense" and key not in self._fresh_reference:
                self.dense_tokens[key] = result.tokens  # this run's first dense: the reference
                self._fresh_reference.add(key)
            elif reference is None:
                reason = "no dense run of this group to compare tokens with"
                rows += [_row(m, math.nan, "ratio", status="skipped", reason=reason)
                         for m in ("token_agreement", "token_agreement_prefix")]
            else:
                overall, prefix = agreement(result.tokens, reference)
                rows += [_row("token_agreement", overall, "ratio"),
                         _row("token_agreement_prefix", prefix, "ratio")]
        return rows


def _module_bytes(module: Any) -> int:
    """Bytes of a torch module's parameters and buffers."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def exempt_backend(device: str) -> str:
    """The exact backend of ``--dense-layers`` layers: split-KV on a GPU, SDPA on a CPU."""
    return "triton-splitkv" if device == "cuda" else "sdpa"


def order_cases(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Returns ``cases`` with each e2e group contiguous (first-seen order) and its dense
    backends first, so a group is prefilled once; other cases keep their place in front."""
    others = [c for c in cases if c.get("kind") != "e2e"]
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for case in cases:
        if case.get("kind") == "e2e":
            groups.setdefault(tuple(case.get(k) for k in GROUP_KEYS), []).append(case)
    ordered = [c for group in groups.values()
               for c in sorted(group, key=lambda c: c.get("family") != "dense")]
    return others + ordered
