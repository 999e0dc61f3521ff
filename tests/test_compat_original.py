"""The original loaders' unit tests, reproduced from their published behaviour.

Each section is written as the original's tests were, against the original's
import; only that import is changed. Two of the original's APIs exist (see
``chunkstream.compat``): the merged code's ``RandomChunkLoader`` (NeuralGraph
chunk_loader.py as of commit 3701037: ``time_units``, ``(start, data, stim)``)
and the integration guide's earlier two-value form (commit b4c18b94), which
chunkstream keeps as ``GuideRandomChunkLoader``. Where the published behaviour
is a number (the draws of ``random.Random(42)``), the test states the number.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from chunkstream.compat import (
    GuideRandomChunkLoader,
    RandomChunkLoader,  # was: from LatentEvolution.chunk_loader import
)


class FakeDisk:
    """A ``load_fn`` over synthetic data that records its calls; row ``t`` holds ``t``."""

    def __init__(self, total_timesteps, neurons=8, stim_dims=3, delay_s=0.0):
        self.total_timesteps, self.neurons, self.stim_dims = total_timesteps, neurons, stim_dims
        self.delay_s = delay_s
        self.calls = []
        self.lock = threading.Lock()

    def load(self, start, end):
        if self.delay_s:
            time.sleep(self.delay_s)
        with self.lock:
            self.calls.append((start, end))
        rows = np.arange(start, end, dtype=np.float32)[:, None]
        return (np.repeat(rows, self.neurons, 1), np.repeat(rows, self.stim_dims, 1))


# -- the merged RandomChunkLoader (chunk_loader.py as of commit 3701037) -------------------


def test_merged_basic_loading_returns_start_data_stim_then_three_nones():
    disk = FakeDisk(20_000, neurons=50, stim_dims=10)
    loader = RandomChunkLoader(load_fn=disk.load, total_timesteps=20_000, chunk_size=2_000,
                               device="cpu", prefetch=1, seed=42, time_units=1)  # fmt: skip
    loader.start_epoch(num_chunks=5)
    for _ in range(5):
        chunk_start, chunk_data, chunk_stim = loader.get_next_chunk()
        assert chunk_data.shape == (2_000, 50) and chunk_stim.shape == (2_000, 10)
        assert chunk_data.device.type == "cpu"
        assert chunk_data[0, 0].item() == chunk_start  # the window begins at its start
    assert loader.get_next_chunk() == (None, None, None)
    assert len(disk.calls) == 5
    loader.cleanup()


def test_merged_seed_42_draws_the_published_starts():
    # random.Random(42) -> 20952, 3648, 819, 24299 for T=30000, chunk 5000, time_units 1.
    disk = FakeDisk(30_000)
    loader = RandomChunkLoader(disk.load, 30_000, 5_000, device="cpu", seed=42)
    starts = []
    for _ in range(2):  # one rng per loader: the draws go on across epochs
        loader.start_epoch(2)
        starts += [loader.get_next_chunk()[0] for _ in range(2)]
    loader.cleanup()
    assert starts == [20952, 3648, 819, 24299]
    assert disk.calls == [(s, s + 5_000) for s in starts]


@pytest.mark.parametrize("time_units", [1, 4, 7, 100])
def test_merged_starts_are_multiples_of_time_units_and_fit(time_units):
    T, C = 10_000, 1_000
    disk = FakeDisk(T)
    loader = RandomChunkLoader(disk.load, T, C, device="cpu", seed=123, time_units=time_units)
    loader.start_epoch(12)
    starts = [loader.get_next_chunk()[0] for _ in range(12)]
    loader.cleanup()
    assert all(s % time_units == 0 and 0 <= s <= T - C for s in starts)
    assert len(set(starts)) > 1  # random, not one place
    assert disk.calls == [(s, s + C) for s in starts]


def test_merged_last_valid_start_is_reachable():
    # T - chunk_size = 10 with time_units 5: the valid starts are 0, 5 and 10.
    disk = FakeDisk(110)
    loader = RandomChunkLoader(disk.load, 110, 100, device="cpu", seed=0, time_units=5)
    loader.start_epoch(60)
    starts = {loader.get_next_chunk()[0] for _ in range(60)}
    loader.cleanup()
    assert starts == {0, 5, 10}


def test_merged_same_seed_same_sequence():
    sequences = []
    for _ in range(2):
        disk = FakeDisk(30_000)
        loader = RandomChunkLoader(disk.load, 30_000, 5_000, device="cpu", seed=7, time_units=10)
        loader.start_epoch(num_chunks=4)
        starts = [loader.get_next_chunk()[0] for _ in range(4)]
        loader.cleanup()
        sequences.append((starts, disk.calls))
    assert sequences[0] == sequences[1]


def test_merged_statistics():
    disk = FakeDisk(15_000)
    loader = RandomChunkLoader(disk.load, 15_000, 3_000, device="cpu", time_units=3)
    loader.start_epoch(num_chunks=5)
    for _ in range(5):
        loader.get_next_chunk()
    assert loader.get_stats() == {"chunks_loaded": 5, "chunks_transferred": 5}
    loader.cleanup()


def test_merged_chunk_larger_than_data_gives_the_whole_data():
    disk = FakeDisk(1_000)
    loader = RandomChunkLoader(disk.load, 1_000, 5_000, device="cpu", seed=0, time_units=8)
    loader.start_epoch(2)
    start, data, stim = loader.get_next_chunk()
    loader.cleanup()
    assert start == 0 and data.shape[0] == 1_000 and stim.shape[0] == 1_000
    assert disk.calls[0] == (0, 1_000)


def test_merged_time_units_must_be_a_positive_int():
    disk = FakeDisk(1_000)
    for bad in (0, -4, 2.5, True):
        with pytest.raises(ValueError, match="time_units"):
            RandomChunkLoader(disk.load, 1_000, 100, device="cpu", time_units=bad)
    assert disk.calls == []


def test_merged_cleanup_stops_loading():
    disk = FakeDisk(50_000, delay_s=0.05)
    loader = RandomChunkLoader(disk.load, 50_000, 5_000, device="cpu", time_units=5)
    loader.start_epoch(num_chunks=20)
    loader.get_next_chunk()
    loader.get_next_chunk()
    loader.cleanup()
    time.sleep(0.2)
    assert len(disk.calls) < 20


def test_merged_loading_overlaps_training():
    # 10 chunks, each 60 ms to load and 60 ms to "train": overlapped ~0.66 s, serial 1.2 s.
    disk = FakeDisk(50_000, delay_s=0.06)
    loader = RandomChunkLoader(disk.load, 50_000, 5_000, device="cpu", prefetch=4, seed=0)
    loader.start_epoch(10)
    begin = time.perf_counter()
    for _ in range(10):
        assert loader.get_next_chunk()[1] is not None
        time.sleep(0.06)
    elapsed = time.perf_counter() - begin
    loader.cleanup()
    assert elapsed < 0.9 * 10 * (0.06 + 0.06)  # generous: 2 shared cores


# -- the integration guide's form (commit b4c18b94), kept as GuideRandomChunkLoader ---------


def test_guide_basic_loading_returns_data_stim_then_two_nones():
    disk = FakeDisk(100_000, neurons=100, stim_dims=20)
    loader = GuideRandomChunkLoader(load_fn=disk.load, total_timesteps=100_000,
                                    chunk_size=10_000, device="cpu", prefetch=1, seed=42)  # fmt: skip
    loader.start_epoch(5)
    for _ in range(5):
        chunk_data, chunk_stim = loader.get_next_chunk()
        assert chunk_data.shape == (10_000, 100) and chunk_stim.shape == (10_000, 20)
        assert chunk_data.device.type == "cpu"
    assert loader.get_next_chunk() == (None, None)
    assert len(disk.calls) == 5
    loader.cleanup()


def test_guide_has_no_time_units():
    disk = FakeDisk(1_000)
    with pytest.raises(TypeError, match="time_units"):
        GuideRandomChunkLoader(disk.load, 1_000, 100, device="cpu", time_units=4)


def test_guide_seed_42_draws_the_published_starts():
    # randint(0, T - chunk_size) of random.Random(42): the merged draw with time_units 1.
    disk = FakeDisk(30_000)
    loader = GuideRandomChunkLoader(disk.load, 30_000, 5_000, device="cpu", seed=42)
    for _ in range(2):
        loader.start_epoch(2)
        for _ in range(2):
            data, _ = loader.get_next_chunk()
    loader.cleanup()
    assert disk.calls == [(s, s + 5_000) for s in (20952, 3648, 819, 24299)]
    assert data[0, 0].item() == 24299


def test_guide_random_starts_in_range_and_deterministic():
    sequences = []
    for _ in range(2):
        disk = FakeDisk(100_000)
        loader = GuideRandomChunkLoader(disk.load, 100_000, 5_000, device="cpu", seed=123)
        loader.start_epoch(10)
        for _ in range(10):
            loader.get_next_chunk()
        loader.cleanup()
        sequences.append(disk.calls)
    assert sequences[0] == sequences[1]
    assert len({s for s, _ in sequences[0]}) > 1
    assert all(0 <= s <= 95_000 and e == s + 5_000 for s, e in sequences[0])


def test_guide_statistics_and_cleanup():
    disk = FakeDisk(15_000, delay_s=0.02)
    loader = GuideRandomChunkLoader(disk.load, 15_000, 3_000, device="cpu")
    loader.start_epoch(5)
    for _ in range(5):
        loader.get_next_chunk()
    assert loader.get_stats() == {"chunks_loaded": 5, "chunks_transferred": 5}
    loader.start_epoch(20)
    loader.get_next_chunk()
    loader.cleanup()
    time.sleep(0.1)
    assert len(disk.calls) < 25
