"""Preemption of a ``BatchStream``: a handler that saves ``state_dict()`` and closes, at any moment.

DESIGN's preemption contract on the batch side, both buffer tiers: a scheduler's
signal runs its handler on the main thread between two bytecodes of whatever the
main thread was doing (drawing starts, adding a chunk to the buffer, gathering a
batch on the host, waiting for a gather's future, receiving a copy), the handler
saves ``stream.state_dict()`` and closes the loader (``BatchStream`` delegates its
shutdown to the loader), then ends the body as ``sys.exit`` would. Moments come
from two sources:

* a sweep of profile events: the handler runs inside every consumer function the
  main thread enters, and at every C call such a function makes (a lock's
  ``acquire``, a wait, a copy);
* real ``SIGALRM`` timers at spread delays, landing wherever the main thread is
  while the readers read and the gather helpers copy.

No trial may hang; every saved state must be the position after the batches the
body received (or one more: the handler may land after a batch was handed over
and before the body logged it) and resume to exactly the rest of its epoch.

The harness here is small and local (``_trial``); the loader's own preemption
tests (issue 37a) keep theirs.
"""

from __future__ import annotations

import _thread
import random
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

import chunkstream as cs
from tests.faults import wait_for_no_threads

T, WINDOW, CHUNK = 2400, 12, 200
PER_CHUNK, CHUNKS = 4, 5
PER_EPOCH = PER_CHUNK * CHUNKS
EPOCHS = 2
CLOSE_TIMEOUT = 2.0

_t = np.arange(T, dtype=np.float32)
ARRAYS = {"x": np.stack([_t, -_t], axis=1), "s": (2 * _t)[:, None].repeat(3, axis=1)}

# (buffer, mix, batch_prefetch, device): both tiers, with and without a shuffle buffer.
TIERS = {
    "device-mix1": ("device", 1, 0, "cpu"),
    "device-mix3": ("device", 3, 0, "cpu"),
    "host-mix1": ("host", 1, 2, "cpu"),
    "host-mix3": ("host", 3, 2, "cpu"),
}
GPU_TIERS = {
    "cuda-device-mix3": ("device", 3, 0, "cuda"),
    "cuda-host-mix3": ("host", 3, 2, "cuda"),
}


def _stream(tier: str) -> cs.BatchStream:
    buffer, mix, prefetch, device = {**TIERS, **GPU_TIERS}[tier]
    on_device = device if buffer == "device" else "cpu"
    loader = cs.ChunkLoader(
        cs.NumpySource(ARRAYS),
        CHUNK,
        device=on_device,
        workers=2,
        prefetch=2,
        sampling="shuffled",
        seed=5,
        pieces=2,
        close_timeout=CLOSE_TIMEOUT,
        stall_timeout=60.0,
    )
    return cs.BatchStream(
        loader,
        window=WINDOW,
        batch_size=8,
        batches_per_chunk=PER_CHUNK,
        chunks_per_epoch=CHUNKS,
        mix=mix,
        buffer=buffer,
        batch_prefetch=prefetch,
        device=device,
    )


def _digest(batch: dict[str, torch.Tensor]) -> tuple[int, ...]:
    x = batch["x"]
    # every batch is whole: windows of the source, both fields alike
    t0 = x[:, :1, 0]
    assert torch.equal(x[:, :, 0], t0 + torch.arange(WINDOW, device=x.device))
    assert torch.equal(batch["s"][:, :, 0], 2 * x[:, :, 0])
    return tuple(int(v) for v in t0.reshape(-1).tolist())


def _body(stream: cs.BatchStream, log: list) -> None:
    for _ in range(EPOCHS):
        for batch in stream:
            log.append(_digest(batch))


class Preempted(BaseException):  # what a real handler's sys.exit would raise
    """Raised by the first handler once it checkpointed and closed."""


@dataclass
class Trial:
    moment: Any
    fired: int = 0
    state: Any = None
    log: list = field(default_factory=list)
    where: list[str] = field(default_factory=list)
    handler_s: float = 0.0
    hung: str | None = None
    error: BaseException | None = None


def save_and_close(stream: cs.BatchStream) -> Any:
    state = stream.state_dict()
    stream.loader.close()
    return state


def save_reload_and_close(stream: cs.BatchStream) -> Any:
    """Also resume the saved state from the handler, which must then report it unchanged."""
    state = stream.state_dict()
    stream.load_state_dict(state)
    again = stream.state_dict()
    assert again["batch"] == state["batch"] and again["refill"] == state["refill"]
    assert {k: v for k, v in again["loader"].items() if k != "num_chunks"} == {
        k: v for k, v in state["loader"].items() if k != "num_chunks"
    }
    stream.loader.close()
    return state


def _frames(frame: Any, limit: int = 8) -> list[str]:
    names = []
    while frame is not None and len(names) < limit:
        names.append(f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}")
        frame = frame.f_back
    return names


