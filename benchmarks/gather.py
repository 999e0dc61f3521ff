"""The host gather against memcpy and ``index_select``, at two geometries, in one run.

    python -m benchmarks.gather                  # both geometries, 3 rounds of 3 s per arm
    python -m benchmarks.gather --geometry small --rounds 5 --seconds 2
    python -m benchmarks.gather --quick          # CI-sized sources, 1 round

Geometries (float32, an in-memory source):

* ``small``: 262,144 x 1,024 source, batches of 256 windows of 64 steps (64 MiB);
* ``zap``: a ZAPBench-like 4,096 x 71,721 source, batches of 32 windows of 100
  steps (918 MB).

Arms, each moving the same bytes per batch into a reused output:

* ``memcpy``: the batch's bytes copied from one contiguous stretch of the source
  (a numpy array, on transparent huge pages as numpy asks for them) into a numpy
  array by ``threads`` plain threads (one contiguous part each): the bound;
* ``memcpy_arena``: the same, from the tier's own storage into a page-aligned
  arena like a batch slot (both on 4 KiB pages): the same copy over the memory
  the tier gathers from and into;
* ``index_select``: ``torch.index_select`` over an ``unfold`` view, ``out=`` a
  reused batch, torch's intra-op pool at ``threads``;
* ``tier``: the host tier alone (``HostTier.batches`` over its own storage, the
  page-aligned arena ``HostTier.store`` makes, holding the source; runs of 64
  batches, 2 ahead, on a loader's batch readers): the library's hot path, what
  the >= 0.8x memcpy target is about;
* ``stream``: ``BatchStream(loader, buffer="host", mix=1)`` over a CPU
  ``ChunkLoader(NumpySource)`` end to end (the loader's reads included: one chunk
  of ``batches_per_chunk`` batches' bytes).

``threads`` is the default count of batch readers (this rank's share of the cores,
at most 4), so memcpy and ``index_select`` use as many threads as the tier.
Rounds alternate the arms' order, so load on a shared machine hits them alike;
reported: each arm's median GB/s of batch bytes, and the median of its per-round
ratios to each memcpy arm (with the rounds' ratios).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

import chunkstream as cs
from chunkstream.consumer._shuffle import HostTier

# The tier is private: the benchmark measures the hot path without the loader's reads.
from chunkstream.pipeline._lane import BatchLane, Request, default_gather_threads


@dataclass(frozen=True)
class Geo:
    name: str
    rows: int
    width: int
    window: int
    batch: int
    chunk: int  # the stream arm's chunk_size

    @property
    def batch_bytes(self) -> int:
        return self.batch * self.window * self.width * 4


GEOS = {
    "small": Geo("small", 262_144, 1_024, 64, 256, 16_384),
    "zap": Geo("zap", 4_096, 71_721, 100, 32, 1_024),
}
QUICK = {
    "small": Geo("small", 32_768, 1_024, 64, 256, 16_384),
    "zap": Geo("zap", 1_024, 71_721, 100, 8, 256),
}


def _starts(geo: Geo, generator: np.random.Generator) -> list[int]:
    return generator.integers(0, geo.rows - geo.window + 1, geo.batch).tolist()


def _memcpy(data: np.ndarray, geo: Geo, threads: int, seconds: float) -> tuple[int, float]:
    return _copy(data, np.empty(geo.batch_bytes // 4, dtype=np.float32), geo, threads, seconds)


def _memcpy_arena(data: np.ndarray, geo: Geo, threads: int, seconds: float) -> tuple[int, float]:
    source = cs.NumpySource({"x": data[: geo.chunk]})
    with cs.ChunkLoader(source, geo.chunk, device="cpu", seed=0) as loader:
        tier = _host_tier(loader, geo, threads)
        storage = _tier_storage(tier, data)["x"].numpy()
        slot = tier.store({"x": torch.from_numpy(data[:1])}, geo.batch * geo.window)["x"].numpy()
    return _copy(storage, slot.reshape(-1), geo, threads, seconds)


def _copy(
    data: np.ndarray, out: np.ndarray, geo: Geo, threads: int, seconds: float
) -> tuple[int, float]:
    flat = data.reshape(-1)
    n = out.size
    bounds = np.linspace(0, n, threads + 1).astype(np.int64)
    rng = np.random.default_rng(1)

    def part(k: int, at: int) -> None:
        lo, hi = bounds[k], bounds[k + 1]
        out[lo:hi] = flat[at + lo : at + hi]

    with ThreadPoolExecutor(threads, thread_name_prefix="bench-memcpy") as pool:

        def one() -> None:
            at = int(rng.integers(0, flat.size - n + 1))
            for f in [pool.submit(part, k, at) for k in range(threads)]:
                f.result()

        return _timed(one, seconds)


def _index_select(data: np.ndarray, geo: Geo, threads: int, seconds: float) -> tuple[int, float]:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        windows = torch.from_numpy(data).unfold(0, geo.window, 1).movedim(-1, 1)
        out = torch.empty((geo.batch, geo.window, geo.width), dtype=torch.float32)
        rng = np.random.default_rng(2)

        def one() -> None:
            torch.index_select(windows, 0, torch.tensor(_starts(geo, rng)), out=out)

        return _timed(one, seconds)
    finally:
        torch.set_num_threads(before)


_RUN = 64  # requests per batch run (an event's batches in BatchStream)


def _requests(geo: Geo, rng: np.random.Generator) -> list[Request]:
    return [Request(torch.tensor(_starts(geo, rng)), None) for _ in range(_RUN)]


def _host_tier(loader: cs.ChunkLoader, geo: Geo, threads: int) -> HostTier:
    lane = BatchLane(
        loader,
        ("x",),
        window=geo.window,
        batch_size=geo.batch,
        device=torch.device("cpu"),
        depth=2,
        threads=threads,
    )
    return HostTier(lane)


def _tier_storage(tier: HostTier, data: np.ndarray) -> dict[str, torch.Tensor]:
    """The tier's own storage, as in BatchStream (a page-aligned arena), holding ``data``."""
    storage = tier.store({"x": torch.from_numpy(data[:1])}, len(data))
    tier.copy_rows(storage["x"], torch.from_numpy(data))
    return storage


