"""Drop-in replacements for the original implementation's API (change one import).

Signatures and return values match the original (see DESIGN.md, "Drop-in
compatibility"); the machinery underneath is :class:`~chunkstream.ChunkLoader`.
What is fixed on the way:

* a reader exception raises :class:`~chunkstream.ChunkLoadError` in
  ``get_next_chunk`` (its ``__cause__`` the original) instead of hanging forever;
* ``start_epoch`` again, also mid-epoch, abandons the old epoch at once: no 2 s
  stall, and no stale end-of-epoch marker handed to the new epoch (each epoch is
  its own generation inside the pipeline);
* the store is opened once, and pinned slots are reused instead of re-pinned.

``load_fn`` is called once with a short window ``(0, min(2, T))`` at
construction to learn the arrays' shapes and dtypes; after that it sees exactly
the plan's ``(start, end)`` windows, the same sequence for the same seed.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ._errors import ConfigError
from .pipeline import ChunkLoader
from .plans import RandomPlan, calculate_chunk_params
from .sources import CallableSource

__all__ = [
    "ChunkLatencyStats",
    "PipelineChunkLoader",
    "RandomChunkLoader",
    "calculate_chunk_params",
    "create_zarr_loader",
    "sample_batch_within_chunk",
]


class RandomChunkLoader:
    """Uniform random windows ``[start, start + chunk_size)`` read ahead in a background thread.

    ``get_next_chunk()`` returns ``(data, stim)`` tensors on ``device``, then
    ``(None, None)`` once the epoch's ``num_chunks`` chunks were delivered.
    """

    def __init__(
        self,
        load_fn: Callable[[int, int], tuple[np.ndarray, np.ndarray]],
        total_timesteps: int,
        chunk_size: int,
        device: str = "cuda",
        prefetch: int = 1,
        seed: int | None = None,
        *,
        _gpu_prefetch: int = 1,
        _align: int = 1,
    ) -> None:
        self.total_timesteps = total_timesteps
        self.chunk_size = chunk_size
        self.device = device
        self.prefetch = prefetch
        self.seed = secrets.randbits(32) if seed is None else seed
        self.source = CallableSource(load_fn, total_timesteps, names=("data", "stim"))
        self._loader = ChunkLoader(
            self.source,
            chunk_size,
            device=device,
            prefetch=prefetch,
            gpu_prefetch=_gpu_prefetch,
            workers=1,
            sampling=RandomPlan(
                total_timesteps=total_timesteps,
                chunk_size=chunk_size,
                align=_align,
                seed=self.seed,
            ),
        )
        self._iterator: Any = None

    def start_epoch(self, num_chunks: int) -> None:
        """Begin an epoch of ``num_chunks`` chunks; abandons any epoch in progress."""
        self._iterator = self._loader.epoch(num_chunks)

    def _next(self):
        if self._iterator is None:
            raise RuntimeError("call start_epoch(num_chunks) before get_next_chunk()")
        return next(self._iterator, None)

    def get_next_chunk(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The next chunk as ``(data, stim)`` on ``device``; ``(None, None)`` after the epoch's last.

        Raises :class:`~chunkstream.ChunkLoadError` if a read failed (it never hangs).
        """
        chunk = self._next()
        if chunk is None:
            return None, None
        return chunk["data"], chunk["stim"]

    def get_stats(self) -> dict[str, int]:
        """``{'chunks_loaded': int, 'chunks_transferred': int}`` since construction."""
        return {
            "chunks_loaded": self._loader._reader.completed,
            "chunks_transferred": len(self._loader.stats.chunks),
        }

    def cleanup(self) -> None:
        """Stop the background threads (idempotent)."""
        self._loader.close()

    @property
    def stats(self):
        """The underlying :class:`~chunkstream.LatencyStats` (waits, reads, transfers)."""
        return self._loader.stats

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


class PipelineChunkLoader(RandomChunkLoader):
    """As :class:`RandomChunkLoader`, with starts a multiple of ``time_units``.

    ``get_next_chunk()`` returns ``(start, data, stim)``, then ``(None, None, None)``.
    """

    def __init__(
        self,
        load_fn: Callable[[int, int], tuple[np.ndarray, np.ndarray]],
        total_timesteps: int,
        chunk_size: int,
        device: str = "cuda",
        prefetch: int = 1,
        seed: int | None = None,
        time_units: int = 1,
        gpu_prefetch: int = 1,
    ) -> None:
        self.time_units = time_units
        super().__init__(
            load_fn,
            total_timesteps,
            chunk_size,
            device=device,
            prefetch=prefetch,
            seed=seed,
            _gpu_prefetch=gpu_prefetch,
            _align=time_units,
        )

    def get_next_chunk(self):  # type: ignore[override]
        """The next chunk as ``(start, data, stim)``; ``(None, None, None)`` after the epoch's last."""
        chunk = self._next()
        if chunk is None:
            return None, None, None
        return chunk.start, chunk["data"], chunk["stim"]


