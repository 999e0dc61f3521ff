"""``cs.staggered_observations``: each neuron observed at its own phase of every period."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import chunkstream as cs


@settings(max_examples=40, deadline=None)
@given(
    time_units=st.integers(1, 6),
    steps=st.integers(0, 4),
    neurons=st.integers(1, 9),
    extra=st.integers(0, 5),
    seed=st.integers(0, 2**31 - 1),
)
def test_agrees_with_a_direct_index_computation(time_units, steps, neurons, extra, seed):
    g = torch.Generator().manual_seed(seed)
    window = (steps + 1) * time_units + extra
    x = torch.randn((5, window, neurons), generator=g)
    phases = torch.randint(0, time_units, (neurons,), generator=g)
    out = cs.staggered_observations(x, phases, time_units, steps)
    assert out.shape == (5, steps + 1, neurons)
    for b in range(5):
        for m in range(steps + 1):
            for n in range(neurons):
                assert out[b, m, n] == x[b, int(phases[n]) + m * time_units, n]


def test_values_at_the_true_timesteps_of_an_aligned_stream():
    T, N, tu = 600, 5, 4
    data = (np.arange(T)[:, None] * N + np.arange(N)).astype(np.float32)  # x[t, n] = t*N + n
    phases = [3, 0, 2, 1, 3]
    with cs.ChunkLoader(cs.NumpySource({"x": data}), 120, device="cpu", seed=1) as loader:
        stream = cs.BatchStream(
            loader,
            window=12,
            batch_size=8,
            batches_per_chunk=2,
            mix=2,
            options=cs.StreamOptions(chunks_per_epoch=5, align=tu),
        )
        for batch in stream:
            obs = cs.staggered_observations(batch["x"], phases, tu, steps=2)
            start = batch["start"]
            assert (start % tu == 0).all()
            t = start[:, None, None] + torch.tensor(phases) + tu * torch.arange(3)[:, None]
            assert torch.equal(obs.long(), t * N + torch.arange(N))


def test_trailing_axes_are_kept():
    x = torch.randn(2, 8, 3, 2)
    out = cs.staggered_observations(x, np.array([1, 0, 1]), 2, 3)
    assert out.shape == (2, 4, 3, 2)
    assert torch.equal(out[:, 2, 0], x[:, 5, 0])


@pytest.mark.parametrize(
    ("phases", "match"),
    [
        ([0, 4, 1], r"phases\[1\]=4 .*neuron 1"),
        ([0, 1, -1], r"phases\[2\]=-1"),
        ([0.5, 1, 1], "integers"),
        ([0, 1], r"shape \(3,\)"),
    ],
)
def test_a_bad_phase_is_named_with_its_neuron(phases, match):
    with pytest.raises(cs.ConfigError, match=match):
        cs.staggered_observations(torch.zeros(2, 12, 3), phases, 4, 1)


def test_a_window_too_short_names_steps():
    with pytest.raises(cs.ConfigError, match="steps"):
        cs.staggered_observations(torch.zeros(2, 8, 3), [3, 0, 0], 4, 2)


@pytest.mark.gpu
def test_on_the_device():
    x = torch.randn(4, 16, 6, device="cuda")
    phases = torch.tensor([0, 1, 2, 3, 0, 1])
    out = cs.staggered_observations(x, phases, 4, 3)
    assert out.is_cuda
    assert torch.equal(out.cpu(), cs.staggered_observations(x.cpu(), phases, 4, 3))
