"""Latency records: what each chunk cost the consumer, and what each batch cost the model.

The loader fills the per-chunk part itself (:meth:`LatencyStats.record_chunk`):
the consumer's wait, the read time measured in the reader thread, the transfer
time (CUDA events, resolved lazily once the copy is known to be done, so
recording never blocks), the queue depth when the consumer asked, and bytes.
Batches are timed by the training loop (:meth:`LatencyStats.batch_timer`): on
CUDA with events recorded on the current stream and read back only once they
have completed, on CPU with ``perf_counter`` (there the work is synchronous).

Summaries: mean/p50/p95/max/min/total in ms per quantity, the stall fraction
(consumer wait over the time spent inside epochs) and throughput (chunks/s and
GB/s of delivered windows over the same time). :meth:`LatencyStats.print_summary`
prints them as a table, :meth:`LatencyStats.log_to` writes TensorBoard scalars,
:func:`chunkstream.stats.plot_timeline` draws the per-chunk lanes and
:meth:`LatencyStats.export_trace` writes them as a Chrome/Perfetto trace.

A remote source's node-local cache (``ZarrSource(url, cache=DIR)``) adds its
counters: ``cache_hits``, ``cache_misses``, ``cache_fetched_bytes`` and
``cache_evicted_bytes`` in the summary (counted since the loader was made or the
stats reset), a line of the table, and TensorBoard scalars.

Thread-safety: records are appended under a lock; summaries copy them first.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._text import format_bytes, format_table
from ._timer import BatchTimer
from ._trace import READ, profiled, write_trace

__all__ = ["BatchRecord", "ChunkRecord", "LatencyStats", "Trip"]


@dataclass
class Trip:
    """One window's way through the pipeline, stamped by the jobs that do its work: the
    stats hook, so the data they hand on (buffers, tensors, events) carries no timings.
    The loader turns it into the chunk's :class:`ChunkRecord`. Each field is written by
    one thread before the future that follows it completes, and read after."""

    read_begin: float = 0.0  # perf_counter when the read started / ended
    read_end: float = 0.0
    read_thread: str | None = None  # the thread that read it and the one that copied it
    transfer_begin: float | None = None  # when the copy (or gather) was issued
    transfer_thread: str | None = None

    def read_done(self, begin: float) -> None:
        """The read began at ``begin`` and ends now, in this thread."""
        self.read_begin, self.read_end = begin, time.perf_counter()
        self.read_thread = threading.current_thread().name

    @contextmanager
    def reading(self, window: tuple[int, int]) -> Iterator[None]:
        """Around a read of ``window``: a profiler range, and its span stamped if it ends
        without an error."""
        begin = time.perf_counter()
        with profiled(READ, window):
            yield
        self.read_done(begin)

    def transfer_issued(self, at: float | None = None) -> None:
        """The transfer is issued now (or at ``at``), from this thread."""
        self.transfer_begin = time.perf_counter() if at is None else at
        self.transfer_thread = threading.current_thread().name


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
    compute_end: float | None = None  # when the consumer asked for the next chunk (timeline)
    read_thread: str | None = None  # the thread that read it and the one that copied it
    transfer_thread: str | None = None  # (trace tracks; None where unknown)
    _events: Any = field(default=None, repr=False)  # (start, end) CUDA events, unresolved


@dataclass
class BatchRecord:
    """One timed batch: seconds in forward, backward and optimizer step."""

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


def _completed(events: tuple) -> bool:
    """Whether every event has completed (``elapsed_time`` raises on one that has not).

    Each event is queried, not only the last: events complete in order only on
    one stream, and a batch's marks follow the current stream, which the loop
    may switch between marks. ``query()`` has no device guard in torch, so it
    runs under the event's own device (no context on another GPU).
    """
    for event in events:
        device = getattr(event, "device", None)
        if isinstance(device, torch.device) and device.type == "cuda":
            with torch.cuda.device(device):
                done = event.query()
        else:
            done = event.query()
        if not done:
            return False
    return True


class LatencyStats:
    """Per-chunk and per-batch latency records with summaries (see module docs)."""

    def __init__(self) -> None:
        # Reentrant: the loader's close() stops the epoch clock, also from a signal handler
        # that interrupted this thread inside a record (each method leaves whole records).
        self._lock = threading.RLock()
        self.chunks: list[ChunkRecord] = []
        self.batches: list[BatchRecord] = []
        self._epoch_begin: float | None = None
        self._elapsed = 0.0  # seconds inside epochs, closed spans only
        self._pending_batches: list[tuple[float, tuple]] = []  # CUDA events not yet read
        # the sources' caches' CacheCounters, and their summed values at reset
        self._cache: tuple[Any, ...] = ()
        self._cache_base: dict[str, int] = {}

    # -- recording -----------------------------------------------------------------

    def record_chunk(self, record: ChunkRecord, *, events: tuple | None = None) -> None:
        """Append ``record``; it closes the previous chunk's compute span in the same epoch.

        ``events`` are the ``(begin, end)`` CUDA events around the chunk's copy; its
        ``transfer_s`` is read from them once they have completed.
        """
        if events is not None:
            record._events = events
        with self._lock:
            if self.chunks:
                previous = self.chunks[-1]
                if previous.compute_end is None and previous.epoch == record.epoch:
                    previous.compute_end = record.received - record.wait_s
            self.chunks.append(record)

    def record_batch(
        self, forward_s: float, backward_s: float, step_s: float, begin: float = 0.0
    ) -> None:
        """Append one batch's phase times (seconds)."""
        with self._lock:
            self.batches.append(BatchRecord(forward_s, backward_s, step_s, begin))

    def batch_timer(
        self, device: str | torch.device | None = "cpu", *, every: int = 1
    ) -> BatchTimer:
        """A timer for every ``every``-th batch of a training loop on ``device``::

            timer = stats.batch_timer(device, every=10)
            for ...:
                with timer.batch() as b:
                    loss = model(x); b.mark("forward")
                    loss.backward(); b.mark("backward")
                    opt.step()                        # leaving the block marks "step"

        On CUDA the marks are events on the current stream, resolved lazily (by
        :meth:`summary` or :meth:`resolve_pending`) once they have completed, so
        timing never blocks the host. Elsewhere marks read ``perf_counter``.
        """
        return BatchTimer(self, device, every=every)

    def record_batch_events(self, begin: float, events: tuple) -> None:
        """Add a batch timed by CUDA events ``(start, forward, backward, end)``; its phase
        times are read once every event has completed (:meth:`resolve_pending`)."""
        with self._lock:
            self._pending_batches.append((begin, events))

    def epoch_started(self) -> None:
        """Start the epoch clock (the loader calls it; ``elapsed_s`` counts time inside epochs)."""
        with self._lock:
            self._epoch_begin = time.perf_counter()

    def epoch_ended(self) -> None:
        """Stop the epoch clock; idempotent (the loader calls it)."""
        with self._lock:
            now = time.perf_counter()
            if self._epoch_begin is not None:
                self._elapsed += now - self._epoch_begin
                self._epoch_begin = None
            if self.chunks and self.chunks[-1].compute_end is None:
                self.chunks[-1].compute_end = now

    def watch_cache(self, *counters: Any) -> None:
        """Report node-local caches' ``CacheCounters`` (hits, misses, bytes fetched and
        evicted), summed (one per remote recording of a ``cs.Recordings``), from now
        on, in :meth:`summary`, the table and TensorBoard."""
        with self._lock:
            self._cache, self._cache_base = counters, _summed(counters)

    def reset(self) -> None:
        """Forget every record and the elapsed time."""
        with self._lock:
            self._cache_base = _summed(self._cache)
            self.chunks.clear()
            self.batches.clear()
            self._pending_batches.clear()
            self._elapsed = 0.0
            self._epoch_begin = None

    def resolve_transfers(self) -> None:
        """Turn finished CUDA event pairs into ``transfer_s``; never waits for a copy."""
        with self._lock:
            pending = [r for r in self.chunks if r._events is not None]
        for record in pending:
            begin, end = record._events
            if _completed((begin, end)):
                record.transfer_s = begin.elapsed_time(end) / 1e3
                if record.transfer_begin is not None:
                    record.transfer_end = record.transfer_begin + record.transfer_s
                record._events = None

    def resolve_pending(self) -> None:
        """Read every CUDA event that has completed (transfers and batches); never waits."""
        self.resolve_transfers()
        with self._lock:
            pending, self._pending_batches = self._pending_batches, []
        keep = []
        for begin, events in pending:
            if _completed(events):
                start, fwd, bwd, step = events
                times = (start.elapsed_time(fwd), fwd.elapsed_time(bwd), bwd.elapsed_time(step))
                self.record_batch(*(t / 1e3 for t in times), begin=begin)
            else:
                keep.append((begin, events))
        with self._lock:
            self._pending_batches[:0] = keep

    @property
    def pending_batches(self) -> int:
        """Timed batches whose CUDA events have not completed yet."""
        with self._lock:
            return len(self._pending_batches)

    # -- summaries -----------------------------------------------------------------

    @property
    def elapsed_s(self) -> float:
        """Seconds spent inside epochs (including a running one)."""
        with self._lock:
            running = 0.0 if self._epoch_begin is None else time.perf_counter() - self._epoch_begin
            return self._elapsed + running

    def summary(self) -> dict[str, float]:
        """Flat dict of figures: waits, reads, transfers, batches, stall fraction, throughput.

        Keys are ``<quantity>_<mean|p50|p95|max|min|total>_ms`` for ``wait``,
        ``wait_after_first``, ``read``, ``transfer``, ``forward``, ``backward``
        and ``step`` (``queue_depth_*`` without unit), plus ``num_chunks``,
        ``num_batches``, ``elapsed_s``, ``stall_fraction``,
        ``stall_fraction_after_first``, ``chunks_per_s``, ``gb_per_s``, ``bytes``
        and ``queue_empty_count``, and with a watched cache ``cache_hits``,
        ``cache_misses``, ``cache_fetched_bytes`` and ``cache_evicted_bytes``.
        Empty quantities are 0.0.
        """
        self.resolve_pending()
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
        later_wait = sum(c.wait_s for c in chunks if c.index > 0)
        out["stall_fraction_after_first"] = later_wait / elapsed if elapsed > 0 else 0.0
        out["chunks_per_s"] = len(chunks) / elapsed if elapsed > 0 else 0.0
        out["gb_per_s"] = total_bytes / elapsed / 1e9 if elapsed > 0 else 0.0
        out["bytes"] = float(total_bytes)
        out["queue_empty_count"] = float(sum(1 for c in chunks if c.queue_depth == 0))
        with self._lock:
            cache, base = self._cache, self._cache_base
        if cache:
            now = _summed(cache)
            for name in _CACHE_COUNTERS:
                out[f"cache_{name}"] = float(now[name] - base[name])
        return out

    # -- reporting -----------------------------------------------------------------

    def format_summary(self) -> str:
        """The summary as a readable table (what :meth:`print_summary` prints)."""
        s = self.summary()
        table = [("", "mean", "p50", "p95", "max", "(ms)")]
        for name, label in _TABLE_ROWS:
            if name in ("transfer",) and not any(c.transfer_s is not None for c in self.chunks):
                continue
            stats = ("mean", "p50", "p95", "max")
            table.append((label, *(f"{s[f'{name}_{k}_ms']:.2f}" for k in stats)))
        rows = format_table(table, align="<>>>>", indent="")
        rows.append(
            f"chunks {int(s['num_chunks'])}, batches timed {int(s['num_batches'])}, "
            f"{s['elapsed_s']:.2f} s in epochs; stall {100 * s['stall_fraction']:.1f}% "
            f"({100 * s['stall_fraction_after_first']:.1f}% after each epoch's first chunk); "
            f"{s['chunks_per_s']:.2f} chunks/s, {s['gb_per_s']:.3f} GB/s; "
            f"queue empty {int(s['queue_empty_count'])}x"
        )
        if "cache_hits" in s:
            hits, misses = int(s["cache_hits"]), int(s["cache_misses"])
            rate = 100 * hits / (hits + misses) if hits + misses else 0.0
            rows.append(
                f"cache: {hits} hits, {misses} misses ({rate:.0f}% hits); "
                f"{format_bytes(s['cache_fetched_bytes'])} fetched, "
                f"{format_bytes(s['cache_evicted_bytes'])} evicted"
            )
        return "\n".join(rows)

    def print_summary(self, file: Any = None) -> None:
        """Print :meth:`format_summary` (an explicit user call, so it prints)."""
        print(self.format_summary(), file=file)

    def export_trace(self, path: str | os.PathLike) -> Path:
        """Write every chunk's read, copy and wait spans as Chrome/Perfetto trace JSON.

        One track per reader thread, one per transfer thread and one for the
        consumer; one complete event per chunk and stage (see
        :mod:`chunkstream.stats._trace`). A CUDA copy whose events have not
        completed yet has no event: call ``torch.cuda.synchronize()`` first to
        include every copy. Returns the path written.
        """
        self.resolve_transfers()
        with self._lock:
            records = list(self.chunks)
        return write_trace(records, path)

    def log_to(self, writer: Any, step: int, prefix: str = "latency/") -> None:
        """Write the summary's main figures as scalars to a TensorBoard ``SummaryWriter``."""
        s = self.summary()
        for key in _LOGGED:
            writer.add_scalar(f"{prefix}{key}", s[key], step)
        for name in _CACHE_COUNTERS if "cache_hits" in s else ():
            writer.add_scalar(f"{prefix}cache_{name}", s[f"cache_{name}"], step)


_TABLE_ROWS = (
    ("wait", "consumer wait"),
    ("wait_after_first", "  after first"),
    ("read", "read"),
    ("transfer", "transfer"),
    ("forward", "forward"),
    ("backward", "backward"),
    ("step", "step"),
)
_CACHE_COUNTERS = ("hits", "misses", "fetched_bytes", "evicted_bytes")


def _summed(counters: tuple[Any, ...]) -> dict[str, int]:
    """The caches' counters added up (each read once, under its own lock)."""
    snapshots = [c.snapshot() for c in counters]
    return {name: sum(getattr(s, name) for s in snapshots) for name in _CACHE_COUNTERS}


_LOGGED = (
    "wait_mean_ms",
    "wait_p95_ms",
    "wait_max_ms",
    "read_mean_ms",
    "transfer_mean_ms",
    "forward_mean_ms",
    "backward_mean_ms",
    "step_mean_ms",
    "queue_depth_mean",
    "stall_fraction",
    "chunks_per_s",
    "gb_per_s",
)
