"""The accuracy runs' batched decode engine: devices, backends, batching, failures."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported

import pytest
import torch

from conftest import ModTok, tiny_llama
from santa_bench.accuracy.engine import (
    Engine,
    Prompt,
    prompt_seed,
    resolve_backend,
    resolve_device,
)
from santa_bench.methods import REGISTRY
from santa_kernels.validate import InputError

pytest.importorskip("transformers")


def _interpreted() -> bool:
    from santa_kernels import triton_santa as ts

    return type(ts._score_pass_kernel).__name__ == "InterpretedFunction"


def prompts(count: int = 5, seed: int = 1) -> list[Prompt]:
    gen = torch.Generator().manual_seed(seed)
    lengths = [40, 57, 33, 64, 48, 71, 36][:count]
    return [Prompt(tuple(torch.randint(0, 90, (n,), generator=gen).tolist()), 6)
            for n in lengths]


def test_device_selection(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu" and resolve_device(None) == "cpu"
    assert resolve_device("CPU") == "cpu"
    with pytest.raises(InputError, match="no CUDA device"):
        resolve_device("cuda")
    with pytest.raises(InputError, match="--device: expected auto, cpu or cuda"):
        resolve_device("tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda" and resolve_device("cuda") == "cuda"
    prop, dense = REGISTRY.get("santa-prop"), REGISTRY.get("dense")
    assert resolve_backend(prop, "cuda") == "triton"
    assert resolve_backend(prop, "cuda", reference=True) == "reference"
    assert resolve_backend(prop, "cpu") == "reference"
    assert resolve_backend(dense, "cuda") == "sdpa"
    assert resolve_backend(REGISTRY.get("santapp"), "cuda") == "triton"
    assert resolve_backend(REGISTRY.get("bernoulli"), "cuda") == "triton"
    assert resolve_backend(REGISTRY.get("magicpig"), "cuda") == "reference"  # no kernel


def test_cases_record_device_and_backend(monkeypatch):
    from santa_bench.runners.tasks import case_command, task_case

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    case = task_case("ruler-vt", "m", REGISTRY.get("santa-prop"), {}, n=2, seed=0, ctx=4096,
                     batch=4)
    assert case["device"] == "cpu" and case["backend"] == "reference"
    assert case["_batch"] == 4  # not a case key: it changes no result on a CPU
    assert "--device cpu" in case_command(case) and "--batch 4" in case_command(case)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu = task_case("ruler-vt", "m", REGISTRY.get("santa-prop"), {}, n=2, seed=0, ctx=4096)
    ref = task_case("ruler-vt", "m", REGISTRY.get("santa-prop"), {}, n=2, seed=0, ctx=4096,
                    reference=True)
    assert (gpu["device"], gpu["backend"], ref["backend"]) == ("cuda", "triton", "reference")
    assert case_command(ref).endswith("--device cuda --reference")
    with pytest.raises(ValueError, match="batch"):
        task_case("ruler-vt", "m", REGISTRY.get("dense"), {}, n=2, seed=0, ctx=64, batch=0)


def test_dense_decode_matches_the_models_own_greedy_generation():
    model = tiny_llama()
    engine = Engine(model, device="cpu", batch=2)
    batch = prompts(3)
    out = engine.generate(REGISTRY.get("dense"), {}, batch, seed=0)
    for prompt, tokens in zip(batch, out.tokens, strict=True):
        ids = torch.tensor([prompt.ids])
        expected = model.generate(ids, max_new_tokens=prompt.max_new_tokens, do_sample=False,
                                  eos_token_id=96, pad_token_id=96)[0, len(prompt.ids):]
        assert tokens == expected.tolist()[: len(tokens)] and len(tokens) >= 1


@pytest.mark.parametrize("spec", ["dense", "santa-sys:S=8", "santa-prop:S=8",
                                  "santapp:M=2,team_size=8,sink=0,window=0",
                                  "santapp:M=2,team_size=8,sink=0,window=0,draw=head",
                                  "magicpig:K=3,L=6,sink=2,window=4"])
def test_batched_decode_gives_the_tokens_of_one_sample_at_a_time(spec):
    from santa_bench.methods import parse_method_specs

    (method, overrides), = parse_method_specs(spec)
    params = method.resolve_params(overrides)
    model = tiny_llama()
    batch = prompts(5)
    run = {"seed": 3, "reference": True}
    together = Engine(model, device="cpu", batch=5).generate(method, params, batch, **run)
    alone = Engine(model, device="cpu", batch=1).generate(method, params, batch, **run)
    assert together.tokens == alone.tokens
    other_seed = Engine(model, device="cpu", batch=5).generate(method, params, batch, seed=4,
                                                                reference=True)
    if method.name != "dense":  # the seed reaches the sampler
        assert other_seed.tokens != together.tokens
        assert all(0 < f <= 1 for f in together.kv_read_fraction)
        assert len(together.kv_read_fraction) > 0


def test_prefills_are_shared_between_methods_and_steps_stop_at_stop_tokens():
    model = tiny_llama()
    engine = Engine(model, device="cpu", batch=2)
    batch = prompts(4)
    engine.generate(REGISTRY.get("dense"), {}, batch)
    assert (engine.prefills.misses, engine.prefills.hits) == (4, 0)
    engine.generate(REGISTRY.get("santa-sys"), {"S": 8}, batch, reference=True)
    assert (engine.prefills.misses, engine.prefills.hits) == (4, 4)
    free = engine.generate(REGISTRY.get("dense"), {}, [batch[0]])
    first = free.tokens[0][0]
    stopped = engine.generate(REGISTRY.get("dense"), {},
                              [Prompt(batch[0].ids, 6, stops=(first,))])
    assert stopped.tokens[0] == [first]
    assert prompt_seed(batch[0].ids) == prompt_seed(list(batch[0].ids))


def test_logits_of_the_first_step_and_bad_prompts():
    model = tiny_llama()
    engine = Engine(model, device="cpu", batch=3)
    batch = [Prompt(p.ids, 1) for p in prompts(3)]
    out = engine.generate(REGISTRY.get("dense"), {}, batch, keep_logits=True)
    assert out.first_logits is not None and out.first_logits.shape == (3, 97)
    for prompt, row in zip(batch, out.first_logits, strict=True):
        with torch.no_grad():
            expected = model(torch.tensor([prompt.ids])).logits[0, -1]
        assert torch.allclose(row, expected, atol=1e-4)
    with pytest.raises(InputError, match="positions"):
        engine.generate(REGISTRY.get("dense"), {}, [Prompt(tuple(range(510)), 8)])
    with pytest.raises(InputError, match="--batch"):
        Engine(model, device="cpu", batch=0)


def test_kernel_backend_through_the_interpreter(monkeypatch):
    """The GPU path's code (Triton kernels in every layer) on the CPU interpreter."""
    if not _interpreted():
        pytest.skip("the Triton kernels were imported without TRITON_INTERPRET=1")
    model = tiny_llama(layers=1)
    method = REGISTRY.get("santa-prop")
    engine = Engine(model, device="cpu", batch=2)
    batch = [Prompt(p.ids, 3) for p in prompts(2)]
    out = engine.generate(method, method.resolve_params({"S": 16}), batch, seed=0,
                          backend="triton")
    assert all(1 <= len(t) <= 3 for t in out.tokens)
    assert out.kv_read_fraction and all(0 < f <= 1 for f in out.kv_read_fraction)
    dense = engine.generate(REGISTRY.get("dense"), {}, batch)
    assert len(dense.tokens) == 2


