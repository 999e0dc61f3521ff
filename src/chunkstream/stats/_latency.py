"""Latency records: what each chunk cost the consumer, and what each batch cost the model.

The loader fills the per-chunk part itself (:meth:`LatencyStats.record_chunk`):
the consumer's wait, the read time measured in the reader thread, the transfer
time (CUDA events, resolved lazily once the copy is known to be done, so
recording never blocks), the queue depth when the consumer asked, and bytes.
Batches are timed by the training loop (:meth:`LatencyStats.batch_timer`).

Thread-safety: records are appended under a lock; summaries copy them first.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["BatchRecord", "ChunkRecord", "LatencyStats"]


@dataclass
class ChunkRecord:
    """One chunk as the consumer saw it. Times are seconds; clocks are ``time.perf_counter``."""

    epoch: int
    index: int
    start: int
    stop: int
    nbytes: int
    wait_s: float  # the consumer blocked in next() for this long
    read_s: float  # the reader spent this long in source.read_into
    queue_depth: int  # chunks ready when the consumer asked
    read_begin: float  # perf_counter when the read started / ended (reader thread)
    read_end: float
    received: float  # perf_counter when next() returned it
    transfer_s: float | None = None  # None until resolved (or on CPU)
    transfer_begin: float | None = None  # host-clock estimate of the copy's span (timeline)
    transfer_end: float | None = None
    _events: Any = field(default=None, repr=False)  # (start, end) CUDA events, unresolved


@dataclass
class BatchRecord:
    forward_s: float
    backward_s: float
    step_s: float
    begin: float = 0.0  # perf_counter at the batch's start (host side, for the timeline)


def _describe(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "max": 0.0, "min": 0.0, "total": 0.0}
    array = np.asarray(values, dtype=np.float64)
    return {
        "mean": float(array.mean()),
        "p50": float(np.percentile(array, 50)),
        "p95": float(np.percentile(array, 95)),
        "max": float(array.max()),
        "min": float(array.min()),
        "total": float(array.sum()),
    }


class LatencyStats:
    """Per-chunk and per-batch latency records with summaries (see module docs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.chunks: list[ChunkRecord] = []
        self.batches: list[BatchRecord] = []
        self._epoch_begin: float | None = None
        self._elapsed = 0.0  # seconds inside epochs, closed spans only

    # -- recording -----------------------------------------------------------------

    def record_chunk(self, record: ChunkRecord) -> None:
        with self._lock:
            self.chunks.append(record)

    def record_batch(self, forward_s: float, backward_s: float, step_s: float, begin: float = 0.0):
        with self._lock:
            self.batches.append(BatchRecord(forward_s, backward_s, step_s, begin))

    def epoch_started(self) -> None:
        with self._lock:
            self._epoch_begin = time.perf_counter()

    def epoch_ended(self) -> None:
        with self._lock:
            if self._epoch_begin is not None:
                self._elapsed += time.perf_counter() - self._epoch_begin
                self._epoch_begin = None

    def reset(self) -> None:
        with self._lock:
            self.chunks.clear()
            self.batches.clear()
            self._elapsed = 0.0
            self._epoch_begin = None

    def resolve_transfers(self) -> None:
        """Turn finished CUDA event pairs into ``transfer_s``; never waits for a copy."""
        with self._lock:
            pending = [r for r in self.chunks if r._events is not None]
        for record in pending:
            begin, end = record._events
            if end.query():
                record.transfer_s = begin.elapsed_time(end) / 1e3
                record._events = None

    # -- summaries -----------------------------------------------------------------

    @property
    def elapsed_s(self) -> float:
        """Seconds spent inside epochs (including a running one)."""
        with self._lock:
            running = 0.0 if self._epoch_begin is None else time.perf_counter() - self._epoch_begin
            return self._elapsed + running

    def summary(self) -> dict[str, float]:
        """Flat dict of figures: waits, reads, transfers, batches, stall fraction, throughput."""
        self.resolve_transfers()
        with self._lock:
            chunks = list(self.chunks)
            batches = list(self.batches)
        out: dict[str, float] = {
            "num_chunks": float(len(chunks)),
            "num_batches": float(len(batches)),
        }
        for name, values in (
            ("wait", [c.wait_s for c in chunks]),
            ("wait_after_first", [c.wait_s for c in chunks if c.index > 0]),
            ("read", [c.read_s for c in chunks]),
            ("transfer", [c.transfer_s for c in chunks if c.transfer_s is not None]),
            ("queue_depth", [float(c.queue_depth) for c in chunks]),
            ("forward", [b.forward_s for b in batches]),
            ("backward", [b.backward_s for b in batches]),
            ("step", [b.step_s for b in batches]),
        ):
            unit = 1.0 if name == "queue_depth" else 1e3
            suffix = "" if name == "queue_depth" else "_ms"
            for key, value in _describe(values).items():
                if key == "total" and name == "queue_depth":
                    continue
                out[f"{name}_{key}{suffix}"] = value * unit
        elapsed = self.elapsed_s
        total_wait = sum(c.wait_s for c in chunks)
        total_bytes = sum(c.nbytes for c in chunks)
        out["elapsed_s"] = elapsed
        out["stall_fraction"] = total_wait / elapsed if elapsed > 0 else 0.0
        out["chunks_per_s"] = len(chunks) / elapsed if elapsed > 0 else 0.0
        out["gb_per_s"] = total_bytes / elapsed / 1e9 if elapsed > 0 else 0.0
        out["bytes"] = float(total_bytes)
        out["queue_empty_count"] = float(sum(1 for c in chunks if c.queue_depth == 0))
        return out
