"""The original implementation's latency recorder (``chunkstream.compat`` exports it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .._text import format_table

__all__ = ["ChunkLatencyStats"]


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
        rows = [
            (key, f"{value:.3f}" if key.endswith("_ms") else str(int(value)))
            for key, value in summary.items()
        ]
        print("\n".join(["chunk latency summary", *format_table(rows)]))
