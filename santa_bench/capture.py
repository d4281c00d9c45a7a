"""Real decode-step inputs: a model's post-RoPE queries, K and V on real text.

``capture_attention`` runs one dense forward over ``ctx`` tokens of a text with an
attention function that records, for the chosen layers, the query of the last
position(s) (after RoPE) and the layer's K and V as the model keeps them (after RoPE
for K, ``[Hkv, N, d]``, without the GQA repeat). ``save_capture`` writes them to a
safetensors file (``L<layer>.query`` ``[P, Hq, d]``, ``L<layer>.key`` / ``.value``
``[N, Hkv, d]``) with metadata (model, ctx, layers, dtype, scale, text). The fidelity
runner reads such a file as patterns ``captured:<model>:L<layer>`` (``load_captured``):
position ``p`` of the ``P`` is one sequence of a batch attending to its causal prefix;
``santa-bench kernel --inputs`` times the kernels on them (``santa_bench.captured``).
"""

from __future__ import annotations

import inspect
import itertools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import torch
import typer

import santa_kernels as sk
from santa_bench.devices import resolve_device

CAPTURED_PREFIX = "captured:"
RULER_HAYSTACK = "ruler-haystack"
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_names = itertools.count()


@dataclass
class LayerCapture:
    """One layer's captured decode inputs (``scale``: the layer's softmax scale)."""

    layer: int
    query: torch.Tensor  # [P, Hq, d], post-RoPE, the last P positions
    key: torch.Tensor  # [N, Hkv, d], post-RoPE
    value: torch.Tensor  # [N, Hkv, d]
    scale: float


def haystack_text(data_dir: str | Path | None = None) -> str:
    """Returns RULER's Paul Graham essays (the NIAH haystack), fetched on first use."""
    from santa_bench.accuracy.ruler import fetch_ruler_data

    folder = fetch_ruler_data(data_dir)
    with open(folder / "PaulGrahamEssays.json") as handle:
        return json.load(handle)["text"]


def capture_attention(
    model: Any,
    input_ids: torch.Tensor,
    layers: list[int],
    *,
    positions: int = 1,
) -> list[LayerCapture]:
    """Runs ``model`` densely on ``input_ids`` [1, N] and returns the chosen layers' inputs."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids: expected [1, N], got {list(input_ids.shape)}")
    n = input_ids.shape[1]
    if not 1 <= positions <= n:
        raise ValueError(f"positions: expected 1..{n}, got {positions}")
    count = int(model.config.num_hidden_layers)
    bad = [layer for layer in layers if not 0 <= layer < count]
    if bad or not layers:
        raise ValueError(f"layers: expected indices in 0..{count - 1}, got {layers}")
    wanted = set(layers)
    found: dict[int, LayerCapture] = {}

    def forward(module, query, key, value, attention_mask, scaling=None, **kwargs):
        layer = getattr(module, "layer_idx", None)
        if layer in wanted:
            d = query.shape[-1]
            found[layer] = LayerCapture(
                layer,
                query[0, :, -positions:, :].transpose(0, 1).detach().clone(),
                key[0].transpose(0, 1).detach().clone(),
                value[0].transpose(0, 1).detach().clone(),
                float(scaling) if scaling is not None else d**-0.5,
            )
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, **kwargs
        )

    name = f"santa_bench_capture_{next(_names)}"
    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    previous = getattr(model.config, "_attn_implementation", None) or "sdpa"
    model.set_attn_implementation(name)
    # the logits of the last position only: all N of them would take N x vocab floats
    keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(
        model.forward).parameters else {}
    try:
        with torch.no_grad():
            model(input_ids.to(model.device), use_cache=False, **keep)
    finally:
        model.set_attn_implementation(previous)
    missing = sorted(wanted - set(found))
    if missing:
        raise ValueError(f"layers {missing}: no attention call recorded (not attention layers?)")
    return [found[layer] for layer in layers]


def save_capture(
    path: str | Path,
    captures: list[LayerCapture],
    *,
    model: str,
    text: str,
    dtype: str = "fp32",
    extra: dict[str, str] | None = None,
) -> Path:
    """Writes the captures to a safetensors file with their metadata (``extra``: more
    metadata entries, such as the device the model ran on); returns its path."""
    from safetensors.torch import save_file

    if dtype not in _DTYPES:
        raise ValueError(f"dtype: expected one of {list(_DTYPES)}, got {dtype!r}")
    tensors = {}
    for c in captures:
        for part in ("query", "key", "value"):
            tensor = getattr(c, part).to(device="cpu", dtype=_DTYPES[dtype]).contiguous()
            tensors[f"L{c.layer}.{part}"] = tensor
    first = captures[0]
    metadata = {
        "format": "santa-bench-capture/1",
        "model": model,
        "ctx": str(first.key.shape[0]),
        "layers": ",".join(str(c.layer) for c in captures),
        "positions": str(first.query.shape[0]),
        "heads": str(first.query.shape[1]),
        "kv_heads": str(first.key.shape[1]),
        "head_dim": str(first.key.shape[2]),
        "dtype": dtype,
        "scales": json.dumps({str(c.layer): c.scale for c in captures}),
        "text": text,
        **(extra or {}),
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=metadata)
    return path


def read_metadata(path: str | Path) -> dict[str, str]:
    """Returns a capture file's metadata (ValueError if it is not one)."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--inputs: {path} not found")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
    except Exception as exc:  # safetensors raises its own error types
        raise ValueError(f"--inputs: {path} is not a safetensors file: {exc}") from None
    if metadata.get("format") != "santa-bench-capture/1":
        raise ValueError(f"--inputs: {path} was not written by `santa-bench capture`")
    return metadata


