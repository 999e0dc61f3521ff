"""An epoch as a run of futures on long-lived executors.

:class:`Executor`: named daemon threads (a read that never returns cannot keep
the interpreter alive), started at construction, each call's value or error
carried in its :class:`~concurrent.futures.Future`. :class:`EpochRun`: one
epoch's windows as two bounded deques of futures, reads (at most ``depth``) and,
with a copy stage, copies chained to their reads (at most ``copy_depth``); at
most ``depth + copy_depth`` windows are in flight. When a run is dropped, reads
not started are cancelled, a read result nobody will consume goes to
``reclaim`` exactly once, and a copy not started sees ``dropped()`` and gives
its buffer back itself.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import traceback
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from itertools import takewhile
from typing import Any

from .._errors import LoaderClosedError
from ..plans import EpochSpan

__all__ = ["POLL_S", "EpochIterator", "EpochRun", "Executor", "shutdown", "thread_stack"]

POLL_S = 0.1  # every wait in the pipeline polls at this interval (errors, close, watchdog)


def thread_stack(thread: threading.Thread, doing: str) -> str | None:
    """``thread``'s current stack under a heading naming what it is ``doing`` (for a
    watchdog's error); ``None`` once the thread has ended."""
    frame = sys._current_frames().get(thread.ident) if thread.ident is not None else None
    if frame is None:
        return None
    return f'Thread "{thread.name}" ({doing}):\n' + "".join(traceback.format_stack(frame))


class Executor:
    """``workers`` daemon threads named ``chunkstream-<name>-<k>`` running submitted calls.

    ``init`` runs at the start of each thread; if it raises, that error is
    ``fatal`` and fails every later future and every one the failed thread takes.
    """

    def __init__(self, name: str, workers: int, init: Callable[[], None] | None = None) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[tuple[Future, Callable, tuple, str] | None]
        self._queue = queue.SimpleQueue()
        self._busy: dict[threading.Thread, str] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._init = init
        self.fatal: BaseException | None = None
        self.last_progress = time.monotonic()
        self.completed = 0  # calls that returned without error, over the executor's life
        self.threads = tuple(
            threading.Thread(target=self._work, name=f"chunkstream-{name}-{k}", daemon=True)
            for k in range(workers)
        )
        for thread in self.threads:
            thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any, what: str = "",
               future: Future | None = None) -> Future:  # fmt: skip
        """Run ``fn(*args)`` in a worker; its value or exception lands in ``future``."""
        future = Future() if future is None else future
        if self.fatal is not None:
            future.set_exception(self.fatal)
        elif self._closed:
            future.set_exception(LoaderClosedError(f"the {self.name} executor is closed"))
        else:
            self._queue.put((future, fn, args, what))
        return future

    def _work(self) -> None:
        me = threading.current_thread()
        failed: BaseException | None = None
        if self._init is not None:
            try:
                self._init()
            except BaseException as exc:  # a thread boundary: handed on through futures
                failed = exc
                if self.fatal is None:
                    self.fatal = exc
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._run_one(me, *item, failed)
            # Locals die with _run_one: a finished value (the user's tensors) must not
            # stay referenced by an idle thread, or its buffers could not be reused.
            del item

    def _run_one(self, me: threading.Thread, future: Future, fn: Callable, args: tuple,
                 what: str, failed: BaseException | None) -> None:  # fmt: skip
        if not future.set_running_or_notify_cancel():
            return
        if failed is not None:
            future.set_exception(failed)
            return
        with self._lock:
            self._busy[me] = what
        try:
            value = fn(*args)
        except BaseException as exc:  # a thread boundary: the future carries it
            future.set_exception(exc)
        else:
            self.completed += 1
            future.set_result(value)
        finally:
            with self._lock:
                self._busy.pop(me, None)
            self.last_progress = time.monotonic()

    def busy_stacks(self) -> list[str]:
        """Stacks of the threads now inside a call, for the no-progress watchdog."""
        with self._lock:
            busy = dict(self._busy)
        stacks = (thread_stack(thread, what) for thread, what in busy.items())
        return [stack for stack in stacks if stack is not None]

    def close(self, deadline: float) -> list[str]:
        """Cancel queued calls, stop the threads, join them until ``deadline`` (monotonic);
        returns the names of threads still alive (inside a call). Idempotent."""
        self._closed = True
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in self.threads:
            self._queue.put(None)
        for thread in self.threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in self.threads if t.is_alive()]


