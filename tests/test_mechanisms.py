"""Every concurrency mechanism in ``src/`` is written down: docs/architecture.md's table.

The table under "The concurrency ideas" names, per row, each owner module and the
primitives *that module* uses for the row's idea; this test reads that from the page
and scans every module with ``ast`` (:mod:`tests.mechanisms`, which lists the kinds
it knows: threads, locks, conditions, events, queues, futures, executors, sleeps,
calls onto an event loop, file locks, finalizers, CUDA streams and events, and waits
with no timeout). A module that uses a primitive no row names for it fails, even
when a row of that module names the primitive for another module; so does a row
naming a primitive its module no longer uses, or a module that does not exist.
Reconciling after a refactor is an edit of the page.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.mechanisms import KINDS, table, used

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "chunkstream"
PAGE = ROOT / "docs" / "architecture.md"
MAX_ROWS = 12


def permitted(page: Path) -> dict[str, set[str]]:
    """Module (path under ``src/chunkstream``) -> the primitives its rows name for it."""
    out: dict[str, set[str]] = {}
    for _, _, modules in table(page):
        for module, kinds in modules.items():
            out.setdefault(module, set()).update(kinds)
    return out


def unnamed(package: Path, page: Path) -> dict[str, list[str]]:
    """Module -> the primitives it uses that no row of ``page`` names for it."""
    allowed = permitted(page)
    found = {}
    for path in sorted(package.rglob("*.py")):
        module = path.relative_to(package).as_posix()
        extra = used(path) - allowed.get(module, set())
        if extra:
            found[module] = sorted(extra)
    return found


def test_the_table_has_at_most_twelve_rows_and_names_real_modules():
    rows = table(PAGE)
    assert 0 < len(rows) <= MAX_ROWS, [r[0] for r in rows]
    for number, primitives, modules in rows:
        assert modules, f"row {number} names no owner module"
        for module, kinds in modules.items():
            assert (PACKAGE / module).is_file(), f"row {number}: no module {module}"
            assert kinds, f"row {number}: {module} has no primitive of the row"
            assert kinds <= KINDS, f"row {number}: not a primitive {kinds - KINDS}"
        listed = set().union(*modules.values())
        assert primitives == listed, (
            f"row {number}: the primitives column {sorted(primitives)} is not the union "
            f"of its modules' {sorted(listed)}"
        )


def test_every_module_uses_only_the_primitives_its_own_rows_name_for_it():
    found = unnamed(PACKAGE, PAGE)
    assert not found, (
        f"modules use concurrency primitives docs/architecture.md does not name for them "
        f"(add the primitive after the module in a row of 'The concurrency ideas', or "
        f"a row): {found}"
    )


def test_every_primitive_a_row_names_for_a_module_is_still_used_there():
    for number, _, modules in table(PAGE):
        for module, kinds in modules.items():
            stale = kinds - used(PACKAGE / module)
            assert not stale, (
                f"row {number} names {sorted(stale)} for {module}, which no longer uses them"
            )


PLANTS = [
    # The first two pass a check by the row's union (what the page once did): row 4
    # names cuda.Event for pipeline/_jobs.py and cuda.Stream for pipeline/_loader.py.
    ("pipeline/_chunk.py", "import torch\nS = torch.cuda.Stream()\n", "cuda.Stream"),
    ("pipeline/_resident.py", "import torch\nE = torch.cuda.Event()\n", "cuda.Event"),
    # row 10 names sync for the cache and the remote store, not for the retry loop
    ("sources/_read.py", "from zarr.core.sync import sync\nsync(None)\n", "sync"),
    # row 7 names Lock for pipeline/_run.py; a Condition is no row's for it
    ("pipeline/_run.py", "import threading\nC = threading.Condition()\n", "Condition"),
    # a wait with no timeout where row 2 says every wait polls
    ("pipeline/_loader.py", "def f(future):\n    return future.result()\n", "result()"),
    ("plans/_plan.py", "import fcntl\nfcntl.flock(0, fcntl.LOCK_EX)\n", "flock"),
    # a subclass of a primitive is one (the executors' GatedFuture is a Future)
    (
        "plans/_windows.py",
        "from concurrent.futures import Future\nclass F(Future):\n    pass\n",
        "Future",
    ),
    ("stats/_trace.py", "class K:\n    def __del__(self):\n        pass\n", "__del__"),
]


@pytest.mark.parametrize(("module", "planted", "kind"), PLANTS, ids=[p[2] for p in PLANTS])
def test_a_primitive_planted_where_its_row_does_not_name_it_fails(tmp_path, module, planted, kind):
    package = tmp_path / "chunkstream"  # the module alone, at its place in the package
    target = package / module
    target.parent.mkdir(parents=True)
    shutil.copyfile(PACKAGE / module, target)
    assert unnamed(package, PAGE) == {}  # as it is, the module passes
    target.write_text(target.read_text() + "\n\n" + planted)
    assert unnamed(package, PAGE) == {module: [kind]}


def test_the_scan_sees_what_it_looks_for(tmp_path):
    sample = tmp_path / "m.py"
    sample.write_text(
        "import threading, time, torch, atexit, weakref, fcntl, asyncio\n"
        "import zarr.core.sync\n"
        "from concurrent.futures import ThreadPoolExecutor as TPE, wait\n"
        "from zarr.core.sync import collect_aiterator\n"
        "threading.Lock(); time.sleep(1); torch.cuda.Event(); torch.cuda.Stream()\n"
        "weakref.finalize(object(), print); TPE(2); wait([])\n"
        "fcntl.flock(0, fcntl.LOCK_SH); zarr.core.sync.sync(None, timeout=1)\n"
        "collect_aiterator(None); asyncio.gather(); loop.create_task(None)\n"
        "stream.wait_event(e); s.wait_stream(t); x.record_stream(s); e.synchronize()\n"
        "with torch.cuda.stream(s):\n    pass\n"
        "future.result(); future.result(timeout=0); ev.wait(); ev.wait(0.1)\n"
        "thread.join(); ', '.join([]); settle(f.result for f in fs)\n"
        "HashStream(1); obj.register(2); Event(); Queue()\n"
        "@atexit.register\ndef f(): pass\n"
        "class K:\n    def __del__(self): pass\n"
    )
    assert used(sample) == {
        "Lock", "sleep", "cuda.Event", "cuda.Stream", "finalize", "ThreadPoolExecutor",
        "wait", "flock", "sync", "collect_aiterator", "gather", "create_task", "wait_event",
        "wait_stream", "record_stream", "synchronize", "cuda.stream", "result()", "wait()",
        "join()", "atexit", "__del__",
    }  # fmt: skip
