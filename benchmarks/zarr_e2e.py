"""The defaults end to end over a zarr store at the race geometry, against memcpy, in one run.

    python -m benchmarks.zarr_e2e                       # 1 GiB store, 3 rounds of 5 s per arm
    python -m benchmarks.zarr_e2e --rounds 2 --seconds 3
    python -m benchmarks.zarr_e2e --quick               # a small store, 1 round: a smoke test

The store: zarr v3, float32, ``T x 1,024`` (``--timesteps``, default 262,144: 1 GiB),
chunks of 1,024 x 1,024, ``zstd`` (``ZstdCodec(level=3)``, which the fast path decodes;
``--codec blosc-zstd`` for the tests' codec), holding a smooth random walk per column
rounded to steps of 2**-10 (so zstd does some work, as on a recording: the compression
ratio is printed). It is written once by :func:`chunkstream.flyvis.write_array` under
``benchmarks/_data/`` (``--data``) and reused; its files are read once before timing, so
the page cache is warm. Batches are the race's: 256 windows of 64 steps x 1,024 float32
(64 MiB).

Arms, each run for ``--seconds`` per round, rounds alternating the arms' order (so load
on a shared machine hits them alike):

* ``memcpy``: one batch's bytes copied from a random place of an in-memory copy of the
  data by 2 plain threads (:func:`benchmarks.gather._copy`): the bound;
* ``stream``: the README's first example, exactly:
  ``cs.BatchStream(cs.ZarrSource(path), window=64, batch_size=256, device="cpu")``,
  built once before the first round (outside the timing), iterated across epochs, a
  few batches of warm-up; batches/s, GB/s of batch bytes and process CPU seconds per
  batch (``time.process_time``, every thread of the process);
* ``tier``: the host tier alone over in-memory storage at the same geometry
  (:func:`benchmarks.gather._tier`): the gather's own ceiling;
* ``decode``: the loader alone over the store, ``cs.ChunkLoader(cs.ZarrSource(path),
  chunk_size=<the stream's loader's>, device="cpu")``, epochs of chunks and no batches:
  GB/s decoded.

How to read the output: each round's figures, then per arm its median and the median of
its per-round ratios to ``memcpy`` (the rounds' ratios beside it). The breakdown then
splits the stream's median time per batch into what its parts need per batch, each from
the same run's medians: the gather (``1 / tier`` batches/s); the decode (the bytes the
stream's loader decodes per batch, one chunk over the plan's batches per chunk, at the
``decode`` arm's rate); the refill (the same bytes copied into the shuffle buffer at
``memcpy`` speed); and what is left (overheads and waits; negative where the parts
overlap on the cores). The stream's shuffle buffer (``BufferInfo.describe()``), its
chunk size and, per round, the chunks its loader handed over, how long the consumer
waited for them (the stall: wait over the arm's seconds) and how long each took to
read, come with it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import zarr

import chunkstream as cs
from benchmarks import gather
from chunkstream._text import format_bytes, format_table
from chunkstream.pipeline._lane import default_gather_threads

WIDTH, WINDOW, BATCH, STORED = 1_024, 64, 256, 1_024
TIMESTEPS, QUICK_TIMESTEPS = 262_144, 16_384
DATA = Path(__file__).resolve().parent / "_data"
ARMS = ("memcpy", "stream", "tier", "decode")
MEMCPY_THREADS = 2
QUANTUM = np.float32(2.0**-10)
WARMUP = 4  # batches (or chunks) taken before an arm's first timing


def _walk(timesteps: int, seed: int = 0) -> np.ndarray:
    """A smooth random walk per column, float32: steps of ~1e-2 around per-column levels,
    rounded to multiples of :data:`QUANTUM` (a recording's ADC steps: about 14 significant
    bits, where full float32 noise would leave zstd nothing to do)."""
    rng = np.random.default_rng(seed)
    out = np.empty((timesteps, WIDTH), dtype=np.float32)
    level = rng.standard_normal(WIDTH, dtype=np.float32)
    for lo in range(0, timesteps, 16_384):  # blocks, so no float64 copy of the whole array
        steps = rng.standard_normal((min(16_384, timesteps - lo), WIDTH), dtype=np.float32)
        np.cumsum(steps * np.float32(0.01), axis=0, out=out[lo : lo + len(steps)])
        out[lo : lo + len(steps)] += level
        level = out[lo + len(steps) - 1].copy()
    np.round(out / QUANTUM, out=out)
    out *= QUANTUM
    return out


def store(data_dir: Path, timesteps: int, codec: str) -> Path:
    """The store's path: written once (to a side path, renamed when whole), then reused."""
    path = data_dir / f"e2e-{codec}-q10-T{timesteps}-N{WIDTH}-c{STORED}.zarr"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        print(f"writing {path} ...", flush=True)
        cs.flyvis.write_array(partial, _walk(timesteps), (STORED, WIDTH), codec=codec)
        os.replace(partial, path)
    return path


