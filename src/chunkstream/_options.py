"""What every options object shares: the default for ``None``, and the error for a
keyword that moved into one (the less common settings of ``ChunkLoader`` and
``BatchStream`` live in ``LoaderOptions`` and ``StreamOptions``)."""

from __future__ import annotations

from dataclasses import fields
from typing import TypeVar

from ._errors import ConfigError

__all__ = ["check_moved", "check_options"]

T = TypeVar("T")


def check_options(options: object, kind: type[T], example: str) -> T:
    """``options`` as given, or ``kind()`` (the defaults) for ``None``; anything else is
    refused, with ``example`` (how to write one) as the fix."""
    if options is None:
        return kind()
    if not isinstance(options, kind):
        raise ConfigError.bad(
            "options",
            type(options).__name__,
            f"a cs.{kind.__name__} or None",
            f"Pass options=cs.{kind.__name__}({example}) with the settings to change.",
        )
    return options


def check_moved(owner: str, kind: type, moved: dict[str, object]) -> None:
    """Refuse the keywords ``owner`` does not take: one that is a field of the options
    object ``kind`` is a :class:`ConfigError` that says to pass it there; any other is
    an unknown keyword, a ``TypeError`` as Python would raise."""
    if not moved:
        return
    name, value = next(iter(moved.items()))
    if name in {f.name for f in fields(kind)}:
        raise ConfigError.bad(
            name,
            value,
            f"a setting of cs.{kind.__name__}, not a keyword of {owner}()",
            f"Pass options=cs.{kind.__name__}({name}={value!r}).",
        )
    raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}")
