"""The preemption pattern, driven at many moments: a handler that checkpoints and closes.

Schedulers (SLURM, LSF) send SIGTERM or SIGUSR1 before they kill a job; its
handler runs on the main thread between two bytecodes of whatever that thread was
doing, saves ``state_dict()`` and calls ``close()``. :func:`preempt` runs a body
(an epoch loop over the object under test) once per moment and interrupts it
there with such a handler:

* :class:`Call` ``(k)``: at the ``k``-th profile event (a call, or just before a C
  call) of the main thread, the handler runs as a signal handler would, inside
  whatever the main thread holds at that point (the loader's lock while it
  publishes, a run's lock in ``take``, the stats' lock, a future's wait);
  :func:`call_sites` lists a body's events, one per site, so a sweep covers every
  function it enters;
* :class:`Alarm` ``(delay, repeat)``: a real ``SIGALRM`` after ``delay`` s (and every
  ``repeat`` s after, so handlers nest), landing wherever the main thread is,
  while the workers read or copy.

Each trial gets a fresh object from ``make()``; a trial still running after
``hang_s`` ends the process with every thread's stack (``faulthandler``): a thread
blocked on a lock its own interrupted frame holds cannot be woken from Python. Reused for
``ChunkLoader`` and ``BatchStream`` (both buffer tiers): only ``make``, ``body`` and
``handler`` differ.
"""

from __future__ import annotations

import faulthandler
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Preempted(BaseException):  # what a real handler's sys.exit would be
    """Raised by the handler after it checkpointed and closed, to end the body."""


@dataclass(frozen=True)
class Call:
    """Interrupt at the ``k``-th profile event of the main thread inside the body."""

    k: int


@dataclass(frozen=True)
class Alarm:
    """Interrupt with a real ``SIGALRM`` after ``delay`` s, then every ``repeat`` s."""

    delay: float
    repeat: float = 0.0


@dataclass
class Trial(Generic[T]):
    """What happened in one trial.

    ``state`` is what the first handler saved; ``log`` what the body had logged
    then (a copy); ``where`` the interrupted main thread's frames (innermost first,
    ``file:function``), ``workers`` the innermost frame of each ``chunkstream-*``
    thread then; ``handler_s`` the longest handler run; ``error`` any exception other
    than the handler's :class:`Preempted` or the closed object's own error
    (``closed_error``). A hang is no trial result: it ends the process (below).
    """

    moment: Call | Alarm
    fired: int = 0
    state: Any = None
    log: list = field(default_factory=list)
    where: list[str] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)
    handler_s: float = 0.0
    error: BaseException | None = None


def save_and_close(obj: Any) -> Any:
    """The usual handler: checkpoint, then close."""
    state = obj.state_dict()
    obj.close()
    return state


def save_reload_and_close(obj: Any) -> Any:
    """A handler that also resumes the state it saved (``load_state_dict`` from a
    handler), then checks the object reports the same position (a pending resume may
    spell ``num_chunks`` differently), then closes."""
    state = obj.state_dict()
    obj.load_state_dict(state)
    again = obj.state_dict()
    same = {k: v for k, v in again.items() if k != "num_chunks"}
    assert same == {k: v for k, v in state.items() if k != "num_chunks"}, (again, state)
    obj.close()
    return state


def _in_gc_callback(frame: Any) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.endswith(("weakref.py", "_weakrefset.py")):
            return True
        frame = frame.f_back
    return False


def _frames(frame: Any, limit: int = 12) -> list[str]:
    names = []
    while frame is not None and len(names) < limit:
        code = frame.f_code
        names.append(f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}")
        frame = frame.f_back
    return names


def _workers() -> list[str]:
    """``thread:function`` of each ``chunkstream-*`` thread's innermost frame. Only that
    one: walking ``f_back`` of another thread's running frames can crash CPython 3.11."""
    frames = sys._current_frames()
    out = []
    for thread in threading.enumerate():
        frame = frames.get(thread.ident) if thread.name.startswith("chunkstream-") else None
        if frame is not None:
            out.append(f"{thread.name}:{frame.f_code.co_name}")
    return out


