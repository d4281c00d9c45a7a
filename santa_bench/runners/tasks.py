"""The task runner: accuracy of a real model on a task, decode steps through a method.

A case is (task, model, method and its parameters, n samples, seed; ctx for the
long-context tasks: RULER, LongBench v2, HELMET-RAG). Rows: the task
``score`` with a Wilson 95% interval, the mean KV read fraction of the decode calls,
and, for a method other than dense, its ``retention`` (score / dense score on the same
samples in the same run) with a paired bootstrap interval. Per-sample correctness is
stored (``per_sample``, JSON) so retention survives a resumed run.

The cases that share their prompts (one :func:`group_key`: task, model, ctx, n, seed,
generation length, device, data) run as one group (:meth:`TaskRunner.run_group`): each
batch of prompts is prefilled once and decoded by every case's method before the next
batch. Each case still has its own rows, plus time rows: the group's ``prefill_s``,
``prefill_tokens``, ``prefills`` (prompts prefilled, not taken from the store) and
``prefill_tokens_per_s``, shared by its cases, and the method's own ``decode_s`` and
``decode_tokens_per_s``.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from santa_bench import plugins
from santa_bench.accuracy.longcontext import HELMET_DATASETS as _HELMET
from santa_bench.accuracy.models import CATALOG
from santa_bench.accuracy.registry import TASKS, Task
from santa_bench.accuracy.ruler import RULER_GROUPS
from santa_bench.methods import REGISTRY, Registry
from santa_kernels.validate import InputError

DEFAULT_BATCH = 16  # sequences decoded together (``--batch``; not part of a case)

PAIR_KEYS = ("task", "model", "n", "seed", "dense_layers", "max_new_tokens")
GROUP_KEYS = ("task", "model", "ctx", "n", "seed", "max_new_tokens", "device", "_batch",
              "_data_dir", "_data_file", "_demo_file")
HELMET_PREFIX = "helmet-rag-"  # helmet-rag-<dataset>: nq, triviaqa, hotpotqa, popqa
HELMET_DATASETS = tuple(_HELMET)
RULER_PREFIX = "ruler-"  # ruler-<task>: RULER task <task> at the case's ctx


def expand_task_names(task: str) -> list[str]:
    """Returns the concrete tasks of ``task``: ``ruler-niah`` -> the eight ``ruler-niah_*``,
    ``helmet-rag`` -> ``helmet-rag-{nq,triviaqa,hotpotqa,popqa}`` (the registry's
    groups); others unchanged."""
    return TASKS.expand(task)


def protocol_columns(case: dict[str, Any]) -> dict[str, str]:
    """What every row of an accuracy case says of its protocol: the task's prompt, chat
    template, generation budget and scoring, and which layers decode through the method."""
    dense = str(case.get("dense_layers") or "")
    return {"protocol": get_task(case["task"]).protocol,
            "sampled_layers": f"all but {dense} (dense)" if dense else "all"}


def get_task(task: str) -> Task:
    """The registered task ``task`` (or an alias of one); ValueError naming what is known."""
    found = TASKS.find(task)
    if found is not None:
        return found
    known = TASKS.names()
    if task.startswith(RULER_PREFIX):
        from santa_bench.accuracy.ruler import RULER_TASKS

        raise ValueError(
            f"task {task!r}: unknown RULER task; known: {', '.join(RULER_TASKS)} "
            f"(and {', '.join(RULER_GROUPS)}, expanded by expand_task_names)"
        )
    if task.startswith(HELMET_PREFIX):
        raise ValueError(f"task {task!r}: unknown HELMET-RAG dataset; known: "
                         f"{tuple(HELMET_DATASETS)}")
    short = [n for n in known if not n.startswith((RULER_PREFIX, HELMET_PREFIX))]
    raise ValueError(
        f"task: expected one of {', '.join(short)}, helmet-rag(-<dataset>) or "
        f"ruler-<task>, got {task!r}"
    )


def _long_context(task: str) -> bool:
    """Tasks whose samples are made at the case's ``ctx``."""
    found = TASKS.find(task)
    return found is not None and found.long_context


