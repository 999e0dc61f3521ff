"""``chunkstream bench PATH``: does background loading keep up? (see ``tools._bench``)."""

from __future__ import annotations

import argparse
import json

from .._text import format_bytes, format_table
from ._checks import float_above, int_at_least, naming_options, new_file, note, refuse, unused
from ._plan import add_data_arguments, add_recordings_arguments, open_runs

__all__ = ["register"]

#: The library's parameter names in a refusal, and the options a bench user typed.
OPTIONS = {
    "device": "--device",
    "gpu_prefetch": "--gpu-prefetch",
    "chunk_size": "--chunk-size",
    "column": "--column",
    "stim_dims": "--stim-dims",
}


def _ints(text: str) -> list[int]:
    try:
        return [int(p) for p in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected comma-separated ints, e.g. 1,2,4,6"
        ) from None


def _pair(text: str) -> tuple[int, int]:
    values = _ints(text)
    if len(values) != 2:
        raise argparse.ArgumentTypeError(f"{text!r}: expected PREFETCH,WORKERS, e.g. 2,1")
    return values[0], values[1]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench",
        help="prefetch diagnosis: does loading keep up with training?",
        description=(
            "Stream --chunks random windows of PATH (a zarr store or URL) for every prefetch "
            "depth x reader worker count, while a simulated training step runs on each chunk "
            "(--train sleep for --train-ms, or --train matmul: real matrix work on the device). "
            "Per chunk it records the queue depth when the consumer asked, the wait, the read "
            "and the transfer time; per setting it reports mean/max wait, how often the queue "
            "was empty/full, the epoch time against the ideal bound first_read + n * "
            "max(read / workers, transfer, train), and a verdict: keeping up or not, and what "
            "to change. With --local COPY (PATH a URL, COPY a local copy of the same store) it "
            "also streams the same windows from both and reports remote vs local GB/s. With "
            "--cache DIR (PATH a URL) it streams the same windows twice through the node-local "
            "cache in DIR and reports epoch 1 (cold: fetched and kept) against epoch 2 (warm)."
        ),
    )
    p.add_argument(
        "path",
        metavar="PATH",
        nargs="+",
        help="zarr store, FlyVis run directory or URL; several: streamed as one dataset "
        "(cs.Recordings, each run's windows in proportion to its length or --weights)",
    )
    add_data_arguments(p, shape=False)
    add_recordings_arguments(p)
    p.add_argument(
        "--chunk-size",
        type=int_at_least(1),
        default=None,
        help="timesteps per chunk (default: a power of two of at most ~64 MiB)",
    )
    p.add_argument(
        "--prefetch",
        type=_ints,
        default=[1, 2, 4, 6],
        help="prefetch depths to try (default 1,2,4,6)",
    )
    p.add_argument(
        "--workers", type=_ints, default=[1, 2], help="reader worker counts to try (default 1,2)"
    )
    p.add_argument(
        "--gpu-prefetch",
        type=int_at_least(1),
        default=1,
        help="chunks kept ready on the device (default 1)",
    )
    p.add_argument(
        "--chunks",
        type=int_at_least(2, "The first chunk only fills the pipeline."),
        default=16,
        help="chunks per setting (default 16)",
    )
    p.add_argument(
        "--train",
        choices=("sleep", "matmul"),
        default="sleep",
        help="simulated training: sleep --train-ms, or matmul on the device (default sleep)",
    )
    p.add_argument(
        "--train-ms",
        type=float_above(0.0, inclusive=True),
        default=50.0,
        help="training time per chunk for --train sleep (default 50)",
    )
    p.add_argument(
        "--train-steps",
        type=int_at_least(1),
        default=4,
        help="matmuls over the whole chunk per chunk for --train matmul (default 4)",
    )
    p.add_argument("--device", default=None, help="cuda, cuda:k or cpu (default cuda if available)")
    p.add_argument("--seed", type=int_at_least(0), default=0, help="window seed (default 0)")
    p.add_argument(
        "--plot",
        default=None,
        metavar="OUT.png",
        help="write the read/transfer/compute timeline of the worst setting",
    )
    p.add_argument(
        "--plot-setting",
        type=_pair,
        default=None,
        metavar="PREFETCH,WORKERS",
        help="plot this setting instead of the worst",
    )
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="hide the progress bars (shown on a terminal only, on stderr)",
    )
    p.add_argument(
        "--local",
        default=None,
        metavar="COPY",
        help="a local copy of the store at PATH (a URL): also report the URL's "
        "throughput against it (GB/s of decoded windows, and the ratio)",
    )
    p.add_argument(
        "--cache",
        default=None,
        metavar="DIR",
        help="a cache folder for the store at PATH (a URL): also report epoch 1 and epoch 2 "
        "of the same windows through the node-local cache there",
    )
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=run)


