"""The concurrency mechanisms a module uses, found with ``ast``; and the page's table.

Used by ``tests/test_mechanisms.py``. A *kind* is one named primitive: what the page's
table writes in backticks. The scan resolves every call through the module's imports
(``from zarr.core.sync import sync``, ``import threading as th``), so a name counts
only when it is the library's primitive, not a class of the module's own that shares
its name (the mixer's ``Event``), and it knows these kinds:

* threads and their synchronisation: ``Thread``, ``Timer``, ``Lock``, ``RLock``,
  ``Condition``, ``Event``, ``Semaphore``, ``BoundedSemaphore``, ``Barrier``,
  ``local``, ``start_new_thread``, ``interrupt_main``;
* queues, futures and executors: ``SimpleQueue``, ``Queue``, ``Future`` (and
  chunkstream's ``GatedFuture``), ``Executor`` (chunkstream's), ``ThreadPoolExecutor``,
  ``ProcessPoolExecutor``, ``wait`` and ``as_completed`` of ``concurrent.futures``; a
  class deriving from one of these uses it;
* time: ``sleep`` (``time.sleep`` and ``asyncio.sleep``);
* calls onto an event loop: ``sync`` and ``collect_aiterator`` (zarr's loop thread),
  ``create_task`` (a task on the running loop, whatever the receiver),
  ``asyncio.gather``, ``run_coroutine_threadsafe``, ``call_soon_threadsafe``;
* file locks between processes: ``flock``, ``lockf`` (``fcntl``);
* finalizers: ``finalize`` (``weakref``), ``atexit`` (``atexit.register``), ``__del__``
  (a method of that name);
* CUDA: ``cuda.Stream``, ``cuda.Event``, ``cuda.stream`` (the context that makes a
  stream current), ``synchronize``, ``wait_event``, ``wait_stream`` and
  ``record_stream`` (each whatever the receiver: only CUDA objects have them here);
* waits with no timeout: ``result()``, ``exception()``, ``wait()`` and ``join()``
  called with no argument, and a bound ``.result`` handed on uncalled (to be called
  so later, as ``settle`` does).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

# Kinds found by the last component of a call's resolved name.
BY_NAME = {
    "Thread",
    "Timer",
    "Lock",
    "RLock",
    "Condition",
    "Semaphore",
    "BoundedSemaphore",
    "Barrier",
    "local",
    "start_new_thread",
    "interrupt_main",
    "SimpleQueue",
    "Future",
    "Executor",
    "ThreadPoolExecutor",
    "ProcessPoolExecutor",
    "sleep",
    "finalize",
    "flock",
    "lockf",
    "run_coroutine_threadsafe",
}
# Kinds found by a method's name on any receiver.
METHODS = {
    "create_task",
    "call_soon_threadsafe",
    "synchronize",
    "wait_event",
    "wait_stream",
    "record_stream",
}
# Waits that block until their object is done when called with no argument.
UNTIMED = {"result", "exception", "wait", "join"}

KINDS = (
    BY_NAME
    | METHODS
    | {f"{m}()" for m in UNTIMED}
    | {"Event", "Queue", "wait", "as_completed", "gather", "sync", "collect_aiterator"}
    | {"cuda.Event", "cuda.Stream", "cuda.stream", "atexit", "__del__"}
)


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _imports(tree: ast.AST) -> dict[str, str]:
    """Local name -> what it names (``sync`` -> ``zarr.core.sync.sync``; a relative
    import keeps its leading dots: ``Executor`` -> ``.._executor.Executor``)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:  # ``import zarr.core.sync`` binds ``zarr``
                    head = alias.name.split(".", 1)[0]
                    names[head] = head
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            for alias in node.names:
                names[alias.asname or alias.name] = f"{module}.{alias.name}"
    return names


def _kind(name: str) -> str | None:
    """The kind a call of the resolved ``name`` is, if any."""
    parts = name.split(".")
    last = parts[-1]
    if last in ("Event", "Stream", "stream") and "cuda" in parts:
        return f"cuda.{last}"
    if last == "Event":
        return "Event" if parts[0] in ("threading", "asyncio") else None
    if last == "Queue":
        return "Queue" if parts[0] in ("queue", "asyncio") else None
    if last in ("wait", "as_completed"):
        return last if name.startswith("concurrent.futures") else None
    if last == "gather":
        return "gather" if parts[0] == "asyncio" else None
    if last in ("sync", "collect_aiterator"):
        return last if parts[0] == "zarr" else None
    if last == "register":
        return "atexit" if parts[0] == "atexit" else None
    if last == "GatedFuture":
        return "Future"  # chunkstream's own Future (_executor.py), waited for on its gate
    if last == "Executor" and parts[0] != "concurrent":
        return "Executor"  # chunkstream's own (concurrent.futures.Executor is abstract)
    return last if last in BY_NAME else None


def used(path: Path) -> set[str]:
    """The kinds of mechanism ``path`` uses (see the module docstring)."""
    tree = ast.parse(path.read_text(), str(path))
    imports = _imports(tree)
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    found: set[str] = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Call):
            names.append(_dotted(node.func))
            # a dataclass field made by a primitive: field(default_factory=threading.Lock)
            names += [_dotted(k.value) for k in node.keywords if k.arg == "default_factory"]
            if isinstance(node.func, ast.Attribute):
                method = node.func.attr
                if method in METHODS:
                    found.add(method)
                if method in UNTIMED and not node.args and not node.keywords:
                    found.add(f"{method}()")
        elif isinstance(node, ast.Attribute) and node.attr == "result" and id(node) not in called:
            found.add("result()")  # a bound .result handed on, to be called later
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names += [_dotted(d) for d in node.decorator_list]
            if isinstance(node, ast.ClassDef):  # a subclass of a primitive is one
                names += [_dotted(b) for b in node.bases]
            if node.name == "__del__":
                found.add("__del__")
        elif isinstance(node, ast.With | ast.AsyncWith):
            names += [_dotted(item.context_expr.func) for item in node.items
                      if isinstance(item.context_expr, ast.Call)]  # fmt: skip
        for name in names:
            head, _, rest = name.partition(".")
            if head not in imports:
                continue  # a local object's method, or a class of the module's own
            kind = _kind(imports[head] + (f".{rest}" if rest else ""))
            if kind is not None:
                found.add(kind)
    return found


def table(page: Path) -> list[tuple[str, set[str], dict[str, set[str]]]]:
    """``(row, primitives, {module: its primitives})`` for every row of the page's
    concurrency table. The owner cell lists ``module: kind, kind; module: ...``; a
    row with one module may name it alone, its kinds then being the row's."""
    text = page.read_text()
    section = text.split("## The concurrency ideas", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].isdigit():
            continue
        number, _, primitives_cell, _, owner = cells
        primitives = set(re.findall(r"`([^`]+)`", primitives_cell))
        modules: dict[str, set[str]] = {}
        for part in owner.split(";"):
            ticks = re.findall(r"`([^`]+)`", part)
            if not ticks:
                continue
            module, kinds = ticks[0], set(ticks[1:])
            modules[module] = kinds if ":" in part else set(primitives)
        rows.append((number, primitives, modules))
    return rows
