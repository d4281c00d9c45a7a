"""The environment record of a run: device, versions, git SHA, command, date; on a GPU its
clocks, power and temperature at the run's start (``gpu_*_start``; ``gpu_*_end`` is added
when the run ends, see :mod:`santa_bench.gpu_state`).

Stored as `run.json` beside a run's Parquet parts and joined to the rows by `run_id`.
Collecting it never fails: whatever cannot be found is recorded as None.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

# Distribution names to try for each recorded package (first installed one wins).
_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "triton": ("triton", "pytorch-triton"),
    "flashinfer": ("flashinfer-python", "flashinfer"),
    "transformers": ("transformers",),
    "flash_attn": ("flash-attn", "flash_attn"),
}

# Fields that change measured results; date, command, git SHA and host do not.
FINGERPRINT_FIELDS: tuple[str, ...] = ("device", "gpu_name", "torch", "triton", "flashinfer")


def collect_environment(command: list[str] | str | None = None) -> dict[str, Any]:
    """Return the environment record of this process (flat, JSON-serialisable)."""
    env: dict[str, Any] = {
        **_device_info(),
        "driver": _nvidia_driver(),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        **{name: _package_version(dists) for name, dists in _DISTRIBUTIONS.items()},
        "git_sha": _git_sha(),
        "command": _command_line(command),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "copy_bandwidth_gbps": None,  # measured later by the GPU timing code
    }
    if env["device"] == "cuda":  # clocks, power, temperature (None without nvidia-ml-py)
        from santa_bench.gpu_state import gpu_state_record

        env.update(gpu_state_record("start"))
    return env


def environment_fingerprint(env: dict[str, Any]) -> str:
    """Return a 12-hex hash of the fields of `env` that change results."""
    relevant = {field: env.get(field) for field in FINGERPRINT_FIELDS}
    canonical = json.dumps(relevant, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def _device_info() -> dict[str, Any]:
    """Return device, GPU name, SM count, L2 and memory sizes, and torch's CUDA version."""
    info: dict[str, Any] = {
        "device": "cpu",
        "gpu_name": None,
        "sm_count": None,
        "l2_bytes": None,
        "gpu_memory_bytes": None,
        "cuda": None,
    }
    try:
        import torch  # the harness depends on torch anyway

        info["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            info.update(
                device="cuda",
                gpu_name=props.name,
                sm_count=props.multi_processor_count,
                l2_bytes=getattr(props, "L2_cache_size", None),
                gpu_memory_bytes=props.total_memory,
            )
    except Exception:  # a broken CUDA setup must not stop a run from being recorded
        pass
    return info


def _nvidia_driver() -> str | None:
    """Return the NVIDIA driver version reported by nvidia-smi, or None."""
    if shutil.which("nvidia-smi") is None:
        return None
    out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return out.splitlines()[0].strip() if out else None


def _package_version(distributions: tuple[str, ...]) -> str | None:
    """Return the installed version of the first found distribution, without importing it."""
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _git_sha() -> str | None:
    """Return HEAD's SHA of the harness's own checkout, with '-dirty' if modified, else None.

    ``$SANTA_BENCH_GIT_SHA``, when set, wins: ``scripts/h200_setup.sh`` sets it from a
    ``.git_sha`` file written here, because a GPU machine's copy of the tree may have no
    ``.git`` or a stale one (rows of 2026-11-29 said ``32e7760-dirty`` for later commits).
    Git is asked only inside the package's own checkout (never the current folder, which may
    be an untrusted repository), with its fsmonitor and hooks turned off.
    """
    pinned = os.environ.get("SANTA_BENCH_GIT_SHA")
    if pinned:
        return pinned
    root = _package_checkout()
    if root is None:
        return None
    sha = _git(root, "rev-parse", "HEAD")
    if not sha:
        return None
    # Untracked files (fresh results, scratch) do not make the code dirty.
    changes = _git(root, "status", "--porcelain", "-uno")
    return f"{sha}-dirty" if changes else sha


def _package_checkout() -> Path | None:
    """Return the folder above the package when it is a git checkout's root, else None."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / ".git").exists() else None


def _git(root: Path, *args: str) -> str | None:
    """Run git in `root` with no fsmonitor, hooks or repository discovery above it."""
    return _run(
        ["git", "-c", "core.fsmonitor=false", "-c", f"core.hooksPath={os.devnull}",
         "--git-dir", str(root / ".git"), "--work-tree", str(root), *args]
    )


def _command_line(command: list[str] | str | None) -> str:
    """Return the command as one shell-quoted string (default: this process's argv)."""
    if isinstance(command, str):
        return command
    if command is None:
        main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        if main_spec is not None and main_spec.name:  # started as `python -m package`
            program = ["python", "-m", main_spec.name.removesuffix(".__main__")]
        else:
            argv0 = sys.argv[0] if sys.argv else ""
            program = ["python", argv0] if argv0 == "-c" else [os.path.basename(argv0)]
        command = program + sys.argv[1:]
    return shlex.join(command)


def _run(args: list[str]) -> str | None:
    """Return the stripped stdout of a short command, or None if it fails."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()
