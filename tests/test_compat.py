"""chunkstream.compat: the original API, exactly, with its hangs and stalls fixed."""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest
import torch

import chunkstream as cs
from chunkstream.compat import (
    ChunkLatencyStats,
    GuideRandomChunkLoader,
    PipelineChunkLoader,
    RandomChunkLoader,
    calculate_chunk_params,
    create_zarr_loader,
    sample_batch_within_chunk,
)
from tests.stores import make_flyvis

T, N, STIM = 1200, 16, 16


@pytest.fixture(scope="module")
def flyvis_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("flyvis")
    data = make_flyvis(path, T, N, chunks=(64, N, 1))
    return path, data


def recording(load_fn):
    calls = []

    def wrapped(start, end):
        calls.append((start, end))
        return load_fn(start, end)

    return wrapped, calls


def test_random_loader_streams_the_store(flyvis_store):
    path, data = flyvis_store
    load_fn = create_zarr_loader(str(path), 3, 4, STIM)
    loader = GuideRandomChunkLoader(load_fn, T, 200, device="cpu", prefetch=1, seed=5)
    try:
        loader.start_epoch(4)
        chunks = []
        while True:
            chunk_data, chunk_stim = loader.get_next_chunk()
            if chunk_data is None:
                assert chunk_stim is None
                break
            chunks.append((chunk_data, chunk_stim))
        assert len(chunks) == 4
        for chunk_data, chunk_stim in chunks:
            assert chunk_data.shape == (200, N) and chunk_stim.shape == (200, STIM)
            # Find the window from the data itself: it must be a real window of the store.
            start = int(np.flatnonzero(data[:, 0, 0] == chunk_data[0, 0].item())[0])
            np.testing.assert_array_equal(chunk_data.numpy(), data[start : start + 200, :, 0])
            np.testing.assert_array_equal(chunk_stim.numpy(), data[start : start + 200, :STIM, 1])
        assert loader.get_next_chunk() == (None, None)
        stats = loader.get_stats()
        assert set(stats) == {"chunks_loaded", "chunks_transferred"}
        assert stats["chunks_transferred"] == 4 and stats["chunks_loaded"] >= 4
    finally:
        loader.cleanup()
        loader.cleanup()
        load_fn.source.close()


def test_same_seed_same_calls_and_starts_in_range(flyvis_store):
    path, _ = flyvis_store
    base = create_zarr_loader(str(path), 3, 4, STIM)
    sequences = []
    for _ in range(2):
        load_fn, calls = recording(base)
        loader = GuideRandomChunkLoader(load_fn, T, 100, device="cpu", prefetch=2, seed=42)
        for _epoch in range(3):
            loader.start_epoch(5)
            while loader.get_next_chunk()[0] is not None:
                pass
        loader.cleanup()
        sequences.append(calls)
    assert sequences[0] == sequences[1]
    windows = sequences[0]  # no shape probe: only delivered windows
    assert len(windows) == 15
    assert all(0 <= s <= T - 100 and e == s + 100 for s, e in windows)
    assert len({s for s, _ in windows}) > 5  # random, not a constant
    base.source.close()


def test_chunk_larger_than_data_gives_the_whole_data(flyvis_store):
    path, data = flyvis_store
    base = create_zarr_loader(str(path), 3, 4, STIM)
    load_fn, calls = recording(base)
    loader = PipelineChunkLoader(load_fn, T, 5000, device="cpu", seed=0)
    loader.start_epoch(2)
    start, chunk_data, _ = loader.get_next_chunk()
    assert start == 0 and chunk_data.shape[0] == T
    np.testing.assert_array_equal(chunk_data.numpy(), data[:, :, 0])
    assert calls[-1] == (0, T)
    loader.cleanup()
    base.source.close()


def test_pipeline_loader_aligns_starts_and_returns_them(flyvis_store):
    path, data = flyvis_store
    load_fn = create_zarr_loader(str(path), 3, 4, STIM)
    loader = PipelineChunkLoader(load_fn, T, 128, device="cpu", seed=3, time_units=16)
    loader.start_epoch(6)
    starts = []
    while True:
        start, chunk_data, chunk_stim = loader.get_next_chunk()
        if start is None:
            assert chunk_data is None and chunk_stim is None
            break
        assert start % 16 == 0 and 0 <= start <= T - 128
        np.testing.assert_array_equal(chunk_data.numpy(), data[start : start + 128, :, 0])
        starts.append(start)
    assert len(starts) == 6
    loader.cleanup()
    load_fn.source.close()


