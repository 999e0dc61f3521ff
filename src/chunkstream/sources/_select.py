"""Field selections on the non-time axes of one array, and the chunks they touch.

A field is an index tuple over axes ``1..ndim-1`` of an array whose axis 0 is
time: each item is an ``int`` (the axis is dropped) or a ``slice`` with step 1.
:func:`normalize_selection` turns the user's tuple into :class:`Selection`
(non-negative ints, explicit ``slice(start, stop)``, one item per axis), so the
readers and the chunk arithmetic never see negative indices or ``None``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import product

import numpy as np

from .._errors import FieldSelectionError

__all__ = [
    "Selection",
    "chunk_ranges",
    "iter_chunk_coords",
    "normalize_selection",
    "read_amplification",
]


@dataclass(frozen=True)
class Selection:
    """A normalised selection: ``items[k]`` indexes array axis ``k + 1``."""

    items: tuple[int | slice, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        """Per-timestep shape of the field (int axes dropped)."""
        return tuple(it.stop - it.start for it in self.items if isinstance(it, slice))

    def as_index(self, start: int, stop: int) -> tuple[int | slice, ...]:
        """The basic-indexing tuple for timesteps ``[start, stop)``."""
        return (slice(start, stop), *self.items)

    def as_slab(self, start: int, stop: int) -> tuple[tuple[slice, ...], tuple[int, ...]]:
        """The index of timesteps ``[start, stop)`` with every int item a length-1 slice,
        and the shape it reads (the field's shape with those axes kept, of length 1).

        The field's rows reshaped to that shape are the same memory, so a reader can
        write into them without knowing about int items (some engines mis-read int
        indices; see :mod:`._zarrs`).
        """
        index = tuple(slice(i, i + 1) if isinstance(i, int) else i for i in self.items)
        return (slice(start, stop), *index), (stop - start, *(s.stop - s.start for s in index))


def normalize_selection(name: str, index: object, shape: Sequence[int], where: str) -> Selection:
    """Validate ``index`` against the non-time axes of ``shape``; raise ``FieldSelectionError``."""
    rest = tuple(shape[1:])
    items = index if isinstance(index, tuple) else (index,)
    if len(items) > len(rest):
        raise FieldSelectionError(
            f"field {name!r} of {where} has selection {index!r} with {len(items)} items, but "
            f"the array has only {len(rest)} non-time axes (shape {tuple(shape)}). "
            "Give one int or slice per axis after the time axis."
        )
    out: list[int | slice] = []
    for axis, (item, size) in enumerate(
        zip(items + (slice(None),) * len(rest), rest, strict=False), start=1
    ):
        if isinstance(item, bool) or not isinstance(item, (int, slice)):
            if hasattr(item, "__index__") and not isinstance(item, bool):
                item = int(item)  # numpy integers
            else:
                raise FieldSelectionError(
                    f"field {name!r} of {where} has {item!r} on axis {axis}: expected an int "
                    "or a slice with step 1 (fancy and boolean indexing are not supported)."
                )
        if isinstance(item, int):
            if not -size <= item < size:
                raise FieldSelectionError(
                    f"field {name!r} of {where}: index {item} is out of range for axis {axis} "
                    f"of size {size}. Use an index in [0, {size})."
                )
            out.append(item % size)
            continue
        if item.step not in (None, 1):
            raise FieldSelectionError(
                f"field {name!r} of {where} has {item!r} on axis {axis}: only step 1 is "
                "supported. Select the contiguous range and subsample on the GPU."
            )
        for bound in (item.start, item.stop):
            if bound is not None and not -size <= bound <= size:
                raise FieldSelectionError(
                    f"field {name!r} of {where} has {item!r} on axis {axis}, which exceeds "
                    f"the axis size {size}. Use bounds in [0, {size}]."
                )
        lo, hi, _ = item.indices(size)
        if hi <= lo:
            raise FieldSelectionError(
                f"field {name!r} of {where} has {item!r} on axis {axis}, which selects no "
                f"elements of an axis of size {size}. Give a non-empty range."
            )
        out.append(slice(lo, hi))
    return Selection(tuple(out))


def _axis_chunks(item: int | slice, chunk: int) -> range:
    if isinstance(item, int):
        return range(item // chunk, item // chunk + 1)
    return range(item.start // chunk, (item.stop - 1) // chunk + 1)


def chunk_ranges(sel: Selection, chunks: Sequence[int], start: int, stop: int) -> list[range]:
    """Per axis (time first), the chunk indices that timesteps ``[start, stop)`` of ``sel`` touch."""
    time = range(start // chunks[0], (stop - 1) // chunks[0] + 1)
    return [time, *(_axis_chunks(it, c) for it, c in zip(sel.items, chunks[1:], strict=True))]


def iter_chunk_coords(ranges: Sequence[range]) -> Iterator[tuple[int, ...]]:
    """Every chunk coordinate in the product of ``ranges``."""
    return product(*ranges)


def read_amplification(
    sel: Selection | Sequence[int | slice], shape: Sequence[int], chunks: Sequence[int]
) -> float:
    """Bytes decoded per byte used on the non-time axes, given the chunk grid.

    Each axis decodes the whole of every chunk the selection touches (clipped
    to the array's extent), so e.g. chunks ``(t, N, 4)`` and selection
    ``(:, 0)`` decode 4 columns to use 1: a factor of 4. ``sel`` is a
    normalised :class:`Selection` or raw index items (negative ints and strided
    slices allowed, missing trailing axes whole), as ``chunkstream inspect`` has.
    """
    items = sel.items if isinstance(sel, Selection) else tuple(sel)
    items = (*items, *[slice(None)] * (len(shape) - 1 - len(items)))
    factor = 1.0
    for item, size, chunk in zip(items, shape[1:], chunks[1:], strict=True):
        picked = (
            np.arange(*item.indices(size)) if isinstance(item, slice) else np.array([item % size])
        )
        if picked.size == 0:
            continue
        touched = np.unique(picked // chunk)
        decoded = np.minimum(chunk, size - touched * chunk).sum()
        factor *= float(decoded) / picked.size
    return factor
