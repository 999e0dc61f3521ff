"""Drop-in replacements for the original implementation's API (change one import).

Which loader is which of the original's APIs:

- :class:`RandomChunkLoader`: the merged code's (NeuralGraph chunk_loader.py as of
  commit 3701037, called by the merged training script ``latent.py``): ``time_units``,
  ``get_next_chunk() -> (start, data, stim)``, ``(None, None, None)`` at the end;
- :class:`PipelineChunkLoader`: the same, with ``gpu_prefetch`` chunks on the device;
- :class:`GuideRandomChunkLoader`: the integration guide's earlier form (commit
  b4c18b94): no ``time_units``, ``get_next_chunk() -> (data, stim)``, ``(None, None)``.

Signatures and return values match the original (DESIGN.md, "Drop-in
compatibility"); underneath is the public :class:`~chunkstream.ChunkLoader`
over a :class:`~chunkstream.CallableSource` of ``load_fn``. Each loader keeps
one ``random.Random(seed)`` and takes one draw per chunk the original loaded,
across epochs (``randint(0, n_valid - 1) * time_units``; the guide's
``randint(0, max(0, T - chunk_size))`` is the same draw with ``time_units=1``), so
the same seed gives the same ``load_fn`` calls in the same order, each
``chunk_size`` long (``(0, T)`` when ``chunk_size > T``). Where compat
deliberately differs (errors raise instead of hanging, restarts, counts) is
listed in the migration guide (docs/guide/migrate.md, "chunkstream.compat").
"""

from ..consumer import sample_batch_within_chunk
from ..plans import calculate_chunk_params
from ..stats import ChunkLatencyStats
from ._helpers import create_zarr_loader
from ._loaders import GuideRandomChunkLoader, PipelineChunkLoader, RandomChunkLoader

__all__ = [
    "ChunkLatencyStats",
    "GuideRandomChunkLoader",
    "PipelineChunkLoader",
    "RandomChunkLoader",
    "calculate_chunk_params",
    "create_zarr_loader",
    "sample_batch_within_chunk",
]
