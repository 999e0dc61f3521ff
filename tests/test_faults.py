"""Fault injection on real zarr stores and real threads: errors, retries, stalls, shutdown.

tests/test_pipeline.py covers the same contracts on the in-memory ArraySource; here the
reads go through ZarrSource (its fast decode pool included), and a fault is a real
chunk file deleted or truncated after open, or a wrapper around the real ``read_into``.
"""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest
import torch

import chunkstream as cs
from chunkstream.plans import SequentialPlan
from tests.faults import ArraySource, Wrapped, chunkstream_threads, make_arrays, wait_for_no_threads
from tests.stores import chunk_files, make_array, random_data

T, N, CT = 1200, 6, 100  # timesteps, columns, zarr chunk length along time (= chunk_size)
N_CHUNKS = T // CT


@pytest.fixture(autouse=True)
def no_thread_left_behind():
    yield
    assert wait_for_no_threads() == [], "a test left chunkstream threads running"


@pytest.fixture
def store(tmp_path):
    """A zarr v3 array, one chunk file per window of the sequential plan."""
    path = tmp_path / "x.zarr"
    data = make_array(path, random_data((T, N), seed=3), (CT, N), codec="zstd")
    return path, data


def _window_file(path, k: int):
    """The chunk file holding window k (chunks are (CT, N): one file per time block)."""
    assert len(chunk_files(path)) == N_CHUNKS
    return path / "c" / str(k) / "0"  # zarr v3 default chunk key encoding


def _consume(loader, n, received):
    for chunk in loader.epoch(n):
        received.append((chunk.start, chunk["data"].numpy().copy()))


