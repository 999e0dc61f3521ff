"""Run by ``torchrun --nproc_per_node=2`` from tests/test_distributed.py (gloo, CPU).

Each rank streams a real zarr array (written by the test) through a ChunkLoader whose
rank and world size come from torch.distributed, then:

1. gathers every rank's windows of a shuffled epoch: they must be disjoint, equal in
   number, and together tile one pass of the data (every tile start exactly once);
2. trains a small DDP model for two epochs on chunks from the loader and checks the
   ranks' parameters agree afterwards (DDP averages gradients, so they must);
3. checks elastic resume under torchrun: a state saved by a single-process run
   midway through an epoch, resumed here with 2 ranks, yields the remaining windows
   once each across ranks.

Writes ``rank<k>.json`` into the output folder (argv[2]) and exits non-zero on any
failed check, so the test sees the reason in the file or in stderr.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import chunkstream as cs


def gather(value: object) -> list[object]:
    out: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def main() -> None:
    store, outdir, elastic = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    chunk, batch, window = 64, 8, 16
    report: dict[str, object] = {"rank": rank, "world_size": world}
    with cs.ZarrSource(store, {"x": (slice(None),)}) as source:
        total = len(source)
        plan = cs.plan_epoch(total, chunk, batch, world_size=world)
        with cs.ChunkLoader(source, chunk, device="cpu", workers=2, seed=3) as loader:
            check(loader.rank == rank and loader.world_size == world, "rank not detected")
            # 1. disjoint, equal, covering
            windows = [(c.start, c.stop) for c in loader.epoch(plan.chunks_per_epoch)]
            every = gather(windows)
            flat = [w for share in every for w in share]
            check(len({len(s) for s in every}) == 1, f"unequal counts {[len(s) for s in every]}")
            check(len(set(flat)) == len(flat), "a window was visited by two ranks")
            tiles = total // chunk
            check(len(flat) == tiles, f"{len(flat)} windows for {tiles} tiles")
            phase = min(s for s, _ in flat)
            check(
                sorted(s for s, _ in flat) == [phase + k * chunk for k in range(tiles)],
                "shuffled windows do not tile one pass",
            )
            report["windows"] = windows

            # 2. two DDP epochs
            torch.manual_seed(0)  # the same initial weights on every rank
            features = source.fields["x"].shape[0]
            model = torch.nn.parallel.DistributedDataParallel(
                torch.nn.Sequential(
                    torch.nn.Flatten(), torch.nn.Linear(window * features, features)
                )
            )
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            generator = torch.Generator().manual_seed(100 + rank)  # ranks sample differently
            steps = 0
            for _epoch in range(2):
                for c in loader.epoch(plan.chunks_per_epoch):
                    x = c["x"]
                    starts = torch.randint(0, len(x) - window, (batch,), generator=generator)
                    inputs = torch.stack([x[s : s + window] for s in starts.tolist()])
                    targets = torch.stack([x[s + window] for s in starts.tolist()])
                    loss = torch.nn.functional.mse_loss(model(inputs), targets)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    steps += 1
            flat_params = torch.cat([p.detach().flatten() for p in model.parameters()])
            params = gather(flat_params.tolist())
            check(all(p == params[0] for p in params), "parameters differ across ranks")
            report["steps"] = steps
            report["param_norm"] = float(flat_params.norm())

        # 3. elastic resume from a single-process state
        with cs.ChunkLoader(source, chunk, device="cpu", workers=2, seed=3) as loader:
            loader.load_state_dict(elastic["state"])
            rest = [[c.start, c.stop] for c in loader.epoch(plan.chunks_per_epoch)]
            every = gather(rest)
            flat = sorted(w for share in every for w in share)
            check(flat == sorted(elastic["remaining"]), "elastic resume re-split is wrong")
            report["resumed"] = rest
    (outdir / f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
