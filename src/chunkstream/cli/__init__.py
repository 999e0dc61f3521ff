"""The ``chunkstream`` command line: one entry point, one module per subcommand.

Each subcommand lives in ``chunkstream/cli/_<name>.py`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a callable
``func(args) -> int``. Errors the user can fix (a bad path, an impossible
setting) are ``ChunkstreamError``/``OSError``/``ValueError``; they print one
line naming the problem and the fix and exit with status 2; ``--debug`` (or
``CHUNKSTREAM_DEBUG=1``) shows the traceback instead, so a bug can be told from a
user error. No command, as any usage error, exits 2. The subcommands import
torch and zarr only when they run, so ``--help`` is quick.
Options are checked (``_checks``) before anything is written, and an option
that has no effect in the given combination is refused or noted, never ignored.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

__all__ = ["main"]

# Order is the order shown by --help.
_COMMANDS = ("demo", "synth", "inspect", "convert", "plan", "bench")


def build_parser() -> argparse.ArgumentParser:
    from ._checks import Parser

    parser = Parser(
        prog="chunkstream",
        description="Stream windows of huge zarr time series to the GPU while the model trains.",
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"chunkstream {__version__}")
    parser.add_argument(
        "--debug",
        action="store_true",
        default=os.environ.get("CHUNKSTREAM_DEBUG", "") not in ("", "0"),
        help="show the traceback of an error (also CHUNKSTREAM_DEBUG=1)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMANDS:
        try:
            module = importlib.import_module(f"{__name__}._{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__name__}._{name}":
                continue  # subcommand not built yet
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a usage error, printed in one line: its status, as a run's
        if exc.code in (0, None):  # --help, --version
            raise
        return int(exc.code) if isinstance(exc.code, int) else 2
    if getattr(args, "func", None) is None:  # a usage error, as argparse's convention
        parser.print_usage(sys.stderr)
        print(
            f"{parser.prog}: error: a command is required (see {parser.prog} --help)",
            file=sys.stderr,
        )
        return 2
    from .._errors import ChunkstreamError, FieldSelectionError

    try:
        return int(args.func(args) or 0)
    except (ChunkstreamError, OSError, ValueError) as exc:
        if args.debug:
            raise
        # A selection error names the field; the user typed it in --fields.
        where = "--fields: " if isinstance(exc, FieldSelectionError) else ""
        print(f"chunkstream {args.command}: error: {where}{exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"chunkstream {args.command}: interrupted", file=sys.stderr)
        return 130
