"""``chunkstream plan``: epoch arithmetic and the memory a configuration takes (``tools._plan``)."""

from __future__ import annotations

import argparse
import dataclasses
import json

from .._errors import ConfigError
from .._text import format_bytes, format_table
from ._checks import float_above, int_at_least, naming_options, note, refuse, unused

__all__ = ["register"]

#: The library's parameter names in a refusal, and the options a plan user typed.
OPTIONS = {
    "world_size": "--world-size",
    "chunk_size": "--chunk-size",
    "batch_size": "--batch-size",
    "passes_per_epoch": "--passes",
    "pieces": "--pieces",
    "align": "--align",
    "batch_window": "--window",
    "segments": "--segments",
    "column": "--column",
}


def _shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--shape {text!r}: expected comma-separated ints T,N[,...], e.g. 967680,13741"
        ) from None


def add_data_arguments(p: argparse.ArgumentParser, *, shape: bool) -> None:
    """The options saying which data to use (shared with ``bench``)."""
    p.add_argument(
        "--fields",
        nargs="+",
        metavar="NAME=INDEX",
        default=None,
        help="fields as NAME=INDEX on the non-time axes (e.g. 'voltage=:,0' "
        "'stimulus=0:1736,1'), or NAME=ARRAY[INDEX] when PATH holds several arrays "
        "(default: the store's only array, whole)",
    )
    p.add_argument(
        "--flyvis",
        action="store_true",
        help="PATH is a FlyVis run directory: stream --column and the stimulus "
        "of PATH/timeseries.zarr",
    )
    p.add_argument(
        "--column",
        default="voltage",
        help="FlyVis dynamic column: voltage, calcium, fluorescence or its id (default voltage)",
    )
    help_stim = "stimulus channels (FlyVis: the first N neurons of column 4"
    help_stim += "; with --shape: adds a (T, N) stimulus field)" if shape else ")"
    p.add_argument("--stim-dims", type=int_at_least(1), default=None, help=help_stim)


def add_recordings_arguments(p: argparse.ArgumentParser) -> None:
    """The option weighing several runs (shared by ``plan`` and ``bench``)."""
    p.add_argument(
        "--weights",
        nargs="+",
        metavar="W",
        default=None,
        help="with several PATHs: one weight per run, its share of every epoch "
        "(default: in proportion to their lengths)",
    )