def test_restarting_mid_epoch_neither_stalls_nor_loses_chunks():
    # prefetch=1 with a slow reader: the original waited 2 s per restart and then
    # handed the new epoch a stale end marker (zero chunks).
    def load_fn(start, end):
        time.sleep(0.02)
        return np.zeros((end - start, 4), np.float32), np.zeros((end - start, 2), np.float32)

    loader = GuideRandomChunkLoader(load_fn, 1000, 100, device="cpu", prefetch=1, seed=0)
    try:
        loader.start_epoch(10)
        loader.get_next_chunk()
        begin = time.perf_counter()
        loader.start_epoch(3)
        delivered = 0
        while loader.get_next_chunk()[0] is not None:
            delivered += 1
        elapsed = time.perf_counter() - begin
        assert delivered == 3
        assert elapsed < 1.0  # three 20 ms reads; the original spent 2 s on the restart alone
    finally:
        loader.cleanup()


def test_reader_exception_raises_instead_of_hanging():
    def load_fn(start, end):
        raise PermissionError("disk on fire")  # not transient: no retry

    loader = GuideRandomChunkLoader(load_fn, 1000, 100, device="cpu", seed=0)
    loader.start_epoch(3)
    outcome = {}

    def consume():
        try:
            loader.get_next_chunk()
        except cs.ChunkLoadError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=consume)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "get_next_chunk hung"
    assert "disk on fire" in str(outcome["error"].__cause__)
    with pytest.raises(cs.LoaderClosedError):  # as the native loader after a failed read
        loader.get_next_chunk()
    loader.cleanup()


def test_a_failure_after_the_first_chunk_raises_too():
    def load_fn(start, end):
        if load_fn.calls:
            raise PermissionError("disk on fire")
        load_fn.calls += 1
        return np.zeros((end - start, 4), np.float32), np.zeros((end - start, 2), np.float32)

    load_fn.calls = 0
    loader = GuideRandomChunkLoader(load_fn, 1000, 100, device="cpu", seed=0)
    loader.start_epoch(3)
    with pytest.raises(cs.ChunkLoadError) as info:  # at the first chunk or the second
        for _ in range(3):
            loader.get_next_chunk()
    assert isinstance(info.value.__cause__, PermissionError)
    loader.cleanup()


def test_a_window_of_another_shape_than_the_first_raises():
    def load_fn(start, end):
        width = 4 if load_fn.calls == 0 else 5  # the second window grows a column
        load_fn.calls += 1
        return np.zeros((end - start, width), np.float32), np.zeros((end - start, 2), np.float32)

    load_fn.calls = 0
    with GuideRandomChunkLoader(load_fn, 1000, 100, device="cpu", seed=0) as loader:
        loader.start_epoch(3)
        with pytest.raises(cs.ChunkLoadError) as info:  # at the first chunk or the second
            for _ in range(3):
                loader.get_next_chunk()
        assert "shape" in str(info.value.__cause__) and "(100, 4)" in str(info.value.__cause__)


# -- load_fn's call pattern: only delivered windows, each chunk_size long -------------------


class CountingLoadFn:
    """A user's load_fn over real arrays that, like the original users', preallocates
    ``chunk_size`` rows and refuses any other length; it records every call."""

    def __init__(self, chunk_size, T=3000):
        rng = np.random.default_rng(0)
        self.data = rng.standard_normal((T, 6)).astype(np.float32)
        self.stim = rng.standard_normal((T, 3)).astype(np.float32)
        self.chunk_size = min(chunk_size, T)
        self.out = np.empty((self.chunk_size, 6), np.float32)  # preallocated once
        self.calls = []
        self.lock = threading.Lock()

    def __call__(self, start, end):
        with self.lock:
            self.calls.append((start, end))
        if end - start != self.chunk_size:
            raise AssertionError(f"load_fn({start}, {end}): not {self.chunk_size} long")
        np.copyto(self.out, self.data[start:end])
        return self.out.copy(), self.stim[start:end].copy()


def _drain_random(loader, load_fn, delivered):
    while True:
        data, stim = loader.get_next_chunk()
        if data is None:
            return
        # Which window is it? Random floats are distinct, so its first value says.
        start = int(np.flatnonzero(load_fn.data[:, 0] == data[0, 0].item())[0])
        end = start + data.shape[0]
        np.testing.assert_array_equal(data.numpy(), load_fn.data[start:end])
        np.testing.assert_array_equal(stim.numpy(), load_fn.stim[start:end])
        delivered.append((start, end))


