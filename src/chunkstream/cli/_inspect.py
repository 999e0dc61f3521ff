"""``chunkstream inspect PATH``: arrays, chunking, compression and read amplification."""

from __future__ import annotations

import argparse
import json

from .._text import format_bytes, format_table
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
    p.add_argument(
        "path",
        metavar="PATH",
        nargs="+",
        help="zarr store, group or directory (or URL); several: each is reported, then "
        "how they stream as one dataset (cs.Recordings: lengths, shares, fields)",
    )

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


def run(args: argparse.Namespace) -> int:
    if args.window is not None and not args.fields:
        raise unused("--window", args.window, "--fields", "it sizes the fields' windows")
    if len(args.path) == 1:
        return _one(args, args.path[0])
    if args.json:
        from ..tools import inspect_store

        runs = [inspect_store(p, args.fields).to_dict() for p in args.path]
        print(json.dumps({"runs": runs, "recordings": _together(args)}, indent=2))
        return 0
    for path in args.path:
        _one(args, path)
        print()
    together = _together(args)
    print(f"as one dataset (cs.Recordings, {len(args.path)} runs):")
    if "error" in together:
        print(f"  these runs cannot stream together: {together['error']}")
        return 1
    runs = [
        (
            r["name"],
            f"{r['timesteps']} timesteps from {r['offset']}, "
            f"{r['share']:.1%} of every epoch by length",
        )
        for r in together["runs"]
    ]
    for line in format_table(runs):
        print(line)
    print(f"  T={together['timesteps']}, aligned to the stored time chunk {together['time_chunk']}")
    for name, spec in together["fields"].items():
        print(f"  field {name}: per step {tuple(spec['shape'])} {spec['dtype']}")
    for line in together["notes"]:
        print(f"  {line}")
    return 0


def _together(args: argparse.Namespace) -> dict:
    """How the runs stream as one :class:`~chunkstream.Recordings`, or why they cannot."""
    from .._errors import ChunkstreamError
    from ..tools import open_recordings

    try:
        recs = open_recordings(args.path, args.fields)
    except ChunkstreamError as exc:
        return {"error": str(exc)}
    with recs:
        masks = [n for n in recs.fields if n.endswith("_mask")]
        notes = [
            f"{m[: -len('_mask')]!r} differs in shape between runs: padded to the largest, "
            f"{m!r} true where real"
            for m in masks
        ]
        return {
            "timesteps": len(recs),
            "time_chunk": recs.time_chunk,
            "runs": [
                {"name": n, "timesteps": t, "offset": o, "share": recs.shares[n]}
                for n, t, o in zip(recs.names, recs.lengths, recs.offsets, strict=True)
            ],
            "fields": {
                n: {"shape": list(s.shape), "dtype": str(s.dtype)} for n, s in recs.fields.items()
            },
            "notes": notes,
        }


def _one(args: argparse.Namespace, path: str) -> int:
    from ..tools import inspect_store

    report = inspect_store(path, args.fields, window=args.window)
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
        "decoded",
        "stored",
        "ratio",
        "chunk",
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
                format_bytes(a.decoded_bytes),
                format_bytes(a.stored_bytes),
                "-" if a.ratio is None else f"{a.ratio:.2f}",
                format_bytes(a.chunk_bytes),
                "not checked" if a.missing_chunks is None else str(a.missing_chunks),
            )
        )
    for line in format_table(rows, align="<<<<<<>>>>>"):
        print(line)
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
