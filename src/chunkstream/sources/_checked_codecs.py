"""Checked codecs for zarr's own pipeline: a short or damaged frame is an error, not data.

zarr-python decodes a chunk with the array's codecs and trusts what they
return. Blosc trusts its own header, so a truncated blosc file decodes without
error and the chunk's tail is whatever memory the decoder was given (zarr v2's
numcodecs ``Blosc`` and v3's ``BloscCodec`` alike); zarr v2's other numcodecs
codecs raise assorted built-in errors (``OSError`` from bz2 and lz4,
``zlib.error``, ``LZMAError``) or return a short chunk.

:func:`with_checked_codecs` re-opens an array over the same store with those
codecs wrapped: a v2 array's compressor and last-applied filter in
:class:`CheckedCodec` (the blosc header against the frame's length, the decoded
size against the chunk's), a v3 array's ``BloscCodec`` (inside shards too) in
:class:`CheckedBloscCodec` (the header against the frame's length), and its
``ShardingCodec`` in :class:`CheckedShardingCodec` (below). A failure raises
:class:`FrameError` (a ``CorruptChunkError``), which zarr raises from its
pipeline unchanged; ``ZarrSource`` then names the store, field and window.

**Shards.** zarr reads a shard whole (every inner chunk wanted: one GET) or in
parts (its index by range, then each wanted inner chunk by range), and trusts
what comes back: a 0-byte shard read whole is taken for an absent one (the fill
value), a request past a truncated shard's end fails like a network error (HTTP
416), an index entry past the end returns a short range. The checked codec sees
every request of a shard read and holds the shard file to the rules
:mod:`._shards` keeps for the local reader: the file holds its index, the index
passes its crc32c, every entry lies inside the file's data bytes. A whole shard's
size is known, so its entries are checked against it; a read in parts knows no
size, so its index is checked for entries no file could hold, and the size is
asked for (one ``HEAD``, through the store's ``getsize``) only after a range
request fails or comes back short, to tell a damaged shard from a network error:
the common read makes no extra request. A failure the size does not explain is
raised as it came (obstore's, which ``ZarrSource`` reports as a
``RemoteStoreError``); a short answer it does not explain is a ``ConnectionError``,
which the loader retries. An index whose codecs are not bytes (+ crc32c), which
:mod:`._shards` does not parse, is left to zarr.
"""

from __future__ import annotations

import copy
import inspect
import math
import struct
from typing import Any

import numcodecs
import numpy as np
import zarr
from numcodecs.compat import ensure_contiguous_ndarray
from zarr.abc.store import ByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.codecs import BloscCodec, ShardingCodec
from zarr.core.array_spec import ArraySpec
from zarr.core.buffer import Buffer, BufferPrototype, NDBuffer
from zarr.storage import StorePath

from .._errors import CorruptChunkError
from ._shards import (
    EMPTY,
    INDEX_CRC_FAILS,
    NO_FILE_END,
    ShardLayout,
    crc32c_problem,
    data_bounds,
    entry_outside,
    shard_layout,
)

__all__ = [
    "OVERRIDDEN",
    "CheckedBloscCodec",
    "CheckedCodec",
    "CheckedShardReads",
    "CheckedShardingCodec",
    "FrameError",
    "blosc_frame_error",
    "changed_internals",
    "with_checked_codecs",
]


class FrameError(CorruptChunkError):
    """A chunk frame that does not decode to a whole chunk; says what, not where."""


class CheckedCodec(numcodecs.abc.Codec):
    """``inner``, whose decoded output must be ``nbytes`` long (``None``: not checked).

    Encoding is ``inner``'s; so is the config (the wrapper never reaches the metadata).
    """

    codec_id = "chunkstream-checked"

    def __init__(self, inner: numcodecs.abc.Codec, nbytes: int | None) -> None:
        self.inner = inner
        self.nbytes = nbytes

    def encode(self, buf):
        return self.inner.encode(buf)

    def decode(self, buf, out=None):
        if isinstance(self.inner, numcodecs.Blosc):
            _check_blosc_frame(ensure_contiguous_ndarray(buf).view(np.uint8).reshape(-1))
        try:
            result = self.inner.decode(buf, out)
        except Exception as exc:  # codecs raise assorted types (OSError, zlib.error, ...)
            raise FrameError(
                f"a {self.inner.codec_id} frame does not decode ({type(exc).__name__}: {exc})"
            ) from exc
        if self.nbytes is not None:
            got = ensure_contiguous_ndarray(result).nbytes
            if got != self.nbytes:
                raise FrameError(f"a chunk decodes to {got} bytes, expected {self.nbytes}")
        return result

    def get_config(self) -> dict:
        return self.inner.get_config()


