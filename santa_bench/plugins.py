"""Plugins: a researcher's own methods, tasks and baselines, registered from their package.

A plugin is a module that registers into santa-bench's registries when imported (its
``@register`` methods, ``register_task`` tasks, ``register_baseline`` baselines). It is
loaded from the entry point group ``santa_bench.plugins`` of any installed distribution
(``[project.entry-points."santa_bench.plugins"] mine = "my_package.santa"``) or named on
the command line (``santa-bench --plugin my_package.santa list``, or a file:
``--plugin mine.py``), and then appears in every command like a built-in. The modules
named are remembered in ``$SANTA_BENCH_PLUGINS``, so a sweep's worker processes load
them too.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Iterable
from pathlib import Path

GROUP = "santa_bench.plugins"
ENV = "SANTA_BENCH_PLUGINS"  # comma list of the modules named with --plugin

_loaded: dict[str, str] = {}  # module -> where it was named (entry point or --plugin)


class PluginError(ImportError):
    """A plugin module that cannot be imported."""


def _import_file(path: Path) -> None:
    """Imports the Python file ``path`` as the module named after its stem."""
    if not path.is_file():
        raise FileNotFoundError(f"no such file {path}")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)


def load_module(name: str, origin: str = "--plugin") -> None:
    """Imports the plugin module ``name`` (a dotted name on the path, or a ``.py`` file)
    once; its import registers what it provides."""
    if name in _loaded:
        return
    try:
        if name.endswith(".py"):
            _import_file(Path(name))
        else:
            importlib.import_module(name)
    except Exception as exc:
        raise PluginError(f"{origin} {name}: {type(exc).__name__}: {exc}") from exc
    _loaded[name] = origin


def load_entry_points() -> None:
    """Loads every plugin of the ``santa_bench.plugins`` entry point group."""
    for point in importlib.metadata.entry_points(group=GROUP):
        if point.value in _loaded:
            continue
        try:
            point.load()
        except Exception as exc:
            raise PluginError(f"entry point {point.name} = {point.value}: "
                              f"{type(exc).__name__}: {exc}") from exc
        _loaded[point.value] = f"entry point {point.name}"


def load(modules: Iterable[str] = ()) -> None:
    """Loads the entry point plugins, the modules of ``$SANTA_BENCH_PLUGINS`` and
    ``modules``, and records ``modules`` in ``$SANTA_BENCH_PLUGINS`` for worker processes."""
    load_entry_points()
    named = [m for m in os.environ.get(ENV, "").split(",") if m]
    for module in modules:
        if module not in named:
            named.append(module)
    for module in named:
        load_module(module)
    if named:
        os.environ[ENV] = ",".join(named)


def loaded() -> dict[str, str]:
    """The plugin modules loaded so far, each with where it was named."""
    return dict(_loaded)


def plugin_args(modules: Iterable[str]) -> list[str]:
    """``--plugin MODULE`` for each module outside santa-bench (a command line that
    reproduces a case of a plugin's method or task names the plugin)."""
    own = [m for m in dict.fromkeys(modules) if m and not m.startswith("santa_bench.")]
    return [part for module in own for part in ("--plugin", module)]
