"""`santa-bench capture` and captured fidelity patterns (a tiny random Llama saved to disk)."""

from __future__ import annotations

import pytest
import torch

import santa_kernels as sk

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

WORDS = [f"w{i}" for i in range(90)]


def _save_tiny_model(folder) -> None:
    """A 3-layer Llama (GQA 4/2, head dim 8) and a word-level tokenizer, saved to ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "</s>": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="[UNK]", eos_token="</s>"
    )
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    _save_tiny_model(folder)
    text = folder / "text.txt"
    text.write_text(" ".join(WORDS[i * 7 % 90] for i in range(400)))
    return folder, text


def test_captured_q_k_v_reproduce_the_layer_attention(tiny):
    from santa_bench.accuracy.models import load_model
    from santa_bench.capture import capture_attention

    folder, text = tiny
    model, tokenizer = load_model(str(folder))
    ids = tokenizer(text.read_text(), return_tensors="pt").input_ids[:, :64]
    seen = {}
    hook = model.model.layers[1].self_attn.o_proj.register_forward_pre_hook(
        lambda module, args: seen.setdefault("in", args[0].detach().clone())
    )
    try:
        (c,) = capture_attention(model, ids, [1], positions=3)
    finally:
        hook.remove()
    assert c.query.shape == (3, 4, 8) and c.key.shape == c.value.shape == (64, 2, 8)
    assert c.scale == pytest.approx(8**-0.5)
    for p in range(3):  # position 61 + p sees the first 62 + p keys
        n = 62 + p
        kv = sk.KVCache.contiguous(c.key[None, :n].double(), c.value[None, :n].double())
        out = sk.dense_attention(c.query[None, p].double(), kv).out
        expected = seen["in"][0, 61 + p].view(4, 8).double()
        torch.testing.assert_close(out[0].double(), expected, atol=1e-5, rtol=1e-4)


def test_capture_command_feeds_fidelity(tiny, tmp_path):
    from typer.testing import CliRunner

    from santa_bench.capture import captured_patterns, load_captured, read_metadata
    from santa_bench.cli import app
    from santa_bench.results import ResultStore

    folder, text = tiny
    out = tmp_path / "cap.safetensors"
    args = ["capture", "--model", str(folder), "--ctx", "128", "--layers", "0,2",
            "--text", str(text), "--positions", "2", "--out", str(out)]
    done = CliRunner().invoke(app, args, catch_exceptions=False)
    assert done.exit_code == 0, done.output
    meta = read_metadata(out)
    assert (meta["model"], meta["ctx"], meta["layers"], meta["dtype"]) == (
        str(folder), "128", "0,2", "fp32")
    names = captured_patterns(out)
    assert names == [f"captured:{folder}:L0", f"captured:{folder}:L2"]
    q, kv = load_captured(out, names[1])
    assert q.shape == (2, 4, 8) and kv.lengths.tolist() == [127, 128]

    fid = ["accuracy", "fidelity", "--inputs", str(out), "--methods", "santa-sys,santa-prop",
           "--S", "16", "--seeds", "4", "--results", str(tmp_path / "res")]
    result = CliRunner().invoke(app, fid, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    frame = ResultStore(tmp_path / "res").load()
    assert set(frame.pattern) == set(names) and frame.case_hash.nunique() == 4
    assert set(frame.ctx) == {128} and set(frame.batch) == {2} and set(frame.heads) == {4}
    errors = frame[frame.metric == "rel_l2_vs_dense"].value
    assert errors.between(0, 2).all()
    assert frame.command.str.contains("--inputs").all()

    bad = CliRunner().invoke(app, [*args[:-2], "--out", str(tmp_path / "x.safetensors"),
                                   "--ctx", "100000"], catch_exceptions=False)
    assert bad.exit_code == 2 and "fewer than --ctx" in bad.output
    wrong = CliRunner().invoke(app, [*fid[:2], "--inputs", str(text)], catch_exceptions=False)
    assert wrong.exit_code == 2 and "safetensors file" in " ".join(wrong.output.split())


def test_capture_device_option(tiny, tmp_path):
    from typer.testing import CliRunner

    from santa_bench.capture import read_metadata
    from santa_bench.cli import app

    folder, text = tiny
    base = ["capture", "--model", str(folder), "--ctx", "64", "--layers", "1", "--text",
            str(text)]
    out = tmp_path / "cpu.safetensors"
    done = CliRunner().invoke(app, [*base, "--device", "cpu", "--out", str(out)],
                              catch_exceptions=False)
    assert done.exit_code == 0, done.output
    meta = read_metadata(out)
    assert (meta["device"], meta["model_dtype"]) == ("cpu", "float32")
    bad = CliRunner().invoke(app, [*base, "--device", "tpu"], catch_exceptions=False)
    assert bad.exit_code == 2 and "--device: expected auto, cpu or cuda" in bad.output
    if not torch.cuda.is_available():
        gpu = CliRunner().invoke(app, [*base, "--device", "cuda"], catch_exceptions=False)
        assert gpu.exit_code == 2 and "no CUDA device" in gpu.output


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_capture_matches_the_cpu_one_to_bf16_rounding(tiny, tmp_path):
    from typer.testing import CliRunner

    from santa_bench.capture import read_layer, read_metadata
    from santa_bench.cli import app

    folder, text = tiny
    base = ["capture", "--model", str(folder), "--ctx", "256", "--layers", "0,2", "--text",
            str(text)]
    paths = {}
    for device in ("cpu", "cuda"):
        paths[device] = tmp_path / f"{device}.safetensors"
        done = CliRunner().invoke(app, [*base, "--device", device, "--out",
                                        str(paths[device])], catch_exceptions=False)
        assert done.exit_code == 0, done.output
    assert read_metadata(paths["cuda"])["model_dtype"] == "bfloat16"
    for layer in (0, 2):
        for ours, theirs in zip(read_layer(paths["cuda"], layer), read_layer(paths["cpu"], layer),
                                strict=True):
            error = (ours - theirs).norm() / theirs.norm()
            assert error < 3e-2  # bf16 weights and activations against fp32
