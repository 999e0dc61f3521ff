"""The FlyVis layout: the original users' data, and how to stream it.

``<path>/timeseries.zarr`` is float32 of shape ``(T, N, 4)``; its last axis holds
the dynamic columns in the order VOLTAGE, STIMULUS, CALCIUM, FLUORESCENCE.
``<path>/metadata.zarr`` is ``(N, 5)``: the static columns INDEX, XPOS, YPOS,
GROUP_TYPE, TYPE. Column ids are those of the full 9-column layout::

    0 INDEX  1 XPOS  2 YPOS  3 VOLTAGE  4 STIMULUS  5 GROUP_TYPE  6 TYPE
    7 CALCIUM  8 FLUORESCENCE

The stimulus is column 4 limited to its first ``stim_dims`` neurons.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from ._errors import ConfigError, NotZarrError, SourceNotFoundError, check_int
from .sources import Source, ZarrSource, close_store, is_url, open_zarr_array, store_errors

__all__ = [
    "CALCIUM",
    "DYNAMIC_COLUMNS",
    "FLUORESCENCE",
    "GROUP_TYPE",
    "INDEX",
    "STATIC_COLUMNS",
    "STIMULUS",
    "TYPE",
    "VOLTAGE",
    "XPOS",
    "YPOS",
    "make_load_fn",
    "open",
    "read_metadata",
    "write",
    "write_array",
]

INDEX, XPOS, YPOS, VOLTAGE, STIMULUS, GROUP_TYPE, TYPE, CALCIUM, FLUORESCENCE = range(9)
#: column id -> (name, position on the last axis of timeseries.zarr)
DYNAMIC_COLUMNS = {
    VOLTAGE: ("voltage", 0),
    STIMULUS: ("stimulus", 1),
    CALCIUM: ("calcium", 2),
    FLUORESCENCE: ("fluorescence", 3),
}
#: column id -> (name, position on the last axis of metadata.zarr)
STATIC_COLUMNS = {
    INDEX: ("index", 0),
    XPOS: ("xpos", 1),
    YPOS: ("ypos", 2),
    GROUP_TYPE: ("group_type", 3),
    TYPE: ("type", 4),
}
_BY_NAME = {name: cid for cid, (name, _) in {**DYNAMIC_COLUMNS, **STATIC_COLUMNS}.items()}


def _dynamic(column: str | int, param: str) -> tuple[str, int]:
    """``(name, last-axis position)`` of a dynamic column given by name or id."""
    cid = _BY_NAME.get(column.lower(), column) if isinstance(column, str) else column
    if cid in STATIC_COLUMNS:
        raise ConfigError.bad(
            param,
            column,
            f"a dynamic column ({_choices()})",
            f"{STATIC_COLUMNS[cid][0]!r} is static: read it from metadata.zarr instead, "
            "e.g. `chunkstream.flyvis.read_metadata(path)`.",
        )
    if isinstance(cid, bool) or cid not in DYNAMIC_COLUMNS:
        raise ConfigError.bad(param, column, f"a dynamic column ({_choices()})")
    return DYNAMIC_COLUMNS[cid]


def _choices() -> str:
    return ", ".join(f"{n!r} or {cid}" for cid, (n, _) in DYNAMIC_COLUMNS.items())


def _child(path: str | Path, name: str) -> str:
    text = str(path)
    if "://" in text:
        return f"{text.rstrip('/')}/{name}"
    return str(Path(text).expanduser() / name)


def open(  # shadows the built-in on purpose: `cs.flyvis.open` is the fixed name
    path: str | Path,
    column: str | int = "voltage",
    stim_dims: int | None = None,
    **kwargs: object,
) -> Source:
    """A source over ``<path>/timeseries.zarr`` with two fields.

    The fields are ``<column name>`` (``timeseries[:, :, k]``) and
    ``"stimulus"`` (``timeseries[:, :stim_dims, 1]``; all neurons if
    ``stim_dims`` is None). With ``column="stimulus"`` there is one field.
    ``kwargs`` go to ``ZarrSource`` (``check_missing``, ``read_threads``, ...).
    A folder written by ``chunkstream convert --flyvis`` (one array per field)
    opens as a :class:`~chunkstream.sources.ZarrGroupSource` with the same fields.
    """
    name, k = _dynamic(column, "column")
    if stim_dims is not None:
        check_int("stim_dims", stim_dims, expected="a positive int or None (all neurons)")
    if _is_per_field(path):
        # The layout `chunkstream convert --flyvis` writes: one array per field.
        from .sources import ZarrGroupSource

        stim_ref = ("stimulus", (slice(0, stim_dims),))
        refs = {"stimulus": stim_ref} if name == "stimulus" else {name: name, "stimulus": stim_ref}
        return ZarrGroupSource(path, refs, **kwargs)
    stim = (slice(0, stim_dims), 1)
    fields = (
        {"stimulus": stim} if name == "stimulus" else {name: (slice(None), k), "stimulus": stim}
    )
    return ZarrSource(_child(path, "timeseries.zarr"), fields, **kwargs)


def _is_per_field(path: str | Path) -> bool:
    """Whether ``path`` is a group written by ``chunkstream convert`` (one array per field)."""
    if "://" in str(path) or (Path(path) / "timeseries.zarr").exists():
        return False
    try:
        attrs = dict(zarr.open_group(str(path), mode="r").attrs)
    except (FileNotFoundError, ValueError, TypeError):
        return False
    return dict(attrs.get("chunkstream", {})).get("layout") == "per-field"


def read_metadata(
    path: str | Path, *, storage_options: Mapping[str, Any] | None = None
) -> np.ndarray:
    """``<path>/metadata.zarr`` as an ``(N, 5)`` array of the static columns.

    A URL opens as ``ZarrSource`` opens one (obstore for s3/gs/az/http, with the
    timeouts and retries of ``storage_options``, failures as ``RemoteStoreError``)
    and its store is closed before returning.
    """
    target = _child(path, "metadata.zarr")
    if is_url(target):
        arr = open_zarr_array(target, storage_options=storage_options)
        try:
            with store_errors(target, "the metadata array"):
                return np.asarray(arr[...])
        finally:
            close_store(arr.store)
    if "://" not in target and not Path(target).exists():
        raise SourceNotFoundError(f"no metadata at {target!r}: expected <path>/metadata.zarr.")
    try:
        arr = zarr.open_array(target, mode="r")
    except (FileNotFoundError, ValueError, TypeError) as exc:
        raise NotZarrError(f"{target!r} is not a zarr array: {exc}") from exc
    return np.asarray(arr[...])


def make_load_fn(
    path: str | Path, column_idx: int, stim_column_idx: int, num_stim_dims: int
) -> Callable[[int, int], tuple[np.ndarray, np.ndarray]]:
    """``load_fn(start, end) -> (data (n, N), stim (n, num_stim_dims))``, opened once.

    Backs ``chunkstream.compat.create_zarr_loader``. Each call returns fresh
    arrays (the caller may keep them); ``end`` is clamped to the data length.
    """
    _, k = _dynamic(column_idx, "column_idx")
    _, ks = _dynamic(stim_column_idx, "stim_column_idx")
    source = ZarrSource(
        _child(path, "timeseries.zarr"),
        {"data": (slice(None), k), "stim": (slice(0, num_stim_dims), ks)},
    )

    def load_fn(start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        start, end = int(start), min(int(end), len(source))
        if not 0 <= start < end:
            raise ConfigError.bad(
                "(start, end)", (start, end), f"0 <= start < end <= {len(source)}"
            )
        out = {n: np.empty((end - start, *s.shape), s.dtype) for n, s in source.fields.items()}
        source.read_into(start, end, out)
        return out["data"], out["stim"]

    load_fn.source = source  # type: ignore[attr-defined]  # so callers can close it
    return load_fn


def _compressors(codec: str | None, zarr_format: int) -> object:
    """zarr ``compressors=`` for a codec name: "blosc-zstd" (bitshuffle), "zstd", "gzip", None."""
    import numcodecs
    from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

    if codec is None:
        return None
    table = {
        "blosc-zstd": (
            lambda: BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle"),
            lambda: numcodecs.Blosc(cname="zstd", clevel=3, shuffle=numcodecs.Blosc.BITSHUFFLE),
        ),
        "zstd": (lambda: ZstdCodec(level=3), lambda: numcodecs.Zstd(level=3)),
        "gzip": (lambda: GzipCodec(level=1), lambda: numcodecs.GZip(level=1)),
    }
    if codec not in table:
        raise ConfigError.bad("codec", codec, f"one of {sorted(table)} or None")
    return table[codec][0 if zarr_format == 3 else 1]()


def write_array(
    path: str | Path,
    data: np.ndarray,
    chunks: tuple[int, ...],
    *,
    zarr_format: int = 3,
    codec: str | None = "blosc-zstd",
) -> zarr.Array:
    """Write ``data`` as a new zarr array at ``path`` (overwriting), returning it."""
    arr = zarr.create_array(
        str(path),
        shape=data.shape,
        chunks=chunks,
        dtype=data.dtype,
        zarr_format=zarr_format,
        compressors=_compressors(codec, zarr_format),
        overwrite=True,
        # every chunk on disk, so an absent one means lost data (ZarrSource refuses it)
        config={"write_empty_chunks": True},
    )
    arr[...] = data
    return arr


def write(
    path: str | Path,
    timeseries: np.ndarray,
    metadata: np.ndarray,
    *,
    chunks: tuple[int, int, int] | None = None,
    zarr_format: int = 3,
    codec: str | None = "blosc-zstd",
) -> None:
    """Write a FlyVis dataset: ``timeseries (T, N, 4)`` and ``metadata (N, 5)`` under ``path``.

    ``chunks`` defaults to one column per chunk, ``(min(T, 4096), N, 1)``, so
    each field decodes only its own column.
    """
    if timeseries.ndim != 3 or timeseries.shape[2] != len(DYNAMIC_COLUMNS):
        raise ConfigError.bad("timeseries.shape", timeseries.shape, "(T, N, 4)")
    if metadata.shape != (timeseries.shape[1], len(STATIC_COLUMNS)):
        raise ConfigError.bad("metadata.shape", metadata.shape, f"({timeseries.shape[1]}, 5)")
    T, N, _ = timeseries.shape
    chunks = chunks or (min(T, 4096), N, 1)
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    write_array(root / "timeseries.zarr", timeseries, chunks, zarr_format=zarr_format, codec=codec)
    write_array(
        root / "metadata.zarr", metadata, metadata.shape, zarr_format=zarr_format, codec=codec
    )
