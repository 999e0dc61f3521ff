"""Preemption: a handler that saves ``state_dict()`` and calls ``close()``, at any moment.

The loader's side of DESIGN's preemption contract, driven by :mod:`tests.preempt`:
the handler interrupts the main thread inside every function it enters (a sweep of
profile events: the plan being drawn, the publication under the loader's lock, a
take under the run's lock, a wait on a future, the stats' lock) and at random
moments with a real signal while the readers read (and, on CUDA, copy), also with
a repeating timer whose handlers nest. No trial may hang; every saved state must
be the position after the chunks the body received, and resume to the rest of
the epoch; ``close()`` must end within its deadline and leave no thread.
"""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

import chunkstream as cs
from tests.faults import ArraySource, make_arrays, wait_for_no_threads
from tests.preempt import (
    Alarm,
    Call,
    call_sites,
    describe,
    from_another_thread,
    preempt,
    save_reload_and_close,
)

CHUNKS = 6  # per epoch
EPOCHS = 2
CLOSE_TIMEOUT = 2.0
ARRAYS = make_arrays(12_000, 8)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _loader(device: str, *, delay: float = 0.0) -> cs.ChunkLoader:
    source = ArraySource(ARRAYS, delay=delay) if delay else cs.NumpySource(ARRAYS)
    return cs.ChunkLoader(
        source,
        chunk_size=512,
        device=device,
        workers=2,
        prefetch=2,
        seed=3,
        options=cs.LoaderOptions(
            pieces=16,  # the reported case: a 16-piece plan
            close_timeout=CLOSE_TIMEOUT,
            stall_timeout=60.0,
        ),
    )


def _body(loader: cs.ChunkLoader, log: list) -> None:
    for _ in range(EPOCHS):
        for chunk in loader.epoch(CHUNKS):
            log.append((chunk.epoch, chunk.index))


def _pieces(loader: cs.ChunkLoader, n: int) -> list:
    out = []
    for chunk in loader.epoch(n):
        out.append(tuple((p.start, p.stop) for p in chunk.pieces))
    return out


def _check(trials: list, *, device: str, resumes: int = 4) -> None:
    """No hang, no error, close within its deadline, states that match what was received."""
    report = describe(trials)
    assert all(t.error is None for t in trials), report
    assert all(t.handler_s < CLOSE_TIMEOUT + 1.0 for t in trials), report
    assert not wait_for_no_threads(), report
    for t in trials:
        if not t.fired:
            continue
        got = (t.state["epoch"], t.state["step"])
        # The handler may land after a chunk was handed to the body and before the body
        # logged it: the state is then one chunk ahead of the log, never behind.
        allowed = {divmod(len(t.log), CHUNKS), divmod(len(t.log) + 1, CHUNKS)}
        assert got in allowed, f"{t.moment}: state {t.state} after {t.log}\n{report}"
    # The saved states resume to the rest of their epoch.
    reference = _loader(device)
    try:
        expected = [_pieces(reference, CHUNKS) for _ in range(EPOCHS + 1)]
    finally:
        reference.close()
    fired = [t for t in trials if t.fired]
    for t in random.Random(0).sample(fired, min(resumes, len(fired))):
        epoch, step = t.state["epoch"], t.state["step"]
        with _loader(device) as resumed:
            resumed.load_state_dict(t.state)
            assert _pieces(resumed, CHUNKS) == expected[epoch][step:], t


def _sweep(device: str, every: int = 1) -> list[Call]:
    sites = call_sites(lambda: _loader(device), _body)
    return [Call(k) for k, _ in sites[::every]]


@pytest.mark.parametrize("device", DEVICES)
def test_a_handler_inside_every_function_checkpoints_and_closes(device):
    moments = _sweep(device)
    assert len(moments) > 50  # the sweep reaches deep into the loader, not a few calls
    trials = preempt(lambda: _loader(device), _body, moments, closed_error=cs.LoaderClosedError)
    assert sum(t.fired > 0 for t in trials) > 0.9 * len(trials), describe(trials)
    where = {name for t in trials for name in t.where[:3]}
    for inside in ("_cursor.py:draw", "_run.py:take", "_executor.py:done_within"):
        assert inside in where, sorted(where)  # interrupted there at least once
    _check(trials, device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_load_state_dict_from_a_handler_at_every_function(device):
    moments = _sweep(device, every=3)
    trials = preempt(
        lambda: _loader(device),
        _body,
        moments,
        handler=save_reload_and_close,
        closed_error=cs.LoaderClosedError,
    )
    _check(trials, device=device, resumes=2)


@pytest.mark.parametrize("device", DEVICES)
def test_signals_while_workers_read_and_handlers_nest(device):
    # Reads sleep, so signals land while the readers read and the consumer waits.
    start = time.monotonic()
    _body(probe := _loader(device, delay=0.002), [])
    probe.close()
    span = time.monotonic() - start
    rng = random.Random(1)
    moments = [Alarm(rng.uniform(0, span)) for _ in range(16)]
    # A repeating timer: the handler runs again inside close()'s joins and waits.
    moments += [Alarm(rng.uniform(0, span), repeat=0.0005) for _ in range(8)]
    trials = preempt(
        lambda: _loader(device, delay=0.002),
        _body,
        moments,
        closed_error=cs.LoaderClosedError,
    )
    workers = [w for t in trials for w in t.workers]
    assert any("chunkstream-read" in w for w in workers), describe(trials)
    assert any(t.fired > 1 for t in trials), describe(trials)  # nested handlers ran
    _check(trials, device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_control_calls_from_another_thread_while_the_main_thread_iterates(device):
    def poke(loader: cs.ChunkLoader) -> dict:
        state = loader.state_dict()
        loader.load_state_dict(state)  # a resume to where it is: harmless, but it drops
        return state

    states = from_another_thread(
        _loader(device, delay=0.001),
        _body,
        poke,
        closed_error=cs.LoaderClosedError,
        join_s=CLOSE_TIMEOUT + 2.0,
    )
    assert states and all(s["step"] >= 0 for s in states)
    assert not wait_for_no_threads()


def test_the_reported_deadlock_a_timer_signal_during_epoch():
    """Issue 37's reproduction: a one-shot timer signal during ``epoch()`` of a 16-piece
    plan, whose handler saves the state and closes (before: a hang on the loader's lock)."""
    moments = [Alarm(d) for d in np.linspace(0.0, 0.002, 12)]
    trials = preempt(
        lambda: _loader("cpu"), _body, moments, closed_error=cs.LoaderClosedError, hang_s=20
    )
    _check(trials, device="cpu", resumes=2)