def _close(obj: Any) -> None:
    obj.close()


# The events a handler runs at: a function's start and just before a C call, where a real
# signal's handler can run too. Not a C call's return: a handler raising there, after
# ``lock.__enter__`` acquired the lock and before the ``with`` block began, would leave it
# held, which a real signal cannot do (CPython runs handlers between bytecodes). Nor just
# before a lock's ``__exit__``/``release``: a raising handler there leaks the lock in any
# Python code (bpo-29988), which is no finding about ours.
_BEFORE = ("call", "c_call")


def _counts(frame: Any, event: str, arg: Any, keep: str | tuple[str, ...]) -> bool:
    """Whether this profile event is a moment (:class:`Call` counts these): ``keep`` is one
    substring of the file's path, or several (any of them)."""
    if event not in _BEFORE:
        return False
    name = frame.f_code.co_filename
    if not any(k in name for k in ((keep,) if isinstance(keep, str) else keep)):
        return False
    return not (event == "c_call" and getattr(arg, "__name__", "") in ("__exit__", "release"))


def call_sites(
    make: Callable[[], T],
    body: Callable[[T, list], None],
    *,
    keep: str | tuple[str, ...] = "chunkstream",
    close: Callable[[T], None] = _close,
) -> list[tuple[int, str]]:
    """The profile events in files whose path contains ``keep`` (counted as
    :class:`Call` counts them) of one uninterrupted ``body`` on the main thread, as
    ``(k, site)`` for the first event at each distinct site (an event, its function
    and its caller): a sweep of
    :class:`Call` ``(k)`` over them interrupts the body once inside every function
    the main thread enters there, and at every C call such a function makes (a lock's
    ``acquire``, a wait, a clock read). The counts are those of this run: a body
    whose waits poll may make more or fewer events in a trial."""
    obj = make()
    count = 0
    sites: dict[str, int] = {}

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if not _counts(frame, event, arg, keep):
            return
        code = frame.f_code
        count += 1
        inner = getattr(arg, "__qualname__", "") if event.startswith("c_") else ""
        caller = frame.f_back.f_code.co_name if frame.f_back is not None else "-"
        site = f"{event} {code.co_filename.rsplit('/', 1)[-1]}:{code.co_name} {inner} <- {caller}"
        sites.setdefault(site, count)

    try:
        sys.setprofile(profile)
        try:
            body(obj, [])
        finally:
            sys.setprofile(None)
    finally:
        close(obj)
    return sorted((k, site) for site, k in sites.items())


def preempt(
    make: Callable[[], T],
    body: Callable[[T, list], None],
    moments: Iterable[Call | Alarm],
    *,
    handler: Callable[[T], Any] = save_and_close,
    closed_error: type[BaseException] | tuple[type[BaseException], ...] = (),
    hang_s: float = 30.0,
    keep: str | tuple[str, ...] = "chunkstream",
    close: Callable[[T], None] = _close,
) -> list[Trial[T]]:
    """One trial per moment: a fresh ``make()``, ``body(obj, log)`` on the main thread,
    ``handler(obj)`` run at the moment (its return value saved as the state); at a
    :class:`Call` the first handler then raises :class:`Preempted` to end the body, as
    ``sys.exit`` would; after an :class:`Alarm` the closed object ends it (below).

    ``body`` appends what it received to ``log`` (the test checks the saved state
    against it). An exception of type ``closed_error`` from the body (the closed
    object's answer to a later call) also ends a trial normally. Must run on the
    main thread (signals are delivered there). :class:`Call` counts only calls and C
    calls in files whose path contains ``keep`` (never a weakref callback of the
    interpreter's, where the handler's exception would be swallowed). ``close(obj)``
    ends every trial (an object without ``close()``, a ``BatchStream``, closes its
    loader).
    """
    assert threading.current_thread() is threading.main_thread()
    return [_trial(make, body, m, handler, closed_error, hang_s, keep, close) for m in moments]


