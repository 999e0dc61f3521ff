"""Run by ``torchrun --nproc_per_node=2`` from tests/test_distributed.py (gloo, CPU).

Each rank streams a real zarr array (written by the test) through a ChunkLoader whose
rank and world size come from torch.distributed, then:

1. gathers every rank's windows of a shuffled epoch: they must be disjoint, equal in
   number, and together tile one pass of the data (every tile start exactly once);
2. trains the reference model (``chunkstream.train.Trainer``, under DDP) for two
   epochs and checks the ranks' parameters agree (DDP averages gradients, so they
   must), that the streamed baseline is the variance of all ranks' rows (the moments
   are all-reduced), that the validation loss agrees, and that only rank 0 wrote the
   checkpoint; then resumes it on every rank for a third epoch, and checks again;
3. checks elastic resume under torchrun: a state saved by a single-process run
   midway through an epoch, resumed here with 2 ranks, yields the remaining windows
   once each across ranks.

Writes ``rank<k>.json`` into the output folder (argv[2]) and exits non-zero on any
failed check, so the test sees the reason in the file or in stderr.

``CHUNKSTREAM_DIST_BACKEND=nccl`` runs the same checks with NCCL and the trainer on
CUDA (``device="cuda"``, which the trainer turns into ``cuda:{LOCAL_RANK}``); the
loaders of checks 1 and 3 stay on the CPU, as the gathers only need the process group.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import chunkstream as cs
from chunkstream.train import TrainConfig, Trainer


def gather(value: object) -> list[object]:
    out: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def params_of(trainer: Trainer) -> list[float]:
    return torch.cat([p.detach().flatten() for p in trainer.model.parameters()]).tolist()


BACKEND = os.environ.get("CHUNKSTREAM_DIST_BACKEND", "gloo")


def train(source: cs.ZarrSource, out: Path, rank: int, world: int) -> dict[str, object]:
    device = "cuda" if BACKEND == "nccl" else "cpu"
    config = TrainConfig(
        data_field="x", stim_field=None, chunk_size=64, batch_size=8, evolve_multiple_steps=2,
        latent_dim=4, hidden_dim=8, epochs=2, warmup_epochs=1, workers=2, device=device,
        tensorboard=None, progress=False, seed=1,
    )  # fmt: skip
    trainer = Trainer(source, config, out_dir=out)
    if BACKEND == "nccl":
        local = int(os.environ["LOCAL_RANK"])
        check(trainer.device == torch.device("cuda", local), f"rank on {trainer.device}")
        check(torch.cuda.current_device() == local, "set_device was not called")
        check(trainer.net.device_ids == [local], f"DDP device_ids {trainer.net.device_ids}")
    check(trainer.plan.world_size == world, "the trainer's plan is not per rank")
    check(isinstance(trainer.net, torch.nn.parallel.DistributedDataParallel), "no DDP wrapper")
    result = trainer.fit()
    check(len(result.history) == 2, f"{len(result.history)} epochs")
    batches = [r.batches for r in result.history]
    params = gather(params_of(trainer))
    check(all(p == params[0] for p in params), "parameters differ across ranks")
    check(len(set(gather(result.val_loss))) == 1, "validation loss differs across ranks")
    # The baseline: the variance of every row any rank trained on in epoch 0 (all-reduced).
    check(len(set(gather(result.baseline_train))) == 1, "baseline differs across ranks")
    check(result.baseline_train > 0, f"baseline {result.baseline_train}")
    dist.barrier()  # rank 0 has written its files
    check((out / "checkpoint.pt").is_file(), "no checkpoint")
    events = sorted(p.name for p in (out / "tensorboard").glob("events.*"))
    check(len(events) <= 1, f"more than rank 0 logged to TensorBoard: {events}")
    dist.barrier()  # every rank looked before the resumed run logs again
    # 3 epochs in all: the resumed run trains one more, on every rank from the same file.
    resumed = Trainer(source, TrainConfig(**{**config.to_dict(), "epochs": 3}), out_dir=out)
    again = resumed.fit(resume=True)
    check(len(again.history) == 3, "the resumed run did not continue from the checkpoint")
    params = gather(params_of(resumed))
    check(all(p == params[0] for p in params), "parameters differ across ranks after resume")
    return {
        "train_batches": batches,
        "val_loss": result.val_loss,
        "param_norm": float(torch.tensor(params[0]).norm()),
        "events": events,
        "resumed_epochs": len(again.history),
        "device": str(trainer.device),
    }


def main() -> None:
    store, outdir, elastic = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
    if BACKEND == "nccl":
        # Before the first collective: NCCL's object gathers use the current device.
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(BACKEND)
    rank, world = dist.get_rank(), dist.get_world_size()
    chunk, batch = 64, 8
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

        # 2. two DDP epochs of the reference trainer, then one more resumed from its checkpoint
        report.update(train(source, outdir / "train", rank, world))

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
