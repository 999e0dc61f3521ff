"""The one producer-thread primitive: an ordered, bounded, multi-threaded map.

Every pipeline stage (readers, the device transfer) is an :class:`OrderedStage`.
It runs ``fn(i, ticket)`` for the job numbers ``i = 0, 1, ..., n - 1`` of the
current *generation* (one generation per epoch) in ``workers`` named threads and
hands the results out with :meth:`get` in job order, whatever order the threads
finish in.

Back-pressure
    A worker takes job ``i`` only when ``i < returned + capacity``, where
    ``returned`` counts results already handed out by :meth:`get`. So at most
    ``capacity`` jobs are being processed or waiting, and the oldest job is
    always admitted: the stage cannot deadlock on its own buffers.

Errors
    A worker's exception is stored as the stage's ``failure``; the next
    :meth:`get` (or the one already waiting, within one 0.1 s poll) raises it.
    The stage then takes no more jobs for that generation.

Thread set-up
    ``thread_init`` runs once at the start of every worker thread, before its
    first job (the CUDA stages set the thread's device there: a new thread
    starts on device 0). If it raises, the thread ends and every later
    :meth:`get`, in any generation, raises that error: a stage short of a
    worker must not look healthy.

Generations
    :meth:`reset` starts a new job list without stopping the threads, so an
    abandoned epoch costs no thread churn. Results of an older generation are
    passed to ``discard`` (to return their buffers) instead of being handed out;
    ``ticket.cancelled()`` turns true for a job of an older generation so a long
    wait inside ``fn`` can give up early. Chained stages are reset together, so
    they share generation numbers: a downstream job asks its upstream with
    ``get(generation=ticket.generation)`` and can never take an item of another
    epoch.

Shutdown
    :meth:`close` is idempotent: set the stop flag, wake everyone, join each
    thread with a deadline, then discard what is left. Every wait in this module
    has a 0.1 s timeout so a stop is seen promptly.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["EndOfJobs", "OrderedStage", "StageClosed", "Ticket", "thread_stack"]

T = TypeVar("T")
_POLL_S = 0.1
_log = logging.getLogger("chunkstream.pipeline")


def thread_stack(thread: threading.Thread, doing: str) -> str | None:
    """``thread``'s current stack under a heading naming it and what it is ``doing``, for a
    no-progress watchdog's error; ``None`` once the thread has ended."""
    frame = sys._current_frames().get(thread.ident) if thread.ident is not None else None
    if frame is None:
        return None
    return f'Thread "{thread.name}" ({doing}):\n' + "".join(traceback.format_stack(frame))


class EndOfJobs(Exception):
    """Raised by :meth:`OrderedStage.get` once every job of the generation was handed out."""


class StageClosed(Exception):
    """Raised by :meth:`OrderedStage.get` when the stage was closed or reset meanwhile."""


class Ticket:
    """What a job knows about itself: its stage's generation, and whether it went stale."""

    __slots__ = ("generation", "stage")

    def __init__(self, stage: OrderedStage, generation: int) -> None:
        self.stage = stage
        self.generation = generation

    def cancelled(self) -> bool:
        return self.stage._closed or self.stage._generation != self.generation


