"""chunkstream: stream random windows of huge zarr time series to the GPU while the model trains."""

from ._errors import (
    ChunkLoadError,
    ChunkstreamError,
    ConfigError,
    CorruptChunkError,
    FieldDtypeError,
    FieldLengthError,
    FieldSelectionError,
    LoaderClosedError,
    LoaderStalledError,
    MissingChunkError,
    NonFiniteError,
    NotZarrError,
    SourceError,
    SourceNotFoundError,
)
from .sources._base import FieldSpec, Source

__version__ = "0.1.0"

__all__ = [
    "ChunkLoadError",
    "ChunkstreamError",
    "ConfigError",
    "CorruptChunkError",
    "FieldDtypeError",
    "FieldLengthError",
    "FieldSelectionError",
    "FieldSpec",
    "LoaderClosedError",
    "LoaderStalledError",
    "MissingChunkError",
    "NonFiniteError",
    "NotZarrError",
    "Source",
    "SourceError",
    "SourceNotFoundError",
]
