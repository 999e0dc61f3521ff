"""The ``zarrs`` engine: a zarr array re-opened with the zarrs Rust codec pipeline (optional extra).

zarr-python picks an array's codec pipeline from its global config when the
array object is made, so :func:`with_zarrs_pipeline` makes a second array
object over the same store and metadata while that config names zarrs. The
pipeline is ``strict``: an array zarrs cannot read is refused here, at open,
instead of falling back silently to zarr's own pipeline on every read.

What zarrs gives and what it does not (zarrs 0.2.3, checked by the tests):
it writes straight into the caller's buffer and raises for a truncated or
corrupt frame (``RuntimeError`` for blosc, ``OSError`` for zstd and gzip), but
like zarr it reads an absent chunk, or an inner chunk a shard's index marks
empty, as the fill value, so ``ZarrSource`` keeps its own missing-chunk check
on this engine too. Layouts zarrs reads wrongly are refused at open
(:func:`zarrs_defect`): big-endian complex data (its real and imaginary parts
come back swapped on reads of part of a chunk), a blosc ``typesize`` that
does not divide the chunk's bytes (``IndexError``, or a valid chunk reported as
corrupt) and zarr v2's ``zlib`` compressor (zarrs ignores the stream's adler32
checksum, so a zlib chunk cut short after its data reads without an error) and an
uncompressed chain with a ``crc32c`` codec (zarrs reads part of such a chunk without
checking the checksum: a flipped bit is delivered as data), and zstd (a damaged frame
that claims a huge decoded size makes zarrs abort the process on a failed allocation:
``ZarrSource`` reads each zstd frame's header before zarrs does, see
:func:`zstd_frame_bound`, and refuses a chain where zstd is not the outermost codec).
zarrs decodes an uncompressed chunk partially (only the bytes a window needs),
so ``ZarrSource`` checks such chunk files' sizes itself. zarrs also fails on an int index into an axis with a partial edge
chunk when the window spans two time chunks (``UnsupportedVIndexingError``);
``ZarrSource`` reads int-indexed axes as length-1 slices, which avoids it.
"""

from __future__ import annotations

import math

import numpy as np
import zarr

from .._errors import ConfigError
from .._memory import thread_budget

__all__ = ["with_zarrs_pipeline", "zarrs_defect", "zstd_frame_bound"]


def with_zarrs_pipeline(arr: zarr.Array, threads: int | None) -> zarr.Array:
    """``arr`` read through zarrs (``threads``: its decode threads; ``None``: the process's
    thread budget, :func:`chunkstream._memory.node_share`)."""
    try:
        import zarrs  # noqa: F401  (the pipeline class is looked up by name below)
        from zarrs.pipeline import UnsupportedMetadataError
    except ImportError as exc:
        raise ImportError(
            "ZarrSource(engine='zarrs') needs zarrs: `pip install chunkstream[zarrs]`, or "
            "use engine='auto'."
        ) from exc
    from zarr.core.array import AsyncArray

    settings: dict = {
        "codec_pipeline.path": "zarrs.ZarrsCodecPipeline",
        "codec_pipeline.strict": True,
    }
    settings["threading.max_workers"] = thread_budget() if threads is None else threads
    # zarr's config is process-wide: while it is set, an array another thread makes gets
    # zarrs as well (same data, other decoder). No I/O happens inside, so the window is short.
    with zarr.config.set(settings):
        try:
            inner = AsyncArray(metadata=arr.metadata, store_path=arr.store_path, config=arr.config)
        except (UnsupportedMetadataError, TypeError, ValueError) as exc:
            # a store zarrs cannot rebuild in Rust (e.g. obstore's MemoryStore) is a ValueError
            # ("Expected an object store-compatible instance"), unsupported codecs the others
            raise ConfigError.bad(
                "engine",
                "zarrs",
                f'"auto" or "zarr" for {arr.store_path}',
                f"zarrs cannot read this array's codecs or store ({exc}).",
            ) from exc
    return zarr.Array(inner)


