"""``chunkstream convert IN OUT --fields ...``: rechunk a store for streaming."""

from __future__ import annotations

import argparse
import json

from .._errors import ConfigError
from .._text import format_bytes, format_table
from ._checks import float_above, int_at_least, naming_options, unused, writable_dir

__all__ = ["register"]

#: ``convert_store``'s parameter names in a refusal, and the options a user typed.
OPTIONS = {
    "column": "--column",
    "stim_dims": "--stim-dims",
    "chunk_mb": "--chunk-mb",
    "dtype": "--dtype",
    "workers": "--workers",
    "fields": "--fields",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..tools import CODECS, OUT_DTYPES

    p = subparsers.add_parser(
        "convert",
        help="rewrite a store as one time-chunked array per field",
        description=(
            "Rewrite IN into a zarr group OUT with one array per field (OUT/<field>), chunked "
            "along time only (about --chunk-mb MiB per chunk, other axes whole). Streams in "
            "slabs with bounded memory over a thread pool, resumes if interrupted (rerun the "
            "same command), verifies every field's checksum at the end and never writes to IN."
        ),
    )
    p.add_argument("input", metavar="IN", help="zarr store, group or directory to read")
    p.add_argument("out", metavar="OUT", help="output directory (a new zarr group)")
    p.add_argument(
        "--fields",
        nargs="+",
        metavar="NAME=INDEX",
        default=None,
        help="fields as NAME=INDEX on the non-time axes (e.g. 'voltage=:,0' "
        "'stimulus=0:1736,1'), or NAME=ARRAY[INDEX] when IN holds several arrays",
    )
    p.add_argument(
        "--flyvis",
        action="store_true",
        help="fill --fields for the FlyVis layout from --column and --stim-dims",
    )
    p.add_argument(
        "--column",
        default="voltage",
        help="with --flyvis: voltage, calcium, fluorescence or stimulus, or id 3/4/7/8",
    )
    p.add_argument(
        "--stim-dims",
        type=int_at_least(1),
        default=None,
        help="with --flyvis: stimulus neurons (default 1736, or N when fewer)",
    )
    p.add_argument(
        "--chunk-mb",
        type=float_above(0.0),
        default=32.0,
        help="target decoded MiB per output chunk (default 32)",
    )
    p.add_argument(
        "--codec",
        choices=CODECS,
        default="blosc-zstd",
        help="output compression (default blosc-zstd)",
    )
    p.add_argument(
        "--zarr-format", type=int, choices=(2, 3), default=3, help="output zarr format (default 3)"
    )
    p.add_argument(
        "--dtype",
        choices=OUT_DTYPES,
        default=None,
        help="write every field in this dtype (e.g. float16: half the bytes to "
        "read and stream); reports the max abs rounding error on a sample",
    )
    p.add_argument(
        "--workers",
        type=int_at_least(1),
        default=None,
        help="parallel slab copies (default min(4, this process's share of the CPUs))",
    )
    p.add_argument("--overwrite", action="store_true", help="delete an existing OUT first")
    p.add_argument("--no-verify", action="store_true", help="skip the final checksum pass")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="hide the progress bars (shown on a terminal only, on stderr)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def _stim_dims(path: str, stim_dims: int | None) -> int:
    """``--stim-dims``, or its default (1736, or the neurons of ``path/timeseries`` when
    fewer); one beyond the neurons is refused, never cut to them."""
    from ..tools import check_flyvis_stim_dims, open_arrays

    arrays = open_arrays(path)
    if stim_dims is None:
        neurons = getattr(arrays.get("timeseries"), "shape", (0, 1736))[1:2] or (1736,)
        return min(1736, int(neurons[0]))
    check_flyvis_stim_dims(arrays, stim_dims, f"{path!r}")
    return stim_dims


@naming_options(OPTIONS)
def run(args: argparse.Namespace) -> int:
    from ..tools import convert_store, flyvis_fields

    writable_dir("OUT", args.out)
    if args.flyvis:
        if args.fields:
            raise ConfigError("--flyvis fills --fields itself: pass one or the other.")
        column = int(args.column) if args.column.isdigit() else args.column
        fields = flyvis_fields(column, _stim_dims(args.input, args.stim_dims))
    elif args.column != "voltage":
        raise unused("--column", args.column, "--flyvis", "it picks a FlyVis column")
    elif args.stim_dims is not None:
        raise unused("--stim-dims", args.stim_dims, "--flyvis", "--fields says what to read")
    elif args.fields:
        fields = args.fields
    else:
        raise ConfigError("no fields to convert: pass --fields NAME=INDEX ... or --flyvis.")
    report = convert_store(
        args.input,
        args.out,
        fields=fields,
        chunk_mb=args.chunk_mb,
        codec=args.codec,
        workers=args.workers,
        zarr_format=args.zarr_format,
        overwrite=args.overwrite,
        verify=not args.no_verify,
        progress=not args.no_progress,
        dtype=args.dtype,
    )
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0
    print(
        f"converted {report.source} -> {report.out} ({report.codec}) in {report.seconds:.1f} s: "
        f"{report.slabs_written} slabs written, {report.slabs_skipped} already done"
    )
    rows = [
        (
            f.name,
            f"<- {f.source}",
            str(f.shape),
            f"chunks {f.chunks}",
            f"checksum {f.checksum_in} "
            + ("verified" if f.checksum_out == f.checksum_in else "not verified"),
        )
        for f in report.fields
    ]
    for line in format_table(rows):
        print(line)
    for f in report.fields:
        if f.max_abs_error is not None:
            print(
                f"  {f.name} as {f.dtype}: max abs rounding error {f.max_abs_error:.3g} "
                "on a sample of slabs"
            )
    ratio = report.decoded_bytes / report.stored_bytes if report.stored_bytes else 0.0
    print(
        f"  {format_bytes(report.decoded_bytes)} decoded, {format_bytes(report.stored_bytes)} "
        f"stored (ratio {ratio:.2f})"
    )
    return 0 if report.verified or args.no_verify else 1
