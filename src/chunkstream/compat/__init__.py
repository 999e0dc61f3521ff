"""Drop-in replacements for the original implementation's API (change one import).

:class:`RandomChunkLoader` is the merged code's loader (NeuralGraph chunk_loader.py as
of commit 3701037: ``time_units``, ``(start, data, stim)``), :class:`PipelineChunkLoader`
the same with ``gpu_prefetch``, :class:`GuideRandomChunkLoader` the integration guide's
earlier form (commit b4c18b94: ``(data, stim)``). Underneath is the public
:class:`~chunkstream.ChunkLoader` over a :class:`~chunkstream.CallableSource` of
``load_fn``. Each loader keeps one ``random.Random(seed)`` and takes one draw per chunk
the original loaded, across epochs: ``randint(0, n_valid - 1) * time_units`` with
``max_start = (max(0, T - chunk_size) // time_units) * time_units`` and
``n_valid = max_start // time_units + 1`` (the guide's ``randint(0, max(0, T -
chunk_size))`` with ``time_units=1``), so the same seed gives the same ``load_fn`` calls
in the same order, each ``chunk_size`` long (``(0, T)`` when ``chunk_size > T``). Where
compat deliberately differs is listed in the migration guide (docs/guide/migrate.md).
"""

from ..plans import calculate_chunk_params
from ..stats import ChunkLatencyStats
from ._augment import sample_batch_within_chunk
from ._helpers import create_zarr_loader
from ._loaders import GuideRandomChunkLoader, PipelineChunkLoader, RandomChunkLoader

# The package's internal face for the rest of chunkstream (public as cs.neighbour_union and
# cs.zero_neurons_with_neighbours: the original's augmentation, beside its batch sampler).
from ._augment import neighbour_union as neighbour_union  # isort: skip
from ._augment import zero_neurons_with_neighbours as zero_neurons_with_neighbours  # isort: skip

__all__ = [
    "ChunkLatencyStats",
    "GuideRandomChunkLoader",
    "PipelineChunkLoader",
    "RandomChunkLoader",
    "calculate_chunk_params",
    "create_zarr_loader",
    "sample_batch_within_chunk",
]
