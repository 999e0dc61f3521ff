"""Drop-in replacements for the original implementation's API (change one import).

Signatures and return values match the original (DESIGN.md, "Drop-in
compatibility"); underneath is the public :class:`~chunkstream.ChunkLoader`
over a :class:`~chunkstream.CallableSource` of ``load_fn``. Each loader keeps
one ``random.Random(seed)`` and takes one draw per chunk the original loaded,
across epochs (``randint(0, max(0, T - chunk_size))``, or
``randint(0, n_valid - 1) * time_units`` for :class:`PipelineChunkLoader`), so
the same seed gives the same ``load_fn`` calls in the same order, each
``chunk_size`` long (``(0, T)`` when ``chunk_size > T``). Where compat
deliberately differs (errors raise instead of hanging, restarts, counts) is
listed in the migration guide (docs/guide/migrate.md, "chunkstream.compat").
"""

from ..consumer import sample_batch_within_chunk
from ..plans import calculate_chunk_params
from ..stats import ChunkLatencyStats
from ._helpers import create_zarr_loader
from ._loaders import PipelineChunkLoader, RandomChunkLoader

__all__ = [
    "ChunkLatencyStats",
    "PipelineChunkLoader",
    "RandomChunkLoader",
    "calculate_chunk_params",
    "create_zarr_loader",
    "sample_batch_within_chunk",
]
