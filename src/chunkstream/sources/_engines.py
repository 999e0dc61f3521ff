"""Which pipeline decodes a :class:`~chunkstream.ZarrSource`'s array, and what it must check.

``engine="auto"`` takes chunkstream's reader (:mod:`._fastzarr`) where the array
suits it, else zarr's pipeline with checked codecs (:mod:`._checked_codecs`).
An explicit engine that cannot keep the integrity rule of :mod:`._zarr` is
refused with a ``ConfigError`` saying why: ``"chunkstream"`` for an array its
reader does not take, ``"zarrs"`` for a remote store (zarrs would do its I/O
outside chunkstream's error mapping, so a server error would read as a corrupt
chunk) or for an array zarrs would decode wrongly (:func:`._zarrs.zarrs_defect`).
On the general path :func:`read_checks` builds the checks zarr and zarrs lack
(:mod:`._read_checks`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import zarr

from .._errors import ConfigError
from ._checked_codecs import with_checked_codecs
from ._fastzarr import fast_decoder
from ._read_checks import ReadChecks, raw_file_nbytes, shard_index_layout
from ._select import Selection
from ._zarrs import with_zarrs_pipeline, zarrs_defect, zstd_frame_bound

__all__ = ["ENGINES", "Engine", "choose_engine", "read_checks"]

#: The values of ``ZarrSource(engine=...)``.
ENGINES = ("auto", "chunkstream", "zarrs", "zarr")


class Engine(NamedTuple):
    """The chosen pipeline: ``name`` ("chunkstream", "zarrs" or "zarr"), the array to
    read through (re-opened for zarr's and zarrs' pipelines), and on our reader its
    ``(codec, shards)`` decoder (else ``None``)."""

    name: str
    array: zarr.Array
    decoder: tuple | None


def choose_engine(
    arr: zarr.Array, engine: str, path: str, local: Path | None, read_threads: int | None
) -> Engine:
    """The pipeline that reads ``arr`` (at ``path``; ``local`` its root on disk, if any)
    under ``engine`` (module docs); raises :class:`ConfigError` for a refused one."""
    decoder = fast_decoder(arr) if engine in ("auto", "chunkstream") else None
    if engine == "chunkstream" and decoder is None:
        raise ConfigError.bad(
            "engine",
            engine,
            '"auto", "zarrs" or "zarr" for this array',
            "chunkstream's reader takes local arrays (and unsharded remote ones read "
            "through cache=): zarr v2 with any numcodecs "
            "compressor and filters; zarr v3, sharded or not, with a bytes codec, at most "
            "one of blosc, zstd or gzip and a trailing crc32c, and no transpose.",
        )
    if decoder is not None:
        return Engine("chunkstream", arr, decoder)
    if engine != "zarrs":
        return Engine("zarr", with_checked_codecs(arr), None)
    if local is None and _is_remote_store(arr.store):
        # zarrs does a remote store's I/O in Rust and reports an HTTP 500 or a 403 as
        # a RuntimeError like a bad frame's: it could not be told from a corrupt chunk
        raise ConfigError.bad(
            "engine",
            engine,
            f'"auto" or "zarr" for the remote array {path!r}',
            "zarrs reads remote stores without chunkstream's error mapping (a server "
            'error would read as a corrupt chunk); use engine="auto".',
        )
    defect = zarrs_defect(arr)
    if defect is not None:
        raise ConfigError.bad(
            "engine",
            engine,
            f'"auto" or "zarr" for {path!r}',
            f'{defect}, so it is refused for this array; engine="auto" reads it.',
        )
    return Engine("zarrs", with_zarrs_pipeline(arr, read_threads), None)


def read_checks(
    arr: zarr.Array,
    path: str,
    local: Path | None,
    selections: Mapping[str, Selection],
    mode: object,
    check_missing: object,
    zarrs: bool,
) -> ReadChecks | None:
    """The general path's checks before each read (:mod:`._read_checks`), or ``None``
    when there is nothing to check. ``arr`` is the array as opened (before a
    pipeline was swapped in); ``mode`` is ``check_missing`` with ``"auto"`` resolved."""
    # zarrs only: the most a zstd frame may declare (see _zarrs.zstd_frame_bound)
    zstd_bound = zstd_frame_bound(arr) if zarrs else None
    shards = None
    # zarrs also aborts the process on a local shard's index entry past the file's end
    # (a truncated shard without an index checksum): its indices are read to check that
    if mode is not False or zstd_bound is not None or (zarrs and local is not None):
        shards = shard_index_layout(arr, path, check_missing)
    raw_nbytes = raw_file_nbytes(arr) if local is not None else None
    # A local chunk deleted after open reads as the fill value on these pipelines; an
    # existence check per chunk file, or a read of each shard index, per read is cheap.
    # Remote stores only where asked (check_missing=True, or "open" for shard indices).
    wanted = (
        mode is True
        or zstd_bound is not None
        or (local is not None and (mode == "open" or raw_nbytes is not None))
        or shards is not None
    )
    if not wanted:
        return None
    return ReadChecks(
        arr,
        path,
        local,
        selections,
        check_missing=mode is not False,
        shards=shards,
        raw_nbytes=raw_nbytes,
        zstd_bound=zstd_bound,
    )


def _is_remote_store(store: Any) -> bool:
    """Whether zarr's ``store`` reads over the network (fsspec, or obstore's remote stores)."""
    from zarr.storage import FsspecStore, ObjectStore

    if isinstance(store, FsspecStore):
        return True
    inner = type(getattr(store, "store", None)).__name__ if isinstance(store, ObjectStore) else ""
    return inner in ("HTTPStore", "S3Store", "GCSStore", "AzureStore")