def test_random_loader_calls_load_fn_only_for_delivered_windows():
    load_fn = CountingLoadFn(chunk_size=200)
    loader = GuideRandomChunkLoader(load_fn, 3000, 200, device="cpu", prefetch=2, seed=7)
    try:
        assert load_fn.calls == []  # construction calls nothing (the original neither)
        loader.start_epoch(0)
        assert loader.get_next_chunk() == (None, None) and load_fn.calls == []
        delivered = []
        for _epoch in range(3):
            loader.start_epoch(4)
            _drain_random(loader, load_fn, delivered)
        assert len(delivered) == 12
        assert load_fn.calls == delivered
        assert all(end - start == 200 for start, end in load_fn.calls)
        # Per epoch, as the original's: the last epoch's 4 chunks.
        assert loader.get_stats() == {"chunks_loaded": 4, "chunks_transferred": 4}
    finally:
        loader.cleanup()


def test_pipeline_loader_calls_load_fn_only_for_delivered_windows():
    load_fn = CountingLoadFn(chunk_size=256)
    loader = PipelineChunkLoader(load_fn, 3000, 256, device="cpu", prefetch=3, seed=1, time_units=8)
    try:
        delivered = []
        for _epoch in range(2):
            loader.start_epoch(5)
            while (start := loader.get_next_chunk()[0]) is not None:
                delivered.append((start, start + 256))
        assert load_fn.calls == delivered and len(delivered) == 10
        assert all(start % 8 == 0 for start, _ in delivered)
    finally:
        loader.cleanup()


def test_a_chunk_longer_than_the_data_calls_load_fn_with_the_whole_data():
    load_fn = CountingLoadFn(chunk_size=5000, T=1000)  # clamped: expects 1000 rows
    loader = PipelineChunkLoader(load_fn, 1000, 5000, device="cpu", seed=0)
    try:
        loader.start_epoch(3)
        while loader.get_next_chunk()[0] is not None:
            pass
        assert load_fn.calls == [(0, 1000)] * 3
    finally:
        loader.cleanup()


def test_restart_mid_epoch_calls_only_delivered_and_read_ahead_windows():
    # The reference: the same seed's draws. An epoch abandoned after 3 chunks consumed
    # 3 + prefetch + gpu_prefetch + 2 = 8 of them, as the original's full queues had.
    reference = CountingLoadFn(chunk_size=100)
    loader = PipelineChunkLoader(reference, 3000, 100, device="cpu", prefetch=2, seed=3)
    loader.start_epoch(8)
    while loader.get_next_chunk()[0] is not None:
        pass
    loader.start_epoch(4)
    while loader.get_next_chunk()[0] is not None:
        pass
    loader.cleanup()
    epoch0, epoch1 = reference.calls[:8], reference.calls[8:]

    load_fn = CountingLoadFn(chunk_size=100)
    loader = PipelineChunkLoader(load_fn, 3000, 100, device="cpu", prefetch=2, seed=3)
    try:
        loader.start_epoch(10)
        first = [loader.get_next_chunk()[0] for _ in range(3)]
        loader.start_epoch(4)  # abandons epoch 0 after 3 of its 10 chunks
        second = []
        while (start := loader.get_next_chunk()[0]) is not None:
            second.append((start, start + 100))
    finally:
        loader.cleanup()
    assert first == [start for start, _ in epoch0[:3]]
    assert second == epoch1
    calls = load_fn.calls
    assert calls[:3] == epoch0[:3] and calls[-4:] == epoch1
    # Between them: only windows read ahead for the abandoned epoch, in its order, at most
    # prefetch + 1 (the reader's depth), each chunk_size long, none delivered.
    extra = calls[3:-4]
    assert extra == epoch0[3 : 3 + len(extra)] and len(extra) <= 2 + 1
    assert all(end - start == 100 for start, end in calls)


def test_a_restart_before_the_first_chunk_reads_at_most_the_abandoned_first_window():
    # The reference: epoch 0's and epoch 1's first windows, each delivered. An epoch
    # abandoned before its first chunk consumed prefetch + 1 = 2 draws (the original's
    # reader, once ahead, had loaded that many).
    other = CountingLoadFn(chunk_size=100)
    loader = GuideRandomChunkLoader(other, 3000, 100, device="cpu", seed=2)
    try:
        for num_chunks in (2, 1):
            loader.start_epoch(num_chunks)
            while loader.get_next_chunk()[0] is not None:
                pass
    finally:
        loader.cleanup()
    epoch0_first, epoch1_first = other.calls[0], other.calls[2]

    load_fn = CountingLoadFn(chunk_size=100)
    loader = GuideRandomChunkLoader(load_fn, 3000, 100, device="cpu", seed=2)
    try:
        loader.start_epoch(5)  # starts reading epoch 0's first window in the background
        loader.start_epoch(5)  # abandons it: a read begun runs to its end, is not delivered
        data, _ = loader.get_next_chunk()
        start = int(np.flatnonzero(load_fn.data[:, 0] == data[0, 0].item())[0])
    finally:
        loader.cleanup()
    assert (start, start + 100) == epoch1_first  # epoch 1's first window is what arrives
    calls = load_fn.calls
    skipped = calls[:1] == [epoch0_first]  # the abandoned read, if it had begun
    assert calls[int(skipped)] == epoch1_first and epoch0_first not in calls[1:]