class OrderedStage(Generic[T]):
    """Run ``fn(i, ticket)`` for jobs ``0..n-1`` in threads; hand results out in order."""

    def __init__(
        self,
        name: str,
        fn: Callable[[int, Ticket], T],
        *,
        workers: int,
        capacity: int,
        discard: Callable[[T], None] | None = None,
        thread_init: Callable[[], None] | None = None,
    ) -> None:
        if workers < 1 or capacity < 1:
            raise ValueError(f"stage {name!r}: workers and capacity must be >= 1")
        self.name = name
        self._fn = fn
        self._discard = discard
        self._capacity = capacity
        self._cond = threading.Condition()
        self._closed = False
        self._generation = 0
        self._num_jobs = 0
        self._next_job = 0
        self._returned = 0
        self._results: dict[int, T] = {}
        self._failure: BaseException | None = None
        self._thread_init = thread_init
        self._fatal: BaseException | None = None  # a thread_init error: outlives reset()
        self._busy: dict[int, int] = {}  # thread ident -> job number, for the watchdog
        self.last_progress = time.monotonic()
        self.completed = 0  # jobs finished without error, over all generations
        self._threads = [
            threading.Thread(target=self._run, name=f"chunkstream-{name}-{k}", daemon=True)
            for k in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    # -- producer side -----------------------------------------------------------------

    def _run(self) -> None:
        if self._thread_init is not None:
            try:
                self._thread_init()
            except BaseException as exc:  # a thread boundary: hand it to the consumer
                with self._cond:
                    if self._fatal is None:
                        self._fatal = exc
                    self._cond.notify_all()
                return
        while True:
            with self._cond:
                while not self._closed and not self._admissible():
                    self._cond.wait(_POLL_S)
                if self._closed:
                    return
                job = self._next_job
                self._next_job += 1
                generation = self._generation
                self._busy[threading.get_ident()] = job

            value: Any = None
            error: BaseException | None = None
            try:
                value = self._fn(job, Ticket(self, generation))
            except BaseException as exc:  # a thread boundary: hand it to the consumer
                error = exc
            stale = False
            with self._cond:
                self._busy.pop(threading.get_ident(), None)
                self.last_progress = time.monotonic()
                if self._closed or generation != self._generation:
                    stale = True
                elif error is not None:
                    if self._failure is None:
                        self._failure = error
                else:
                    self._results[job] = value
                if error is None:
                    self.completed += 1
                self._cond.notify_all()
            if stale and error is None:
                self._drop(value)

    def _admissible(self) -> bool:
        return (
            self._failure is None
            and self._next_job < self._num_jobs
            and self._next_job < self._returned + self._capacity
        )

    def _drop(self, value: Any) -> None:
        if self._discard is not None and value is not None:
            try:
                self._discard(value)
            except Exception:
                _log.exception("chunkstream: discarding a stale %s result failed", self.name)

    # -- consumer side -----------------------------------------------------------------

    def reset(self, num_jobs: int) -> None:
        """Start a new generation of ``num_jobs`` jobs; older results are discarded."""
        with self._cond:
            self._generation += 1
            self._num_jobs = int(num_jobs)
            self._next_job = 0
            self._returned = 0
            self._failure = None
            leftovers = list(self._results.values())
            self._results.clear()
            self.last_progress = time.monotonic()
            self._cond.notify_all()
        for value in leftovers:
            self._drop(value)

    def get(self, timeout: float | None = None, generation: int | None = None) -> T:
        """Return the next result in job order.

        Raises the worker's exception, :class:`EndOfJobs` after the last job,
        :class:`StageClosed` if the stage is closed or moves past ``generation``
        (default: the current one) while waiting, or ``TimeoutError`` after
        ``timeout`` seconds without a result. Asking for a generation the stage
        has not reached yet waits for its reset.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if generation is None:
                generation = self._generation
            while True:
                if self._closed or generation < self._generation:
                    raise StageClosed(self.name)
                if self._fatal is not None:
                    raise self._fatal
                if generation > self._generation:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise TimeoutError(self.name)
                    self._cond.wait(_POLL_S)
                    continue
                if self._failure is not None:
                    raise self._failure
                if self._returned in self._results:
                    value = self._results.pop(self._returned)
                    self._returned += 1
                    self._cond.notify_all()
                    return value
                if self._returned >= self._num_jobs:
                    raise EndOfJobs(self.name)
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(self.name)
                self._cond.wait(_POLL_S)

    def ready(self) -> int:
        """How many in-order results are waiting (the queue depth the consumer sees)."""
        with self._cond:
            count = 0
            while self._returned + count in self._results:
                count += 1
            return count

    def busy_stacks(self) -> list[str]:
        """Stacks of the threads now inside ``fn``, for the no-progress watchdog."""
        with self._cond:
            busy = dict(self._busy)
        stacks = []
        for thread in self._threads:
            if thread.ident in busy:
                stack = thread_stack(thread, f"job {busy[thread.ident]}")
                if stack is not None:
                    stacks.append(stack)
        return stacks

    # -- shutdown ----------------------------------------------------------------------

    def close(self, deadline_s: float = 5.0) -> list[str]:
        """Stop and join the threads; return the names of any still alive at the deadline."""
        with self._cond:
            already = self._closed
            self._closed = True
            self._cond.notify_all()
        end = time.monotonic() + deadline_s
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, end - time.monotonic()))
        if not already:
            with self._cond:
                leftovers = list(self._results.values())
                self._results.clear()
            for value in leftovers:
                self._drop(value)
        return [t.name for t in self._threads if t.is_alive()]

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        return tuple(self._threads)
