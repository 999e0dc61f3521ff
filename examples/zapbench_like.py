"""Train on a synthetic ZAPBench-shaped dataset, resident and streamed, and compare the runs.

    python examples/zapbench_like.py                          # writes ./zapbench-like, trains
    python examples/zapbench_like.py --timesteps 9000 --neurons 1024 --epochs 5

The dataset has the layout of ZAPBench-like data, each part in its own store:

* ``traces.zarr``: activity ``(T, N)`` in float16, a zarr v3 array written and opened
  through tensorstore. The array holds ``PAD`` dead frames before and after the
  recording, and the spec's index ``transform`` selects the recorded frames;
* ``mask.zarr``: a zarr v2 boolean "observed" mask of the same shape (unobserved
  frames hold 0 in ``traces`` and weigh nothing in the loss);
* ``covariates.npy``: 26 stimulus features per frame (float32, a memmap);
* ``conditions.csv``: 9 stimulus conditions of different lengths (``start,stop,name``).

``cs.JoinSource`` puts the three stores on one time axis; every chunk reads all of
them concurrently. Each condition is cut 70/10/20 into train/val/test
(``cs.split_segments`` with a gap of ``window - 1``, so no window sees two splits).
Frames come in acquisition periods of ``TIME_UNITS`` timesteps, so every window
starts on a period (``StreamOptions(align=TIME_UNITS)``).

The model is the reference :class:`chunkstream.train.LatentDynamics` (encode a frame,
roll a latent forward one period per step driven by the covariates, decode), trained
here by a short loop over ``cs.BatchStream`` rather than by ``chunkstream.train.Trainer``:
the trainer takes neither a compute dtype for float16 fields, nor ``resident=``, nor a
mask, nor a test split. Batches are upcast to float32 in the gather
(``dtype=torch.float32``: the chunks stay float16 on the device), the mask gathers as bool.

It trains twice with the same seed: once with ``resident=True`` (the training
segments are read once and kept on the device) and once streamed (``resident=False``),
with pieced chunks. Both see the same chunks and batches, so their losses agree;
the script prints both runs' losses (overall and per condition, val and test,
evaluated in order with ``sampling="sequential"``) and the GB/s each delivered.
``--json FILE`` also writes the figures (``tests/test_examples.py`` reads them).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

import chunkstream as cs
from chunkstream.train import LatentDynamics

CONDITIONS = {  # ZAPBench's 9 stimulus conditions and their relative lengths here
    "gain": 1.0, "dots": 0.6, "flash": 1.4, "taxis": 0.8, "turning": 1.2,
    "position": 0.7, "open_loop": 1.3, "rotation": 0.9, "dark": 1.1,
}  # fmt: skip
COVARIATES = 26
PAD = 16  # dead frames around the recording in traces.zarr (the transform drops them)
TIME_UNITS = 2  # timesteps per acquisition period: one rollout step
STEPS = 4  # rollout steps per window
WINDOW = TIME_UNITS * STEPS + 1
SPLITS = (0.7, 0.1, 0.2)


# -- the dataset --------------------------------------------------------------------------


def condition_bounds(timesteps: int) -> list[tuple[int, int, str]]:
    """The 9 conditions as consecutive ``(start, stop, name)`` ranges covering ``timesteps``."""
    total = sum(CONDITIONS.values())
    cuts = np.round(np.cumsum([0.0, *CONDITIONS.values()]) / total * timesteps).astype(int)
    bounds = zip(cuts[:-1], cuts[1:], CONDITIONS, strict=True)
    return [(int(a), int(b), name) for a, b, name in bounds]


def synthesize(timesteps: int, neurons: int, seed: int) -> dict[str, np.ndarray]:
    """Activity driven by the covariates through a slow latent system, one regime per condition."""
    rng = np.random.default_rng(seed)
    latent = 8
    drive = rng.standard_normal((timesteps, COVARIATES)).astype(np.float32)
    kernel = np.exp(-np.arange(16) / 4.0)
    covariates = np.stack([np.convolve(drive[:, j], kernel)[:timesteps] for j in range(COVARIATES)],
                          axis=1).astype(np.float32) / 2  # fmt: skip
    mix_in = rng.standard_normal((COVARIATES, latent)) * 0.1
    loading = rng.standard_normal((latent, neurons)) / math.sqrt(latent)
    z = np.zeros(latent)
    zs = np.empty((timesteps, latent))
    for start, stop, _ in condition_bounds(timesteps):  # each condition its own rotation rate
        angle = rng.uniform(0.02, 0.2)
        rot = np.eye(latent) * 0.97
        rot[0, 0] = rot[1, 1] = 0.97 * math.cos(angle)
        rot[0, 1], rot[1, 0] = -0.97 * math.sin(angle), 0.97 * math.sin(angle)
        for t in range(start, stop):
            z = rot @ z + covariates[t] @ mix_in
            zs[t] = z
    traces = np.tanh(zs @ loading) + 0.05 * rng.standard_normal((timesteps, neurons))
    observed = rng.random((timesteps, neurons)) > 0.1
    traces = np.where(observed, traces, 0.0).astype(np.float16)
    return {"traces": traces, "mask": observed, "covariates": covariates}


def write_dataset(out: Path, timesteps: int, neurons: int, seed: int) -> dict:
    """Write the four stores under ``out``; return the tensorstore spec of the traces."""
    import tensorstore as ts
    import zarr

    out.mkdir(parents=True, exist_ok=True)
    data = synthesize(timesteps, neurons, seed)
    base = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(out / "traces.zarr")}}
    grid = {"name": "regular", "configuration": {"chunk_shape": [64, neurons]}}
    meta = {"shape": [timesteps + 2 * PAD, neurons], "data_type": "float16", "chunk_grid": grid,
            "codecs": [{"name": "bytes"}, {"name": "zstd", "configuration": {"level": 1}}]}  # fmt: skip
    store = ts.open({**base, "metadata": meta}, create=True, delete_existing=True).result()
    store[PAD : PAD + timesteps].write(data["traces"]).result()
    mask = zarr.create_array(out / "mask.zarr", shape=data["mask"].shape, dtype="bool",
                             chunks=(64, neurons), zarr_format=2, overwrite=True)  # fmt: skip
    mask[:] = data["mask"]
    np.save(out / "covariates.npy", data["covariates"])
    lines = ["start,stop,name"] + [f"{a},{b},{n}" for a, b, n in condition_bounds(timesteps)]
    (out / "conditions.csv").write_text("\n".join(lines) + "\n")
    # The recorded frames are [PAD, PAD + T) of the array: the transform selects them.
    domain = {"input_inclusive_min": [PAD, 0], "input_exclusive_max": [PAD + timesteps, neurons]}
    return {**base, "transform": domain}


def open_dataset(out: Path, spec: dict) -> cs.JoinSource:
    """The three stores as one source with fields ``traces``, ``mask`` and ``covariates``."""
    return cs.JoinSource({
        "traces": cs.TensorStoreSource(spec),
        "mask": cs.ZarrSource(out / "mask.zarr"),
        "covariates": cs.NumpySource({"covariates": np.load(out / "covariates.npy", mmap_mode="r")}),
    })  # fmt: skip


# -- training and evaluation ------------------------------------------------------------------


def masked_losses(model: LatentDynamics, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``(training loss, rollout loss)``: mean squared errors over the observed frames only."""
    x, m, s = batch["traces"], batch["mask"], batch["covariates"]
    recon_w = m.to(x.dtype)
    recon = ((model.reconstruct(x) - x) ** 2 * recon_w).sum() / recon_w.sum().clamp(min=1)
    pred = model.rollout(x[:, 0], s, STEPS, TIME_UNITS)
    w = m[:, TIME_UNITS::TIME_UNITS].to(x.dtype)
    rollout = ((pred - x[:, TIME_UNITS::TIME_UNITS]) ** 2 * w).sum() / w.sum().clamp(min=1)
    return rollout + 0.1 * recon, rollout


