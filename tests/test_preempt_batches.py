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

The driver is the loader's (:mod:`tests.preempt`): only the object, the body and
the handler differ (a ``BatchStream`` closes through its loader).
"""

from __future__ import annotations

import random
import time
from typing import Any

import numpy as np
import pytest
import torch

import chunkstream as cs
from tests.faults import wait_for_no_threads
from tests.preempt import Alarm, Call, Trial, call_sites, describe, from_another_thread, preempt

T, WINDOW, CHUNK = 2400, 12, 200
PER_CHUNK, CHUNKS = 4, 5
PER_EPOCH = PER_CHUNK * CHUNKS
EPOCHS = 2
CLOSE_TIMEOUT = 2.0
# The consumer's code on the main thread: consumer/ and the batch lane the loader runs it
# with (pipeline/_lane.py, pipeline/_held.py).
CONSUMER = ("/consumer/", "/pipeline/_lane.py", "/pipeline/_held.py")

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
        options=cs.LoaderOptions(pieces=2, close_timeout=CLOSE_TIMEOUT, stall_timeout=60.0),
    )
    return cs.BatchStream(
        loader,
        window=WINDOW,
        batch_size=8,
        batches_per_chunk=PER_CHUNK,
        mix=mix,
        buffer=buffer,
        device=device,
        options=cs.StreamOptions(chunks_per_epoch=CHUNKS, batch_prefetch=prefetch),
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


def _close(stream: cs.BatchStream) -> None:
    stream.loader.close()


def _sites(tier: str, keep: str) -> list[int]:
    """The moments of a sweep: one per site the main thread's body reaches in files whose
    path holds ``keep`` (:func:`tests.preempt.call_sites`)."""
    return [k for k, _ in _found(tier, keep)]


def _found(tier: str, keep: str) -> list[tuple[int, str]]:
    """``(moment, site)`` of every site of one uninterrupted body (:func:`_sites`)."""
    return call_sites(lambda: _stream(tier), _body, keep=keep, close=_close)


def _trials(tier: str, moments: list, handler: Any, keep: str) -> list[Trial]:
    return preempt(
        lambda: _stream(tier),
        _body,
        moments,
        handler=handler,
        closed_error=cs.LoaderClosedError,
        keep=keep,
        close=_close,
    )


def _alarm_trials(tier: str, *, n: int, seed: int) -> list[Trial]:
    """``n`` trials, each a real ``SIGALRM`` at a random moment of an uninterrupted body's
    span (timed once), landing wherever the main thread is while the readers read and
    the helpers gather (or, on CUDA, copy)."""
    start = time.monotonic()
    _body(probe := _stream(tier), [])
    probe.loader.close()
    span = time.monotonic() - start
    rng = random.Random(seed)
    moments = [Alarm(rng.uniform(0.0, span)) for _ in range(n)]
    return _trials(tier, moments, save_and_close, "chunkstream")


def _spread(sites: list[int], n: int) -> list[int]:
    """At most ``n`` of ``sites``, evenly spread (the first and the last kept)."""
    if len(sites) <= n:
        return sites
    return [sites[round(i * (len(sites) - 1) / (n - 1))] for i in range(n)]


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
    report = describe(trials)
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
    found = _found(tier, CONSUMER)
    # The sweep reaches into the gather, the mixer, the tiers: functions the main thread
    # enters at every batch, whatever the threads beside it have done. Which of them a
    # sampled moment lands in depends on how far those threads got (a wait that polls
    # makes more or fewer events), so the trials are not asserted to land in each.
    reached = {site.split(" ")[1] for _, site in found}
    inside = ["_batches.py:_batches", "_mixing.py:add", "_mixing.py:sample"]
    if TIERS[tier][0] == "host":
        inside += ["_lane.py:batches"]
    for name in inside:
        assert name in reached, sorted(reached)
    assert len(found) > 20
    moments = _spread([k for k, _ in found], 40)
    trials = _trials(tier, [Call(k) for k in moments], save_and_close, CONSUMER)
    assert sum(t.fired > 0 for t in trials) > 0.9 * len(trials)
    _check(trials, tier)


@pytest.mark.parametrize("tier", ["device-mix3", "host-mix3"])
def test_load_state_dict_from_a_handler_at_every_consumer_function(tier):
    moments = _spread(_sites(tier, CONSUMER), 15)
    trials = _trials(tier, [Call(k) for k in moments], save_reload_and_close, CONSUMER)
    _check(trials, tier, resumes=2)


@pytest.mark.parametrize("tier", list(TIERS))
def test_signals_while_the_helpers_gather_and_the_readers_read(tier):
    _check(_alarm_trials(tier, n=8, seed=2), tier)


@pytest.mark.parametrize("tier", ["device-mix3", "host-mix3"])
def test_control_calls_from_another_thread_while_the_main_thread_iterates(tier):
    states = from_another_thread(
        _stream(tier),
        _body,
        lambda stream: stream.state_dict(),
        close=_close,
        closed_error=cs.LoaderClosedError,
        join_s=CLOSE_TIMEOUT + 2.0,
    )
    assert states and all(0 <= s["batch"] < PER_CHUNK and 0 <= s["refill"] < 3 for s in states)
    assert not wait_for_no_threads()


@pytest.mark.gpu
@pytest.mark.parametrize("tier", list(GPU_TIERS))
def test_on_cuda_a_handler_inside_every_consumer_function_checkpoints_and_closes(tier):
    moments = _spread(_sites(tier, CONSUMER), 30)
    trials = _trials(tier, [Call(k) for k in moments], save_and_close, CONSUMER)
    _check(trials, tier)


@pytest.mark.gpu
@pytest.mark.parametrize("tier", list(GPU_TIERS))
def test_on_cuda_signals_while_batches_are_copied(tier):
    _check(_alarm_trials(tier, n=10, seed=3), tier)
