"""A child process for tests/test_rank_memory.py: the issue's rank over a zarr store.

``rank STORE OUT``: run under ``torchrun`` (gloo, CPU): ``ChunkLoader(src,
chunk_size=4096, device="cpu")`` and ``BatchStream(loader, window=64, plan=plan)``
(the defaults) for one epoch, then ``OUT/rank<k>.json`` with the batches and the
buffer's terms. ``alone GROUP STORE OUT``: join the v1 memory cgroup ``GROUP`` first,
then the same as one process.
"""

from __future__ import annotations

import json
import os
import sys


def _epoch(store: str, out: str, rank: int, world: int) -> None:
    import chunkstream as cs

    src = cs.ZarrSource(store)
    plan = cs.plan_epoch(total_timesteps=len(src), chunk_size=4096, batch_size=32, world_size=world)
    with cs.ChunkLoader(src, chunk_size=4096, device="cpu") as loader:
        stream = cs.BatchStream(loader, window=64, plan=plan)
        batches = sum(1 for _ in stream)
        report = {
            "batches": batches,
            "expected": len(stream),
            "mix": stream.mix,
            "describe": stream.buffer.describe(),
            "terms": stream.buffer.terms,
        }
    src.close()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)


def rank(store: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    _epoch(store, out, dist.get_rank(), dist.get_world_size())
    dist.barrier()
    dist.destroy_process_group()


def alone(group: str, store: str, out: str) -> None:
    with open(os.path.join(group, "cgroup.procs"), "w") as f:  # join the cgroup first
        f.write(str(os.getpid()))
    _epoch(store, out, 0, 1)


if __name__ == "__main__":
    {"rank": rank, "alone": alone}[sys.argv[1]](*sys.argv[2:])
