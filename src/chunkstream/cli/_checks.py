"""The CLI's own checks: options named as the user typed them, refused before any write.

The library names its Python parameters (``stim_dims``); a command line user typed
``--stim-dims``, so every subcommand validates its options here first, with
messages of one form: ``--option VALUE is invalid: expected ...; the fix``.

* :class:`Parser` prints argparse's own refusals (a wrong type, a missing
  argument) as one line, ``chunkstream CMD: error: ...``, like the run errors.
* :func:`int_at_least` / :func:`float_above` are argparse ``type=`` functions:
  a zero, negative or non-numeric value is refused while parsing.
* :func:`refuse`, :func:`unused`, :func:`new_file` and :func:`writable_dir` are for
  the checks that need more than one option (a missing dependency option, a
  conflict, a path); :func:`note` names an option that changes nothing in this run.
* :func:`as_options` rewrites a library refusal's parameter names as options;
  :func:`naming_options` does it for everything a command's ``run`` raises.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from .._errors import ConfigError

__all__ = [
    "Parser",
    "as_options",
    "float_above",
    "int_at_least",
    "naming_options",
    "new_file",
    "note",
    "refuse",
    "unused",
    "writable_dir",
]


_TYPE_ERROR = re.compile(
    r"argument (?P<option>[^/:\s]+)\S*: '(?P<value>[^']*)' is invalid: (?P<rest>.*)", re.S
)


# reST markup the help texts borrow from docstrings: ``code``, :func:`name`.
_MARKUP = re.compile(r"``([^`]+)``|:\w+:`~?([^`]+)`")


def plain(text: str) -> str:
    """``text`` without reST markup, as a terminal shows it."""
    return _MARKUP.sub(lambda m: m[1] or m[2], text)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line, with the help to read,
    and whose help is plain text (the descriptions are docstrings, in reST)."""

    def format_help(self) -> str:
        return plain(super().format_help())

    def error(self, message: str) -> NoReturn:
        # argparse writes "argument --seed/-s: '-1' is invalid: ..."; the run's refusals
        # read "--seed -1 is invalid: ...", and so does this.
        match = _TYPE_ERROR.match(message)
        if match:
            message = f"{match['option']} {match['value']} is invalid: {match['rest']}"
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def refuse(option: str, value: object, expected: str, fix: str = "") -> ConfigError:
    """``--option VALUE is invalid: expected EXPECTED. FIX`` as a :class:`ConfigError`."""
    message = f"{option} {value} is invalid: expected {expected}."
    return ConfigError(f"{message} {fix}" if fix else message)


def int_at_least(minimum: int, fix: str = "") -> Callable[[str], int]:
    """An argparse ``type=``: an int >= ``minimum`` (argparse names the option)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            end = f" {fix}" if fix else ""
            raise argparse.ArgumentTypeError(
                f"{text!r} is invalid: expected an integer >= {minimum}.{end}"
            )
        return value

    parse.__name__ = f"int >= {minimum}"
    return parse


def float_above(
    minimum: float, fix: str = "", *, inclusive: bool = False
) -> Callable[[str], float]:
    """An argparse ``type=``: a finite float > ``minimum`` (>= with ``inclusive``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        ok = value >= minimum if inclusive else value > minimum
        if not ok or value == float("inf"):
            bound = ">=" if inclusive else ">"
            end = f" {fix}" if fix else ""
            raise argparse.ArgumentTypeError(
                f"{text!r} is invalid: expected a number {bound} {minimum:g}.{end}"
            )
        return value

    parse.__name__ = f"number > {minimum:g}"
    return parse


def unused(option: str, value: object, needs: str, why: str = "") -> ConfigError:
    """The refusal of an option that has no effect without another (``needs``): it is
    never ignored in silence."""
    because = f" ({why})" if why else ""
    return ConfigError(
        f"{option} {value} has no effect without {needs}{because}: pass {needs} too, or "
        f"drop {option}."
    )


def note(command: str, text: str) -> None:
    """A one-line note on stderr about an option that changes nothing in this run."""
    print(f"chunkstream {command}: note: {text}", file=sys.stderr)


def new_file(option: str, path: str | os.PathLike) -> Path:
    """``path`` for a file the command will write, once its folder exists and is writable
    (checked before the run, so a bad path costs nothing and creates no folder)."""
    out = Path(path)
    parent = out.parent if str(out.parent) else Path(".")
    if out.is_dir():
        raise refuse(option, str(path), "a file path, not a folder", f"Pass {path}/out.png.")
    if not parent.is_dir():
        raise refuse(
            option,
            str(path),
            f"a path in an existing folder ({str(parent)!r} is not one)",
            f"Create it first (mkdir -p {parent}) or pick another path.",
        )
    if not os.access(parent, os.W_OK):
        raise refuse(
            option,
            str(path),
            f"a path in a writable folder ({str(parent)!r} is not)",
            "Pick a folder you can write to.",
        )
    return out


def writable_dir(option: str, path: str | os.PathLike) -> Path:
    """``path`` for a folder the command will create or fill: its nearest existing
    ancestor must be a writable folder."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise refuse(option, str(path), "a folder, not a file", "Pick another path.")
    probe = out
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK):
        raise refuse(
            option,
            str(path),
            f"a folder under a writable one ({str(probe)!r} is not)",
            "Pick a folder you can write to.",
        )
    return out


def naming_options(options: dict[str, str]) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """A command's ``run``, with every :class:`ConfigError` it raises rewritten by
    :func:`as_options` to name the options the user typed."""

    def wrap(run: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(run)
        def named(args: argparse.Namespace) -> int:
            try:
                return run(args)
            except ConfigError as exc:
                raise as_options(exc, options) from exc

        return named

    return wrap


def as_options(exc: ConfigError, options: dict[str, str]) -> ConfigError:
    """``exc`` with the library's parameter names (``world_size``) written as the options
    the user typed (``--world-size``). Names with an underscore are never prose and are
    replaced anywhere; the others only as ``name=value``."""
    words = "|".join(
        re.escape(n) + ("\\b" if "_" in n else "(?==)")
        for n in sorted(options, key=len, reverse=True)
    )
    pattern = re.compile(rf"(?<![\w-])({words})")
    return ConfigError(pattern.sub(lambda m: options[m.group(1)], str(exc)))