# The events a handler runs at: a function's start and just before a C call, where a real
# signal's handler can run too. Not a C call's return: a handler raising there, after
# ``lock.__enter__`` acquired the lock and before the ``with`` block began, would leave it
# held, which a real signal cannot do (CPython runs handlers between bytecodes).
# Nor just before a lock's ``__exit__`` at the end of a ``with`` block: a raising handler
# there leaks the lock in any Python code (bpo-29988), which is no finding about ours.
_BEFORE = ("call", "c_call")


def _counts(event: str, arg: Any) -> bool:
    if event not in _BEFORE:
        return False
    return not (event == "c_call" and getattr(arg, "__name__", "") in ("__exit__", "release"))


def _sites(tier: str, keep: str) -> list[int]:
    """The profile event counts (in files whose path holds ``keep``) of the first event at
    each distinct site of one uninterrupted body: a sweep over them interrupts the body
    once inside every function the main thread enters there."""
    stream = _stream(tier)
    count, sites = 0, {}

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if not _counts(event, arg) or keep not in frame.f_code.co_filename:
            return
        count += 1
        inner = getattr(arg, "__qualname__", "") if event.startswith("c_") else ""
        sites.setdefault(f"{event} {frame.f_code.co_name} {inner}", count)

    try:
        sys.setprofile(profile)
        try:
            _body(stream, [])
        finally:
            sys.setprofile(None)
    finally:
        stream.loader.close()
    return sorted(sites.values())


def _spread(sites: list[int], n: int) -> list[int]:
    """At most ``n`` of ``sites``, evenly spread (the first and the last kept)."""
    if len(sites) <= n:
        return sites
    return [sites[round(i * (len(sites) - 1) / (n - 1))] for i in range(n)]


def _in_gc_callback(frame: Any) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.endswith(("weakref.py", "_weakrefset.py")):
            return True
        frame = frame.f_back
    return False


def _trial(tier: str, moment: Any, handler: Any, keep: str, hang_s: float = 30.0) -> Trial:
    """One fresh stream, ``_body`` on the main thread, ``handler`` at ``moment``: a profile
    event count (int) or an alarm delay in seconds (float)."""
    trial = Trial(moment)
    stream = _stream(tier)
    log: list = []
    main = threading.main_thread().ident
    busy = False

    def run_handler(frame: Any) -> None:
        nonlocal busy
        if busy:
            return
        first = trial.fired == 0
        trial.fired += 1
        if first:
            trial.where, trial.log = _frames(frame), list(log)
        busy, began = True, time.monotonic()
        try:
            state = handler(stream)
        finally:
            busy = False
            trial.handler_s = max(trial.handler_s, time.monotonic() - began)
        if first:
            trial.state = state
            # A real signal may land between a lock's acquire and its ``with`` block, where
            # an exception from the handler leaks the lock (bpo-29988; the profile sweep
            # skips those two points): there the closed loader ends the body instead.
            # Inside a weakref callback the garbage collector runs, the exception would be
            # swallowed (reported as unraisable): there too the closed loader ends it.
            if not isinstance(moment, float) and not _in_gc_callback(frame):
                raise Preempted

    calls = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if not _counts(event, arg) or keep not in frame.f_code.co_filename:
            return
        calls += 1
        if calls == moment:
            sys.setprofile(None)
            run_handler(frame)

    def watchdog() -> None:
        frame = sys._current_frames().get(main)
        trial.hung = "".join(traceback.format_stack(frame)) if frame else "?"
        _thread.interrupt_main()

    dog = threading.Timer(hang_s, watchdog)
    dog.daemon = True
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: run_handler(frame))
    try:
        dog.start()
        try:
            if isinstance(moment, float):
                signal.setitimer(signal.ITIMER_REAL, moment)
            else:
                sys.setprofile(profile)
            try:
                _body(stream, log)
            finally:
                sys.setprofile(None)
                signal.setitimer(signal.ITIMER_REAL, 0)
        except Preempted:
            pass
        except KeyboardInterrupt:
            if trial.hung is None:
                raise
        except cs.LoaderClosedError:
            pass  # the closed loader's answer to a later call
        except BaseException as exc:
            trial.error = exc
        finally:
            dog.cancel()
    finally:
        signal.signal(signal.SIGALRM, previous)
        stream.loader.close()
    return trial


def _reference(tier: str) -> list[tuple[int, ...]]:
    stream = _stream(tier)
    try:
        log: list = []
        for _ in range(EPOCHS + 1):
            log += [_digest(b) for b in stream]
        return log
    finally:
        stream.loader.close()


