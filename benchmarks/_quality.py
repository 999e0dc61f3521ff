"""The quality race: what a chunking costs the model, and what pieces cost the reader.

Batches drawn inside one contiguous chunk come from one stretch of the
recording, so consecutive gradient steps are correlated. This race trains the
reference model (``chunkstream.train``) with the same number of batches and the
same seeds under each chunking and reports the validation loss as a ratio to
i.i.d. sampling of the whole training split:

* ``iid``: the whole training split is one chunk (held in memory), every batch
  uniform over all of its windows;
* ``contiguous``: chunks of ``chunk_size`` contiguous timesteps (``pieces=1``);
* ``pieces=k``: chunks of ``k`` pieces of ``chunk_size // k`` from independent
  places, for ``k`` in :data:`PIECES`;
* ``pieces=k,mix=M``: those chunks, each batch drawn over the last ``M`` chunks
  (``TrainConfig(mix=)``, the consumer's chunk shuffle buffer), for the
  ``(k, M)`` in :data:`MIXES`.

On two datasets: (a) the demo's synthetic data (``chunkstream demo``'s), the
last 10% held out; (b) a recording of :data:`REGIMES` stimulus regimes in
consecutive blocks (``synth --regimes``), each regime a segment whose last 10%
is held out (so validation covers every regime).

The read side: delivered GB/s of contiguous and pieced reads on a compressed
per-column store (chunks of ``(2000, N, 1)``), chunks of 16,000 timesteps, so
pieces of 4,000 and 2,000 cover whole stored chunks and pieces of 1,000 (half a
stored chunk) show the read amplification of pieces shorter than a stored chunk.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

import chunkstream as cs
from chunkstream.tools import ensure_synthetic

from ._stores import DATA_DIR, Geometry, StoreSpec, make_store, store_specs, warm

__all__ = [
    "MIXES",
    "PIECES",
    "REGIMES",
    "QualityReps",
    "quality_markdown",
    "quality_section",
    "quality_targets",
    "run_quality",
]

PIECES = (4, 16, 32)
MIXES = ((32, 16), (128, 16))  # (pieces, mix); the buffer is kept across epochs
REGIMES = 8
READ_CHUNK = 16000  # 8 stored chunks of 2000 steps
READ_PIECES = (4, 8, 16)


@dataclass(frozen=True, kw_only=True)
class QualityReps:
    """How much of the race a mode runs."""

    timesteps: int = 24576  # the demo's
    epochs: int = 6  # the demo's (the first warms up on reconstruction)
    seeds: int = 5
    chunk_size: int = 1024  # the demo's
    hidden_dim: int = 128  # the reference model's (TrainConfig's defaults)
    latent_dim: int = 32
    read_geometry: str = "full"  # "full": the benchmark's store; "quick": a smaller one
    read_chunks: int = 8
    read_runs: int = 3

    @staticmethod
    def full() -> QualityReps:
        return QualityReps()

    @staticmethod
    def quick() -> QualityReps:
        # A third of the demo's timesteps (a third of the batches per epoch), 3 epochs and
        # a smaller model: a few minutes on 2 shared cores, still 5 seeds per arm.
        return QualityReps(timesteps=8192, epochs=3, hidden_dim=64, latent_dim=16,
                           read_geometry="quick", read_chunks=6)  # fmt: skip

    @staticmethod
    def smoke() -> QualityReps:
        return QualityReps(timesteps=2048, epochs=2, seeds=2, chunk_size=256,
                           read_geometry="tiny", read_chunks=2, read_runs=1)  # fmt: skip


def _dataset(root: Path, reps: QualityReps, regimes: int) -> Path:
    out = root / f"quality-T{reps.timesteps}-R{regimes}"
    ensure_synthetic(out, timesteps=reps.timesteps, neurons=128, stim_dims=32,
                     chunks=(32, 32, 1), seed=0, regimes=regimes, progress=False)  # fmt: skip
    return out


def _arms(reps: QualityReps, segments: cs.Segments | None, window: int) -> dict[str, dict]:
    """TrainConfig overrides per arm; ``iid`` is one chunk holding the whole training split."""
    if segments is None:
        iid = {"chunk_size": reps.timesteps, "pieces": 1}
    else:  # every training segment whole, one piece each, in one chunk
        train = cs.split_segments(segments, {"train": 0.9, "val": 0.1}, gap=window - 1)["train"]
        longest = max(len(s) for s in train)
        iid = {"chunk_size": len(train) * longest, "pieces": len(train)}
    arms = {"iid": iid, "contiguous": {"chunk_size": reps.chunk_size, "pieces": 1}}
    for k in PIECES:
        arms[f"pieces={k}"] = {"chunk_size": reps.chunk_size, "pieces": k}
    for k, mix in MIXES:
        arms[f"pieces={k},mix={mix}"] = {"chunk_size": reps.chunk_size, "pieces": k, "mix": mix}
    return arms


def _in_memory(data: Path) -> dict[str, np.ndarray]:
    """The dataset's fields decoded into memory, once per dataset: the race measures the
    model, not the reads (:func:`read_rates` does), and on a shared machine decoding
    every arm's chunks again would dominate its time."""
    from chunkstream.cli._demo import _open
    from chunkstream.train._data import load_range

    zarr_source = _open(data, 32)
    try:
        fields = load_range(zarr_source, 0, len(zarr_source), torch.device("cpu"))
    finally:
        zarr_source.close()
    return {name: t.numpy() for name, t in fields.items()}