def open_runs(args: argparse.Namespace):
    """The several runs of ``args.path`` as one :class:`~chunkstream.Recordings`, opened
    with the data options and ``--weights`` (shared by ``plan`` and ``bench``)."""
    from ..tools import open_recordings, parse_weights

    return open_recordings(
        args.path,
        args.fields,
        flyvis=args.flyvis,
        column=args.column,
        stim_dims=args.stim_dims,
        weights=parse_weights(args.weights, len(args.path)),
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan",
        help="epoch arithmetic and memory: full dataset on the device vs streaming",
        description=(
            "Size a run before starting it: the epoch arithmetic (chunks per epoch, batches "
            "per chunk), and a memory table comparing the whole dataset on the device with "
            "streaming (device bytes = (gpu_prefetch + 1 held) chunks + validation data; "
            "pinned host bytes = host_slots chunks; other host bytes = decode scratch). With "
            "--gpu-mem/--host-mem it finds the largest chunk_size (a power of two where "
            "--align allows) and the deepest prefetch depths that fit. Give the data as a "
            "store PATH or as --shape/--dtype. Sizes: 8GB, 512MiB, or bytes."
        ),
        epilog="example: chunkstream plan --shape 967680,13741 --stim-dims 1736 "
        "--chunk-size 65536 --batch-size 256",
    )
    p.add_argument(
        "path",
        metavar="PATH",
        nargs="*",
        default=None,
        help="zarr store, group or FlyVis run directory (or URL); or use --shape. Several: "
        "runs streamed as one dataset (cs.Recordings): prints each run's length, share "
        "and what one pass draws from it",
    )
    p.add_argument(
        "--shape",
        type=_shape,
        default=None,
        metavar="T,N[,...]",
        help="plan for an array of this shape instead of a store",
    )
    p.add_argument("--dtype", default="float32", help="dtype with --shape (default float32)")
    add_data_arguments(p, shape=True)
    add_recordings_arguments(p)
    p.add_argument("--chunk-size", type=int_at_least(1), required=True, help="timesteps per chunk")
    p.add_argument("--batch-size", type=int_at_least(1), required=True, help="batch size")
    p.add_argument(
        "--window",
        type=int_at_least(1),
        default=1,
        help="timesteps of one training window (default 1)",
    )
    p.add_argument(
        "--prefetch", type=int_at_least(1), default=2, help="chunks read ahead (default 2)"
    )
    p.add_argument(
        "--gpu-prefetch",
        type=int_at_least(1),
        default=1,
        help="chunks kept ready on the device (default 1)",
    )
    p.add_argument("--workers", type=int_at_least(1), default=2, help="reader threads (default 2)")
    p.add_argument(
        "--host-slots",
        type=int_at_least(1),
        default=None,
        help="pinned host slots (default prefetch + workers)",
    )
    p.add_argument(
        "--passes", type=int_at_least(1), default=1, help="data passes per epoch (default 1)"
    )
    p.add_argument("--world-size", type=int_at_least(1), default=1, help="ranks (default 1)")
    p.add_argument(
        "--ranks-per-node",
        type=int_at_least(1),
        default=None,
        help="this job's processes on each node, which share its memory and CPUs (default: "
        "as detected here: LOCAL_WORLD_SIZE, Slurm's tasks on the node, else 1)",
    )
    p.add_argument(
        "--align", type=int_at_least(1), default=1, help="window starts multiple of (default 1)"
    )
    p.add_argument(
        "--pieces",
        type=int_at_least(1),
        default=1,
        help="pieces per chunk (chunk_size // pieces timesteps each, from "
        "independent places; default 1: contiguous)",
    )
    p.add_argument(
        "--segments",
        default=None,
        help="CSV or JSON file of (start, stop, name) segments no window may cross; "
        "prints the valid piece starts per segment",
    )
    p.add_argument(
        "--sampling",
        choices=("random", "shuffled", "sequential"),
        default="shuffled",
        help="the plan, for chunks per pass (default shuffled)",
    )
    p.add_argument(
        "--val-fraction",
        type=float_above(0.0, inclusive=True),
        default=0.0,
        help="fraction of timesteps held out and kept on the device (default 0)",
    )
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="where training runs (default cuda)",
    )
    p.add_argument("--gpu-mem", default=None, help="device memory budget, e.g. 8GB")
    p.add_argument(
        "--host-mem",
        default=None,
        help="host memory budget of one rank, e.g. 32GB (default: this rank's share of "
        "the memory the job may use here, cgroup limits included)",
    )
    p.add_argument(
        "--mix",
        default="auto",
        metavar="M|auto",
        help="chunks the shuffle buffer holds (BatchStream(mix=); default auto, as "
        "BatchStream's: the largest share of the split half the job's host memory holds)",
    )
    p.add_argument(
        "--buffer",
        choices=("auto", "host", "device"),
        default="auto",
        help="where the shuffle buffer lives (BatchStream(buffer=); auto: host on "
        "the CPU, device on CUDA)",
    )
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=run)