def captured_patterns(path: str | Path) -> list[str]:
    """Returns the pattern names a capture file provides: ``captured:<model>:L<layer>``."""
    meta = read_metadata(path)
    return [f"{CAPTURED_PREFIX}{meta['model']}:L{layer}" for layer in meta["layers"].split(",")]


def captured_shape(path: str | Path) -> dict[str, int]:
    """Returns the fidelity shape keys of a capture (batch = captured positions)."""
    meta = read_metadata(path)
    return {
        "batch": int(meta["positions"]),
        "ctx": int(meta["ctx"]),
        "heads": int(meta["heads"]),
        "kv_heads": int(meta["kv_heads"]),
        "head_dim": int(meta["head_dim"]),
    }


def file_digest(path: str | Path) -> str:
    """The first 12 hex digits of the file's sha256 (a case key: which capture)."""
    from santa_bench.accuracy.models import sha256_of

    return sha256_of(Path(path))[:12]


def read_layer(
    path: str | Path, layer: int | str, *, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns one captured layer's ``(query [P, Hq, d], key [N, Hkv, d], value)``.

    ``query`` is rescaled so that the default softmax scale ``1/sqrt(d)`` equals the
    layer's own.
    """
    from safetensors import safe_open

    meta = read_metadata(path)
    layer = str(layer)
    if layer not in meta["layers"].split(","):
        raise ValueError(f"layer {layer}: not in {path} (layers {meta['layers']})")
    with safe_open(str(path), framework="pt") as handle:
        query = handle.get_tensor(f"L{layer}.query").to(dtype)
        key = handle.get_tensor(f"L{layer}.key").to(dtype)
        value = handle.get_tensor(f"L{layer}.value").to(dtype)
    if key.shape != value.shape:
        raise ValueError(f"{path}: layer {layer} holds K {list(key.shape)} and V "
                         f"{list(value.shape)}: capture the file again")
    scale = float(json.loads(meta["scales"])[layer])
    return query * (scale * math.sqrt(query.shape[-1])), key, value


def load_captured(
    path: str | Path, pattern: str, *, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, sk.KVCache]:
    """Returns ``(q [P, Hq, d], kv)`` of a captured pattern for the reference kernels.

    Position ``p`` (of the last ``P``) is sequence ``p``: it sees the first
    ``N - P + 1 + p`` keys. ``q`` is rescaled as in :func:`read_layer`.
    """
    meta = read_metadata(path)
    match = re.fullmatch(rf"{re.escape(CAPTURED_PREFIX)}(.+):L(\d+)", pattern)
    if not match or match.group(1) != meta["model"]:
        raise ValueError(f"pattern {pattern!r}: not in {path} ({captured_patterns(path)})")
    layer = match.group(2)
    if layer not in meta["layers"].split(","):
        raise ValueError(f"pattern {pattern!r}: layer {layer} not in {path}")
    query, key, value = read_layer(path, layer, dtype=dtype)
    positions, n = query.shape[0], key.shape[0]
    lengths = torch.arange(n - positions + 1, n + 1)
    k = key.unsqueeze(0).expand(positions, -1, -1, -1).contiguous()
    v = value.unsqueeze(0).expand(positions, -1, -1, -1).contiguous()
    return query, sk.KVCache.contiguous(k, v, lengths if positions > 1 else None)


MODEL_DTYPES = {"cpu": "float32", "cuda": "bfloat16"}
"""The weights' dtype on each device the capture runs on."""


def capture_device(requested: str) -> str:
    """Returns ``cpu`` or ``cuda`` for ``--device auto|cpu|cuda`` (ValueError if unusable)."""
    return resolve_device(requested)


def default_layers(count: int) -> list[int]:
    """First, middle and last layer."""
    return sorted({0, count // 2, count - 1})


def capture_command(
    model: Annotated[
        str,
        typer.Option(help="Catalog model (smollm2-135m, ...), a local path or a Hugging Face id."),
    ] = "smollm2-135m",
    ctx: Annotated[str, typer.Option(help="Tokens of text to run (4k, 8192, ...).")] = "4k",
    layers: Annotated[
        str, typer.Option(help="Layers to capture, comma list (default: first, middle, last).")
    ] = "",
    text: Annotated[
        str,
        typer.Option(help=f"A text file, or '{RULER_HAYSTACK}' (RULER's Paul Graham essays)."),
    ] = RULER_HAYSTACK,
    positions: Annotated[int, typer.Option(help="Last positions whose query is kept.")] = 1,
    dtype: Annotated[str, typer.Option(help="Stored dtype: fp32, bf16 or fp16.")] = "fp32",
    device: Annotated[
        str,
        typer.Option(
            help="Where the model runs: auto (a GPU when present), cpu (fp32 weights) or "
            "cuda (bf16 weights; 32k tokens in seconds where a CPU takes minutes)."
        ),
    ] = "auto",
    out: Annotated[Path, typer.Option(help="Output safetensors file.")] = Path(
        "captured.safetensors"
    ),
) -> None:
    """Capture a model's post-RoPE query, K and V at chosen layers on real text.

    The file feeds `santa-bench accuracy fidelity --inputs FILE` (patterns
    captured:<model>:L<layer>) and `santa-bench kernel --inputs FILE` (kernel timings on
    real attention).
    """

    from santa_bench.console import fail as one_line_error
    from santa_bench.console import make_console
    from santa_bench.units import parse_list, parse_size

    console = make_console()

    def fail(message: str) -> None:
        one_line_error(console, message)

    try:
        size = parse_size(ctx)
        chosen = parse_list(layers, int)
        if dtype not in _DTYPES:
            raise ValueError(f"--dtype: expected one of {list(_DTYPES)}, got {dtype!r}")
        where = capture_device(device)
        if text == RULER_HAYSTACK:
            body = haystack_text()
        elif Path(text).is_file():
            body = Path(text).read_text()
        else:
            raise ValueError(f"--text: {text} is neither a file nor {RULER_HAYSTACK!r}")
    except Exception as exc:  # bad options or unavailable data
        fail(str(exc))
        return
    from santa_bench.accuracy.models import download_notice, load_model
    from santa_bench.extras import require_model_packages

    require_model_packages(console, [model])
    if notice := download_notice(model):
        console.print(notice, soft_wrap=True)
    try:
        model_obj, tokenizer = load_model(model, dtype=MODEL_DTYPES[where], device=where)
    except (OSError, ValueError) as exc:  # an unknown name, path or hub id; no network
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        fail(f"--model {model}: cannot load it ({first})")
        return
    ids = tokenizer(body, return_tensors="pt").input_ids
    if ids.shape[1] < size:
        fail(f"--text: {ids.shape[1]} tokens, fewer than --ctx {size}")
    chosen = chosen or default_layers(int(model_obj.config.num_hidden_layers))
    try:
        captures = capture_attention(model_obj, ids[:, :size], chosen, positions=positions)
    except ValueError as exc:
        fail(str(exc))
        return
    path = save_capture(out, captures, model=model, text=text, dtype=dtype,
                        extra={"device": where, "model_dtype": MODEL_DTYPES[where]})
    first = captures[0]
    console.print(
        f"wrote {path}: {model}, ctx {size}, layers {','.join(map(str, chosen))}, "
        f"q {list(first.query.shape)}, K/V {list(first.key.shape)}, {dtype} (the model in "
        f"{MODEL_DTYPES[where]} on {where})"
    )
