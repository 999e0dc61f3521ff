"""From the drop-in to the defaults: the merged script's loop, then the same with BatchStream.

The merged training script streams with ``RandomChunkLoader`` and draws every
batch inside the current chunk (``sample_batch_within_chunk``): consecutive
gradient steps share one stretch of the recording. ``chunkstream.compat`` keeps
exactly that, as a drop-in must. The way up is a few lines (the README's
"From the drop-in to better batches"): a ``ChunkLoader`` over the same data and a
``BatchStream`` with its defaults, which draws each batch over the largest share
of the training split the job's memory allows.

This script trains the same model (same initial weights, optimizer and number
of steps) with both loops on a FlyVis-like recording of several stimulus
regimes (``chunkstream synth --regimes``), each regime's last fifth held out
for validation, and prints one JSON line per epoch and loop::

    python examples/migrate_compat.py --out /tmp/migrate [--timesteps 65536 --epochs 4]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import zarr
from torch import nn

import chunkstream as cs
from chunkstream.compat import (
    RandomChunkLoader,
    calculate_chunk_params,
    sample_batch_within_chunk,
)
from chunkstream.tools import ensure_synthetic

STEPS = 4  # rollout steps: a window is STEPS + 1 frames
WINDOW = STEPS + 1


class Rollout(nn.Module):
    """x[t+1] = x[t] + f(x[t], s[t]), rolled out for ``STEPS`` steps from each window's start."""

    def __init__(self, neurons: int, stim: int, hidden: int = 64) -> None:
        super().__init__()
        self.f = nn.Sequential(
            nn.Linear(neurons + stim, hidden), nn.Tanh(), nn.Linear(hidden, neurons)
        )

    def loss(
        self, x: torch.Tensor, s: torch.Tensor
    ) -> torch.Tensor:  # (B, WINDOW, N), (B, WINDOW, S)
        state, total = x[:, 0], 0.0
        for k in range(STEPS):
            state = state + self.f(torch.cat([state, s[:, k]], dim=1))
            total = total + torch.mean((state - x[:, k + 1]) ** 2)
        return total / STEPS


def split(data: Path, regimes: int, stim_dims: int) -> tuple[dict, dict]:
    """Each regime's first 80% for training (concatenated), its last 20% for validation."""
    stored = np.asarray(zarr.open_array(str(data / "timeseries.zarr"), mode="r")[:])
    voltage = np.ascontiguousarray(stored[:, :, 0])  # the FlyVis layout's dynamic columns
    stimulus = np.ascontiguousarray(stored[:, :stim_dims, 1])
    bounds = [tuple(map(int, line.split(",")[:2]))
              for line in (data / "regimes.csv").read_text().splitlines()[1:]]  # fmt: skip
    cut = [(a, a + (b - a) * 4 // 5, b) for a, b in bounds[:regimes]]
    train = {"voltage": np.concatenate([voltage[a:m] for a, m, _ in cut]),
             "stimulus": np.concatenate([stimulus[a:m] for a, m, _ in cut])}  # fmt: skip
    val = {
        "voltage": [voltage[m:b] for _, m, b in cut],
        "stimulus": [stimulus[m:b] for _, m, b in cut],
    }
    return train, val


def validate(model: Rollout, val: dict, count: int = 256) -> float:
    """Mean rollout loss over ``count`` evenly spaced windows of every held-out range."""
    losses = []
    with torch.no_grad():
        for v, s in zip(val["voltage"], val["stimulus"], strict=True):
            starts = torch.linspace(0, len(v) - WINDOW, count).long()
            idx = starts[:, None] + torch.arange(WINDOW)
            losses.append(float(model.loss(torch.from_numpy(v)[idx], torch.from_numpy(s)[idx])))
    return float(np.mean(losses))


def merged_loop(train: dict, val: dict, args, model: Rollout, report) -> None:
    """The merged script's loop on the drop-in: batches drawn inside the current chunk."""
    total = len(train["voltage"])

    def load_fn(start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        return train["voltage"][start:end], train["stimulus"][start:end]

    chunks_per_epoch, batches_per_chunk, _ = calculate_chunk_params(
        total, args.chunk_size, args.batch_size, 1
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loader = RandomChunkLoader(load_fn, total, args.chunk_size, device="cpu", seed=args.seed)
    empty = torch.empty(0, dtype=torch.long)
    for epoch in range(args.epochs):
        loader.start_epoch(num_chunks=chunks_per_epoch)
        for _ in range(chunks_per_epoch):
            _start, chunk_data, chunk_stim = loader.get_next_chunk()
            for _ in range(batches_per_chunk):
                starts, _, _ = sample_batch_within_chunk(
                    chunk_data, chunk_stim, empty, empty, args.batch_size, WINDOW, 0, "cpu"
                )
                idx = starts[:, None] + torch.arange(WINDOW)
                loss = model.loss(chunk_data[idx], chunk_stim[idx])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        report("compat", epoch, validate(model, val), chunks_per_epoch * batches_per_chunk)
    loader.cleanup()


def batchstream_loop(train: dict, val: dict, args, model: Rollout, report) -> None:
    """The same training with a ChunkLoader and a BatchStream with its defaults."""
    source = cs.NumpySource(train)
    plan = cs.plan_epoch(
        total_timesteps=len(source), chunk_size=args.chunk_size, batch_size=args.batch_size
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    with cs.ChunkLoader(source, args.chunk_size, device="cpu", seed=args.seed) as loader:
        batches = cs.BatchStream(loader, window=WINDOW, plan=plan, options=cs.StreamOptions(batches_per_epoch=plan.chunks_per_epoch * plan.batches_per_chunk))  # fmt: skip
        for epoch in range(args.epochs):
            for batch in batches:
                loss = model.loss(batch["voltage"], batch["stimulus"])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            report(
                "batchstream", epoch, validate(model, val), len(batches), batches.buffer.describe()
            )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="chunkstream-migrate")
    p.add_argument("--timesteps", type=int, default=32768)
    p.add_argument("--neurons", type=int, default=64)
    p.add_argument("--stim-dims", type=int, default=16)
    p.add_argument("--regimes", type=int, default=8)
    p.add_argument("--chunk-size", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # a small model: intra-op threads only contend
    data = Path(args.out) / "data"
    ensure_synthetic(data, timesteps=args.timesteps, neurons=args.neurons, stim_dims=args.stim_dims,
                     regimes=args.regimes, chunks=(256, args.stim_dims, 1), seed=args.seed,
                     progress=False)  # fmt: skip
    train, val = split(data, args.regimes, args.stim_dims)

    def report(loop: str, epoch: int, val_loss: float, steps: int, buffer: str = "") -> None:
        line = {"loop": loop, "epoch": epoch, "val_loss": val_loss, "steps": steps}
        print(json.dumps({**line, "buffer": buffer} if buffer else line), flush=True)

    for loop in (merged_loop, batchstream_loop):
        torch.manual_seed(args.seed)  # the same initial weights for both loops
        model = Rollout(args.neurons, args.stim_dims)
        loop(train, val, args, model, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