def check(args: argparse.Namespace) -> None:
    """Refuse, before the run, what cannot work or has no effect; note what changes nothing."""
    from ..tools import is_remote

    if args.column != "voltage" and not args.flyvis:
        raise unused("--column", args.column, "--flyvis", "it picks a FlyVis column")
    if args.stim_dims is not None and not args.flyvis:
        raise unused("--stim-dims", args.stim_dims, "--flyvis", "--fields says what to read")
    for option, values in (("--prefetch", args.prefetch), ("--workers", args.workers)):
        if not values or min(values) < 1:
            raise refuse(option, ",".join(map(str, values)), "integers >= 1, e.g. 1,2,4,6")
    if len(args.path) > 1:
        for option, value in (("--local", args.local), ("--cache", args.cache)):
            if value is not None:
                raise refuse(
                    option,
                    value,
                    "one PATH",
                    f"{option} compares one remote store: bench each run on its own.",
                )
    elif args.weights is not None:
        raise unused("--weights", " ".join(args.weights), "several PATHs", "one run has no share")
    args.path = args.path[0] if len(args.path) == 1 else args.path
    if args.local is not None:
        if not is_remote(str(args.path)):
            raise refuse(
                "--local",
                args.local,
                "PATH to be a URL (s3://, gs://, https://...)",
                f"PATH {args.path!r} is local: --local compares a remote store with "
                "its local copy, so drop --local.",
            )
        if is_remote(str(args.local)):
            raise refuse("--local", args.local, "a local copy of the store", "Pass a local path.")
    if args.cache is not None and not is_remote(str(args.path)):
        raise refuse(
            "--cache",
            args.cache,
            "PATH to be a URL (s3://, gs://, https://...)",
            f"PATH {args.path!r} is local: the cache keeps copies of remote stores, so drop "
            "--cache.",
        )
    if args.plot_setting is not None:
        if args.plot is None:
            raise unused("--plot-setting", ",".join(map(str, args.plot_setting)), "--plot")
        p, w = args.plot_setting
        if p not in args.prefetch or w not in args.workers:
            raise refuse(
                "--plot-setting",
                f"{p},{w}",
                "a PREFETCH,WORKERS pair the run tries "
                f"(--prefetch {','.join(map(str, args.prefetch))}, --workers "
                f"{','.join(map(str, args.workers))})",
            )
    if args.plot is not None:
        new_file("--plot", args.plot)
    if args.train == "sleep" and args.train_steps != 4:
        raise unused("--train-steps", args.train_steps, "--train matmul", "sleep does no matmul")
    if args.train == "matmul" and args.train_ms != 50.0:
        raise unused("--train-ms", args.train_ms, "--train sleep", "matmul times itself")


def _on_cpu(device: str | None) -> bool:
    import torch

    return device == "cpu" if device is not None else not torch.cuda.is_available()


