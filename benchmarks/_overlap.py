"""Overlap, stall, abandon/restart and RSS of a ChunkLoader with a sleeping consumer.

The consumer "trains" by sleeping ``train_s`` per chunk, which costs no CPU, so
the readers keep both cores. The exact pipeline bound of an epoch of ``n``
chunks is ``first_read + n * max(read, train)`` (DESIGN "What fast means"),
with ``read`` the loader's steady per-chunk interval with no consumer work,
measured just before and just after the epoch and averaged, and ``first_read``
the epoch's wait for its first chunk.
"""

from __future__ import annotations

import time

import psutil

import chunkstream as cs

__all__ = [
    "abandon_cost",
    "against_bound",
    "epoch_with_sleep",
    "read_interval",
    "rss_over_epochs",
]


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


def epoch_with_sleep(loader: cs.ChunkLoader, n: int, train_s: float) -> dict:
    """One epoch of ``n`` chunks with a consumer sleeping ``train_s`` per chunk: its time,
    its first wait and its waits after the first (see :func:`against_bound` for the ratios)."""
    loader.stats.reset()
    begin = time.perf_counter()
    for chunk in loader.epoch(n):
        del chunk
        time.sleep(train_s)
    elapsed = time.perf_counter() - begin
    records = loader.stats.chunks
    waits = sorted(r.wait_s for r in records[1:])
    # The bound for the reads this run actually had: chunk i is ready when its read
    # ended; an ideal consumer starts training on it at max(ready_i, end of i - 1).
    finish = 0.0
    for record in records:
        finish = max(record.read_end - begin, finish) + train_s
    return {
        "chunks": n,
        "train_s": train_s,
        "elapsed_s": elapsed,
        "first_wait_s": records[0].wait_s,
        "bound_own_reads_s": finish,
        "ratio_own_reads": elapsed / finish if finish else 0.0,
        "wait_after_first_median_s": waits[len(waits) // 2] if waits else 0.0,
        "wait_after_first_max_s": waits[-1] if waits else 0.0,
    }


def against_bound(run: dict, before: dict, after: dict) -> dict:
    """``run`` (:func:`epoch_with_sleep`) over the bound ``first + n * max(read, train)``,
    ``read`` the mean of the steady intervals measured just before and just after it
    (``ratio``); ``ratio_before_only`` uses the interval before it alone."""
    n, train_s, elapsed = run["chunks"], run["train_s"], run["elapsed_s"]
    read_s = (before["interval_s"] + after["interval_s"]) / 2
    bound = run["first_wait_s"] + n * max(read_s, train_s)
    only_before = run["first_wait_s"] + n * max(before["interval_s"], train_s)
    return run | {
        "read_interval_s": read_s,
        "read_interval_before_s": before["interval_s"],
        "read_interval_after_s": after["interval_s"],
        "bound_s": bound,
        "ratio": elapsed / bound,
        "ratio_before_only": elapsed / only_before,
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
