"""The quality race at the users' scale: the shuffle buffer as a share of the training split.

:mod:`benchmarks._quality` runs where a buffer of 16 chunks holds the whole
training split, so every batch is drawn over all of it: i.i.d. by construction.
Here the split is long (the full mode: 196,608 timesteps, a training split
about 11x the 16-chunk buffer) and every arm is described by the share of the
split the buffer holds, ``mix * chunk_size / split``. The reference model
(``chunkstream.train``) trains with the same number of batches and the same
seeds (paired) in every arm, and the race reports the validation loss as a
ratio to i.i.d.:

* ``iid``: the whole training split in one resident chunk, every batch drawn
  uniformly over all of its window starts;
* ``contiguous``: chunks of ``chunk_size`` contiguous timesteps, no buffer
  (``pieces=1, mix=1``);
* ``pieces=k``: chunks of ``k`` pieces from independent places, no buffer;
* ``buffer <share>``: contiguous chunks, each batch drawn over the last ``mix``
  chunks (``TrainConfig(mix=)``, the consumer's chunk shuffle buffer, kept
  across epochs), ``mix`` chosen so that the buffer holds :data:`SHARES` of
  the split;
* ``pieces=k + buffer <share>``: the same buffer of pieced chunks, at
  :data:`PIECED_SHARES` (what the trainer's default ``pieces="auto"`` streams);
* ``defaults``: ``TrainConfig``'s defaults (``pieces="auto"``, ``mix="auto"``:
  the library's one policy, :mod:`chunkstream._memory._defaults`), sized from
  the host memory the job may use (here, the whole split);
* ``defaults, 25% cap``: the same with the host memory capped
  (``CHUNKSTREAM_HOST_MEMORY``) so that ``mix="auto"`` holds at most
  :data:`TARGET_SHARE` of the split, as on a job whose memory limit is short.

``run_quality_scale(arms=...)`` (``benchmarks.run --arms``) runs only the
arms named (``iid`` always, the ratios' denominator).

The buffer's tier (device or host memory) does not change which windows are
drawn, so the race holds for either.

On two datasets: stationary synthetic data (``synth``), the last 10% held out;
and a recording of :data:`REGIMES` stimulus regimes in consecutive blocks
(``synth --regimes``), each regime cut 70/10/20 into train/validation/test
(:func:`chunkstream.split_segments`, ``window - 1`` steps between them),
validated per regime; the test ranges give a second, untouched figure.

Runs go seed by seed (every arm of both datasets at seed 0, then seed 1, ...),
so a run stopped early still holds complete, paired seeds; ``progress``
receives the results after each of them.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

import chunkstream as cs
from chunkstream.tools import ensure_synthetic

from ._stores import DATA_DIR

__all__ = [
    "PIECED_SHARES",
    "REGIMES",
    "SHARES",
    "ScaleReps",
    "first_scale_results",
    "plot_quality_scale",
    "quality_scale_markdown",
    "quality_scale_section",
    "quality_scale_targets",
    "run_quality_scale",
]

SHARES = (0.02, 0.10, 0.25, 0.50, 1.0)  # of the training split, held by the buffer
PIECED_SHARES = (0.10, 0.25)  # the buffer of pieced chunks
REGIMES = 8
TARGET_SHARE = 0.25
TARGET_RATIO = 1.02
DATASETS = (("stationary", "stationary"), ("regimes", f"{REGIMES} regimes"))
IMAGE = Path(__file__).resolve().parent.parent / "docs" / "img" / "quality_scale.png"


@dataclass(frozen=True, kw_only=True)
class ScaleReps:
    """How much of the race a mode runs."""

    timesteps: int = 196608  # the example: 8x the demo's
    neurons: int = 128
    stim_dims: int = 32
    epochs: int = 6  # the demo's (the first warms up on reconstruction)
    seeds: int = 5
    chunk_size: int = 1024  # the demo's
    pieces: int = 32  # the pieces-only arm's
    hidden_dim: int = 128  # the reference model's (TrainConfig's defaults)
    latent_dim: int = 32

    @staticmethod
    def full() -> ScaleReps:
        return ScaleReps()

    @staticmethod
    def shared() -> ScaleReps:
        # The full split and chunking with 2 epochs (the warm-up, then one on the rollout:
        # still more rollout batches than the demo's whole run) and the smaller model: what
        # 2 heavily shared cores finish in under an hour.
        return ScaleReps(epochs=2, hidden_dim=64, latent_dim=16)

    @staticmethod
    def quick() -> ScaleReps:
        # A sixth of the timesteps, fewer neurons and a smaller model: minutes on 2 cores,
        # 3 seeds; the split is still ~35 chunks, so every share is a different buffer.
        return ScaleReps(timesteps=40960, neurons=64, epochs=3, seeds=3, hidden_dim=64,
                         latent_dim=16)  # fmt: skip

    @staticmethod
    def smoke() -> ScaleReps:
        return ScaleReps(timesteps=6144, neurons=16, stim_dims=8, epochs=2, seeds=2,
                         chunk_size=256, pieces=4, hidden_dim=16, latent_dim=8)  # fmt: skip


def _dataset(root: Path, reps: ScaleReps, regimes: int) -> Path:
    out = root / f"quality-scale-T{reps.timesteps}-N{reps.neurons}-S{reps.stim_dims}-R{regimes}"
    # Column chunks as wide as the stimulus, so neither field decodes columns it drops.
    chunks = (min(4096, reps.timesteps), reps.stim_dims, 1)
    ensure_synthetic(out, timesteps=reps.timesteps, neurons=reps.neurons,
                     stim_dims=reps.stim_dims, chunks=chunks, seed=0, regimes=regimes,
                     progress=False)  # fmt: skip
    return out


def _in_memory(data: Path, stim_dims: int) -> dict[str, np.ndarray]:
    """The dataset's fields decoded into memory once: the race measures the model."""
    from chunkstream.cli._demo import _open
    from chunkstream.train._data import load_range

    source = _open(data, stim_dims)
    try:
        fields = load_range(source, 0, len(source), torch.device("cpu"))
    finally:
        source.close()
    return {name: t.numpy() for name, t in fields.items()}