def test_e2e_santa_flash_runs_the_kernel_its_row_records(monkeypatch):
    """The decode backend of santa-flash (end-to-end and accuracy runs) calls the function
    the kernel harness times and names in its rows, ``triton_santa_flash.santa_flash``,
    on a workspace split by that kernel's rule; any other kernel fails here."""
    import santa_kernels.triton_santa_flash as tsf
    from santa_bench.e2e.cache import StaticKVCache
    from santa_bench.methods.santa import TritonSampledDecode, kernel_function, santa_prepare

    if not _interpreted():
        pytest.skip("the Triton kernels were imported without TRITON_INTERPRET=1")
    ran = []
    real = tsf.santa_flash
    assert kernel_function(real) == "triton_santa_flash.santa_flash"

    def spy(*args, **kw):
        ran.append(kw["workspace"])
        return real(*args, **kw)

    monkeypatch.setattr(tsf, "santa_flash", spy)
    method = REGISTRY.get("santa-flash")
    params = method.resolve_params({"S": 32, "tile": 16})
    cache = StaticKVCache(num_layers=1, batch=1, capacity=256, num_kv_heads=2, head_dim=16,
                          dtype=torch.float32, device="cpu")
    cache.set_lengths(200)
    q = torch.randn(1, 4, 16, generator=torch.Generator().manual_seed(0))
    backend = TritonSampledDecode(method, params, 0.25, 0)
    backend.setup(cache, q)
    out = backend(0, q)
    assert ran == [backend.workspace] and torch.isfinite(out).all()
    harness = santa_prepare("santa_flash")(q, cache.layers[0], seed=0, **params)
    assert backend.kernel_function == harness.kernel_function == "test_engine.spy"
    assert backend.workspace.num_splits == tsf.flash_workspace(q, cache.layers[0], 32,
                                                               16).num_splits