def _check(trials: list[Trial], tier: str, *, resumes: int = 4) -> None:
    report = "\n".join(
        f"{t.moment}: fired={t.fired} log={len(t.log)} where={t.where[:3]} "
        f"state={t.state and (t.state['loader'], t.state['batch'], t.state['refill'])} "
        f"error={t.error!r} hung={t.hung}"
        for t in trials
    )
    assert all(t.hung is None for t in trials), report
    assert all(t.error is None for t in trials), report
    assert all(t.handler_s < CLOSE_TIMEOUT + 1.0 for t in trials), report
    assert not wait_for_no_threads(), report
    reference = _reference(tier)
    fired = [t for t in trials if t.fired]
    for t in random.Random(0).sample(fired, min(resumes, len(fired))):
        resumed = _stream(tier)
        try:
            resumed.load_state_dict(t.state)
            rest = [_digest(b) for b in resumed]  # the rest of the interrupted epoch
        finally:
            resumed.loader.close()
        # After the batches the body logged, or one more: the handler may land after a
        # batch was handed over and before the body logged it.
        allowed = []
        for j in (len(t.log), len(t.log) + 1):
            allowed.append(reference[j : (j // PER_EPOCH + 1) * PER_EPOCH])
        assert rest in allowed, f"{t.moment}: {len(rest)} batches\n{report}"
        assert t.log == reference[: len(t.log)]


@pytest.mark.parametrize("tier", list(TIERS))
def test_a_handler_inside_every_consumer_function_checkpoints_and_closes(tier):
    sites = _sites(tier, "consumer")
    assert len(sites) > 20  # the sweep reaches into the gather, the mixer, the tiers
    moments = _spread(sites, 40)
    trials = [_trial(tier, k, save_and_close, "consumer") for k in moments]
    assert sum(t.fired > 0 for t in trials) > 0.9 * len(trials)
    where = {name for t in trials for name in t.where[:2]}
    inside = ["_batches.py:_batches", "_mixing.py:add", "_mixing.py:sample"]
    if TIERS[tier][0] == "host":
        inside += ["_shuffle.py:batches", "_slots.py:submit"]
        # Which gather function the main thread is in when a sampled call lands depends
        # on how far the helpers got; that it lands inside the gather pool does not.
        assert any(name.startswith("_gather.py:") for name in where), sorted(where)
    for name in inside:
        assert name in where, sorted(where)
    _check(trials, tier)


@pytest.mark.parametrize("tier", ["device-mix3", "host-mix3"])
def test_load_state_dict_from_a_handler_at_every_consumer_function(tier):
    moments = _spread(_sites(tier, "consumer"), 15)
    trials = [_trial(tier, k, save_reload_and_close, "consumer") for k in moments]
    _check(trials, tier, resumes=2)


@pytest.mark.parametrize("tier", list(TIERS))
def test_signals_while_the_helpers_gather_and_the_readers_read(tier):
    start = time.monotonic()
    _body(probe := _stream(tier), [])
    probe.loader.close()
    span = time.monotonic() - start
    rng = random.Random(2)
    moments = [rng.uniform(0.0, span) for _ in range(8)]
    trials = [_trial(tier, d, save_and_close, "chunkstream") for d in moments]
    _check(trials, tier)


@pytest.mark.parametrize("tier", ["device-mix3", "host-mix3"])
def test_control_calls_from_another_thread_while_the_main_thread_iterates(tier):
    stream = _stream(tier)
    states: list[dict] = []
    stop = threading.Event()

    def poke() -> None:
        while not stop.is_set():
            states.append(stream.state_dict())
            time.sleep(0.001)
        stream.loader.close()

    thread = threading.Thread(target=poke)
    log: list = []
    thread.start()
    try:
        time.sleep(0.05)
        stop.set()
        with pytest.raises(cs.LoaderClosedError):
            while True:
                _body(stream, log)
    finally:
        stop.set()
        thread.join(CLOSE_TIMEOUT + 2.0)
        stream.loader.close()
    assert not thread.is_alive()
    assert states and all(0 <= s["batch"] < PER_CHUNK and 0 <= s["refill"] < 3 for s in states)
    assert not wait_for_no_threads()


@pytest.mark.gpu
@pytest.mark.parametrize("tier", list(GPU_TIERS))
def test_on_cuda_a_handler_inside_every_consumer_function_checkpoints_and_closes(tier):
    moments = _spread(_sites(tier, "consumer"), 30)
    trials = [_trial(tier, k, save_and_close, "consumer") for k in moments]
    _check(trials, tier)


@pytest.mark.gpu
@pytest.mark.parametrize("tier", list(GPU_TIERS))
def test_on_cuda_signals_while_batches_are_copied(tier):
    start = time.monotonic()
    _body(probe := _stream(tier), [])
    probe.loader.close()
    span = time.monotonic() - start
    rng = random.Random(3)
    trials = [
        _trial(tier, rng.uniform(0.0, span), save_and_close, "chunkstream") for _ in range(10)
    ]
    _check(trials, tier)
