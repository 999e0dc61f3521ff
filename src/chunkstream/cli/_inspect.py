"""``chunkstream inspect PATH``: arrays, chunking, compression and read amplification."""

from __future__ import annotations

import argparse
import json

from ._checks import int_at_least, refuse, unused

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "inspect",
        help="list arrays, chunks, codecs, compression; read amplification of fields",
        description=(
            "List every array under PATH (a zarr array, a group, or a directory of .zarr "
            "stores) with shape, dtype, chunk grid, codecs, decoded and stored bytes, "
            "compression ratio, bytes per chunk and missing chunk files (local stores only). "
            "With --fields, show how many bytes reading each field decodes per byte it uses, "
            "and what to do about it."
        ),
    )
    p.add_argument("path", metavar="PATH", help="zarr store, group or directory (or URL)")
    p.add_argument(
        "--fields",
        nargs="+",
        metavar="NAME=INDEX",
        default=None,
        help="fields as NAME=INDEX on the non-time axes (e.g. 'voltage=:,0' "
        "'stimulus=0:1736,1'), or NAME=ARRAY[INDEX] when PATH holds several arrays",
    )
    p.add_argument(
        "--window",
        type=int_at_least(1),
        default=None,
        help="also report amplification for random windows of this many timesteps",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def _mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e6:.2f}"


def run(args: argparse.Namespace) -> int:
    from ..tools import inspect_store

    if args.window is not None and not args.fields:
        raise unused("--window", args.window, "--fields", "it sizes the fields' windows")
    report = inspect_store(args.path, args.fields, window=args.window)
    timesteps = {a.name: a.shape[0] for a in report.arrays}
    for f in report.fields:
        if args.window is not None and args.window > timesteps[f.array]:
            raise refuse(
                "--window",
                args.window,
                f"at most the {timesteps[f.array]} timesteps of {f.array!r}",
                "Pass a window no longer than the data.",
            )
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0
    print(f"{report.path}")
    header = (
        "array",
        "shape",
        "dtype",
        "chunks",
        "grid",
        "codecs",
        "MB",
        "stored MB",
        "ratio",
        "MB/chunk",
        "missing",
    )
    rows = [header]
    for a in report.arrays:
        rows.append(
            (
                a.name,
                "x".join(map(str, a.shape)),
                a.dtype,
                "x".join(map(str, a.chunks)),
                "x".join(map(str, a.grid)),
                ",".join(a.codecs) or "none",
                _mb(a.decoded_bytes),
                _mb(a.stored_bytes),
                "-" if a.ratio is None else f"{a.ratio:.2f}",
                _mb(a.chunk_bytes),
                "not checked" if a.missing_chunks is None else str(a.missing_chunks),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        print("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    if report.fields:
        print("fields:")
        for f in report.fields:
            line = f"  {f.name}: {f.array}[{f.index}] -> per step {f.shape}, amplification {f.amplification:.2f}x"
            if f.window_amplification is not None:
                line += f", {f.window_amplification:.2f}x for {f.window}-step windows"
            print(line)
    for verdict in report.verdicts:
        print(verdict)
    return 0
