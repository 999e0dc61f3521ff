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
:class:`CheckedBloscCodec` (the header against the frame's length). A failure
raises :class:`FrameError` (a ``CorruptChunkError``), which zarr raises from its
pipeline unchanged; ``ZarrSource`` then names the store, field and window.
"""

from __future__ import annotations

import copy
import math
import struct

import numcodecs
import numpy as np
import zarr
from numcodecs.compat import ensure_contiguous_ndarray
from zarr.codecs import BloscCodec, ShardingCodec
from zarr.core.array_spec import ArraySpec
from zarr.core.buffer import Buffer

from .._errors import CorruptChunkError

__all__ = [
    "CheckedBloscCodec",
    "CheckedCodec",
    "FrameError",
    "blosc_frame_error",
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
        return (f"is {len(raw)} bytes decoding to {frame_size or 'its frame'}; header says "
                f"{cbytes} bytes decoding to {nbytes}")  # fmt: skip
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


def _checked_v3(codecs: tuple) -> tuple:
    """``codecs`` with every ``BloscCodec`` checked, inside shards too."""
    out = []
    for codec in codecs:
        if isinstance(codec, ShardingCodec):
            codec = ShardingCodec(
                chunk_shape=codec.chunk_shape, codecs=_checked_v3(tuple(codec.codecs)),
                index_codecs=codec.index_codecs, index_location=codec.index_location,
            )  # fmt: skip
        elif type(codec) is BloscCodec:
            codec = CheckedBloscCodec.from_dict(codec.to_dict())
        out.append(codec)
    return tuple(out)


def with_checked_codecs(arr: zarr.Array) -> zarr.Array:
    """``arr`` re-opened over the same store with checked codecs (see the module docs)."""
    from zarr.core.array import AsyncArray

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
