"""The defaults on CUDA at the users' geometry: what a batch costs from a host-tier buffer.

    python -m benchmarks.gpu_defaults [--chunks 6] [--batches 256] [--json OUT]

Chunks of 65,536 timesteps x 13,741 neurons of float32 plus a 1,736-wide stimulus
(4.06 GB a chunk), batches of 256 windows. Two ways to the same batches on the
GPU, each timed over ``--batches`` batches after a warm-up (CUDA synchronized
before the clock is read):

* ``defaults``: ``ChunkLoader(device="cpu")`` + ``BatchStream(loader, window=W,
  plan=plan, device="cuda")``, everything else default: the host tier holding
  the share of the split the job's host memory allows, each batch a host gather
  and one copy;
* ``device tier``: ``ChunkLoader(device="cuda")`` + ``BatchStream(...)``: at most
  16 chunks within an eighth of the device, each batch an ``index_select`` there.

The data is ``np.zeros`` (pages mapped on first read, never written), so the
figures are the pipeline's, not a disk's. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

import chunkstream as cs

ROWS, NEURONS, STIM, BATCH, WINDOW = 65536, 13741, 1736, 256, 9


def _time(stream: cs.BatchStream, batches: int) -> dict:
    it = iter(stream)
    for _ in range(8):  # warm-up: the first chunk's read and the buffer's first fill
        next(it)
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(batches):
        batch = next(it)
    torch.cuda.synchronize()  # the clock stops once the last copy has landed
    seconds = time.perf_counter() - began
    it.close()
    return {"ms_per_batch": 1e3 * seconds / batches, "batch_mb": sum(
        t.numel() * t.element_size() for n, t in batch.items() if n in stream.fields) / 1e6,
        "tier": stream.buffer.tier, "mix": stream.mix, "share": stream.buffer.split_share,
        "buffer": stream.buffer.describe()}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chunks", type=int, default=6, help="timesteps of the data, in chunks")
    p.add_argument("--batches", type=int, default=256, help="batches timed per arm")
    p.add_argument("--json", default=None, help="also write the result here")
    args = p.parse_args()
    total = args.chunks * ROWS
    src = cs.NumpySource({"voltage": np.zeros((total, NEURONS), np.float32),
                          "stimulus": np.zeros((total, STIM), np.float32)})  # fmt: skip
    plan = cs.plan_epoch(total_timesteps=total, chunk_size=ROWS, batch_size=BATCH)
    out: dict = {"geometry": {"rows": ROWS, "neurons": NEURONS, "stim": STIM, "batch": BATCH,
                              "window": WINDOW, "chunks": args.chunks},
                 "device": torch.cuda.get_device_name(0)}  # fmt: skip
    with cs.ChunkLoader(src, ROWS, device="cpu", seed=0) as loader:
        stream = cs.BatchStream(loader, window=WINDOW, plan=plan, device="cuda")
        out["defaults"] = _time(stream, args.batches)
    with cs.ChunkLoader(src, ROWS, device="cuda", seed=0) as loader:
        stream = cs.BatchStream(loader, window=WINDOW, plan=plan)
        out["device tier"] = _time(stream, args.batches)
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