@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("fault", ["deleted", "truncated", "raising"])
def test_a_fault_in_one_of_several_workers_reaches_the_consumer(store, where, fault):
    path, data = store
    k = {"first": 0, "middle": N_CHUNKS // 2, "last": N_CHUNKS - 1}[where]
    source = cs.ZarrSource(path)  # open: every chunk present, so the check at open passes
    assert source.uses_fast_path
    if fault == "deleted":
        _window_file(path, k).unlink()
    elif fault == "truncated":
        f = _window_file(path, k)
        f.write_bytes(f.read_bytes()[:-7])
    else:
        source = Wrapped(source, fail_windows={k * CT})
    loader = cs.ChunkLoader(source, CT, device="cpu", workers=3, sampling="sequential")
    received: list = []
    begin = time.monotonic()
    with pytest.raises(cs.ChunkLoadError) as info:
        _consume(loader, N_CHUNKS, received)
    assert time.monotonic() - begin < 5  # reached the consumer, no hang
    error = info.value
    assert error.window == (k * CT, (k + 1) * CT)
    assert f"[{k * CT}, {(k + 1) * CT})" in str(error)
    cause = error.__cause__
    if fault == "deleted":
        assert isinstance(cause, cs.MissingChunkError) and isinstance(cause, FileNotFoundError)
        assert f"c/{k}/0" in str(cause)
    elif fault == "truncated":
        assert isinstance(cause, cs.CorruptChunkError)
        assert str(_window_file(path, k)) in str(cause)
    else:
        assert isinstance(cause, PermissionError)
        assert source.attempts[k * CT] == 1  # not transient: not retried
    # every chunk delivered before the failure is the stored data, in plan order
    assert [s for s, _ in received] == [i * CT for i in range(len(received))]
    assert all(s < k * CT for s, _ in received)
    for start, array in received:
        np.testing.assert_array_equal(array, data[start : start + CT])
    assert loader.closed
    loader.close()  # idempotent after an error
    source.close()


@pytest.mark.parametrize("error", [ConnectionError, TimeoutError, BlockingIOError])
def test_transient_errors_are_retried_and_the_retried_data_is_the_stored_data(store, error):
    path, data = store
    failures = {0: 2, 3 * CT: 1, 7 * CT: 2}  # window start -> failing attempts

    class Flaky(Wrapped):
        def read_into(self, start, stop, out):
            with self._lock:
                attempt = self.attempts.get(start, 0)
                self.attempts[start] = attempt + 1
            if attempt < failures.get(start, 0):
                out["data"][: stop - start] = np.nan  # a half-done read: must be overwritten
                raise error(f"injected {error.__name__} at {start}")
            self.source.read_into(start, stop, out)

    source = Flaky(cs.ZarrSource(path))
    with cs.ChunkLoader(
        source,
        CT,
        device="cpu",
        workers=3,
        sampling="sequential",
        options=cs.LoaderOptions(read_retries=2),
    ) as loader:
        chunks = list(loader.epoch(N_CHUNKS))
    assert [c.start for c in chunks] == [i * CT for i in range(N_CHUNKS)]
    for chunk in chunks:
        np.testing.assert_array_equal(chunk["data"].numpy(), data[chunk.start : chunk.stop])
    assert {s: source.attempts[s] for s in failures} == {s: n + 1 for s, n in failures.items()}
    source.close()


def test_retries_run_out_into_a_chunkloaderror_with_the_last_cause(store):
    path, _ = store
    source = Wrapped(cs.ZarrSource(path), transient=lambda start, attempt: start == 2 * CT)
    loader = cs.ChunkLoader(
        source, CT, device="cpu", sampling="sequential", options=cs.LoaderOptions(read_retries=1)
    )
    with pytest.raises(cs.ChunkLoadError) as info:
        list(loader.epoch(N_CHUNKS))
    assert isinstance(info.value.__cause__, ConnectionError)
    assert source.attempts[2 * CT] == 2  # one try plus read_retries=1
    loader.close()
    source.close()


def test_a_hanging_read_raises_loaderstalled_with_the_stuck_stack(store):
    path, _ = store
    source = Wrapped(cs.ZarrSource(path), hang_windows={CT})
    loader = cs.ChunkLoader(
        source,
        CT,
        device="cpu",
        workers=2,
        sampling="sequential",
        options=cs.LoaderOptions(stall_timeout=0.5),
    )
    try:
        received = []
        with pytest.raises(cs.LoaderStalledError) as info:
            for chunk in loader.epoch(N_CHUNKS):
                received.append(chunk.start)
        error = info.value
        assert isinstance(error, cs.ChunkLoadError) and isinstance(error, TimeoutError)
        message = str(error)
        assert "stall_timeout" in message
        assert "chunkstream-read-" in message and "(job 1)" in message
        assert "in read_into" in message and "self.release.wait" in message  # the stuck line
        assert received == [0]
        assert loader.closed
        with pytest.raises(cs.LoaderClosedError):
            loader.epoch(1)
    finally:
        source.release.set()
        loader.close()
        source.close()


def test_a_reader_raising_baseexception_does_not_kill_the_pipeline_silently(store):
    path, _ = store
    source = Wrapped(cs.ZarrSource(path), fail_windows={2 * CT}, error=SystemExit(3))
    loader = cs.ChunkLoader(source, CT, device="cpu", workers=2, sampling="sequential")
    with pytest.raises(cs.ChunkLoadError) as info:
        list(loader.epoch(N_CHUNKS))
    assert isinstance(info.value.__cause__, SystemExit)
    loader.close()
    source.close()


@pytest.mark.parametrize("raised", [ValueError, KeyboardInterrupt])
def test_consumer_raising_mid_epoch_inside_with_shuts_everything_down(store, raised):
    path, data = store
    source = cs.ZarrSource(path)
    with (
        pytest.raises(raised, match="consumer"),
        cs.ChunkLoader(source, CT, device="cpu", workers=3, prefetch=3) as loader,
    ):
        for k, chunk in enumerate(loader.epoch(N_CHUNKS)):
            np.testing.assert_array_equal(chunk["data"].numpy(), data[chunk.start : chunk.stop])
            if k == 4:
                raise raised("consumer")
    assert loader.closed
    assert all(not t.is_alive() for t in loader.threads)
    source.close()


def test_close_during_a_stall_returns_once_the_read_ends(store):
    path, _ = store
    source = Wrapped(cs.ZarrSource(path), hang_windows={0})
    loader = cs.ChunkLoader(
        source,
        CT,
        device="cpu",
        workers=2,
        sampling="sequential",
        options=cs.LoaderOptions(stall_timeout=None),
    )
    iterator = iter(loader.epoch(N_CHUNKS))
    time.sleep(0.2)  # the reader of window 0 is stuck
    threading.Timer(0.5, source.release.set).start()
    loader.close()  # joins within close_timeout: the stuck read ends after 0.5 s
    assert all(not t.is_alive() for t in loader.threads)
    with pytest.raises(cs.LoaderClosedError):
        next(iterator)
    loader.close()
    source.close()


def test_close_with_a_read_that_never_ends_warns_instead_of_hanging(store):
    path, _ = store
    source = Wrapped(cs.ZarrSource(path), hang_windows={0})
    loader = cs.ChunkLoader(
        source,
        CT,
        device="cpu",
        workers=1,
        sampling="sequential",
        options=cs.LoaderOptions(stall_timeout=None),
    )
    next_chunk = iter(loader.epoch(N_CHUNKS))
    time.sleep(0.2)
    begin = time.monotonic()
    with pytest.warns(RuntimeWarning, match="chunkstream-read-0"):
        loader.close()
    assert time.monotonic() - begin < loader.config.close_timeout + 2  # bounded
    source.release.set()  # the stuck read returns; the thread then sees the stop and ends
    del next_chunk
    source.close()


def test_close_from_another_thread_wakes_the_waiting_consumer(store):
    path, _ = store
    source = Wrapped(cs.ZarrSource(path), hang_windows={0})
    loader = cs.ChunkLoader(
        source,
        CT,
        device="cpu",
        workers=2,
        sampling="sequential",
        options=cs.LoaderOptions(stall_timeout=None),
    )
    outcome: dict[str, object] = {}

    def consume():
        try:
            outcome["chunks"] = list(loader.epoch(N_CHUNKS))
        except BaseException as exc:  # the test inspects whatever came out
            outcome["error"] = exc

    consumer = threading.Thread(target=consume)
    consumer.start()
    time.sleep(0.3)  # the consumer is now waiting for window 0
    threading.Timer(0.3, source.release.set).start()
    loader.close()
    consumer.join(5)
    assert not consumer.is_alive(), "the consumer still waits after close()"
    assert isinstance(outcome.get("error"), cs.LoaderClosedError)
    loader.close()
    source.close()


def test_close_after_a_stall_error_after_an_error_and_twice(store):
    path, _ = store
    # after the stall error
    source = Wrapped(cs.ZarrSource(path), hang_windows={0})
    loader = cs.ChunkLoader(
        source, CT, device="cpu", sampling="sequential", options=cs.LoaderOptions(stall_timeout=0.3)
    )
    with pytest.raises(cs.LoaderStalledError):
        next(iter(loader.epoch(3)))
    source.release.set()
    loader.close()
    loader.close()
    source.close()
    # after a read error, then a new loader on the same source works
    source = Wrapped(cs.ZarrSource(path), fail_windows={0})
    with cs.ChunkLoader(source, CT, device="cpu", sampling="sequential") as loader:
        with pytest.raises(cs.ChunkLoadError):
            list(loader.epoch(3))
        loader.close()
    source.fail_windows.clear()
    with cs.ChunkLoader(source, CT, device="cpu", sampling="sequential") as loader:
        assert [c.start for c in loader.epoch(3)] == [0, CT, 2 * CT]
    source.close()
    # closed from inside the loop: the next step says so
    source = cs.ZarrSource(path)
    loader = cs.ChunkLoader(source, CT, device="cpu")
    iterator = loader.epoch(5)
    next(iterator)
    loader.close()
    with pytest.raises(cs.LoaderClosedError):
        next(iterator)
    source.close()


@pytest.mark.parametrize("state", ["never started", "blocked by back-pressure", "finished"])
def test_dropped_loader_warns_and_its_threads_end(store, state):
    path, _ = store
    source = cs.ZarrSource(path)
    loader = cs.ChunkLoader(source, CT, device="cpu", workers=3, prefetch=1)
    threads = loader.threads
    if state == "blocked by back-pressure":
        iterator = iter(loader.epoch(N_CHUNKS))
        next(iterator)
        time.sleep(0.1)
        del iterator  # the iterator refers to the loader; the user dropped both
    elif state == "finished":
        assert len(list(loader.epoch(3))) == 3
    with pytest.warns(ResourceWarning, match="not closed"):
        del loader
        gc.collect()
    for thread in threads:
        thread.join(5)
    assert not any(t.is_alive() for t in threads)
    source.close()


def test_a_read_error_does_not_leak_buffers_or_threads_over_many_loaders(store):
    path, _ = store
    source = Wrapped(cs.ZarrSource(path), fail_windows={5 * CT})
    baseline = len(chunkstream_threads())
    for workers in (1, 2, 3, 4) * 3:
        loader = cs.ChunkLoader(source, CT, device="cpu", workers=workers, sampling="sequential")
        with pytest.raises(cs.ChunkLoadError):
            for chunk in loader.epoch(N_CHUNKS):
                del chunk  # the user holds nothing: buffers must be reused
        assert loader._pool.allocated <= loader.config.reader_capacity + 2
        loader.close()
    assert len(chunkstream_threads()) <= baseline + len(source.source._pool.pool.threads)
    source.close()


@pytest.mark.gpu
def test_an_error_in_the_cuda_copy_mid_epoch_shuts_down_cleanly(store, monkeypatch):
    path, data = store
    source = cs.ZarrSource(path)
    original = torch.Tensor.copy_
    copies = {"n": 0}

    def failing_copy(self, *args, **kwargs):
        if self.is_cuda:
            copies["n"] += 1
            if copies["n"] == 4:
                raise RuntimeError("injected copy failure")
        return original(self, *args, **kwargs)

    loader = cs.ChunkLoader(source, CT, device="cuda", workers=2, sampling="sequential")
    monkeypatch.setattr(torch.Tensor, "copy_", failing_copy)
    received = []
    with pytest.raises(cs.ChunkLoadError, match="copying window") as info:
        for chunk in loader.epoch(N_CHUNKS):
            received.append((chunk.start, chunk["data"].cpu().numpy()))
    monkeypatch.undo()
    assert "injected copy failure" in str(info.value.__cause__)
    assert info.value.window == (3 * CT, 4 * CT)
    for start, array in received:
        np.testing.assert_array_equal(array, data[start : start + CT])
    assert loader.closed
    loader.close()
    assert all(not t.is_alive() for t in loader.threads)
    source.close()
    assert SequentialPlan(total_timesteps=T, chunk_size=CT).windows_per_pass == N_CHUNKS


# -- a decode task stuck on ZarrSource's pool, with close_source=True ---------------------

_BLOCK_S = 20.0  # how long the stuck decode task blocks; every wait below is far shorter


@pytest.fixture
def stuck_decode(tmp_path, monkeypatch):
    """A real ZarrSource (two zarr chunks per window, so decodes run on its pool) whose
    decode of window 1 blocks on an Event for up to _BLOCK_S seconds."""
    path = tmp_path / "x.zarr"
    make_array(path, random_data((T, N), seed=3), (CT // 2, N), codec="zstd")
    source = cs.ZarrSource(path, read_threads=2)
    assert source.uses_fast_path
    release = threading.Event()
    decode = source._fast._decode

    def blocking(coords, target, read):
        if coords[0] == 2:  # the first zarr chunk of window [CT, 2 CT)
            release.wait(_BLOCK_S)
        return decode(coords, target, read)

    monkeypatch.setattr(source._fast, "_decode", blocking)
    yield source
    release.set()  # the decode task returns; the reader sees the stop and ends
    source.close()


def test_a_stuck_decode_does_not_delay_the_stall_error_with_close_source(stuck_decode):
    loader = cs.ChunkLoader(stuck_decode, CT, device="cpu", workers=1, sampling="sequential", options=cs.LoaderOptions(stall_timeout=1, close_source=True))  # fmt: skip
    begin = time.monotonic()
    with pytest.raises(cs.LoaderStalledError) as info:
        list(loader.epoch(3))
    elapsed = time.monotonic() - begin
    assert elapsed < _BLOCK_S / 2, f"the stall error waited {elapsed:.1f} s for the decode"
    assert "the source was left open" in str(info.value) and "chunkstream-read-0" in str(info.value)
    assert loader.closed
    loader.close()  # idempotent, and does not wait either
    assert time.monotonic() - begin < _BLOCK_S / 2


def test_close_with_a_stuck_decode_and_close_source_keeps_its_deadline(stuck_decode):
    import dataclasses

    loader = cs.ChunkLoader(stuck_decode, CT, device="cpu", workers=1, sampling="sequential", options=cs.LoaderOptions(stall_timeout=None, close_source=True))  # fmt: skip
    loader.config = dataclasses.replace(loader.config, close_timeout=1.0)
    iterator = iter(loader.epoch(3))
    next(iterator)  # window 0; the reader is now stuck in window 1's decode
    time.sleep(0.2)
    begin = time.monotonic()
    with pytest.warns(RuntimeWarning, match=r"chunkstream-read-0.*source was left open"):
        loader.close()
    assert time.monotonic() - begin < _BLOCK_S / 4
    del iterator


def test_close_honours_one_deadline_across_stages(store):
    import dataclasses

    path, _ = store
    source = Wrapped(cs.ZarrSource(path), hang_windows={0})
    loader = cs.ChunkLoader(source, CT, device="cpu", workers=1, sampling="sequential", options=cs.LoaderOptions(stall_timeout=None))  # fmt: skip
    loader.config = dataclasses.replace(loader.config, close_timeout=2.0)

    class StuckExecutor:  # a second executor whose thread never stops: it uses up the deadline
        threads = ()

        def close(self, deadline):
            time.sleep(max(0.0, deadline - time.monotonic()))
            return ["chunkstream-transfer-0"]

    iterator = iter(loader.epoch(3))
    loader._executors.append(StuckExecutor())
    time.sleep(0.2)  # the reader of window 0 is stuck
    begin = time.monotonic()
    try:
        with pytest.warns(RuntimeWarning, match="chunkstream-read-0"):
            loader.close()
        elapsed = time.monotonic() - begin
        # Each stage with its own full deadline would take twice close_timeout.
        assert elapsed < 1.5 * loader.config.close_timeout, elapsed
    finally:
        source.release.set()
        del iterator
        source.close()


def test_a_stall_inside_a_sources_own_pool_shows_the_stuck_tasks_stack():
    # A JoinSource reads its second part on its pool ("chunkstream-join-<n>") and waits
    # for it with no timeout (settle: docs/architecture.md, row 8); the stall error
    # shows the stack of the task that hangs, not only the reader that waits for it.
    arrays = make_arrays(400)
    hanging = ArraySource({"stimulus": arrays["stimulus"]}, hang_at={1})
    source = cs.JoinSource(ArraySource({"voltage": arrays["voltage"]}), hanging)
    loader = cs.ChunkLoader(source, 100, device="cpu", workers=1, sampling="sequential",
                            options=cs.LoaderOptions(stall_timeout=0.5))  # fmt: skip
    try:
        with pytest.raises(cs.LoaderStalledError) as info:
            for _ in loader.epoch(4):
                pass
        message = str(info.value)
        assert "chunkstream-read-" in message and "settle" in message  # the waiting reader
        task = message.split("(a task a reader waits for)", 1)
        assert len(task) == 2 and 'Thread "chunkstream-join-' in task[0].rsplit("\n", 1)[-1]
        assert "self.release.wait" in task[1] and "_read_part" in task[1]
    finally:
        hanging.release.set()
        loader.close()
        source.close()
