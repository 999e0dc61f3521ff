"""Overlap, stall, abandon/restart and RSS of a ChunkLoader with a sleeping consumer.

The consumer "trains" by sleeping ``train_s`` per chunk, which costs no CPU, so
the readers keep both cores. The exact pipeline bound of an epoch of ``n``
chunks is ``first_read + n * max(read, train)`` (DESIGN "What fast means"),
with ``read`` the loader's steady per-chunk interval measured just before with
no consumer work, and ``first_read`` the wait for the first chunk.
"""

from __future__ import annotations

import time

import psutil

import chunkstream as cs

__all__ = ["abandon_cost", "epoch_with_sleep", "read_interval", "rss_over_epochs"]


def read_interval(loader: cs.ChunkLoader, n: int) -> dict:
    """Steady seconds per chunk (after the first) and the first chunk's wait, consumer idle."""
    begin = time.perf_counter()
    times = []
    for chunk in loader.epoch(n):
        times.append(time.perf_counter())
        del chunk
    first = times[0] - begin
    steady = (times[-1] - times[0]) / max(1, n - 1)
    return {"first_s": first, "interval_s": steady}


def epoch_with_sleep(
    loader: cs.ChunkLoader, n: int, train_s: float, first_s: float, read_s: float
) -> dict:
    """One epoch with a sleeping consumer; its time over the exact bound and waits after the first."""
    loader.stats.reset()
    begin = time.perf_counter()
    for chunk in loader.epoch(n):
        del chunk
        time.sleep(train_s)
    elapsed = time.perf_counter() - begin
    records = loader.stats.chunks
    first = records[0].wait_s if records else first_s
    bound = first + n * max(read_s, train_s)
    waits = sorted(r.wait_s for r in records[1:])
    # The bound for the reads this run actually had: chunk i is ready when its read
    # ended; an ideal consumer starts training on it at max(ready_i, end of i - 1).
    finish = 0.0
    for record in records:
        finish = max(record.read_end - begin, finish) + train_s
    return {
        "elapsed_s": elapsed,
        "bound_s": bound,
        "ratio": elapsed / bound,
        "bound_own_reads_s": finish,
        "ratio_own_reads": elapsed / finish if finish else 0.0,
        "first_wait_s": first,
        "wait_after_first_median_s": waits[len(waits) // 2] if waits else 0.0,
        "wait_after_first_max_s": waits[-1] if waits else 0.0,
    }


def abandon_cost(loader: cs.ChunkLoader, repeats: int, n: int = 50) -> dict:
    """Seconds of the ``epoch()`` call that abandons a running epoch and starts the next,
    and the wait for the new epoch's first chunk (a read, for comparison)."""
    calls, firsts = [], []
    it = loader.epoch(n)
    next(it)
    for _ in range(repeats):
        time.sleep(0.05)  # let the readers fill the queue: the abandon has work to discard
        begin = time.perf_counter()
        it = loader.epoch(n)
        calls.append(time.perf_counter() - begin)
        chunk = next(it)
        firsts.append(time.perf_counter() - begin)
        del chunk
    return {"call_s": calls, "first_chunk_s": firsts}


def rss_over_epochs(loader: cs.ChunkLoader, epochs: int, n: int = 10) -> dict:
    """RSS after each of ``epochs`` epochs abandoned after one chunk; growth after the 20th."""
    proc = psutil.Process()
    rss = []
    for _ in range(epochs):
        it = loader.epoch(n)
        chunk = next(it)
        del chunk
        rss.append(proc.memory_info().rss)
    base = rss[min(19, len(rss) - 1)]
    after = rss[20:] or rss[-1:]
    return {
        "rss_bytes": rss,
        "rss_at_20": base,
        "rss_max_after_20": max(after),
        "growth": (max(after) - base) / base,
    }
