"""``chunkstream demo``: train a latent-dynamics model by streaming a synthetic FlyVis dataset.

With no arguments it writes (once; later runs reuse it) a synthetic dataset in
the FlyVis layout under ``./chunkstream-demo/data``, streams its training split
in chunks (CUDA when present, else CPU) and trains on the batches a ``BatchStream``
draws from them, for a few epochs, prints one line per
epoch and a final table, and writes TensorBoard logs, ``timeline.png`` and
``trace.json`` (the loader's spans, for ui.perfetto.dev) into the output folder. ``--data`` trains on existing FlyVis-layout directories
(several: one dataset, ``cs.Recordings``, validated per run); ``--val-data`` holds
runs out entirely and validates on each whole.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from .._errors import ConfigError
from .._text import format_bytes, format_table
from ._checks import int_at_least, naming_options, note, refuse, writable_dir

__all__ = ["register"]

#: TrainConfig's parameter names in a refusal, and the demo's options.
OPTIONS = {
    "chunk_size": "--chunk-size",
    "batch_size": "--batch-size",
    "pieces": "--pieces",
    "mix": "--mix",
    "buffer": "--buffer",
    "epochs": "--epochs",
    "segments": "--segments",
    "val_data": "--val-data",
    "val_fraction": "--val-fraction",
    "device": "--device",
    "seed": "--seed",
}

DEFAULTS = {
    "timesteps": 24576,
    "neurons": 128,
    "stim_dims": 32,
    "chunk_size": 1024,
    "epochs": 6,
    "pieces": "auto",
    "mix": "auto",
}
#: Stored time chunk of the synthetic dataset: ``pieces="auto"`` comes down to pieces of
#: this length (chunk_size // 32), so a piece decodes whole stored chunks and nothing more.
TIME_CHUNK = 32


def _auto_int(text: str) -> int | str:
    """``--pieces``/``--mix``: "auto" or an int (TrainConfig checks its range)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'{text!r} is not an int or "auto"') from None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo",
        help="train a model by streaming a synthetic dataset; print the table, draw the timeline",
        description=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument(
        "--data",
        nargs="+",
        metavar="RUN",
        default=None,
        help="FlyVis-layout directories (timeseries.zarr); several: trained on as one "
        "dataset (cs.Recordings), validated per run; default: write a synthetic one "
        "under OUT/data (cached)",
    )
    p.add_argument(
        "--val-data",
        nargs="+",
        metavar="RUN",
        default=None,
        help="FlyVis-layout directories held out entirely: each validated whole and "
        "reported on its own (with --data)",
    )
    p.add_argument(
        "--val-fraction",
        type=float,
        default=None,
        help="share of every training run held out at its end (default 0.1; 0 with "
        "--val-data: validate on the held-out runs only)",
    )
    p.add_argument(
        "--timesteps",
        type=int_at_least(1),
        default=DEFAULTS["timesteps"],
        help="synthetic timesteps (default %(default)s)",
    )
    p.add_argument(
        "--neurons",
        type=int_at_least(1),
        default=DEFAULTS["neurons"],
        help="synthetic neurons (default %(default)s)",
    )
    p.add_argument(
        "--stim-dims",
        type=int_at_least(1),
        default=None,
        help=f"stimulus channels (default {DEFAULTS['stim_dims']}, or the neurons when fewer)",
    )
    p.add_argument(
        "--epochs",
        type=int_at_least(1),
        default=DEFAULTS["epochs"],
        help="epochs (default %(default)s)",
    )
    p.add_argument(
        "--chunk-size",
        type=int_at_least(1),
        default=DEFAULTS["chunk_size"],
        help="timesteps per streamed chunk (default %(default)s)",
    )
    p.add_argument(
        "--pieces",
        type=_auto_int,
        default=DEFAULTS["pieces"],
        help="pieces per chunk, from independent places (default %(default)s: up to "
        "128, each at least a stored time chunk; 1: contiguous chunks)",
    )
    p.add_argument(
        "--mix",
        type=_auto_int,
        default=DEFAULTS["mix"],
        help="chunks held and mixed per batch, a shuffle buffer of chunks (default "
        "%(default)s: the largest share of the training split that half the job's host "
        "memory holds, cgroup limits included; 1: each batch from one chunk)",
    )
    p.add_argument(
        "--buffer",
        choices=("auto", "host", "device"),
        default="auto",
        help="where the shuffle buffer lives (BatchStream's buffer=): host memory, each "
        "batch gathered there and copied to the device from pinned slots; or the device "
        "(default %(default)s: the one that holds more of the split)",
    )
    p.add_argument(
        "--segments",
        default=None,
        help="a CSV or JSON file of (start, stop, name) segments: no window crosses "
        "one, the end of each is held out, validation is reported per segment",
    )
    p.add_argument(
        "--batch-size", type=int_at_least(1), default=32, help="windows per batch (default 32)"
    )
    p.add_argument("--device", default=None, help="cuda, cuda:k or cpu (default: cuda if present)")
    p.add_argument(
        "--out", default="chunkstream-demo", help="output folder (default ./chunkstream-demo)"
    )
    p.add_argument("--seed", type=int_at_least(0), default=0, help="random seed (default 0)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="hide the progress bars (shown on a terminal only, on stderr)",
    )
    p.add_argument("--json", action="store_true", help="also write OUT/result.json")
    p.set_defaults(func=run)


