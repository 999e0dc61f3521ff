"""The chunk shuffle buffer (``BatchStream(mix=)``, ``ChunkMixer``), on a real zarr store."""

from __future__ import annotations

import collections
import itertools

import numpy as np
import pytest
import torch

import chunkstream as cs
from chunkstream.consumer._mixing import ChunkMixer
from tests.flat import loader_from, stream_from
from tests.stores import make_array

T = 2000
GRID = 16  # the store's time chunk
WINDOW = 5


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Column 0 is the timestep, so a window's first value names its start."""
    path = tmp_path_factory.mktemp("mixing") / "x.zarr"
    t = np.arange(T, dtype=np.float32)
    make_array(path, np.stack([t, np.sin(t)], axis=1), (GRID, 2))
    source = cs.ZarrSource(path)
    yield source
    source.close()


SEGMENTS = [(0, 700, "a"), (760, 1500, "b"), (1530, 2000, "c")]


def _loader(source, **kwargs):
    options = {"device": "cpu", "workers": 2, "prefetch": 2, "sampling": "shuffled", "seed": 3,
               "pieces": 4, "window": WINDOW}  # fmt: skip
    return loader_from(source, 256, **{**options, **kwargs})


def _stream(loader, **kwargs):
    options = {"window": WINDOW, "batch_size": 16, "batches_per_chunk": 4, "chunks_per_epoch": 6,
               "fields": "data", "mix": 3}  # fmt: skip
    return stream_from(loader, **{**options, **kwargs})


@pytest.mark.parametrize(("mix", "pieces", "segments"),
                         [(3, 4, None), (2, 1, None), (4, 8, SEGMENTS), (6, 2, SEGMENTS)])  # fmt: skip
def test_mixed_windows_stay_inside_one_piece_of_a_held_chunk_and_mix_chunks(
    store, mix, pieces, segments
):
    with _loader(store, pieces=pieces, segments=segments) as loader:
        stream = _stream(loader, mix=mix)
        chunks_per_batch = []
        for batch in stream:
            held = stream._mixer.held  # the buffer as it was when the batch was drawn
            assert 1 <= len(held) <= mix
            pieces_held = [(c.index, p) for c in held for p in c.pieces]
            sources = set()
            for w in batch.numpy():
                t0 = int(w[0, 0])
                # a window is a contiguous stretch of the source ...
                np.testing.assert_array_equal(w[:, 0], np.arange(t0, t0 + WINDOW))
                # ... inside one piece of a chunk the buffer holds, and one segment
                inside = [i for i, p in pieces_held if p.start <= t0 and t0 + WINDOW <= p.stop]
                assert inside, (t0, pieces_held)
                sources.add(inside[0])
                if segments is not None:
                    assert any(a <= t0 and t0 + WINDOW <= b for a, b, _ in segments)
            chunks_per_batch.append(len(sources))
    assert len(chunks_per_batch) == 24
    # the point of mixing: a batch draws from several held chunks, not one
    assert max(chunks_per_batch) == min(mix, 6)
    assert np.mean(chunks_per_batch) > 1.5


