"""In memory at the ZAPBench-like geometry: ``BatchStream`` against the users' prefetcher (issue 49).

The data: ~7,900 frames x 71,721 neurons of float32 (2.3 GB) held in memory as a
``cs.NumpySource``; a batch is 32 windows of 100 frames (918 MB). Two arms, rounds
alternated in one process so that the machine's load falls on both alike:

* ``stream``: ``cs.BatchStream(cs.ChunkLoader(source, chunk_size, device="cpu"),
  window=100, plan=plan)``, the library's defaults (host tier, gather pool);
* ``prefetch``: the users' hand-written prefetcher: one background thread draws 32
  random starts, copies each window into one of a few reused *unpinned* buffers and
  puts the filled buffer on a queue (``maxsize=1``); the training loop takes it.

Per arm and round: batches/s and the process's CPU time per batch (every thread)
over ``--seconds``, after a warm-up; medians over ``--rounds``; the ratio
stream/prefetch per round, then its median. The consumer touches one value of each
batch (no model), so the figure is the data path's alone.

Run: ``python -m benchmarks.zapbench_prefetch --rounds 3 --seconds 8``. With
``--device cuda`` (``benchmarks/gpu.sh``'s ``zapbench`` step) each batch also goes to
the GPU: the stream's from its page-locked batch slots on the loader's copy stream
(``BatchStream(device="cuda")``, the host tier), the users' with
``.to(device, non_blocking=True)`` from their pageable buffers (which CUDA runs as a
staged, synchronous copy); each batch is read on the device before the next.
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import threading
import time

import numpy as np
import torch

import chunkstream as cs

T, N, BATCH, WINDOW = 7_900, 71_721, 32, 100


class Prefetcher:
    """The users' way: one thread, ``slots`` reused pageable buffers, a queue of filled ones."""

    def __init__(self, data: torch.Tensor, slots: int = 3, seed: int = 0) -> None:
        self.data, self.rng = data, np.random.default_rng(seed)
        self.buffers = [torch.empty((BATCH, WINDOW, data.shape[1])) for _ in range(slots)]
        self.queue: queue.Queue = queue.Queue(maxsize=1)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="users-prefetch", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            out = self.buffers[i % len(self.buffers)]
            for b, s in enumerate(self.rng.integers(0, len(self.data) - WINDOW + 1, BATCH)):
                out[b].copy_(self.data[s : s + WINDOW])
            while not self.stop.is_set():
                try:
                    self.queue.put(out, timeout=0.1)
                    break
                except queue.Full:
                    continue
            i += 1

    def __iter__(self):
        while True:
            yield self.queue.get(timeout=60)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


def _measure(batches, seconds: float) -> dict[str, float]:
    for _ in range(4):  # warm-up: past the first use of every reused buffer's fresh pages
        float(next(batches)[0, 0, 0])
    n, wall, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - wall < seconds:
        float(next(batches)[0, 0, 0])
        n += 1
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"batches_per_s": n / wall, "cpu_ms_per_batch": 1e3 * cpu / max(n, 1)}


def _stream_batches(stream: cs.BatchStream):
    while True:
        for batch in stream:
            yield batch["data"]


def _to(batches, device: torch.device):
    """The users' loop: each filled pageable buffer sent with ``non_blocking=True``."""
    for batch in batches:
        yield batch.to(device, non_blocking=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--frames", type=int, default=T)
    p.add_argument("--neurons", type=int, default=N)
    p.add_argument("--chunk-size", type=int, default=1024)
    p.add_argument("--device", default="cpu", help="where batches go: cpu or cuda")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    array = np.full((args.frames, args.neurons), 1.0, dtype=np.float32)  # every page touched
    source = cs.NumpySource({"data": array})
    plan = cs.plan_epoch(total_timesteps=len(source), chunk_size=args.chunk_size, batch_size=BATCH)
    got: dict[str, list[dict]] = {"stream": [], "prefetch": []}
    with cs.ChunkLoader(source, args.chunk_size, device="cpu", seed=0) as loader:
        stream = cs.BatchStream(loader, window=WINDOW, plan=plan, device=device)
        batches = _stream_batches(stream)
        for r in range(args.rounds):
            got["stream"].append(_measure(batches, args.seconds))
            users = Prefetcher(torch.from_numpy(array), seed=r)
            try:
                users_batches = iter(users) if device.type == "cpu" else _to(users, device)
                got["prefetch"].append(_measure(users_batches, args.seconds))
            finally:
                users.close()
            print(
                f"round {r}: "
                + ", ".join(
                    f"{arm} {v[-1]['batches_per_s']:.2f} batches/s {v[-1]['cpu_ms_per_batch']:.0f} CPU ms/batch"
                    for arm, v in got.items()
                ),
                flush=True,
            )
        buffer = stream.buffer.describe()
        batches.close()
    ratios = [
        s["batches_per_s"] / u["batches_per_s"]
        for s, u in zip(got["stream"], got["prefetch"], strict=True)
    ]
    report = {
        arm: {k: statistics.median(v[k] for v in rows) for k in rows[0]}
        for arm, rows in got.items()
    }
    report["ratio_median"] = statistics.median(ratios)
    report["ratios"] = ratios
    report["buffer"] = buffer
    report["device"] = str(device)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