def zarrs_defect(arr: zarr.Array) -> str | None:
    """Why zarrs would read ``arr`` wrongly (see the module docs), or ``None``."""
    from zarr.codecs import (
        BloscCodec,
        BytesCodec,
        Crc32cCodec,
        ShardingCodec,
        TransposeCodec,
        ZstdCodec,
    )

    dtype = np.dtype(arr.dtype)
    meta = arr.metadata
    chunks, codecs = tuple(arr.chunks), []
    if meta.zarr_format == 3:
        codecs = list(meta.codecs)
        if codecs and isinstance(codecs[0], ShardingCodec):
            chunks, codecs = tuple(codecs[0].chunk_shape), list(codecs[0].codecs)
        big = any(
            isinstance(c, BytesCodec) and c.endian is not None and c.endian.value == "big"
            for c in codecs
        )
    else:
        big = dtype.byteorder == ">"
        if getattr(meta.compressor, "codec_id", None) == "zlib":
            return (
                "zarrs does not check a zlib stream's trailing adler32 checksum, so a "
                "truncated or altered zlib chunk can read without an error"
            )
    if big and dtype.kind == "c":
        return (
            "zarrs swaps the real and imaginary parts of big-endian complex data on reads "
            "of part of a chunk"
        )
    if any(isinstance(c, ZstdCodec) for c in codecs) and zstd_frame_bound(arr) is None:
        return (
            "zarrs aborts the whole process (a failed allocation in Rust) on a damaged "
            "zstd frame that claims a huge decoded size, and chunkstream checks the "
            "frame only where zstd is the outermost codec"
        )
    if any(isinstance(c, Crc32cCodec) for c in codecs) and all(
        isinstance(c, (BytesCodec, Crc32cCodec, TransposeCodec)) for c in codecs
    ):
        return (
            "zarrs reads part of an uncompressed chunk without checking its crc32c "
            "checksum, so a damaged chunk can read as data"
        )
    nbytes = math.prod(chunks) * dtype.itemsize
    for codec in codecs:
        if isinstance(codec, BloscCodec) and codec.typesize and nbytes % codec.typesize:
            return (
                f"zarrs fails on blosc chunks of {nbytes} bytes, not a multiple of the "
                f"codec's typesize {codec.typesize}"
            )
    return None


def zstd_frame_bound(arr: zarr.Array) -> int | None:
    """The most bytes a stored (inner) chunk's zstd frame may declare, where zstd is the
    outermost codec (its frame starts the chunk's bytes); ``None`` without zstd there.

    A frame declaring more is damaged: zarrs would try to allocate it and abort the
    process, so ``ZarrSource`` raises ``CorruptChunkError`` before zarrs reads it. Where
    zstd compresses the chunk's bytes the bound is exact (the chunk's size); where it
    compresses another codec's output (``[bytes, gzip, zstd]``) that output may exceed
    the chunk, so the bound is the most each codec inside may produce (:func:`_grown`).
    """
    from zarr.codecs import Crc32cCodec, ShardingCodec, ZstdCodec

    meta = arr.metadata
    nbytes = math.prod(arr.chunks) * np.dtype(arr.dtype).itemsize
    if meta.zarr_format == 2:
        if getattr(meta.compressor, "codec_id", None) != "zstd":
            return None
        # filters may change the size (e.g. astype); no filter grows data beyond 8x
        return nbytes * (8 if meta.filters else 1)
    codecs = list(meta.codecs)
    if codecs and isinstance(codecs[0], ShardingCodec):
        nbytes = math.prod(codecs[0].chunk_shape) * np.dtype(arr.dtype).itemsize
        codecs = list(codecs[0].codecs)
    while codecs and isinstance(codecs[-1], Crc32cCodec):
        codecs.pop()
    if not codecs or not isinstance(codecs[-1], ZstdCodec):
        return None
    bound = nbytes
    for codec in codecs[:-1]:  # array -> array codecs keep the size, the serializer too
        if _is_bytes_to_bytes(codec):
            bound = bound + 4 if isinstance(codec, Crc32cCodec) else _grown(bound)
    return bound


def _is_bytes_to_bytes(codec: object) -> bool:
    from zarr.abc.codec import BytesBytesCodec

    return isinstance(codec, BytesBytesCodec)


def _grown(nbytes: int) -> int:
    """The most a compressor's output of ``nbytes`` bytes may hold, generously: gzip's
    stored blocks add 5 bytes per 64 KiB and an 18-byte frame, zstd's bound is
    ``n + n / 256 + 64``, blosc adds at most 32 header bytes plus a few per block."""
    return nbytes + nbytes // 8 + 1024