def blosc_frame_error(raw: np.ndarray | memoryview, frame_size: int | None = None) -> str | None:
    """What is wrong with the blosc frame ``raw`` (uint8 or bytes), or ``None``.

    Blosc trusts its header, so a truncated frame decodes without error: the
    header's compressed size must be ``raw``'s length and, with ``frame_size``,
    its decoded size must be that. The answer completes "the frame ...".
    """
    if len(raw) < 16:
        return f"holds {len(raw)} bytes, shorter than a blosc header"
    nbytes, _, cbytes = struct.unpack("<III", bytes(raw[4:16]))
    if cbytes != len(raw) or nbytes != (frame_size or nbytes):
        return (
            f"is {len(raw)} bytes decoding to {frame_size or 'its frame'}; header says "
            f"{cbytes} bytes decoding to {nbytes}"
        )
    return None


def _check_blosc_frame(raw: np.ndarray) -> None:
    """Raise ``FrameError`` where :func:`blosc_frame_error` finds ``raw`` damaged."""
    what = blosc_frame_error(raw)
    if what is not None:
        raise FrameError(f"a blosc frame {what}")


class CheckedBloscCodec(BloscCodec):
    """zarr v3's ``BloscCodec``, with the frame's length checked against its header."""

    def _decode_sync(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> Buffer:
        _check_blosc_frame(chunk_bytes.as_numpy_array().view(np.uint8).reshape(-1))
        return super()._decode_sync(chunk_bytes, chunk_spec)


class CheckedShardingCodec(ShardingCodec):
    """zarr v3's ``ShardingCodec``, with each shard file checked against its index as it
    is read (module docs, "Shards").

    The checks sit in the partial decode, which zarr's pipeline uses whenever the
    sharding codec is the array's only codec (as zarr writes sharded arrays); a shard
    behind other codecs is decoded whole from bytes the pipeline fetched, unchecked here.
    """

    def _layout(self, shard_spec: ArraySpec) -> ShardLayout | None:
        found = shard_layout(self, tuple(shard_spec.shape))
        return None if found is None else found[0]

    async def _decode_partial_single(
        self, byte_getter: Any, selection: Any, shard_spec: ArraySpec
    ) -> NDBuffer | None:
        layout = self._layout(shard_spec)
        # a shard in the store (not one nested in another shard's bytes): its requests checked
        if layout is not None and isinstance(byte_getter, StorePath):
            byte_getter = CheckedShardReads(byte_getter, layout)
        return await super()._decode_partial_single(byte_getter, selection, shard_spec)


class CheckedShardReads:
    """The requests of one shard read (zarr's ``ByteGetter``), each checked as it returns
    (module docs, "Shards"); a ``FrameError``'s message starts with ``label`` (default:
    "zarr shard '<key>'").

    One per shard per read, so the index it keeps is that read's; zarr asks for the
    index before any inner chunk.
    """

    def __init__(self, inner: StorePath, layout: ShardLayout, label: str | None = None) -> None:
        self._inner = inner
        self._layout = layout
        self.label = label or f"zarr shard {inner.path!r}"
        self._index: np.ndarray | None = None

    async def get(
        self, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        try:
            buf = await self._inner.get(prototype, byte_range)
        except Exception as exc:
            # Any failure of a range request (obstore's HTTP 416, zarr's OverflowError for a
            # suffix longer than the file where a store takes no suffix requests) may be a
            # damaged shard or the network: the object's size tells which. Re-raised unless
            # the size proves the shard damaged.
            if byte_range is not None:
                await self._check_size(byte_range, None, exc)
            raise
        if buf is None:  # no such shard: zarr's rule for absent chunks applies
            return None
        if byte_range is None:
            self._index = _check_whole_shard(buf, self._layout, self.label)
        elif len(buf) != _requested(byte_range, len(buf)):  # as short a file would give
            await self._check_size(byte_range, len(buf), None)
        elif self._is_index(byte_range):
            self._index = _check_index(
                buf.to_bytes(), self._layout, self.label, (self._lo, NO_FILE_END)
            )
        return buf

    @property
    def _lo(self) -> int:
        return self._layout.index_nbytes if self._layout.index_at_start else 0

    def _is_index(self, byte_range: ByteRequest) -> bool:
        need = self._layout.index_nbytes
        if self._layout.index_at_start:
            # an inner chunk's entry at [0, need) fails the index's own check first
            return byte_range == RangeByteRequest(0, need)
        return byte_range == SuffixByteRequest(need)

    async def _check_size(
        self, byte_range: ByteRequest, got: int | None, exc: BaseException | None
    ) -> None:
        """After a range request failed (``exc``) or returned ``got`` bytes too few:
        ``FrameError`` where the file's size shows the shard damaged; else, for a short
        read, ``ConnectionError``; else nothing (the caller re-raises ``exc``)."""
        try:
            size = await self._inner.store.getsize(self._inner.path)
        except Exception:  # the size cannot be had either: the read's own failure stands
            size = None
        if size is not None:
            if self._is_index(byte_range):
                if size < self._layout.index_nbytes:
                    raise _short_file(self.label, size, self._layout) from exc
            elif isinstance(byte_range, RangeByteRequest):
                bounds = data_bounds(self._layout, size)
                start, stop = byte_range.start, byte_range.end
                if start < bounds[0] or stop > bounds[1]:
                    raise FrameError(
                        f"{self.label} holds {size} bytes and has an index entry "
                        f"{self._position(start, stop)}at bytes [{start}, {stop}), outside its "
                        f"data bytes [{bounds[0]}, {bounds[1]})"
                    ) from exc
        if exc is None and got is not None:
            holds = "whose size could not be had" if size is None else f"which holds {size}"
            raise ConnectionError(
                f"a request for {_requested(byte_range, got)} bytes ({byte_range}) of "
                f"{self.label}, {holds}, returned {got}: a transfer cut short, or the file "
                "changed while it was read"
            )

    def _position(self, start: int, stop: int) -> str:
        """``"for inner chunk (i, j) "`` of the index entry ``[start, stop)``, or ``""``."""
        if self._index is None:
            return ""
        hits = np.flatnonzero((self._index[:, 0] == start) & (self._index[:, 1] == stop - start))
        if not len(hits):
            return ""
        position = np.unravel_index(int(hits[0]), self._layout.chunks_per_shard)
        return f"for inner chunk {tuple(int(p) for p in position)} "


def _requested(byte_range: ByteRequest, got: int) -> int:
    """How many bytes ``byte_range`` asks for (``got``, for a range that does not say)."""
    if isinstance(byte_range, RangeByteRequest):
        return byte_range.end - byte_range.start
    if isinstance(byte_range, SuffixByteRequest):
        return byte_range.suffix
    return got


def _short_file(label: str, size: int, layout: ShardLayout) -> FrameError:
    need = layout.index_nbytes
    return FrameError(f"{label} holds {size} bytes, fewer than its {need}-byte index")


def _check_whole_shard(buf: Buffer, layout: ShardLayout, label: str) -> np.ndarray:
    """The parsed index of the whole shard file ``buf``; ``FrameError`` for a file
    shorter than its index, an index failing its checksum or an entry outside the file."""
    size, need = len(buf), layout.index_nbytes
    if size < need:
        raise _short_file(label, size, layout)
    raw = buf[:need] if layout.index_at_start else buf[size - need :]
    return _check_index(raw.to_bytes(), layout, label, data_bounds(layout, size))


def _check_index(
    raw: bytes, layout: ShardLayout, label: str, bounds: tuple[int, int]
) -> np.ndarray:
    """The ``(inner chunks, 2)`` index from its bytes ``raw``; ``FrameError`` if it fails
    its crc32c or an entry that is not empty lies outside ``bounds`` ``[lo, hi)``."""
    if layout.checksum:
        problem = crc32c_problem(raw, INDEX_CRC_FAILS)
        if problem is not None:
            raise FrameError(f"{label} {problem}")
        raw = raw[:-4]
    index = np.frombuffer(raw, layout.index_dtype).reshape(-1, 2).astype("=u8", copy=False)
    offset, nbytes = index[:, 0], index[:, 1]
    lo, hi = np.uint64(bounds[0]), np.uint64(bounds[1])
    # in uint64 without overflow: nbytes must fit between the offset and hi
    outside = (offset < lo) | (offset > hi) | (nbytes > hi - np.minimum(offset, hi))
    bad = np.flatnonzero(outside & ~((offset == EMPTY) & (nbytes == EMPTY)))
    if len(bad):
        first = int(bad[0])
        position = tuple(int(p) for p in np.unravel_index(first, layout.chunks_per_shard))
        entry = (int(offset[first]), int(nbytes[first]))
        raise FrameError(f"{label} {entry_outside(entry, bounds, position)}")
    return index


def _checked_v3(codecs: tuple) -> tuple:
    """``codecs`` with every ``BloscCodec`` and ``ShardingCodec`` checked, inside shards too."""
    out = []
    for codec in codecs:
        if isinstance(codec, ShardingCodec):
            codec = CheckedShardingCodec(
                chunk_shape=codec.chunk_shape,
                codecs=_checked_v3(tuple(codec.codecs)),
                index_codecs=codec.index_codecs,
                index_location=codec.index_location,
            )
        elif type(codec) is BloscCodec:
            codec = CheckedBloscCodec.from_dict(codec.to_dict())
        out.append(codec)
    return tuple(out)


#: zarr's private methods the checked codecs override, with the parameters they call
#: them with (tests/test_zarr_internals.py; pyproject.toml caps zarr at a minor that has them).
OVERRIDDEN = {
    (BloscCodec, "_decode_sync"): ("self", "chunk_bytes", "chunk_spec"),
    (ShardingCodec, "_decode_partial_single"): ("self", "byte_getter", "selection", "shard_spec"),
}


def changed_internals() -> list[str]:
    """The overridden zarr methods this zarr no longer has as called (empty: all there)."""
    changed = []
    for (cls, name), params in OVERRIDDEN.items():
        method = getattr(cls, name, None)
        if method is None or tuple(inspect.signature(method).parameters) != params:
            changed.append(f"{cls.__name__}.{name}{params}")
    return changed


def with_checked_codecs(arr: zarr.Array) -> zarr.Array:
    """``arr`` re-opened over the same store with checked codecs (see the module docs).

    Refused (``RuntimeError``) under a zarr that renamed or changed a method the checks
    override, where they would be skipped in silence."""
    from zarr.core.array import AsyncArray

    if changed := changed_internals():
        raise RuntimeError(
            f"zarr {zarr.__version__} changed {', '.join(changed)}, which chunkstream's "
            "integrity checks override: they would be skipped. Install the zarr "
            "pyproject.toml asks for (pip install 'zarr>=3.1,<3.2')."
        )

    meta = arr.metadata
    checked = copy.copy(meta)
    # the metadata is frozen; this copy is ours and only its codec objects change
    if meta.zarr_format == 3:
        object.__setattr__(checked, "codecs", _checked_v3(tuple(meta.codecs)))
    else:
        nbytes = math.prod(meta.chunks) * np.dtype(arr.dtype).itemsize
        filters = tuple(meta.filters or ())
        if meta.compressor is not None:
            compressor = CheckedCodec(meta.compressor, None if filters else nbytes)
            object.__setattr__(checked, "compressor", compressor)
        if filters:  # filters decode in reverse: the first one's output is the chunk
            first = CheckedCodec(filters[0], nbytes)
            object.__setattr__(checked, "filters", (first, *filters[1:]))
    return zarr.Array(AsyncArray(metadata=checked, store_path=arr.store_path, config=arr.config))
