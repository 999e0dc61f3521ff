"""``inspect``: what a store holds and how well it streams.

For every array: shape, dtype, chunk grid, codecs, decoded and stored bytes
(the compression ratio, from the chunk files' sizes), bytes per chunk and the
number of missing chunk files (zarr silently reads those as the fill value).
For requested fields: the read amplification, bytes decoded per byte used,
and a verdict with the fix.

Read amplification is a pure function of the array shape, the chunk shape and
the selection (:func:`read_amplification`); ``sources/_zarr.py`` computes the
same quantity for ``ZarrSource`` and the two should share one implementation.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import check_int
from ..sources import read_amplification as nontime_amplification
from ._codecs import describe_codecs
from ._fieldspec import Index, format_index, parse_fields, selected_shape
from ._stores import local_root, open_arrays, resolve_field

__all__ = ["ArrayReport", "FieldReport", "StoreReport", "inspect_store", "read_amplification"]

_METADATA_FILES = frozenset({".zarray", ".zattrs", ".zgroup", ".zmetadata", "zarr.json"})
# Above this, a field wastes enough decode work that converting pays off.
_AMPLIFICATION_LIMIT = 1.2


@dataclass(frozen=True, kw_only=True)
class ArrayReport:
    """One array. ``stored_bytes``, ``ratio`` and ``missing_chunks`` are None when
    not checked (a remote store). ``chunk_bytes`` is the decoded size of one
    chunk; ``grid`` counts chunk files (shards where sharded) per axis."""

    name: str
    path: str
    zarr_format: int
    shape: tuple[int, ...]
    dtype: str
    chunks: tuple[int, ...]
    shards: tuple[int, ...] | None
    grid: tuple[int, ...]
    codecs: list[str]
    decoded_bytes: int
    stored_bytes: int | None
    ratio: float | None
    chunk_bytes: int
    stored_chunk_bytes: float | None
    missing_chunks: int | None
    missing_examples: list[str]


@dataclass(frozen=True, kw_only=True)
class FieldReport:
    """One field: the per-timestep ``shape`` it selects, its ``amplification``
    for a full pass (and ``window_amplification`` for random windows of
    ``window`` timesteps when given) and the ``verdict``."""

    name: str
    array: str
    index: str
    shape: tuple[int, ...]
    used_bytes_per_step: int
    amplification: float
    window: int | None
    window_amplification: float | None
    verdict: str


@dataclass(frozen=True, kw_only=True)
class StoreReport:
    """Everything :func:`inspect_store` found; ``verdicts`` are plain-words lines."""

    path: str
    arrays: list[ArrayReport]
    fields: list[FieldReport]
    verdicts: list[str]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def read_amplification(
    shape: tuple[int, ...],
    chunks: tuple[int, ...],
    index: Index,
    window: int | None = None,
) -> float:
    """Bytes decoded per byte used when reading ``index`` from every timestep.

    ``shape``/``chunks`` include the time axis (axis 0); ``index`` covers the
    non-time axes (missing trailing axes are whole). Each non-time axis
    contributes (elements of the chunks it touches) / (elements selected). With
    ``window``, a window of that many timesteps at a uniformly random start
    touches on average ``1 + (window - 1) / chunk_t`` time chunks, adding the
    factor ``(window + chunk_t - 1) / window`` (capped by the array length).
    """
    # The non-time factor is the one ZarrSource warns with: one implementation.
    factor = nontime_amplification(index, shape, chunks)
    if window is not None and shape[0] > 0:
        w = min(int(window), shape[0])
        decoded_t = min(w + chunks[0] - 1, max(shape[0], w))
        factor *= decoded_t / w
    return factor


def _stored_files(root: Path) -> tuple[int, int]:
    """(bytes, count) of the chunk files under an array directory."""
    total = count = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            if name not in _METADATA_FILES:
                total += os.path.getsize(os.path.join(dirpath, name))
                count += 1
    return total, count


def _array_report(name: str, array: Any) -> ArrayReport:
    shape = tuple(int(s) for s in array.shape)
    chunks = tuple(int(c) for c in array.chunks)
    shards = tuple(int(s) for s in array.shards) if array.shards else None
    file_shape = shards or chunks
    grid = tuple(-(-s // c) if s else 0 for s, c in zip(shape, file_shape, strict=True))
    itemsize = array.dtype.itemsize
    decoded = int(np.prod(shape, dtype=np.int64)) * itemsize
    chunk_bytes = int(np.prod(chunks, dtype=np.int64)) * itemsize
    root = local_root(array)
    stored = ratio = stored_per = missing = None
    examples: list[str] = []
    if root is not None and root.is_dir():
        stored, nfiles = _stored_files(root)
        ratio = decoded / stored if stored else None
        stored_per = stored / nfiles if nfiles else None
        missing = 0
        for coords in itertools.product(*(range(g) for g in grid)):
            key = array.metadata.encode_chunk_key(coords)
            if not (root / key).is_file():
                missing += 1
                if len(examples) < 3:
                    examples.append(key)
    return ArrayReport(
        name=name,
        path=str(root) if root is not None else str(array.store),
        zarr_format=int(array.metadata.zarr_format),
        shape=shape,
        dtype=str(array.dtype),
        chunks=chunks,
        shards=shards,
        grid=grid,
        codecs=describe_codecs(array),
        decoded_bytes=decoded,
        stored_bytes=stored,
        ratio=ratio,
        chunk_bytes=chunk_bytes,
        stored_chunk_bytes=stored_per,
        missing_chunks=missing,
        missing_examples=examples,
    )


def inspect_store(
    path: str | os.PathLike,
    fields: Iterable[str] | Mapping[str, Any] | None = None,
    *,
    window: int | None = None,
) -> StoreReport:
    """Report on every array under ``path`` and on the requested ``fields``.

    ``fields`` are CLI strings (``"voltage=:,0"``, ``"voltage=timeseries[:,0]"``)
    or a ``{name: index}`` mapping as for ``ZarrSource``. Opens read-only.
    Raises ``SourceNotFoundError``/``NotZarrError`` for a bad path and
    ``FieldSelectionError``/``ConfigError`` for a bad field.
    """
    if window is not None:
        check_int("window", window, 1, "Pass a window of at least one timestep.")
    arrays = open_arrays(path)
    reports = [_array_report(name, arr) for name, arr in arrays.items()]
    verdicts: list[str] = []
    for rep in reports:
        if rep.missing_chunks:
            verdicts.append(
                f"missing: {rep.name!r} lacks {rep.missing_chunks} of "
                f"{int(np.prod(rep.grid))} chunk files (e.g. {rep.missing_examples[0]}); zarr "
                "reads them as the fill value. Rewrite them, or, if they are all-fill chunks "
                "skipped on purpose, rewrite with write_empty_chunks=True."
            )
    requests = parse_fields(fields)
    resolved = [resolve_field(req, arrays) for req in requests]
    shape_of = {name: tuple(int(n) for n in arr.shape) for name, arr in arrays.items()}
    amps = [
        read_amplification(shape_of[name], tuple(arr.chunks), index)
        for name, arr, index in resolved
    ]
    # The fix converts every requested field at once, so the command is shared.
    spec = " ".join(
        f"{req.name}={format_index(index)}"
        if req.array is None
        else f"{req.name}={name}[{format_index(index)}]"
        for req, (name, _, index) in zip(requests, resolved, strict=True)
    )
    fix = f"run `chunkstream convert {path} OUT --fields {spec}`"
    field_reports: list[FieldReport] = []
    for req, (name, array, index), amp in zip(requests, resolved, amps, strict=True):
        wamp = None
        if window is not None:
            wamp = read_amplification(shape_of[name], tuple(array.chunks), index, window)
        step_shape = selected_shape(index, shape_of[name][1:])
        used = int(np.prod(step_shape, dtype=np.int64)) * array.dtype.itemsize
        kind = "interleaved" if amp > _AMPLIFICATION_LIMIT else "ok"
        verdict = f"{kind}: reading {req.name!r} decodes {amp:.1f}x the bytes it uses"
        if kind == "interleaved":
            verdict += f"; {fix}"
        if wamp is not None and wamp > 2 * amp:
            verdict += (
                f"; a random {window}-step window decodes {wamp:.1f}x (time chunks of "
                f"{array.chunks[0]} steps are long for it: convert with a smaller --chunk-mb)"
            )
        verdicts.append(verdict)
        field_reports.append(
            FieldReport(
                name=req.name,
                array=name,
                index=format_index(index),
                shape=step_shape,
                used_bytes_per_step=used,
                amplification=amp,
                window=window,
                window_amplification=wamp,
                verdict=verdict,
            )
        )
    return StoreReport(path=str(path), arrays=reports, fields=field_reports, verdicts=verdicts)
