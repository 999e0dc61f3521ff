"""Code-shape figures of ``src/chunkstream``.

    python -m benchmarks.code_metrics [SRC]    # prints the figures; exit 1 if a limit is broken

Reported: lines per file and per function (decorators and docstrings included)
and the lines of ``pipeline/`` plus ``compat`` by kind (code, docstring,
comment, blank). These are figures, not limits: the line-count limits of the
earlier restructuring are retired, and the formatter lays out the code.

Limits (issue 27's done-when list): import circles among modules (every import
statement, function-local and ``TYPE_CHECKING`` ones included) and imports of
another package's underscore module (``chunkstream.a._x`` importing
``chunkstream.b._y``) are 0; in ``pipeline/``, ``_memory/`` and ``_executor.py``
no ``add_done_callback``, ``RLock``, ``WeakSet`` or ``WeakKeyDictionary``; no
``isinstance`` on a plan type and no ``getattr`` on a plan outside ``plans/``;
one ``feistel`` call site; no ``# fmt: skip`` (a table that reads better may keep
one, with its reason on the line). A module's package is its first folder under
``chunkstream``; the root modules (``_errors`` and the like) and the faces of the
root underscore packages (``_memory``) are the shared base every package may import.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src" / "chunkstream"
# Reported sizes (not limits), and the limits.
SIZES = {"file_lines": 450, "function_lines": 80}
LIMITS = {
    "import_circles": 0,
    "cross_package_private_imports": 0,
    "run_machinery": 0,
    "plan_probes": 0,
    "feistel_call_sites": 1,
    "fmt_skip": 0,
}


def _module(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(module: str, root: Path) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (root / parts[1]).is_dir()) else ""


def _imports(path: Path, module: str, is_package: bool, known: set[str]) -> set[str]:
    """Modules of chunkstream that ``module`` imports at module level."""
    base = module.split(".") if is_package else module.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                target = ".".join(
                    base[: len(base) - node.level + 1] + ([node.module] if node.module else [])
                )
            else:
                target = node.module or ""
            if target.startswith("chunkstream"):
                # ``from pkg import module`` needs the module (pkg is already running or
                # loaded); ``from pkg import name`` needs pkg itself.
                named = {f"{target}.{a.name}" for a in node.names}
                found = named & known
                out.update(found if found else {target})
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("chunkstream"))
    return out


def _long_functions(tree: ast.AST) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = (node.end_lineno or node.lineno) - first + 1
            if length > SIZES["function_lines"]:
                out.append((node.name, length))
    return out


def structure(root: Path | None = None) -> tuple[list[list[str]], list[str]]:
    """The import circles (each a sorted list of modules) and the imports of another
    package's underscore module (``"a -> b"``) of the package at ``root``."""
    root = ROOT if root is None else root
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    modules = {_module(p, root): p for p in files}
    graph: dict[str, set[str]] = {}
    private: list[str] = []
    for module, path in modules.items():
        targets = _imports(path, module, path.name == "__init__.py", set(modules))
        # Parents are imported too, but a package's __init__ is not a dependency cycle edge
        # of its own submodules: keep only the modules named.
        graph[module] = {t for t in targets if t in modules and t != module}
        mine = _package(module, root)
        for target in sorted(t for t in targets if t in modules):
            name = target.split(".")[-1]
            theirs = _package(target, root)
            # A root module (``_errors``) or a root package's face (``_memory``) is the
            # shared base; a module inside another package is not.
            if name.startswith("_") and theirs and theirs != mine and target.count(".") > 1:
                private.append(f"{module} -> {target}")
    # Edges into a package stand for its __init__; circles through an __init__ that only
    # re-exports are real at import time, so they are kept.
    return sorted(_circles(graph)), private


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    return found


def _kinds(text: str) -> dict[str, int]:
    """A file's lines by kind: code, docstring, comment, blank."""
    lines = text.splitlines()
    doc: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if (isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):  # fmt: skip
            doc.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    blank = sum(1 for k, line in enumerate(lines, 1) if not line.strip() and k not in doc)
    comment = sum(1 for k, line in enumerate(lines, 1)
                  if line.strip().startswith("#") and k not in doc)  # fmt: skip
    return {"code": len(lines) - blank - comment - len(doc), "docstring": len(doc),
            "comment": comment, "blank": blank}  # fmt: skip


