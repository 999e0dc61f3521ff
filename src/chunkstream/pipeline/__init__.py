"""The streaming pipeline: ordered bounded stages, host buffers, and ``ChunkLoader``."""

from ._chunk import Chunk
from ._config import LoaderConfig, resolve_device
from ._loader import ChunkLoader

__all__ = ["Chunk", "ChunkLoader", "LoaderConfig", "resolve_device"]
