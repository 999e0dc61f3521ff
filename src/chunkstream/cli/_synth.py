"""``chunkstream synth OUT``: write a synthetic dataset (see ``tools._synth``)."""

from __future__ import annotations

import argparse
import json

from .._errors import ConfigError

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
    p.add_argument("--layout", choices=("flyvis", "arrays"), default="flyvis",
                   help="dataset layout (default: flyvis)")  # fmt: skip
    p.add_argument("--timesteps", "-T", type=int, default=4096, help="timesteps (default 4096)")
    p.add_argument("--neurons", "-N", type=int, default=512, help="neurons (default 512)")
    p.add_argument("--stim-dims", type=int, default=64,
                   help="stimulus channels, fed to the first neurons (default 64)")  # fmt: skip
    p.add_argument("--dtype", default="float32", help="float dtype (default float32)")
    p.add_argument("--zarr-format", type=int, choices=(2, 3), default=3,
                   help="zarr format (default 3)")  # fmt: skip
    p.add_argument("--codec", choices=CODECS, default="none", help="compression (default none)")
    p.add_argument("--chunks", type=_ints, default=None,
                   help="chunk shape: t,n,c for flyvis or t,n for arrays "
                        "(default: ~8 MiB along time, other axes whole)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--regimes", type=int, default=1,
                   help="K stimulus regimes in consecutive blocks (conditions that change over "
                        "time), listed in OUT/regimes.csv for --segments (default 1: none)")  # fmt: skip
    p.add_argument("--overwrite", action="store_true", help="replace an existing dataset")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..tools import write_synthetic

    if args.timesteps < 1 or args.neurons < 1:
        raise ConfigError("--timesteps and --neurons must be >= 1: pass positive sizes.")
    info = write_synthetic(
        args.out, layout=args.layout, timesteps=args.timesteps, neurons=args.neurons,
        stim_dims=args.stim_dims, dtype=args.dtype, zarr_format=args.zarr_format,
        codec=args.codec, chunks=args.chunks, seed=args.seed, overwrite=args.overwrite,
        progress=not args.no_progress, regimes=args.regimes,
    )  # fmt: skip
    if args.json:
        print(json.dumps(info.to_dict(), indent=2))
        return 0
    print(f"wrote {info.out} ({info.layout}, zarr v{info.zarr_format}, codec {info.codec}) "
          f"in {info.seconds:.1f} s")  # fmt: skip
    for name, path in info.arrays.items():
        print(f"  {name:<12} {info.shapes[name]!s:<22} {info.dtype}  {path}")
    print(f"  {info.nbytes / 1e6:.1f} MB decoded; connectivity in {info.out}/connectivity.npz")
    if info.regimes > 1:
        print(f"  {info.regimes} stimulus regimes, blocks in {info.out}/regimes.csv (--segments)")
    return 0
