"""The epoch run of futures, with a copy stage as on CUDA, exercised on the CPU.

The copy stage here is a plain function; the structure (a read future per window,
a copy future chained to it, bounded deques, buffers given back exactly once when
a run is dropped) is the one the CUDA path runs.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from chunkstream import ChunkLoadError
from chunkstream._executor import Executor
from chunkstream.pipeline._run import EpochRun


class _Buffers:
    """Counts buffers taken and given back; a read takes one, a copy or reclaim returns it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.out = Counter()

    def take(self, window):
        with self.lock:
            self.out[window] += 1

    def give(self, window):
        with self.lock:
            self.out[window] -= 1
            assert self.out[window] >= 0, f"{window} given back twice"


@pytest.fixture
def executors():
    readers, copier = Executor("read", 3), Executor("transfer", 1)
    yield readers, copier
    end = time.monotonic() + 5
    assert copier.close(end) == [] and readers.close(end) == []


def _run(executors, buffers, windows, *, delay=0.0, fail=None, depth=4, copy_depth=2):
    readers, copier = executors
    in_flight = []

    def read(window, dropped, trip):
        buffers.take(window)
        in_flight.append(window)
        time.sleep(delay)
        if window == fail:
            buffers.give(window)  # as read_job does when a read fails
            raise ChunkLoadError(f"reading {window} failed", window=window)
        return window

    def copy(window, dropped, trip):
        buffers.give(window)  # the slot goes back behind the copy
        return None if dropped() else ("copied", window)

    run = EpochRun(windows, read=read, readers=readers, depth=depth, copy=copy, copier=copier,
                   copy_depth=copy_depth, reclaim=buffers.give)  # fmt: skip
    return run, in_flight


@pytest.mark.parametrize("consumer", ["waits for reads", "finds reads done"])
def test_copies_arrive_in_window_order_within_the_bounds(executors, consumer):
    buffers = _Buffers()
    windows = [(k, k + 1) for k in range(12)]
    slow = consumer == "waits for reads"
    run, in_flight = _run(executors, buffers, windows, delay=0.01 if slow else 0.0)
    got = []
    for _ in windows:
        if not slow:
            time.sleep(0.02)  # every read in the deque is done when its copy is chained
        # Never more windows started than taken + reads + copies.
        assert len(in_flight) <= len(got) + 4 + 2
        got.append(run.take()[0].result(timeout=5))
    assert got == [("copied", w) for w in windows]
    with pytest.raises(IndexError):
        run.take()
    assert sum(buffers.out.values()) == 0  # every buffer came back, once


def test_a_dropped_run_gives_every_buffer_back_exactly_once(executors):
    for stop_after in (0, 1, 3):
        buffers = _Buffers()
        run, _ = _run(executors, buffers, [(k, k + 1) for k in range(10)], delay=0.02)
        for _ in range(stop_after):
            run.take()[0].result(timeout=5)
        time.sleep(0.03)  # some reads running, some done, some copies queued
        run.drop()
        deadline = time.monotonic() + 5
        while sum(buffers.out.values()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sum(buffers.out.values()) == 0, buffers.out


def test_a_later_window_error_is_seen_while_waiting_for_an_earlier_one(executors):
    buffers = _Buffers()
    release = threading.Event()
    readers, copier = executors

    def read(window, dropped, trip):
        buffers.take(window)
        if window == (0, 1):
            release.wait(5)
        if window == (1, 2):
            buffers.give(window)
            raise ChunkLoadError("injected", window=window)
        return window

    def copy(window, dropped, trip):
        buffers.give(window)
        return window

    run = EpochRun([(0, 1), (1, 2), (2, 3)], read=read, readers=readers, depth=3, copy=copy,
                   copier=copier, copy_depth=1, reclaim=buffers.give)  # fmt: skip
    first, _ = run.take()
    deadline = time.monotonic() + 2
    while run.failed() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    failed = run.failed()
    assert failed is not None and not first.done()
    with pytest.raises(ChunkLoadError, match="injected"):
        failed.result()
    release.set()
    assert first.result(timeout=5) == (0, 1)
    run.drop()
    deadline = time.monotonic() + 5
    while sum(buffers.out.values()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sum(buffers.out.values()) == 0, buffers.out


def test_the_loader_with_a_copy_stage_orders_restarts_and_is_collected():
    # device="meta": the copy stage runs (a synchronous .to(device) of each host buffer),
    # as on an accelerator without CUDA streams; nothing is computed.
    import gc
    import warnings

    import chunkstream as cs
    from tests.faults import ArraySource, make_arrays, wait_for_no_threads

    source = ArraySource(make_arrays(2000), delay=0.002)
    with cs.ChunkLoader(source, 100, device="meta", workers=2, sampling="sequential") as loader:
        assert sorted(t.name for t in loader.threads) == [
            "chunkstream-read-0", "chunkstream-read-1", "chunkstream-transfer-0"]  # fmt: skip
        chunks = list(loader.epoch(10))
        assert [(c.start, c.stop) for c in chunks] == [(k * 100, k * 100 + 100) for k in range(10)]
        assert all(c["voltage"].device.type == "meta" for c in chunks)
        for k, _ in enumerate(loader.epoch(10)):
            if k == 2:
                break
        assert [c.index for c in loader.epoch(5)] == list(range(5))  # a fresh epoch
        time.sleep(0.1)
        # Every read of the dropped epoch went back: nothing beyond the arena was needed.
        assert loader._pool.allocated == loader.config.reader_capacity + 2
    loader = cs.ChunkLoader(source, 100, device="meta", workers=2)
    next(iter(loader.epoch(8)))  # reads and copies still in flight when it is dropped
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del loader
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) for w in caught)
    assert wait_for_no_threads(5.0) == [], "threads left behind"


class _Slots:
    """A fixed pool of ``n`` slots (as the pinned pool): ``acquire`` waits for one."""

    def __init__(self, n):
        self.free = threading.Semaphore(n)

    def acquire(self, dropped):
        while not self.free.acquire(timeout=0.01):
            if dropped():
                raise InterruptedError("dropped")

    def release(self):
        self.free.release()


@pytest.mark.parametrize("ordered", [True, False])
def test_reads_take_slots_in_window_order_or_a_late_first_read_starves(ordered):
    # Two readers, two slots, copies released in window order (as the pinned pool on
    # CUDA): the first read reaches its acquire late, after the reads behind it took
    # both slots. Unordered, their copies queue behind the first window's, which waits
    # for a slot forever (the hang seen on an H200); in turn, every window arrives.
    readers, copier = Executor("read", 2), Executor("transfer", 1)
    slots = _Slots(2)
    first_late = threading.Event()

    def read(window, dropped, trip, turn=None):
        if window == (0, 1):
            first_late.wait(0.3)  # the first read's thread is descheduled for a while

        def take():
            slots.acquire(dropped)
            return window

        return take() if turn is None else turn.take(take, dropped)

    def copy(window, dropped, trip):
        slots.release()
        return window

    run = EpochRun([(k, k + 1) for k in range(8)], read=read, readers=readers, depth=2,
                   copy=copy, copier=copier, copy_depth=2, reclaim=lambda w: slots.release(),
                   ordered=ordered)  # fmt: skip
    try:
        if ordered:
            assert [run.take()[0].result(timeout=5) for _ in range(8)] == [
                (k, k + 1) for k in range(8)
            ]
        else:
            with pytest.raises(TimeoutError):
                run.take()[0].result(timeout=1.5)
    finally:
        first_late.set()
        run.drop()
        end = time.monotonic() + 5
        assert copier.close(end) == [] and readers.close(end) == []
