"""ChunkLoader behaviour: order, data, overlap, errors, shutdown, resume, memory."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest
import torch

import chunkstream as cs
from chunkstream.pipeline import ChunkLoader, LoaderOptions
from tests.faults import ArraySource, make_arrays
from tests.flat import loader_from


def loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("chunkstream-")]


@pytest.fixture(autouse=True)
def no_thread_left_behind():
    yield
    deadline = time.monotonic() + 5
    while loader_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert loader_threads() == [], "a test left loader threads running"


def test_delivers_stored_bytes_in_plan_order_whatever_the_worker_count():
    arrays = make_arrays(3000)
    seen = {}
    for workers in (1, 2, 4):
        source = ArraySource(arrays, delay=0.001)
        with ChunkLoader(
            source, 250, device="cpu", workers=workers, sampling="random", seed=7
        ) as loader:
            windows = []
            for epoch in range(2):
                for chunk in loader.epoch(6):
                    assert chunk.epoch == epoch
                    for name, array in arrays.items():
                        np.testing.assert_array_equal(
                            chunk[name].numpy(), array[chunk.start : chunk.stop]
                        )
                    windows.append((chunk.start, chunk.stop))
        seen[workers] = windows
    assert seen[1] == seen[2] == seen[4]
    plan = cs.plans.RandomPlan(total_timesteps=3000, chunk_size=250, seed=7)
    assert seen[1][:6] == [plan.window(0, i) for i in range(6)]


def test_held_chunks_are_never_overwritten():
    arrays = make_arrays(2000)
    with ChunkLoader(ArraySource(arrays), 100, device="cpu", workers=3, prefetch=2) as loader:
        held = list(loader.epoch(20))  # keep every chunk: buffers cannot be reused
        for chunk in held:
            np.testing.assert_array_equal(
                chunk["voltage"].numpy(), arrays["voltage"][chunk.start : chunk.stop]
            )
        assert len({(c.start, c.stop) for c in held}) == 20  # shuffled: one pass, no repeat


def test_buffers_are_reused_once_the_user_lets_go():
    arrays = make_arrays(2000)
    with ChunkLoader(ArraySource(arrays), 100, device="cpu", workers=2, prefetch=2) as loader:
        for _ in range(10):
            for chunk in loader.epoch(20):
                _ = chunk["voltage"].sum()
        # Bound: the pipeline's prefetch + workers sets, plus the one the user holds.
        assert loader._pool.allocated <= loader.config.reader_capacity + 2


def test_loading_overlaps_a_sleeping_consumer():
    read_s, n = 0.05, 12
    source = ArraySource(make_arrays(2000), delay=read_s)
    with ChunkLoader(source, 100, device="cpu", workers=1, prefetch=2) as loader:
        begin = time.perf_counter()
        for _chunk in loader.epoch(n):
            time.sleep(read_s)  # "training" as slow as reading
        elapsed = time.perf_counter() - begin
    serial = 2 * n * read_s
    # The ideal pipeline takes (n + 1) * read_s; serial takes 2 n read_s. Generous ratio.
    assert elapsed < 0.75 * serial, (elapsed, serial)


@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("workers", [1, 3])
def test_reader_failure_raises_chunkloaderror_without_hanging(where, workers):
    arrays = make_arrays(2000)
    plan = cs.plans.SequentialPlan(total_timesteps=2000, chunk_size=100)
    n = 10
    bad = {"first": 0, "middle": 5, "last": n - 1}[where]
    bad_start = plan.window(0, bad)[0]
    source = ArraySource(arrays, fail_windows={bad_start})
    loader = ChunkLoader(source, 100, device="cpu", workers=workers, sampling="sequential")
    received = []
    begin = time.perf_counter()
    with pytest.raises(cs.ChunkLoadError) as info:
        for chunk in loader.epoch(n):
            received.append(chunk.start)
    assert time.perf_counter() - begin < 5
    error = info.value
    assert isinstance(error.__cause__, OSError)
    assert error.window == (bad_start, bad_start + 100)
    assert error.field == "voltage"
    assert f"[{bad_start}, {bad_start + 100})" in str(error) and "'voltage'" in str(error)
    assert all(start < bad_start for start in received)
    assert loader.closed  # the pipeline shut down
    loader.close()  # idempotent


def test_error_reaches_a_waiting_consumer_within_a_second():
    # Chunk 0 is slow, chunk 1 fails: the consumer, waiting on chunk 0, hears at once.
    source = ArraySource(make_arrays(2000), fail_windows={100}, hang_at={0})
    # The hung read ends after 0.5 s, so the shutdown after the error can join it.
    threading.Timer(0.5, source.release.set).start()
    with ChunkLoader(source, 100, device="cpu", workers=2, sampling="sequential") as loader:
        begin = time.perf_counter()
        with pytest.raises(cs.ChunkLoadError) as info:
            next(iter(loader.epoch(5)))
        assert info.value.window == (100, 200)
        assert time.perf_counter() - begin < 1.5


def test_stalled_reader_raises_with_the_workers_stack():
    source = ArraySource(make_arrays(2000), hang_at={0})
    loader = ChunkLoader(
        source, 100, device="cpu", workers=1, options=LoaderOptions(stall_timeout=0.5)
    )
    try:
        with pytest.raises(cs.LoaderStalledError) as info:
            next(iter(loader.epoch(3)))
        message = str(info.value)
        assert "chunkstream-read-0" in message and "read_into" in message
        assert isinstance(info.value, TimeoutError)
    finally:
        source.release.set()
        loader.close()


def test_abandoned_epochs_leave_no_thread_and_no_memory_growth():
    psutil = pytest.importorskip("psutil")
    arrays = make_arrays(4000, neurons=64)
    process = psutil.Process()
    with ChunkLoader(ArraySource(arrays), 500, device="cpu", workers=2, prefetch=2) as loader:
        threads = len(loader_threads())
        rss = []
        for epoch in range(200):
            for k, chunk in enumerate(loader.epoch(8)):
                if k == epoch % 3:
                    break
                del chunk
            if epoch == 20:
                gc.collect()
                rss.append(process.memory_info().rss)
        gc.collect()
        rss.append(process.memory_info().rss)
        assert len(loader_threads()) == threads
        assert rss[-1] <= rss[0] * 1.05 + 8 * 2**20
        assert loader._pool.allocated <= 3 * loader.config.reader_capacity


def test_abandoning_does_not_deliver_stale_chunks():
    arrays = make_arrays(2000)
    with ChunkLoader(
        ArraySource(arrays, delay=0.002), 100, device="cpu", workers=3, sampling="random", seed=3
    ) as loader:
        for _ in range(5):
            next(iter(loader.epoch(10)))
        chunks = list(loader.epoch(10))
        epoch, plan = chunks[0].epoch, loader.plan
        assert [(c.start, c.stop) for c in chunks] == [plan.window(epoch, i) for i in range(10)]


def test_close_from_every_state():
    arrays = make_arrays(2000)
    # never started
    ChunkLoader(ArraySource(arrays), 100, device="cpu").close()
    # mid-epoch, with readers blocked by back-pressure (nothing consumed)
    loader = ChunkLoader(ArraySource(arrays), 100, device="cpu", workers=2, prefetch=1)
    iterator = iter(loader.epoch(10))
    next(iterator)
    time.sleep(0.05)
    begin = time.perf_counter()
    loader.close()
    assert time.perf_counter() - begin < 1
    with pytest.raises(cs.LoaderClosedError):  # using a closed loader is a bug: say so
        next(iterator)
    with pytest.raises(cs.LoaderClosedError):
        loader.epoch(1)
    loader.close()
    # after an epoch ran to its end
    with ChunkLoader(ArraySource(arrays), 100, device="cpu") as loader:
        assert len(list(loader.epoch(3))) == 3
    # after an error
    loader = ChunkLoader(
        ArraySource(arrays, fail_at={0}), 100, device="cpu", options=LoaderOptions(read_retries=0)
    )
    with pytest.raises(cs.ChunkLoadError):
        list(loader.epoch(3))
    loader.close()


def test_consumer_exception_inside_with_shuts_down():
    with (
        pytest.raises(KeyboardInterrupt),
        ChunkLoader(ArraySource(make_arrays()), 100, device="cpu") as loader,
    ):
        for _chunk in loader.epoch(10):
            raise KeyboardInterrupt
    assert loader.closed


def test_dropped_loader_warns_and_stops_its_threads():
    loader = ChunkLoader(ArraySource(make_arrays()), 100, device="cpu", workers=2)
    next(iter(loader.epoch(5)))
    with pytest.warns(ResourceWarning, match="not closed"):
        del loader
        gc.collect()


def test_state_counts_received_chunks_and_resumes_the_remaining_windows():
    arrays = make_arrays(3000)
    with ChunkLoader(ArraySource(arrays), 200, device="cpu", workers=2, seed=11) as loader:
        list(loader.epoch(10))
        iterator = loader.epoch(10)
        first = [next(iterator) for _ in range(4)]
        time.sleep(0.05)  # let readers run ahead: the state must not count prefetched chunks
        state = loader.state_dict()
        assert state["epoch"] == 1 and state["step"] == 4
        rest = [(c.start, c.stop) for c in iterator]
        following = [(c.start, c.stop) for c in loader.epoch(10)]
    assert all(isinstance(v, int) for v in state.values())
    del first
    with ChunkLoader(ArraySource(arrays), 200, device="cpu", workers=3, seed=11) as resumed:
        resumed.load_state_dict(state)
        chunks = list(resumed.epoch(10))
        assert [(c.start, c.stop) for c in chunks] == rest
        assert [c.index for c in chunks] == list(range(4, 10))
        assert [(c.start, c.stop) for c in resumed.epoch(10)] == following


def test_memory_budget_sets_the_depths():
    arrays = make_arrays(2000)
    chunk_bytes = sum(a[:100].nbytes for a in arrays.values())
    with ChunkLoader(
        ArraySource(arrays),
        100,
        device="cpu",
        workers=2,
        options=LoaderOptions(host_memory=5 * chunk_bytes),
    ) as loader:
        # The arena is prefetch + workers sets plus the two a loop holds: all within budget.
        assert loader.config.prefetch == 1
        assert loader.config.host_sets(on_cuda=False) * loader.chunk_bytes <= 5 * chunk_bytes
    with pytest.raises(cs.ConfigError, match="host_memory"):
        ChunkLoader(
            ArraySource(arrays),
            100,
            device="cpu",
            workers=2,
            options=LoaderOptions(host_memory=chunk_bytes),
        )


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"chunk_size": 0}, "chunk_size"),
        ({"chunk_size": -5}, "chunk_size"),
        ({"prefetch": 0}, "prefetch"),
        ({"workers": 0}, "workers"),
        ({"gpu_prefetch": 0}, "gpu_prefetch"),
        ({"sampling": "sorted"}, "sampling"),
        ({"stall_timeout": -1}, "stall_timeout"),
        ({"rank": 2, "world_size": 2}, "rank"),
    ],
)
def test_bad_arguments_are_refused_clearly(kwargs, name):
    args = {"chunk_size": 100, "device": "cpu", **kwargs}
    chunk_size = args.pop("chunk_size")
    before = len(loader_threads())
    with pytest.raises(cs.ConfigError, match=name) as info:
        loader_from(ArraySource(make_arrays()), chunk_size, **args)
    assert isinstance(info.value, ValueError)
    assert len(loader_threads()) == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on CPU-only machines")
def test_missing_cuda_is_a_clear_error():
    with pytest.raises(cs.ConfigError, match="device='cpu'"):
        ChunkLoader(ArraySource(make_arrays()), 100, device="cuda")


def test_non_finite_check_names_the_position():
    arrays = make_arrays(1000)
    arrays["voltage"][437, 5] = np.nan
    loader = ChunkLoader(
        ArraySource(arrays),
        100,
        device="cpu",
        sampling="sequential",
        options=LoaderOptions(check_finite=True),
    )
    with pytest.raises(cs.ChunkLoadError) as info:
        list(loader.epoch(10))
    assert isinstance(info.value.__cause__, cs.NonFiniteError)
    assert "(437, 5)" in str(info.value)
    loader.close()


def test_stats_are_filled_by_the_loader():
    source = ArraySource(make_arrays(2000), delay=0.005)
    with ChunkLoader(source, 100, device="cpu") as loader:
        for _ in loader.epoch(5):
            time.sleep(0.01)
        summary = loader.stats.summary()
    assert summary["num_chunks"] == 5
    assert summary["read_mean_ms"] >= 5
    assert 0 <= summary["stall_fraction"] < 1
    assert summary["bytes"] == 5 * loader.chunk_bytes


def test_transient_errors_are_retried_with_identical_data():
    arrays = make_arrays(2000)
    source = ArraySource(arrays, transient=2)  # every window fails twice, then reads
    with ChunkLoader(
        source, 100, device="cpu", workers=2, options=LoaderOptions(read_retries=2)
    ) as loader:
        for chunk in loader.epoch(5):
            np.testing.assert_array_equal(
                chunk["voltage"].numpy(), arrays["voltage"][chunk.start : chunk.stop]
            )
    source = ArraySource(arrays, transient=3)
    with (
        ChunkLoader(source, 100, device="cpu", options=LoaderOptions(read_retries=2)) as loader,
        pytest.raises(cs.ChunkLoadError) as info,
    ):
        list(loader.epoch(5))
    assert isinstance(info.value.__cause__, ConnectionError)


def test_epoch_at_starts_mid_epoch_without_reading_the_skipped_windows():
    arrays = make_arrays(2000)
    source = ArraySource(arrays)
    with ChunkLoader(source, 100, device="cpu", workers=2, sampling="random", seed=5) as loader:
        plan = loader.plan
        chunks = list(loader.epoch(8, at=3))
        assert [c.index for c in chunks] == [3, 4, 5, 6, 7]
        assert [(c.start, c.stop) for c in chunks] == [plan.window(0, i) for i in range(3, 8)]
        for chunk in chunks:
            np.testing.assert_array_equal(chunk["voltage"].numpy(),
                                          arrays["voltage"][chunk.start : chunk.stop])  # fmt: skip
        assert sorted(source.calls) == sorted(plan.window(0, i) for i in range(3, 8))
        assert list(loader.epoch(8, at=8)) == []  # the whole epoch skipped: nothing read
        assert len(source.calls) == 5
        # at=0 is the plain next epoch; the state counts the skipped steps as passed.
        iterator = loader.epoch(8, at=6)
        next(iterator)
        assert loader.state_dict()["step"] == 7 and loader.state_dict()["epoch"] == 2
        assert [c.index for c in loader.epoch(2)] == [0, 1]
        # A pending resume already says where the epoch starts: at must then be 0.
        loader.load_state_dict({"epoch": 9, "step": 2, "num_chunks": 4})
        with pytest.raises(cs.ConfigError, match=r"at=1.*resume is pending"):
            loader.epoch(4, at=1)
        assert [c.index for c in loader.epoch(4)] == [2, 3]


def test_the_host_arena_is_allocated_at_construction_and_serves_every_epoch():
    arrays = make_arrays(2000)
    with ChunkLoader(ArraySource(arrays), 100, device="cpu", workers=2, prefetch=2) as loader:
        sets = loader.config.reader_capacity + 2  # the pipeline's, and two a loop holds
        assert loader._pool.allocated == sets
        assert loader._pool.nbytes >= sets * loader.chunk_bytes
        for _ in range(3):
            for chunk in loader.epoch(20):
                np.testing.assert_array_equal(chunk["voltage"].numpy(),
                                              arrays["voltage"][chunk.start : chunk.stop])  # fmt: skip
        assert loader._pool.allocated == sets  # a plain for loop never needs a fresh buffer


def test_a_source_that_learns_its_fields_at_the_first_read_streams_the_same_chunks():
    # CallableSource(specs="first"): nothing is read at construction, the buffers are
    # made after the first read, load_fn runs once per piece read, and the chunks equal
    # those of the same data with known fields, pieces and two readers included.
    data = np.random.default_rng(0).standard_normal((500, 3)).astype(np.float32)
    calls, lock = [], threading.Lock()

    def load_fn(start, stop):
        with lock:
            calls.append((start, stop))
        return data[start:stop], (data[start:stop, :1] * 2).astype(np.float64)

    source = cs.CallableSource(load_fn, 500, names=("x", "y"), specs="first")
    known = cs.NumpySource({"x": data, "y": (data[:, :1] * 2).astype(np.float64)})
    assert source.fields is None
    with (ChunkLoader(source, 50, device="cpu", workers=2, seed=3, options=LoaderOptions(pieces=2)) as lazy,
          ChunkLoader(known, 50, device="cpu", workers=2, seed=3, options=LoaderOptions(pieces=2)) as reference):  # fmt: skip
        assert calls == [] and lazy.chunk_bytes is None
        read = []
        for epoch in range(2):
            for a, b in zip(lazy.epoch(), reference.epoch(), strict=True):
                assert a.pieces == b.pieces and (a.epoch, a.index) == (epoch, b.index)
                read += [(p.start, p.stop) for p in a.pieces]
                for name in ("x", "y"):
                    assert a[name].dtype == b[name].dtype
                    torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)
        assert dict(source.fields) == dict(known.fields)
        assert lazy.chunk_bytes == reference.chunk_bytes
    assert sorted(calls) == sorted(read)  # once per piece delivered: no probe, no repeat


def test_the_learned_arrays_are_forgotten_when_their_epoch_is_dropped_unread():
    # The learning job keeps the first window's arrays for that epoch's read of it; an
    # epoch dropped before that read (here while load_fn still runs) must not leave them.
    data = np.arange(400.0, dtype=np.float32)[:, None]
    first_call, release = threading.Event(), threading.Event()

    def load_fn(start, stop):
        if not first_call.is_set():
            first_call.set()
            release.wait(10)  # the learning read, still running when its epoch is dropped
        return (data[start:stop],)

    source = cs.CallableSource(load_fn, 400, names=("x",), specs="first")
    with ChunkLoader(
        source, 40, device="cpu", workers=1, seed=0, options=LoaderOptions(pieces=2)
    ) as loader:
        first = loader.epoch(4)
        assert first_call.wait(10)
        learned = first._span.windows[0][0]
        second = loader.epoch(4)  # drops the first: its reads are cancelled, never run
        release.set()
        read = {(p.start, p.stop) for w in second._span.windows for p in w}
        assert (learned.start, learned.stop) not in read  # (seed 0) no later read takes them
        for chunk in second:
            want = np.concatenate([data[p.start : p.stop] for p in chunk.pieces])
            np.testing.assert_array_equal(chunk["x"].numpy(), want)
        with pytest.raises(StopIteration):
            next(first)
        assert source._learned == {}  # nothing kept for a read that never came


def test_a_failed_first_read_of_a_learning_source_reaches_the_consumer():
    def load_fn(start, stop):
        raise FileNotFoundError(f"no file for [{start}, {stop})")

    source = cs.CallableSource(load_fn, 100, specs="first")
    with ChunkLoader(source, 10, device="cpu", sampling="sequential") as loader:
        with pytest.raises(cs.ChunkLoadError, match=r"reading window \[0, 10\)") as info:
            next(iter(loader.epoch()))
        assert isinstance(info.value.__cause__, FileNotFoundError)
        assert source.fields is None and loader.closed


def test_a_learning_source_loses_nothing_when_reads_race_or_the_loader_closes():
    # Two readers learning the same window each get their own arrays (one load_fn call
    # per read), and arrays learned for a read that never happened are not served later.
    calls, lock, gate = [], threading.Lock(), threading.Event()

    def load_fn(start, stop):
        with lock:
            calls.append((start, stop))
            n = len(calls)
        gate.wait(10)
        return (np.full((stop - start, 3), n, np.float32),)

    gate.set()
    source = cs.CallableSource(load_fn, 100, names=("x",), specs="first")
    source.learn(0, 100)  # two reads of the same window learned before either read
    source.learn(0, 100)
    out = [np.empty((100, 3), np.float32) for _ in range(3)]
    for o in out:
        source.read_into(0, 100, {"x": o})
    assert len(calls) == 3 and sorted(int(o[0, 0]) for o in out) == [1, 2, 3]

    gate.clear()
    calls.clear()
    source = cs.CallableSource(load_fn, 100, names=("x",), specs="first")
    loader = ChunkLoader(source, 100, device="cpu", workers=1, sampling="sequential")
    chunks = loader.epoch(1)
    deadline = time.monotonic() + 10
    while not calls and time.monotonic() < deadline:  # the first read is inside load_fn
        time.sleep(0.01)
    closer = threading.Thread(target=loader.close)
    closer.start()  # close() waits for the reader, which then finds the pool closed
    time.sleep(0.2)
    gate.set()
    closer.join(10)
    with pytest.raises(cs.LoaderClosedError):
        next(chunks)
    o = np.empty((100, 3), np.float32)
    source.read_into(0, 100, {"x": o})  # a new read calls load_fn again
    assert len(calls) == 2 and o[0, 0] == 2


def test_a_failed_allocation_after_the_first_read_names_itself_once(monkeypatch):
    import chunkstream.pipeline._loader as loader_module

    made = []

    def no_memory(*args, **kwargs):
        made.append(args)
        raise MemoryError("cannot allocate the arena")

    monkeypatch.setattr(loader_module, "HostBufferPool", no_memory)
    source = cs.CallableSource(lambda a, b: (np.zeros((b - a, 2), np.float32),), 100,
                               names=("x",), specs="first")  # fmt: skip
    with ChunkLoader(source, 10, device="cpu", workers=2, sampling="sequential") as loader:
        with pytest.raises(cs.ChunkLoadError, match="allocating the host buffers failed: "
                                                    "MemoryError") as info:  # fmt: skip
            next(iter(loader.epoch(4)))
        assert info.value.window == (0, 10)
    assert len(made) == 1  # tried once, not once per reader