def _train(arrays: dict[str, np.ndarray], config) -> dict:
    from chunkstream.train import Trainer

    source = cs.NumpySource(arrays)  # reads only: every run sees the same arrays
    try:
        trainer = Trainer(source, config)
        result = trainer.fit()
        return {"val_loss": result.val_loss, "baseline_val": result.baseline_val,
                "pieces": trainer.pieces, "chunk_size": trainer.chunk_size,
                "batches": [r.batches for r in result.history],
                "val_segments": result.val_segments, "seconds": result.seconds}  # fmt: skip
    finally:
        source.close()


def race_dataset(data: Path, reps: QualityReps, segments: cs.Segments | None,
                 log: Callable[[str], None]) -> dict:  # fmt: skip
    """Every arm at every seed on one dataset; losses and their ratios to ``iid``."""
    from chunkstream.train import TrainConfig

    base = TrainConfig(epochs=reps.epochs, device="cpu", progress=False, tensorboard=False,
                       segments=segments, chunk_size=reps.chunk_size, hidden_dim=reps.hidden_dim,
                       latent_dim=reps.latent_dim, pieces=1, mix=1)  # fmt: skip
    contiguous = cs.plan_epoch(
        segments.timesteps if segments is not None else reps.timesteps - int(reps.timesteps * 0.1),
        reps.chunk_size,
        base.batch_size,
    )
    batches = contiguous.chunks_per_epoch * contiguous.batches_per_chunk
    out: dict = {"batches_per_epoch": batches, "arms": {}}
    arrays = _in_memory(data)
    for name, over in _arms(reps, segments, base.window).items():
        runs = []
        for seed in range(reps.seeds):
            config = TrainConfig(**{**base.to_dict(), **over, "seed": seed,
                                    "batches_per_epoch": batches})  # fmt: skip
            runs.append(_train(arrays, config))
            log(f"quality {data.name} {name} seed {seed}: val {runs[-1]['val_loss']:.5f} "
                f"({runs[-1]['seconds']:.1f} s)")  # fmt: skip
        out["arms"][name] = {"runs": runs}
    iid = [r["val_loss"] for r in out["arms"]["iid"]["runs"]]
    for arm in out["arms"].values():
        # Paired by seed: the same initial weights and batch seeds under each chunking.
        ratios = [r["val_loss"] / i for r, i in zip(arm["runs"], iid, strict=True)]
        arm["ratio"] = {"mean": statistics.fmean(ratios), "min": min(ratios), "max": max(ratios)}
    return out


