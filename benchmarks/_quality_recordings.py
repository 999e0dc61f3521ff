"""The quality race on several recordings: 4 regimes in 4 separate stores, as one dataset.

Issue 44: the defaults' shuffle buffer holds chunks of several recordings, so
consecutive batches mix them. Here a synthetic recording of :data:`RECORDINGS`
stimulus regimes (``synth --regimes``, the regimes of
:mod:`benchmarks._quality_scale`) is cut at its regime bounds and each block
written to its own FlyVis-layout store (``rec<i>/timeseries.zarr``); the race
opens the four stores, decodes them into memory (it measures the model, not
the reads) and trains the reference model on ``cs.Recordings`` of them:

* ``iid``: every recording's whole training range in one resident chunk (one
  piece each), every batch drawn uniformly over all of their window starts;
* ``contiguous``: chunks of ``chunk_size`` contiguous timesteps, no buffer
  (how hard the dataset is for a loader that does not mix);
* ``defaults``: ``TrainConfig``'s defaults (``pieces="auto"``, ``mix="auto"``),
  with the host memory capped (``CHUNKSTREAM_HOST_MEMORY``) so that the buffer
  holds at most :data:`~benchmarks._quality_scale.TARGET_SHARE` of the split,
  as :mod:`benchmarks._quality_scale`'s capped arm (uncapped, the buffer would
  hold the whole split: i.i.d. by construction).

Each recording's last 10% is held out (the trainer's split for a
``Recordings``) and validated per recording; every arm trains the same number
of batches at the same seeds, and the race reports the validation loss as a
ratio to i.i.d. (mean, spread over seeds, and the worst recording).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

import chunkstream as cs
from chunkstream import flyvis
from chunkstream.tools import ensure_synthetic

from ._quality_scale import TARGET_RATIO, TARGET_SHARE, ScaleReps, _cap_for, _host_cap
from ._stores import DATA_DIR

__all__ = ["RECORDINGS", "recordings_section", "recordings_targets", "run_quality_recordings"]

RECORDINGS = 4


def _stores(root: Path, reps: ScaleReps) -> list[Path]:
    """The four run directories (written once): each regime block in its own store."""
    out = root / f"quality-recordings-T{reps.timesteps}-N{reps.neurons}-S{reps.stim_dims}"
    chunks = (min(4096, reps.timesteps), reps.stim_dims, 1)
    whole = out / "whole"
    ensure_synthetic(
        whole,
        timesteps=reps.timesteps,
        neurons=reps.neurons,
        stim_dims=reps.stim_dims,
        chunks=chunks,
        seed=0,
        regimes=RECORDINGS,
        progress=False,
    )
    regimes = cs.Segments.read(whole / "regimes.csv")
    runs = [out / f"rec{i}" for i in range(RECORDINGS)]
    stamp = out / "split.done"
    if not stamp.exists():
        import zarr

        series = zarr.open_array(str(whole / "timeseries.zarr"), mode="r")
        for run, seg in zip(runs, regimes, strict=True):
            run.mkdir(parents=True, exist_ok=True)
            block = np.asarray(series[seg.start : seg.stop])
            flyvis.write_array(run / "timeseries.zarr", block, (min(4096, len(seg)), *chunks[1:]))
        stamp.write_text("ok\n")
    return runs


def _in_memory(runs: list[Path], stim_dims: int) -> cs.Recordings:
    """The four stores opened (the demo's FlyVis fields), decoded into memory once."""
    from chunkstream.cli._demo import _open
    from chunkstream.train._data import load_range

    parts = []
    for run in runs:
        source = _open(run, stim_dims)
        try:
            fields = load_range(source, 0, len(source), torch.device("cpu"))
        finally:
            source.close()
        parts.append(cs.NumpySource({k: t.numpy() for k, t in fields.items()}))
    return cs.Recordings(parts, names=[r.name for r in runs])


def _arms(reps: ScaleReps, train_ranges: list[int]) -> dict[str, dict]:
    shortest = min(train_ranges)
    return {
        "iid": {"chunk_size": len(train_ranges) * shortest, "pieces": len(train_ranges), "mix": 1},
        "contiguous": {"chunk_size": reps.chunk_size, "pieces": 1, "mix": 1},
        "defaults": {
            "chunk_size": reps.chunk_size,
            "pieces": "auto",
            "mix": "auto",
            "cap_share": TARGET_SHARE,
        },
    }


def _train(recs: cs.Recordings, config, cap_share: float | None) -> dict:
    from chunkstream.train import Trainer

    cap = None if cap_share is None else _cap_for(Trainer(recs, config), cap_share)
    with _host_cap(cap):
        trainer = Trainer(recs, config)
    result = trainer.fit()
    return {
        "val_loss": result.val_loss,
        "val_segments": result.val_segments,
        "pieces": trainer.pieces,
        "mix": trainer.mix,
        "share": trainer.buffer.split_share,
        "batches": sum(r.batches for r in result.history),
        "seconds": result.seconds,
        "host_cap": cap,
    }


def run_quality_recordings(
    reps: ScaleReps,
    *,
    data_dir: Path = DATA_DIR,
    log: Callable[[str], None] = lambda s: None,
) -> dict:
    """The race (module docs); a JSON-ready dict."""
    from chunkstream.train import TrainConfig
    from chunkstream.train._heldout import recordings_config, split_source

    began, threads = time.perf_counter(), torch.get_num_threads()
    torch.set_num_threads(1)  # a small model: intra-op threads only contend here
    try:
        recs = _in_memory(_stores(data_dir, reps), reps.stim_dims)
        base = TrainConfig(
            epochs=reps.epochs,
            device="cpu",
            progress=False,
            tensorboard=False,
            chunk_size=reps.chunk_size,
            hidden_dim=reps.hidden_dim,
            latent_dim=reps.latent_dim,
            pieces=1,
            mix=1,
        )
        split = split_source(recordings_config(base, recs), len(recs))
        plan = cs.plan_epoch(split.train_len, reps.chunk_size, base.batch_size)
        batches = plan.chunks_per_epoch * plan.batches_per_chunk
        arms = _arms(reps, [len(s) for s in split.train_segments])
        res: dict = {
            "reps": asdict(reps),
            "recordings": list(recs.names),
            "lengths": list(recs.lengths),
            "train_len": split.train_len,
            "batches_per_epoch": batches,
            "target": TARGET_RATIO,
            "arms": {n: {"config": a, "runs": []} for n, a in arms.items()},
        }
        for seed in range(reps.seeds):
            for name, arm in res["arms"].items():
                over = {k: v for k, v in arm["config"].items() if k != "cap_share"}
                config = TrainConfig(
                    **{**base.to_dict(), **over, "seed": seed, "batches_per_epoch": batches}
                )
                run = _train(recs, config, arm["config"].get("cap_share"))
                arm["runs"].append(run)
                log(
                    f"quality on recordings: {name} seed {seed}: val {run['val_loss']:.5f} "
                    f"(share {run['share']:.1%}, {run['seconds']:.1f} s)"
                )
        _summarize(res)
        res["seconds"] = time.perf_counter() - began
        return res
    finally:
        torch.set_num_threads(threads)


def _summarize(res: dict) -> None:
    iid = res["arms"]["iid"]["runs"]
    for arm in res["arms"].values():
        ratios = [r["val_loss"] / i["val_loss"] for r, i in zip(arm["runs"], iid, strict=True)]
        arm["ratio"] = {
            "mean": statistics.fmean(ratios),
            "min": min(ratios),
            "max": max(ratios),
            "std": statistics.stdev(ratios) if len(ratios) > 1 else 0.0,
            "per_seed": ratios,
        }
        arm["recording_ratio"] = {
            n: statistics.fmean(
                r["val_segments"][n] / i["val_segments"][n]
                for r, i in zip(arm["runs"], iid, strict=True)
            )
            for n in sorted(arm["runs"][0]["val_segments"])
        }


def recordings_targets(res: dict) -> list[dict]:
    r = res["arms"]["defaults"]["ratio"]
    held = statistics.fmean(run["share"] for run in res["arms"]["defaults"]["runs"])
    return [
        {
            "what": f"quality on {RECORDINGS} recordings in separate stores: val loss with the "
            f"defaults (buffer capped at {TARGET_SHARE:.0%} of the split, held {held:.1%}) "
            f"over i.i.d. (mean of {len(r['per_seed'])} seeds)",
            "target": f"<= {TARGET_RATIO}x",
            "figure": f"{r['mean']:.3f}x ({r['min']:.3f}-{r['max']:.3f})",
            "met": r["mean"] <= TARGET_RATIO,
        }
    ]


def recordings_section(res: dict, command: str) -> list[str]:
    """The BENCHMARKS.md table."""
    r = res["reps"]
    lines = [
        f"- command: `{command}` ({res['seconds'] / 60:.0f} min)",
        f"- {RECORDINGS} recordings ({', '.join(res['recordings'])}, "
        f"{'/'.join(map(str, res['lengths']))} timesteps; one synthetic regime each, "
        f"N={r['neurons']}, stimulus {r['stim_dims']}) in separate zarr stores, streamed as "
        f"one `cs.Recordings`; the last 10% of each held out and validated per recording; "
        f"{r['epochs']} epochs, chunk_size {r['chunk_size']}, hidden/latent "
        f"{r['hidden_dim']}/{r['latent_dim']}, {res['batches_per_epoch']} batches per epoch "
        f"in every arm, seeds 0-{r['seeds'] - 1} paired",
        "",
        "| arm | pieces | mix | buffer share | ratio to i.i.d.: mean | std | min | max | "
        "per seed | worst recording |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, arm in res["arms"].items():
        q, run = arm["ratio"], arm["runs"][0]
        worst = max(arm["recording_ratio"].items(), key=lambda kv: kv[1])
        share = statistics.fmean(x["share"] for x in arm["runs"])
        lines.append(
            f"| {name} | {run['pieces']} | {run['mix']} | {share:.1%} | {q['mean']:.3f} | "
            f"{q['std']:.3f} | {q['min']:.3f} | {q['max']:.3f} | "
            f"{', '.join(f'{x:.3f}' for x in q['per_seed'])} | {worst[1]:.3f} "
            f"({worst[0].split('/')[0]}) |"
        )
    lines += ["", "| target | wanted | figure | met |", "|---|---|---|---|"]
    lines += [
        f"| {t['what']} | {t['target']} | {t['figure']} | {'yes' if t['met'] else '**no**'} |"
        for t in recordings_targets(res)
    ]
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=("full", "shared", "quick", "smoke"), default="quick")
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    reps = getattr(ScaleReps, args.preset)()
    if args.seeds is not None:
        reps = ScaleReps(**{**asdict(reps), "seeds": args.seeds})
    res = run_quality_recordings(reps, log=lambda s: print(s, flush=True))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    import sys

    given = sys.argv[1:] if argv is None else argv
    command = "python -m benchmarks._quality_recordings " + " ".join(given)
    print("\n".join(recordings_section(res, command.strip())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
