"""The import graph of ``src/chunkstream``, read with ``ast`` (no module is imported).

Used by ``tests/test_structure.py``. A module is named by its dotted path under the
package (``pipeline._loader``; a package by its folder, ``pipeline``). Every import
counts, at the top of a module or inside a function: an import deferred into a
function to break a circle still makes the two modules depend on each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "chunkstream"


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(importer: str, is_package: bool, level: int, module: str | None) -> str:
    """The absolute dotted name (under the package) a relative import refers to."""
    base = importer.split(".") if importer else []
    if not is_package:
        base = base[:-1]  # a module's relative imports start from its package
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, *(module.split(".") if module else [])])


def imports(package: Path = PACKAGE) -> dict[str, list[tuple[str, int]]]:
    """Module -> ``(imported module, line)`` for every import of another chunkstream
    module (``from . import x`` counts as importing ``x`` where ``x`` is a module)."""
    names = {module_name(p, package): p for p in package.rglob("*.py")}
    graph: dict[str, list[tuple[str, int]]] = {}
    for name, path in names.items():
        is_package = path.name == "__init__.py"
        edges = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level == 0:
                    if not (node.module or "").startswith("chunkstream"):
                        continue
                    target = (node.module or "").removeprefix("chunkstream").lstrip(".")
                else:
                    target = _resolve(name, is_package, node.level, node.module)
                for alias in node.names:  # `from . import _x` imports the module _x
                    sub = f"{target}.{alias.name}" if target else alias.name
                    edges.append((sub if sub in names else target, node.lineno))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("chunkstream."):
                        edges.append((alias.name.removeprefix("chunkstream."), node.lineno))
        graph[name] = [(t, line) for t, line in edges if t in names and t != name]
    return graph


def cycles(graph: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan), each sorted."""
    edges = {m: sorted({t for t, _ in targets}) for m, targets in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
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

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def package_of(module: str, packages: set[str]) -> str:
    """The package a module belongs to (a package belongs to itself)."""
    return module if module in packages else module.rpartition(".")[0]


def private_imports(graph: dict[str, list[tuple[str, int]]], package: Path = PACKAGE):
    """``(importer, imported, line)`` for every import of a private module (its name
    starts with ``_``) of a package that is neither the importer's nor one enclosing it:
    the rest of chunkstream imports a package through its ``__init__``."""
    packages = {module_name(p, package) for p in package.rglob("__init__.py")}
    found = []
    for importer, targets in sorted(graph.items()):
        home = package_of(importer, packages)
        for target, line in targets:
            if target in packages or not target.rpartition(".")[2].startswith("_"):
                continue
            owner = target.rpartition(".")[0]
            if owner == home or home.startswith(owner + ".") or owner == "":
                continue
            found.append((importer, target, line))
    return found
