"""No Python module of the harness or the kernel library grows past the size bar."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 1200  # the bar; aim for about 1,000


def test_no_module_over_the_size_bar():
    sizes = {path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
             for folder in ("santa_bench", "kernels") for path in (ROOT / folder).rglob("*.py")}
    assert any(name.startswith("kernels/") for name in sizes)  # the walk found the kernels
    over = {name: lines for name, lines in sorted(sizes.items()) if lines > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split them by job): {over}"
