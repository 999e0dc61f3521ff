"""The CUDA path: pinned slots, the transfer stream, events and memory bounds (needs a GPU)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import chunkstream as cs
from tests.faults import ArraySource, make_arrays

pytestmark = pytest.mark.gpu


def test_device_chunks_equal_the_stored_bytes():
    arrays = make_arrays(4000, neurons=256)
    with cs.ChunkLoader(ArraySource(arrays), 500, device="cuda", workers=2, seed=1) as loader:
        for _ in range(3):
            for chunk in loader.epoch(8):
                assert chunk["voltage"].is_cuda
                # The current stream already waits for the copy: no explicit sync needed
                # for kernels; .cpu() synchronises with the current stream.
                np.testing.assert_array_equal(
                    chunk["voltage"].cpu().numpy(), arrays["voltage"][chunk.start : chunk.stop]
                )


def test_pinned_pool_is_fixed_and_device_memory_bounded():
    arrays = make_arrays(20000, neurons=512)
    with cs.ChunkLoader(
        ArraySource(arrays), 2000, device="cuda", prefetch=2, gpu_prefetch=1, workers=2
    ) as loader:
        pool = loader._pool
        assert pool.nbytes == loader.config.slots * loader.chunk_bytes
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        peak = 0
        for _ in range(5):
            for chunk in loader.epoch(10):
                time.sleep(0.01)  # let the transfer stage run ahead as far as it may
                peak = max(peak, torch.cuda.memory_allocated() - base)
                del chunk
        # gpu_prefetch chunks queued + one being made + the one the user holds.
        assert peak <= (loader.config.gpu_prefetch + 2) * loader.chunk_bytes
        assert pool.nbytes == loader.config.slots * loader.chunk_bytes


def test_transfer_time_is_measured_with_events():
    arrays = make_arrays(8000, neurons=512)
    with cs.ChunkLoader(ArraySource(arrays), 1000, device="cuda") as loader:
        for _ in loader.epoch(6):
            pass
        torch.cuda.synchronize()
        summary = loader.stats.summary()
    assert summary["transfer_mean_ms"] > 0


def test_error_during_the_copy_reaches_the_consumer(monkeypatch):
    arrays = make_arrays(4000)
    with cs.ChunkLoader(ArraySource(arrays), 500, device="cuda") as loader:
        original = torch.Tensor.copy_

        def failing_copy(self, *args, **kwargs):
            if self.is_cuda:
                raise RuntimeError("injected copy failure")
            return original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "copy_", failing_copy)
        with pytest.raises(cs.ChunkLoadError, match="copying window") as info:
            list(loader.epoch(4))
        assert "injected copy failure" in str(info.value.__cause__)