def test_a_failing_method_gives_a_failed_row_and_the_run_goes_on(tmp_path, monkeypatch):
    from santa_bench import environment, execute, results
    from santa_bench.accuracy import models
    from santa_bench.methods import Method
    from santa_bench.runners.tasks import expand_task_cases

    model = tiny_llama()
    monkeypatch.setattr(models, "load_model", lambda name, **kw: (model, ModTok(keep=60)))
    original = Method.run_reference

    def broken(self, *args, **kwargs):
        if self.name == "santa-sys":
            raise RuntimeError("boom")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Method, "run_reference", broken)
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text(
        '{"question": "1+1?", "answer": "so #### 2"}\n{"question": "2+2?", "answer": "#### 4"}\n')
    methods = [(REGISTRY.get(n), {"S": 8}) for n in ("santa-sys", "santa-prop")]
    cases = expand_task_cases("gsm8k", "tiny", methods, n=2, seed=0, max_new_tokens=3,
                              data_dir=str(tmp_path), device="cpu")
    outcome = execute.run_cases(cases, results.ResultStore(tmp_path / "res"),
                                environment.collect_environment("test"))
    by_method = {case["method"]: rows for case, rows in outcome.results}
    assert by_method["santa-sys"][0]["status"] == "failed"
    assert "boom" in by_method["santa-sys"][0]["reason"]
    prop = {r["metric"]: r for r in by_method["santa-prop"]}
    assert prop["score"].get("status", "ok") == "ok" and "retention" in prop
    assert {r["metric"] for r in by_method["dense"]} >= {"score", "wall_s", "decode_steps"}


def test_the_progress_bar_counts_samples_times_methods():
    from rich.console import Console

    from santa_bench.execute import _Progress, case_weight

    cases = [{"kind": "accuracy", "n": 50, "method": "dense"},
             {"kind": "accuracy", "n": 50, "method": "santa-prop"},
             {"kind": "kernel", "method": "dense"}]
    assert [case_weight(c) for c in cases] == [50, 50, 1]
    with _Progress(Console(file=open(os.devnull, "w")), 101, "t", weighted=True) as progress:
        progress.start("local", cases[0])
        progress.samples("local", 25)
        task = progress.progress.tasks[0]
        assert task.completed == 25 and task.total == 101
        progress.samples("local", 40)  # never past the case's own samples
        assert task.completed == 50
        progress.done("local", [])
        progress.start("local", cases[1])
        progress.done("local", [])  # a case that fails at once advances by all its samples
        assert task.completed == 100


def test_the_accuracy_table_script_reads_a_store(tmp_path):
    from conftest import load_script
    from santa_bench import results

    module = load_script("accuracy_table")
    store = results.ResultStore(tmp_path)
    run = store.start_run({"command": "t"}, run_id="r")
    base = {"kind": "accuracy", "task": "ruler-vt", "model": "m", "n": 2, "seed": 0,
            "family": "santa", "ctx": 64, "device": "cuda", "backend": "triton"}
    for method, params, score in (("dense", {}, 1.0), ("santa-prop", {"S": 128}, 0.5)):
        case = {**base, "method": method, **REGISTRY.get(method).resolve_params(params)}
        rows = [{"metric": "score", "value": score, "unit": "ratio", "ci_low": 0.1,
                 "ci_high": 0.9},
                {"metric": "decode_kv_read_fraction", "value": 0.5, "unit": "ratio"}]
        if method != "dense":
            rows.append({"metric": "retention", "value": 0.5, "unit": "ratio",
                         "ci_low": 0.2, "ci_high": 0.8})
        run.write_case(case, rows, command="c")
    layered = {**base, "method": "santa-prop", "dense_layers": "0,1",
               **REGISTRY.get("santa-prop").resolve_params({"S": 128})}
    run.write_case(layered, [{"metric": "score", "value": 0.75, "unit": "ratio"}], command="c")
    table = module.accuracy_table(store.load())
    # a run with dense layers is its own row, not merged into the all-sampled one
    assert list(table.config) == ["dense", "santa-prop S=128", "santa-prop S=128 dense_layers=0,1"]
    assert table.loc[1, "vt"] == "50.0 [10, 90] r=0.50"
    assert module.main([str(tmp_path), "--csv", str(tmp_path / "t.csv")]) == 0
    assert module.main([str(tmp_path / "r")]) == 1  # a run folder, not a store: a message


def test_a_case_asked_twice_is_refused_before_anything_runs(tmp_path):
    """Two cases with one config hash would write one stored case twice, whatever the
    command that made them (here an accuracy case: a default spelled out)."""
    from santa_bench import environment, execute, results
    from santa_bench.runners.tasks import expand_task_cases

    methods = [(REGISTRY.get("santa-prop"), {"S": 8}),
               (REGISTRY.get("santa-prop"), {"S": 8, "stash": "fp16"})]
    cases = expand_task_cases("gsm8k", "tiny", methods, n=2, seed=0, max_new_tokens=3,
                              data_dir=str(tmp_path), device="cpu")
    store = results.ResultStore(tmp_path / "res")
    with pytest.raises(execute.ExecutorError, match="santa-prop S=8 is asked twice"):
        execute.run_cases(cases, store, environment.collect_environment("test"))
    assert not (tmp_path / "res").exists() or not any((tmp_path / "res").rglob("*.parquet"))