def measure() -> dict:
    files = sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)
    modules = {_module(p, ROOT): p for p in files}
    long_files, long_funcs = [], []
    for module, path in modules.items():
        text = path.read_text()
        lines = text.count("\n")
        if lines > SIZES["file_lines"]:
            long_files.append((module, lines))
        long_funcs += [(f"{module}.{name}", n) for name, n in _long_functions(ast.parse(text))]
    circles, private = structure(ROOT)
    # compat is a module or a package, depending on the version measured.
    both = [p for m, p in modules.items()
            if m.startswith(("chunkstream.pipeline", "chunkstream.compat"))]  # fmt: skip
    pc_lines = sum(p.read_text().count("\n") for p in both)
    kinds: dict[str, int] = {}
    for path in both:
        for kind, n in _kinds(path.read_text()).items():
            kinds[kind] = kinds.get(kind, 0) + n
    return {
        "files_over_450": long_files,
        "functions_over_80": long_funcs,
        "pipeline_compat_lines": pc_lines,
        "pipeline_compat_kinds": kinds,
        "import_circles": circles,
        "cross_package_private_imports": private,
    }


def _lines_matching(paths: list[Path], pattern: str) -> list[str]:
    import re

    rx = re.compile(pattern)
    return [
        f"{p.relative_to(ROOT.parent)}:{k}"
        for p in paths
        for k, line in enumerate(p.read_text().splitlines(), 1)
        if rx.search(line) and not line.lstrip().startswith("#")
    ]


def shape() -> dict:
    """Issue 27's structure checks: each a list of the offending lines."""
    files = sorted(ROOT.rglob("*.py"))
    core = [p for p in files if p.parts[len(ROOT.parts)] in ("pipeline", "_memory", "_executor.py")]
    outside_plans = [p for p in files if p.parts[len(ROOT.parts)] != "plans"]
    skips = [f for f in _lines_matching(files, r"# fmt: skip") if "# fmt: skip:" not in f]
    return {
        "run_machinery": _lines_matching(
            core, r"add_done_callback|RLock|WeakSet|WeakKeyDictionary"
        ),
        "plan_probes": _lines_matching(
            outside_plans,
            r"isinstance\([^,]+,[^)]*(?<!Epoch)Plan\b|getattr\((self\.)?(_?plan|loader\.plan)\b",
        ),
        "feistel_call_sites": _lines_matching(files, r"(?<!def )\bfeistel\("),
        "fmt_skip": _lines_matching(files, r"# fmt: skip"),
    } | ({"fmt_skip_without_reason": skips} if skips else {})


def main(argv: list[str] | None = None) -> int:
    global ROOT
    args = sys.argv[1:] if argv is None else argv
    if args:
        ROOT = Path(args[0]).resolve() / "chunkstream"
    got = measure()
    print(f"files over {SIZES['file_lines']} lines: {len(got['files_over_450'])}",
          *(f"  {m}: {n}" for m, n in got["files_over_450"]), sep="\n")  # fmt: skip
    print(f"functions over {SIZES['function_lines']} lines: {len(got['functions_over_80'])}",
          *(f"  {m}: {n}" for m, n in got["functions_over_80"]), sep="\n")  # fmt: skip
    print(f"pipeline/ + compat lines: {got['pipeline_compat_lines']}; of which "
          + ", ".join(f"{kind} {n}" for kind, n in got["pipeline_compat_kinds"].items()))  # fmt: skip
    print(f"import circles: {len(got['import_circles'])}",
          *(f"  {' <-> '.join(c)}" for c in got["import_circles"]), sep="\n")  # fmt: skip
    print(f"cross-package underscore imports: {len(got['cross_package_private_imports'])}",
          *(f"  {i}" for i in got["cross_package_private_imports"]), sep="\n")  # fmt: skip
    ok = not got["import_circles"] and not got["cross_package_private_imports"]
    for name, lines in shape().items():
        limit = LIMITS.get(name, 0)
        print(f"{name}: {len(lines)} (limit {limit})", *(f"  {x}" for x in lines), sep="\n")
        ok = ok and len(lines) <= limit
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
