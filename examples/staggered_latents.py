"""Staggered acquisition with a learned initial latent per window, trained on the stream.

The users' newer scripts, on ``cs.BatchStream``'s defaults: each neuron is observed
once per ``time_units`` period at its own phase (``0 <= phase_n < time_units``,
drawn once per run, as on a scanning microscope), and instead of an encoder the
model learns one initial latent per period-aligned window of every training
recording, an ``nn.Embedding`` indexed by ``(recording, start // time_units)``.
Both need to know where each window starts, which every dict batch says:
``batch["start"]`` (its first timestep within its recording) and
``batch["recording"]`` (the recording's index in ``Recordings.names``).

* data: a few simulated runs of a small latent linear system driven by a stimulus
  (``--runs`` for training, one more held out), each a ``cs.NumpySource``; the
  training runs as one ``cs.Recordings``;
* training: ``cs.BatchStream(loader, window=W, plan=plan)`` with
  ``align=time_units`` so that every window starts on the period grid; the loss
  compares the model's frames and the data at each neuron's own observation times,
  ``start + phase_n + m * time_units`` (``cs.staggered_observations``);
* validation on the held-out run: the dynamics and decoder frozen, its windows'
  initial latents fitted for a few steps (the run has no trained latents), then
  the staggered loss against that of a model predicting the run's mean;
* resume: a stream restored from a mid-epoch ``state_dict`` yields the same latent
  indices as the uninterrupted epoch from that batch on (asserted).

Run: ``python examples/staggered_latents.py`` (a few seconds on a CPU); it prints
one JSON line. The test suite runs it (tests/test_examples.py).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from torch import nn

import chunkstream as cs

TIME_UNITS = 4
STEPS = 3  # observations m = 0..STEPS of each neuron per window
WINDOW = (STEPS + 1) * TIME_UNITS  # holds every neuron's last observation


def simulate(timesteps: int, neurons: int, stim_dims: int, latent: int, seed: int) -> dict:
    """One run: ``x = C z + noise`` with ``z`` a damped rotation driven by a stimulus."""
    system = np.random.default_rng(0)  # the same network in every run
    theta = system.uniform(0.05, 0.2, latent // 2)
    A = np.zeros((latent, latent))
    for i, th in enumerate(theta):
        c, s = np.cos(th), np.sin(th)
        A[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = 0.99 * np.array([[c, -s], [s, c]])
    B = system.normal(0, 0.3, (latent, stim_dims))
    C = system.normal(0, 1.0, (neurons, latent)) / np.sqrt(latent)
    rng = np.random.default_rng(seed)  # this run's stimulus, initial state and noise
    stim = rng.normal(0, 1, (timesteps, stim_dims))
    z, zs = rng.normal(0, 1, latent), []
    for t in range(timesteps):
        zs.append(z)
        z = A @ z + B @ stim[t] * 0.1
    x = np.asarray(zs) @ C.T + rng.normal(0, 0.05, (timesteps, neurons))
    return {"x": x.astype(np.float32), "stim": stim.astype(np.float32)}


class StaggeredLatents(nn.Module):
    """A bank of initial latents per window, a stimulus-driven evolver, a linear decoder."""

    def __init__(self, windows: int, neurons: int, stim_dims: int, latent: int) -> None:
        super().__init__()
        self.initial = nn.Embedding(windows, latent)
        nn.init.normal_(self.initial.weight, std=0.1)
        self.evolver = nn.Sequential(
            nn.Linear(latent + stim_dims, 64), nn.Tanh(), nn.Linear(64, latent)
        )
        self.decoder = nn.Linear(latent, neurons)

    def frames(self, z0: torch.Tensor, stim: torch.Tensor) -> torch.Tensor:
        """Predicted frames ``(B, W, N)`` from initial latents ``z0`` and the window's stimulus."""
        z, out = z0, []
        for t in range(stim.shape[1]):
            out.append(self.decoder(z))
            z = z + self.evolver(torch.cat([z, stim[:, t]], dim=-1))
        return torch.stack(out, dim=1)


def staggered_loss(pred, x, phases) -> torch.Tensor:
    """MSE at each neuron's own observation times only."""
    observed = cs.staggered_observations(x, phases, TIME_UNITS, STEPS)
    return ((cs.staggered_observations(pred, phases, TIME_UNITS, STEPS) - observed) ** 2).mean()


def bank_rows(lengths: list[int]) -> list[int]:
    """The first row of each recording's latents in the bank: one per period of it."""
    rows, at = [], 0
    for n in lengths:
        rows.append(at)
        at += n // TIME_UNITS
    return [*rows, at]


