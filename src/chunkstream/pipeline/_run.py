"""An epoch as a run of futures on long-lived executors (:mod:`chunkstream._executor`).

:class:`EpochRun` holds one epoch's windows as two bounded deques of futures, in
window order, as Grain's prefetch does: reads (at most ``depth``, run by the
readers) and, with a copy stage, copies (at most ``copy_depth``). The copy of a
window is one job on the single transfer thread that waits for its read's future
and then copies: copies run in window order, and no future calls back into the
run, so it needs no callbacks and no reentrant lock.

Buffer ownership: a read's buffer belongs to its reader until the read returns,
then to the one job that follows that read on the transfer thread, the copy, or
after a drop the reclaim (:meth:`EpochRun.drop` queues one for every read not
yet followed by a copy). A copy that finds its run dropped gives its buffer
back itself, so each buffer has exactly one owner, and one way back, at every
moment. Without a copy stage (the CPU), a read's result is the user's chunk.
"""

from __future__ import annotations

import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from itertools import takewhile
from typing import Any

from .._executor import POLL_S, Executor, wait_done
from ..plans import EpochSpan
from ..stats import Trip

__all__ = ["EpochIterator", "EpochRun", "Owned", "Turn", "forgotten", "shutdown"]


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

    ``read(window, dropped, trip)`` runs in ``readers``; with a copy stage,
    ``copy(result, dropped, trip)`` runs in ``copier`` (one thread) after its read,
    and ``reclaim(result)`` gives back the buffer of a read no copy will follow.
    ``trip`` is the window's :class:`~chunkstream.stats.Trip`, which the jobs stamp
    with their timings and :meth:`take` hands to the consumer. With ``ordered``, each
    read is also passed ``turn=`` a :class:`Turn`, so reads take their buffers in
    window order.
    """

    def __init__(
        self,
        windows: Sequence[Any],
        *,
        read: Callable[[Any, Callable[[], bool], Trip], Any],
        readers: Executor,
        depth: int,
        copy: Callable[..., Any] | None = None,
        copier: Executor | None = None,
        copy_depth: int = 1,
        reclaim: Callable[[Any], None] | None = None,
        ordered: bool = False,
    ) -> None:
        self._windows = windows
        self._read, self._readers, self._depth = read, readers, depth
        self._copy, self._copier, self._copy_depth = copy, copier, copy_depth
        self._reclaim = reclaim
        self._ordered, self._last_turn = ordered, None
        self._next = 0
        self._reads: deque[tuple[int, Future, Trip]] = deque()  # reads not yet followed
        self._copies: deque[tuple[Future, Future, Trip]] = deque()  # (copy, its read, trip)
        # Every read submitted and not yet known done, weakly (a done read's value is the
        # consumer's, never kept here): settle() waits for them.
        self._made: list[weakref.ref[Future]] = []
        # take() and the consumer's queries may run in different threads; drop() takes no lock
        self._lock = threading.Lock()
        self._dropped = False
        self.started = time.monotonic()
        self._top_up()

    def dropped(self) -> bool:
        return self._dropped

    def ready(self) -> int:
        """How many futures at the head of the delivery deque are done (the queue depth)."""
        # list(deque) is one C call: a snapshot even while drop() pops from another frame.
        if self._copier:
            delivery = [copy for copy, _, _ in list(self._copies)]
        else:
            delivery = [read for _, read, _ in list(self._reads)]
        return sum(1 for _ in takewhile(lambda future: future.done(), delivery))

    def failed(self) -> Future | None:
        """A future of a later window that already failed, if any (raised at once)."""
        pending = [f for c, r, _ in list(self._copies) for f in (c, r)]
        pending += [r for _, r, _ in list(self._reads)]
        for future in pending:
            if future.done() and not future.cancelled() and future.exception(timeout=0) is not None:
                return future
        return None

    def take(self) -> tuple[Future, Trip]:
        """The next window's future and its trip, in window order; ``IndexError`` after
        the last."""
        with self._lock:
            if self._copier is not None and self._copies:
                future, _, trip = self._copies.popleft()
            elif self._copier is None and self._reads:
                _, future, trip = self._reads.popleft()
            else:
                raise IndexError("no window left in this epoch")
            self._top_up_locked()
        return future, trip

    def _top_up(self) -> None:
        with self._lock:
            self._top_up_locked()

    def _top_up_locked(self) -> None:
        while not self._dropped:
            while len(self._reads) < self._depth and self._next < len(self._windows):
                job, window = self._next, self._windows[self._next]
                self._next += 1
                read_fn = self._read
                if self._ordered:
                    self._last_turn = Turn(self._last_turn)
                    read_fn = partial(self._read, turn=self._last_turn)
                trip = Trip()
                read = self._readers.submit(read_fn, window, self.dropped, trip, what=f"job {job}")
                self._reads.append((job, read, trip))
                self._remember(read)
            if self._copier is None or len(self._copies) >= self._copy_depth or not self._reads:
                break
            job, read, trip = self._reads.popleft()
            copy = self._copier.submit(self._copy_after, read, trip, what=f"job {job}")
            self._copies.append((copy, read, trip))
        if self._dropped:  # dropped while this topped up: what it queued is drained here
            self._drain()

    def _remember(self, read: Future) -> None:
        if len(self._made) > 2 * self._depth + 8:
            self._made = [r for r in self._made if (f := r()) is not None and not f.done()]
        self._made.append(weakref.ref(read))

    def settle(self, stop: Callable[[], bool]) -> bool:
        """Wait until every read this run submitted has finished or was cancelled, also
        after :meth:`drop` (a started read runs to its end); whether they all did before
        ``stop()`` turned true. What a consumer that reuses the memory the reads read from
        (the shuffle buffer's refill, :mod:`chunkstream.pipeline._lane`) waits for."""
        for ref in list(self._made):
            read = ref()
            if read is not None and not wait_done(read, stop):
                return False
        return True

    def _copy_after(self, read: Future, trip: Trip) -> Any:
        """The transfer thread's job for one window: its read's result, copied."""
        if not wait_done(read, self.dropped):
            return self._follow_dropped(read)
        result = read.result(timeout=0)  # done: a failed read's error is this window's
        assert self._copy is not None
        return self._copy(result, self.dropped, trip)  # gives the buffer back, dropped or not

    def _follow_dropped(self, read: Future) -> None:
        """Give back the buffer of ``read`` once it is done (its run was dropped)."""
        if read.cancel():
            return None
        # A read stops soon after its run is dropped; one that ignores cancellation must
        # not hold the transfer thread past the loader's close (the pool closes with it).
        copier = self._copier
        if not wait_done(read, lambda: copier is not None and copier.closed):
            return None
        if read.exception(timeout=0) is None and self._reclaim is not None:
            self._reclaim(read.result(timeout=0))
        return None

    def drop(self) -> None:
        """Abandon the run: cancel reads not started; give back buffers nobody will consume
        (a reclaim job on the transfer thread for each read no copy follows).

        Takes no lock, so a signal handler may call it while its own thread is inside
        :meth:`take`: the flag is one assignment, and each queued future is popped
        (atomically) by exactly one of :meth:`drop` and a top-up that saw the flag late.
        Idempotent."""
        self._dropped = True
        self._drain()

    def _drain(self) -> None:
        while True:
            try:
                _, read, _ = self._reads.popleft()
            except IndexError:
                break
            if not read.cancel() and self._copier is not None:
                self._copier.submit(self._follow_dropped, read, what="reclaim")
        self._copies.clear()  # a copy that finds its run dropped gives its buffer back


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


@dataclass
class Owned:
    """What a loader releases when it shuts down: the epoch run in progress, the
    executors, the host buffer pool (``None`` until a learning source was read) and
    the source, if the loader closes it. Held apart from the loader so that a
    finalizer can release it once the loader is collected."""

    executors: list[Executor] = field(default_factory=list)
    pool: Any = None
    #: The batch lane's buffer pools (:meth:`ChunkLoader.lane`), closed with the arena.
    pools: list[Any] = field(default_factory=list)
    source: Any = None
    run: EpochRun | None = None


def forgotten(owned: Owned, stats: Any, timeout: float) -> None:
    """The finalizer of a loader collected without ``close()``: warn, then shut it down."""
    warnings.warn(
        "ChunkLoader was not closed; use `with ChunkLoader(...)` or call close()",
        ResourceWarning,
        stacklevel=2,
    )
    try:
        shutdown(owned, deadline_s=timeout, warn_after=timeout)
    finally:
        stats.epoch_ended()


def shutdown(owned: Owned, *, deadline_s: float, warn_after: float | None = None) -> str:
    """Drop the run, stop the executors (the copy one first), close the pool, close the
    owned source.

    One deadline covers everything; every step runs even if an earlier one raises.
    The pool is unpinned only once the copy thread has stopped, and the source is
    closed only if no reader is inside a read (``source.close()`` would wait for
    it past every deadline). Returns a note when the source was left open;
    ``warn_after`` (the user's deadline) warns about it and about live threads.
    """
    end = time.monotonic() + deadline_s
    alive: list[str] = []
    note = ""
    run, owned.run = owned.run, None
    try:
        if run is not None:
            run.drop()
        for executor in reversed(owned.executors):
            alive += executor.close(end)
    finally:
        try:
            copying = any(name.startswith("chunkstream-transfer") for name in alive)
            for pool in [owned.pool, *owned.pools]:
                if pool is not None:
                    pool.close(max(0.0, end - time.monotonic()), unpin=not copying)
        finally:
            readers = [name for name in alive if name.startswith("chunkstream-read")]
            if owned.source is not None and readers:
                note = (
                    f"; the source was left open (close_source=True) because {readers} "
                    "are still reading from it: call source.close() once the read returns, "
                    "or let the process exit"
                )
            elif owned.source is not None:
                owned.source.close()
            if alive and warn_after is not None:
                warnings.warn(
                    f"chunkstream: threads {alive} did not stop within {warn_after} s (a read "
                    f"that ignores cancellation); they are daemon threads and end with the "
                    f"process{note}",
                    RuntimeWarning,
                    stacklevel=4,
                )
    return note
