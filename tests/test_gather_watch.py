"""The host gather's waits, bounded and watched like a reader's (issue 43).

A copy out of a memory-mapped source on a hung mount never returns; here the
window copies of the gather (``_gather._bits_windows`` and ``_numpy_windows``) is replaced by one that
blocks until the test lets it go: failure injection, with real threads, a real
loader and real tensors around it.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

import chunkstream as cs
from chunkstream.consumer import _gather
from chunkstream.consumer._gather import GatherPool, Watch
from chunkstream.consumer._shuffle import HostTier, Request

T, WIDTH, WINDOW, BATCH = 4096, 8, 16, 32


def _hung_mount_copy(monkeypatch) -> threading.Event:
    """Every window copy of the gather blocks until the returned event is set (60 s
    at most, so a failing test ends)."""
    release = threading.Event()
    for name in ("_bits_windows", "_numpy_windows"):
        copy = getattr(_gather, name)

        def stuck_on_a_hung_mount(src, dst, starts, window, lo, hi, copy=copy):
            release.wait(60)
            copy(src, dst, starts, window, lo, hi)

        monkeypatch.setattr(_gather, name, stuck_on_a_hung_mount)
    return release


def _stream(**loader_options):
    data = np.arange(T * WIDTH, dtype=np.float32).reshape(T, WIDTH)
    loader = cs.ChunkLoader(cs.NumpySource({"x": data}), 1024, device="cpu", seed=0,
                            options=cs.LoaderOptions(**loader_options))  # fmt: skip
    stream = cs.BatchStream(loader, window=WINDOW, batch_size=BATCH, batches_per_chunk=2,
                            fields="x", buffer="host", mix=1,
                            options=cs.StreamOptions(gather_threads=2))  # fmt: skip
    return loader, stream


def test_a_stuck_gather_is_reported_with_its_stack_within_the_stall_timeout(monkeypatch):
    release = _hung_mount_copy(monkeypatch)
    loader, stream = _stream(stall_timeout=0.5)
    try:
        began = time.monotonic()
        with pytest.raises(cs.LoaderStalledError) as info:
            next(iter(stream))
        took = time.monotonic() - began
        message = str(info.value)
        assert "stall_timeout" in message
        assert "stuck_on_a_hung_mount" in message  # the stuck helper's stack
        assert 'Thread "chunkstream-gather-' in message
        assert took < 0.5 + 5, took
    finally:
        release.set()
        began = time.monotonic()
        loader.close()
    assert time.monotonic() - began < 5 + 1


def test_close_ends_a_wait_for_a_stuck_gather_within_its_deadline(monkeypatch):
    release = _hung_mount_copy(monkeypatch)
    loader, stream = _stream(stall_timeout=60, close_timeout=1.0)
    batches = iter(stream)
    closer = threading.Timer(0.5, loader.close)
    closer.start()
    try:
        began = time.monotonic()
        with pytest.raises(cs.LoaderClosedError, match="closed while a batch"):
            next(batches)
        assert time.monotonic() - began < 0.5 + 1.0 + 2, "close() did not end the wait"
    finally:
        closer.join(10)
        release.set()
    assert not closer.is_alive()


def test_the_slots_of_abandoned_gathers_come_back(monkeypatch):
    """A stream closed with gathers ahead: each slot comes back once its claimed blocks
    end (the stuck ones when let go), so the next epoch reuses them all."""
    release = _hung_mount_copy(monkeypatch)
    loader, stream = _stream(stall_timeout=0.3)
    with loader:
        with pytest.raises(cs.LoaderStalledError):
            next(iter(stream))
        release.set()
        monkeypatch.undo()
        pool = stream._tier.slots._slots
        deadline = time.monotonic() + 10
        while any(b.busy for b in pool._sets) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(b.busy for b in pool._sets)
        batch = next(iter(stream))  # the next iteration gathers into the same slots
        assert batch.shape == (BATCH, WINDOW, WIDTH)
        assert pool.allocated == stream.batch_prefetch + 2


def test_a_watched_job_is_gathered_by_the_helpers_alone():
    """Its caller only waits (so it can see a stall), also with one thread."""
    ran_on: list[str] = []
    job = GatherPool(1).submit(
        lambda block: ran_on.append(threading.current_thread().name), 4, watch=Watch()
    )
    job.wait()
    assert len(ran_on) == 4
    assert all(name.startswith("chunkstream-gather-") for name in ran_on)


def test_a_watch_on_a_closed_loader_cancels_the_job_and_its_then_runs_once():
    calls: list[bool] = []
    gate = threading.Event()
    job = GatherPool(1).submit(lambda block: gate.wait(10), 3, calls.append,
                               watch=Watch(closed=lambda: True))  # fmt: skip
    try:
        with pytest.raises(cs.LoaderClosedError):
            job.wait()
    finally:
        gate.set()
    deadline = time.monotonic() + 10
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls == [True]  # once the claimed block ended: the slot would come back
    assert job.cancel() is False


def test_cancel_says_whether_the_job_had_finished():
    job = GatherPool(2).submit(lambda block: None, 3, watch=Watch())
    job.wait()
    assert job.cancel() is True  # finished: its output is the caller's to give back
    out = torch.zeros(2)
    pending = GatherPool(1).submit(lambda block: out.add_(1), 0)
    assert pending.cancel() is True  # no blocks: finished at once


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_the_gather_copies_every_bit(dtype):
    """Same-dtype windows are copied as unsigned ints: signalling NaNs with payloads,
    -0.0 and infinities arrive bit for bit."""
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[
        torch.empty(0, dtype=dtype).element_size()
    ]
    info = torch.iinfo(bits)
    raw = torch.randint(info.min, info.max, (300, 6), dtype=bits)
    x = raw.view(dtype)
    starts = [0, 17, 290, 5]
    out = torch.empty((len(starts), 10, 6), dtype=dtype)
    _gather.host_gather(x, starts, 10, out, pool=GatherPool(2))
    for b, s in enumerate(starts):
        assert torch.equal(out[b].view(bits), raw[s : s + 10])


def test_a_failed_gather_is_raised_at_its_own_turn(monkeypatch):
    """Gathers run ahead, but a batch's error comes after every batch before it."""
    copy = _gather._bits_windows

    def fails_at_the_third(src, dst, starts, window, lo, hi):
        if starts[lo] == 3:
            raise OSError("bad sector")
        copy(src, dst, starts, window, lo, hi)

    monkeypatch.setattr(_gather, "_bits_windows", fails_at_the_third)
    tier = HostTier(("x",), window=4, batch_size=2, device=torch.device("cpu"), depth=3,
                    gather=GatherPool(2))  # fmt: skip
    x = torch.arange(400, dtype=torch.float32).reshape(100, 4)
    storage = tier.store({"x": x}, 100)
    tier.copy_rows(storage["x"], x)
    requests = [Request(torch.tensor([b, 50]), b) for b in range(5)]
    batches = tier.batches(storage, requests)
    got = [next(batches)[1], next(batches)[1], next(batches)[1]]
    assert got == [0, 1, 2]
    with pytest.raises(OSError, match="bad sector"):
        next(batches)