def _open(path: Path, stim_dims: int | None):
    """The FlyVis fields ``voltage`` and ``stimulus`` of ``path/timeseries.zarr``."""
    from ..sources import ZarrSource

    store = path / "timeseries.zarr"
    if not store.exists():
        from .._errors import SourceNotFoundError

        raise SourceNotFoundError(
            f"--data {str(path)!r} has no timeseries.zarr: pass a FlyVis-layout directory, "
            "or leave --data out to use a synthetic dataset."
        )
    from ..tools import check_flyvis_stim_dims, open_arrays

    arrays = open_arrays(path)
    if stim_dims is None:  # the default, or every neuron when there are fewer
        neurons = getattr(arrays.get("timeseries"), "shape", (0, DEFAULTS["stim_dims"]))[1]
        stim_dims = min(DEFAULTS["stim_dims"], int(neurons))
    check_flyvis_stim_dims(arrays, stim_dims, f"--data {str(path)!r}")
    return ZarrSource(
        str(store), fields={"voltage": (slice(None), 0), "stimulus": (slice(0, stim_dims), 1)}
    )


def _open_runs(runs: list[str], stim_dims: int | None):
    """One run's source, or several as one :class:`~chunkstream.Recordings` named after
    their directories."""
    if len(runs) == 1:
        return _open(Path(runs[0]), stim_dims)
    from ..sources import Recordings
    from ..tools import recording_names

    return Recordings([_open(Path(r), stim_dims) for r in runs], names=recording_names(runs))


