"""Train a LightningModule on the demo store through ``cs.BatchStream``, and resume exactly.

    python examples/lightning_train.py                      # 2 epochs on ./chunkstream-demo/data
    python examples/lightning_train.py --die-at-step 60     # "killed" at step 60 (os._exit)
    python examples/lightning_train.py --resume             # continue from the last checkpoint

The training data is the store ``chunkstream demo`` writes (24,576 timesteps x 128
neurons in the FlyVis layout; written once under ``--out``/data if missing). The
``LightningDataModule`` below opens it as a source, streams it with a
``ChunkLoader`` and hands Lightning a ``BatchStream``: an iterable of device
batches with ``__len__`` (so Lightning knows the epoch's length and fetches no
batch ahead) and ``state_dict()`` / ``load_state_dict()``, which Lightning 2.x
saves in every checkpoint and restores on ``fit(ckpt_path=...)``. A run killed
mid-epoch and resumed from its last checkpoint therefore trains on exactly the
batches an uninterrupted run trains on after that step.

``--record FILE`` appends one JSON line per training step (step, epoch, a checksum
of the batch, the loss); ``tests/test_examples.py`` compares an uninterrupted
run's lines with those of a killed and resumed one.
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

import chunkstream as cs
from chunkstream.tools import ensure_synthetic

# The demo store's arguments (``chunkstream demo`` with no options writes the same).
DEMO = {"timesteps": 24576, "neurons": 128, "stim_dims": 32, "seed": 0, "chunks": (512, 32, 1)}


class NextStep(L.LightningModule):
    """From each timestep's voltage and stimulus, predict the next timestep's voltage."""

    def __init__(self, neurons: int, stim_dims: int, record: Path | None = None) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(neurons + stim_dims, neurons)
        self.record = record

    def forward(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return x[:, :-1] + self.linear(torch.cat([x[:, :-1], s[:, :-1]], dim=-1))

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, s = batch["voltage"], batch["stimulus"]  # (B, W, N), (B, W, S), on the device
        loss = F.mse_loss(self(x, s), x[:, 1:])
        self.log("loss", loss, prog_bar=True, batch_size=x.shape[0])
        if self.record is not None:
            line = {
                "step": self.global_step,
                "epoch": self.current_epoch,
                "batch": float(x.double().sum() + s.double().sum()),
                "loss": float(loss.detach()),
            }
            with self.record.open("a") as f:  # a line per step survives a kill
                f.write(json.dumps(line) + "\n")
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class StreamingData(L.LightningDataModule):
    """The demo store as a ``BatchStream``; the loader lives from ``setup`` to ``teardown``."""

    def __init__(self, data: Path, *, chunk_size: int, batch_size: int, window: int) -> None:
        super().__init__()
        self.data, self.chunk_size, self.batch_size, self.window = (
            data,
            chunk_size,
            batch_size,
            window,
        )
        self.source: cs.Source | None = None
        self.loader: cs.ChunkLoader | None = None
        self.stream: cs.BatchStream | None = None

    def setup(self, stage: str) -> None:
        self.source = cs.flyvis.open(self.data, column="voltage", stim_dims=DEMO["stim_dims"])
        plan = cs.plan_epoch(
            len(self.source), chunk_size=self.chunk_size, batch_size=self.batch_size
        )
        self.loader = cs.ChunkLoader(
            self.source,
            chunk_size=self.chunk_size,
            device="cuda" if torch.cuda.is_available() else "cpu",
            prefetch=2,
            workers=2,
            sampling="shuffled",
            seed=0,
        )
        self.stream = cs.BatchStream(self.loader, window=self.window, plan=plan)

    def train_dataloader(self) -> cs.BatchStream:
        assert self.stream is not None, "setup() builds the stream"
        return self.stream

    def teardown(self, stage: str) -> None:
        if self.loader is not None:
            self.loader.close()
        if self.source is not None:
            self.source.close()


class DieAtStep(Callback):
    """Simulates a kill: the process ends at once, mid-epoch, nothing flushed or closed."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step >= self.step:
            os._exit(17)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=None,
                   help="a FlyVis-layout directory (default: the demo store under OUT/data)")  # fmt: skip
    p.add_argument("--out", type=Path, default=Path("chunkstream-demo"))
    p.add_argument("--max-epochs", type=int, default=2)
    p.add_argument("--chunk-size", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--window", type=int, default=8, help="timesteps per sample")
    p.add_argument("--ckpt-every", type=int, default=25, help="checkpoint every N steps")
    p.add_argument("--resume", action="store_true", help="continue from OUT/lightning/last.ckpt")
    p.add_argument("--die-at-step", type=int, default=None, help="end the process at this step")
    p.add_argument("--record", type=Path, default=None, help="append a JSON line per step")
    p.add_argument("--quiet", action="store_true", help="no progress bar or model summary")
    args = p.parse_args(argv)

    data = args.data
    if data is None:
        data = args.out / "data"
        ensure_synthetic(data, progress=not args.quiet, **DEMO)
    ckpt_dir = args.out / "lightning"
    # Lightning 2.6 checks for pytree leaves in a way torch >= 2.10 deprecates; the warning is
    # about Lightning's code, not this script's, so only it is silenced.
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
    )
    if args.resume:  # resuming means the checkpoint folder holds checkpoints: say it is fine
        warnings.filterwarnings(
            "ignore",
            message=r"Checkpoint directory .* exists and is not empty",
            category=UserWarning,
        )
    L.seed_everything(0, verbose=False)
    model = NextStep(DEMO["neurons"], DEMO["stim_dims"], record=args.record)
    datamodule = StreamingData(
        data, chunk_size=args.chunk_size, batch_size=args.batch_size, window=args.window
    )
    callbacks: list[Callback] = [
        ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=args.ckpt_every, save_last=True)
    ]
    if args.die_at_step is not None:
        callbacks.append(DieAtStep(args.die_at_step))
    trainer = L.Trainer(
        max_epochs=args.max_epochs,
        accelerator="auto",
        devices=1,
        callbacks=callbacks,
        logger=False,
        default_root_dir=args.out,
        enable_progress_bar=not args.quiet,
        enable_model_summary=not args.quiet,
    )
    ckpt_path = ckpt_dir / "last.ckpt" if args.resume else None
    try:
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    finally:
        datamodule.teardown("fit")  # idempotent; Lightning skips it when fit() fails early
    print(f"trained {trainer.global_step} steps; checkpoints in {ckpt_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
