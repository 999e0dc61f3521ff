"""Field specifications on the command line: ``name=[ARRAY][INDEX]``.

A field names a selection on the non-time axes of one array, with the same
meaning as ``ZarrSource(fields=...)``: ``voltage=:,0`` is
``timeseries[:, :, 0]`` for a ``(T, N, 4)`` array. The array may be named when
the store holds several: ``voltage=timeseries[:,0]``. Index items are an int,
a slice ``start:stop[:step]`` or empty/``:`` for the whole axis; axes not named
are taken whole. ``voltage=`` (empty) selects every non-time element.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .._errors import ConfigError, FieldSelectionError

__all__ = [
    "FieldRequest",
    "format_index",
    "parse_field",
    "parse_fields",
    "parse_index",
    "selected_shape",
    "validate_index",
]

Index = tuple[int | slice, ...]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_WITH_ARRAY = re.compile(r"^(?P<array>[^\[\]]+)\[(?P<index>[^\[\]]*)\]$")


@dataclass(frozen=True, kw_only=True)
class FieldRequest:
    """One parsed field: its ``name``, the ``array`` it reads (None: the store's
    default array) and the ``index`` on that array's non-time axes."""

    name: str
    array: str | None
    index: Index


def parse_index(text: str) -> Index:
    """Parse ``":,0"`` or ``"0:1736,1"`` into ``(slice(None), 0)`` / ``(slice(0, 1736), 1)``."""
    text = text.strip()
    if text == "":
        return ()
    items: list[int | slice] = []
    for raw in text.split(","):
        item = raw.strip()
        try:
            if ":" in item:
                parts = item.split(":")
                if len(parts) > 3:
                    raise ValueError(item)
                nums = [int(p) if p.strip() else None for p in parts]
                items.append(slice(*nums))
            elif item == "":
                items.append(slice(None))
            else:
                items.append(int(item))
        except ValueError:
            raise ConfigError.bad(
                "index",
                text,
                "comma-separated ints or start:stop[:step] slices, e.g. ':,0' or '0:1736,1'",
            ) from None
    return tuple(items)


def parse_field(text: str) -> FieldRequest:
    """Parse one ``name=[ARRAY[]INDEX[]]`` string (see the module docs)."""
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or not _NAME.match(name):
        raise ConfigError.bad(
            "--fields",
            text,
            "NAME=INDEX or NAME=ARRAY[INDEX], e.g. 'voltage=:,0' or 'voltage=timeseries[:,0]'",
        )
    rest = rest.strip()
    match = _WITH_ARRAY.match(rest)
    if match:
        return FieldRequest(
            name=name, array=match["array"].strip(), index=parse_index(match["index"])
        )
    return FieldRequest(name=name, array=None, index=parse_index(rest))


def parse_fields(fields: Iterable[str] | Mapping[str, object] | None) -> list[FieldRequest]:
    """Parse CLI strings, or take a ``{name: index}`` mapping as ZarrSource does.

    A mapping value may be a tuple index, an int, a slice or an index string.
    """
    if fields is None:
        return []
    requests: list[FieldRequest] = []
    if isinstance(fields, Mapping):
        for name, value in fields.items():
            if isinstance(value, str):
                requests.append(parse_field(f"{name}={value}"))
            else:
                index = value if isinstance(value, tuple) else (value,)
                requests.append(FieldRequest(name=str(name), array=None, index=index))
    else:
        requests = [parse_field(text) for text in fields]
    names = [r.name for r in requests]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError.bad("--fields", dupes, "each field name once", "Rename one of them.")
    return requests


def validate_index(name: str, index: Index, shape: tuple[int, ...], where: str) -> Index:
    """Check ``index`` against the non-time ``shape``; return it padded to every axis.

    Raises ``FieldSelectionError`` naming the field, the axis and the valid range.
    """
    if len(index) > len(shape):
        raise FieldSelectionError(
            f"field {name!r} indexes {len(index)} non-time axes of {where}, which has "
            f"{len(shape)} (shape after time {shape}): drop the extra index items."
        )
    full: list[int | slice] = []
    for axis, (item, size) in enumerate(
        zip((*index, *[slice(None)] * len(shape)), shape, strict=False)
    ):
        if isinstance(item, slice):
            if item.step is not None and item.step <= 0:
                raise FieldSelectionError(
                    f"field {name!r}: slice step {item.step} on axis {axis + 1} of {where} "
                    "must be positive."
                )
            start, stop, _ = item.indices(size)
            if stop <= start:
                raise FieldSelectionError(
                    f"field {name!r}: slice {format_index((item,))} on axis {axis + 1} of "
                    f"{where} selects nothing (axis length {size}): give a non-empty range."
                )
            full.append(item)
        elif isinstance(item, int) and not isinstance(item, bool):
            if not -size <= item < size:
                raise FieldSelectionError(
                    f"field {name!r}: index {item} on axis {axis + 1} of {where} is out of "
                    f"range for length {size}: use 0..{size - 1}."
                )
            full.append(item % size)
        else:
            raise FieldSelectionError(
                f"field {name!r}: index item {item!r} on axis {axis + 1} of {where} must be "
                "an int or a slice."
            )
    return tuple(full)


def selected_shape(index: Index, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Per-timestep shape of a validated, padded ``index`` on non-time ``shape``."""
    return tuple(
        len(range(*item.indices(size)))
        for item, size in zip(index, shape, strict=True)
        if isinstance(item, slice)
    )


def format_index(index: Index) -> str:
    """The CLI spelling of an index: ``(slice(None), 0)`` -> ``":,0"``."""
    parts = []
    for item in index:
        if isinstance(item, slice):
            text = f"{'' if item.start is None else item.start}:{'' if item.stop is None else item.stop}"
            if item.step not in (None, 1):
                text += f":{item.step}"
            parts.append(text)
        else:
            parts.append(str(item))
    return ",".join(parts)
