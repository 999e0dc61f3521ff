"""Shard files of zarr v3 ``sharding_indexed`` arrays, for the fast reader: layout and index.

A shard file holds its inner chunks' encoded bytes back to back (zarr writes them
in Morton order; the index says where each one is, so the order does not matter
here) and an index, at the end (zarr's default) or at the start: per inner chunk,
in C order of its position inside the shard, a uint64 pair ``(offset, nbytes)``
(little-endian with zarr's default ``bytes`` index codec, big-endian with
``BytesCodec(endian="big")``), both ``2**64 - 1`` for an inner chunk that was not
written; then, with zarr's default ``index_codecs`` (``bytes`` + ``crc32c``), the
crc32c of those pairs as 4 little-endian bytes (the crc32c codec's own order).
With the index at the start the offsets count from the file's first byte, index
included. This is zarr 3.1's ``zarr/codecs/sharding.py`` (``_ShardIndex``,
``_encode_shard_dict``).

:func:`shard_layout` says whether an array's sharding suits the fast reader;
:func:`open_shard` maps one shard file once and checks its index, after which
:meth:`Shard.chunk` slices inner chunks out of the map from any thread.
"""

from __future__ import annotations

import math
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from google_crc32c import value as crc32c  # what zarr checks a shard index with

from .._errors import CorruptChunkError

__all__ = [
    "EMPTY",
    "INDEX_CRC_FAILS",
    "NO_FILE_END",
    "Shard",
    "ShardLayout",
    "check_crc32c",
    "check_entry",
    "corrupt_error",
    "crc32c",
    "crc32c_problem",
    "data_bounds",
    "entry_outside",
    "index_entry",
    "open_shard",
    "parse_index",
    "shard_layout",
]

EMPTY = 2**64 - 1  # an index entry's offset and size both, for an inner chunk not written
#: No shard file reaches this far: an index entry beyond it is damage whatever the file's size.
NO_FILE_END = 2**63


