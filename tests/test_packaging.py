"""The checkout's top-level kernels/ folder never shadows Hugging Face's `kernels` package.

transformers (>= 5.25) imports `kernels` at load time; wherever the checkout root is on
sys.path (``python -m pytest``, scripts run from the root) the name must resolve to that
package, or to a namespace portion holding none of our modules where it is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import json, sys
sys.path.insert(0, {root!r})
import kernels
import santa_kernels
from santa_kernels import KVCache  # the kernel library still imports under its name
print(json.dumps({{"file": getattr(kernels, "__file__", None),
                  "path": [str(p) for p in getattr(kernels, "__path__", [])],
                  "ours": santa_kernels.__name__}}))
"""


def _probe(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_kernels_folder_holds_no_importable_modules():
    folder = ROOT / "kernels"
    assert folder.is_dir()  # the layout users know stays
    assert not (folder / "__init__.py").exists()
    assert not list(folder.glob("*.py"))  # the modules live in kernels/santa_kernels/
    assert (folder / "santa_kernels" / "__init__.py").is_file()


def test_import_kernels_from_the_root_is_not_this_repository():
    seen = json.loads(_probe(PROBE.format(root=str(ROOT))))
    assert seen["ours"] == "santa_kernels"
    ours = (ROOT / "kernels").resolve()
    if seen["file"] is None:  # a namespace package: Hugging Face's `kernels` is not installed
        for portion in map(Path, seen["path"]):
            assert not list(portion.glob("*.py")), f"{portion} holds modules named kernels.*"
        return
    assert not Path(seen["file"]).resolve().is_relative_to(ours)
    try:
        hub = metadata.distribution("kernels")
    except metadata.PackageNotFoundError:
        return
    assert Path(seen["file"]).resolve() == Path(hub.locate_file("kernels/__init__.py")).resolve()


def test_transformers_loads_from_the_root():
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed")
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
            "import transformers.modeling_utils; print('ok')")
    assert _probe(code) == "ok"
