"""A new loader's first epoch against its steady state, and its time to the first chunk.

Each run builds a fresh loader (timed: construction), takes its first epoch of
``chunks`` chunks (timed: the first chunk's arrival after construction, and the
delivered GB/s from the first chunk on), then one more epoch of the same length
(the steady state). The host arena is measured on 4 KiB pages (the default)
and on transparent huge pages (``chunkstream._memory._arena.HUGEPAGES``), the
two kinds alternating run by run so that load drifting on a shared machine hits
both alike.
"""

from __future__ import annotations

import statistics
import time

import chunkstream as cs
from chunkstream._memory import _arena

from ._measure import open_source
from ._stores import Geometry, StoreSpec

__all__ = ["first_epoch"]


def _epoch(loader: cs.ChunkLoader, n: int, nbytes: int, since: float) -> tuple[float, float]:
    """(seconds from ``since`` to the first chunk, delivered GB/s from the first chunk on)."""
    times = []
    for chunk in loader.epoch(n):
        times.append(time.perf_counter())
        del chunk
    return times[0] - since, (len(times) - 1) * nbytes / (times[-1] - times[0]) / 1e9


def _one(spec: StoreSpec, geo: Geometry, chunks: int, seed: int) -> dict:
    src = open_source(spec, geo)
    try:
        begin = time.perf_counter()
        loader = cs.ChunkLoader(src, geo.chunk_size, device="cpu", sampling="random", seed=seed)
        built = time.perf_counter()
        with loader:
            first_s, first = _epoch(loader, chunks, geo.window_nbytes, built)
            _, steady = _epoch(loader, chunks, geo.window_nbytes, time.perf_counter())
            reads = [r.read_s for r in loader.stats.chunks if r.epoch == 1]
        return {"construct_s": built - begin, "first_chunk_s": first_s, "first_gbps": first,
                "steady_gbps": steady, "steady_read_s": statistics.median(reads)}  # fmt: skip
    finally:
        src.close()


def first_epoch(spec: StoreSpec, geo: Geometry, *, chunks: int, runs: int) -> dict:
    """Per arena kind (``hugepages``, ``pages``): one dict per run (see :func:`_one`)."""
    out: dict = {}
    saved = getattr(_arena, "HUGEPAGES", None)  # None: a chunkstream without the arena
    try:
        for r in range(runs):
            for kind, huge in (("pages", False), ("hugepages", True)):
                _arena.HUGEPAGES = huge
                out.setdefault(kind, []).append(_one(spec, geo, chunks, seed=100 + r))
    finally:
        if saved is None:
            del _arena.HUGEPAGES
        else:
            _arena.HUGEPAGES = saved
    return out


def summary(runs: list[dict]) -> dict:
    """Medians: first/steady GB/s ratio, first chunk over a steady read, construction."""
    med = statistics.median
    return {
        "ratio": med(r["first_gbps"] / r["steady_gbps"] for r in runs),
        "first_chunk_reads": med(r["first_chunk_s"] / r["steady_read_s"] for r in runs),
        "construct_s": med(r["construct_s"] for r in runs),
        "first_chunk_s": med(r["first_chunk_s"] for r in runs),
    }
