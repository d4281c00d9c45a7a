"""``santa-bench accuracy fidelity`` with SANTA++'s team index built once per input.

Run:  python scripts/fidelity_one_index.py [fidelity options]

The fidelity command draws SANTA++ through its registry reference, which builds the team
index anew for every seed; on a CPU at 16k that doubles a case's time. The index of
``policy=contiguous`` holds no randomness, so this runs the same command (the same cases,
rows and store) with each index built once per (cache, index arguments) and reused by the
seeds and configurations that follow. Use it for contiguous teams only.
"""

from __future__ import annotations

import sys
from typing import Any

import santa_kernels.santapp as santapp
from santa_bench.cli import app

_build = santapp.build_team_index
_last: dict[tuple, tuple[Any, Any]] = {}


def _build_once(kv: Any, **kwargs: Any) -> Any:
    """The index of ``kv`` for ``kwargs``, built on the first call (``kv`` is kept
    alive beside it, so its ``id`` is not reused while it is cached)."""
    if kwargs.get("policy", "contiguous") != "contiguous":
        return _build(kv, **kwargs)
    key = (id(kv), tuple(sorted(kwargs.items())))
    if key not in _last:
        _last.clear()
        _last[key] = (kv, _build(kv, **kwargs))
    return _last[key][1]


def main() -> None:
    """Runs ``santa-bench accuracy fidelity`` with the arguments given, the index reused."""
    santapp.build_team_index = _build_once
    sys.argv[1:1] = ["accuracy", "fidelity"]  # as the run records its command
    app()


if __name__ == "__main__":
    main()