def _pair_key(record: dict[str, Any]) -> tuple:
    """Dense/method pairing key; long-context cases also pair on their context length."""
    key = tuple(record.get(k) for k in PAIR_KEYS)
    if _long_context(str(record.get("task", ""))):
        key += (int(record["ctx"]),)
    return key


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Returns the Wilson score interval of a proportion."""
    if n == 0:
        return math.nan, math.nan
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


class TaskRunner:
    """Runs accuracy cases; keeps one model loaded and the dense results per sample set."""

    def __init__(self, registry: Registry = REGISTRY) -> None:
        self.registry = registry
        self._model_name: str | None = None
        self._model: Any = None
        self.dense: dict[tuple, list[bool]] = {}
        self._samples: tuple[tuple, list] | None = None  # the last sample set
        self._prompts: tuple[tuple, list] | None = None  # its token ids
        self.prefills: Any = None  # the engine's PrefillStore (or a PrefillCache)
        self._engine: tuple | None = None  # ((model, device), Engine | None, why)
        self.on_samples: Any = None  # progress: called with each batch's sample count

    def model(self, name: str):
        if name != self._model_name:
            from santa_bench.accuracy.models import load_model

            self._model, self._model_name = load_model(name), name
            self._engine = None
        return self._model

    def samples(self, case: dict[str, Any]) -> list:
        """The case's samples; the methods of one task share them (made once)."""
        key = tuple(str(case.get(k)) for k in ("task", "model", "ctx", "n", "seed", "_data_dir"))
        if self._samples is None or self._samples[0] != key:
            self._samples = (key, self._make_samples(case))
        return self._samples[1]

    def prompts(self, case: dict[str, Any], tokenizer: Any, items: list) -> list:
        """The prompts of ``items`` (the sample set :meth:`samples` last returned) as token
        ids; the methods of one task share them (tokenized once: 50 RULER prompts at 32k
        take seconds)."""
        from santa_bench.accuracy.tasks import task_prompts

        max_new = int(case.get("max_new_tokens") or 256)
        key = (self._samples[0] if self._samples is not None else None, max_new)
        if self._prompts is None or self._prompts[0] != key:
            self._prompts = (key, task_prompts(case["task"], tokenizer, items, max_new))
        return self._prompts[1]

    def _make_samples(self, case: dict[str, Any]) -> list:
        def tokenizer() -> Any:
            return self.model(case["model"])[1]

        return get_task(case["task"]).samples(case, tokenizer)

    def recall(self, frame, fingerprint: str) -> None:
        """Loads stored dense per-sample results (for resumed runs)."""
        if frame.empty or "per_sample" not in frame.columns:
            return
        rows = frame[
            (frame.metric == "score")
            & (frame.method == "dense")
            & (frame.env_fingerprint == fingerprint)
            & frame.per_sample.notna()
        ]
        for record in rows.to_dict("records"):
            self.dense[_pair_key(record)] = json.loads(record["per_sample"])

    def engine(self, name: str, device: str, batch: int):
        """The decode engine of model ``name`` on ``device`` (None: the model's family is
        not one the suite's decoder runs; CPU runs then go through transformers)."""
        from santa_bench.accuracy.engine import Engine
        from santa_bench.accuracy.tasks import PrefillCache

        model, _ = self.model(name)
        key = (name, device)
        if self._engine is None or self._engine[0] != key:
            self._engine = None
            try:
                engine = Engine(model, device=device, batch=batch, name=name)
            except InputError as exc:
                if device == "cuda":
                    raise
                self._engine = (key, None, str(exc))
            else:
                self._engine = (key, engine, "")
            self.prefills = self._engine[1].prefills if self._engine[1] else PrefillCache()
        engine = self._engine[1]
        if engine is not None:
            engine.batch = batch
        return engine

    def run(self, case: dict[str, Any]) -> list[dict[str, Any]]:
        """The rows of one case (a group of one: :meth:`run_group`); raises its error.
        Cases run one by one keep their prefills for the next case of the same prompts."""
        found = self.run_group([case], keep_prefills=True)[0]
        if isinstance(found, BaseException):
            raise found
        return found

    def run_group(self, cases: list[dict[str, Any]], keep_prefills: bool = False,
                  ) -> list[list[dict[str, Any]] | Exception]:
        """The rows of cases that share their prompts (one :func:`group_key`), or the
        error of each case that failed: the prompts are loaded once and each batch is
        prefilled once, then decoded by every case's method (dense first, for retention).
        ``keep_prefills``: also keep each prompt's K/V in the engine's store (:meth:`run`'s
        cases, run one by one; a group's one cache serves all its methods)."""
        from santa_bench.accuracy.engine import Decoding, resolve_backend
        from santa_bench.accuracy.tasks import task_scores

        if len({group_key(c) for c in cases}) > 1:
            raise ValueError("run_group: the cases do not share their prompts")
        found: list[list[dict[str, Any]] | Exception | None] = [None] * len(cases)
        runs: dict[int, Decoding] = {}
        for slot, case in enumerate(cases):
            try:
                method = self.registry.get(case["method"])
                params = {p.name: case[p.name] for p in method.params if p.name in case}
                layers = tuple(int(x) for x in str(case.get("dense_layers") or "").split(",")
                               if x)
                backend = case.get("backend") or resolve_backend(method, case.get("device",
                                                                                  "cpu"))
                runs[slot] = Decoding(method, params, seed=case["seed"], dense_layers=layers,
                                      backend="sdpa" if method.name == "dense" else backend)
            except Exception as exc:  # this case's error: the others go on
                found[slot] = exc
        if not runs:
            return found  # type: ignore[return-value]
        first = cases[next(iter(runs))]
        try:
            items = self.samples(first)  # first: missing data fails before a model loads
            device = first.get("device", "cpu")
            started = time.perf_counter()
            engine = self.engine(first["model"], device,
                                 int(first.get("_batch") or DEFAULT_BATCH))
            model, tokenizer = self.model(first["model"])
            count = int(model.config.num_hidden_layers)
            for slot, run in list(runs.items()):
                try:  # a model named by path or hub id: its layers are known once loaded
                    if run.dense_layers:
                        check_dense_layers(run.dense_layers, count, first["model"])
                except ValueError as exc:
                    found[slot] = exc
                    del runs[slot]
            task = get_task(first["task"])
            if engine is None:  # a model family the suite's decoder does not run
                for slot, run in runs.items():
                    try:
                        correct, reads = self._run_hf(cases[slot], task, run.method,
                                                      run.params, items, run.dense_layers)
                        found[slot] = self._rows(cases[slot], correct, reads, [])
                    except Exception as exc:  # this case's error: the others go on
                        found[slot] = exc
                return found  # type: ignore[return-value]
            prompts = self.prompts(first, tokenizer, items)
            slots = list(runs)
            generated = engine.generate_many(
                [Decoding(r.method, r.method.resolve_params(r.params), r.seed,
                          r.dense_layers, r.backend) for r in runs.values()],
                prompts, keep_logits=task.keep_logits, on_batch=self._advance,
                keep_prefills=keep_prefills)
        except Exception as exc:  # the group's error (data, model, prefill): every case's
            return [exc if f is None else f for f in found]
        wall = time.perf_counter() - started
        pairs = sorted(zip(slots, generated, strict=True),  # dense first: retention
                       key=lambda pair: cases[pair[0]]["method"] != "dense")
        for slot, generation in pairs:
            if isinstance(generation, Exception):
                found[slot] = generation
                continue
            try:
                correct, _ = task_scores(first["task"], tokenizer, items, generation)
                found[slot] = self._rows(cases[slot], correct, generation.kv_read_fraction,
                                         speed_rows(generation, wall))
            except Exception as exc:  # this case's error: the others go on
                found[slot] = exc
        return found  # type: ignore[return-value]

    def _rows(self, case: dict[str, Any], correct: list, reads: list[float],
              extra: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A case's rows: score, read fraction, ``extra``, and retention against dense."""
        from santa_bench.accuracy.tasks import retention_ci

        n = len(correct)
        low, high = wilson(round(sum(correct)), n)
        rows = [
            {
                "metric": "score",
                "value": sum(correct) / n,
                "unit": "ratio",
                "ci_low": low,
                "ci_high": high,
                "per_sample": json.dumps([c if isinstance(c, float) else int(c) for c in correct]),
            },
            {
                "metric": "decode_kv_read_fraction",
                "value": sum(reads) / len(reads) if reads else 1.0,
                "unit": "ratio",
            },
            *extra,
        ]
        key = _pair_key(case)
        if case["method"] == "dense":
            self.dense[key] = [c if isinstance(c, float) else bool(c) for c in correct]
        elif key in self.dense:
            ratio, low, high = retention_ci(correct, self.dense[key], seed=case["seed"])
            rows.append(
                {
                    "metric": "retention",
                    "value": ratio,
                    "unit": "ratio",
                    "ci_low": low,
                    "ci_high": high,
                }
            )
        else:
            rows.append(
                {
                    "metric": "retention",
                    "value": math.nan,
                    "unit": "ratio",
                    "status": "skipped",
                    "reason": "no dense run on the same samples",
                }
            )
        return [{**row, **protocol_columns(case)} for row in rows]

    def _advance(self, count: int) -> None:
        if self.on_samples is not None:
            self.on_samples(count)

    def _run_hf(self, case, task, method, params, items, layers) -> tuple[list, list]:
        """The case through transformers' own decode loop (``accuracy.integration``):
        CPU runs of model families the suite's decoder does not run."""
        from santa_bench.accuracy.integration import use_method
        from santa_bench.accuracy.tasks import hf_task_scores

        model, tokenizer = self.model(case["model"])
        spec = method.name + (
            ":" + ",".join(f"{k}={v}" for k, v in params.items()) if params else ""
        )
        info = use_method(model, spec, seed=case["seed"], dense_layers=layers)
        if task.hf_scores is not None:
            correct = task.hf_scores(model, tokenizer, items, case, self.prefills)
        else:
            correct = hf_task_scores(task, model, tokenizer, items, case, self.prefills)
        return correct, info["kv_read_fraction"]


def group_key(case: dict[str, Any]) -> tuple:
    """The keys that fix an accuracy case's prompts (and the batches they are decoded in):
    cases with one key are run together, each batch prefilled once (see
    :meth:`TaskRunner.run_group`)."""
    return tuple(str(case.get(k)) for k in GROUP_KEYS)


def speed_rows(generation: Any, wall_s: float) -> list[dict[str, Any]]:
    """A case's time rows: the group's wall and prefill (shared by its methods), the
    method's own decode; throughputs where their time is > 0 (a prefill taken from the
    store has none)."""
    tokens = sum(len(t) for t in generation.tokens)
    rows = [
        {"metric": "wall_s", "value": wall_s, "unit": "s"},
        {"metric": "prefill_s", "value": generation.prefill_s, "unit": "s"},
        {"metric": "decode_s", "value": generation.decode_s, "unit": "s"},
        {"metric": "decode_steps", "value": float(generation.decode_steps), "unit": "count"},
        {"metric": "generated_tokens", "value": float(tokens), "unit": "count"},
        {"metric": "prefills", "value": float(generation.prefills), "unit": "count"},
        {"metric": "prefill_tokens", "value": float(generation.prefill_tokens),
         "unit": "count"},
    ]
    if generation.prefill_tokens and generation.prefill_s > 0:
        rows.append({"metric": "prefill_tokens_per_s", "unit": "tok/s",
                     "value": generation.prefill_tokens / generation.prefill_s})
    if tokens and generation.decode_s > 0:
        rows.append({"metric": "decode_tokens_per_s", "unit": "tok/s",
                     "value": tokens / generation.decode_s})
    return rows


def parse_dense_layers(text: str | None) -> tuple[int, ...]:
    """The layer indices of ``--dense-layers`` (``"0,1"``); ValueError naming the option."""
    items = [item.strip() for item in str(text or "").split(",") if item.strip()]
    if bad := [item for item in items if not item.isdigit()]:
        raise ValueError(f"--dense-layers: expected layer indices like 0,1, got {bad[0]!r}")
    return tuple(int(item) for item in items)


def check_dense_layers(layers: tuple[int, ...], count: int, model: str) -> None:
    """ValueError when a layer kept exact is not one of the model's ``count`` layers."""
    if layers and max(layers) >= count:
        raise ValueError(f"--dense-layers: {model} has layers 0..{count - 1}, "
                         f"got {max(layers)}")


def task_case(
    task: str,
    model: str,
    method,
    overrides: dict[str, Any],
    *,
    n: int,
    seed: int,
    dense_layers: str = "",
    max_new_tokens: int = 256,
    ctx: int | None = None,
    data_dir: str | None = None,
    data_file: str | None = None,
    demo_file: str | None = None,
    device: str = "auto",
    reference: bool = False,
    batch: int | None = None,
) -> dict[str, Any]:
    """Returns the accuracy case of one method (the same dict for the CLI and suites).

    ``data_dir``, ``data_file`` (a local JSONL/JSON/Parquet/CSV file of the task) and
    ``demo_file`` (HELMET-RAG demonstrations) say where the data is: not case keys.
    ``device`` (auto: CUDA when present) and ``backend`` (the method's Triton kernel on
    CUDA, its PyTorch reference on a CPU or with ``reference``) are case keys; ``batch``
    (sequences decoded together) is not.
    """
    from santa_bench.accuracy.engine import resolve_backend, resolve_device

    found = get_task(task)
    if found.long_context and (ctx is None or ctx <= 0):
        raise ValueError(f"task {task!r}: needs a context length ctx > 0")
    if n <= 0:
        raise ValueError(f"n: must be > 0, got {n}")
    if task == "gsm8k" and max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens: must be > 0, got {max_new_tokens}")
    layers = parse_dense_layers(dense_layers)
    if model in CATALOG:  # a catalog model's layers are known without loading it
        check_dense_layers(layers, CATALOG[model].layers, model)
    case = {
        "kind": "accuracy",
        "task": task,
        "model": model,
        "method": method.name,
        "family": method.family,
        **method.resolve_params(overrides),
        "n": n,
        "seed": seed,
        "dense_layers": dense_layers,
        "device": resolve_device(device),
        "max_new_tokens": max_new_tokens if found.generates else 0,
    }
    case["backend"] = resolve_backend(method, case["device"], reference)
    if batch is not None:
        if batch <= 0:
            raise ValueError(f"batch: must be > 0, got {batch}")
        case["_batch"] = int(batch)
    if ctx is not None:
        case["ctx"] = ctx
    if data_dir:
        case["_data_dir"] = str(data_dir)  # where the data is: not part of the case
    if data_file:
        case["_data_file"] = str(data_file)
    if demo_file:
        case["_demo_file"] = str(demo_file)
    return case


def expand_task_cases(
    task: str,
    model: str,
    methods: list,
    *,
    n: int,
    seed: int,
    dense_layers: str = "",
    max_new_tokens: int = 256,
    data_dir: str | None = None,
    ctx: int | None = None,
    data_file: str | None = None,
    demo_file: str | None = None,
    device: str = "auto",
    reference: bool = False,
    batch: int | None = None,
) -> list[dict[str, Any]]:
    """Returns one accuracy case per method (per concrete task of a group such as
    ``ruler-niah``); dense first, so retention can be computed."""
    ordered = sorted(methods, key=lambda m: m[0].name != "dense")
    if ordered[0][0].name != "dense":
        ordered.insert(0, (REGISTRY.get("dense"), {}))  # the same run always includes dense
    return [
        task_case(
            concrete,
            model,
            method,
            overrides,
            n=n,
            seed=seed,
            dense_layers=dense_layers,
            max_new_tokens=max_new_tokens,
            ctx=ctx,
            data_dir=data_dir,
            data_file=data_file,
            demo_file=demo_file,
            device=device,
            reference=reference,
            batch=batch,
        )
        for concrete in expand_task_names(task)
        for method, overrides in ordered
    ]


def case_command(case: dict[str, Any], registry: Registry = REGISTRY) -> str:
    """Returns the ``santa-bench accuracy <task>`` command line that runs exactly ``case``."""
    import shlex

    method = registry.get(case["method"])
    params = [f"{p.name}={case[p.name]}" for p in method.params if case.get(p.name) is not None]
    spec = method.name + (":" + ",".join(params) if params else "")
    task = get_task(case["task"])
    plugin = plugins.plugin_args((method.module, task.module))
    args = [
        "santa-bench",
        *plugin,
        *task.command_args(case),
        "--model",
        case["model"],
        "--methods",
        spec,
        "--n",
        str(case["n"]),
        "--seed",
        str(case["seed"]),
    ]
    if case.get("dense_layers"):
        args += ["--dense-layers", str(case["dense_layers"])]
    args += ["--device", str(case.get("device", "cpu"))]
    if case.get("backend") == "reference" and case.get("device") == "cuda":
        args.append("--reference")
    if case.get("_batch"):
        args += ["--batch", str(case["_batch"])]
    if task.generates:
        args += ["--max-new-tokens", str(case["max_new_tokens"])]
    for key, flag in (("_data_dir", "--data-dir"), ("_data_file", "--file")):
        if case.get(key):
            args += [flag, case[key]]
    if case.get("_demo_file"):
        args += ["--demo-file", case["_demo_file"]]
    return shlex.join(args)
