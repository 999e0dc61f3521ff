"""Sizes and data layouts for ``plan`` and ``bench``: byte strings, and what one timestep costs.

:func:`parse_bytes` reads ``"8GB"`` (decimal) or ``"512MiB"`` (binary);
a :class:`DataLayout` is the per-timestep shape of every field, taken from
``--shape``/``--dtype`` (:func:`layout_from_shape`) or a store's metadata
(:func:`layout_from_store`, which reads no chunk).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .._errors import ConfigError
from .._memory import parse_bytes
from .._text import format_bytes
from ..sources import FieldSpec, check_lengths, window_nbytes
from ._fieldspec import FieldRequest, parse_fields, selected_shape, validate_index
from ._stores import open_arrays, resolve_field

__all__ = [
    "DataLayout",
    "flyvis_requests",
    "format_bytes",
    "layout_from_shape",
    "layout_from_store",
    "parse_bytes",
]


@dataclass(frozen=True, kw_only=True)
class DataLayout:
    """What the plan needs to know of the data: its length and fields (and where from)."""

    total_timesteps: int
    fields: Mapping[str, FieldSpec]
    where: str
    zarr_chunk_bytes: int | None = None  # decoded bytes of the largest zarr chunk read, if known
    time_chunk: int = 1  # stored time-chunk length (lcm over the arrays read); 1 if unknown

    @property
    def step_nbytes(self) -> int:
        return window_nbytes(self.fields, 1)


def layout_from_shape(
    shape: Sequence[int],
    dtype: str = "float32",
    stim_dims: int | None = None,
    fields: Sequence[str] | None = None,
) -> DataLayout:
    """A layout of one field ``data`` of ``shape = (T, ...)`` (plus ``stimulus`` of
    ``(T, stim_dims)`` when given, the FlyVis stimulus), or of ``fields``
    (``NAME=INDEX`` strings on the non-time axes of ``shape``) instead of ``data``."""
    shape = tuple(int(s) for s in shape)
    if not shape or any(s < 1 for s in shape):
        raise ConfigError.bad("--shape", shape, "positive sizes T,N[,...], e.g. 967680,13741")
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        raise ConfigError.bad("--dtype", dtype, "a numpy dtype such as float32") from None
    if fields:
        where = f"--shape {','.join(map(str, shape))}"
        specs = {}
        for request in parse_fields(fields):
            if request.array is not None:
                raise ConfigError.bad(
                    "--fields",
                    f"{request.name}={request.array}[...]",
                    "NAME=INDEX with --shape",
                    "--shape describes one array: drop the array name.",
                )
            index = validate_index(request.name, request.index, shape[1:], where)
            specs[request.name] = FieldSpec(selected_shape(index, shape[1:]), np_dtype)
    else:
        specs = {"data": FieldSpec(shape[1:], np_dtype)}
    if stim_dims is not None:
        if stim_dims < 1:
            raise ConfigError.bad("--stim-dims", stim_dims, "a positive number of channels")
        specs["stimulus"] = FieldSpec((stim_dims,), np_dtype)
    return DataLayout(total_timesteps=shape[0], fields=specs, where=f"shape {shape} {np_dtype}")


def check_flyvis_stim_dims(arrays: Mapping[str, object], stim_dims: int | None, where: str) -> None:
    """Refuse a ``--stim-dims`` beyond the neurons of a FlyVis ``timeseries`` (a slice
    past them would silently be cut to them)."""
    series = arrays.get("timeseries")
    shape = getattr(series, "shape", None)
    if stim_dims is None or shape is None or len(shape) < 2:
        return
    if stim_dims > shape[1]:
        raise ConfigError.bad(
            "--stim-dims",
            stim_dims,
            f"at most the {shape[1]} neurons of {where}",
            f"Pass --stim-dims {shape[1]} or fewer.",
        )


def flyvis_requests(column: str | int, stim_dims: int | None) -> list[FieldRequest]:
    """The two FlyVis fields as requests on ``timeseries`` (see ``chunkstream.flyvis``)."""
    from .. import flyvis

    by_name = {name: (cid, pos) for cid, (name, pos) in flyvis.DYNAMIC_COLUMNS.items()}
    key = column.lower() if isinstance(column, str) and not column.isdigit() else int(column)
    pos = next((p for cid, (n, p) in flyvis.DYNAMIC_COLUMNS.items() if key in (cid, n)), None)
    if pos is None:
        raise ConfigError.bad(
            "--column",
            column,
            f"a dynamic column: one of {sorted(by_name)} or ids {sorted(flyvis.DYNAMIC_COLUMNS)}",
            "Static columns live in metadata.zarr.",
        )
    name = next(n for n, (_, p) in by_name.items() if p == pos)
    stim = FieldRequest(name="stimulus", array="timeseries", index=(slice(0, stim_dims), 1))
    if name == "stimulus":
        return [stim]
    return [FieldRequest(name=name, array="timeseries", index=(slice(None), pos)), stim]


def layout_from_store(
    path: str | os.PathLike,
    fields: Sequence[str] | Mapping[str, object] | None = None,
    *,
    flyvis: bool = False,
    column: str | int = "voltage",
    stim_dims: int | None = None,
) -> DataLayout:
    """The layout of fields of a zarr store, from its metadata only (no chunk is read).

    ``fields`` as in ``chunkstream inspect --fields``; ``flyvis=True`` takes the
    FlyVis fields (``column`` and ``stimulus``) of ``PATH/timeseries.zarr``; neither
    means the store's only array, whole, as field ``data``.
    """
    arrays = open_arrays(path)
    if flyvis:
        check_flyvis_stim_dims(arrays, stim_dims, f"{str(path)!r}")
        requests = flyvis_requests(column, stim_dims)
    elif fields:
        requests = parse_fields(fields)
    elif len(arrays) == 1:
        requests = [FieldRequest(name="data", array=None, index=())]
    else:
        raise ConfigError(
            f"{str(path)!r} holds several arrays ({sorted(arrays)}): say what to stream "
            "with --fields NAME=ARRAY[INDEX] ... or --flyvis."
        )
    specs: dict[str, FieldSpec] = {}
    lengths: dict[str, int] = {}
    chunk_bytes, time_chunk = 0, 1
    for request in requests:
        _, array, index = resolve_field(request, arrays)
        specs[request.name] = FieldSpec(selected_shape(index, tuple(array.shape[1:])), array.dtype)
        lengths[request.name] = int(array.shape[0])
        chunk_bytes = max(chunk_bytes, int(np.prod(array.chunks)) * array.dtype.itemsize)
        time_chunk = math.lcm(time_chunk, int(array.chunks[0]))
    total = check_lengths(lengths, f"store {str(path)!r}")
    return DataLayout(
        total_timesteps=total,
        fields=specs,
        where=str(path),
        zarr_chunk_bytes=chunk_bytes,
        time_chunk=time_chunk,
    )