def check(args: argparse.Namespace) -> None:
    """Refuse, before anything is written, what cannot run or has no effect."""
    synthetic = ("--timesteps", args.timesteps, "timesteps"), ("--neurons", args.neurons, "neurons")
    if args.data is not None:
        for option, value, key in synthetic:
            if value != DEFAULTS[key]:
                raise ConfigError(
                    f"{option} {value} has no effect with --data (it sizes the "
                    f"synthetic dataset): drop {option}, or drop --data."
                )
    elif args.val_data is not None:
        raise ConfigError(
            "--val-data holds runs out of --data's: give the training runs with --data "
            "(the synthetic dataset has no other run to validate on)."
        )
    elif args.stim_dims is None:
        args.stim_dims = min(DEFAULTS["stim_dims"], args.neurons)
    elif args.stim_dims > args.neurons:
        raise refuse(
            "--stim-dims",
            args.stim_dims,
            f"at most --neurons={args.neurons}",
            f"Pass --stim-dims {args.neurons} or fewer, or raise --neurons.",
        )
    runs = [*(args.data or []), *(args.val_data or [])]
    if len({str(Path(r).resolve()) for r in runs}) != len(runs):
        raise ConfigError(
            f"--data and --val-data name a run twice ({' '.join(runs)}): a held-out run "
            "must not be trained on. Give each run once."
        )
    if args.chunk_size < args.batch_size:
        raise refuse(
            "--chunk-size",
            args.chunk_size,
            f"at least --batch-size={args.batch_size}",
            "Not one batch fits in a chunk: raise --chunk-size or lower --batch-size.",
        )
    if args.segments is not None:  # a missing or malformed file, before any write
        from ..plans import Segments, as_segments

        if args.data is None:
            as_segments(args.segments, args.timesteps)  # and inside the synthetic data
        else:
            Segments.read(args.segments)
    if args.device is not None:
        from ..pipeline import resolve_device

        resolve_device(args.device)
    if args.resume and not (Path(args.out) / "checkpoint.pt").is_file():
        note("demo", f"--resume: no checkpoint in {args.out}, so the run starts from scratch")
    writable_dir("--out", args.out)


@naming_options(OPTIONS)
def run(args: argparse.Namespace) -> int:
    from ..stats import plot_timeline
    from ..tools import ensure_synthetic
    from ..train import TrainConfig, Trainer

    check(args)
    # Checked before the dataset is written: a bad --pieces, --mix or --segments costs nothing.
    config = TrainConfig(
        chunk_size=args.chunk_size,
        batch_size=args.batch_size,
        epochs=args.epochs,
        device=args.device,
        seed=args.seed,
        progress=not args.no_progress,
        pieces=args.pieces,
        mix=args.mix,
        buffer=args.buffer,
        segments=args.segments,
        **({} if args.val_fraction is None else {"val_fraction": args.val_fraction}),
        # Checked here with a placeholder; the runs are opened below.
        **({} if args.val_data is None else {"val_data": {}}),
    )
    out = Path(args.out)
    began = time.perf_counter()
    if args.data is None:
        data = out / "data"
        print(f"dataset: {data} (synthetic FlyVis layout, written once, then reused)")
        info = ensure_synthetic(
            data,
            timesteps=args.timesteps,
            neurons=args.neurons,
            stim_dims=args.stim_dims,
            seed=args.seed,
            progress=not args.no_progress,
            # One zarr chunk per field column and per stimulus width: no read amplification;
            # TIME_CHUNK steps long, so the default pieces decode whole chunks.
            chunks=(TIME_CHUNK, max(1, min(args.stim_dims, args.neurons)), 1),
        )
        print(
            f"  {info.timesteps} timesteps x {info.neurons} neurons x 4 columns, "
            f"{format_bytes(info.nbytes)}"
        )
        source = _open(data, args.stim_dims)
    else:
        source = _open_runs(args.data, args.stim_dims)
    if args.val_data is not None:
        from ..tools import recording_names

        names = recording_names(args.val_data)
        held = {
            n: _open(Path(r), args.stim_dims) for n, r in zip(names, args.val_data, strict=True)
        }
        config = dataclasses.replace(config, val_data=held)

    def on_epoch(trainer: Trainer, record) -> None:
        parts = ", ".join(f"{k} {v:.4f}" for k, v in record.losses.items() if k != "loss")
        phase = "warm-up (reconstruction)" if record.epoch < config.warmup_epochs else "rollout"
        print(
            f"epoch {record.epoch + 1}/{config.epochs} {phase:<24} train {parts}; "
            f"val {record.val_loss:.4f} vs constant {record.baseline_val:.4f}; "
            f"{record.chunks} chunks, {record.batches} batches, {record.seconds:.1f} s"
        )

    try:
        trainer = Trainer(source, config, out_dir=out, on_epoch=on_epoch)
        if isinstance(args.pieces, int) and trainer.pieces != args.pieces:
            note(
                "demo",
                f"--pieces {args.pieces}: using {trainer.pieces}, the most up to "
                f"{args.pieces} that divide --chunk-size {args.chunk_size} into pieces "
                f"of at least the {config.window}-step window",
            )
        buffer = trainer.buffer
        print(
            f"training on {trainer.device}: {trainer.plan.describe()}, {trainer.pieces} "
            f"pieces/chunk, batches mixed over {trainer.mix} chunks ({buffer.pieces} "
            f"independent pieces, {buffer.split_share:.1%} of the training split, "
            f"{buffer.tier} tier); window {config.window} timesteps "
            f"({config.evolve_multiple_steps} rollout steps)"
        )
        if buffer.memory:
            print(f"  {buffer.memory}")
        result = trainer.fit(resume=args.resume)
    finally:
        source.close()
        for run in (config.val_data or {}).values():
            run.close()
    assert trainer.loader is not None  # set by fit()
    timeline = plot_timeline(trainer.loader.stats, out / "timeline.png")
    trace = trainer.loader.stats.export_trace(out / "trace.json")  # Perfetto / chrome://tracing
    print()
    print(result_table(result))
    from .._memory import quality_note

    quality = quality_note(_buffer_share(result.memory)) if result.memory.get("mixer") else ""
    if quality:
        print(quality)
    print()
    print(
        f"wrote {timeline}, {trace} (ui.perfetto.dev), TensorBoard logs in {out / 'tensorboard'} "
        f"(tensorboard --logdir {out / 'tensorboard'}), checkpoint {result.checkpoint}"
    )
    print(f"demo took {time.perf_counter() - began:.1f} s")
    if args.json:
        payload = {
            "val_loss": result.val_loss,
            "baseline_val": result.baseline_val,
            "baseline_train": result.baseline_train,
            "memory": result.memory,
            "latency": result.latency,
            "seconds": result.seconds,
            "device": result.device,
            "buffer": result.buffer.tier,
            "mix": result.buffer.mix,
            "batches": sum(r.batches for r in result.history),
            "epoch_seconds": [r.seconds for r in result.history],
        }
        (out / "result.json").write_text(json.dumps(payload, indent=1))
    return 0