def _read_spec(reps: QualityReps, root: Path) -> tuple[StoreSpec, Geometry]:
    geo = {
        "full": Geometry.full(),
        "quick": Geometry(timesteps=65536, neurons=256, stim_dims=64, chunk_size=READ_CHUNK),
        "tiny": Geometry.tiny(),
    }[reps.read_geometry]
    spec = next(s for s in store_specs(geo, root) if s.name == "percol-blosc")
    return spec, geo


def read_rates(reps: QualityReps, root: Path, log: Callable[[str], None]) -> dict:
    """Delivered GB/s of contiguous and pieced chunks on the compressed per-column store."""
    from ._measure import _delivered, open_source

    spec, geo = _read_spec(reps, root)
    store = make_store(spec, geo)
    warm(spec)
    chunk = min(READ_CHUNK, geo.timesteps // 2)
    nbytes = chunk * (geo.neurons + geo.stim_dims) * 4
    out: dict = {"store": spec.name, "chunks": list(spec.chunks), "chunk_size": chunk,
                 "decoded_bytes": store["decoded_bytes"], "rates": {}}  # fmt: skip
    src = open_source(spec, geo)
    try:
        # Interleaved by run, so drift on a shared machine hits every arm alike.
        arms = [("contiguous", 1), *((f"pieces={k}", k) for k in READ_PIECES if chunk % k == 0)]
        loaders = {
            name: cs.ChunkLoader(
                src,
                chunk,
                device="cpu",
                sampling="random",
                seed=3,
                options=cs.LoaderOptions(pieces=k),
            )
            for name, k in arms
        }
        try:
            for name, loader in loaders.items():
                _delivered(loader, 2, nbytes)  # warm
                out["rates"][name] = []
                out.setdefault("piece_align", {})[name] = getattr(loader.plan, "piece_align", 1)
            for _ in range(reps.read_runs):
                for name, loader in loaders.items():
                    out["rates"][name].append(_delivered(loader, reps.read_chunks, nbytes))
        finally:
            for loader in loaders.values():
                loader.close()
    finally:
        src.close()
    contiguous = statistics.median(out["rates"]["contiguous"])
    out["ratio"] = {n: statistics.median(v) / contiguous for n, v in out["rates"].items()}
    log(f"quality reads: {', '.join(f'{n} {r:.2f}x' for n, r in out['ratio'].items())}")
    return out


def run_quality(reps: QualityReps, *, data_dir: Path = DATA_DIR,
                log: Callable[[str], None] = lambda s: None) -> dict:  # fmt: skip
    """The whole race: both datasets, then the reads; a JSON-ready dict."""
    began = time.perf_counter()
    res: dict = {"reps": asdict(reps), "pieces": list(PIECES), "regimes": REGIMES,
                 "mixes": [list(m) for m in MIXES]}  # fmt: skip
    demo = _dataset(data_dir, reps, 1)
    res["demo"] = race_dataset(demo, reps, None, log)
    regimes = _dataset(data_dir, reps, REGIMES)
    res["regimes_data"] = race_dataset(
        regimes, reps, cs.Segments.read(regimes / "regimes.csv"), log
    )
    res["reads"] = read_rates(reps, data_dir, log)
    res["seconds"] = time.perf_counter() - began
    return res


def best_pieces(res: dict) -> str:
    """The pieced (or pieced and mixed) arm with the lowest worst-dataset mean ratio."""
    names = [f"pieces={k}" for k in res["pieces"]]
    names += [f"pieces={k},mix={m}" for k, m in res.get("mixes", [])]
    return min(
        names,
        key=lambda n: max(res[d]["arms"][n]["ratio"]["mean"] for d in ("demo", "regimes_data")),
    )


def quality_targets(res: dict) -> list[dict]:
    """The race's targets, in the runner's target format."""
    out = []
    best = best_pieces(res)
    for key, label in (("demo", "demo data"), ("regimes_data", f"{res['regimes']} regimes")):
        arms = res[key]["arms"]
        r = arms[best]["ratio"]
        out.append({
            "what": f"batch correlation, {label}: val loss of {best} over i.i.d. (mean of "
                    f"{len(arms[best]['runs'])} seeds; contiguous "
                    f"{arms['contiguous']['ratio']['mean']:.3f}x)",
            "target": "<= 1.02x",
            "figure": f"{r['mean']:.3f}x ({r['min']:.3f}-{r['max']:.3f})",
            "met": r["mean"] <= 1.02,
        })  # fmt: skip
    reads = res["reads"]
    aligned = [n for n in reads["ratio"] if n != "contiguous"
               and reads["chunk_size"] // int(n.split("=")[1]) % reads["chunks"][0] == 0]  # fmt: skip
    worst = min(aligned, key=lambda n: reads["ratio"][n]) if aligned else None
    if worst is not None:
        out.append({
            "what": f"pieced reads whose pieces cover whole stored chunks ({', '.join(aligned)}), "
                    f"GB/s over contiguous, {reads['store']}",
            "target": ">= 0.95x",
            "figure": f"{reads['ratio'][worst]:.3f}x (worst: {worst})",
            "met": reads["ratio"][worst] >= 0.95,
        })  # fmt: skip
    return out


def quality_markdown(results_dir: Path) -> list[str]:
    """The section from the first results file holding the race (``quality`` first)."""
    from ._engines_report import first_results_with

    res = first_results_with(results_dir, ("quality", "full", "quality-quick", "quick"), "quality")
    if res is None:
        return ["### batch correlation (the quality race)", "", "Not run yet: `python -m "
                "benchmarks.run --only quality` measures it.", ""]  # fmt: skip
    return quality_section({**res["quality"], "command": res.get("command")})


def quality_section(res: dict) -> list[str]:
    """The "batch correlation" table of BENCHMARKS.md."""
    lines = ["### batch correlation (the quality race)", "",
             f"- command: `{res.get('command') or 'python -m benchmarks.run --only quality'}` "
             f"({res['seconds'] / 60:.1f} min; the machine was shared)",
             f"- reference trainer, {res['reps']['epochs']} epochs (the first on reconstruction "
             f"only), {res['reps']['timesteps']} timesteps, chunk_size "
             f"{res['reps']['chunk_size']}, model hidden/latent "
             f"{res['reps'].get('hidden_dim', 128)}/{res['reps'].get('latent_dim', 32)}, "
             f"equal batches per epoch in every arm, seeds "
             f"0-{res['reps']['seeds'] - 1} paired across arms", "",
             "| dataset | arm | batches/epoch | val loss, mean | ratio to i.i.d.: mean | min | max |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for key, label in (("demo", "demo"), ("regimes_data", f"{res['regimes']} regimes")):
        d = res[key]
        for name, arm in d["arms"].items():
            r, losses = arm["ratio"], [x["val_loss"] for x in arm["runs"]]
            lines.append(f"| {label} | {name} | {d['batches_per_epoch']} | "
                         f"{statistics.fmean(losses):.5f} | {r['mean']:.3f} | {r['min']:.3f} | "
                         f"{r['max']:.3f} |")  # fmt: skip
    reads = res["reads"]
    lines += ["", f"Reads: {reads['store']} chunks {tuple(reads['chunks'])}, chunk_size "
              f"{reads['chunk_size']}, delivered GB/s (median of runs) and ratio to contiguous:",
              "", "| chunk | piece starts aligned to | GB/s, median | ratio |", "|---|---|---|---|"]  # fmt: skip
    for name, rates in reads["rates"].items():
        lines.append(f"| {name} | {reads['piece_align'][name]} | "
                     f"{statistics.median(rates):.3f} | {reads['ratio'][name]:.3f} |")  # fmt: skip
    lines += ["", "| target | wanted | figure | met |", "|---|---|---|---|"]
    lines += [f"| {t['what']} | {t['target']} | {t['figure']} | {'yes' if t['met'] else '**no**'} |"
              for t in res.get("targets", quality_targets(res))]  # fmt: skip
    return [*lines, ""]