@torch.no_grad()
def evaluate(model, source, segments, args, resident: bool) -> dict[str, float]:
    """Masked rollout MSE per segment: every window starting on a period, read in order."""
    sums: dict[str, list[float]] = {seg.name: [0.0, 0.0] for seg in segments}
    with cs.ChunkLoader(source, args.chunk_size, device=args.device, sampling="sequential", options=cs.LoaderOptions(segments=segments, window=WINDOW, resident=resident)) as loader:  # fmt: skip
        for chunk in loader.epoch():
            x = chunk["traces"]
            for piece in chunk.pieces:  # one segment each; windows never cross a piece
                first = -(-piece.start // TIME_UNITS) * TIME_UNITS  # the first period start
                rows = torch.arange(first - piece.start + piece.offset,
                                    piece.offset + piece.length - WINDOW + 1, TIME_UNITS,
                                    device=x.device)  # fmt: skip
                if rows.numel() == 0:
                    continue
                batch = {name: cs.gather_windows(chunk[name], rows, WINDOW, dtype=torch.float32)
                         for name in chunk}  # fmt: skip
                pred = model.rollout(batch["traces"][:, 0], batch["covariates"], STEPS, TIME_UNITS)
                w = batch["mask"][:, TIME_UNITS::TIME_UNITS].double()
                err = ((pred.double() - batch["traces"][:, TIME_UNITS::TIME_UNITS]) ** 2 * w).sum()
                acc = sums[segments[piece.segment].name]
                acc[0] += float(err)
                acc[1] += float(w.sum())
    return {name: total / count for name, (total, count) in sums.items() if count > 0}


def train(source, splits, args, resident: bool) -> dict:
    """One run: ``args.epochs`` epochs of the training segments, then val and test per condition."""
    torch.manual_seed(args.seed)  # the same initial weights in both runs
    model = LatentDynamics(args.neurons, COVARIATES, latent_dim=16, hidden_dim=64).to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    began = time.perf_counter()
    with cs.ChunkLoader(source, args.chunk_size, device=args.device, sampling="shuffled", seed=args.seed, options=cs.LoaderOptions(pieces=args.pieces, segments=splits["train"], window=WINDOW, resident=resident)) as loader:  # fmt: skip
        stream = cs.BatchStream(loader, window=WINDOW, batch_size=args.batch_size, batches_per_chunk=args.batches_per_chunk, options=cs.StreamOptions(dtype=torch.float32, align=TIME_UNITS))  # fmt: skip
        for _ in range(args.epochs):
            total = torch.zeros((), dtype=torch.float64, device=args.device)
            for batch in stream:
                loss, rollout = masked_losses(model, batch)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                total += rollout.detach()
            losses.append(float(total) / len(stream))  # one host sync per epoch
        seconds = time.perf_counter() - began
        figures = loader.stats.summary()
        mode, reason = loader.mode, loader.mode_reason
    model.eval()
    return {
        "mode": mode, "reason": reason, "train": losses, "seconds": seconds,
        "gb_per_s": figures["gb_per_s"], "bytes": figures["bytes"],
        "val": evaluate(model, source, splits["val"], args, resident),
        "test": evaluate(model, source, splits["test"], args, resident),
    }  # fmt: skip


# -- the report -------------------------------------------------------------------------


def overall(per_segment: dict[str, float]) -> float:
    return sum(per_segment.values()) / len(per_segment)


def report(runs: dict[str, dict]) -> str:
    res, stream = runs["resident"], runs["streaming"]
    lines = [f"{'run':<10}{'mode':<11}{'train, epoch 1':>15}{'last':>9}{'val':>9}{'test':>9}"
             f"{'seconds':>9}{'GB/s':>10}{'MB':>7}"]  # fmt: skip
    for name, r in runs.items():
        lines.append(
            f"{name:<10}{r['mode']:<11}{r['train'][0]:>15.5f}{r['train'][-1]:>9.5f}"
            f"{overall(r['val']):>9.5f}{overall(r['test']):>9.5f}{r['seconds']:>9.2f}"
            f"{r['gb_per_s']:>10.3g}{r['bytes'] / 1e6:>7.1f}"
        )
    lines.append("(losses: masked rollout MSE; val/test: mean over conditions; seconds: training;"
                 " GB/s: chunk bytes delivered over the epochs' time, training included)")  # fmt: skip
    lines.append("")
    lines.append(f"{'condition':<12}{'split':<7}{'resident':>12}{'streaming':>12}")
    for split in ("val", "test"):
        for key in res[split]:
            lines.append(f"{key.split('/')[0]:<12}{split:<7}{res[split][key]:>12.5f}"
                         f"{stream[split][key]:>12.5f}")  # fmt: skip
    same = all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
               for a, b in zip(_figures(res), _figures(stream), strict=True))  # fmt: skip
    lines.append("")
    lines.append(f"resident and streamed losses equal: {'yes' if same else 'NO'}")
    lines.append(f"resident mode: {res['reason']}")
    return "\n".join(lines)