def versus_constant(result) -> str:
    """The model's validation loss against the constant baseline, in words."""
    model, constant = result.val_loss, result.baseline_val
    if model <= 0:
        return "perfect: zero loss"
    if model < constant:
        return f"{constant / model:.1f}x lower than constant"
    return (
        f"{model / max(constant, 1e-30):.2f}x higher than constant: "
        "the model has not beaten the constant baseline"
    )


def _share(loader: int, mixer: int | None, split: int) -> str:
    """What streaming holds of the training split: the loader's buffers, and with the
    shuffle buffer (which at a small split can hold most of it)."""
    text = f"the loader holds {100 * loader / max(1, split):.0f}% of it"
    if mixer:
        text += f", {100 * (loader + mixer) / max(1, split):.0f}% with the shuffle buffer"
    return text


def _tier(result) -> str:
    """The shuffle buffer's tier, in the table's words."""
    tier = getattr(result.buffer, "tier", "device" if result.device != "cpu" else "host")
    return f"{tier} tier"


def _buffer_share(memory: dict) -> float:
    """The share of the training split the shuffle buffer holds (0 with mix=1: no buffer)."""
    held = memory.get("mixer") or 0
    return min(1.0, held / max(1, memory["train_split"]))


def _held_out_words(name: str) -> str:
    """What a held-out range's row of the table is."""
    if name.endswith("/val"):
        return f"validation loss on the held-out end of {name.removesuffix('/val')!r}"
    if "/" not in name and name != "val":
        return "validation loss on this held-out run (--val-data), whole"
    return "validation loss of the model on this held-out segment"


