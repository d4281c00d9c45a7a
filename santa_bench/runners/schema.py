"""Each runner's case schema, declared once: the keys of its cases, their value kinds,
defaults and help. The suite keys and defaults (``santa_bench.sweep.RUNNERS``), the grids'
defaults (``KernelGrid``, ``FidelityGrid``, ``E2EGrid``) and the commands' option
defaults and help read it.

Kinds are the suite loader's: ``method``, ``budget`` (a size or a ``1%`` ratio),
``size`` (``4k``), ``int``, ``str``, ``bool``. A default of None has none to give (the
suite names the key, or the runner derives it, e.g. a capture file's attention shape).
Imports only the size formatting of ``santa_bench.units``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from santa_bench.units import format_size


@dataclass(frozen=True)
class CaseKey:
    """One case key: its name, value kind, default and help.

    ``fill``: a suite that omits the key gets the default in its combinations (False:
    the runner's grid fills it in, so that a method parameter of that name, as a dense
    baseline's ``page_size``, keeps its own default)."""

    name: str
    kind: str
    default: Any = None
    help: str = ""
    fill: bool = True


@dataclass(frozen=True)
class RunnerSchema:
    """A runner's case keys, its suite ``options`` and the ``derived`` keys its cases add."""

    name: str
    keys: tuple[CaseKey, ...]
    options: dict[str, type] = field(default_factory=dict)
    derived: tuple[str, ...] = ("kind", "family")

    def __getitem__(self, name: str) -> CaseKey:
        for key in self.keys:
            if key.name == name:
                return key
        raise KeyError(f"{self.name}: no case key {name!r}")

    def kinds(self) -> dict[str, str]:
        """Key -> value kind, in declaration order."""
        return {key.name: key.kind for key in self.keys}

    def suite_defaults(self) -> dict[str, Any]:
        """The defaults a suite's combinations get (a list default is swept)."""
        return {key.name: key.default for key in self.keys
                if key.default is not None and key.fill}

    def default(self, name: str) -> Any:
        return self[name].default

    def option_default(self, name: str) -> str:
        """The default as a command's comma-list option text: ``16,64,256``, ``4k``."""
        key = self[name]
        values = key.default if isinstance(key.default, list) else [key.default]
        text = format_size if key.kind == "size" else str
        return ",".join(text(v) for v in values)

    def help(self, name: str) -> str:
        return self[name].help


_METHOD = CaseKey("method", "method", help="Method spec (name:key=value, see `santa-bench list`).")
_SEED = "Seed of the inputs and of the samplers."

KERNEL = RunnerSchema(
    "kernel",
    (
        _METHOD,
        CaseKey("S", "budget", 128, "Sample budget(s) S for the sampling methods, comma list."),
        CaseKey("batch", "int", 1, "Batch size(s), comma list."),
        CaseKey("ctx", "size", 4096, "Context length(s), comma list; accepts 4k, 32k, 1m or "
                "integers (default: 4k; with --inputs, the captured length)."),
        CaseKey("heads", "int", None, "Query heads Hq (default: 32, Llama-3.1-8B; with "
                "--inputs, the file's)."),
        CaseKey("kv_heads", "int", None, "KV heads Hkv; Hq must be a multiple (default: 8; "
                "with --inputs, the file's)."),
        CaseKey("head_dim", "int", None, "Head dimension d (default: 128; with --inputs, the "
                "file's)."),
        CaseKey("dtype", "str", "bf16", "Storage dtype of Q/K/V: bf16, fp16 or fp32.",
                fill=False),
        CaseKey("layout", "str", "contiguous", "KV layout: contiguous (NHD) or paged.",
                fill=False),
        CaseKey("page_size", "size", 16, "Tokens per page for the paged layout.", fill=False),
        CaseKey("seed", "int", 0, _SEED, fill=False),
        CaseKey("device", "str", "auto", "auto (GPU when present), cpu or cuda."),
        CaseKey("graph", "bool", True, "GPU: time CUDA-graph replays (as a serving engine runs "
                "decode); --no-graph times eager calls with CUDA events.", fill=False),
        CaseKey("cold", "bool", True, "GPU: keep L2 cold by rotating copies of the inputs.",
                fill=False),
        CaseKey("inputs", "str", None, "A `santa-bench capture` file: time on a model's real "
                "q, K, V instead of Gaussian noise."),
    ),
    options={"cpu_budget": float, "gpu_budget_ms": float},
    derived=("kind", "family", "timing", "l2"),
)

FIDELITY = RunnerSchema(
    "fidelity",
    (
        _METHOD,
        CaseKey("S", "budget", [16, 64, 256], "Budgets S, comma list."),
        CaseKey("pattern", "str", None, "Attention pattern (uniform, peaked, needle, ...)."),
        CaseKey("batch", "int", 1, "Sequences per case."),
        CaseKey("ctx", "size", 2048, "Context length(s): 2k, 8k, ..."),
        CaseKey("heads", "int", 8, "Query heads."),
        CaseKey("kv_heads", "int", 2, "KV heads."),
        CaseKey("head_dim", "int", 64, "Head dimension."),
        CaseKey("seeds", "int", 32, "Independent draws per case (bias, spread)."),
        CaseKey("seed", "int", 0, "Seed of the synthetic inputs."),
    ),
)

ACCURACY = RunnerSchema(
    "accuracy",
    (
        _METHOD,
        CaseKey("S", "budget", None, "Sample budget S of the sampling methods."),
        CaseKey("model", "str", "smollm2-135m", "Catalog model, a local path or a hub id."),
        CaseKey("task", "str", None, "Task (mmlu, gsm8k, ruler-niah, longbench-v2, ...)."),
        CaseKey("ctx", "size", None, "Context length of the long-context tasks."),
        CaseKey("n", "int", 20, "Samples (a seeded shuffle of the task)."),
        CaseKey("seed", "int", 0, "Seed of the sample shuffle and the samplers."),
        CaseKey("dense_layers", "str", "", "Layers kept exact, comma list (e.g. 0,1)."),
        CaseKey("max_new_tokens", "int", 256, "Greedy tokens a GSM8K answer may take."),
        CaseKey("device", "str", "auto", "auto (GPU when present), cpu or cuda."),
        CaseKey("reference", "bool", False, "Run the methods' PyTorch references on the GPU."),
        CaseKey("batch", "int", 16, "Sequences decoded together."),
    ),
)

E2E = RunnerSchema(
    "e2e",
    (
        _METHOD,
        CaseKey("S", "budget", None, "Sample budget S of the sampling methods."),
        CaseKey("model", "str", "llama-3.1-8b", "Named shape or Hugging Face model."),
        CaseKey("weights", "str", "real", "real (a model's weights) or random."),
        CaseKey("ctx", "size", 32768, "Prompt length(s) per sequence, comma list: 8k,32k,128k."),
        CaseKey("batch", "int", 4, "Batch size(s), comma list: 1,4,8,16."),
        CaseKey("decode_steps", "int", 64, "Greedy decode steps per run (>= 2); the first 2 are "
                "untimed warm-up."),
        CaseKey("seed", "int", 0, "Seed of the weights, prompt, page order and samplers."),
        CaseKey("dtype", "str", "bf16", "Weights and KV cache dtype: bf16, fp16, fp32."),
        CaseKey("device", "str", "auto", "auto (GPU when present), cpu or cuda."),
        CaseKey("layout", "str", "contiguous", "KV cache layout: contiguous [B, N, Hkv, d], or "
                "paged (shuffled pages)."),
        CaseKey("page_size", "int", 16, "Tokens per page of the paged layout."),
        CaseKey("dense_layers", "str", "", "Layers kept exact under a sampled method."),
        CaseKey("dense_backends", "str", "auto", "Exact backends that 'dense' runs."),
        CaseKey("prefill", "str", "dense", "dense (chunked causal prefill) or random."),
        CaseKey("prefill_chunk", "int", 1024, "Prompt tokens per sequence per prefill chunk."),
        CaseKey("graph", "bool", True, "GPU: capture the decode step in a CUDA graph."),
        CaseKey("rest", "str", "auto", "The step outside attention: fused, gemm, torch or auto."),
    ),
    derived=("kind", "family", "backend", "timing"),
)

SCHEMAS = {schema.name: schema for schema in (KERNEL, FIDELITY, ACCURACY, E2E)}
