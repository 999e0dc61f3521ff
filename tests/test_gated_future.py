"""A wait interrupted anywhere cannot leave a worker stuck (``_executor.GatedFuture``).

The consumer waits for a reader's future in the main thread, where signal handlers
run; a handler that raises (``sys.exit``, a preemption handler) lands in that wait at
whatever bytecode it is on. CI once caught it inside ``Condition.__enter__``, after the
future's lock was taken and before the ``with`` body: the lock stayed held, and the
reader's ``set_result`` waited on it for good. Here the interruption is placed
deterministically at every opcode of the wait in turn (a trace function that raises,
which CPython propagates like an asynchronous exception), and after each the worker
must still finish, a later wait must see it, and the executor must run the next call.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import pytest

from chunkstream._executor import Executor, GatedFuture, done_within


class Interrupt(Exception):
    """What the simulated signal handler raises."""


def _traced(call: Callable[[], object], at: int | None) -> int:
    """Run ``call`` in this thread, raising :class:`Interrupt` at its ``at``-th opcode
    (counting every frame it enters); the number of opcodes it ran (``at`` if raised)."""
    count = itertools.count()

    def trace(frame, event, arg):
        frame.f_trace_opcodes = True
        if event == "opcode" and next(count) == at:
            raise Interrupt
        return trace

    before = sys.gettrace()
    sys.settrace(trace)
    try:
        call()
    except Interrupt:
        pass
    finally:
        sys.settrace(before)
    return next(count)


def _check_not_stuck(executor: Executor, future: Future, release: threading.Event) -> None:
    """The worker finishes ``future`` and runs the next call; seen through a plain event
    the next call sets, not through ``future`` (a wait on the future's own condition from
    this thread would take a lock this thread may hold, reentrantly, and mask it)."""
    release.set()
    ran = threading.Event()
    executor.submit(ran.set)
    assert ran.wait(10), "the executor's worker is stuck: the call after the future never ran"
    assert done_within(future, 0) and future.result(timeout=0) == "read"


@pytest.mark.parametrize("finishes", ["after the wait", "during the wait"])
def test_an_exception_at_any_point_of_a_wait_leaves_no_worker_stuck(finishes: str) -> None:
    executor = Executor("gated", 1)
    try:

        def wait_on(future: Future) -> Callable[[], object]:
            return lambda: done_within(future, 0.5 if finishes == "during the wait" else 0.01)

        def read(release: threading.Event) -> str:
            if finishes == "during the wait":
                time.sleep(0.005)  # finishes while the main thread waits on its acquire
            else:
                release.wait()
            return "read"

        release = threading.Event()
        future = executor.submit(read, release)
        opcodes = _traced(wait_on(future), at=None)
        _check_not_stuck(executor, future, release)
        assert opcodes > 3
        for at in range(opcodes + 2):
            release = threading.Event()
            future = executor.submit(read, release)
            _traced(wait_on(future), at=at)
            _check_not_stuck(executor, future, release)
    finally:
        assert executor.close(time.monotonic() + 5) == []


def test_the_gate_opens_once_whatever_finishes_the_future() -> None:
    """Cancelled twice, failed, or finished: ``done_within`` sees it at once, and a second
    ``cancel`` (True again, as ``Future``'s) does not release the gate twice."""
    cancelled = GatedFuture()
    assert cancelled.cancel() and cancelled.cancel()
    assert cancelled.done() and cancelled.cancelled() and done_within(cancelled, 0)
    failed = GatedFuture()
    failed.set_exception(ValueError("x"))
    assert done_within(failed, 0) and not failed.cancelled()
    pending = GatedFuture()
    assert not done_within(pending, 0.01) and not pending.done()
    pending.set_result(1)
    assert done_within(pending, 0) and done_within(pending, 0)  # the gate stays open
    assert pending.result(timeout=0) == 1


def test_a_call_claimed_back_is_never_run_and_a_started_one_cannot_be_claimed() -> None:
    """``claim``: how a gather takes back a part no reader started (``Future.cancel``
    would take the future's condition in the thread signals land in)."""
    executor = Executor("claim", 1)
    try:
        started, release = threading.Event(), threading.Event()

        def block() -> str:
            started.set()
            release.wait(10)
            return "ran"

        busy = executor.submit(block)
        assert started.wait(10)
        runs: list[int] = []
        queued = executor.submit(runs.append, 1)
        assert not busy.claim()  # its worker claimed it before running it
        assert queued.claim() and not queued.claim()  # still queued: taken back, once
        release.set()
        ran = threading.Event()
        executor.submit(ran.set)
        assert ran.wait(10)
        assert runs == [] and not queued.done() and busy.result(timeout=0) == "ran"
    finally:
        assert executor.close(time.monotonic() + 5) == []


def _cancel_both(ok: Future, bad: Future, answered: list) -> None:
    answered.append((ok.cancel(), bad.cancel()))


def test_a_finished_futures_value_and_error_are_read_without_its_condition() -> None:
    """The consumer reads the error of every finished read queued ahead at each poll
    (``failed()``), in the thread signals land in, and another thread takes a read's
    value next (the transfer thread's copy): an exception raised at any opcode of those
    reads leaves nothing held that ``cancel()`` (the future's condition) would wait on."""
    executor = Executor("finished", 1)
    try:
        ok = executor.submit(lambda: "value")
        bad = executor.submit(lambda: 1 / 0)
        assert done_within(ok, 10) and done_within(bad, 10)

        def reads() -> None:
            assert ok.exception(timeout=0) is None and ok.result(timeout=0) == "value"
            assert isinstance(bad.exception(timeout=0), ZeroDivisionError)
            with pytest.raises(ZeroDivisionError):
                bad.result(timeout=0)

        for at in range(_traced(reads, at=None) + 2):
            _traced(reads, at=at)
            answered: list[tuple[bool, bool]] = []
            other = threading.Thread(target=_cancel_both, args=(ok, bad, answered))
            other.start()
            other.join(10)
            assert answered == [(False, False)], "a finished future's condition was left held"
    finally:
        assert executor.close(time.monotonic() + 5) == []
