"""The batch read's waits, bounded and watched like a reader's (issues 43 and 47).

A copy out of a memory-mapped source on a hung mount never returns; here the
window copies of a batch read (``_held._bits_windows`` and ``_numpy_windows``) are
replaced by one that blocks until the test lets it go: failure injection, with
real threads, a real loader and real tensors around it.
"""

from __future__ import annotations

import threading
import time
import warnings

import numpy as np
import pytest
import torch

import chunkstream as cs
from chunkstream._memory import HostBufferPool
from chunkstream.pipeline import _held
from chunkstream.pipeline import _lane as _lane_module
from chunkstream.pipeline._lane import BatchLane, Request

T, WIDTH, WINDOW, BATCH = 4096, 8, 16, 32


def _hung_mount_copy(monkeypatch) -> threading.Event:
    """Every window copy of a batch read blocks until the returned event is set (60 s
    at most, so a failing test ends)."""
    release = threading.Event()
    for name in ("_bits_windows", "_numpy_windows"):
        copy = getattr(_held, name)

        def stuck_on_a_hung_mount(src, dst, starts, window, copy=copy):
            release.wait(60)
            copy(src, dst, starts, window)

        monkeypatch.setattr(_held, name, stuck_on_a_hung_mount)
    return release


def _loader(**loader_options):
    data = np.arange(T * WIDTH, dtype=np.float32).reshape(T, WIDTH)
    return cs.ChunkLoader(cs.NumpySource({"x": data}), 1024, device="cpu", seed=0,
                          options=cs.LoaderOptions(**loader_options))  # fmt: skip


def _stream(**loader_options):
    loader = _loader(**loader_options)
    stream = cs.BatchStream(loader, window=WINDOW, batch_size=BATCH, batches_per_chunk=2,
                            fields="x", buffer="host", mix=1,
                            options=cs.StreamOptions(gather_threads=2))  # fmt: skip
    return loader, stream


def test_a_stuck_batch_read_is_reported_with_its_stack_within_the_stall_timeout(monkeypatch):
    release = _hung_mount_copy(monkeypatch)
    loader, stream = _stream(stall_timeout=0.5)
    try:
        began = time.monotonic()
        with pytest.raises(cs.LoaderStalledError) as info:
            next(iter(stream))
        took = time.monotonic() - began
        message = str(info.value)
        assert "stall_timeout" in message
        assert "stuck_on_a_hung_mount" in message  # the stuck reader's stack
        assert 'Thread "chunkstream-batch-' in message
        assert took < 0.5 + 5, took
    finally:
        release.set()
        began = time.monotonic()
        loader.close()
    assert time.monotonic() - began < 5 + 1


def test_close_ends_a_wait_for_a_stuck_batch_read_within_its_deadline(monkeypatch):
    release = _hung_mount_copy(monkeypatch)
    loader, stream = _stream(stall_timeout=60, close_timeout=1.0)
    batches = iter(stream)
    warned: list[str] = []

    def close() -> None:  # the stuck batch reader is a loader thread: close() says so
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader.close()
        warned.extend(str(w.message) for w in caught)

    closer = threading.Timer(0.5, close)
    closer.start()
    try:
        began = time.monotonic()
        with pytest.raises(cs.LoaderClosedError, match="closed"):
            next(batches)
        assert time.monotonic() - began < 0.5 + 1.0 + 2, "close() did not end the wait"
    finally:
        closer.join(10)
        release.set()
    assert not closer.is_alive()
    assert any("chunkstream-batch-" in w for w in warned), warned


def test_the_sets_of_abandoned_batch_reads_come_back(monkeypatch):
    """A stall shuts the loader down with reads in flight: each read's set comes back
    once its copy ends (the stuck ones when let go), and no set is lost."""
    release = _hung_mount_copy(monkeypatch)
    loader, stream = _stream(stall_timeout=0.3)
    with loader:
        with pytest.raises(cs.LoaderStalledError):
            next(iter(stream))
        release.set()
        pool = stream._tier.lane._pool
        deadline = time.monotonic() + 10
        while any(b.busy for b in pool._sets) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(b.busy for b in pool._sets)
        assert pool.allocated == stream.batch_prefetch + 2
        with pytest.raises(cs.LoaderClosedError):
            next(iter(stream))  # the stall shut the loader down, as for a chunk


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_the_batch_read_copies_every_bit(dtype):
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
    _held.HeldSource({"x": x}).read_windows(starts, 10, {"x": out})
    for b, s in enumerate(starts):
        assert torch.equal(out[b].view(bits), raw[s : s + 10])


def _lane(loader, depth):
    return BatchLane(loader, ("x",), window=4, batch_size=2, device=torch.device("cpu"),
                     depth=depth, threads=2)  # fmt: skip


