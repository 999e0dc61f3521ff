"""Three stores as one (``cs.Recordings``) against one store of the same total size.

    python -m benchmarks.recordings_speed                 # T=131072 x 256, 6 rounds of 4 s
    python -m benchmarks.recordings_speed --quick         # T=32768 x 128, 2 rounds of 2 s

Issue 44 asks that streaming three stores as one costs no more than one store of
the same total size: >= 0.9x its batches/s. Both arms are real zarr v3 stores
(blosc-zstd, stored time chunk 1024) holding the same rows: one store of ``T``
timesteps, and three stores of 25%, 35% and 40% of them; each arm streams with
the library's defaults (``ChunkLoader(src, chunk_size, device="cpu")``,
``BatchStream(loader, window=W, batch_size=B, ...)``), the three-store arm with
every window inside one recording. Two figures per arm: batches/s of the
``BatchStream`` (what a training loop sees) and chunks/s of the loader alone
(reads and decodes, where a cost of several stores would show first), each with
the process's CPU time per batch or chunk (all threads: on a shared machine the
one figure the other jobs' load does not move much). The arms
take turns within a round, the order alternating, in one process; reported: each
round's figures, and the median of the per-round ratios with their range.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import chunkstream as cs
from chunkstream import flyvis

WINDOW, BATCH = 32, 64


def _cpu_s() -> float:
    """CPU seconds of this process, every thread (user + system)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def write_stores(root: Path, t: int, n: int) -> tuple[str, list[str]]:
    """One store of ``t`` rows and three of 25/35/40% of the same rows."""
    data = np.random.default_rng(0).standard_normal((t, n), dtype=np.float32)
    one = root / "one.zarr"
    flyvis.write_array(one, data, (1024, n), zarr_format=3, codec="blosc-zstd")
    cuts = [0, t // 4, t // 4 + (t * 35) // 100, t]
    parts = []
    for i in range(3):
        path = root / f"part{i}.zarr"
        flyvis.write_array(
            path, data[cuts[i] : cuts[i + 1]], (1024, n), zarr_format=3, codec="blosc-zstd"
        )
        parts.append(str(path))
    return str(one), parts


def open_arm(arm: str, one: str, parts: list[str]) -> cs.Source:
    if arm == "one":
        return cs.ZarrSource(one)
    return cs.Recordings([cs.ZarrSource(p) for p in parts], names=["p0", "p1", "p2"])


def batches_per_s(source: cs.Source, chunk: int, seconds: float) -> tuple[float, float]:
    """Batches/s and CPU ms per batch."""
    with cs.ChunkLoader(source, chunk, device="cpu", seed=0) as loader:
        stream = cs.BatchStream(
            loader,
            window=WINDOW,
            batch_size=BATCH,
            fields="data",
            options=cs.StreamOptions(chunks_per_epoch=100_000),
            batches_per_chunk=chunk // BATCH,
        )
        it = iter(stream)
        for _ in range(4):  # warm-up: the buffer filled, slots made
            next(it)
        n, t0, c0 = 0, time.perf_counter(), _cpu_s()
        while time.perf_counter() - t0 < seconds:
            next(it)
            n += 1
        return n / (time.perf_counter() - t0), 1e3 * (_cpu_s() - c0) / max(1, n)


def chunks_per_s(source: cs.Source, chunk: int, seconds: float) -> tuple[float, float]:
    """The loader alone: chunks/s and CPU ms per chunk."""
    with cs.ChunkLoader(source, chunk, device="cpu", seed=1) as loader:
        it = iter(loader.epoch(100_000))
        next(it)
        n, t0, c0 = 0, time.perf_counter(), _cpu_s()
        while time.perf_counter() - t0 < seconds:
            next(it)
            n += 1
        return n / (time.perf_counter() - t0), 1e3 * (_cpu_s() - c0) / max(1, n)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=None)
    args = ap.parse_args(argv)
    t, n, chunk = (32768, 128, 4096) if args.quick else (131072, 256, 16384)
    rounds = args.rounds or (2 if args.quick else 6)
    seconds = args.seconds or (2.0 if args.quick else 4.0)
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    print(
        f"T={t:,} x {n} float32 ({t * n * 4 / 1e6:.0f} MB), blosc-zstd, time chunk 1024; "
        f"chunk_size={chunk:,}, window {WINDOW}, batch {BATCH}; {seconds:g} s per arm, "
        f"{rounds} rounds",
        flush=True,
    )
    ratios: dict[str, list[float]] = {"batches": [], "chunks": [], "cpu/batch": [], "cpu/chunk": []}
    with tempfile.TemporaryDirectory() as tmp:
        one, parts = write_stores(Path(tmp), t, n)
        for r in range(rounds):
            order = ("one", "three") if r % 2 == 0 else ("three", "one")
            got: dict[tuple[str, str], float] = {}
            for arm in order:
                with open_arm(arm, one, parts) as src:
                    got[arm, "batches"], got[arm, "cpu/batch"] = batches_per_s(src, chunk, seconds)
                with open_arm(arm, one, parts) as src:
                    got[arm, "chunks"], got[arm, "cpu/chunk"] = chunks_per_s(src, chunk, seconds)
            for what in ratios:
                ratios[what].append(got["three", what] / got["one", what])
            print(
                f"  round {r}: one store {got['one', 'batches']:7.1f} batches/s "
                f"{got['one', 'chunks']:6.1f} chunks/s | three stores "
                f"{got['three', 'batches']:7.1f} batches/s {got['three', 'chunks']:6.1f} "
                f"chunks/s | ratio {ratios['batches'][-1]:.3f} batches, "
                f"{ratios['chunks'][-1]:.3f} chunks; CPU ms one/three: "
                f"{got['one', 'cpu/batch']:.2f}/{got['three', 'cpu/batch']:.2f} per batch, "
                f"{got['one', 'cpu/chunk']:.1f}/{got['three', 'cpu/chunk']:.1f} per chunk",
                flush=True,
            )
    for what, values in ratios.items():
        unit = " CPU ms" if what.startswith("cpu") else "/s"
        print(
            f"three stores / one store, {what}{unit}: median {statistics.median(values):.3f} "
            f"(range {min(values):.3f}-{max(values):.3f}, {len(values)} rounds)"
        )
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