def sample_batch_within_chunk(
    chunk_data: torch.Tensor,
    chunk_stim: torch.Tensor,
    wmat_indices: Any,
    wmat_indptr: Any,
    batch_size: int,
    total_steps: int,
    num_neurons_to_zero: int,
    device: str | torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random batch starts inside a chunk, plus the original's neuron-zeroing augmentation.

    Returns ``(batch_indices, selected_neurons, needed_indices)``: ``batch_size``
    starts uniform in ``[0, chunk_len - total_steps)``; if ``num_neurons_to_zero > 0``,
    that many random neurons and the sorted unique union of them with their CSR
    neighbours; else two empty long tensors.
    """
    del chunk_stim
    chunk_len = int(chunk_data.shape[0])
    high = chunk_len - int(total_steps)
    if high <= 0:
        raise ConfigError(
            f"total_steps={total_steps} does not fit in a chunk of {chunk_len} timesteps: "
            "batch starts are drawn from [0, chunk_len - total_steps), which is empty. "
            "Use a larger chunk_size or a shorter rollout."
        )
    batch_indices = torch.randint(0, high, (int(batch_size),), device=device)
    if num_neurons_to_zero <= 0:
        empty = torch.empty(0, dtype=torch.long, device=device)
        return batch_indices, empty, empty.clone()
    from .consumer import neighbour_union

    num_neurons = int(chunk_data.shape[1])
    selected = torch.randperm(num_neurons, device=device)[: int(num_neurons_to_zero)]
    needed = neighbour_union(selected, wmat_indices, wmat_indptr)
    return batch_indices, selected, needed


class ChunkLatencyStats:
    """The original's latency recorder: seconds in, milliseconds in the summary."""

    def __init__(self) -> None:
        self.chunk_get_times: list[float] = []
        self.batch_forward_times: list[float] = []
        self.batch_backward_times: list[float] = []
        self.batch_step_times: list[float] = []

    def record_chunk_get(self, seconds: float) -> None:
        """Record one wait for ``get_next_chunk``, in seconds."""
        self.chunk_get_times.append(float(seconds))

    def record_batch_times(self, forward: float, backward: float, step: float) -> None:
        """Record one batch's forward, backward and optimizer-step times, in seconds."""
        self.batch_forward_times.append(float(forward))
        self.batch_backward_times.append(float(backward))
        self.batch_step_times.append(float(step))

    def get_summary(self) -> dict[str, float | int]:
        """Means/max/min in ms and counts under the original keys; 0.0 where nothing was recorded."""

        def ms(values: list[float], reduce: Callable[[list[float]], float]) -> float:
            return float(reduce(values)) * 1e3 if values else 0.0

        return {
            "chunk_get_mean_ms": ms(self.chunk_get_times, np.mean),
            "chunk_get_max_ms": ms(self.chunk_get_times, max),
            "chunk_get_min_ms": ms(self.chunk_get_times, min),
            "batch_forward_mean_ms": ms(self.batch_forward_times, np.mean),
            "batch_backward_mean_ms": ms(self.batch_backward_times, np.mean),
            "batch_step_mean_ms": ms(self.batch_step_times, np.mean),
            "num_chunks": len(self.chunk_get_times),
            "num_batches_sampled": len(self.batch_forward_times),
        }

    def print_summary(self) -> None:
        """Print the summary as a small table (this API prints by contract)."""
        summary = self.get_summary()
        width = max(len(k) for k in summary)
        print("chunk latency summary")
        for key, value in summary.items():
            text = f"{value:.3f}" if isinstance(value, float) else str(value)
            print(f"  {key:<{width}}  {text}")


def create_zarr_loader(
    data_path: str, column_idx: int, stim_column_idx: int, num_stim_dims: int
) -> Callable[[int, int], tuple[np.ndarray, np.ndarray]]:
    """``load_fn(start, end) -> (data, stim)`` over a FlyVis store, opened once."""
    from . import flyvis

    return flyvis.make_load_fn(data_path, column_idx, stim_column_idx, num_stim_dims)