def warm(path: Path) -> int:
    """Read every file of ``path`` once (the page cache then holds the store); its bytes."""
    total = 0
    for f in path.rglob("*"):
        if f.is_file():
            total += len(f.read_bytes())
    return total


def _timed(one: Callable[[], object], seconds: float) -> dict[str, float]:
    n, c0, t0 = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < seconds or n < 3:
        one()
        n += 1
    return {"n": n, "wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}


def _forever(make: Callable[[], Iterator]) -> Iterator:
    while True:
        yield from make()


class Bench:
    """The arms over one store, with the objects that live across rounds."""

    def __init__(self, path: Path, timesteps: int) -> None:
        self.path = path
        # The README's first example: the stream builds and owns its loader.
        self.stream = cs.BatchStream(cs.ZarrSource(str(path)), window=WINDOW, batch_size=BATCH,
                                     device="cpu")  # fmt: skip
        loader = self.stream.loader
        self.chunk_size = loader.config.chunk_size
        # the geometry of benchmarks.gather, with the stream's chunk for the tier's loader
        self.geo = gather.Geo("e2e", timesteps, WIDTH, WINDOW, BATCH, self.chunk_size)
        # After the stream sized its buffer, which counts what the process holds.
        self.data = np.asarray(zarr.open_array(str(path), mode="r")[...])
        self._batches = _forever(lambda: iter(self.stream))
        for _ in range(WARMUP):
            next(self._batches)
        self.decoder = cs.ChunkLoader(cs.ZarrSource(str(path)), self.chunk_size, device="cpu")
        self._chunks = _forever(lambda: self.decoder.epoch())
        for _ in range(WARMUP):
            next(self._chunks)
        self.threads = default_gather_threads()

    def close(self) -> None:
        self._batches.close()
        self._chunks.close()
        self.stream.close()
        self.decoder.close()

    def _tier(self, seconds: float) -> dict[str, float]:
        """``benchmarks.gather._tier``, its set-up outside the CPU clock too."""
        geo = self.geo
        source = cs.NumpySource({"x": self.data[: geo.chunk]})  # the loader lends its executors
        with cs.ChunkLoader(source, geo.chunk, device="cpu", seed=0) as loader:
            tier = gather._host_tier(loader, geo, self.threads)
            storage = gather._tier_storage(tier, self.data)
            rng = np.random.default_rng(3)
            batches = _forever(lambda: tier.batches(storage, gather._requests(geo, rng)))
            try:
                for _ in range(WARMUP):
                    next(batches)
                return _timed(lambda: next(batches), seconds)
            finally:
                batches.close()

    @property
    def batch_bytes(self) -> int:
        return self.geo.batch_bytes

    def run(self, arm: str, seconds: float) -> dict[str, float]:
        if arm == "memcpy":
            c0 = time.process_time()
            n, wall = gather._memcpy(self.data, self.geo, MEMCPY_THREADS, seconds)
            # gather's 3 warm-up copies ran on the same clock: their share taken out
            cpu = (time.process_time() - c0) * n / (n + 3)
            return {"n": n, "wall": wall, "cpu": cpu, "bytes": n * self.batch_bytes}
        if arm == "tier":
            out = self._tier(seconds)
            return {**out, "bytes": out["n"] * self.batch_bytes}
        if arm == "decode":
            out = _timed(lambda: next(self._chunks), seconds)
            return {**out, "bytes": out["n"] * self.decoder.chunk_bytes}
        stats = self.stream.loader.stats
        seen = len(stats.chunks)
        out = _timed(lambda: next(self._batches), seconds)
        chunks = stats.chunks[seen:]
        out.update(
            bytes=out["n"] * self.batch_bytes,
            chunks=len(chunks),
            wait=sum(c.wait_s for c in chunks),
            read=statistics.median([c.read_s for c in chunks]) if chunks else float("nan"),
        )
        return out


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.2f}"


