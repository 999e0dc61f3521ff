"""Resident memory of ``chunkstream.compat`` against the original loop, on one ``load_fn``.

``python -m benchmarks.compat_rss [--quick]``

Each arm runs in a fresh interpreter (so neither sees the other's pages) and plays the
merged training script's loop on the CPU: ``start_epoch(n)``, ``n`` times
``get_next_chunk()`` whose chunk the "training" reads and holds until the next one,
over several epochs. The arms:

* ``original``: a minimal reimplementation of the original ``RandomChunkLoader``: one
  thread draws ``random.Random(seed)`` starts, calls ``load_fn``, wraps its arrays with
  ``torch.from_numpy`` (``.to("cpu")`` is a no-op) and puts them on a
  ``queue.Queue(maxsize=prefetch)``;
* ``compat``: ``chunkstream.compat.RandomChunkLoader`` over the same ``load_fn``.

``load_fn`` returns fresh arrays, as a zarr read does. Printed per arm: RSS after
imports, the peak (``ru_maxrss``) and the RSS at each epoch's end, in MiB and in
chunks over the import baseline; then compat's peak over the original's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

ARM = r"""
import json, queue, random, resource, sys, threading
import numpy as np, torch

T, N, S, C, EPOCHS, CHUNKS, PREFETCH, ARM = json.loads(sys.argv[1])

def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

def load_fn(start, end):  # fresh arrays, as a zarr read returns
    data = np.empty((end - start, N), np.float32)
    data[:] = np.arange(start, end, dtype=np.float32)[:, None]
    return data, np.ones((end - start, S), np.float32)

class Original:
    # The original's loop, minimal: one thread, one queue of `prefetch` chunks.
    def __init__(self, load_fn, total_timesteps, chunk_size, prefetch, seed):
        self.load_fn, self.T, self.C = load_fn, total_timesteps, chunk_size
        self.rng, self.prefetch = random.Random(seed), prefetch
        self.thread = None
    def start_epoch(self, num_chunks):
        self.queue = queue.Queue(maxsize=self.prefetch)
        def run(q=self.queue):
            for _ in range(num_chunks):
                start = self.rng.randint(0, max(0, self.T - self.C))
                data, stim = self.load_fn(start, min(start + self.C, self.T))
                q.put((start, torch.from_numpy(data).to("cpu"), torch.from_numpy(stim).to("cpu")))
            q.put(None)
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
    def get_next_chunk(self):
        item = self.queue.get()
        return (None, None, None) if item is None else item
    def cleanup(self):
        self.thread.join()

base = rss_mib()
if ARM == "compat":
    from chunkstream.compat import RandomChunkLoader
    loader = RandomChunkLoader(load_fn, T, C, device="cpu", prefetch=PREFETCH, seed=0)
else:
    loader = Original(load_fn, T, C, PREFETCH, 0)
base = rss_mib()  # after the arm's imports
per_epoch, checksum = [], 0.0
for _ in range(EPOCHS):
    loader.start_epoch(CHUNKS)
    chunk_data = None
    for _ in range(CHUNKS):
        chunk_start, chunk_data, chunk_stim = loader.get_next_chunk()
        checksum += float(chunk_data[:: 256].sum())  # "training" reads the chunk it holds
    per_epoch.append(rss_mib())
    del chunk_data, chunk_stim
loader.cleanup()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"base": base, "peak": peak, "epochs": per_epoch, "checksum": checksum}))
"""


def run_arm(arm: str, config: list) -> dict:
    out = subprocess.run([sys.executable, "-c", ARM, json.dumps([*config, arm])],
                         capture_output=True, text=True, check=True, timeout=600)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="32 MiB chunks, 3 epochs")
    args = parser.parse_args()
    T, N, S = 200_000, 2048, 128
    C, epochs = (4096, 3) if args.quick else (16_384, 6)
    chunks, prefetch = 4, 1
    chunk_mib = C * (N + S) * 4 / 2**20
    print(f"chunk {C} x ({N} + {S}) float32 = {chunk_mib:.0f} MiB, prefetch {prefetch}, "
          f"{epochs} epochs of {chunks} chunks, CPU")  # fmt: skip
    results = {}
    for arm in ("original", "compat"):
        r = results[arm] = run_arm(arm, [T, N, S, C, epochs, chunks, prefetch])
        over = r["peak"] - r["base"]
        ends = ", ".join(f"{e:.0f}" for e in r["epochs"])
        print(f"{arm:>8}: imports {r['base']:.0f} MiB, peak {r['peak']:.0f} MiB "
              f"(+{over:.0f} = {over / chunk_mib:.2f} chunks), epoch ends [{ends}] MiB")  # fmt: skip
    assert results["original"]["checksum"] == results["compat"]["checksum"]  # same windows
    o, c = results["original"], results["compat"]
    print(
        f"compat peak over original: {c['peak'] - o['peak']:+.0f} MiB "
        f"({(c['peak'] - c['base'] - (o['peak'] - o['base'])) / chunk_mib:+.2f} chunks "
        "over each arm's import baseline)"
    )


if __name__ == "__main__":
    main()
