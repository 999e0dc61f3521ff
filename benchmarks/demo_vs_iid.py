"""The demo's validation loss against i.i.d. batches on the same data, model and steps.

    python -m benchmarks.demo_vs_iid --timesteps 196608 --seeds 0 1 [--out DIR]

For each seed: ``chunkstream demo --timesteps T --chunk-size 1024 --seed S`` with
everything else default (its ``--json`` result), then the reference trainer on
the same dataset with the demo's configuration except the streaming: the whole
training split in one chunk, every batch drawn uniformly over it (the quality
race's ``iid`` arm), for the same number of batches. Prints one JSON line per
seed and the mean ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path


def _iid(data: Path, seed: int, chunk_size: int) -> float:
    import torch

    from chunkstream.cli._demo import DEFAULTS, _open
    from chunkstream.train import TrainConfig, Trainer

    torch.set_num_threads(1)
    demo = TrainConfig(chunk_size=chunk_size, batch_size=32, epochs=DEFAULTS["epochs"],
                       device="cpu", seed=seed, progress=False, tensorboard=False)  # fmt: skip
    source = _open(data, None)
    try:
        streamed = Trainer(source, demo)
        batches = streamed.plan.chunks_per_epoch * streamed.plan.batches_per_chunk
        config = TrainConfig(**{**demo.to_dict(), "chunk_size": streamed.train_len, "pieces": 1,
                                "mix": 1, "batches_per_epoch": batches})  # fmt: skip
        return Trainer(source, config).fit().val_loss
    finally:
        source.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--timesteps", type=int, default=196608)
    p.add_argument("--chunk-size", type=int, default=1024)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--out", default="benchmarks/_data/demo-vs-iid")
    args = p.parse_args()
    ratios = []
    for seed in args.seeds:
        out = Path(args.out) / f"T{args.timesteps}-seed{seed}"
        cmd = [sys.executable, "-m", "chunkstream", "demo", "--timesteps", str(args.timesteps),
               "--chunk-size", str(args.chunk_size), "--seed", str(seed), "--out", str(out),
               "--no-progress", "--json"]  # fmt: skip
        shown = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        demo = json.loads((out / "result.json").read_text())
        iid = _iid(out / "data", seed, args.chunk_size)
        ratio = demo["val_loss"] / iid
        ratios.append(ratio)
        lines = [ln for ln in shown.splitlines() if "mixed over" in ln or "host memory" in ln]
        print(json.dumps({"seed": seed, "demo_val": demo["val_loss"], "iid_val": iid,
                          "ratio": ratio, "demo": lines, "seconds": demo["seconds"]}),
              flush=True)  # fmt: skip
    print(json.dumps({"mean_ratio": statistics.fmean(ratios), "ratios": ratios}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
