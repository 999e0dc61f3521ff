"""The host gather on an idle and on an oversubscribed machine (issues 28 and 31).

    python -m benchmarks.gather_busy            # 65,536 x 1,024 float32, chunk 16,384
    python -m benchmarks.gather_busy --quick    # 16,384 x 256, chunk 4,096 (CI-sized)

``ChunkLoader(NumpySource, chunk_size, device="cpu")`` + ``BatchStream(window=64,
batch_size=256)``, the consumer doing nothing with a batch but dropping it. Arms:

* ``before``: what BatchStream did before this change, by hand: each batch's
  starts from ``sample_windows`` and one ``index_select`` over an ``unfold``
  view (torch's intra-op pool, fresh pages per batch);
* ``device``: ``BatchStream(buffer="device")``: the pooled CPU gather
  (:mod:`chunkstream.pipeline._lane`), a fresh batch tensor per batch;
* ``host``: ``BatchStream()`` with the default ``buffer="auto"`` (the host tier on
  the CPU): gathered ahead into reused slots.

Each arm runs ``--seconds`` idle and then with the machine oversubscribed: the
benchmark starts two CPU burner processes per core (``while True: pass``) and
stops them after the arm. Rounds alternate the arms and conditions, so a
machine shared with other work affects them alike. Reported per arm: batches/s
and CPU ms per batch (this process's CPU time: gather, readers, everything)
idle and busy, and the ratios the issues' targets are about.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

import chunkstream as cs
from chunkstream.consumer import sample_windows

WINDOW, BATCH = 64, 256


def _burners(n: int) -> list[subprocess.Popen]:
    return [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        for _ in range(n)
    ]


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait(10)


def _before(loader: cs.ChunkLoader, per_chunk: int, generator: torch.Generator):
    """The old BatchStream path (mix=1): index_select over an unfold view, per batch."""
    while True:
        for chunk in loader.epoch():
            x = chunk["x"]
            windows = x.unfold(0, WINDOW, 1).movedim(-1, 1)
            for _ in range(per_chunk):
                starts = sample_windows(chunk, BATCH, WINDOW, generator)
                yield torch.index_select(windows, 0, starts)
            del x, windows, chunk


def _stream(loader: cs.ChunkLoader, per_chunk: int, buffer: str, **options):
    # mix=1: the gathers measured here are those of one chunk (the default now mixes).
    # benchmarks.ab runs this harness on older trees too, from before StreamOptions.
    if hasattr(cs, "StreamOptions"):
        options = {"options": cs.StreamOptions(**options)}
    stream = cs.BatchStream(loader, window=WINDOW, batch_size=BATCH, batches_per_chunk=per_chunk,
                            fields="x", buffer=buffer, mix=1, **options)  # fmt: skip
    while True:
        yield from stream


def measure(data: np.ndarray, chunk: int, arm: str, seconds: float,
            **options) -> dict[str, float]:  # fmt: skip
    """Batches/s and CPU ms per batch of ``arm`` over ``seconds`` (after one chunk's warm-up)."""
    per_chunk = chunk // BATCH
    with cs.ChunkLoader(cs.NumpySource({"x": data}), chunk, device="cpu", seed=0) as loader:
        if arm == "before":
            batches = _before(loader, per_chunk, torch.Generator().manual_seed(0))
        else:
            batches = _stream(loader, per_chunk, "device" if arm == "device" else "auto",
                              **options)  # fmt: skip
        for _ in range(4):  # warm up: the first chunk read, slots and pools made
            next(batches)
        n, t0, c0 = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - t0 < seconds:
            next(batches)
            n += 1
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        batches.close()
    return {"batches_s": n / wall, "cpu_ms": 1e3 * cpu / max(1, n), "batches": n}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="16,384 x 256, chunk 4,096")
    ap.add_argument("--seconds", type=float, default=None, help="per arm and condition")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--arms", default="before,device,host")
    ap.add_argument(
        "--gather-threads", type=int, default=None, help="StreamOptions(gather_threads=)"
    )
    ap.add_argument("--batch-prefetch", type=int, default=2, help="StreamOptions(batch_prefetch=)")
    args = ap.parse_args(argv)
    t, n, chunk = (16384, 256, 4096) if args.quick else (65536, 1024, 16384)
    seconds = args.seconds or (2.0 if args.quick else 5.0)
    rounds = args.rounds or (1 if args.quick else 2)
    arms = args.arms.split(",")
    cores = os.cpu_count() or 1
    data = np.random.default_rng(0).standard_normal((t, n), dtype=np.float32)
    print(f"NumpySource {t:,} x {n:,} float32, chunk_size={chunk:,}, window={WINDOW}, "
          f"batch {BATCH}; {cores} cores, busy = {2 * cores} burner processes; "
          f"torch threads {torch.get_num_threads()}; {seconds:g} s per arm, {rounds} rounds",
          flush=True)  # fmt: skip
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for r in range(rounds):
        for condition in ("idle", "busy"):
            order = arms if r % 2 == 0 else arms[::-1]
            for arm in order:
                procs = _burners(2 * cores) if condition == "busy" else []
                try:
                    if procs:
                        time.sleep(0.3)  # the burners are running
                    options = {"gather_threads": args.gather_threads}
                    if arm == "host":
                        options["batch_prefetch"] = args.batch_prefetch
                    out = measure(data, chunk, arm, seconds, **({} if arm == "before" else options))
                finally:
                    _stop(procs)
                results.setdefault((arm, condition), []).append(out)
                print(f"  round {r} {condition:4} {arm:6}: {out['batches_s']:7.1f} batches/s, "
                      f"{out['cpu_ms']:7.1f} CPU ms/batch", flush=True)  # fmt: skip

    def med(arm: str, cond: str, key: str) -> float:
        return statistics.median(o[key] for o in results[(arm, cond)])

    print("\n| arm | idle batches/s | busy batches/s | busy/idle | idle CPU ms/batch | "
          "busy CPU ms/batch | busy/idle CPU |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for arm in arms:
        bi, bb = med(arm, "idle", "batches_s"), med(arm, "busy", "batches_s")
        ci, cb = med(arm, "idle", "cpu_ms"), med(arm, "busy", "cpu_ms")
        print(f"| {arm} | {bi:.1f} | {bb:.1f} | {bb / bi:.2f}x | {ci:.1f} | {cb:.1f} | "
              f"{cb / ci:.2f}x |")  # fmt: skip
    checks = []
    if "host" in arms:
        bi, bb = med("host", "idle", "batches_s"), med("host", "busy", "batches_s")
        ci, cb = med("host", "idle", "cpu_ms"), med("host", "busy", "cpu_ms")
        checks += [("default (host tier) busy/idle batches/s >= 0.25", bb / bi, bb / bi >= 0.25),
                   ("default (host tier) busy/idle CPU ms/batch <= 2", cb / ci, cb / ci <= 2.0)]  # fmt: skip
        if "device" in arms:
            ratio = bi / med("device", "idle", "batches_s")
            checks.append(("host tier / device tier idle batches/s >= 0.9", ratio, ratio >= 0.9))
        if "before" in arms:
            ratio = bi / med("before", "idle", "batches_s")
            checks.append(("default / before, idle batches/s >= 1", ratio, ratio >= 1.0))
    print()
    for what, value, ok in checks:
        print(f"{'met ' if ok else 'MISS'}  {what}: {value:.2f}")
    return 0 if all(ok for *_, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