class EpochRun:
    """One epoch's windows as bounded deques of futures (see the module docs).

    ``read(window, dropped)`` runs in ``readers``, then ``copy(result, dropped)`` in
    ``copier``; ``reclaim(result)`` gives back an unconsumed result's buffer.
    """

    def __init__(self, windows: Sequence[Any], *, read: Callable[[Any, Callable[[], bool]], Any],
                 readers: Executor, depth: int, copy: Callable[..., Any] | None = None,
                 copier: Executor | None = None, copy_depth: int = 1,
                 reclaim: Callable[[Any], None] | None = None) -> None:  # fmt: skip
        self._windows = windows
        self._read, self._readers, self._depth = read, readers, depth
        self._copy, self._copier, self._copy_depth = copy, copier, copy_depth
        self._reclaim = reclaim
        self._next = 0
        self._reads: deque[Future] = deque()
        self._copies: deque[Future] = deque()
        # Weak: a strong reference to a done read would keep the user's tensors' buffers.
        self._jobs: weakref.WeakKeyDictionary[Future, int] = weakref.WeakKeyDictionary()
        self._claimed: weakref.WeakSet[Future] = weakref.WeakSet()  # results with their owner
        # Reentrant: add_done_callback runs the callback at once, under this lock, when
        # the future is already done, and the callbacks take the lock too.
        self._lock = threading.RLock()
        self._dropped = False
        self.started = time.monotonic()
        self._top_up()

    def dropped(self) -> bool:
        return self._dropped

    def ready(self) -> int:
        """How many futures at the head of the delivery deque are done (the queue depth)."""
        return sum(1 for _ in takewhile(Future.done, self._delivery()))

    def failed(self) -> Future | None:
        """A future of a later window that already failed, if any (raised at once)."""
        with self._lock:
            pending = [*self._copies, *self._reads]
        for future in pending:
            if future.done() and not future.cancelled() and future.exception() is not None:
                return future
        return None

    def take(self) -> Future:
        """The next window's future, in window order; ``IndexError`` after the last."""
        delivery = self._delivery()
        if not delivery:
            raise IndexError("no window left in this epoch")
        future = delivery.popleft()
        self._top_up()
        return future

    def _delivery(self) -> deque[Future]:
        return self._copies if self._copier is not None else self._reads

    def _top_up(self) -> None:
        with self._lock:
            if self._dropped:
                return
            while True:
                while len(self._reads) < self._depth and self._next < len(self._windows):
                    job, window = self._next, self._windows[self._next]
                    self._next += 1
                    read = self._readers.submit(self._read, window, self.dropped, what=f"job {job}")
                    self._jobs[read] = job
                    if self._reclaim is not None:
                        read.add_done_callback(self._settle)
                    self._reads.append(read)
                if self._copier is None or len(self._copies) >= self._copy_depth or not self._reads:
                    return
                out: Future = Future()
                self._copies.append(out)
                self._reads.popleft().add_done_callback(
                    lambda read, out=out: self._chain(read, out)
                )

    def _claim(self, read: Future) -> bool:
        """Whether the caller becomes the one owner of ``read``'s result (true once only)."""
        with self._lock:
            if read in self._claimed:
                return False
            self._claimed.add(read)
            return True

    def _give_back(self, read: Future) -> None:
        if read.cancelled() or read.exception() is not None or self._reclaim is None:
            return
        if self._claim(read):
            self._reclaim(read.result())

    def _settle(self, read: Future) -> None:
        # A read that finishes after its run was dropped: nobody will consume it.
        if self._dropped:
            self._give_back(read)

    def _chain(self, read: Future, out: Future) -> None:
        """A read finished: submit its copy, or carry its error (runs in the reader thread)."""
        if self._dropped:
            self._give_back(read)
            out.cancel()
            return
        if read.cancelled():
            out.cancel()
            return
        error = read.exception()
        if error is not None:
            out.set_exception(error)
            return
        if self._claim(read):  # the copy owns the buffer now, and gives it back itself
            assert self._copier is not None and self._copy is not None
            self._copier.submit(self._copy, read.result(), self.dropped,
                                what=f"job {self._jobs[read]}", future=out)  # fmt: skip

    def drop(self) -> None:
        """Abandon the run: cancel reads not started; give back buffers nobody will consume."""
        with self._lock:
            self._dropped = True
            reads = list(self._reads)
            self._reads.clear()
            self._copies.clear()
        for read in reads:
            if not read.cancel() and read.done():
                self._give_back(read)


class EpochIterator:
    """Iterates one epoch of a :class:`~chunkstream.ChunkLoader` (its ``_next_chunk`` gives
    each chunk); ends early once the next epoch starts or the loader closes."""

    def __init__(self, loader: Any, span: EpochSpan, run: Any) -> None:
        self._loader, self._span, self._run = loader, span, run
        self.epoch = span.epoch

    def __iter__(self) -> EpochIterator:
        return self

    def __next__(self) -> Any:
        span = self._span
        if span.dropped or span.finished:
            # The clock stops here, so training on the last chunk counts (idempotent).
            self._loader.stats.epoch_ended()
            raise StopIteration
        chunk = self._loader._next_chunk(span, self._run)
        span.received += 1
        return chunk

    def __len__(self) -> int:
        return self._span.stop - self._span.first


def shutdown(
    executors: Sequence[Executor], pool: Any, owned_source: Any, *, deadline_s: float,
    warn_after: float | None = None,
) -> str:  # fmt: skip
    """Stop the executors (the copy one first), close the pool, close ``owned_source``.

    One deadline covers everything; every step runs even if an earlier one raises.
    The pool is unpinned only once the copy thread has stopped, and the source is
    closed only if no reader is inside a read (``source.close()`` would wait for
    it past every deadline). Returns a note when the source was left open;
    ``warn_after`` (the user's deadline) warns about it and about live threads.
    """
    end = time.monotonic() + deadline_s
    alive: list[str] = []
    note = ""
    try:
        for executor in reversed(executors):
            alive += executor.close(end)
    finally:
        try:
            copying = any(name.startswith("chunkstream-transfer") for name in alive)
            pool.close(max(0.0, end - time.monotonic()), unpin=not copying)
        finally:
            readers = [name for name in alive if name.startswith("chunkstream-read")]
            if owned_source is not None and readers:
                note = (
                    f"; the source was left open (close_source=True) because {readers} "
                    "are still reading from it: call source.close() once the read returns, "
                    "or let the process exit"
                )
            elif owned_source is not None:
                owned_source.close()
            if alive and warn_after is not None:
                warnings.warn(
                    f"chunkstream: threads {alive} did not stop within {warn_after} s (a read "
                    f"that ignores cancellation); they are daemon threads and end with the "
                    f"process{note}",
                    RuntimeWarning,
                    stacklevel=4,
                )
    return note