def _fail_reads_at(monkeypatch, start: int, error: BaseException) -> None:
    """Batch reads whose first window starts at ``start`` raise ``error``; others copy."""
    copy = _held._bits_windows

    def failing(src, dst, starts, window):
        if starts[0] == start:
            raise error
        copy(src, dst, starts, window)

    monkeypatch.setattr(_held, "_bits_windows", failing)


def test_a_failed_batch_read_is_raised_at_its_own_turn(monkeypatch):
    """Batches are read ahead, but a batch's error comes after every batch before it."""
    _fail_reads_at(monkeypatch, 3, OSError("bad sector"))
    with _loader() as loader:
        x = torch.arange(400, dtype=torch.float32).reshape(100, 4)
        batches = _lane(loader, 3).batches(
            {"x": x}, [Request(torch.tensor([b, 50]), b) for b in range(5)]
        )
        got = [next(batches)[1], next(batches)[1], next(batches)[1]]
        assert got == [0, 1, 2]
        with pytest.raises(OSError, match="bad sector"):
            next(batches)


def test_every_set_a_batch_read_takes_is_given_back_once(monkeypatch):
    """A failed read gives its set back; those read ahead are dropped with the run: each
    set taken is given back exactly once (twice queued, one set would serve two reads)."""
    given_back: list[int] = []
    taken: list[int] = []
    release, acquire = HostBufferPool.release, HostBufferPool.acquire

    def counted_release(self, buffers, after=None):
        given_back.append(id(buffers))
        release(self, buffers, after)

    def counted_acquire(self, cancelled=None):
        buffers = acquire(self, cancelled)
        taken.append(id(buffers))
        return buffers

    monkeypatch.setattr(HostBufferPool, "release", counted_release)
    monkeypatch.setattr(HostBufferPool, "acquire", counted_acquire)
    _fail_reads_at(monkeypatch, 1, RuntimeError("read failed"))
    with _loader() as loader:
        lane = _lane(loader, 2)
        x = torch.arange(400, dtype=torch.float32).reshape(100, 4)
        batches = lane.batches({"x": x}, [Request(torch.tensor([b, 50]), b) for b in range(4)])
        assert next(batches)[1] == 0
        with pytest.raises(RuntimeError, match="read failed"):
            next(batches)
        batches.close()
        lane.settle()  # every read of the run has ended
    assert len(taken) == len(given_back) >= 2
    assert sorted(taken) == sorted(given_back)


def test_a_held_slot_is_refilled_only_after_every_read_over_it_ended(monkeypatch):
    """The ownership rule (pipeline/_lane.py): batch reads left in flight by a consumer
    that stopped early are waited for before the refill writes the rows they read."""
    reading, overlaps = [0], []
    lock = threading.Lock()
    copy = _held._bits_windows

    def slow_read(src, dst, starts, window):
        with lock:
            reading[0] += 1
        time.sleep(0.05)
        copy(src, dst, starts, window)
        with lock:
            reading[0] -= 1

    fill = _held.copy_rows

    def watched_fill(dst, src):
        overlaps.append(reading[0])
        fill(dst, src)

    monkeypatch.setattr(_held, "_bits_windows", slow_read)
    monkeypatch.setattr(_lane_module, "copy_rows", watched_fill)
    with _loader() as loader:
        lane = _lane(loader, 3)
        x = torch.arange(400, dtype=torch.float32).reshape(100, 4)
        storage = x.clone()
        batches = lane.batches(
            {"x": storage}, [Request(torch.tensor([b, 50]), b) for b in range(8)]
        )
        assert next(batches)[1] == 0
        batches.close()  # three reads still in flight over the storage
        lane.fill(storage, x + 1)
        assert overlaps and not any(overlaps), overlaps
        torch.testing.assert_close(storage, x + 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64])
def test_windows_of_memcpy_size_are_copied_bit_for_bit(dtype):
    """Windows of at least ``MEMCPY_FROM`` bytes take glibc's memcpy, smaller ones the
    ufunc loop: both give the source's bytes (NaN payloads included)."""
    itemsize = np.dtype(dtype).itemsize
    row = _held.MEMCPY_FROM // itemsize // 2  # two rows: one window at the threshold
    bits = np.random.default_rng(3).integers(0, 255, (9 * row * itemsize,), dtype=np.uint8)
    src = torch.from_numpy(bits.view(dtype).reshape(9, row))
    starts = [0, 7, 3, 3]
    for window in (1, 2):  # below the threshold, then at it
        out = torch.empty((len(starts), window, row), dtype=src.dtype)
        _held.copy_windows(src, out, starts, window)
        for b, s in enumerate(starts):
            assert out[b].numpy().tobytes() == src[s : s + window].numpy().tobytes()