def _figures(run: dict) -> list[float]:
    return [*run["train"], *run["val"].values(), *run["test"].values()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("zapbench-like"), help="dataset folder")
    p.add_argument("--timesteps", type=int, default=4500)
    p.add_argument("--neurons", type=int, default=256)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--chunk-size", type=int, default=512)
    p.add_argument("--pieces", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--batches-per-chunk", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = p.parse_args(argv)
    smallest = min(condition_bounds(args.timesteps), key=lambda c: c[1] - c[0])
    if (smallest[1] - smallest[0] - 2 * (WINDOW - 1)) * SPLITS[1] < WINDOW:
        p.error(f"--timesteps {args.timesteps} leaves condition {smallest[2]!r} a val split "
                f"shorter than one window ({WINDOW}); use at least 2000")  # fmt: skip

    spec = write_dataset(args.out, args.timesteps, args.neurons, args.seed)
    conditions = cs.Segments.read(args.out / "conditions.csv")
    splits = cs.split_segments(conditions, SPLITS, gap=WINDOW - 1)
    with open_dataset(args.out, spec) as source:
        print(f"{len(source)} timesteps; fields "
              + ", ".join(f"{n} {tuple(f.shape)} {f.dtype}" for n, f in source.fields.items())
              + f"; {len(conditions)} conditions cut {SPLITS}")  # fmt: skip
        runs = {name: train(source, splits, args, resident)
                for name, resident in (("resident", True), ("streaming", False))}  # fmt: skip
    print(report(runs))
    if args.json is not None:
        args.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
