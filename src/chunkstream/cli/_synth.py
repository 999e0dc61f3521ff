"""``chunkstream synth OUT``: write a synthetic dataset (see ``tools._synth``)."""

from __future__ import annotations

import argparse
import json

from .._text import format_bytes, format_table
from ._checks import int_at_least, refuse, writable_dir

__all__ = ["register"]


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--chunks {text!r}: expected comma-separated ints, e.g. 256,13741,4"
        ) from None


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..tools import CODECS

    p = subparsers.add_parser(
        "synth",
        help="write a synthetic dataset (FlyVis layout or plain arrays)",
        description=(
            "Write a synthetic dataset whose signals come from a sparse recurrent network "
            "driven by a smooth stimulus (learnable, compresses like real data). The flyvis "
            "layout writes OUT/timeseries.zarr (T, N, 4: voltage, stimulus, calcium, "
            "fluorescence) and OUT/metadata.zarr (N, 5); the arrays layout writes "
            "OUT/voltage.zarr (T, N) and OUT/stimulus.zarr (T, stim_dims). Both write "
            "OUT/connectivity.npz (CSR). Memory stays bounded: it writes in ~64 MiB slabs."
        ),
    )
    p.add_argument("out", metavar="OUT", help="output directory")
    p.add_argument(
        "--layout",
        choices=("flyvis", "arrays"),
        default="flyvis",
        help="dataset layout (default: flyvis)",
    )
    p.add_argument(
        "--timesteps", "-T", type=int_at_least(1), default=4096, help="timesteps (default 4096)"
    )
    p.add_argument(
        "--neurons", "-N", type=int_at_least(1), default=512, help="neurons (default 512)"
    )
    p.add_argument(
        "--stim-dims",
        type=int_at_least(0),
        default=None,
        help="stimulus channels, fed to the first neurons (default 64, or N when fewer)",
    )
    p.add_argument(
        "--dtype",
        choices=("float16", "float32", "float64"),
        default="float32",
        help="float dtype (default float32)",
    )
    p.add_argument(
        "--zarr-format", type=int, choices=(2, 3), default=3, help="zarr format (default 3)"
    )
    p.add_argument("--codec", choices=CODECS, default="none", help="compression (default none)")
    p.add_argument(
        "--chunks",
        type=_ints,
        default=None,
        help="chunk shape: t,n,c for flyvis or t,n for arrays "
        "(default: ~8 MiB along time, other axes whole)",
    )
    p.add_argument("--seed", type=int_at_least(0), default=0, help="random seed (default 0)")
    p.add_argument(
        "--regimes",
        type=int_at_least(1),
        default=1,
        help="K stimulus regimes in consecutive blocks (conditions that change over "
        "time), listed in OUT/regimes.csv for --segments (default 1: none)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing dataset")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="hide the progress bar (shown on a terminal only, on stderr)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def check(args: argparse.Namespace) -> None:
    """Refuse what ``write_synthetic`` would, naming the options, before anything is written;
    fill ``--stim-dims``'s default."""
    n, t = args.neurons, args.timesteps
    if args.stim_dims is None:
        args.stim_dims = min(64, n)
    elif args.stim_dims > n:
        raise refuse(
            "--stim-dims",
            args.stim_dims,
            f"at most --neurons={n}",
            f"Pass --stim-dims {n} or fewer, or raise --neurons.",
        )
    if args.regimes > t:
        raise refuse(
            "--regimes",
            args.regimes,
            f"at most --timesteps={t}",
            "Each regime needs at least one timestep.",
        )
    if args.chunks is not None:
        rank = 3 if args.layout == "flyvis" else 2
        example = "t,n,c, e.g. 256,512,4" if rank == 3 else "t,n, e.g. 256,512"
        if len(args.chunks) != rank or min(args.chunks) < 1:
            raise refuse(
                "--chunks",
                ",".join(map(str, args.chunks)),
                f"{rank} positive ints for --layout {args.layout}: {example}",
            )
        # A chunk larger than the array is refused, not cut to its shape in silence.
        shape = (t, args.neurons, 4) if rank == 3 else (t, args.neurons)
        if any(c > n for c, n in zip(args.chunks, shape, strict=True)):
            fit = ",".join(str(min(c, n)) for c, n in zip(args.chunks, shape, strict=True))
            raise refuse(
                "--chunks",
                ",".join(map(str, args.chunks)),
                f"a chunk no larger than the array's shape {','.join(map(str, shape))} "
                "(--timesteps, --neurons" + (", 4 columns)" if rank == 3 else ")"),
                f"Pass --chunks {fit}.",
            )
    writable_dir("OUT", args.out)


def run(args: argparse.Namespace) -> int:
    from ..tools import write_synthetic

    check(args)
    info = write_synthetic(
        args.out,
        layout=args.layout,
        timesteps=args.timesteps,
        neurons=args.neurons,
        stim_dims=args.stim_dims,
        dtype=args.dtype,
        zarr_format=args.zarr_format,
        codec=args.codec,
        chunks=args.chunks,
        seed=args.seed,
        overwrite=args.overwrite,
        progress=not args.no_progress,
        regimes=args.regimes,
    )
    if args.json:
        print(json.dumps(info.to_dict(), indent=2))
        return 0
    print(
        f"wrote {info.out} ({info.layout}, zarr v{info.zarr_format}, codec {info.codec}) "
        f"in {info.seconds:.1f} s"
    )
    rows = [
        (name, str(info.shapes[name]), str(info.dtype), path) for name, path in info.arrays.items()
    ]
    for line in format_table(rows):
        print(line)
    print(f"  {format_bytes(info.nbytes)} decoded; connectivity in {info.out}/connectivity.npz")
    if info.regimes > 1:
        print(f"  {info.regimes} stimulus regimes, blocks in {info.out}/regimes.csv (--segments)")
    return 0
