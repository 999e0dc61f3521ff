"""Latency records, batch timing, summaries, TensorBoard scalars and the overlap timeline."""

from ._latency import BatchRecord, ChunkRecord, LatencyStats
from ._timeline import plot_timeline
from ._timer import BatchTimer

__all__ = ["BatchRecord", "BatchTimer", "ChunkRecord", "LatencyStats", "plot_timeline"]