@naming_options(OPTIONS)
def run(args: argparse.Namespace) -> int:
    from ..tools import compare_cache, compare_local, open_bench_source, plot_bench, run_bench

    check(args)
    if args.gpu_prefetch != 1 and _on_cpu(args.device):
        note(
            "bench",
            f"--gpu-prefetch {args.gpu_prefetch} changes nothing on the CPU (no device copies)",
        )
    if isinstance(args.path, list):  # several runs: one dataset
        source = open_runs(args)
        where = " + ".join(map(str, args.path))
    else:
        source = open_bench_source(
            args.path, args.fields, flyvis=args.flyvis, column=args.column, stim_dims=args.stim_dims
        )
        where = args.path
    try:
        if args.chunk_size is not None and args.chunk_size > len(source):
            raise refuse(
                "--chunk-size",
                args.chunk_size,
                f"at most the {len(source)} timesteps of {where!r}",
                "Every chunk would be all of the data: pass a smaller --chunk-size.",
            )
        report = run_bench(
            source,
            chunk_size=args.chunk_size,
            prefetch=args.prefetch,
            workers=args.workers,
            gpu_prefetch=args.gpu_prefetch,
            num_chunks=args.chunks,
            train=args.train,
            train_ms=args.train_ms,
            train_steps=args.train_steps,
            device=args.device,
            seed=args.seed,
            progress=not args.no_progress,
            path=where,
        )
    finally:
        source.close()
    remote = None
    if args.local is not None:
        remote = compare_local(
            args.path,
            args.local,
            args.fields,
            flyvis=args.flyvis,
            column=args.column,
            stim_dims=args.stim_dims,
            chunk_size=report.chunk_size,
            windows=args.chunks,
            workers=max(args.workers),
            seed=args.seed,
            progress=not args.no_progress,
        )
    cached = None
    if args.cache is not None:
        cached = compare_cache(
            args.path,
            args.cache,
            args.fields,
            flyvis=args.flyvis,
            column=args.column,
            stim_dims=args.stim_dims,
            chunk_size=report.chunk_size,
            windows=args.chunks,
            workers=max(args.workers),
            seed=args.seed,
            progress=not args.no_progress,
        )
    plotted = None
    if args.plot is not None:
        chosen = report.find(*args.plot_setting) if args.plot_setting else None
        plotted = plot_bench(report, args.plot, chosen)
    if args.json:
        out = report.to_dict()
        out["plot"] = plotted
        if remote is not None:
            out["remote"] = remote.to_dict()
        if cached is not None:
            out["cache"] = cached.to_dict()
        print(json.dumps(out, indent=2))
        return 0
    print(
        f"{report.path}: chunk {report.chunk_size} timesteps ({format_bytes(report.chunk_bytes)}), "
        f"{report.num_chunks} chunks per setting, train {report.train}, {report.device}"
    )
    header = (
        "prefetch",
        "workers",
        "wait ms",
        "max ms",
        "empty",
        "full",
        "read ms",
        "xfer ms",
        "train ms",
        "epoch s",
        "ideal s",
        "x ideal",
        "",
    )
    rows = [header]
    for s in report.settings:
        rows.append(
            (
                str(s.prefetch),
                str(s.workers),
                f"{s.wait_after_first_mean_s * 1e3:.1f}",
                f"{s.wait_max_s * 1e3:.1f}",
                str(s.queue_empty),
                str(s.queue_full),
                f"{s.read_mean_s * 1e3:.1f}",
                "-" if s.transfer_mean_s is None else f"{s.transfer_mean_s * 1e3:.1f}",
                f"{s.train_mean_s * 1e3:.1f}",
                f"{s.epoch_s:.2f}",
                f"{s.ideal_s:.2f}",
                f"{s.overlap:.2f}",
                "ok" if s.keeping_up else "STALLS",
            )
        )
    for line in format_table(rows, align=">" * (len(header) - 1)):
        print(line)
    print("  (wait: mean after the first chunk; empty/full: queue when the consumer asked)")
    if any(s.overlap < 1 for s in report.settings):
        print(
            "  (x ideal below 1: the run beat the ideal bound, an estimate from mean read, "
            "copy and train times; not a failure)"
        )
    for s in report.settings:
        print(f"{s.label}: {s.verdict}")
    print(f"recommendation: {report.recommendation}")
    if remote is not None:
        print(
            f"remote vs local copy ({remote.windows} windows, {format_bytes(remote.nbytes)}): "
            f"{remote.remote_gbps:.3f} GB/s from {remote.url}, {remote.local_gbps:.3f} GB/s "
            f"from {remote.local}; remote/local = {remote.ratio:.2f}"
        )
    if cached is not None:
        for i in range(2):
            print(
                f"through the cache {cached.cache}, epoch {i + 1}: {cached.epoch_s[i]:.2f} s, "
                f"{cached.gbps[i]:.3f} GB/s; {cached.hits[i]} hits, {cached.misses[i]} "
                f"misses, {format_bytes(cached.fetched_bytes[i])} fetched"
            )
        print(f"  epoch 2 / epoch 1 = {cached.speedup:.2f}x")
        for said in cached.warnings:
            print(f"  cache warning: {said}")
    if plotted:
        print(f"timeline written to {plotted}")
    return 0
