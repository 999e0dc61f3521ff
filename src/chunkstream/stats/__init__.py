"""Latency records, batch timing, summaries, TensorBoard scalars and the overlap timeline."""

from ._latency import BatchRecord, ChunkRecord, LatencyStats
from ._timeline import plot_timeline
from ._timer import BatchTimer

# The package's internal face for the rest of chunkstream (not public API).
from ._latency import Trip as Trip  # isort: skip
from ._original import ChunkLatencyStats as ChunkLatencyStats  # isort: skip
from ._trace import COPY as COPY  # isort: skip
from ._trace import READ as READ  # isort: skip
from ._trace import WAIT as WAIT  # isort: skip
from ._trace import profiled as profiled  # isort: skip

__all__ = ["BatchRecord", "BatchTimer", "ChunkRecord", "LatencyStats", "plot_timeline"]