@dataclass(frozen=True)
class _Split:
    """What the trainer streams and what the race evaluates, for one dataset."""

    segments: cs.Segments | None  # the trainer's segments (train + gap + val per regime)
    val_fraction: float
    train_len: int
    train_pieces: int  # training ranges (1 without segments)
    shortest: int  # the shortest training range
    test: list[tuple[str, int, int]]  # held-out test ranges, evaluated after training


def _split(total: int, regimes: cs.Segments | None, window: int) -> _Split:
    """Stationary: the last 10% held out. Regimes: each cut 70/10/20 by ``split_segments``;
    the trainer gets each regime's train and validation ranges (and the gap between them)
    as one segment, with the ``val_fraction`` that reproduces the cut (checked)."""
    if regimes is None:
        split = cs.plans.held_out_split(total, 0.1, window)
        return _Split(None, 0.1, split.train_len, 1, split.train_len, [])
    cut = cs.split_segments(regimes, (0.7, 0.1, 0.2), gap=window - 1)
    train, val = list(cut["train"]), list(cut["val"])
    segments = cs.Segments(
        [(t.start, v.stop, t.name.split("/")[0]) for t, v in zip(train, val, strict=True)]
    )
    fraction = len(val[0]) / (len(train[0]) + len(val[0]))
    held = cs.plans.held_out_split(total, fraction, window, segments)
    got = [(s.start, s.stop) for s in held.train_segments]
    if got != [(s.start, s.stop) for s in train] or [r[1:] for r in held.val_ranges] != [
        (s.start, s.stop) for s in val
    ]:
        raise RuntimeError(f"the trainer's split {got} is not split_segments' 70/10/20 cut")
    test = [(s.name.split("/")[0], s.start, s.stop) for s in cut["test"]]
    return _Split(segments, fraction, held.train_segments.timesteps, len(train),
                  min(len(s) for s in train), test)  # fmt: skip


def buffer_mix(share: float, train_len: int, chunk_size: int, chunks: int) -> int:
    """Chunks a buffer holding ``share`` of a ``train_len`` split needs (1 to ``chunks``)."""
    return max(1, min(chunks, round(share * train_len / chunk_size)))


DEFAULTS_ARM = "defaults"
CAPPED_ARM = f"defaults, {TARGET_SHARE:.0%} cap"


