"""A zarr read on zarr's event loop that its reader can leave, and that leaves no request behind.

zarr's ``Array.get_basic_selection`` blocks its thread in ``zarr.core.sync.sync`` until
the whole selection has been read, with no way to stop it, and the ``asyncio.gather``
of the chunk requests inside returns at the first failure while the other requests run
on. So a read in flight when its run was dropped (``close()``, a new epoch, an error in
another window) held its reader for as long as its store's timeouts and retries allow
(minutes with the default :class:`~chunkstream.RemoteOptions`), past ``close()``'s
deadline; and a failed read's leftover requests outlived it, even the source's
``close()``: s3fs opens a new client (and aiohttp session) for a request on a closed
filesystem, which nobody closes.

:func:`read_selection` runs the same coroutine as one task on zarr's loop and tracks
every task it starts (a task factory on zarr's loop, scoped by a context variable the
read's tasks inherit). The reader waits at :data:`~chunkstream._executor.POLL_S`,
asking the stop callable :func:`leave_when` set for the read; once it says stop, the
read's task is cancelled and the reader raises
:class:`~chunkstream._executor.Cancelled`. A read that fails or is cancelled cancels
the tasks it started that are still pending, and waits for them up to :data:`LEAVE_S`,
before the reader returns: nothing of the read writes into the caller's buffer or calls
its store afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import zarr
import zarr.core.sync
from zarr.core.array import AsyncArray
from zarr.core.buffer import default_buffer_prototype
from zarr.core.indexing import BasicIndexer

from .._executor import POLL_S, Cancelled

__all__ = ["LEAVE_S", "changed_internals", "leave_when", "read_selection"]

#: How long the end of a read waits for its cancelled tasks to finish.
LEAVE_S = 2.0

_stop: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar(
    "chunkstream_read_stop", default=None
)
# The tasks of the read running in this task's context (inherited by the tasks it starts).
_scope: contextvars.ContextVar[set[asyncio.Task] | None] = contextvars.ContextVar(
    "chunkstream_read_tasks", default=None
)
_installed: set[int] = set()  # ids of the loops our task factory is on
_install_lock = threading.Lock()


@contextlib.contextmanager
def leave_when(stop: Callable[[], bool]) -> Iterator[None]:
    """Let a :func:`read_selection` inside the block (on this thread) be left once
    ``stop()`` turns true."""
    token = _stop.set(stop)
    try:
        yield
    finally:
        _stop.reset(token)


def _track(loop: asyncio.AbstractEventLoop) -> None:
    """Put a task factory on ``loop`` that adds each task started inside a read's scope to
    that read's set, over any factory already there (on zarr's loop, once)."""
    with _install_lock:
        if id(loop) in _installed:
            return
        previous = loop.get_task_factory()

        def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task:
            if previous is not None:
                task = previous(loop, coro, **kwargs)
            else:
                task = asyncio.Task(coro, loop=loop, **kwargs)
            tasks = _scope.get()
            if tasks is not None:
                tasks.add(task)
            return task

        loop.set_task_factory(factory)
        _installed.add(id(loop))


class _Read:
    """One read's outcome, written on zarr's loop and read by its reader once ``ended``."""

    def __init__(self) -> None:
        self.ended = threading.Event()
        self.error: BaseException | None = None
        self.cancelled = False
        self.task: asyncio.Task | None = None

    def finished(self, task: asyncio.Task) -> None:  # the task's done callback
        self.cancelled = task.cancelled()
        self.ended.set()


async def _scoped(make: Callable[[], Coroutine[Any, Any, Any]], read: _Read) -> None:
    """``await make()``; if it fails or is cancelled, cancel (and wait for) every task it
    started that is still pending. After a success every request has ended; what is still
    pending was meant to outlive the read (the node-local cache's entry writes)."""
    tasks: set[asyncio.Task] = set()
    _scope.set(tasks)  # this task's own context: the tasks it starts inherit the set
    try:
        await make()
    except BaseException as exc:
        # kept for the reader, not raised out of the task (asyncio would log it unretrieved);
        # a cancellation is raised on, so that the task ends cancelled
        read.error = exc
        pending = [task for task in tasks if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=LEAVE_S)
        if isinstance(exc, asyncio.CancelledError):
            raise


# The zarr internals a leavable read calls, as ``get_basic_selection`` calls them
# (zarr 3.1): checked once, so a zarr that changed them reads through zarr's own
# ``get_basic_selection`` (correct, only no longer leavable) instead of failing.
_SELECTION_PARAMS = ("self", "indexer", "prototype", "out", "fields")


def changed_internals() -> list[str]:
    """The zarr internals :func:`read_selection` calls that this zarr lacks as called."""
    changed = []
    method = getattr(AsyncArray, "_get_selection", None)
    if method is None or tuple(inspect.signature(method).parameters) != _SELECTION_PARAMS:
        changed.append(f"AsyncArray._get_selection{_SELECTION_PARAMS}")
    for name in ("_get_loop", "_get_executor", "_executor"):
        if not hasattr(zarr.core.sync, name):
            changed.append(f"zarr.core.sync.{name}")
    return changed


@functools.cache
def _leavable() -> bool:
    return not changed_internals()


def read_selection(array: zarr.Array, selection: Any, out: Any) -> None:
    """``array.get_basic_selection(selection, out=out)`` (``out`` an ``NDBuffer``), left
    with :class:`~chunkstream._executor.Cancelled` once the :func:`leave_when` stop says so
    (see the module docs); zarr's own call, not leavable, under a zarr whose internals
    changed (:func:`changed_internals`)."""
    if not _leavable():
        array.get_basic_selection(selection, out=out)
        return

    loop = zarr.core.sync._get_loop()
    if zarr.core.sync._executor is None and zarr.config.get("threading.max_workers") is not None:
        zarr.core.sync._get_executor()  # as zarr's sync() does: the loop's decode threads
    _track(loop)
    indexer = BasicIndexer(selection, array.shape, array.metadata.chunk_grid)
    prototype = default_buffer_prototype()
    read = _Read()

    def make() -> Coroutine[Any, Any, Any]:  # made on the loop: no coroutine left unawaited
        return array.async_array._get_selection(indexer, out=out, prototype=prototype)

    def start() -> None:
        # a fresh context: the read's scope is its own, whatever the loop thread ran before
        read.task = loop.create_task(_scoped(make, read), context=contextvars.Context())
        read.task.add_done_callback(read.finished)

    def cancel() -> None:  # after start(): the loop runs its callbacks in order
        if read.task is not None:
            read.task.cancel()

    loop.call_soon_threadsafe(start)
    stop = _stop.get()
    left = False
    try:
        while not read.ended.wait(POLL_S):
            if stop is not None and stop():
                left = True
                break
    finally:
        if not read.ended.is_set():  # left, or interrupted (KeyboardInterrupt): cancel it
            loop.call_soon_threadsafe(cancel)
            read.ended.wait(LEAVE_S + POLL_S)
    if left:
        raise Cancelled("the read was left: its run was dropped or its loader closed")
    if read.cancelled or isinstance(read.error, asyncio.CancelledError):
        # cancelled by someone else (zarr's loop stopping at exit)
        raise Cancelled("the read's task on zarr's event loop was cancelled")
    if read.error is not None:
        raise read.error
