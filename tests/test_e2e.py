"""End-to-end batched decode (santa_bench.e2e): model, cache, backends, loop, runner, CLI.

CPU tests use the ``tiny`` configs in fp32: the decoder against transformers' logits and
greedy ``generate``, paged against contiguous, sampled methods (PyTorch references, and
the Triton kernels through the interpreter) against dense, rows in the store, the CLI.
GPU tests (CUDA graphs, FlashInfer) skip without a device.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from santa_bench.cli import app
from santa_bench.e2e import cli as e2e_cli
from santa_bench.e2e.attention import LayerRouting, ReferenceDecode, dense_backend
from santa_bench.e2e.configs import NAMED, from_hf_config, hf_config, resolve_config
from santa_bench.e2e.loop import DecodeSession
from santa_bench.e2e.model import Decoder
from santa_bench.e2e.runner import agreement, case_command, order_cases
from santa_bench.methods import REGISTRY
from santa_bench.methods.santa import TritonSampledDecode
from santa_bench.methods.santapp import TritonSantaPPDecode
from santa_bench.results import ResultStore, config_hash
from santa_bench.sweep import load_suite, suite_from_dict
from santa_kernels.validate import InputError

ROOT = Path(__file__).resolve().parents[1]
CTX, STEPS = 40, 5


def _text(result) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", result.output)


def _invoke(*args, env=None):
    env = {"COLUMNS": "200", **(env or {})}
    # the CLI's console fixes its width when created if COLUMNS was set then (a pytest-xdist
    # worker may have it): the tables' labels must not fold
    e2e_cli.console.width = int(env["COLUMNS"])
    return CliRunner().invoke(app, [str(a) for a in args], env=env)


def _hf_model(name: str):
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM

    torch.manual_seed(0)
    cls = Qwen2ForCausalLM if NAMED[name].family == "qwen2" else LlamaForCausalLM
    return cls(hf_config(NAMED[name])).eval()


def _prompt(config, batch=2, ctx=CTX, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.vocab, (batch, ctx), generator=gen)


def _session(model, layout="contiguous", steps=STEPS, prompt=None, batch=2):
    session = DecodeSession(model, batch=batch, ctx=CTX, steps=steps, layout=layout, page_size=8)
    session.prefill("dense", prompt if prompt is not None else _prompt(model.config, batch),
                    chunk=16)
    return session


def _decode(session, backend, **kw):
    attend = backend if isinstance(backend, LayerRouting) else LayerRouting(backend)
    session.prepare(attend)
    return session.decode(attend, **kw)


# ------------------------------------------------------------------ model
@pytest.mark.parametrize("name", ["tiny", "tiny-qwen"])
def test_decoder_logits_and_greedy_tokens_match_transformers(name):
    hf = _hf_model(name)
    model = Decoder.from_hf(hf, name=name)
    assert model.config == from_hf_config(hf.config, name)
    prompt = _prompt(model.config)
    session = _session(model, prompt=prompt)  # chunk 16 < ctx 40: three prefill chunks
    result = _decode(session, dense_backend("sdpa", session.scale), keep_logits=True)
    with torch.no_grad():
        generated = hf.generate(prompt, attention_mask=torch.ones_like(prompt),
                                max_new_tokens=STEPS + 1, do_sample=False)
        full = hf(generated).logits  # teacher-forced logits of the whole sequence
    assert torch.equal(session.first_tokens, generated[:, CTX])
    assert torch.equal(result.tokens, generated[:, CTX + 1 :])
    torch.testing.assert_close(session.prefill_logits, full[:, CTX - 1], atol=1e-5, rtol=1e-5)
    for step in range(STEPS):  # decode step i consumes token CTX + i
        torch.testing.assert_close(result.logits[step], full[:, CTX + step], atol=1e-5,
                                   rtol=1e-5)


def test_named_configs_have_the_published_shapes():
    llama = resolve_config("llama-3.1-8b")
    assert (llama.num_layers, llama.hidden, llama.num_heads, llama.num_kv_heads) == (
        32, 4096, 32, 8)
    assert abs(llama.num_parameters() / 1e9 - 8.03) < 0.01
    assert llama.kv_bytes_per_token() * 8 * 32768 == 32 * 2**30  # 32k x B=8: 34 GB
    qwen = resolve_config("Qwen/Qwen2.5-7B-Instruct")  # a hub id aliases its shape
    assert qwen.qkv_bias and qwen.num_kv_heads == 4
    assert abs(qwen.num_parameters() / 1e9 - 7.62) < 0.01
    with pytest.raises(InputError, match="unknown config 'llama-9'"):
        resolve_config("llama-9")


def test_random_decoder_is_seeded_and_tied_heads_share_storage():
    a = Decoder.random(NAMED["tiny-qwen"], dtype=torch.float32, seed=3)
    b = Decoder.random(NAMED["tiny-qwen"], dtype=torch.float32, seed=3)
    assert torch.equal(a.layers[1].w_qkv, b.layers[1].w_qkv)
    assert a.lm_head is a.embed_weight and a.layers[0].b_qkv is not None
    assert a.weights == "random"


# ------------------------------------------------------------------ cache and backends
def test_paged_cache_decodes_exactly_like_contiguous():
    model = Decoder.random(NAMED["tiny"], dtype=torch.float32, std=0.1)
    runs = {}
    for layout in ("contiguous", "paged"):
        session = _session(model, layout=layout)
        assert session.cache.lengths.dtype == torch.int32
        result = _decode(session, dense_backend("sdpa", session.scale))
        runs[layout] = (session.prefill_logits, result)
        if layout == "paged":  # pages are shuffled: the table is not the identity
            table = session.cache.page_table
            assert not torch.equal(table.flatten().sort().values, table.flatten())
    torch.testing.assert_close(runs["paged"][0], runs["contiguous"][0])
    assert torch.equal(runs["paged"][1].tokens, runs["contiguous"][1].tokens)


def test_sampled_method_with_a_large_budget_decodes_like_dense():
    model = Decoder.random(NAMED["tiny"], dtype=torch.float32, std=0.1)
    session = _session(model)
    dense = _decode(session, dense_backend("sdpa", session.scale))
    prop = REGISTRY.get("santa-prop")
    huge = ReferenceDecode(prop, prop.resolve_params({"S": 1 << 16}), session.scale, seed=0)
    assert torch.equal(_decode(session, huge).tokens, dense.tokens)
    # a small budget runs, draws a fresh seed per (step, layer) call, and replays exactly
    small = ReferenceDecode(prop, prop.resolve_params({"S": 4}), session.scale, seed=0)
    first, second = _decode(session, small), _decode(session, small)
    assert torch.equal(first.tokens, second.tokens)
    assert small.calls == (STEPS + len(first.attention_ms)) * model.config.num_layers


def test_exempt_layers_run_the_exact_backend():
    model = Decoder.random(NAMED["tiny"], dtype=torch.float32, std=0.1)
    session = _session(model)
    dense = _decode(session, dense_backend("sdpa", session.scale))
    prop = REGISTRY.get("santa-prop")
    sampled = ReferenceDecode(prop, prop.resolve_params({"S": 2}), session.scale, seed=0)
    routed = LayerRouting(sampled, dense_backend("sdpa", session.scale), exempt_layers=(0, 1))
    assert torch.equal(_decode(session, routed).tokens, dense.tokens)  # every layer exempt
    assert sampled.calls == 0


def test_santapp_builds_its_index_after_prefill_and_decodes():
    model = Decoder.random(NAMED["tiny"], dtype=torch.float32, std=0.1)
    session = _session(model)
    method = REGISTRY.get("santapp")
    params = method.resolve_params({"M": 3, "team_size": 16, "sink": 0, "window": 0})
    full = ReferenceDecode(method, params, session.scale, seed=0)  # 40 tokens: 3 teams, all in
    result = _decode(session, full)
    assert [int(units[0].length[0]) for units in full.indexes] == [CTX, CTX]  # one index a layer
    assert torch.equal(result.tokens, _decode(session, dense_backend("sdpa", session.scale)).tokens)


def _interpreted() -> bool:
    import santa_kernels.triton_santa as ts
    import santa_kernels.triton_splitkv as tsk

    return (type(ts._score_pass_kernel).__name__ == "InterpretedFunction"
            and tsk.splitkv_available()[1] == "interpreter")


def test_triton_kernels_in_the_loop_through_the_interpreter():
    if not _interpreted():
        pytest.skip("the Triton kernels were imported without TRITON_INTERPRET=1")
    model = Decoder.random(NAMED["tiny"], dtype=torch.float32, std=0.1)
    session = _session(model, layout="paged", steps=2, batch=1)
    dense = _decode(session, dense_backend("sdpa", session.scale))
    assert torch.equal(_decode(session, dense_backend("triton-splitkv", session.scale)).tokens,
                       dense.tokens)
    prop, santapp = REGISTRY.get("santa-prop"), REGISTRY.get("santapp")
    kernel = TritonSampledDecode(prop, prop.resolve_params({"S": 64, "tile": 16}),
                                 session.scale, seed=0)
    result = _decode(session, kernel)
    # one shared workspace: its device step counter advanced once per (step, layer) call
    calls = (2 + len(result.attention_ms)) * model.config.num_layers
    assert int(kernel.workspace.rng[0]) == calls
    # santa-flash runs its one kernel on a workspace split by its own rule
    flash = REGISTRY.get("santa-flash")
    one = TritonSampledDecode(flash, flash.resolve_params({"S": 64, "tile": 16}),
                              session.scale, seed=0)
    result = _decode(session, one)
    assert one.kernel_function == "triton_santa_flash.santa_flash"
    assert int(one.workspace.rng[0]) == calls
    # SANTA++: teams packed after the prefill, 2 of the 3 (40 tokens / 16) drawn a call
    no_exact = {"sink": 0, "window": 0}
    teams = TritonSantaPPDecode(santapp.resolve_params({"M": 2, **no_exact}),
                                session.scale, seed=0)
    _decode(session, teams)
    assert teams.workspaces[0] is teams.workspaces[1]  # layers of one plan share it
    assert int(teams.workspaces[0].rng[0]) == calls
    # M = every team: each layer reads every token, through the split-KV dense kernel
    every = TritonSantaPPDecode(santapp.resolve_params({"M": 3, **no_exact}),
                                session.scale, seed=0)
    assert torch.equal(_decode(session, every).tokens, dense.tokens)
    assert every.packed == [None] * model.config.num_layers


def test_agreement_counts_equal_tokens_and_the_prefix():
    ref = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    out = torch.tensor([[1, 2, 0, 4], [5, 6, 7, 8]])
    assert agreement(out, ref) == (7 / 8, (2 / 4 + 1) / 2)


# ------------------------------------------------------------------ CLI and store
def test_cli_run_writes_rows_and_resumes(tmp_path):
    args = ("e2e", "--config", "tiny", "--ctx", "64", "--batch", "1,2", "--steps", "4",
            "--methods", "dense,santa-prop:S=16", "--dense-layers", "0",
            "--results", tmp_path, "--run-id", "r")
    result = _invoke(*args)
    assert result.exit_code == 0, _text(result)
    text = _text(result)
    assert "weights: random" in text and "santa-prop S=16" in text
    frame = ResultStore(tmp_path).load()
    ok = frame[frame.status == "ok"]
    for metric in ("step_ms_median", "step_ms_p90", "tokens_per_s", "attention_share",
                   "attention_ms_median", "speedup_vs_best_dense"):
        assert metric in set(ok.metric), metric
    assert set(frame.weights) == {"random"} and set(frame.prefill) == {"dense"}
    assert set(frame.rest) == {"torch"}  # auto: the eager ops on a CPU
    assert set(frame.backend) == {"sdpa", "reference"}
    speedup = ok[ok.metric == "speedup_vs_best_dense"]
    assert len(speedup) == 2 and set(speedup.best_dense) == {"sdpa"}
    share = ok[ok.metric == "attention_share"].value
    # a ratio of two wall-clock timings of a few CPU reps: positive and finite, but not
    # bounded by 1 on a loaded machine (on a GPU the graphs bound it)
    assert ((share > 0) & (share < float("inf"))).all()
    step = ok[(ok.metric == "step_ms_median") & (ok.method == "santa-prop")].iloc[0]
    assert step.dense_layers == "0" and len(json.loads(step.samples_ms)) == 4 - 2
    # each row's command reruns exactly its case: the store skips it
    again = _invoke(*step.command.split()[1:], "--results", tmp_path)
    assert again.exit_code == 0 and "1 of 1 cases already in" in _text(again)
    rerun = _invoke(*args)
    assert "4 of 4 cases already in" in _text(rerun)


def test_e2e_report_labels_name_santapp_variants():
    from santa_bench.e2e.report import _label

    row = {"method": "santapp", "M": 32.0, "reps": "int8", "draw": "pooled"}
    assert _label(pd.Series(row)) == "santapp M=32 reps=int8"
    head = {**row, "draw": float("nan")}  # stored before pooled was the default
    assert _label(pd.Series(head)) == "santapp M=32 draw=head reps=int8"
    assert _label(pd.Series({**row, "merge": "kernel"})) == "santapp M=32 reps=int8 merge=kernel"
    assert _label(pd.Series({**row, "merge": float("nan")})) == "santapp M=32 reps=int8"


def test_speedups_recall_dense_runs_of_an_earlier_process_and_the_report(tmp_path):
    common = ("e2e", "--config", "tiny", "--ctx", "64", "--batch", "2", "--steps", "3",
              "--results", tmp_path, "--run-id", "x")
    assert _invoke(*common, "--methods", "dense").exit_code == 0
    result = _invoke(*common, "--methods", "santa-flash:S=8")
    assert result.exit_code == 0, _text(result)
    frame = ResultStore(tmp_path).load()
    speedup = frame[frame.metric == "speedup_vs_best_dense"]
    assert list(speedup.status) == ["ok"] and list(speedup.best_dense) == ["sdpa"]
    from santa_bench.e2e.report import e2e_table

    table = e2e_table(frame)
    assert "model: tiny, weights: random" in table and "| 64 | 2 | santa-flash S=8 |" in table
    assert table.index("| dense |") < table.index("santa-flash")
    # a store merged from two machines holds the same cases under two run ids: one line
    # per run, not a crash (run dirs copied together, as results/h200 is)
    shutil.copytree(tmp_path / "x", tmp_path / "y")
    table = e2e_table(ResultStore(tmp_path).load())
    assert table.count("| 64 | 2 | santa-flash S=8 |") == 2
    # rows stored before the ``rest`` column existed ran the eager rest: their own table
    assert "rest: torch" in table and "rest: fused" not in table
    old = frame.drop(columns=["rest"])
    assert e2e_table(old) == e2e_table(frame)
    mixed = pd.concat([frame.assign(rest="fused", run_id="new"), old])
    assert e2e_table(mixed).count("**model: tiny") == 2  # one table per rest


def test_real_weights_report_token_agreement(tmp_path, monkeypatch):
    hf = _hf_model("tiny")
    monkeypatch.setattr("santa_bench.accuracy.models.load_model", lambda *a, **k: (hf, None))
    result = _invoke("e2e", "--model", "my/tiny", "--ctx", "48", "--batch", "2", "--steps", "4",
                     "--methods", "dense,santa-prop:S=65536,santa-sys:S=2",
                     "--results", tmp_path)
    assert result.exit_code == 0, _text(result)
    frame = ResultStore(tmp_path).load()
    assert set(frame.weights) == {"real"}
    agree = frame[frame.metric == "token_agreement"].set_index("method").value
    assert agree["santa-prop"] == 1.0 and 0 <= agree["santa-sys"] <= 1
    assert "token_agreement_prefix" in set(frame.metric)


def test_help_explains_every_option():
    result = _invoke("e2e", "--help")
    assert result.exit_code == 0
    text = _text(result)
    for option in ("--config", "--model", "--random-weights", "--ctx", "--batch", "--methods",
                   "--steps", "--dense-backends", "--layout", "--page-size", "--dense-layers",
                   "--prefill", "--prefill-chunk", "--graph", "--dtype", "--seed", "--device",
                   "--results", "--run-id", "--force"):
        assert option in text, option
    assert "random weights" in text and "speed" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--config", "llama-9"), "unknown config 'llama-9'"),
        (("--config", "tiny", "--batch", "0"), "--batch: every value must be > 0"),
        (("--config", "tiny", "--ctx", "8k"), "tiny has 4096 positions"),
        (("--config", "tiny", "--methods", "santa-nope"), "unknown method 'santa-nope'"),
        (("--config", "tiny", "--methods", "sdpa-cudnn"), "name 'dense' and pick its backends"),
        (("--config", "tiny", "--ctx", "64", "--dense-layers", "2"), "tiny has layers 0..1"),
        (("--config", "tiny", "--dense-backends", "cudnn"), "unknown backend 'cudnn'"),
        (("--config", "tiny", "--model", "x"), "give one"),
        (("--model", "x", "--prefill", "random"), "real weights need the dense prefill"),
        (("--config", "tiny", "--steps", "1"), "at least 2 decode steps"),
        (("--config", "tiny", "--rest", "fast"), "--rest: expected auto, fused or gemm or torch"),
    ],
)
def test_bad_input_is_a_clear_error(tmp_path, args, message):
    result = _invoke("e2e", *args, "--results", tmp_path)
    assert result.exit_code == 2
    assert message in " ".join(_text(result).split())
    assert not list(tmp_path.glob("*/part-*"))


def test_unavailable_backend_is_a_skipped_row(tmp_path):
    result = _invoke("e2e", "--config", "tiny", "--ctx", "64", "--steps", "2", "--methods",
                     "dense", "--dense-backends", "sdpa,flashinfer-tc", "--results", tmp_path)
    assert result.exit_code == 0, _text(result)
    frame = ResultStore(tmp_path).load().set_index("backend")
    assert frame.loc["flashinfer-tc", "status"] == "skipped"
    assert "flashinfer" in frame.loc["flashinfer-tc", "reason"]


# ------------------------------------------------------------------ sweeps
def test_the_e2e_suite_expands_and_a_cpu_suite_runs(tmp_path):
    suite = load_suite(ROOT / "suites" / "e2e-batched-decode.yaml")
    assert suite.implemented and {c["weights"] for c in suite.cases} == {"random"}
    dense = [c for c in suite.cases if c["method"] == "dense"]
    assert {c["backend"] for c in dense} >= {"sdpa", "triton-splitkv", "flashinfer-tc"}
    small = suite_from_dict({
        "runner": "e2e",
        "fixed": {"model": "tiny", "weights": "random", "ctx": 64, "decode_steps": 3,
                  "device": "cpu", "dense_layers": "1"},
        "grid": {"method": ["santa-flash", "dense"], "batch": [1, 2], "S": [8]},
    })
    ordered = order_cases(small.cases)
    assert [c["method"] for c in ordered] == ["dense", "santa-flash"] * 2
    cases = {config_hash(c) for c in small.cases}
    path = tmp_path / "suite.yaml"
    import yaml

    path.write_text(yaml.safe_dump({
        "runner": "e2e",
        "fixed": {"model": "tiny", "weights": "random", "ctx": 64, "decode_steps": 3,
                  "device": "cpu", "dense_layers": "1"},
        "grid": {"method": ["santa-flash", "dense"], "batch": [1, 2], "S": [8]},
    }))
    result = _invoke("sweep", path, "--results", tmp_path / "store")
    assert result.exit_code == 0, _text(result)
    frame = ResultStore(tmp_path / "store").load()
    assert set(frame.case_hash) == cases
    assert (frame[frame.metric == "speedup_vs_best_dense"].status == "ok").all()
    assert all(case_command(c).startswith("santa-bench e2e --config tiny") for c in small.cases)


# ------------------------------------------------------------------ GPU
def _gpu_session(dtype, layout="contiguous", steps=8):
    from santa_bench.e2e.configs import ModelConfig

    # Llama-3.1-8B's attention shape (GQA group 4, head dim 128): the FlashInfer JIT
    # kernels built here serve an e2e run that follows on the same machine
    config = ModelConfig("gpu-small", "llama", 2, 512, 8, 2, 128, 512, 512, 4096, 10000.0)
    model = Decoder.random(config, device="cuda", dtype=dtype, std=0.05)
    session = DecodeSession(model, batch=2, ctx=300, steps=steps, layout=layout, page_size=16)
    session.prefill("dense", chunk=128)
    return session


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_gpu_graph_decode_matches_eager_and_draws_fresh_numbers(layout):
    session = _gpu_session(torch.float32, layout)
    eager = _decode(session, dense_backend("sdpa", session.scale), graph=False, keep_logits=True)
    assert eager.timing == "events"
    for name in ("sdpa", "triton-splitkv"):
        graphed = _decode(session, dense_backend(name, session.scale), graph=True)
        assert graphed.timing == "graph" and torch.equal(graphed.tokens, eager.tokens), name
    layers = session.model.config.num_layers
    prop, santapp = REGISTRY.get("santa-prop"), REGISTRY.get("santapp")
    kernel = TritonSampledDecode(prop, prop.resolve_params({"S": 1 << 14, "stash": "fp32"}),
                                 session.scale, seed=0)
    result = _decode(session, kernel, graph=True, keep_logits=True)
    # every replayed step and layer advanced the shared workspace's device counter
    assert int(kernel.workspace.rng[0]) == (8 + len(result.attention_ms)) * layers
    # S >> context: the first step's logits are dense's up to the sampling noise (greedy
    # tokens of a random model may still flip on near-ties and then diverge)
    first, dense_first = result.logits[0].double(), eager.logits[0].double()
    rel = float((first - dense_first).norm() / dense_first.norm())
    assert rel < 0.05, rel
    assert torch.equal(result.tokens[:, 0], eager.tokens[:, 0])
    no_exact = {"sink": 0, "window": 0}
    teams = TritonSantaPPDecode(santapp.resolve_params({"M": 4, **no_exact}), session.scale,
                                seed=0)
    result = _decode(session, teams, graph=True)
    assert int(teams.workspaces[0].rng[0]) == (8 + len(result.attention_ms)) * layers
    # M = every team (300 tokens / 16): exact attention, the dense tokens up to rounding
    everything = TritonSantaPPDecode(santapp.resolve_params({"M": 19, **no_exact}),
                                     session.scale, seed=0)
    exact = _decode(session, everything, graph=True, keep_logits=True)
    first = exact.logits[0].double()
    assert float((first - dense_first).norm() / dense_first.norm()) < 1e-3
    assert torch.equal(exact.tokens[:, 0], eager.tokens[:, 0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_cli_run_on_a_small_config(tmp_path):
    result = _invoke("e2e", "--config", "llama-3.2-1b", "--ctx", "4k", "--batch", "2",
                     "--steps", "8", "--prefill", "random", "--dense-backends",
                     "sdpa,triton-splitkv", "--methods", "dense,santa-prop:S=128,santapp:M=32",
                     "--results", tmp_path)
    assert result.exit_code == 0, _text(result)
    frame = ResultStore(tmp_path).load()
    ok = frame[(frame.metric == "speedup_vs_best_dense") & (frame.status == "ok")]
    assert set(ok.method) == {"santa-prop", "santapp"}
    assert set(frame[frame.metric == "step_ms_median"].timing_mode) == {"graph"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["triton-splitkv", "flashinfer-tc", "flashinfer-fa3",
                                  "flash-attn"])
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_gpu_dense_backends_agree_with_sdpa_under_graphs(name, layout):
    """Last in the file: a vendor backend that breaks graph capture cannot fail the rest."""
    from santa_bench.baselines import Unsupported

    session = _gpu_session(torch.bfloat16, layout, steps=6)
    backend = LayerRouting(dense_backend(name, session.scale))
    try:
        session.prepare(backend)
    except Unsupported as exc:
        pytest.skip(str(exc))
    sdpa = LayerRouting(dense_backend("sdpa", session.scale))
    session.prepare(sdpa)
    config = session.model.config
    q = torch.randn(2, config.num_heads, config.head_dim, device="cuda", dtype=torch.bfloat16)
    backend.before_step([300, 300])
    torch.testing.assert_close(backend(1, q).float(), sdpa(1, q).float(), atol=2e-2, rtol=2e-2)
    result = _decode(session, backend, graph=True, keep_logits=True)
    reference = _decode(session, sdpa, graph=True, keep_logits=True)
    # the first step's logits (later greedy tokens of a random bf16 model flip on near-ties
    # and then diverge: a token agreement over the steps measures luck, not the backend)
    first, want = result.logits[0].double(), reference.logits[0].double()
    assert float((first - want).norm() / want.norm()) < 2e-2
    assert (result.tokens[:, 0] == reference.tokens[:, 0]).all()
