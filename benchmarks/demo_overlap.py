"""The demo's overlap per buffer tier: its training time against the same steps on a resident batch.

    python -m benchmarks.demo_overlap --device cuda [--tiers host device] [--json PATH]

For each tier: the reference trainer with ``chunkstream demo``'s configuration
(its synthetic dataset, chunk 1,024, batches of 32; ``TrainConfig(buffer=TIER)``,
as ``chunkstream demo --buffer TIER``) for ``--epochs`` epochs on ``--device``.
Its time per batch is the rollout epochs' seconds, less one validation each
(timed once after the run, the device synchronized around it), over their
batches. The bound is the same model, loss and optimizer step on one batch
already on the device, as many times, timed with the device synchronized before
and after. ``ratio`` = streamed / bound: 1.0 is full overlap, the data path
hidden behind the training step; above it, the time the step waited for data.
On the CPU the ratio says how much the data path costs beside the step (no
overlap there: the gather shares the cores).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

TIERS = ("host", "device")


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _dataset(root: Path, timesteps: int, seed: int) -> Path:
    from chunkstream.cli._demo import DEFAULTS, TIME_CHUNK
    from chunkstream.tools import ensure_synthetic

    neurons, stim = DEFAULTS["neurons"], DEFAULTS["stim_dims"]
    ensure_synthetic(root, timesteps=timesteps, neurons=neurons, stim_dims=stim, seed=seed,
                     progress=False, chunks=(TIME_CHUNK, stim, 1))  # fmt: skip
    return root


def measure(data: Path, tier: str, device: str, epochs: int, seed: int) -> dict:
    """One tier's figures: streamed and bound ms per batch, and their ratio."""
    import torch

    from chunkstream.cli._demo import _open
    from chunkstream.train import TrainConfig, Trainer

    config = TrainConfig(chunk_size=1024, batch_size=32, epochs=epochs, device=device,
                         seed=seed, progress=False, tensorboard=False, buffer=tier)  # fmt: skip
    source = _open(data, None)
    try:
        trainer = Trainer(source, config)
        result = trainer.fit()
    finally:
        source.close()
    dev = trainer.device
    _sync(dev)
    began = time.perf_counter()
    trainer.validate()
    _sync(dev)
    val_s = time.perf_counter() - began
    rollout = [r for r in result.history if r.epoch >= config.warmup_epochs]
    batches = sum(r.batches for r in rollout)
    streamed_s = sum(r.seconds - val_s for r in rollout)
    # The bound: the same steps on one batch that stays on the device.
    x = torch.randn(config.batch_size, config.window, trainer.neurons, device=dev)
    s = torch.randn(config.batch_size, config.window, trainer.stim_dims, device=dev)
    _sync(dev)
    began = time.perf_counter()
    for _ in range(batches):
        losses = trainer._losses(x, s, warm=False)
        trainer.optimizer.zero_grad(set_to_none=True)
        losses["loss"].backward()
        trainer.optimizer.step()
    _sync(dev)
    bound_s = time.perf_counter() - began
    return {
        "tier": result.buffer.tier,
        "mix": result.buffer.mix,
        "device": result.device,
        "batches": batches,
        "streamed_ms_per_batch": 1e3 * streamed_s / max(1, batches),
        "bound_ms_per_batch": 1e3 * bound_s / max(1, batches),
        "ratio": streamed_s / max(1e-9, bound_s),
        "validation_s": val_s,
        "val_loss": result.val_loss,
        "loader_device_bytes": result.memory["loader_device"],
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    from chunkstream.cli._demo import DEFAULTS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda, cuda:k or cpu (default cuda)")
    p.add_argument("--tiers", nargs="+", choices=TIERS, default=list(TIERS))
    p.add_argument("--timesteps", type=int, default=DEFAULTS["timesteps"])
    p.add_argument("--epochs", type=int, default=3, help="the first is warm-up (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default="benchmarks/_data/demo-overlap", help="dataset folder")
    p.add_argument("--json", default=None, help="also write the figures here")
    args = p.parse_args(argv)
    if args.epochs < 2:
        p.error("--epochs must be >= 2: the first epoch is warm-up and is not timed")
    if args.timesteps < 2048:
        p.error("--timesteps must be >= 2048 (a training split of a 1,024-step chunk or more)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    data = _dataset(Path(args.data) / f"T{args.timesteps}-seed{args.seed}", args.timesteps,
                    args.seed)  # fmt: skip
    rows = []
    for tier in args.tiers:
        row = measure(data, tier, args.device, args.epochs, args.seed)
        rows.append(row)
        print(json.dumps(row), flush=True)
    for row in rows:
        print(f"{row['tier']:>6} tier on {row['device']}: {row['streamed_ms_per_batch']:.3f} ms "
              f"per batch streamed, {row['bound_ms_per_batch']:.3f} ms on a resident batch: "
              f"{row['ratio']:.3f}x (1.0: full overlap)")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
