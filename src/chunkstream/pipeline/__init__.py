"""The streaming pipeline: an epoch as a run of futures, host buffers, and ``ChunkLoader``."""

from ._chunk import Chunk
from ._config import LoaderConfig, resolve_device
from ._loader import ChunkLoader

# The package's internal face for the rest of chunkstream (not public API).
from ._run import POLL_S as POLL_S  # isort: skip
from ._run import thread_stack as thread_stack  # isort: skip

__all__ = ["Chunk", "ChunkLoader", "LoaderConfig", "resolve_device"]