def test_draws_are_uniform_over_every_valid_start_of_the_held_chunks(store):
    segments = cs.Segments([(0, 100), (300, 1000), (1200, 1230)])  # one piece shorter than 64
    with _loader(store, pieces=4, segments=segments, sampling="random") as loader:
        mixer = ChunkMixer(3, window=WINDOW, rows=loader.rows, fields=["data"])
        chunks = loader.epoch(3)
        for chunk in chunks:
            mixer.add(chunk)
        held = mixer.held
    assert len(held) == 3
    valid = collections.Counter()
    for c in held:
        for p in c.pieces:
            for t in range(p.start, p.stop - WINDOW + 1):
                valid[t] += 1  # a timestep may start windows in two held chunks
    generator = torch.Generator().manual_seed(0)
    draws = 400 * sum(valid.values())
    starts = mixer.sample(draws, generator)
    t0 = mixer.gather("data", starts)[:, 0, 0].long().tolist()
    seen = collections.Counter(t0)
    assert set(seen) == set(valid)  # no start outside a piece, every valid one drawn
    for t, n in valid.items():  # expected 400 per valid (chunk, start); 6+ sigma bounds
        assert 250 * n <= seen[t] <= 550 * n, (t, seen[t], n)
    # each chunk's share is its share of the valid starts
    per_chunk = torch.bincount(starts // loader.rows, minlength=3).tolist()
    for c, got in zip(held, per_chunk, strict=True):
        n = sum(max(0, p.stop - p.start - WINDOW + 1) for p in c.pieces)
        assert abs(got / draws - n / sum(valid.values())) < 0.02


@pytest.mark.parametrize(
    ("mix", "cut"),
    # 24 batches an epoch (6 chunks of 4): cuts mid-chunk and between chunks, in the first
    # epoch, at an epoch's end (24, 48) and just after it; with mix=8 the buffer spans
    # more than an epoch, so the state to resume lies an epoch (or two) back.
    [(3, 1), (3, 4), (3, 5), (3, 13), (3, 22), (3, 24), (3, 25), (3, 30), (3, 48),
     (8, 5), (8, 24), (8, 27), (8, 30), (8, 45), (8, 48), (8, 53)],
)  # fmt: skip
def test_resume_is_exact_mid_buffer_and_across_epochs(store, mix, cut):
    epochs = 4
    with _loader(store) as loader:
        stream = _stream(loader, mix=mix)
        full = [b.clone() for _ in range(epochs) for b in stream]
    with _loader(store) as loader:
        stream = _stream(loader, mix=mix)
        head: list[torch.Tensor] = []
        while len(head) < cut:  # whole epochs, then part of one
            it = iter(stream)
            head += [b.clone() for b in itertools.islice(it, cut - len(head))]
        state = stream.state_dict()
    with _loader(store) as loader:
        stream = _stream(loader, mix=mix)
        stream.load_state_dict(state)
        tail = [b.clone() for b in stream]  # the rest of the interrupted epoch
        while len(head) + len(tail) < 3 * 24:
            epoch = [b.clone() for b in stream]
            assert len(epoch) == 24  # batches per epoch unchanged
            tail += epoch
        third = stream.state_dict()  # at an epoch's end: the held chunks are re-read
    with _loader(store) as loader:
        stream = _stream(loader, mix=mix)
        stream.load_state_dict(third)
        tail += [b.clone() for b in stream]
    assert state["batch"] == cut % 4 and set(state) >= {"loader", "batch"}  # a few integers
    assert 0 <= state["refill"] < mix
    assert len(head) + len(tail) == len(full) == epochs * 24
    for a, b in zip(head + tail, full, strict=True):
        torch.testing.assert_close(a, b)


def test_the_buffer_is_kept_across_epochs_and_dropped_when_an_epoch_is_closed_early(store):
    with _loader(store) as loader:
        stream = _stream(loader, mix=8)
        for _ in stream:
            pass
        assert [c.epoch for c in stream._mixer.held] == [0] * 6  # kept after the epoch
        it = iter(stream)
        first = next(it)
        held = stream._mixer.held
        # the next epoch's first batch mixes its first chunk with the last epoch's six
        assert [(c.epoch, c.index) for c in held] == [(0, i) for i in range(6)] + [(1, 0)]
        t0 = first[:, 0, 0].long().tolist()
        sources = {c.epoch for c in held for p in c.pieces for t in t0
                   if p.start <= t and t + WINDOW <= p.stop}  # fmt: skip
        assert 0 in sources
        # closed after one batch: the epoch is over and its resume state is the next
        # epoch's start, so the buffer starts empty again
        it.close()
        assert stream._mixer.held == () and stream.state_dict()["refill"] == 0


def test_mix_one_holds_the_loaders_chunk_and_draws_from_it_alone(store):
    with _loader(store) as loader:
        stream = _stream(loader, mix=1)
        count = 0
        for batch in stream:
            (chunk,) = stream._mixer.held
            for t0 in batch[:, 0, 0].long().tolist():
                assert any(p.start <= t0 and t0 + WINDOW <= p.stop for p in chunk.pieces)
            count += 1
        assert count == 24 and stream._mixer.nbytes == 0  # no copy


def test_the_mixer_owns_its_storage_so_the_loader_never_waits_for_it(store):
    with _loader(store, prefetch=1, workers=1) as loader:
        stream = _stream(loader, mix=5, chunks_per_epoch=8)
        count = 0
        for _ in stream:  # 5 chunks held with one loader buffer in flight: no stall
            mixer = stream._mixer
            base = mixer._storage["data"].untyped_storage().data_ptr()
            assert all(c["data"].untyped_storage().data_ptr() == base for c in mixer.held)
            count += 1
        assert count == 32
        assert mixer.nbytes == 5 * loader.rows * 2 * 4


def test_bad_mix_is_refused(store):
    with _loader(store) as loader:
        for bad in (0, -2, 1.5, True, "4"):
            with pytest.raises(cs.ConfigError, match=r"mix=.*an int >= 1"):
                _stream(loader, mix=bad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_mixed_batches_equal_the_cpu_ones_and_the_buffer_lives_on_the_device(store):
    # The copies into the mixer's storage are queued on the current stream after the
    # chunk's ready event; the batches must equal a CPU run's (the draws are seeded alike
    # only per device, so compare every window with the source instead).
    with _loader(store, device="cuda") as loader:
        stream = _stream(loader, mix=4)
        count = 0
        for batch in stream:
            assert batch.is_cuda and stream._mixer._storage["data"].is_cuda
            w = batch.cpu().numpy()
            t0 = w[:, 0, 0].astype(np.int64)
            np.testing.assert_array_equal(w[:, :, 0], t0[:, None] + np.arange(WINDOW))
            np.testing.assert_allclose(w[:, :, 1], np.sin(w[:, :, 0]), rtol=1e-6)
            count += 1
        assert count == 24