def test_bad_arguments_are_refused_at_construction():
    load_fn = CountingLoadFn(chunk_size=100)
    for kwargs in ({"chunk_size": 0}, {"prefetch": 0}, {"device": "tpu:0"}):
        args = {"chunk_size": 100, **kwargs}
        with pytest.raises(cs.ConfigError):
            GuideRandomChunkLoader(
                load_fn, 3000, args.pop("chunk_size"), **{"device": "cpu", **args}
            )
    with pytest.raises(cs.ConfigError, match="load_fn"):
        GuideRandomChunkLoader(3, 3000, 100, device="cpu")
    assert load_fn.calls == []


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((967680, 65536, 256, 1), (14, 256, 3780)),
        ((1000, 5000, 10, 3), (3, 100, 300)),
        ((10000, 1000, 100, 2), (20, 10, 200)),
    ],
)
def test_calculate_chunk_params(args, expected):
    assert calculate_chunk_params(*args) == expected


@pytest.mark.parametrize("args", [(100, 1000, 500, 1), (10000, 50, 100, 1), (10000, 1000, 100, 0)])
def test_calculate_chunk_params_zero_results_raise(args):
    with pytest.raises(ValueError):
        calculate_chunk_params(*args)


def test_sample_batch_within_chunk():
    torch.manual_seed(0)
    data = torch.randn(300, 10)
    # CSR: neuron i connects to (i + 1) % 10 and (i + 2) % 10.
    indptr = np.arange(0, 21, 2)
    indices = np.array([(i + d) % 10 for i in range(10) for d in (1, 2)])
    starts, selected, needed = sample_batch_within_chunk(
        data, None, indices, indptr, 64, 50, 3, "cpu"
    )
    assert starts.shape == (64,) and starts.dtype == torch.long
    assert int(starts.min()) >= 0 and int(starts.max()) < 300 - 50
    assert selected.shape == (3,) and len(set(selected.tolist())) == 3
    expected = sorted(
        {int(i) for i in selected} | {(int(i) + d) % 10 for i in selected for d in (1, 2)}
    )
    assert needed.tolist() == expected
    _, sel, need = sample_batch_within_chunk(data, None, indices, indptr, 8, 50, 0, "cpu")
    assert sel.numel() == 0 and need.numel() == 0 and sel.dtype == torch.long
    with pytest.raises(ValueError, match="total_steps"):
        sample_batch_within_chunk(data, None, indices, indptr, 8, 300, 0, "cpu")


def test_chunk_latency_stats(capsys):
    stats = ChunkLatencyStats()
    summary = stats.get_summary()
    assert summary["chunk_get_mean_ms"] == 0.0 and summary["num_chunks"] == 0
    for seconds in (0.001, 0.003):
        stats.record_chunk_get(seconds)
    stats.record_batch_times(0.01, 0.02, 0.005)
    summary = stats.get_summary()
    assert set(summary) == {
        "chunk_get_mean_ms", "chunk_get_max_ms", "chunk_get_min_ms", "batch_forward_mean_ms",
        "batch_backward_mean_ms", "batch_step_mean_ms", "num_chunks", "num_batches_sampled",
    }  # fmt: skip
    assert summary["chunk_get_mean_ms"] == pytest.approx(2.0)
    assert summary["chunk_get_max_ms"] == pytest.approx(3.0)
    assert summary["chunk_get_min_ms"] == pytest.approx(1.0)
    assert summary["batch_backward_mean_ms"] == pytest.approx(20.0)
    assert summary["num_chunks"] == 2 and summary["num_batches_sampled"] == 1
    stats.print_summary()
    assert "chunk_get_mean_ms" in capsys.readouterr().out


# -- the first window, read in the background ---------------------------------------------


