"""The merged training script's loop, played with one import changed.

NeuralGraph's merged ``latent.py`` (commit 35464579) streams its training data
with ``RandomChunkLoader`` (chunk_loader.py as of commit 3701037). This plays
its loop: ``calculate_chunk_params``, a loader with ``time_units``, per epoch
``start_epoch(num_chunks=chunks_per_epoch)`` and ``chunks_per_epoch`` times
``chunk_start, chunk_data, chunk_stim = get_next_chunk()`` timed into
``ChunkLatencyStats``, ``batches_per_chunk`` batches from
``sample_batch_within_chunk`` trained on, and ``cleanup()`` at the end.

The expectation is recorded, not computed by chunkstream: ``ORIGINAL_STARTS`` are
the starts the original draws for this seed (its published rule, written out
with ``random.Random`` in ``test_the_recorded_starts_follow_the_published_rule``),
and the reference run calls ``load_fn`` itself, synchronously, at those starts,
with the same batches and training, so every loss and the final model must be
bit-identical.
"""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import torch

from chunkstream.compat import (
    ChunkLatencyStats,
    RandomChunkLoader,  # the one changed import (was LatentEvolution.chunk_loader)
    calculate_chunk_params,
    create_zarr_loader,
    sample_batch_within_chunk,
)
from tests.stores import make_flyvis

T, N, STIM = 1200, 16, 8
CHUNK_SIZE, BATCH_SIZE, PASSES, EPOCHS = 256, 32, 1, 3
TIME_UNITS, EVOLVE_STEPS = 4, 2
TOTAL_STEPS = TIME_UNITS * EVOLVE_STEPS
SEED = 2024
# random.Random(2024), max_start = (1200 - 256) // 4 * 4 = 944, n_valid = 237:
# randint(0, 236) * 4, twelve times (3 epochs of 4 chunks).
ORIGINAL_STARTS = [480, 184, 744, 592, 308, 204, 908, 740, 416, 772, 732, 776]


def test_the_recorded_starts_follow_the_published_rule():
    rng = random.Random(SEED)
    max_start = (max(0, T - CHUNK_SIZE) // TIME_UNITS) * TIME_UNITS
    n_valid = max_start // TIME_UNITS + 1
    assert [rng.randint(0, n_valid - 1) * TIME_UNITS for _ in ORIGINAL_STARTS] == ORIGINAL_STARTS


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("merged") / "run"
    data = make_flyvis(path, T, N, chunks=(64, STIM, 1))  # the stimulus in its own chunks
    return path, data


def _graph():
    """A CSR connectome: neuron i feeds (i + 1) % N and (i + 3) % N."""
    indptr = torch.arange(0, 2 * N + 1, 2)
    indices = torch.tensor([(i + d) % N for i in range(N) for d in (1, 3)])
    return indices, indptr


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.evolve = torch.nn.Linear(N + STIM, N)

    def forward(self, x, s):  # x: (B, W, N), s: (B, W, STIM)
        return x[:, :-1] + self.evolve(torch.cat([x[:, :-1], s[:, :-1]], dim=-1))


def _train_chunk(model, optimizer, chunk_data, chunk_stim, stats, losses):
    """One chunk's batches, as the merged script trains them."""
    indices, indptr = _graph()
    window = torch.arange(TOTAL_STEPS)
    for _ in range(BATCHES_PER_CHUNK):
        batch_indices, selected, _needed = sample_batch_within_chunk(
            chunk_data, chunk_stim, indices, indptr, BATCH_SIZE, TOTAL_STEPS,
            num_neurons_to_zero=2, device="cpu",
        )  # fmt: skip
        rows = batch_indices[:, None] + window  # (B, TOTAL_STEPS)
        x, s = chunk_data[rows].clone(), chunk_stim[rows]
        x[:, :, selected] = 0.0  # the augmentation: zero the selected neurons' inputs
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x, s), chunk_data[rows][:, 1:])
        t1 = time.perf_counter()
        optimizer.zero_grad()
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
        stats.record_batch_times(t1 - t0, t2 - t1, time.perf_counter() - t2)
        losses.append(loss.item())


CHUNKS_PER_EPOCH, BATCHES_PER_CHUNK, BATCHES_PER_EPOCH = calculate_chunk_params(
    T, CHUNK_SIZE, BATCH_SIZE, PASSES
)


def _fresh_model():
    torch.manual_seed(0)
    model = Model()
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def test_the_merged_loop_makes_the_originals_calls_and_trains_identically(store):
    path, data = store
    assert (CHUNKS_PER_EPOCH, BATCHES_PER_CHUNK, BATCHES_PER_EPOCH) == (4, 8, 37)
    zarr_load_fn = create_zarr_loader(str(path), 3, 4, STIM)
    calls = []

    def load_fn(start, end):  # the script's load_fn, recorded
        calls.append((start, end))
        return zarr_load_fn(start, end)

    # chunkstream, as the merged script drives it.
    model, optimizer = _fresh_model()
    stats, losses, starts = ChunkLatencyStats(), [], []
    loader = RandomChunkLoader(load_fn=load_fn, total_timesteps=T, chunk_size=CHUNK_SIZE,
                               device="cpu", prefetch=1, seed=SEED, time_units=TIME_UNITS)  # fmt: skip
    for _epoch in range(EPOCHS):
        loader.start_epoch(num_chunks=CHUNKS_PER_EPOCH)
        for _ in range(CHUNKS_PER_EPOCH):
            t0 = time.perf_counter()
            chunk_start, chunk_data, chunk_stim = loader.get_next_chunk()
            stats.record_chunk_get(time.perf_counter() - t0)
            assert chunk_data is not None
            np.testing.assert_array_equal(
                chunk_data.numpy(), data[chunk_start : chunk_start + CHUNK_SIZE, :, 0]
            )
            np.testing.assert_array_equal(
                chunk_stim.numpy(), data[chunk_start : chunk_start + CHUNK_SIZE, :STIM, 1]
            )
            starts.append(chunk_start)
            _train_chunk(model, optimizer, chunk_data, chunk_stim, stats, losses)
        assert loader.get_next_chunk() == (None, None, None)
        assert loader.get_stats() == {"chunks_loaded": 4, "chunks_transferred": 4}
    loader.cleanup()
    summary = stats.get_summary()
    assert summary["num_chunks"] == EPOCHS * CHUNKS_PER_EPOCH
    assert summary["num_batches_sampled"] == EPOCHS * CHUNKS_PER_EPOCH * BATCHES_PER_CHUNK

    # The original's calls: one per chunk, at the recorded starts, chunk_size long.
    assert starts == ORIGINAL_STARTS
    assert calls == [(s, s + CHUNK_SIZE) for s in ORIGINAL_STARTS]

    # The original's loop, played synchronously at the recorded starts.
    ref_model, ref_optimizer = _fresh_model()
    ref_losses = []
    for start in ORIGINAL_STARTS:
        chunk_data, chunk_stim = map(torch.from_numpy, zarr_load_fn(start, start + CHUNK_SIZE))
        _train_chunk(ref_model, ref_optimizer, chunk_data, chunk_stim, ChunkLatencyStats(),
                     ref_losses)  # fmt: skip
    zarr_load_fn.source.close()
    assert losses == ref_losses
    for ours, theirs in zip(model.state_dict().values(), ref_model.state_dict().values(),
                            strict=True):  # fmt: skip
        assert ours.numpy().tobytes() == theirs.numpy().tobytes()
