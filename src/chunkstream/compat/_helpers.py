"""The original's helpers: batch sampling inside a chunk, latency records, the FlyVis ``load_fn``."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .._errors import ConfigError

__all__ = [
    "CALLER",
    "ChunkLatencyStats",
    "Claims",
    "create_zarr_loader",
    "sample_batch_within_chunk",
]


def _also_chunk_stim(function):
    """Accept the keyword ``chunk_stim=`` (the integration guide's name) for ``_chunk_stim=``."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        if "chunk_stim" in kwargs:
            if "_chunk_stim" in kwargs or len(args) > 1:
                raise TypeError(
                    "sample_batch_within_chunk() got the stimulus twice (_chunk_stim and chunk_stim)"
                )
            kwargs["_chunk_stim"] = kwargs.pop("chunk_stim")
        return function(*args, **kwargs)

    return wrapper


@_also_chunk_stim
def sample_batch_within_chunk(
    chunk_data: torch.Tensor,
    _chunk_stim: torch.Tensor,
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
    that many neurons drawn with replacement and the sorted unique union of them
    with their CSR neighbours, else two empty long tensors. The draws are the
    original's ``torch.randint`` calls (same torch seed, same tensors). The unused
    stimulus may be passed as ``_chunk_stim=`` or ``chunk_stim=``.
    """
    chunk_len = int(chunk_data.shape[0])
    high = chunk_len - int(total_steps)
    if high <= 0:
        raise ConfigError(
            f"total_steps={total_steps} does not fit in a chunk of {chunk_len} timesteps: "
            "batch starts are drawn from [0, chunk_len - total_steps), which is empty. "
            "Use a larger chunk_size or a shorter rollout."
        )
    batch_indices = torch.randint(low=0, high=high, size=(int(batch_size),), device=device)
    if num_neurons_to_zero <= 0:
        empty = torch.empty(0, dtype=torch.long, device=device)
        return batch_indices, empty, empty.clone()
    from ..consumer import neighbour_union

    num_neurons = int(chunk_data.shape[1])
    selected = torch.randint(
        low=0, high=num_neurons, size=(int(num_neurons_to_zero),), device=device
    )
    needed = neighbour_union(selected, wmat_indices, wmat_indptr)
    return batch_indices, selected, needed


@dataclass
class ChunkLatencyStats:
    """The original's latency recorder: seconds in, milliseconds in the summary (which,
    as the original's, ignores ``chunk_load_times`` and ``chunk_transfer_times``)."""

    chunk_load_times: list[float] = field(default_factory=list)
    chunk_transfer_times: list[float] = field(default_factory=list)
    chunk_get_times: list[float] = field(default_factory=list)
    batch_forward_times: list[float] = field(default_factory=list)
    batch_backward_times: list[float] = field(default_factory=list)
    batch_step_times: list[float] = field(default_factory=list)

    def record_chunk_get(self, duration_s: float) -> None:
        """Record one wait for ``get_next_chunk``, in seconds."""
        self.chunk_get_times.append(float(duration_s))

    def record_batch_times(self, forward_s: float, backward_s: float, step_s: float) -> None:
        """Record one batch's forward, backward and optimizer-step times, in seconds."""
        self.batch_forward_times.append(float(forward_s))
        self.batch_backward_times.append(float(backward_s))
        self.batch_step_times.append(float(step_s))

    def get_summary(self) -> dict[str, float]:
        """Means/max/min in ms and counts under the original keys, all floats as the
        original's; 0.0 where nothing was recorded."""

        def ms(values: list[float], reduce: Callable[[list[float]], float]) -> float:
            return float(reduce(values)) * 1e3 if values else 0.0

        return {
            "chunk_get_mean_ms": ms(self.chunk_get_times, np.mean),
            "chunk_get_max_ms": ms(self.chunk_get_times, max),
            "chunk_get_min_ms": ms(self.chunk_get_times, min),
            "batch_forward_mean_ms": ms(self.batch_forward_times, np.mean),
            "batch_backward_mean_ms": ms(self.batch_backward_times, np.mean),
            "batch_step_mean_ms": ms(self.batch_step_times, np.mean),
            "num_chunks": float(len(self.chunk_get_times)),
            "num_batches_sampled": float(len(self.batch_forward_times)),
        }

    def print_summary(self) -> None:
        """Print the summary as a small table (this API prints by contract)."""
        summary = self.get_summary()
        width = max(len(k) for k in summary)
        print("chunk latency summary")
        for key, value in summary.items():
            text = f"{value:.3f}" if key.endswith("_ms") else str(int(value))
            print(f"  {key:<{width}}  {text}")


class Claims:
    """The ``create_zarr_loader`` functions one compat loader has called."""

    def __init__(self) -> None:
        self.users: set[_ZarrLoadFn] = set()


# The compat loader on whose behalf this thread is calling load_fn (None: a direct call).
CALLER: ContextVar[Claims | None] = ContextVar("chunkstream_compat_caller", default=None)


class _ZarrLoadFn:
    """:func:`create_zarr_loader`'s ``load_fn``: a FlyVis store, open while in use.

    Opened at creation (a bad path fails there). Every compat loader that calls it,
    also through a wrapper, claims it (:data:`CALLER`); once the last claimant's
    ``cleanup()`` released it and no call is in flight, the store is closed, and a
    later call reopens it. Thread-safe.
    """

    def __init__(self, open_fn: Callable[[], Callable]) -> None:
        self._open_fn = open_fn
        self._fn = open_fn()
        self._open = True
        self._users: set[Claims] = set()
        self._in_flight = 0
        self._close_pending = False  # released by its last claimant while a call ran
        self._lock = threading.Lock()

    @property
    def source(self):
        """The :class:`~chunkstream.ZarrSource` it reads (``source.close()`` closes it)."""
        return self._fn.source

    def __call__(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        claims = CALLER.get()
        with self._lock:
            if claims is not None and claims not in self._users:
                self._users.add(claims)
                claims.users.add(self)
                self._close_pending = False
            if not self._open:
                self._fn, self._open = self._open_fn(), True
            fn = self._fn
            self._in_flight += 1
        try:
            return fn(start, end)
        finally:
            with self._lock:
                self._in_flight -= 1
                self._close_if_unused()

    def release(self, claims: Claims) -> None:
        """``claims``' loader is done with it: close the store if nobody else uses it."""
        with self._lock:
            self._users.discard(claims)
            claims.users.discard(self)
            # Only a store some loader claimed closes by itself; a load_fn only ever
            # called directly stays open, as the original's.
            self._close_pending = not self._users
            self._close_if_unused()

    def _close_if_unused(self) -> None:  # called under the lock
        if self._open and self._close_pending and not self._users and not self._in_flight:
            self._fn.source.close()
            self._open = self._close_pending = False


def create_zarr_loader(
    data_path: str, column_idx: int, stim_column_idx: int, num_stim_dims: int
) -> Callable[[int, int], tuple[np.ndarray, np.ndarray]]:
    """``load_fn(start, end) -> (data, stim)`` over a FlyVis store, opened once.

    The compat loaders that call it close its store in their ``cleanup()`` once
    none of them uses it (it reopens on its next call); ``load_fn.source`` is the
    open :class:`~chunkstream.ZarrSource`.
    """
    from .. import flyvis

    return _ZarrLoadFn(
        lambda: flyvis.make_load_fn(data_path, column_idx, stim_column_idx, num_stim_dims)
    )