def _tier(data: np.ndarray, geo: Geo, threads: int, seconds: float) -> tuple[int, float]:
    source = cs.NumpySource({"x": data[: geo.chunk]})  # the loader lends its executors
    with cs.ChunkLoader(source, geo.chunk, device="cpu", seed=0) as loader:
        tier = _host_tier(loader, geo, threads)
        storage = _tier_storage(tier, data)
        rng = np.random.default_rng(3)

        def forever():
            while True:
                yield from tier.batches(storage, _requests(geo, rng))

        batches = forever()
        try:
            return _timed(lambda: next(batches), seconds)
        finally:
            batches.close()


def _stream(data: np.ndarray, geo: Geo, threads: int, seconds: float) -> tuple[int, float]:
    per_chunk = max(1, geo.chunk // geo.batch)
    with cs.ChunkLoader(cs.NumpySource({"x": data}), geo.chunk, device="cpu", seed=0) as loader:
        # Older trees (run with PYTHONPATH against this harness) predate StreamOptions.
        options = {"gather_threads": threads}
        if hasattr(cs, "StreamOptions"):
            options = {"options": cs.StreamOptions(**options)}
        stream = cs.BatchStream(loader, window=geo.window, batch_size=geo.batch,
                                batches_per_chunk=per_chunk, fields="x", buffer="host", mix=1,
                                **options)  # fmt: skip

        def forever():
            while True:
                yield from stream

        batches = forever()
        try:
            return _timed(lambda: next(batches), seconds)
        finally:
            batches.close()


ARMS = {
    "memcpy": _memcpy,
    "memcpy_arena": _memcpy_arena,
    "index_select": _index_select,
    "tier": _tier,
    "stream": _stream,
}


def _timed(one, seconds: float) -> tuple[int, float]:
    for _ in range(3):  # warm up: pages faulted in, slots and pools made
        one()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or n < 3:
        one()
        n += 1
    return n, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--geometry", default="small,zap")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    seconds = args.seconds or (1.0 if args.quick else 3.0)
    arms = args.arms.split(",")
    threads = default_gather_threads()
    print(f"threads {threads}; {rounds} rounds of {seconds:g} s per arm; "
          f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}", flush=True)  # fmt: skip
    misses = 0
    for name in args.geometry.split(","):
        geo = (QUICK if args.quick else GEOS)[name]
        data = np.random.default_rng(0).standard_normal((geo.rows, geo.width), dtype=np.float32)
        print(f"\n{name}: source {geo.rows:,} x {geo.width:,} float32, batch {geo.batch} x "
              f"{geo.window} ({geo.batch_bytes / 1e6:.0f} MB)", flush=True)  # fmt: skip
        got: dict[str, list[float]] = {a: [] for a in arms}
        for r in range(rounds):
            for arm in arms if r % 2 == 0 else arms[::-1]:
                n, wall = ARMS[arm](data, geo, threads, seconds)
                got[arm].append(n * geo.batch_bytes / wall / 1e9)
                print(f"  round {r} {arm:12}: {got[arm][-1]:6.2f} GB/s ({n} batches)", flush=True)
        for arm in arms:
            med = statistics.median(got[arm])
            line = f"  {arm:12} median {med:6.2f} GB/s"
            for base in ("memcpy", "memcpy_arena"):
                if base in got and arm not in ("memcpy", "memcpy_arena"):
                    ratios = [a / b for a, b in zip(got[arm], got[base], strict=True)]
                    ratio = statistics.median(ratios)
                    line += f"; {ratio:.2f}x {base} (rounds: "
                    line += ", ".join(f"{x:.2f}" for x in ratios) + ")"
                    if arm == "tier" and base == "memcpy" and ratio < 0.8:
                        misses += 1
            print(line, flush=True)
        del data
    print(f"\nload after: {os.getloadavg()[0]:.2f}")
    print(("MISS" if misses else "met ") + "  host tier >= 0.8x memcpy at every geometry")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
