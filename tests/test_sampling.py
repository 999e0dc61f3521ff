"""Batch sampling inside a chunk: bounds, the without-replacement property, gather, augmentation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from chunkstream import ConfigError
from chunkstream.compat import (
    neighbour_union,
    sample_batch_within_chunk,
    zero_neurons_with_neighbours,
)
from chunkstream.consumer import gather_windows, sample_windows
from chunkstream.consumer._sampling import WindowSampler
from chunkstream.pipeline import Chunk

sizes = st.integers(1, 300).flatmap(
    lambda length: st.tuples(st.just(length), st.integers(1, length), st.integers(1, 64))
)


@settings(max_examples=60, deadline=None)
@given(sizes, st.integers(0, 2**31), st.booleans())
def test_sample_windows_stays_in_bounds(size, seed, replacement):
    length, window, batch = size
    n = length - window + 1
    if not replacement and batch > n:
        with pytest.raises(ConfigError, match="batch_size"):
            sample_windows(length, batch, window, replacement=False)
        return
    gen = torch.Generator().manual_seed(seed)
    starts = sample_windows(length, batch, window, gen, replacement=replacement)
    assert starts.dtype == torch.long and starts.shape == (batch,)
    assert int(starts.min()) >= 0 and int(starts.max()) <= length - window
    if not replacement:
        assert starts.unique().numel() == batch


def test_sample_windows_takes_a_chunk_or_tensor_and_is_seeded():
    data = torch.randn(100, 3)
    chunk = Chunk({"x": data}, start=0, stop=100, epoch=0, index=0)
    a = sample_windows(chunk, 16, 10, torch.Generator().manual_seed(1))
    b = sample_windows(data, 16, 10, torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and a.device == data.device
    assert not torch.equal(a, sample_windows(chunk, 16, 10, torch.Generator().manual_seed(2)))


@settings(max_examples=40, deadline=None)
@given(sizes, st.integers(0, 2**31))
def test_window_sampler_yields_every_start_once_per_pass(size, seed):
    length, window, batch = size
    sampler = WindowSampler(length, window, batch, torch.Generator().manual_seed(seed))
    for _ in range(2):  # each pass is a fresh permutation of all starts
        batches = list(sampler)
        assert len(batches) == len(sampler)
        assert all(len(b) <= batch for b in batches)
        starts = torch.cat(batches).sort().values
        assert torch.equal(starts, torch.arange(length - window + 1))


def test_window_sampler_drop_last_and_replacement():
    gen = torch.Generator().manual_seed(0)
    full = WindowSampler(103, 4, 10, gen, drop_last=True)  # 100 starts
    assert len(full) == 10 and all(len(b) == 10 for b in full)
    short = WindowSampler(104, 4, 10, gen, drop_last=True)  # 101 starts: one dropped
    assert len(short) == 10 and torch.cat(list(short)).unique().numel() == 100
    rep = WindowSampler(104, 4, 10, gen, replacement=True)
    batches = list(rep)
    assert len(batches) == len(rep) == 11
    assert all(len(b) == 10 and int(b.max()) <= 100 for b in batches)


def test_gather_windows_matches_slicing_and_fills_out():
    x = torch.randn(50, 3, 2)
    starts = torch.tensor([0, 45, 7, 7])
    batch = gather_windows(x, starts, 5)
    assert batch.shape == (4, 5, 3, 2) and batch.is_contiguous()
    for b, s in enumerate(starts.tolist()):
        assert torch.equal(batch[b], x[s : s + 5])
    out = torch.empty(4, 5, 3, 2)
    result = gather_windows(x, starts, 5, out=out)
    assert result.data_ptr() == out.data_ptr() and torch.equal(out, batch)


def test_gather_windows_rejects_bad_input():
    x = torch.randn(20, 4)
    with pytest.raises(ConfigError, match="window"):
        gather_windows(x, torch.tensor([0]), 21)
    with pytest.raises(ConfigError, match="starts"):
        gather_windows(x, torch.tensor([0.0]), 3)
    with pytest.raises(ConfigError, match="window"):
        sample_windows(10, 4, 11)
    with pytest.raises(ConfigError, match="batch_size"):
        sample_windows(10, 0, 2)


def _random_csr(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    counts = rng.integers(0, 5, n)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    indices = rng.integers(0, n, int(indptr[-1]))
    return indices, indptr


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 40), st.integers(0, 2**31), st.data())
def test_neighbour_union_matches_a_reference(n, seed, data):
    rng = np.random.default_rng(seed)
    indices, indptr = _random_csr(rng, n)
    k = data.draw(st.integers(0, n))
    selected = torch.as_tensor(rng.permutation(n)[:k])
    got = neighbour_union(selected, indices, indptr)
    expected = set(selected.tolist())
    for i in selected.tolist():
        expected.update(indices[indptr[i] : indptr[i + 1]].tolist())
    assert got.dtype == torch.long
    assert got.tolist() == sorted(expected)
    # torch CSR arrays give the same answer
    assert torch.equal(
        got, neighbour_union(selected, torch.as_tensor(indices), torch.as_tensor(indptr))
    )


def test_zero_neurons_with_neighbours():
    rng = np.random.default_rng(0)
    indices, indptr = _random_csr(rng, 12)
    batch = torch.randn(4, 6, 12) + 5.0
    out, selected, needed = zero_neurons_with_neighbours(
        batch, 3, indices, indptr, generator=torch.Generator().manual_seed(0)
    )
    assert selected.numel() == 3 and set(selected.tolist()) <= set(needed.tolist())
    assert torch.all(out[..., selected] == 0)
    keep = [i for i in range(12) if i not in selected.tolist()]
    assert torch.equal(out[..., keep], batch[..., keep])
    assert torch.all(batch > 0)  # not in place by default
    same, empty, empty2 = zero_neurons_with_neighbours(batch, 0, indices, indptr)
    assert same is batch and empty.numel() == empty2.numel() == 0
    with pytest.raises(ConfigError, match="num_neurons_to_zero"):
        zero_neurons_with_neighbours(batch, 13, indices, indptr)


def test_compat_sample_batch_uses_the_union():
    rng = np.random.default_rng(1)
    indices, indptr = _random_csr(rng, 20)
    data = torch.randn(64, 20)
    starts, selected, needed = sample_batch_within_chunk(
        data, data, indices, indptr, 8, 10, 4, "cpu"
    )
    assert starts.shape == (8,) and int(starts.max()) < 64 - 10
    assert torch.equal(needed, neighbour_union(selected, indices, indptr))


def test_the_csr_cache_drops_a_dead_arrays_device_copy_at_once():
    import gc

    from chunkstream.compat import _augment

    indptr = np.array([0, 2, 3, 3, 5])
    indices = np.array([1, 2, 0, 3, 4])
    key = (id(indices), id(indptr), "cpu")
    neighbour_union(torch.tensor([3, 0]), indices, indptr)
    assert key in _augment._CACHE
    del indices  # the caller's array dies: its copy goes with it, not at the next miss
    gc.collect()
    assert key not in _augment._CACHE
    alive = [(np.array([0]), np.array([0, 1])) for _ in range(2 * _augment._CACHE_SIZE)]
    for idx, ptr in alive:
        neighbour_union(torch.tensor([0]), idx, ptr)
    assert len(_augment._CACHE) <= _augment._CACHE_SIZE  # bounded while the arrays live