def latent_index(batch: dict, first: torch.Tensor) -> torch.Tensor:
    """Each window's row in the bank: ``(recording, start // time_units)``."""
    return first[batch["recording"]] + batch["start"] // TIME_UNITS


def stream_over(source, args, plan):
    loader = cs.ChunkLoader(source, args.chunk_size, device="cpu", seed=args.seed)
    # BatchStream's defaults, with windows on the period grid.
    stream = cs.BatchStream(
        loader, window=WINDOW, plan=plan, options=cs.StreamOptions(align=TIME_UNITS)
    )
    return loader, stream


def validate(model, run: dict, phases, args) -> tuple[float, float]:
    """The held-out run: its windows' latents fitted with the rest frozen; the model's
    staggered loss and that of predicting the run's per-neuron mean."""
    x = torch.from_numpy(run["x"])
    stim = torch.from_numpy(run["stim"])
    starts = torch.arange(0, len(x) - WINDOW + 1, TIME_UNITS)
    xs = cs.gather_windows(x, starts, WINDOW)
    ss = cs.gather_windows(stim, starts, WINDOW)
    bank = nn.Embedding(len(starts), model.initial.embedding_dim)
    nn.init.zeros_(bank.weight)
    opt = torch.optim.Adam(bank.parameters(), lr=0.05)
    for p in model.parameters():
        p.requires_grad_(False)
    idx = torch.arange(len(starts))
    for _ in range(args.val_steps):
        loss = staggered_loss(model.frames(bank(idx), ss), xs, phases)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        loss = staggered_loss(model.frames(bank(idx), ss), xs, phases)
        mean = xs.mean(dim=(0, 1), keepdim=True).expand_as(xs)
        baseline = staggered_loss(mean, xs, phases)
    for p in model.parameters():
        p.requires_grad_(True)
    return float(loss), float(baseline)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=2, help="training runs (one more is held out)")
    p.add_argument("--timesteps", type=int, default=768)
    p.add_argument("--neurons", type=int, default=24)
    p.add_argument("--stim-dims", type=int, default=3)
    p.add_argument("--latent", type=int, default=4)
    p.add_argument("--chunk-size", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--val-steps", type=int, default=80)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (a model this small runs fastest on one)",
    )
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)

    # Runs of different lengths: every window's latent lives in its own run's part of the bank.
    lengths = [args.timesteps + 256 * i for i in range(args.runs)]
    runs = [
        simulate(n, args.neurons, args.stim_dims, args.latent, seed=1 + i)
        for i, n in enumerate(lengths)
    ]
    held_out = simulate(args.timesteps // 2, args.neurons, args.stim_dims, args.latent, seed=99)
    phases = torch.randint(0, TIME_UNITS, (args.neurons,))  # drawn once per run
    first = torch.tensor(bank_rows(lengths))

    source = cs.Recordings([cs.NumpySource(r) for r in runs])
    plan = cs.plan_epoch(
        total_timesteps=len(source), chunk_size=args.chunk_size, batch_size=args.batch_size
    )
    model = StaggeredLatents(int(first[-1]), args.neurons, args.stim_dims, args.latent)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    loader, stream = stream_over(source, args, plan)
    with loader:
        for _ in range(args.epochs):
            total = count = 0.0
            for batch in stream:
                z0 = model.initial(latent_index(batch, first))
                loss = staggered_loss(model.frames(z0, batch["stim"]), batch["x"], phases)
                opt.zero_grad()
                loss.backward()
                opt.step()
                total, count = total + float(loss.detach()), count + 1
            losses.append(total / count)
        # Resume: the epoch after the last one, uninterrupted, then cut at `cut` and resumed.
        cut = len(stream) // 2
        state = stream.state_dict()
        whole = [latent_index(b, first).tolist() for b in stream]
        stream.load_state_dict(state)
        epoch = iter(stream)
        head = [latent_index(next(epoch), first).tolist() for _ in range(cut)]
        mid = stream.state_dict()
        epoch.close()
    assert head == whole[:cut]
    loader, stream = stream_over(
        cs.Recordings([cs.NumpySource(r) for r in runs]), args, plan
    )  # a fresh process's objects
    with loader:
        stream.load_state_dict(mid)
        rest = [latent_index(b, first).tolist() for b in stream]
    assert rest == whole[cut:], "a mid-epoch resume must give the same latent indices"

    val, baseline = validate(model, held_out, phases, args)
    print(
        json.dumps(
            {
                "train": losses,
                "val": val,
                "val_baseline": baseline,
                "resumed_batches": len(rest),
                "bank": int(first[-1]),
                "buffer": stream.buffer.describe(),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
