"""``chunkstream bench PATH``: does background loading keep up? (see ``tools._bench``)."""

from __future__ import annotations

import argparse
import json
import sys

from ._plan import add_data_arguments

__all__ = ["register"]


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
            "also streams the same windows from both and reports remote vs local GB/s."
        ),
    )
    p.add_argument("path", metavar="PATH", help="zarr store, FlyVis run directory or URL")
    add_data_arguments(p, shape=False)
    p.add_argument("--chunk-size", type=int, default=None,
                   help="timesteps per chunk (default: a power of two of at most ~64 MiB)")  # fmt: skip
    p.add_argument("--prefetch", type=_ints, default=[1, 2, 4, 6],
                   help="prefetch depths to try (default 1,2,4,6)")  # fmt: skip
    p.add_argument("--workers", type=_ints, default=[1, 2],
                   help="reader worker counts to try (default 1,2)")  # fmt: skip
    p.add_argument("--gpu-prefetch", type=int, default=1,
                   help="chunks kept ready on the device (default 1)")  # fmt: skip
    p.add_argument("--chunks", type=int, default=16, help="chunks per setting (default 16)")
    p.add_argument("--train", choices=("sleep", "matmul"), default="sleep",
                   help="simulated training: sleep --train-ms, or matmul on the device "
                        "(default sleep)")  # fmt: skip
    p.add_argument("--train-ms", type=float, default=50.0,
                   help="training time per chunk for --train sleep (default 50)")  # fmt: skip
    p.add_argument("--train-steps", type=int, default=4,
                   help="matmuls over the whole chunk per chunk for --train matmul (default 4)")  # fmt: skip
    p.add_argument("--device", default=None, help="cuda, cuda:k or cpu (default cuda if available)")
    p.add_argument("--seed", type=int, default=0, help="window seed (default 0)")
    p.add_argument("--plot", default=None, metavar="OUT.png",
                   help="write the read/transfer/compute timeline of the worst setting")  # fmt: skip
    p.add_argument("--plot-setting", type=_pair, default=None, metavar="PREFETCH,WORKERS",
                   help="plot this setting instead of the worst")  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--local", default=None, metavar="COPY",
                   help="a local copy of the store at PATH (a URL): also report the URL's "
                        "throughput against it (GB/s of decoded windows, and the ratio)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..tools import compare_local, open_bench_source, plot_bench, run_bench

    source = open_bench_source(args.path, args.fields, flyvis=args.flyvis, column=args.column,
                               stim_dims=args.stim_dims)  # fmt: skip
    try:
        report = run_bench(
            source, chunk_size=args.chunk_size, prefetch=args.prefetch, workers=args.workers,
            gpu_prefetch=args.gpu_prefetch, num_chunks=args.chunks, train=args.train,
            train_ms=args.train_ms, train_steps=args.train_steps, device=args.device,
            seed=args.seed, progress=not args.no_progress and sys.stderr.isatty(),
            path=args.path,
        )  # fmt: skip
    finally:
        source.close()
    remote = None
    if args.local is not None:
        remote = compare_local(
            args.path, args.local, args.fields, flyvis=args.flyvis, column=args.column,
            stim_dims=args.stim_dims, chunk_size=report.chunk_size, windows=args.chunks,
            workers=max(args.workers), seed=args.seed,
        )  # fmt: skip
    plotted = None
    if args.plot is not None:
        chosen = report.find(*args.plot_setting) if args.plot_setting else None
        plotted = plot_bench(report, args.plot, chosen)
    if args.json:
        out = report.to_dict()
        out["plot"] = plotted
        if remote is not None:
            out["remote"] = remote.to_dict()
        print(json.dumps(out, indent=2))
        return 0
    print(f"{report.path}: chunk {report.chunk_size} timesteps ({report.chunk_bytes / 1e6:.1f} "
          f"MB), {report.num_chunks} chunks per setting, train {report.train}, {report.device}")  # fmt: skip
    header = ("prefetch", "workers", "wait ms", "max ms", "empty", "full", "read ms",
              "xfer ms", "train ms", "epoch s", "ideal s", "x ideal", "")  # fmt: skip
    rows = [header]
    for s in report.settings:
        rows.append((
            str(s.prefetch), str(s.workers), f"{s.wait_after_first_mean_s * 1e3:.1f}",
            f"{s.wait_max_s * 1e3:.1f}", str(s.queue_empty), str(s.queue_full),
            f"{s.read_mean_s * 1e3:.1f}",
            "-" if s.transfer_mean_s is None else f"{s.transfer_mean_s * 1e3:.1f}",
            f"{s.train_mean_s * 1e3:.1f}", f"{s.epoch_s:.2f}", f"{s.ideal_s:.2f}",
            f"{s.overlap:.2f}", "ok" if s.keeping_up else "STALLS",
        ))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        print("  " + "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    print("  (wait: mean after the first chunk; empty/full: queue when the consumer asked)")
    for s in report.settings:
        print(f"{s.label}: {s.verdict}")
    print(f"recommendation: {report.recommendation}")
    if remote is not None:
        print(f"remote vs local copy ({remote.windows} windows, {remote.nbytes / 1e6:.1f} MB): "
              f"{remote.remote_gbps:.3f} GB/s from {remote.url}, {remote.local_gbps:.3f} GB/s "
              f"from {remote.local}; remote/local = {remote.ratio:.2f}")  # fmt: skip
    if plotted:
        print(f"timeline written to {plotted}")
    return 0
