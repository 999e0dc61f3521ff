"""An epoch as a run of futures on long-lived executors (:mod:`chunkstream._executor`).

:class:`EpochRun`: one epoch's windows as two bounded deques of futures, reads (at most ``depth``) and,
with a copy stage, copies chained to their reads (at most ``copy_depth``); at
most ``depth + copy_depth`` windows are in flight. When a run is dropped, reads
not started are cancelled, a read result nobody will consume goes to
``reclaim`` exactly once, and a copy not started sees ``dropped()`` and gives
its buffer back itself.
"""

from __future__ import annotations

import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from functools import partial
from itertools import takewhile
from typing import Any

from .._executor import POLL_S, Executor
from ..plans import EpochSpan

__all__ = ["EpochIterator", "EpochRun", "Turn", "shutdown"]


class Turn:
    """A read's place in the line for a host buffer: reads take buffers in window order.

    Pinned slots come back in window order (one copy stream), and a window's copy
    is queued only after the windows before it. Were a later window to take the
    last free slot while an earlier one still waited for it, the earlier would
    wait forever: the slots are held by reads whose copies queue behind its own
    (seen on an H200: two readers, two slots, a slowed copy). So read ``j`` takes
    its buffer only once read ``j - 1`` has taken one, or given up.
    """

    __slots__ = ("_before", "_taken")

    def __init__(self, before: Turn | None) -> None:
        self._before = before
        self._taken = threading.Event()

    def take(self, acquire: Callable[[], Any], dropped: Callable[[], bool]) -> Any:
        """``acquire()`` once the window before has taken its buffer; stops waiting,
        raising ``InterruptedError``, once ``dropped()`` (a dropped run cancels the
        reads it did not start, whose turns never come)."""
        try:
            before = self._before
            while before is not None and not before._taken.wait(POLL_S):
                if dropped():
                    raise InterruptedError("the epoch was dropped while this read waited")
            return acquire()
        finally:
            self._before = None  # no chain of turns kept alive
            self._taken.set()


class EpochRun:
    """One epoch's windows as bounded deques of futures (see the module docs).

    ``read(window, dropped)`` runs in ``readers``, then ``copy(result, dropped)`` in
    ``copier``; ``reclaim(result)`` gives back an unconsumed result's buffer. With
    ``ordered``, each read is also passed ``turn=`` a :class:`Turn`, so reads take
    their buffers in window order.
    """

    def __init__(self, windows: Sequence[Any], *, read: Callable[[Any, Callable[[], bool]], Any],
                 readers: Executor, depth: int, copy: Callable[..., Any] | None = None,
                 copier: Executor | None = None, copy_depth: int = 1,
                 reclaim: Callable[[Any], None] | None = None, ordered: bool = False) -> None:  # fmt: skip
        self._windows = windows
        self._read, self._readers, self._depth = read, readers, depth
        self._copy, self._copier, self._copy_depth = copy, copier, copy_depth
        self._reclaim = reclaim
        self._ordered, self._last_turn = ordered, None
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
                    read_fn = self._read
                    if self._ordered:
                        self._last_turn = Turn(self._last_turn)
                        read_fn = partial(self._read, turn=self._last_turn)
                    read = self._readers.submit(read_fn, window, self.dropped, what=f"job {job}")
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
