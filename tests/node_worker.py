"""A child process for tests/test_node_share.py: real processes, real limits.

``threads STORE``: stream one epoch of a zarr store (host tier, ``BatchStream``'s
defaults) and print, as JSON, the most ``chunkstream-decode-*`` and
``chunkstream-gather-*`` threads alive at once and this process's share.

``rank NPY OUT``: run under ``torchrun`` (gloo): one epoch of the defaults over a
``.npy`` array per rank, then ``OUT/rank<k>.json`` with the buffer, the share, the
batches, and the ranks on this host as the process group counts them (with
``LOCAL_WORLD_SIZE`` hidden).

``refusal CGROUP NPY``: join the v1 memory cgroup ``CGROUP`` first, then build the
issue's loader (an arena larger than half of the room left) and ``BatchStream``'s
host tier with ``mix="auto"``, and stream an epoch.
"""

from __future__ import annotations

import json
import os
import sys
import threading


def _threads() -> tuple[int, int]:
    names = [t.name for t in threading.enumerate()]
    return (
        sum(n.startswith("chunkstream-decode-") for n in names),
        sum(n.startswith("chunkstream-gather-") for n in names),
    )


def threads(store: str) -> None:
    import chunkstream as cs
    from chunkstream._memory import node_share

    src = cs.ZarrSource(store)
    plan = cs.plan_epoch(total_timesteps=len(src), chunk_size=2048, batch_size=16)
    most = [0, 0]
    with cs.ChunkLoader(src, 2048, device="cpu", sampling="shuffled", seed=0) as loader:
        stream = cs.BatchStream(loader, window=8, plan=plan)
        for _ in stream:
            most = [max(a, b) for a, b in zip(most, _threads(), strict=True)]
    src.close()
    share = node_share()
    print(json.dumps({"decode": most[0], "gather": most[1], "threads": share.threads,
                      "share": share.describe(), "engine": src.engine}))  # fmt: skip


def rank(npy: str, out: str) -> None:
    import numpy as np
    import torch.distributed as dist

    import chunkstream as cs
    from chunkstream._memory import ranks_on_node

    dist.init_process_group("gloo")
    data = np.load(npy, mmap_mode="r")
    src = cs.NumpySource({"x": data})
    plan = cs.plan_epoch(total_timesteps=len(src), chunk_size=8192, batch_size=32,
                         world_size=dist.get_world_size())  # fmt: skip
    with cs.ChunkLoader(src, 8192, device="cpu", sampling="shuffled", seed=0, workers=1,
                        prefetch=1) as loader:  # fmt: skip
        stream = cs.BatchStream(loader, window=16, plan=plan)
        batches = sum(1 for _ in stream)
        report = {"mix": stream.mix, "memory": stream.buffer.memory, "batches": batches,
                  "expected": len(stream), "share": loader.share.describe()}  # fmt: skip
    dist.barrier()
    os.environ.pop("LOCAL_WORLD_SIZE", None)
    report["group_ranks"] = list(ranks_on_node())
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


def refusal(group: str, npy: str) -> None:
    with open(os.path.join(group, "cgroup.procs"), "w") as f:  # join the cgroup first
        f.write(str(os.getpid()))
    import numpy as np

    import chunkstream as cs

    data = np.load(npy, mmap_mode="r")
    src = cs.NumpySource({"x": data})
    chunk = len(data) // 8
    plan = cs.plan_epoch(total_timesteps=len(src), chunk_size=chunk, batch_size=32)
    with cs.ChunkLoader(src, chunk, device="cpu", sampling="shuffled", seed=0) as loader:
        stream = cs.BatchStream(loader, window=64, plan=plan, mix="auto", buffer="host")
        print("MEMORY", stream.buffer.memory, flush=True)
        print("MIX", stream.mix, stream.buffer.tier, flush=True)
        n = sum(1 for _ in stream)
    print("BATCHES", n, len(stream), flush=True)


if __name__ == "__main__":
    {"threads": threads, "rank": rank, "refusal": refusal}[sys.argv[1]](*sys.argv[2:])