def _trial(
    make: Callable[[], T],
    body: Callable[[T, list], None],
    moment: Call | Alarm,
    handler: Callable[[T], Any],
    closed_error: Any,
    hang_s: float,
    keep: str | tuple[str, ...],
    close: Callable[[T], None],
) -> Trial[T]:
    trial: Trial[T] = Trial(moment)
    obj = make()
    log: list = []
    in_handler = False

    def run_handler(frame: Any) -> None:
        nonlocal in_handler
        first = trial.fired == 0
        trial.fired += 1
        if first:
            trial.where, trial.workers, trial.log = _frames(frame), _workers(), list(log)
        was, in_handler = in_handler, True
        began = time.monotonic()
        try:
            state = handler(obj)
        finally:
            in_handler = was
            trial.handler_s = max(trial.handler_s, time.monotonic() - began)
        if first:
            trial.state = state
            # A real signal may land between a lock's acquire and its ``with`` block, where
            # an exception from the handler leaks the lock (bpo-29988; the profile sweep
            # skips those two points), and inside a weakref callback the garbage collector
            # runs the exception would be swallowed: there the closed object ends the body
            # instead, at its next call (``closed_error``).
            if isinstance(moment, Call) and not _in_gc_callback(frame):
                raise Preempted

    def on_signal(signum: int, frame: Any) -> None:
        run_handler(frame)

    calls = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if not _counts(frame, event, arg, keep):
            return
        calls += 1
        if calls == moment.k and not in_handler:  # type: ignore[union-attr]
            sys.setprofile(None)
            run_handler(frame)

    previous = signal.signal(signal.SIGALRM, on_signal)
    try:
        # A hang (a handler blocked on a lock its own interrupted frame holds) cannot be
        # interrupted from Python: it ends the process with every thread's stack.
        faulthandler.dump_traceback_later(hang_s, exit=True)
        try:
            if isinstance(moment, Alarm):
                signal.setitimer(signal.ITIMER_REAL, moment.delay, moment.repeat)
            else:
                sys.setprofile(profile)
            try:
                body(obj, log)
            finally:
                sys.setprofile(None)
                signal.setitimer(signal.ITIMER_REAL, 0)
        except Preempted:
            pass
        except Exception as exc:
            if not (closed_error and isinstance(exc, closed_error)):
                trial.error = exc
        finally:
            faulthandler.cancel_dump_traceback_later()
    finally:
        signal.signal(signal.SIGALRM, previous)
        try:
            close(obj)  # a trial whose moment never came (the body ended first)
        except Exception as exc:  # reported, not raised: the trial's finding
            trial.error = trial.error or exc
    return trial


def describe(trials: list[Trial]) -> str:
    """One line per trial, for a failure message."""
    lines = []
    for t in trials:
        where = " < ".join(n for n in t.where[:4])
        lines.append(
            f"{t.moment}: fired={t.fired} state={t.state} handler={t.handler_s:.3f}s "
            f"error={t.error!r} at {where}"
        )
    return "\n".join(lines)


def from_another_thread(
    obj: T,
    body: Callable[[T, list], None],
    poke: Callable[[T], Any],
    *,
    close: Callable[[T], None] = _close,
    closed_error: type[BaseException] | tuple[type[BaseException], ...],
    join_s: float,
    run_s: float = 0.05,
) -> list:
    """Control calls from another thread while the main thread iterates: a thread calls
    ``poke(obj)`` over and over (its answers returned) for ``run_s``, then ``close(obj)``;
    the main thread runs ``body`` until the closed object answers with ``closed_error``.
    Fails if the body ends otherwise or the thread is still alive ``join_s`` after."""
    answers: list = []
    stop = threading.Event()

    def pokes() -> None:
        while not stop.is_set():
            answers.append(poke(obj))
            time.sleep(0.001)
        close(obj)

    thread = threading.Thread(target=pokes)
    thread.start()
    try:
        time.sleep(run_s)
        stop.set()
        try:
            while True:
                body(obj, [])
        except closed_error:
            pass
    finally:
        stop.set()
        thread.join(join_s)
        close(obj)
    assert not thread.is_alive(), "the other thread's control calls did not end"
    return answers