@dataclass(frozen=True)
class ShardLayout:
    """How an array's shard files are laid out (see module docs)."""

    chunks_per_shard: tuple[int, ...]
    index_at_start: bool
    checksum: bool
    big_endian: bool = False  # the index's uint64 pairs

    @property
    def index_dtype(self) -> str:
        return ">u8" if self.big_endian else "<u8"

    @property
    def index_nbytes(self) -> int:
        return 16 * math.prod(self.chunks_per_shard) + (4 if self.checksum else 0)

    def locate(self, coords: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(shard coords, position inside the shard)`` of inner chunk ``coords``."""
        pairs = [divmod(c, n) for c, n in zip(coords, self.chunks_per_shard, strict=True)]
        return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)


def shard_layout(codec: object, shard_shape: tuple[int, ...]) -> tuple[ShardLayout, tuple] | None:
    """``(layout, inner codecs)`` if ``codec`` is a ``ShardingCodec`` we read, else ``None``.

    We read ``index_codecs`` of ``bytes`` (either byte order) with or without
    ``crc32c`` after it, the index at either end; the caller checks the inner codecs.
    """
    from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec

    if not isinstance(codec, ShardingCodec):
        return None
    index = list(codec.index_codecs)
    if not index or not isinstance(index[0], BytesCodec):
        return None
    if len(index) > 2 or (len(index) == 2 and not isinstance(index[1], Crc32cCodec)):
        return None
    # zarr validates that the inner chunks tile the shard exactly
    cps = tuple(s // c for s, c in zip(shard_shape, codec.chunk_shape, strict=True))
    big = index[0].endian is not None and index[0].endian.value == "big"
    layout = ShardLayout(cps, codec.index_location.value == "start", len(index) == 2, big)
    return layout, tuple(codec.codecs)


class Shard:
    """One shard file, mapped for one read. Thread-safe: tasks only slice the map.

    The map is not closed explicitly: it closes when the last view of it goes,
    which may be a traceback holding a decode task's frame. Mapping is safe
    because zarr replaces a file by rename (``LocalStore``'s atomic write), so a
    mapped file never shrinks under a read; a file truncated in place while
    mapped would fault (SIGBUS) where ``pread`` would return short.
    """

    def __init__(
        self,
        path: Path,
        data: memoryview,
        index: np.ndarray,
        shape: tuple[int, ...],
        bounds: tuple[int, int],
        window: tuple[int, int],
    ) -> None:
        self.path = path
        self._data = data
        self._index = index  # (inner chunks, 2) uint64, C order of position in the shard
        self._shape = shape  # inner chunks per shard, per axis
        self._bounds = bounds  # where inner chunks' bytes may lie: the file less its index
        self._window = window

    def chunk(self, position: tuple[int, ...]) -> memoryview | None:
        """The bytes of the inner chunk at ``position`` in the shard; ``None`` if it is empty."""
        entry = index_entry(self._index, position, self._shape)
        if entry is None:
            return None
        check_entry(entry, self._bounds, f"zarr shard file {self.path}", position, self._window)
        offset, nbytes = entry
        return self._data[offset : offset + nbytes]


def open_shard(path: Path, layout: ShardLayout, window: tuple[int, int]) -> Shard | None:
    """Map the shard file at ``path`` and check its index; ``None`` if there is no file.

    Raises ``CorruptChunkError`` if the file is shorter than its index or the
    index fails its checksum (an entry pointing outside the file is found when
    that inner chunk is read).
    """
    label = f"zarr shard file {path}"
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        need = layout.index_nbytes
        if size < need:
            raise corrupt_error(
                label, f"holds {size} bytes, fewer than its {need}-byte index", window
            )
        data = memoryview(mmap.mmap(fd, size, access=mmap.ACCESS_READ))  # keeps its own fd
    finally:
        os.close(fd)
    at = 0 if layout.index_at_start else size - need
    index = parse_index(data[at : at + need], layout, label, window)
    return Shard(path, data, index, layout.chunks_per_shard, data_bounds(layout, size), window)


def parse_index(
    raw: memoryview | bytes, layout: ShardLayout, label: str, window: tuple[int, int]
) -> np.ndarray:
    """The ``(inner chunks, 2)`` uint64 index from its ``layout.index_nbytes`` bytes, its
    checksum checked; ``CorruptChunkError`` naming ``label`` and ``window`` if it fails."""
    need = layout.index_nbytes
    pairs = need - 4 if layout.checksum else need
    if len(raw) != need:
        raise corrupt_error(label, f"has a {len(raw)}-byte shard index, expected {need}", window)
    if layout.checksum:
        raw = check_crc32c(raw, label, window, INDEX_CRC_FAILS)
    return np.frombuffer(raw[:pairs], layout.index_dtype).reshape(-1, 2).astype("=u8")


INDEX_CRC_FAILS = "has a shard index whose crc32c checksum fails"


def crc32c_problem(raw: memoryview | bytes, fails: str = "fails its crc32c checksum") -> str | None:
    """What is wrong with ``raw``'s trailing crc32c (4 little-endian bytes, the crc32c of
    the bytes before them: zarr's ``crc32c`` codec, on a chunk or a shard index), saying
    ``fails`` for a mismatch; ``None`` when it matches."""
    if len(raw) < 4:
        return f"holds {len(raw)} bytes, shorter than its crc32c checksum"
    stored = int.from_bytes(raw[-4:], "little")
    computed = crc32c(bytes(raw[:-4]))  # its C function takes bytes, not views
    if stored != computed:
        return f"{fails} (stored {stored:#010x}, computed {computed:#010x})"
    return None


def check_crc32c(
    raw: memoryview | bytes,
    label: str,
    window: tuple[int, int],
    fails: str = "fails its crc32c checksum",
) -> memoryview | bytes:
    """``raw`` less its trailing crc32c; ``CorruptChunkError`` naming ``label`` and
    ``window`` for what :func:`crc32c_problem` finds."""
    problem = crc32c_problem(raw, fails)
    if problem is not None:
        raise corrupt_error(label, problem, window)
    return raw[:-4]


def data_bounds(layout: ShardLayout, size: int) -> tuple[int, int]:
    """``[lo, hi)``: where inner chunks' bytes may lie in a shard file of ``size`` bytes
    (the file less its index)."""
    need = layout.index_nbytes
    return (need, size) if layout.index_at_start else (0, size - need)


def check_entry(
    entry: tuple[int, int],
    bounds: tuple[int, int],
    label: str,
    position: tuple[int, ...],
    window: tuple[int, int],
) -> None:
    """``CorruptChunkError`` naming ``label`` and ``window`` unless the index ``entry``
    ``(offset, nbytes)`` of the inner chunk at ``position`` lies inside ``bounds``
    (:func:`data_bounds`): without its checksum a damaged index is found only so."""
    offset, nbytes = entry
    lo, hi = bounds
    if offset < lo or offset + nbytes > hi:
        raise corrupt_error(label, entry_outside(entry, bounds, position), window)


def entry_outside(
    entry: tuple[int, int], bounds: tuple[int, int], position: tuple[int, ...]
) -> str:
    """What is wrong with the index ``entry`` of the inner chunk at ``position``, which
    lies outside ``bounds`` (a ``hi`` of :data:`NO_FILE_END`: the file's size unknown)."""
    (offset, nbytes), (lo, hi) = entry, bounds
    end = "the file's end" if hi == NO_FILE_END else hi
    return (
        f"has an index entry for inner chunk {position} at bytes "
        f"[{offset}, {offset + nbytes}), outside its data bytes [{lo}, {end})"
    )


def index_entry(
    index: np.ndarray, position: tuple[int, ...], chunks_per_shard: tuple[int, ...]
) -> tuple[int, int] | None:
    """``(offset, nbytes)`` of the inner chunk at ``position`` in a parsed shard ``index``;
    ``None`` where the index marks it as not written (both ``2**64 - 1``)."""
    flat = 0
    for p, n in zip(position, chunks_per_shard, strict=True):
        flat = flat * n + p  # C order, as the index lists the inner chunks
    offset, nbytes = int(index[flat, 0]), int(index[flat, 1])
    if offset == EMPTY and nbytes == EMPTY:
        return None
    return offset, nbytes


def corrupt_error(label: str, what: str, window: tuple[int, int]) -> CorruptChunkError:
    """The error for a damaged chunk or shard file, naming it and the window being read."""
    return CorruptChunkError(
        f"{label} {what}, read for timesteps [{window[0]}, {window[1]}): it is truncated or "
        "corrupt. Rewrite the array (or restore that file) and retry."
    )
