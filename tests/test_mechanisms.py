"""Every concurrency mechanism in ``src/`` is written down: docs/architecture.md's table.

The table under "The concurrency ideas" names, per row, the primitives its owner
modules may use; this test reads that mapping from the page and scans every
module with ``ast``. A module that uses a primitive no row names for it fails, and
so does a row naming a primitive none of its modules uses any more, or a module
that does not exist. Reconciling after a refactor is an edit of the page.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "chunkstream"
PAGE = ROOT / "docs" / "architecture.md"
MAX_ROWS = 12

# Call names that are concurrency primitives, by their last dotted component. ``Event``
# and ``Stream`` under a ``cuda`` prefix are CUDA's; ``register`` counts only as
# ``atexit.register``; ``synchronize`` is a device or stream synchronize.
_PRIMITIVES = {
    "Thread",
    "Timer",
    "Lock",
    "RLock",
    "Condition",
    "Event",
    "Semaphore",
    "BoundedSemaphore",
    "Barrier",
    "local",
    "Executor",
    "ThreadPoolExecutor",
    "ProcessPoolExecutor",
    "Future",
    "sleep",
    "finalize",
    "SimpleQueue",
    "Queue",
    "synchronize",
    "Stream",
    "register",
    "start_new_thread",
    "interrupt_main",
}


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _primitive(name: str) -> str | None:
    last = name.rsplit(".", 1)[-1]
    if last not in _PRIMITIVES:
        return None
    if last in ("Event", "Stream") and "cuda" in name.split("."):
        return f"cuda.{last}"
    if last == "Stream":
        return None  # a stream of another kind (random draws): not CUDA's
    if last == "register":
        return "atexit" if name.startswith("atexit") else None
    if last == "Queue" and not name.startswith("queue"):
        return None
    return last


def used(path: Path) -> set[str]:
    """The primitives ``path`` calls (or applies as a decorator), through import aliases."""
    tree = ast.parse(path.read_text(), str(path))
    aliases = {
        alias.asname: alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
        if alias.asname
    }
    # A bare name counts only when imported (``from threading import Event``): a class
    # of the module's own that shares a primitive's name (the mixer's ``Event``) is not one.
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Call):
            names.append(_dotted(node.func))
            # a dataclass field made by a primitive: field(default_factory=threading.Lock)
            names += [_dotted(k.value) for k in node.keywords if k.arg == "default_factory"]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names += [_dotted(d) for d in node.decorator_list]
        for name in names:
            head, _, rest = name.partition(".")
            if head not in imported:
                continue
            name = aliases.get(head, head) + (f".{rest}" if rest else "")
            primitive = _primitive(name)
            if primitive is not None:
                found.add(primitive)
    return found


def table() -> list[tuple[str, set[str], list[str]]]:
    """``(row, primitives, owner modules)`` for every row of the page's table."""
    text = PAGE.read_text()
    section = text.split("## The concurrency ideas", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].isdigit():
            continue
        number, _, primitives, _, owner = cells
        rows.append(
            (number, set(re.findall(r"`([^`]+)`", primitives)), re.findall(r"`([^`]+)`", owner))
        )
    return rows


def allowed() -> dict[str, set[str]]:
    """Module (path under ``src/chunkstream``) -> the primitives the page names for it."""
    out: dict[str, set[str]] = {}
    for _, primitives, owners in table():
        for module in owners:
            out.setdefault(module, set()).update(primitives)
    return out


def test_the_table_has_at_most_twelve_rows_and_names_real_modules():
    rows = table()
    assert 0 < len(rows) <= MAX_ROWS, [r[0] for r in rows]
    for number, primitives, owners in rows:
        assert owners, f"row {number} names no owner module"
        for module in owners:
            assert (PACKAGE / module).is_file(), f"row {number}: no module {module}"
        unknown = {p for p in primitives if p not in {"cuda.Event", "cuda.Stream", "atexit"}}
        assert unknown <= _PRIMITIVES, f"row {number}: not a primitive {unknown - _PRIMITIVES}"


def test_every_module_uses_only_the_primitives_the_page_names_for_it():
    permitted = allowed()
    unnamed = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        extra = used(path) - permitted.get(module, set())
        if extra:
            unnamed[module] = sorted(extra)
    assert not unnamed, (
        f"modules use concurrency primitives docs/architecture.md does not name for them "
        f"(add the module, or the primitive, to a row of 'The concurrency ideas'): {unnamed}"
    )


def test_every_primitive_the_page_names_is_still_used_by_its_row():
    for number, primitives, owners in table():
        in_use = set().union(*(used(PACKAGE / m) for m in owners if (PACKAGE / m).is_file()))
        stale = primitives - in_use
        assert not stale, f"row {number} names {sorted(stale)}, which none of {owners} uses"


def test_the_scan_sees_what_it_looks_for(tmp_path):
    sample = tmp_path / "m.py"
    sample.write_text(
        "import threading, time, torch, atexit, weakref\n"
        "from concurrent.futures import ThreadPoolExecutor as TPE\n"
        "threading.Lock(); time.sleep(1); torch.cuda.Event(); torch.cuda.Stream()\n"
        "weakref.finalize(object(), print); TPE(2)\n"
        "HashStream(1); obj.register(2)\n"
        "@atexit.register\ndef f(): pass\n"
    )
    expected = {"Lock", "sleep", "cuda.Event", "cuda.Stream", "finalize", "atexit"}
    assert used(sample) == expected | {"ThreadPoolExecutor"}