def test_a_slot_whose_copy_failed_is_given_back_once(monkeypatch):
    """Once the consumer hands a gathered slot to the copy, the copy gives it back (on
    CUDA behind a fence); closing the tier after the copy failed must not give it back
    again (twice queued, one slot would be handed to two gathers)."""
    from chunkstream._memory import HostBufferPool
    from chunkstream.consumer._slots import BatchSlots

    given_back: list[int] = []
    release = HostBufferPool.release

    def counted(self, buffers, after=None):
        given_back.append(id(buffers))
        release(self, buffers, after)

    def failing_copy(self, gather):
        gather.slots.release(gather.buffers)  # as copy_to_device does on a failed copy
        raise RuntimeError("copy failed")

    monkeypatch.setattr(HostBufferPool, "release", counted)
    monkeypatch.setattr(BatchSlots, "deliver", failing_copy)
    tier = HostTier(("x",), window=4, batch_size=2, device=torch.device("cpu"), depth=2,
                    gather=GatherPool(2))  # fmt: skip
    x = torch.arange(400, dtype=torch.float32).reshape(100, 4)
    batches = tier.batches({"x": x}, [Request(torch.tensor([b, 50]), b) for b in range(4)])
    with pytest.raises(RuntimeError, match="copy failed"):
        next(batches)
    batches.close()
    deadline = time.monotonic() + 10
    while len(given_back) < 3 and time.monotonic() < deadline:  # the others' cancels
        time.sleep(0.01)
    time.sleep(0.2)
    assert len(given_back) == len(set(given_back)) == 3, given_back
