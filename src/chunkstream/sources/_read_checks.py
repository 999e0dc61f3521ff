"""What zarr's and zarrs' pipelines do not check, checked by ``ZarrSource`` before each read.

Our reader (:mod:`._fastzarr`) finds absent chunks and damaged frames itself. On
the general path (engines ``"zarr"`` and ``"zarrs"``) :class:`ReadChecks` runs
before each field's read and raises what the pipelines would not:

* ``MissingChunkError`` for a chunk or shard file the window needs that is
  absent (both pipelines read it as the fill value), and for an inner chunk its
  shard's index marks empty (zarr leaves out inner chunks equal to the fill
  value unless ``write_empty_chunks=True``): the index is read on its own
  (local: one ``pread``; remote: one byte-range request) and parsed by
  :mod:`._shards`;
* ``CorruptChunkError`` for an uncompressed chunk file of the wrong size (zarrs
  decodes such a chunk partially, reading only the bytes a window needs, so a
  truncated file would go unnoticed) and, on zarrs, for a zstd frame declaring
  more bytes than its chunk holds (zarrs would abort the process allocating
  them; see :func:`._zarrs.zstd_frame_bound`);
* ``CorruptChunkError`` for an entry of a local shard's index that points outside
  the shard file's data bytes (a truncated shard whose index has no checksum:
  zarrs aborts the process on such an entry; zarr's pipeline, its sharding codec
  checked by :mod:`._checked_codecs`, would find it too, but later).

Local files are checked directly with ``os`` calls, not through zarr's event
loop: a round trip per chunk file on every read adds up. With
``check_missing="open"`` :func:`check_all_chunks` lists the store once when the
source opens and raises ``MissingChunkError`` for the first chunk any field needs
that is absent.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

import numcodecs
import numpy as np
import zarr

from .._errors import ConfigError, MissingChunkError
from ._checked_codecs import CheckedShardReads, FrameError
from ._fastzarr import declared_size
from ._remote import store_errors
from ._select import Selection, chunk_ranges, iter_chunk_coords
from ._shards import (
    ShardLayout,
    check_entry,
    corrupt_error,
    data_bounds,
    index_entry,
    parse_index,
    shard_layout,
)

__all__ = [
    "ReadChecks",
    "check_all_chunks",
    "missing_error",
    "needed_keys",
    "raw_file_nbytes",
    "shard_index_layout",
]

_METADATA_FILES = ("zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata")

_ZSTD_HEADER = 18  # the longest zstd frame header: magic, descriptor, window, dict id, size


def missing_error(
    what: str, name: str, where: str, window: tuple[int, int] | None = None
) -> MissingChunkError:
    """The error for an absent chunk (``what``, e.g. "zarr chunk 'c/0/0'") of field ``name``
    that the timesteps ``window`` need (``None``: found at open, not for a read)."""
    needed = "" if window is None else f", needed for timesteps [{window[0]}, {window[1]}),"
    return MissingChunkError(
        f"{what} of field {name!r}{needed} is missing from {where}. zarr would read it as the fill "
        "value and train on it silently. Rewrite the array (or that chunk) with "
        "write_empty_chunks=True (zarr's default skips chunks equal to the fill value); pass "
        "check_missing=False only if absent chunks are meant to be fill values."
    )


def needed_keys(arr: zarr.Array, sel: Selection, start: int, stop: int) -> list[str]:
    """The store keys (chunk or shard files) that timesteps ``[start, stop)`` of ``sel`` need."""
    grid = tuple(getattr(arr, "shards", None) or arr.chunks)
    ranges = chunk_ranges(sel, grid, start, stop)
    return [arr.metadata.encode_chunk_key(c) for c in iter_chunk_coords(ranges)]


def raw_file_nbytes(arr: zarr.Array) -> int | None:
    """The exact size of every chunk file of an unsharded, uncompressed array; else ``None``."""
    from zarr.codecs import BytesCodec, Crc32cCodec, TransposeCodec

    meta = arr.metadata
    nbytes = math.prod(arr.chunks) * np.dtype(arr.dtype).itemsize
    if meta.zarr_format == 2:
        return nbytes if meta.compressor is None and not meta.filters else None
    if getattr(arr, "shards", None) is not None:
        return None
    codecs = list(meta.codecs)
    if not all(isinstance(c, (BytesCodec, Crc32cCodec, TransposeCodec)) for c in codecs):
        return None
    return nbytes + 4 * sum(isinstance(c, Crc32cCodec) for c in codecs)


def shard_index_layout(arr: zarr.Array, path: str, check_missing: object) -> ShardLayout | None:
    """The layout of ``arr``'s shard index (``None``: not sharded); ``ConfigError`` if it
    is not one chunkstream reads (``check_missing`` is the value the checks serve)."""
    if getattr(arr, "shards", None) is None:
        return None
    codecs = list(arr.metadata.codecs)
    sharded = shard_layout(codecs[0], tuple(arr.shards)) if len(codecs) == 1 else None
    if sharded is not None:
        return sharded[0]
    if check_missing is False:  # only zarrs' checks need the index then
        raise ConfigError.bad(
            "engine",
            "zarrs",
            f'"auto" or "zarr" for {path!r}',
            "zarrs aborts the process on a damaged zstd frame claiming a huge size or a "
            "shard index entry past the file's end, and this array's shard index is not one "
            'chunkstream reads to check them first; engine="auto" reads it.',
        )
    raise ConfigError.bad(
        "check_missing",
        check_missing,
        "False for this array",
        "Its shard index is not bytes (+ crc32c), which chunkstream reads, so "
        "inner chunks left out of a shard could not be told from fill values. Rewrite the "
        "array with zarr's default index codecs, or pass check_missing=False if absent "
        "chunks are meant to be fill values.",
    )


class ReadChecks:
    """The checks of the module docs for one array's general-path reads; thread-safe.

    ``root``: the array's folder for a local store, else ``None``. ``check_missing``:
    raise for absent chunks. ``shards``: the shard index layout of a sharded array
    whose indices are read. ``raw_nbytes``: the exact size of every chunk file
    (uncompressed arrays), checked where not ``None``. ``zstd_bound``: the most a
    zstd frame may declare (zarrs only).
    """

    def __init__(
        self,
        arr: zarr.Array,
        path: str,
        root: Path | None,
        selections: Mapping[str, Selection],
        *,
        check_missing: bool,
        shards: ShardLayout | None,
        raw_nbytes: int | None,
        zstd_bound: int | None,
    ) -> None:
        self._arr = arr
        self._path = path
        self._root = root
        self._selections = dict(selections)
        self._check_missing = check_missing
        self._shards = shards
        self._raw_nbytes = raw_nbytes
        self._zstd_bound = zstd_bound

    def check(self, name: str, start: int, stop: int) -> None:
        """Raise for what timesteps ``[start, stop)`` of field ``name`` need (module docs)."""
        sel = self._selections[name]
        if self._shards is not None:
            self._check_shards(name, sel, (start, stop))
            return
        from zarr.core.sync import sync

        store, prefix = self._arr.store, self._arr.store_path.path
        for key in needed_keys(self._arr, sel, start, stop):
            size = None
            if self._root is not None:
                try:
                    size = os.stat(self._root / key).st_size
                except FileNotFoundError:
                    present = False
                else:
                    present = True
                    if self._zstd_bound is not None:
                        self._check_zstd_frames(self._root / key, [0], (start, stop))
            else:
                full = f"{prefix}/{key}" if prefix else key
                with store_errors(self._path, f"whether chunk {key!r} exists"):
                    present = sync(store.exists(full))
            if not present and self._check_missing:
                raise missing_error(f"zarr chunk {key!r}", name, repr(self._path), (start, stop))
            if present and self._raw_nbytes not in (None, size):
                raise corrupt_error(
                    f"zarr chunk file {self._root / key}",
                    f"holds {size} bytes, expected {self._raw_nbytes}",
                    (start, stop),
                )

    def _check_shards(self, name: str, sel: Selection, window: tuple[int, int]) -> None:
        layout = self._shards
        positions: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        for coords in iter_chunk_coords(chunk_ranges(sel, self._arr.chunks, *window)):
            shard, position = layout.locate(coords)
            positions.setdefault(shard, []).append(position)
        for shard, wanted in positions.items():
            key = self._arr.metadata.encode_chunk_key(shard)
            found = self._read_index(key, window)
            if found is None:
                if self._check_missing:
                    raise missing_error(f"zarr shard {key!r}", name, repr(self._path), window)
                continue
            index, size = found
            offsets = []
            for position in wanted:
                entry = index_entry(index, position, layout.chunks_per_shard)
                if entry is not None:
                    if size is not None:  # zarrs aborts the process on an entry past the file
                        check_entry(
                            entry,
                            data_bounds(layout, size),
                            f"zarr shard file {self._root / key}",
                            position,
                            window,
                        )
                    offsets.append(entry[0])
                elif self._check_missing:
                    what = (
                        f"inner chunk {position} of zarr shard {key!r} (the shard's index "
                        "marks it empty)"
                    )
                    raise missing_error(what, name, repr(self._path), window)
            if self._zstd_bound is not None and self._root is not None:
                self._check_zstd_frames(self._root / key, offsets, window)

    def _read_index(
        self, key: str, window: tuple[int, int]
    ) -> tuple[np.ndarray, int | None] | None:
        """``(the parsed index of shard key, the file's size where local)``, the index read
        on its own; ``None`` where there is no such shard."""
        layout = self._shards
        need = layout.index_nbytes
        if self._root is not None:
            label = f"zarr shard file {self._root / key}"
            try:
                fd = os.open(self._root / key, os.O_RDONLY)
            except FileNotFoundError:
                return None
            try:
                size = os.fstat(fd).st_size
                if size < need:
                    raise corrupt_error(
                        label, f"holds {size} bytes, fewer than its {need}-byte index", window
                    )
                raw = os.pread(fd, need, 0 if layout.index_at_start else size - need)
            finally:
                os.close(fd)
            return parse_index(raw, layout, label, window), size
        from zarr.abc.store import RangeByteRequest, SuffixByteRequest
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.sync import sync
        from zarr.storage import StorePath

        prefix = self._arr.store_path.path
        full = f"{prefix}/{key}" if prefix else key
        request = RangeByteRequest(0, need) if layout.index_at_start else SuffixByteRequest(need)
        label = f"zarr shard {key!r} of {self._path!r}"
        # checked as the read itself checks it: a shard shorter than its index is damage,
        # not the network error its failed range request (HTTP 416) looks like
        reads = CheckedShardReads(StorePath(self._arr.store, full), layout, label)
        try:
            with store_errors(self._path, f"the index of shard {key!r}"):
                buf = sync(reads.get(default_buffer_prototype(), request))
        except FrameError as exc:
            raise corrupt_error(label, str(exc).removeprefix(f"{label} "), window) from exc
        return None if buf is None else (parse_index(buf.to_bytes(), layout, label, window), None)

    def _check_zstd_frames(self, path: Path, offsets: list[int], window: tuple[int, int]) -> None:
        """``CorruptChunkError`` for a zstd frame at one of ``offsets`` in ``path`` that
        declares more than the bound (zarrs would abort allocating it)."""
        fd = os.open(path, os.O_RDONLY)
        try:
            for offset in offsets:
                header = memoryview(os.pread(fd, _ZSTD_HEADER, offset))
                declared = declared_size(numcodecs.Zstd(), header)
                if declared is not None and declared > self._zstd_bound:
                    where = (
                        f"zarr chunk file {path}"
                        if self._shards is None
                        else f"the inner chunk at byte {offset} of zarr shard file {path}"
                    )
                    raise corrupt_error(
                        where,
                        f"holds a zstd frame declaring {declared} bytes, more than the "
                        f"{self._zstd_bound} its content can hold",
                        window,
                    )
        finally:
            os.close(fd)


def check_all_chunks(
    array: zarr.Array,
    selections: Mapping[str, Selection],
    length: int,
    path: str,
    local: Path | None,
) -> None:
    """List the store once (``local``: its root on disk; else through zarr) and raise
    ``MissingChunkError`` for the first chunk a field needs over ``[0, length)`` that
    is absent."""
    present = _list_local(local) if local is not None else _list_remote(array, path)
    for name, sel in selections.items():
        for key in needed_keys(array, sel, 0, length):
            if key not in present:
                raise missing_error(f"zarr chunk {key!r}", name, repr(path))


def _list_remote(array: zarr.Array, path: str) -> set[str]:
    from zarr.core.sync import collect_aiterator

    prefix = array.store_path.path
    # collect_aiterator runs the listing on zarr's loop itself (wrapping it in sync() failed)
    with store_errors(path, "the list of chunk keys"):
        keys = collect_aiterator(array.store.list_prefix(prefix))
    cut = len(prefix) + 1 if prefix else 0
    return {k[cut:] for k in keys}


def _list_local(root: Path) -> set[str]:
    """Every file under ``root`` as a ``/``-separated key, metadata files excluded."""
    keys: set[str] = set()
    stack = [(str(root), "")]
    while stack:
        folder, prefix = stack.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=True):
                    stack.append((entry.path, f"{prefix}{entry.name}/"))
                elif entry.name not in _METADATA_FILES:
                    keys.add(prefix + entry.name)
    return keys