def buffer_summary(args: argparse.Namespace, report, pieces: dict | None, share):
    """The shuffle buffer the run's ``BatchStream(mix=, buffer=)`` would hold."""
    import torch

    from .._memory import choose_tier, plan_buffer

    mix = args.mix if args.mix == "auto" else _int_arg(args.mix, "--mix")
    if pieces is not None and pieces["chunks_per_pass"]:
        pass_chunks = pieces["chunks_per_pass"]
    else:
        pass_chunks = -(-report.train_timesteps // report.chunk_size)
    loader = report.streaming
    gpu_mem = getattr(report.budget, "gpu_mem", None) if report.budget is not None else None
    device_memory, assumed = gpu_mem, ""
    if mix == "auto" and args.device == "cuda" and gpu_mem is None:
        if torch.cuda.is_available():
            device_memory = torch.cuda.get_device_properties(0).total_memory
        else:
            device_memory, assumed = 80 * 10**9, ", an 80 GB device assumed: give --gpu-mem"
    host_mem = None if args.host_mem is None else report.budget.host_mem
    loader_nbytes = (loader.pinned_bytes or 0) + (loader.host_bytes or 0)
    device = torch.device(args.device)
    sizes = {
        "chunk_nbytes": report.chunk_bytes,
        "pass_chunks": pass_chunks,
        "loader_nbytes": loader_nbytes,
        "host_memory": host_mem,
        "device_memory": device_memory,
        "share": share,
    }
    tier, chose = choose_tier(args.buffer, device, mix=mix, **sizes)
    return plan_buffer(
        mix,
        tier,
        pieces=pieces["pieces"] if pieces is not None else 1,
        device=device,
        why=f"--buffer {args.buffer}{assumed}: {chose}",
        **sizes,
    )


def _int_arg(value: str, name: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise refuse(name, value, "an int >= 1 or 'auto'", f"Pass {name} 16, or {name} auto.")
    return number


def layout_from_args(args: argparse.Namespace):
    """The data layout the arguments describe (a store, or --shape); an option that has
    no effect on it is refused."""
    from ..tools import layout_from_shape, layout_from_store

    shape = getattr(args, "shape", None)
    if args.path is None and shape is None:
        raise ConfigError("give a store PATH or --shape T,N[,...]: nothing to plan for.")
    if args.path is not None and shape is not None:
        raise ConfigError("give either a store PATH or --shape, not both.")
    if args.flyvis and args.fields:
        raise ConfigError("--flyvis names the fields itself: drop --fields.")
    if args.column != "voltage" and not args.flyvis:
        raise unused("--column", args.column, "--flyvis", "it picks a FlyVis column")
    if args.path is None:
        if args.flyvis:
            raise unused("--flyvis", "", "a run directory PATH", "--shape has no columns")
        if args.fields and args.stim_dims is not None:
            raise ConfigError(
                "--stim-dims adds a stimulus field to --shape's data, and --fields "
                "names the fields itself: name the stimulus in --fields instead."
            )
        return layout_from_shape(shape, args.dtype, args.stim_dims, args.fields)
    if getattr(args, "dtype", "float32") != "float32":
        raise unused("--dtype", args.dtype, "--shape", "a store has its own dtype")
    if args.stim_dims is not None and not args.flyvis:
        raise unused(
            "--stim-dims",
            args.stim_dims,
            "--flyvis (or --shape)",
            "with a store PATH, --fields says what to read",
        )
    return layout_from_store(
        args.path, args.fields, flyvis=args.flyvis, column=args.column, stim_dims=args.stim_dims
    )


def saving_words(saving: float) -> str:
    """The device saving of streaming in words, for a gain and for a loss."""
    if saving > 0:
        return f"streaming uses {saving:.0%} less device memory"
    if saving == 0:
        return "streaming uses as much device memory as the whole dataset"
    return (
        f"streaming uses {-saving:.0%} MORE device memory than the whole dataset: "
        "keep the data on the device, or lower --chunk-size"
    )


def piece_summary(args: argparse.Namespace, layout, segments=None, recs=None) -> dict | None:
    """Pieces and segments of the run (``None`` for contiguous chunks over the whole
    data); with several runs (``recs``), what one pass draws from each."""
    if args.pieces == 1 and segments is None:
        return None
    from ..plans import PiecePlan, held_out_split, plan_epoch
    from ..tools import pass_shares

    # The trainer's split: with segments, the last val_fraction of each one is held out.
    split = held_out_split(layout.total_timesteps, args.val_fraction, args.window, segments)
    plan = PiecePlan(
        total_timesteps=layout.total_timesteps,
        chunk_size=args.chunk_size,
        pieces=args.pieces,
        sampling=args.sampling,
        segments=split.train_segments,
        align=args.align,
        grid=layout.time_chunk,
        batch_window=args.window,
        recordings=recs.strata if recs is not None else None,
    )
    size, grid = plan.piece_size, layout.time_chunk
    if segments is None:
        epoch = plan_epoch(
            split.train_len,
            args.chunk_size,
            args.batch_size,
            args.passes,
            world_size=args.world_size,
        )
    else:  # as the trainer: a chunk is at most the source, a pass whole tiles and the pool
        total = layout.total_timesteps
        epoch = plan_epoch(
            total,
            min(args.chunk_size, total),
            args.batch_size,
            args.passes,
            world_size=args.world_size,
            segments=split.train_segments,
            pieces=args.pieces,
        )
    # Unaligned, a piece touches up to ceil((size - 1) / grid) + 1 stored chunks.
    touched = 1 + -(-(size - 1) // grid) if size % grid else size // grid
    return {
        "pieces": plan.pieces,
        "piece_size": size,
        "piece_align": plan.piece_align,
        "time_chunk": grid,
        "sampling": plan.sampling,
        "chunks_per_pass": plan.windows_per_pass,
        "valid_starts": plan.valid_starts(),
        "read_amplification": touched * grid / size,
        "chunks_per_epoch": epoch.chunks_per_epoch,
        "timesteps": split.train_len,
        "recordings": None
        if recs is None
        else [dataclasses.asdict(s) for s in pass_shares(plan, recs)],
    }


def check(args: argparse.Namespace) -> None:
    """Refuse or note the options that cannot run or change nothing in this combination."""
    if not args.val_fraction < 1.0:
        raise refuse(
            "--val-fraction",
            args.val_fraction,
            "a fraction in [0, 1)",
            "Hold out less: 0.1 keeps 90% for training.",
        )
    if args.device == "cpu":
        if args.gpu_mem is not None:
            raise unused(
                "--gpu-mem", args.gpu_mem, "--device cuda", "a CPU run has no device memory"
            )
        for option, value, default in (
            ("--gpu-prefetch", args.gpu_prefetch, 1),
            ("--host-slots", args.host_slots, None),
        ):
            if value != default:
                note(
                    "plan",
                    f"{option} {value} changes nothing with --device cpu "
                    "(no device copies, no pinned slots)",
                )
    if args.pieces == 1 and args.segments is None and args.sampling != "shuffled":
        note(
            "plan",
            f"--sampling {args.sampling} changes no figure here: contiguous chunks "
            "(--pieces 1) over the whole data take the same memory and epoch",
        )


@naming_options(OPTIONS)
def run(args: argparse.Namespace) -> int:
    from ..tools import (
        RecordingShare,
        format_shares,
        parse_bytes,
        plan_memory,
        plan_share,
        recordings_layout,
    )

    check(args)
    share = plan_share(args.ranks_per_node)
    recs = None
    if len(args.path) > 1:
        if args.shape is not None:
            raise ConfigError("give either store PATHs or --shape, not both.")
        recs = open_runs(args)
        layout = recordings_layout(recs)
    else:
        if args.weights is not None:
            raise unused("--weights", " ".join(args.weights), "several PATHs")
        args.path = args.path[0] if args.path else None
        layout = layout_from_args(args)
    segments = None
    if args.segments is not None:
        from ..plans import Segments

        segments = Segments.read(args.segments)
    if recs is not None:  # the runs' bounds are segments; given ones are cut at them
        from ..plans import within_recordings

        if segments is None:
            segments = recs.segments
        else:
            segments = within_recordings(segments, recs.strata, len(recs))
    report = plan_memory(
        layout,
        chunk_size=args.chunk_size,
        batch_size=args.batch_size,
        window=args.window,
        prefetch=args.prefetch,
        gpu_prefetch=args.gpu_prefetch,
        workers=args.workers,
        host_slots=args.host_slots,
        passes=args.passes,
        world_size=args.world_size,
        val_fraction=args.val_fraction,
        device=args.device,
        align=args.align,
        gpu_mem=None if args.gpu_mem is None else parse_bytes(args.gpu_mem, "--gpu-mem"),
        host_mem=None if args.host_mem is None else parse_bytes(args.host_mem, "--host-mem"),
        segments=segments,
        pieces=args.pieces,
        share=share,
    )
    pieces = piece_summary(args, layout, segments, recs)
    if recs is not None:
        recs.close()
    buffer = buffer_summary(args, report, pieces, share)
    if args.json:
        shuffle = {**dataclasses.asdict(buffer), "note": buffer.note}
        print(json.dumps({**report.to_dict(), "pieces": pieces, "buffer": shuffle}, indent=2))
        return 0
    fields = ", ".join(f"{n} {tuple(s)} {d}" for n, (s, d) in report.fields.items())
    print(
        f"{report.where}: T={report.total_timesteps} ({fields}), "
        f"{format_bytes(report.step_bytes)} per timestep"
    )
    if report.val_timesteps:
        print(
            f"  validation: {report.val_timesteps} timesteps held out, "
            f"{report.train_timesteps} for training"
        )
    e = report.epoch
    print(f"epoch: {e.describe()}")
    if pieces is not None:
        print(
            f"pieces: {pieces['pieces']} x {pieces['piece_size']} timesteps per chunk, "
            f"starts aligned to {pieces['piece_align']} (stored time chunk "
            f"{pieces['time_chunk']}); {pieces['sampling']}: "
            f"{pieces['chunks_per_pass'] or 'no'} chunks per pass; "
            f"{pieces['chunks_per_epoch']} chunks per epoch over {pieces['timesteps']} "
            "timesteps"
        )
        if pieces["read_amplification"] > 1:
            print(
                f"note: pieces of {pieces['piece_size']} steps on a stored time chunk of "
                f"{pieces['time_chunk']} decode up to {pieces['read_amplification']:.2f}x "
                "the bytes they use: pick pieces so chunk_size // pieces is a multiple of it"
            )
        starts = [(n, f"{c} valid piece starts") for n, c in pieces["valid_starts"].items()]
        for line in format_table(starts):
            print(line)
        if pieces["recordings"] is not None:
            shares = [RecordingShare(**r) for r in pieces["recordings"]]
            title = f"recordings (one pass: {pieces['chunks_per_pass'] or 1000} chunks):"
            for line in format_shares(shares, title):
                print(line)
    print(
        f"chunk: {report.chunk_size} timesteps = {format_bytes(report.chunk_bytes)}; "
        f"prefetch={report.prefetch}, gpu_prefetch={report.gpu_prefetch}, "
        f"workers={report.workers}, host_slots={report.host_slots} ({report.device})"
    )
    rows = [("", "device", "pinned host", "other host", "")]
    for row in (report.full, report.streaming):
        rows.append(
            (
                row.name,
                format_bytes(row.device_bytes),
                format_bytes(row.pinned_bytes),
                format_bytes(row.host_bytes),
                row.note,
            )
        )
    for line in format_table(rows, align="<>>>"):
        print(line)
    if report.device == "cuda":
        print(f"  {saving_words(report.saving)}")
    print(f"this rank's share of the node: {report.node}")
    print(buffer.describe())
    if buffer.note:
        print(buffer.note)
    print(f"mode with resident='auto': {report.mode}")
    for text in report.notes:
        print(f"note: {text}")
    b = report.budget
    if b is not None:
        budgets = ", ".join(
            f"{k} {format_bytes(v)}"
            for k, v in (("--gpu-mem", b.gpu_mem), ("--host-mem", b.host_mem))
            if v
        )
        verdict = "fits" if b.requested_fits else "does NOT fit"
        limited_by = b.limited_by
        if b.host_from != "--host-mem":
            budgets = budgets.replace("--host-mem", b.host_from)
            limited_by = limited_by.replace("--host-mem", b.host_from)
        print(f"budget ({budgets}): the requested configuration {verdict}")
        print(
            f"  largest chunk_size at the requested depths: {b.chunk_size} "
            f"({format_bytes(b.chunk_bytes)}, bounded by {limited_by})"
        )
        print(
            f"  deepest depths at that size: prefetch={b.prefetch}, "
            f"gpu_prefetch={b.gpu_prefetch}, host_slots={b.host_slots}: device "
            f"{format_bytes(b.device_bytes)}, pinned {format_bytes(b.pinned_bytes)}"
        )
    return 0