def _median(runs: list[dict[str, float]], key: str) -> float:
    """The median over rounds of ``key`` per byte."""
    return statistics.median(r[key] / r["bytes"] for r in runs)


def report(bench: Bench, got: dict[str, list[dict[str, float]]]) -> list[str]:
    """The summary and the breakdown, as lines."""
    gbps = {a: [r["bytes"] / r["wall"] / 1e9 for r in rs] for a, rs in got.items()}
    rows = [("arm", "median GB/s", "batches/s", "CPU s/GB", "x memcpy", "per round (x memcpy)")]
    for arm, values in gbps.items():
        rate = statistics.median(values) * 1e9 / bench.batch_bytes
        cells = [arm, f"{statistics.median(values):.2f}", f"{rate:.1f}" if arm != "decode" else "-",
                 f"{_median(got[arm], 'cpu') * 1e9:.3f}"]  # fmt: skip
        if "memcpy" in gbps and arm != "memcpy":
            ratios = [a / b for a, b in zip(values, gbps["memcpy"], strict=True)]
            cells += [f"{statistics.median(ratios):.2f}x", ", ".join(f"{x:.2f}" for x in ratios)]
        rows.append(cells)
    lines = ["", "summary (medians over rounds):", *format_table(rows, align="<>>>>")]
    if "stream" not in got:
        return lines
    s = got["stream"]
    cpu = statistics.median(r["cpu"] / r["n"] for r in s)
    stall = statistics.median(r["wait"] / r["wall"] for r in s)
    busy = statistics.median(r["cpu"] / r["wall"] for r in s)
    cores = len(os.sched_getaffinity(0))
    lines.append(f"  stream: {_ms(cpu)} CPU ms per batch (process), {busy:.2f} of {cores} cores "
                 f"busy (at {cores} whole cores: {cores / cpu:.0f} batches/s); the consumer "
                 f"waited for chunks {stall:.1%} of the time")  # fmt: skip
    if not {"memcpy", "tier", "decode"} <= set(got):
        return lines
    loader = bench.stream.loader
    per_chunk = bench.stream.batches_per_chunk
    decoded = loader.chunk_bytes / per_chunk  # the stream's loader's bytes per batch
    wall = {a: 1 / (statistics.median(v) * 1e9) for a, v in gbps.items()}  # seconds per byte
    cpus = {a: _median(rs, "cpu") for a, rs in got.items()}  # CPU seconds per byte
    size = bench.batch_bytes
    parts = [
        ("gather (the tier arm)", size, "tier"),
        (f"decode ({format_bytes(decoded)} at the decode arm's rate)", decoded, "decode"),
        (f"refill copy ({format_bytes(decoded)} at memcpy's rate)", decoded, "memcpy"),
    ]
    whole = {"wall": size * wall["stream"], "cpu": size * cpus["stream"]}
    rows = [("per batch of the stream", "wall ms", "share", "CPU ms", "share")]

    def row(what: str, w: float, c: float) -> tuple[str, ...]:
        return (what, _ms(w), f"{w / whole['wall']:.0%}", _ms(c), f"{c / whole['cpu']:.0%}")

    rows += [row(what, n * wall[arm], n * cpus[arm]) for what, n, arm in parts]
    left = {k: whole[k] - sum(n * (wall if k == "wall" else cpus)[arm] for _, n, arm in parts)
            for k in whole}  # fmt: skip
    rows += [
        row("left (overheads, waits)", left["wall"], left["cpu"]),
        row("stream, measured", whole["wall"], whole["cpu"]),
        row(
            "memcpy of the batch's bytes (the bound)", size * wall["memcpy"], size * cpus["memcpy"]
        ),
    ]
    lines += ["", "where the stream's time goes:", *format_table(rows, align="<>>>>")]
    lines.append(f"  the stream's loader: chunks of {bench.chunk_size:,} steps "
                 f"({format_bytes(loader.chunk_bytes)}), {per_chunk} batches per chunk, "
                 f"{bench.stream.chunks_per_epoch} chunks per epoch; stream mix={bench.stream.mix}")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--timesteps", type=int, default=None)
    ap.add_argument("--codec", default="zstd", choices=("zstd", "blosc-zstd"))
    ap.add_argument("--data", type=Path, default=DATA, help="where the store is kept")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    seconds = args.seconds or (0.5 if args.quick else 5.0)
    timesteps = args.timesteps or (QUICK_TIMESTEPS if args.quick else TIMESTEPS)
    if timesteps < BATCH * WINDOW:  # the memcpy arm copies one batch's bytes out of the data
        ap.error(f"--timesteps {timesteps}: at least {BATCH * WINDOW:,} (one batch's bytes)")
    arms = args.arms.split(",")
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        ap.error(f"--arms: unknown {unknown}; pick from {', '.join(ARMS)}")
    load0 = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable); load "
          f"{load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}", flush=True)  # fmt: skip
    path = store(args.data, timesteps, args.codec)
    stored = warm(path)
    raw = timesteps * WIDTH * 4
    print(f"store: {path.name}, {timesteps:,} x {WIDTH:,} float32 ({format_bytes(raw)}), chunks "
          f"{STORED:,} x {WIDTH:,}, {args.codec}: {format_bytes(stored)} on disk, ratio "
          f"{raw / stored:.2f}; page cache warm", flush=True)  # fmt: skip
    bench = Bench(path, timesteps)
    try:
        stream = bench.stream
        print(f"batches: {BATCH} x {WINDOW} x {WIDTH:,} float32 ({format_bytes(bench.batch_bytes)});"
              f" gather threads {bench.threads}, memcpy threads {MEMCPY_THREADS}; engine "
              f"{stream.loader.source.engine}; {rounds} rounds of {seconds:g} s per arm")  # fmt: skip
        print(stream.buffer.describe())
        got: dict[str, list[dict[str, float]]] = {a: [] for a in arms}
        for r in range(rounds):
            for arm in arms if r % 2 == 0 else arms[::-1]:
                res = bench.run(arm, seconds)
                got[arm].append(res)
                line = f"  round {r} {arm:7}: {res['bytes'] / res['wall'] / 1e9:6.2f} GB/s"
                line += f" ({res['n']} {'chunks' if arm == 'decode' else 'batches'})"
                if arm == "stream":
                    line += f"; {1e3 * res['cpu'] / res['n']:.1f} CPU ms/batch; loader: "
                    line += f"{res['chunks']} chunks, waited {res['wait']:.3f} s"
                    if res["chunks"]:
                        line += f", read {1e3 * res['read']:.0f} ms each (median)"
                print(line, flush=True)
        print("\n".join(report(bench, got)))
        print("\nthe stream's loader (LatencyStats; its epoch clock also ran during other arms):")
        print(stream.loader.stats.format_summary())
    finally:
        bench.close()
    load1 = os.getloadavg()
    print(f"\nload after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
