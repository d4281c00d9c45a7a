"""No import cycles among santa_bench's modules (imports inside functions included)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "santa_bench"


def modules(root: Path = PACKAGE) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package ``__init__``)."""
    found = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module -> the package modules importing it executes.

    ``import a.b`` and ``from a.b import c`` reach ``a.b`` (and ``a.b.c`` where that is a
    module) and run the ``__init__`` of every package above it; a module's own packages
    are left out of that (they are initialising already when it runs), but a direct
    ``from its.package import x`` counts.
    """
    mods = modules(root)
    graph: dict[str, set[str]] = {}
    for name, (path, package) in mods.items():
        here = name if package else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                for alias in node.names:  # a submodule, else a name of base
                    submodule = f"{base}.{alias.name}"
                    targets.add(submodule if submodule in mods else base)
        edges = set()
        own = set(_ancestors(name))
        for target in targets:
            while target and target not in mods:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if not target:
                continue
            edges.add(target)
            edges.update(a for a in _ancestors(target) if a in mods and a not in own)
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_santa_bench_has_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_cycle_finder_sees_function_level_and_package_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.a import A\n")
    (pkg / "sub" / "a.py").write_text("A = 1\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.c import C\n")
    (pkg / "c.py").write_text("import pkg.sub.a\n")
    (pkg / "d.py").write_text("from pkg import b\n")
    graph = import_graph(pkg)
    assert graph["pkg.c"] == {"pkg.sub", "pkg.sub.a"}
    assert graph["pkg.d"] == {"pkg.b"}
    assert cycles(graph) == []
    (pkg / "sub" / "a.py").write_text("def g():\n    from .. import d\n")
    assert cycles(import_graph(pkg)) == [["pkg.b", "pkg.c", "pkg.d", "pkg.sub", "pkg.sub.a"]]
