"""Two ranks of one CPU each against one process of two CPUs, on this tree and an older one.

    python -m benchmarks.node_share --against 2f6cf81              # 3 rounds of 4 s
    python -m benchmarks.node_share --against 2f6cf81 --rounds 5 --seconds 6

Issue 42 asks that 2 ranks x 1 CPU deliver >= 0.9x the batches/s of 1 process x 2 CPUs
in aggregate, over the same zarr store. Each arm runs in fresh processes with
``chunkstream`` imported from a tree's ``src/`` (the other commit's exported with
``git archive``, as :mod:`benchmarks.ab`): ``1x2`` is one process under ``taskset -c
0,1``; ``2x1`` is two processes at once, ``taskset -c 0`` and ``taskset -c 1``, with
``LOCAL_WORLD_SIZE=2`` and ``rank=0/1, world_size=2`` (torchrun's environment, without a
process group: the ranks need not talk to stream their shares). Every process streams
``BatchStream``'s defaults (host tier) over the store, warms up, then counts the batches
it delivers in one wall-clock window shared by the ranks; ``2x1``'s figure is the sum.
Rounds alternate the trees' order. Reported per round: each tree's two figures, also
per CPU-second the processes used (every thread's, over the window: a figure that a
machine loaded by others disturbs less than wall-clock batches/s), and the ratio
``2x1 / 1x2``; then the median ratios per tree.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.ab import ROOT, _export

T, N, TIME_CHUNK, FIELD_CHUNK = 65536, 512, 2048, 128  # 128 MiB of float32, zstd
CHUNK, WINDOW, BATCH = 8192, 32, 64
#: Batches each chunk feeds: few, so that reading (decoding zstd) is most of the work, as
#: when a store is far larger than memory and each chunk is read for a few batches.
BATCHES_PER_CHUNK = 8


def _store(path: Path) -> Path:
    """A zarr v3 store (zstd): a smooth signal plus noise, so it compresses as recordings do."""
    import numpy as np
    import zarr

    rng = np.random.default_rng(0)
    array = zarr.create_array(
        str(path),
        shape=(T, N),
        chunks=(TIME_CHUNK, FIELD_CHUNK),
        dtype="float32",
        compressors=zarr.codecs.ZstdCodec(level=3),
    )
    phase = rng.uniform(0, 6.28, N).astype(np.float32)
    for start in range(0, T, 8192):
        t = np.arange(start, start + 8192, dtype=np.float32)[:, None]
        block = np.sin(t / 50 + phase) + 0.01 * rng.standard_normal((8192, N), dtype=np.float32)
        array[start : start + 8192] = np.round(block, 3)
    return path


def _child(store: str, rank: int, world: int, start_at: float, seconds: float) -> None:
    import chunkstream as cs

    src = cs.ZarrSource(store)
    plan = cs.plan_epoch(len(src), chunk_size=CHUNK, batch_size=BATCH, world_size=world)
    batches, cpu = 0, None
    # The trees compared may predate the option objects (rank= was a keyword then).
    ranks, epoch = {"rank": rank, "world_size": world}, {"chunks_per_epoch": plan.chunks_per_epoch}
    if hasattr(cs, "LoaderOptions"):
        ranks = {"options": cs.LoaderOptions(**ranks)}
        epoch = {"options": cs.StreamOptions(**epoch)}
    with cs.ChunkLoader(src, CHUNK, device="cpu", sampling="shuffled", seed=0,
                        **ranks) as loader:  # fmt: skip
        stream = cs.BatchStream(
            loader, window=WINDOW, batch_size=BATCH, batches_per_chunk=BATCHES_PER_CHUNK, **epoch
        )
        done = False
        while not done:
            for batch in stream:
                now = time.time()
                if now >= start_at + seconds:
                    done = True
                    break
                if now >= start_at:
                    if cpu is None:  # every thread's CPU time, from the window's start
                        cpu = time.process_time()
                    batches += 1
                    float(batch["data"][0, 0, 0])
    cpu_s = time.process_time() - cpu if cpu is not None else 0.0
    threads = sum(t.startswith("chunkstream-decode-") for t in _thread_names())
    print(json.dumps({"batches": batches, "late": time.time() < start_at, "decode": threads,
                      "cpu_s": cpu_s, "module": cs.__file__}), flush=True)  # fmt: skip
    src.close()


def _thread_names() -> list[str]:
    import threading

    return [t.name for t in threading.enumerate()]


def _spawn(src: Path, store: Path, cpus: str, rank: int, world: int, start_at: float, s: float):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(ROOT)])}
    for name in ("LOCAL_WORLD_SIZE", "CHUNKSTREAM_CPUS", "CHUNKSTREAM_RANKS_PER_NODE"):
        env.pop(name, None)
    if world > 1:
        env["LOCAL_WORLD_SIZE"] = str(world)
    cmd = ["taskset", "-c", cpus, sys.executable, "-m", "benchmarks.node_share", "--child",
           str(store), str(rank), str(world), str(start_at), str(s)]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip


def _collect(procs) -> list[dict]:
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        lines = [line for line in stdout.splitlines() if line.startswith("{")]
        if proc.returncode or not lines:
            raise SystemExit(f"exit {proc.returncode}\n{stdout}\n{stderr[-3000:]}")
        out.append(json.loads(lines[-1]))
    return out


def arm(src: Path, store: Path, layout: str, seconds: float, lead: float) -> dict:
    """Batches/s of ``layout`` ("1x2" or "2x1") with ``src``'s chunkstream."""
    start_at = time.time() + lead  # imports, the store's opening and a warm-up first
    if layout == "1x2":
        procs = [_spawn(src, store, "0,1", 0, 1, start_at, seconds)]
    else:
        procs = [_spawn(src, store, str(r), r, 2, start_at, seconds) for r in range(2)]
    reports = _collect(procs)
    if any(r["late"] for r in reports):
        raise SystemExit(f"a process was not ready {lead} s after its start: raise --lead")
    batches = sum(r["batches"] for r in reports)
    return {"batches_per_s": batches / seconds,
            "batches_per_cpu_s": batches / max(1e-9, sum(r["cpu_s"] for r in reports)),
            "decode_threads": [r["decode"] for r in reports]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", default=None, help="older commit for 'before'")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--lead", type=float, default=12.0, help="s before counting starts")
    parser.add_argument("--child", nargs=5, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        store, rank, world, start_at, seconds = args.child
        _child(store, int(rank), int(world), float(start_at), float(seconds))
        return
    if len(os.sched_getaffinity(0)) < 2 or shutil.which("taskset") is None:
        raise SystemExit("needs taskset and two CPUs (0 and 1)")
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"after": ROOT / "src"}
        if args.against:
            trees["before"] = _export(args.against, Path(tmp) / "before")
        store = _store(Path(tmp) / "x.zarr")
        print(
            f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}"
        )
        ratios: dict[str, list[float]] = {name: [] for name in trees}
        efficiency: dict[str, list[float]] = {name: [] for name in trees}
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(trees)[::-1]
            for name in order:
                one = arm(trees[name], store, "1x2", args.seconds, args.lead)
                two = arm(trees[name], store, "2x1", args.seconds, args.lead)
                ratio = two["batches_per_s"] / max(1e-9, one["batches_per_s"])
                ratios[name].append(ratio)
                per_cpu = two["batches_per_cpu_s"] / max(1e-9, one["batches_per_cpu_s"])
                efficiency[name].append(per_cpu)
                print(
                    f"round {r} {name:>6}: 1x2 {one['batches_per_s']:7.1f} batches/s "
                    f"({one['batches_per_cpu_s']:.1f} per CPU-s, decode threads "
                    f"{one['decode_threads']}), 2x1 {two['batches_per_s']:7.1f} batches/s "
                    f"({two['batches_per_cpu_s']:.1f} per CPU-s, decode threads "
                    f"{two['decode_threads']}): 2x1/1x2 = {ratio:.3f} ({per_cpu:.3f} per CPU-s)",
                    flush=True,
                )
        print(
            f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}"
        )
        for name, values in ratios.items():
            per_cpu = efficiency[name]
            print(
                f"{name}: median 2x1/1x2 = {statistics.median(values):.3f} "
                f"(range {min(values):.3f}-{max(values):.3f}, {len(values)} rounds); "
                f"per CPU-second {statistics.median(per_cpu):.3f} "
                f"({min(per_cpu):.3f}-{max(per_cpu):.3f})"
            )


if __name__ == "__main__":
    main()