def test_a_hung_first_read_raises_stalled_with_its_stack_instead_of_hanging():
    release = threading.Event()

    def load_fn(start, end):
        release.wait(60)  # a hung network mount
        return np.zeros((end - start, 4), np.float32), np.zeros((end - start, 2), np.float32)

    stall = 0.3
    loader = GuideRandomChunkLoader(load_fn, 1000, 100, device="cpu", seed=0, _stall_timeout=stall)
    outcome = {}

    def consume():
        begin = time.perf_counter()
        try:
            loader.get_next_chunk()
        except cs.LoaderStalledError as exc:
            outcome["error"], outcome["waited"] = exc, time.perf_counter() - begin

    try:
        loader.start_epoch(3)
        thread = threading.Thread(target=consume)
        thread.start()
        thread.join(30)  # 100x the stall timeout
        assert not thread.is_alive(), "get_next_chunk hung"
        error = outcome["error"]
        assert isinstance(error, TimeoutError) and "stall_timeout" in str(error)
        # The stuck reader's stack, under its thread's name (ChunkLoader.threads).
        assert "chunkstream-read-0" in str(error) and "release.wait" in str(error)
        assert error.window is not None and outcome["waited"] >= stall
        with pytest.raises(cs.LoaderClosedError):
            loader.get_next_chunk()
    finally:
        release.set()
        loader.cleanup()


def test_a_stall_behind_an_abandoned_first_read_shows_the_stuck_read():
    release = threading.Event()

    def load_fn(start, end):
        release.wait(60)  # every read hangs: the abandoned epoch's blocks the next one
        return np.zeros((end - start, 4), np.float32), np.zeros((end - start, 2), np.float32)

    loader = GuideRandomChunkLoader(load_fn, 1000, 100, device="cpu", seed=0, _stall_timeout=0.3)
    try:
        loader.start_epoch(3)
        time.sleep(0.05)  # epoch 0's first read has begun
        loader.start_epoch(3)  # epoch 1's first read waits for it (one load_fn call at a time)
        with pytest.raises(cs.LoaderStalledError) as info:
            loader.get_next_chunk()
        message = str(info.value)
        # The one reader is still inside epoch 0's read: its stack holds everything up.
        assert "chunkstream-read-0" in message and "release.wait" in message
    finally:
        release.set()
        loader.cleanup()


def test_cleanup_while_the_first_read_hangs_returns():
    release, entered = threading.Event(), threading.Event()

    def load_fn(start, end):
        entered.set()
        release.wait(60)
        return np.zeros((end - start, 4), np.float32), np.zeros((end - start, 2), np.float32)

    loader = GuideRandomChunkLoader(load_fn, 1000, 100, device="cpu", seed=0)
    loader.start_epoch(3)
    assert entered.wait(10)  # the first read is inside load_fn
    done, warned = threading.Event(), []

    def clean():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader.cleanup()
        warned.extend(str(w.message) for w in caught)
        done.set()

    thread = threading.Thread(target=clean)
    thread.start()
    thread.join(30)
    release.set()
    assert done.is_set(), "cleanup() hung on a first read in flight"
    # Left to finish in its daemon thread, and said so.
    assert any("chunkstream-read-0" in w and "did not stop" in w for w in warned), warned


def test_the_first_chunks_wait_is_in_the_stats():
    gate = threading.Event()
    delay = 0.2

    def load_fn(start, end):
        if not gate.is_set():  # the first window only
            time.sleep(delay)
            gate.set()
        return np.zeros((end - start, 4), np.float32), np.zeros((end - start, 2), np.float32)

    with GuideRandomChunkLoader(load_fn, 1000, 100, device="cpu", prefetch=1, seed=0) as loader:
        loader.start_epoch(3)
        while loader.get_next_chunk()[0] is not None:
            pass
        first, *rest = loader.stats.chunks
        assert first.wait_s >= delay * 0.5 and first.read_s >= delay * 0.9
        assert first.wait_s > 5 * max(r.wait_s for r in rest)  # the later reads are fast
        assert loader.stats.summary()["wait_max_ms"] == pytest.approx(first.wait_s * 1e3)
        assert loader.get_stats() == {"chunks_loaded": 3, "chunks_transferred": 3}


def test_under_a_process_group_every_rank_reads_the_unsharded_sequence(monkeypatch):
    # The original did not shard: rank 1 of 2 reads what a single process reads, and
    # load_fn is called only for the windows it delivers.
    reference = CountingLoadFn(chunk_size=100)
    with GuideRandomChunkLoader(reference, 3000, 100, device="cpu", seed=4) as loader:
        loader.start_epoch(4)
        _drain_random(loader, reference, [])
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda *a, **k: 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a, **k: 2)
    load_fn = CountingLoadFn(chunk_size=100)
    delivered = []
    with GuideRandomChunkLoader(load_fn, 3000, 100, device="cpu", seed=4) as loader:
        loader.start_epoch(4)
        _drain_random(loader, load_fn, delivered)
        assert (loader._loader.rank, loader._loader.world_size) == (0, 1)
    assert delivered == reference.calls and load_fn.calls == delivered