def _arms(reps: ScaleReps, split: _Split, chunks: int) -> dict[str, dict]:
    """TrainConfig overrides per arm (module docs)."""
    if split.segments is None:
        iid = {"chunk_size": split.train_len, "pieces": 1, "mix": 1}
    else:  # every training range in one chunk, one piece each
        iid = {"chunk_size": split.train_pieces * split.shortest, "pieces": split.train_pieces,
               "mix": 1}  # fmt: skip
    arms = {
        "iid": iid,
        "contiguous": {"chunk_size": reps.chunk_size, "pieces": 1, "mix": 1},
        f"pieces={reps.pieces}": {"chunk_size": reps.chunk_size, "pieces": reps.pieces, "mix": 1},
    }
    for share in SHARES:
        mix = buffer_mix(share, split.train_len, reps.chunk_size, chunks)
        arms[f"buffer {share:.0%}"] = {"chunk_size": reps.chunk_size, "pieces": 1, "mix": mix}
    for share in PIECED_SHARES:
        mix = buffer_mix(share, split.train_len, reps.chunk_size, chunks)
        arms[f"pieces={reps.pieces} + buffer {share:.0%}"] = {
            "chunk_size": reps.chunk_size, "pieces": reps.pieces, "mix": mix}  # fmt: skip
    arms[DEFAULTS_ARM] = {"chunk_size": reps.chunk_size, "pieces": "auto", "mix": "auto"}
    arms[CAPPED_ARM] = {**arms[DEFAULTS_ARM], "cap_share": TARGET_SHARE}
    return arms


@contextmanager
def _host_cap(nbytes: int | None):
    """``CHUNKSTREAM_HOST_MEMORY`` set to ``nbytes`` while the trainer sizes its buffer."""
    from chunkstream._memory import ENV_HOST_MEMORY

    old = os.environ.get(ENV_HOST_MEMORY)
    if nbytes is not None:
        os.environ[ENV_HOST_MEMORY] = str(int(nbytes))
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV_HOST_MEMORY, None)
        else:
            os.environ[ENV_HOST_MEMORY] = old


