"""Long-lived executors: named daemon threads running submitted calls, each call's
value or error carried in its :class:`~concurrent.futures.Future`.

Daemon threads, so a call that never returns cannot keep the interpreter alive
(``ThreadPoolExecutor`` joins its workers without a deadline at exit since
Python 3.9, bpo-39812, so one read hung on a dead mount would hang the exit);
``close`` joins until a deadline; the calls running now, and their threads'
stacks, are known to a watchdog (:meth:`Executor.busy_stacks`). One job waits
for another's future with :func:`wait_done`, never through a callback.
:data:`POLL_S` is the one interval every wait of the loader's jobs and of the
consumer polls at, so errors, ``close()`` and the watchdog are seen within it (a
pinned slot's copy is waited for by its CUDA event's blocking ``synchronize``,
not polled; a read's waits for its source's own tasks block on the task: a hung
one is the watchdog's, docs/architecture.md rows 8 and 10).
"""

from __future__ import annotations

import itertools
import queue
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from concurrent.futures._base import (  # Future's states, unchanged since Python 3.2
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
)
from pathlib import Path
from typing import Any

from ._errors import LoaderClosedError

__all__ = [
    "POLL_S",
    "Cancelled",
    "Executor",
    "GatedFuture",
    "done_within",
    "helper_stacks",
    "thread_stack",
    "wait_done",
]

POLL_S = 0.1  # every wait in the pipeline polls at this interval (errors, close, watchdog)


class GatedFuture(Future):
    """A :class:`~concurrent.futures.Future` that can be waited for without its condition.

    ``Future``'s waits take ``with self._condition``, whose ``__enter__`` is Python code:
    a signal handler that raises (``sys.exit``, a preemption handler) can run between the
    lock's acquire and the ``with`` body, leaving the condition held by the main thread
    for good (bpo-29988), and the worker's ``set_result`` on it then never returns (seen
    once in CI; the pinned pool avoids the same hazard with ``with self._lock``).
    Here finishing also opens a plain lock (the gate, held from construction), released
    from the worker (a release never blocks), and :func:`done_within` waits on the gate's
    C ``acquire``: an exception landing around it can only leave the gate held, and a
    later wait then reads the finished state instead. Every future the executors make is
    one (:meth:`Executor.submit`).
    """

    def __init__(self) -> None:
        super().__init__()
        self._gate = threading.Lock()
        self._gate.acquire()
        self._opened = itertools.count()  # next() is atomic: the gate opens exactly once
        self._claims = itertools.count()

    def claim(self) -> bool:
        """Whether this caller is the first to claim the call: the worker about to run it
        (:class:`Executor`) or the thread that submitted it, taking it back to run
        itself (once taken back, no worker runs it and the future never finishes).
        ``Future.cancel`` would take the future's condition; this is one atomic
        ``next()``, which no signal handler can interrupt halfway."""
        return next(self._claims) == 0

    def _open(self) -> None:
        if next(self._opened) == 0:
            self._gate.release()

    def set_result(self, result: Any) -> None:
        super().set_result(result)
        self._open()

    def set_exception(self, exception: BaseException | None) -> None:
        super().set_exception(exception)
        self._open()

    def cancel(self) -> bool:
        cancelled = super().cancel()
        if cancelled:
            self._open()
        return cancelled

    # The state reads, and a finished future's value and error, without the condition (one
    # attribute read, atomic under the GIL; the value is set before the state): the
    # consumer asks them of the reads queued ahead while it waits (a later read failed?),
    # and another thread may take a read's value next (the transfer thread's copy).
    def done(self) -> bool:
        return self._state in (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED)

    def cancelled(self) -> bool:
        return self._state in (CANCELLED, CANCELLED_AND_NOTIFIED)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state == FINISHED:
            return self._exception
        return super().exception(timeout)

    def result(self, timeout: float | None = None) -> Any:
        if self._state == FINISHED:
            if self._exception is not None:
                try:
                    raise self._exception
                finally:
                    self = None  # as Future's own: no cycle through this frame's traceback
            return self._result
        return super().result(timeout)


def done_within(future: Future, timeout: float = POLL_S) -> bool:
    """Wait up to ``timeout`` for ``future`` to finish (or be cancelled); whether it did.

    A :class:`GatedFuture` is waited for on its gate, never on the future's condition
    (the class says why); any other future on its own condition (a reentrant lock),
    never through ``concurrent.futures.wait``, whose waiter sets a plain-lock event from
    ``cancel()``: a handler that cancels the future (``close()``) while its own thread is
    inside that wait would block on the lock its interrupted frame holds.
    """
    if isinstance(future, GatedFuture):
        if future.done():
            return True
        if future._gate.acquire(timeout=timeout):
            future._gate.release()  # open for every other waiter
            return True
        return future.done()  # a wait interrupted after its acquire left the gate held
    try:
        future.exception(timeout)
    except CancelledError:
        pass
    except TimeoutError:
        return False
    return True