# -- the original's window draws (issue 19, item 6) ---------------------------------------


def original_starts(seed, T, chunk_size, time_units=1):
    """The original's start sequence: one randint of one random.Random(seed) per chunk."""
    rng = random.Random(seed)
    max_start = (max(0, T - chunk_size) // time_units) * time_units
    return iter(lambda: rng.randint(0, max_start // time_units) * time_units, None)


def _starts(loader, num_chunks, take=None):
    """Start an epoch and return the starts of the chunks taken (all of them by default)."""
    loader.start_epoch(num_chunks)
    starts = []
    for _ in range(num_chunks if take is None else take):
        out = loader.get_next_chunk()
        if out[0] is None:
            break
        starts.append(int(out[0]) if isinstance(loader, RandomChunkLoader) else None)
    return starts


@pytest.mark.parametrize("cls", [GuideRandomChunkLoader, RandomChunkLoader, PipelineChunkLoader])
def test_seed_42_gives_the_originals_load_fn_calls(cls):
    # The example: the original asks load_fn for these starts, with both loaders.
    load_fn = CountingLoadFn(chunk_size=5000, T=30000)
    with cls(load_fn, 30000, 5000, device="cpu", seed=42) as loader:
        for _ in range(2):
            _starts(loader, 2)
    assert load_fn.calls == [(s, s + 5000) for s in (20952, 3648, 819, 24299)]


@pytest.mark.parametrize(
    ("cls", "kwargs", "depth"),
    [
        (GuideRandomChunkLoader, {"prefetch": 1}, 1 + 1),
        (GuideRandomChunkLoader, {"prefetch": 3}, 3 + 1),
        (RandomChunkLoader, {"prefetch": 2, "time_units": 16}, 2 + 1),
        (RandomChunkLoader, {"prefetch": 1, "time_units": 7}, 1 + 1),
        (PipelineChunkLoader, {"prefetch": 2, "time_units": 16}, 2 + 1 + 2),
        (PipelineChunkLoader, {"prefetch": 1, "gpu_prefetch": 2, "time_units": 7}, 1 + 2 + 2),
    ],
)
def test_draws_follow_the_original_across_epochs_and_restarts(cls, kwargs, depth):
    T, C = 3000, 100
    load_fn = CountingLoadFn(chunk_size=C, T=T)
    delivered = []
    with cls(load_fn, T, C, device="cpu", seed=11, **kwargs) as loader:
        epochs = [(5, None), (9, 2), (0, None), (4, None), (6, 0), (3, None)]
        for num_chunks, take in epochs:
            before = len(loader.stats.chunks)
            _starts(loader, num_chunks, take)
            delivered += [(r.start, r.stop) for r in loader.stats.chunks[before:]]
    # The original: an epoch drained consumed its draws, one abandoned after d chunks
    # consumed min(n, d + depth) (its queues full), and the next epoch drew on from there.
    draws = original_starts(11, T, C, kwargs.get("time_units", 1))
    expected, consumed = [], []
    for num_chunks, take in epochs:
        count = num_chunks if take is None else min(num_chunks, take + depth)
        starts = [(s, s + C) for s in itertools.islice(draws, count)]
        consumed += starts
        expected += starts if take is None else starts[:take]
    assert delivered == expected
    # load_fn saw only consumed draws, in draw order (the delivered ones and read-ahead).
    rest = iter(consumed)
    assert all(call in rest for call in load_fn.calls)


# -- the original's counters, augmentation and types (issue 19, item 7) --------------------


def test_get_stats_counts_the_current_epoch():
    load_fn = CountingLoadFn(chunk_size=100)
    with PipelineChunkLoader(load_fn, 3000, 100, device="cpu", prefetch=2, seed=0) as loader:
        assert loader.get_stats() == {"chunks_loaded": 0, "chunks_transferred": 0}
        _starts(loader, 3)
        assert loader.get_stats() == {"chunks_loaded": 3, "chunks_transferred": 3}
        loader.start_epoch(4)  # the counters start again, as the original's
        assert loader.get_stats()["chunks_transferred"] == 0
        loader.get_next_chunk()
        stats = loader.get_stats()
        assert stats["chunks_transferred"] == 1 and 1 <= stats["chunks_loaded"] <= 4
        while loader.get_next_chunk()[0] is not None:
            pass
        assert loader.get_stats() == {"chunks_loaded": 4, "chunks_transferred": 4}


def _original_augmentation(chunk_data, indices, indptr, batch_size, total_steps, k, device):
    """The original's sample_batch_within_chunk draws, written out."""
    starts = torch.randint(
        low=0, high=chunk_data.shape[0] - total_steps, size=(batch_size,), device=device
    )
    selected = torch.randint(low=0, high=chunk_data.shape[1], size=(k,), device=device)
    neighbours = torch.cat([indices[indptr[i] : indptr[i + 1]] for i in selected])
    return starts, selected, torch.unique(torch.cat([neighbours, selected]))


@pytest.mark.parametrize("k", [3, 25])  # 25 > N: the original draws 25, with replacement
def test_sample_batch_draws_neurons_as_the_original(k):
    data = torch.randn(300, 10)
    indptr = torch.arange(0, 21, 2)
    indices = torch.tensor([(i + d) % 10 for i in range(10) for d in (1, 2)])
    torch.manual_seed(5)
    expected = _original_augmentation(data, indices, indptr, 64, 50, k, "cpu")
    for stim_keyword in ("_chunk_stim", "chunk_stim"):  # the original's name, and the guide's
        torch.manual_seed(5)
        got = sample_batch_within_chunk(
            data, **{stim_keyword: None}, wmat_indices=indices, wmat_indptr=indptr,
            batch_size=64, total_steps=50, num_neurons_to_zero=k, device="cpu",
        )  # fmt: skip
        for a, b in zip(got, expected, strict=True):
            assert torch.equal(a, b)
    assert got[1].shape == (k,)
    with pytest.raises(TypeError):
        sample_batch_within_chunk(data, None, indices, indptr, 8, 50, 1, "cpu", chunk_stim=None)


def test_device_is_a_torch_device_and_latency_stats_is_the_originals_dataclass():
    loader = GuideRandomChunkLoader(CountingLoadFn(100), 3000, 100, device="cpu")
    assert isinstance(loader.device, torch.device) and loader.device == torch.device("cpu")
    loader.cleanup()
    assert [f.name for f in dataclasses.fields(ChunkLatencyStats)] == [
        "chunk_load_times", "chunk_transfer_times", "chunk_get_times",
        "batch_forward_times", "batch_backward_times", "batch_step_times",
    ]  # fmt: skip
    stats = ChunkLatencyStats()
    stats.chunk_load_times.append(0.5)  # code written for the original appends to these
    assert stats.get_summary()["num_chunks"] == 0.0


# -- create_zarr_loader's resources (issue 19, item 8) ------------------------------------


def test_cleanup_closes_the_store_create_zarr_loader_opened(tmp_path):
    make_flyvis(tmp_path / "run", 600, N, chunks=(64, N, 1))  # zarr's I/O thread is up now
    baseline = set(threading.enumerate())
    for i in range(5):
        # As the integration guide: load_fn wrapped in a lambda that offsets the split.
        zarr_load_fn = create_zarr_loader(str(tmp_path / "run"), 3, 4, N)
        loader = GuideRandomChunkLoader(
            lambda start, end, f=zarr_load_fn: f(100 + start, 100 + end), 500, 64,
            device="cpu", seed=i,
        )  # fmt: skip
        loader.start_epoch(3)
        while loader.get_next_chunk()[0] is not None:
            pass
        loader.cleanup()
        left = [t.name for t in threading.enumerate() if t not in baseline]
        assert left == [], f"loader {i} left threads running: {left}"
    # A load_fn shared by loaders in turn reopens its store when called again.
    shared = create_zarr_loader(str(tmp_path / "run"), 3, 4, N)
    for _ in range(2):
        with GuideRandomChunkLoader(shared, 600, 64, device="cpu", seed=0) as loader:
            loader.start_epoch(2)
            assert loader.get_next_chunk()[0].shape == (64, N)
    shared.source.close()


@pytest.mark.parametrize("cls", [GuideRandomChunkLoader, RandomChunkLoader, PipelineChunkLoader])
def test_on_the_cpu_a_chunk_is_load_fns_arrays_without_a_copy(cls):
    # As the original's torch.from_numpy: no host arena, so no chunk copies beyond its own.
    returned = []

    def load_fn(start, end):
        arrays = np.random.default_rng(start).standard_normal((2, end - start, 3))
        returned.append(arrays.astype(np.float32))
        return returned[-1][0], returned[-1][1]

    with cls(load_fn, 1000, 100, device="cpu", seed=0) as loader:
        loader.start_epoch(3)
        delivered = [loader.get_next_chunk()[-2:] for _ in range(3)]
        assert loader._loader._pool is None  # the host arena was never made
    for (data, stim), arrays in zip(delivered, returned, strict=False):
        assert data.data_ptr() == arrays[0].ctypes.data
        assert torch.equal(data, torch.from_numpy(arrays[0]))
        assert stim.data_ptr() == arrays[1].ctypes.data


# Run in a fresh interpreter: this one has zarr's loop up from writing test stores.
_FIVE_LOADERS = """
import sys, threading
from chunkstream.compat import RandomChunkLoader, create_zarr_loader
baseline = sorted(t.name for t in threading.enumerate())
for i in range(5):
    load_fn = create_zarr_loader(sys.argv[1], 3, 4, 8)
    loader = RandomChunkLoader(load_fn, 600, 64, device="cpu", prefetch=2, seed=i,
                               time_units=4)
    for _ in range(2):
        loader.start_epoch(3)
        while loader.get_next_chunk()[0] is not None:
            pass
    loader.cleanup()
    left = sorted(t.name for t in threading.enumerate())
    assert left == baseline, f"loader {i} left threads: {left} (before: {baseline})"
print("ok", baseline)
"""


def test_five_loaders_in_a_row_leave_no_thread_of_ours_or_zarrs(tmp_path):
    # Neither chunkstream's threads nor zarr-python's event loop (zarr_io, asyncio_<n>):
    # the local fast path opens the array without that loop (sources/_zarr.py, "Threads").
    make_flyvis(tmp_path / "run", 600, N, chunks=(64, 8, 1))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.path.join(root, "src")}
    result = subprocess.run([sys.executable, "-c", _FIVE_LOADERS, str(tmp_path / "run")],
                            env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok ['MainThread']"), result.stdout


def test_the_amplification_warning_comes_once_per_store(tmp_path):
    make_flyvis(tmp_path / "run", 200, N, chunks=(64, N, 4))  # columns interleaved: 4x
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(5):
            create_zarr_loader(str(tmp_path / "run"), 3, 4, STIM).source.close()
    amplification = [w for w in caught if issubclass(w.category, cs.ReadAmplificationWarning)]
    assert 1 <= len(amplification) <= 2  # the first open: one per field, then none


def test_a_read_in_flight_at_a_restart_counts_for_its_own_epoch():
    # get_stats() counts the current epoch's load_fn calls: one that began for the
    # abandoned epoch and returns after start_epoch is not the new epoch's.
    entered = threading.Event()

    def load_fn(start, end):
        entered.set()
        time.sleep(0.3)
        return np.zeros((end - start, 4), np.float32), np.zeros((end - start, 2), np.float32)

    with GuideRandomChunkLoader(load_fn, 1000, 100, device="cpu", prefetch=1, seed=0) as loader:
        loader.start_epoch(3)
        assert entered.wait(10)  # epoch 0's first read is inside load_fn
        loader.start_epoch(2)
        while loader.get_next_chunk()[0] is not None:
            pass
        assert loader.get_stats() == {"chunks_loaded": 2, "chunks_transferred": 2}


def test_calls_after_a_failed_read_say_the_loader_shut_down():
    def load_fn(start, end):
        raise FileNotFoundError("gone")

    loader = GuideRandomChunkLoader(load_fn, 1000, 100, device="cpu", seed=0)
    try:
        loader.start_epoch(2)
        with pytest.raises(cs.ChunkLoadError):
            loader.get_next_chunk()
        with pytest.raises(cs.LoaderClosedError, match="create a new one"):
            loader.get_next_chunk()
        with pytest.raises(cs.LoaderClosedError, match="create a new one"):
            loader.start_epoch(2)
    finally:
        loader.cleanup()


@pytest.mark.gpu
@pytest.mark.parametrize(("cls", "kwargs"),
                         [(GuideRandomChunkLoader, {}), (RandomChunkLoader, {"time_units": 4}),
                          (PipelineChunkLoader, {"gpu_prefetch": 3})])  # fmt: skip
def test_on_cuda_a_restart_never_reads_a_window_twice(cls, kwargs):
    # Reads plus copies in flight stay within the draws an abandoned epoch consumes
    # (prefetch + 1, or prefetch + gpu_prefetch + 2), so the next epoch's first draw was
    # never read ahead (test_cuda_logic checks the counts with fake copies, every depth).
    load_fn = CountingLoadFn(chunk_size=100, T=1_000_000)  # 60 random windows: no repeat
    for prefetch in (1, 2):
        loader = cls(load_fn, 1_000_000, 100, device="cuda", prefetch=prefetch, seed=3,
                     **kwargs)  # fmt: skip
        try:
            for _ in range(3):
                loader.start_epoch(20)
                for _ in range(2):
                    loader.get_next_chunk()
                time.sleep(0.3)  # the pipeline fills up
        finally:
            loader.cleanup()
        assert len(load_fn.calls) == len(set(load_fn.calls))
        load_fn.calls.clear()
