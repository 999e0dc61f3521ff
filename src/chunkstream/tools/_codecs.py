"""Codec names the tools accept, mapped to zarr format 2 and format 3 codecs.

``none`` stores raw bytes; ``blosc-zstd`` and ``blosc-lz4`` use Blosc with
bit-shuffle (float data compresses far better with its bits regrouped);
``zstd`` is plain Zstandard. Format 2 takes a numcodecs compressor, format 3 a
``zarr.codecs`` bytes-to-bytes codec.
"""

from __future__ import annotations

from typing import Any

from .._errors import ConfigError

__all__ = ["CODECS", "OUT_DTYPES", "compressors_for", "describe_codecs"]

CODECS = ("none", "blosc-zstd", "blosc-lz4", "zstd")

# Output dtypes convert's ``dtype=`` accepts: storage precisions a loader streams as they are.
OUT_DTYPES = ("float16", "float32", "float64")


def compressors_for(codec: str, zarr_format: int) -> Any:
    """Return the ``compressors`` argument of ``zarr.create_array`` for ``codec``."""
    if codec not in CODECS:
        raise ConfigError.bad("codec", codec, f"one of {', '.join(CODECS)}")
    if zarr_format not in (2, 3):
        raise ConfigError.bad("zarr_format", zarr_format, "2 or 3")
    if codec == "none":
        return None
    if zarr_format == 2:
        import numcodecs

        if codec == "zstd":
            return numcodecs.Zstd(level=3)
        cname = codec.removeprefix("blosc-")
        return numcodecs.Blosc(cname=cname, clevel=5, shuffle=numcodecs.Blosc.BITSHUFFLE)
    from zarr.codecs import BloscCodec, ZstdCodec

    if codec == "zstd":
        return [ZstdCodec(level=3)]
    return [BloscCodec(cname=codec.removeprefix("blosc-"), clevel=5, shuffle="bitshuffle")]


def describe_codecs(array: Any) -> list[str]:
    """Short names of an array's filters, serializer and compressors, in pipeline order."""
    names: list[str] = []
    for codec in (*array.filters, *array.compressors):
        names.append(_codec_name(codec))
    if array.metadata.zarr_format == 3 and array.serializer is not None:
        names.insert(len(array.filters), _codec_name(array.serializer))
    return names


def _codec_name(codec: Any) -> str:
    cname = getattr(codec, "cname", None)
    kind = type(codec).__name__.removesuffix("Codec").lower()
    if cname is not None:
        return f"{kind}-{getattr(cname, 'value', cname)}"
    return kind