def result_table(result) -> str:
    """The demo's final table (see docs: what the numbers mean)."""
    from .._memory import node_share  # torch: imported by a run, not by --help

    share = node_share()
    m, lat = result.memory, result.latency
    held_device = m["device_peak"] if m["device_peak"] is not None else None
    loader = m["loader_host"] + m["loader_device"]
    rows = [
        ("validation loss, model", f"{result.val_loss:.5f}", versus_constant(result)),
        (
            "validation loss, constant",
            f"{result.baseline_val:.5f}",
            "predicts the streamed per-neuron training mean",
        ),
        (
            "training loss, constant",
            f"{result.baseline_train:.5f}",
            "mean per-neuron variance, from running moments",
        ),
        (
            "loader host buffers",
            format_bytes(m["loader_host"]),
            "fixed; does not grow with the data",
        ),
        (
            "loader device chunks",
            format_bytes(m["loader_device"]) if m["loader_device"] else "-",
            "chunks on the GPU at once"
            if m["loader_device"]
            else "(CPU run: chunks are host buffers)",
        ),
        (
            "chunk shuffle buffer",
            format_bytes(m.get("mixer")) if m.get("mixer") else "-",
            f"{_tier(result)}: --mix chunks held by the BatchStream, {_buffer_share(m):.1%} of "
            "the training split; batches drawn over them",
        ),
        (
            "device peak (allocator)",
            format_bytes(held_device),
            "model, optimizer, chunks, validation",
        ),
        (
            "validation on device",
            format_bytes(m["validation"]),
            "held-out range, kept on the device",
        ),
        (
            "whole training split",
            format_bytes(m["train_split"]),
            _share(loader, m.get("mixer"), m["train_split"]),
        ),
        ("host peak RSS", format_bytes(m["host_peak_rss"]), "whole process"),
        ("threads (this rank)", str(share.threads), share.describe_cpus()),
        ("host memory (job)", "", share.describe_memory()),
        (
            "stall fraction",
            f"{100 * lat['stall_fraction']:.1f}%",
            f"{100 * lat['stall_fraction_after_first']:.1f}% after each epoch's first chunk",
        ),
        (
            "read GB/s (readers)",
            f"{lat['bytes'] / max(1e-9, lat['read_total_ms'] / 1e3) / 1e9:.3f}",
            "bytes over time spent in source reads: the streaming headroom",
        ),
        ("chunks/s", f"{lat['chunks_per_s']:.2f}", f"{int(lat['num_chunks'])} chunks"),
        (
            "GB/s delivered",
            f"{lat['gb_per_s']:.3f}",
            f"{format_bytes(lat['bytes'])} in {lat['elapsed_s']:.1f} s of epochs",
        ),
        (
            "batch fwd/bwd/step",
            f"{lat['forward_mean_ms']:.2f}/{lat['backward_mean_ms']:.2f}/"
            f"{lat['step_mean_ms']:.2f} ms",
            f"mean of {int(lat['num_batches'])} timed batches",
        ),
        *(  # remote data read through the node cache: every recording's counters, summed
            [
                (
                    "node cache hits",
                    f"{int(lat['cache_hits'])}/{int(lat['cache_hits'] + lat['cache_misses'])}",
                    f"{format_bytes(lat['cache_fetched_bytes'])} fetched, "
                    f"{format_bytes(lat['cache_evicted_bytes'])} evicted (all recordings)",
                )
            ]
            if "cache_hits" in lat
            else []
        ),
    ]
    rows[1:1] = [
        (f"  {name}", f"{loss:.5f}", _held_out_words(name))
        for name, loss in result.val_segments.items()
        if len(result.val_segments) > 1 or name != "val"
    ]
    title = f"chunkstream demo on {result.device}, {result.seconds:.1f} s"
    return "\n".join([title, *format_table(rows, align="<>")])
