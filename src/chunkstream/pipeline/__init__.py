"""The streaming pipeline: an epoch as a run of futures, host buffers, and ``ChunkLoader``."""

from ._chunk import Chunk
from ._config import LoaderConfig, resolve_device
from ._loader import ChunkLoader

__all__ = ["Chunk", "ChunkLoader", "LoaderConfig", "resolve_device"]