class Cancelled(InterruptedError):
    """Internal cancellation: the run this work belonged to was dropped (a newer epoch, a
    ``load_state_dict``, a ``close``), so the work stops here. Never reaches the user."""


def wait_done(future: Future, stop: Callable[[], bool]) -> bool:
    """Wait for ``future`` to finish, polling ``stop()`` every :data:`POLL_S`; whether it
    finished (false: ``stop()`` turned true first). How one job waits for another's."""
    while not done_within(future):
        if stop():
            return False
    return True


def thread_stack(thread: threading.Thread, doing: str) -> str | None:
    """``thread``'s current stack under a heading naming what it is ``doing`` (for a
    watchdog's error); ``None`` once the thread has ended."""
    frame = sys._current_frames().get(thread.ident) if thread.ident is not None else None
    if frame is None:
        return None
    return f'Thread "{thread.name}" ({doing}):\n' + "".join(traceback.format_stack(frame))


_PACKAGE = str(Path(__file__).resolve().parent)


def helper_stacks(prefixes: tuple[str, ...]) -> list[str]:
    """Stacks of the threads whose names start with one of ``prefixes`` that are inside
    chunkstream's code now: a source's decode or part tasks, which a reader waits for
    with no timeout (``settle``), so that a stall error shows where the wait is stuck.
    An idle pool thread (only the standard library on its stack) is left out."""
    frames = sys._current_frames()
    stacks = []
    for thread in threading.enumerate():
        if not thread.name.startswith(prefixes):
            continue
        frame = frames.get(thread.ident) if thread.ident is not None else None
        inside, walk = False, frame
        while walk is not None and not inside:
            inside = walk.f_code.co_filename.startswith(_PACKAGE)
            walk = walk.f_back
        if inside:
            stacks.append(
                f'Thread "{thread.name}" (a task a reader waits for):\n'
                + "".join(traceback.format_stack(frame))
            )
    return stacks


class Executor:
    """``workers`` daemon threads named ``chunkstream-<name>-<k>`` running submitted calls
    (``k`` from ``first``: pools of one stage that live together number on).

    ``init`` runs at the start of each thread; if it raises, that error is
    ``fatal`` and fails every later future and every one the failed thread takes.
    """

    def __init__(
        self,
        name: str,
        workers: int,
        init: Callable[[], None] | None = None,
        *,
        first: int = 0,
    ) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[tuple[GatedFuture, Callable, tuple, str] | None]
        self._queue = queue.SimpleQueue()
        self._busy: dict[threading.Thread, str] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._init = init
        self.fatal: BaseException | None = None
        self.last_progress = time.monotonic()
        self.completed = 0  # calls that returned without error, over the executor's life (_lock)
        self.threads = tuple(
            threading.Thread(target=self._work, name=f"chunkstream-{name}-{k}", daemon=True)
            for k in range(first, first + workers)
        )
        for thread in self.threads:
            thread.start()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` began: queued calls are cancelled, threads stopping."""
        return self._closed

    def submit(
        self,
        fn: Callable[..., Any],
        *args: Any,
        what: str = "",
        future: GatedFuture | None = None,
    ) -> GatedFuture:
        """Run ``fn(*args)`` in a worker; its value or exception lands in ``future``."""
        future = GatedFuture() if future is None else future
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

    def _run_one(
        self,
        me: threading.Thread,
        future: GatedFuture,
        fn: Callable,
        args: tuple,
        what: str,
        failed: BaseException | None,
    ) -> None:
        if not future.claim() or not future.set_running_or_notify_cancel():
            return
        if failed is not None:
            future.set_exception(failed)
            return
        with self._lock:
            self._busy[me] = what
        done = False
        try:
            value = fn(*args)
            done = True
        except BaseException as exc:  # a thread boundary: the future carries it
            future.set_exception(exc)
        finally:
            with self._lock:  # several workers count: ``+=`` is not atomic across threads
                self._busy.pop(me, None)
                self.completed += done
            self.last_progress = time.monotonic()
        if done:
            future.set_result(value)

    def busy_stacks(self) -> list[str]:
        """Stacks of the threads now inside a call, for the no-progress watchdog."""
        with self._lock:
            busy = dict(self._busy)
        stacks = (thread_stack(thread, what) for thread, what in busy.items())
        return [stack for stack in stacks if stack is not None]

    def close_within(self, seconds: float, who: str, why: str, stacklevel: int = 3) -> list[str]:
        """:meth:`close` with a deadline ``seconds`` from now; threads still inside a call
        (daemons, left to end with the process) are said in a ``RuntimeWarning`` naming
        ``who`` they are and ``why`` a call may not return (``stacklevel`` as for
        ``warnings.warn``, counted from the caller of this method's caller)."""
        alive = self.close(time.monotonic() + seconds)
        if alive:
            warnings.warn(
                f"chunkstream: {who} threads {alive} did not stop within {seconds} s ({why}); "
                "they are daemon threads and end with the process",
                RuntimeWarning,
                stacklevel=stacklevel,
            )
        return alive

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