def _cap_for(trainer, share: float) -> int:
    """Host memory under which ``mix="auto"`` holds ``share`` of the split at most: the
    policy gives the buffer ``HOST_SHARE`` of what it leaves beside the loader's arena."""
    from chunkstream._memory import HOST_SHARE

    chunk = trainer._mixer_chunk_bytes()
    pass_chunks = max(1, trainer.plan.chunks_per_epoch // trainer.config.passes_per_epoch)
    held = max(1, math.floor(share * pass_chunks))
    return math.ceil((held * chunk + chunk // 2) / HOST_SHARE) + trainer._loader_nbytes()


def _test_losses(trainer, arrays: dict[str, np.ndarray], test: list, config) -> dict[str, float]:
    """The trained model's rollout MSE on each test range, and ``"all"`` over them."""
    from chunkstream.train._heldout import evaluate

    window, parts = config.window, []
    for name, start, stop in test:
        fields = {
            k: torch.from_numpy(np.ascontiguousarray(v[start:stop])) for k, v in arrays.items()
        }
        stride = max(1, (stop - start - window + 1) // 64)
        parts.append((name, fields, torch.arange(0, stop - start - window + 1, stride)))
    sums = evaluate(trainer.model, parts, trainer.moments.mean, config, trainer.neurons)
    out = {name: float(row[0] / row[2]) for (name, _, _), row in zip(test, sums, strict=True)}
    out["all"] = float(sums[:, 0].sum() / sums[:, 2].sum())
    return out


def _train(arrays: dict[str, np.ndarray], config, test: list, cap_share: float | None) -> dict:
    from chunkstream.train import Trainer

    source = cs.NumpySource(arrays)  # reads only: every run sees the same arrays
    try:
        cap = None if cap_share is None else _cap_for(Trainer(source, config), cap_share)
        with _host_cap(cap):
            trainer = Trainer(source, config)
        result = trainer.fit()
        out = {"val_loss": result.val_loss, "baseline_val": result.baseline_val,
               "val_segments": result.val_segments, "pieces": trainer.pieces,
               "chunk_size": trainer.chunk_size, "mix": trainer.mix,
               "batches": sum(r.batches for r in result.history), "seconds": result.seconds,
               "buffer": trainer.buffer.describe(), "share": trainer.buffer.split_share,
               "host_cap": cap}  # fmt: skip
        if test:
            out["test"] = _test_losses(trainer, arrays, test, config)
        return out
    finally:
        source.close()


def _summary(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0, "n": len(values)}  # fmt: skip


def summarize(d: dict) -> None:
    """Each arm's ratios to ``iid``, paired by seed, over the seeds every arm has run."""
    arms = d["arms"]
    seeds = min(len(a["runs"]) for a in arms.values())
    iid = arms["iid"]["runs"][:seeds]
    for arm in arms.values():
        runs = arm["runs"][:seeds]
        arm["ratio"] = _summary(
            [r["val_loss"] / i["val_loss"] for r, i in zip(runs, iid, strict=True)]
        )
        names = sorted(runs[0]["val_segments"]) if len(runs[0]["val_segments"]) > 1 else []
        arm["segment_ratio"] = {
            n: statistics.fmean(r["val_segments"][n] / i["val_segments"][n] for r, i in zip(runs, iid, strict=True))
            for n in names
        }  # fmt: skip
        if "test" in runs[0]:
            arm["test_ratio"] = _summary([r["test"]["all"] / i["test"]["all"]
                                          for r, i in zip(runs, iid, strict=True)])  # fmt: skip
    d["seeds_done"] = seeds


def run_quality_scale(
    reps: ScaleReps,
    *,
    data_dir: Path = DATA_DIR,
    log: Callable[[str], None] = lambda s: None,
    progress: Callable[[dict], None] | None = None,
    arms: tuple[str, ...] | None = None,
) -> dict:
    """The whole race (module docs), or the ``arms`` named (and ``iid``); a JSON-ready dict."""

    began, threads = time.perf_counter(), torch.get_num_threads()
    # The model is small: its ops gain nothing from intra-op threads, which on a shared
    # machine only contend with each other.
    torch.set_num_threads(1)
    try:
        return _run(reps, data_dir, log, progress, began, arms)
    finally:
        torch.set_num_threads(threads)


def _run(reps: ScaleReps, data_dir: Path, log, progress, began: float, only) -> dict:
    from chunkstream.train import TrainConfig

    base = TrainConfig(epochs=reps.epochs, device="cpu", progress=False, tensorboard=False,
                       chunk_size=reps.chunk_size, hidden_dim=reps.hidden_dim,
                       latent_dim=reps.latent_dim, pieces=1, mix=1)  # fmt: skip
    res: dict = {"reps": asdict(reps), "shares": list(SHARES), "regimes": REGIMES,
                 "target": {"share": TARGET_SHARE, "ratio": TARGET_RATIO}}  # fmt: skip
    setups = {}
    for key, _ in DATASETS:
        path = _dataset(data_dir, reps, REGIMES if key == "regimes" else 1)
        log(f"quality at scale: {path.name}")
        arrays = _in_memory(path, reps.stim_dims)
        regimes = cs.Segments.read(path / "regimes.csv") if key == "regimes" else None
        split = _split(reps.timesteps, regimes, base.window)
        plan = cs.plan_epoch(split.train_len, reps.chunk_size, base.batch_size)
        batches = plan.chunks_per_epoch * plan.batches_per_chunk
        arms = _arms(reps, split, plan.chunks_per_epoch)
        if only is not None:
            unknown = set(only) - set(arms)
            if unknown:
                raise ValueError(f"arms {sorted(unknown)} unknown: choose from {sorted(arms)}")
            arms = {n: a for n, a in arms.items() if n == "iid" or n in only}
        res[key] = {
            "train_len": split.train_len, "chunks_per_epoch": plan.chunks_per_epoch,
            "batches_per_epoch": batches, "val_fraction": split.val_fraction,
            "arms": {name: {"config": over, "share": _share(name, over, split.train_len),
                            "runs": []} for name, over in arms.items()},
        }  # fmt: skip
        setups[key] = (arrays, split, batches)
    for seed in range(reps.seeds):
        for key, _ in DATASETS:
            arrays, split, batches = setups[key]
            for name, arm in res[key]["arms"].items():
                over = {k: v for k, v in arm["config"].items() if k != "cap_share"}
                config = TrainConfig(**{**base.to_dict(), **over, "seed": seed,
                                        "segments": split.segments, "val_fraction": split.val_fraction,
                                        "batches_per_epoch": batches})  # fmt: skip
                run = _train(arrays, config, split.test, arm["config"].get("cap_share"))
                arm["runs"].append(run)
                log(f"quality at scale: {key} {name} seed {seed}: val {run['val_loss']:.5f} "
                    f"({run['seconds']:.1f} s)")  # fmt: skip
            summarize(res[key])
        res["seconds"] = time.perf_counter() - began
        if progress is not None:
            progress(res)
    return res


def _share(name: str, over: dict, train_len: int) -> float:
    """The share of the split one batch is drawn over: the buffer's, or the chunk's (the
    defaults' arms: their cap, or the whole split; each run records what it held)."""
    if name == "iid":
        return 1.0
    if over["mix"] == "auto":
        return over.get("cap_share", 1.0)
    return over["mix"] * over["chunk_size"] / train_len


def quality_scale_targets(res: dict) -> list[dict]:
    """Buffer at :data:`TARGET_SHARE` of the split within :data:`TARGET_RATIO` of i.i.d.,
    for the buffer of contiguous chunks and for the buffer of pieced chunks."""
    out = []
    pieced = f"pieces={res['reps']['pieces']} + buffer {TARGET_SHARE:.0%}"
    names = (f"buffer {TARGET_SHARE:.0%}", pieced, CAPPED_ARM)
    for name, key, label in [(n, k, lab) for n in names for k, lab in DATASETS]:  # fmt: skip
        arm = res[key]["arms"].get(name)
        if arm is None or "ratio" not in arm:  # a run of selected arms
            continue
        r = arm["ratio"]
        if name == CAPPED_ARM:
            held = statistics.fmean(run["share"] for run in arm["runs"])
            what = (f"the defaults (pieces, mix 'auto') with host memory capped to hold at most "
                    f"{TARGET_SHARE:.0%} of the split (held {held:.1%})")  # fmt: skip
        else:
            chunks = "contiguous" if name.startswith("buffer") else f"{res['reps']['pieces']}-piece"
            what = f"a buffer of {chunks} chunks at {arm['share']:.1%} of the split"
        out.append({
            "what": f"quality at scale, {label}: val loss with {what} over i.i.d. "
                    f"(mean of {r['n']} seeds)",
            "target": f"<= {TARGET_RATIO}x",
            "figure": f"{r['mean']:.3f}x ({r['min']:.3f}-{r['max']:.3f})",
            "met": r["mean"] <= TARGET_RATIO,
        })  # fmt: skip
    return out


def plot_quality_scale(res: dict, path: Path = IMAGE) -> Path:
    """The ratio to i.i.d. against the buffer's share of the split, both datasets: the
    whole range on the left, the band around the target on the right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4), dpi=110)
    for ax in axes:
        _draw(ax, res)
    axes[1].set_ylim(0.985, 1.06)
    axes[1].set_title(f"zoom on the target ({TARGET_RATIO}x, dashed)", fontsize=9)
    axes[0].legend(fontsize=7)
    r = res["reps"]
    seeds = min(res[k].get("seeds_done", 0) for k, _ in DATASETS)
    axes[0].set_title(f"T={r['timesteps']}, N={r['neurons']}, chunk {r['chunk_size']}, "
                      f"{r['epochs']} epochs, hidden {r['hidden_dim']}, {seeds} paired seeds",
                      fontsize=9)  # fmt: skip
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _draw(ax, res: dict) -> None:
    """Every arm of both datasets on ``ax``: mean, with the min-max over seeds."""

    def errorbar(arms: list[dict], **style) -> None:
        ys = [a["ratio"]["mean"] for a in arms]
        err = [[y - a["ratio"]["min"] for y, a in zip(ys, arms, strict=True)],
               [a["ratio"]["max"] - y for y, a in zip(ys, arms, strict=True)]]  # fmt: skip
        ax.errorbar([100 * a["share"] for a in arms], ys, yerr=err, capsize=3, **style)

    pieces = res["reps"]["pieces"]
    for (key, label), color in zip(DATASETS, ("tab:blue", "tab:orange"), strict=True):
        arms = res[key]["arms"]
        errorbar([a for n, a in arms.items() if n.startswith("buffer")], marker="o",
                 color=color, label=f"{label}: buffer of contiguous chunks")  # fmt: skip
        errorbar([a for n, a in arms.items() if "+ buffer" in n], marker="D", color=color,
                 linestyle=":", label=f"{label}: buffer of {pieces}-piece chunks")  # fmt: skip
        for name, marker in (("contiguous", "s"), (f"pieces={pieces}", "^")):
            errorbar([arms[name]], marker=marker, color=color, linestyle="none",
                     label=f"{label}: {name}, no buffer")  # fmt: skip
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.axhline(TARGET_RATIO, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xscale("log")
    ticks = [0.5, 1, 2, 5, 10, 25, 50, 100]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("share of the training split one batch is drawn over (%)")
    ax.set_ylabel("validation loss / i.i.d. (mean, min-max)")
    ax.grid(True, which="both", alpha=0.3)


def _per_seed(arm: dict, iid: dict) -> list[float]:
    """The arm's ratio to i.i.d. at each seed both have run."""
    # Not strict: a run stopped early leaves the arms with different numbers of seeds.
    return [r["val_loss"] / i["val_loss"] for r, i in zip(arm["runs"], iid["runs"], strict=False)]


def first_scale_results(results_dir: Path) -> dict | None:
    """The first results file holding the race: the full run, else the shared, else quick."""
    from ._engines_report import first_results_with

    modes = ("quality-scale", "quality-scale-shared", "quality-scale-quick")
    return first_results_with(results_dir, modes, "quality_scale")


def quality_scale_markdown(results_dir: Path) -> list[str]:
    """The section from :func:`first_scale_results`; the plot is drawn from the same."""
    res = first_scale_results(results_dir)
    if res is None:
        return ["### quality at scale (the buffer's share of the split)", "", "Not run yet: "
                "`python -m benchmarks.run --only quality-scale` measures it.", ""]  # fmt: skip
    return quality_scale_section({**res["quality_scale"], "command": res.get("command")})


def quality_scale_section(res: dict) -> list[str]:
    """The "quality at scale" table of BENCHMARKS.md."""
    r = res["reps"]
    seeds = min(res[k]["seeds_done"] for k, _ in DATASETS)
    lines = ["### quality at scale (the buffer's share of the split)", "",
             f"- command: `{res.get('command') or 'python -m benchmarks.run --only quality-scale'}` "
             f"({res['seconds'] / 60:.0f} min; 2 CPU cores shared with other jobs)",
             f"- synthetic data T={r['timesteps']}, N={r['neurons']}, stimulus {r['stim_dims']}; "
             f"reference trainer, {r['epochs']} epochs (the first on reconstruction only), "
             f"chunk_size {r['chunk_size']}, model hidden/latent {r['hidden_dim']}/{r['latent_dim']}, "
             f"the same batches in every arm, seeds 0-{seeds - 1} paired across arms",
             "- share: of the training split that one batch is drawn over (`mix * chunk_size / "
             "split`; a chunk alone for the arms without a buffer); the buffer arms use contiguous "
             "chunks (`pieces=1`)",
             "", "![ratio to i.i.d. against the buffer's share](docs/img/quality_scale.png)", ""]  # fmt: skip
    for key, label in DATASETS:
        d = res[key]
        regimes = key == "regimes"
        lines += [f"{label}: training split {d['train_len']} timesteps ({d['chunks_per_epoch']} "
                  f"chunks), {d['batches_per_epoch']} batches per epoch"
                  + (", each regime cut 70/10/20 (train/val/test)" if regimes else ", the last 10% "
                     "held out"), "",
                  "| arm | mix | share | val loss, mean | ratio to i.i.d.: mean | std | min | max | per seed |"
                  + (" worst regime | test ratio |" if regimes else ""),
                  "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if regimes else "")]  # fmt: skip
        for name, arm in d["arms"].items():
            q = arm["ratio"]
            loss = statistics.fmean(x["val_loss"] for x in arm["runs"][: q["n"]])
            row = (f"| {name} | {arm['config']['mix']} | {100 * arm['share']:.1f}% | {loss:.5f} | "
                   f"{q['mean']:.3f} | {q['std']:.3f} | {q['min']:.3f} | {q['max']:.3f} | "
                   f"{', '.join(f'{x:.3f}' for x in _per_seed(arm, d['arms']['iid']))} |")  # fmt: skip
            if regimes:
                worst = max(
                    arm["segment_ratio"].items(), key=lambda kv: kv[1], default=("-", math.nan)
                )
                where = worst[0].split("/")[0]
                row += f" {worst[1]:.3f} ({where}) | {arm['test_ratio']['mean']:.3f} |"
            lines.append(row)
        lines.append("")
    lines += ["| target | wanted | figure | met |", "|---|---|---|---|"]
    lines += [f"| {t['what']} | {t['target']} | {t['figure']} | {'yes' if t['met'] else '**no**'} |"
              for t in res.get("targets", quality_scale_targets(res))]  # fmt: skip
    return [*lines, ""]
