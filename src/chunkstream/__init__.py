"""chunkstream: stream random windows of huge zarr time series to the GPU while the model trains.

The flow mirrors the package layout: ``sources`` (where bytes come from) ->
``plans`` (which windows an epoch visits) -> ``pipeline`` (reader threads,
pinned slots, the transfer stream, :class:`ChunkLoader`) -> ``consumer``
(batches sampled inside a chunk on the device) and ``stats``; ``cli`` and
``tools`` hold the command line.
"""

# ruff: noqa: F405
from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_names

if TYPE_CHECKING:  # what tools that read the code see; at run time, __getattr__ below
    from ._public import *  # noqa: F403

__version__ = "0.1.0"

__all__ = [
    "BatchStream",
    "BatchTimer",
    "CacheWarning",
    "CallableSource",
    "Chunk",
    "ChunkLoadError",
    "ChunkLoader",
    "ChunkstreamError",
    "ConfigError",
    "CorruptChunkError",
    "EpochPlan",
    "FieldDtypeError",
    "FieldLengthError",
    "FieldSelectionError",
    "FieldSpec",
    "JoinSource",
    "LatencyStats",
    "LoaderClosedError",
    "LoaderOptions",
    "LoaderStalledError",
    "MissingChunkError",
    "NonFiniteError",
    "NotZarrError",
    "NumpySource",
    "Piece",
    "PiecePlan",
    "RandomPlan",
    "ReadAmplificationWarning",
    "Recordings",
    "RemoteOptions",
    "RemotePermissionError",
    "RemoteStoreError",
    "Segments",
    "SequentialPlan",
    "ShuffledPlan",
    "Source",
    "SourceError",
    "SourceNotFoundError",
    "StreamOptions",
    "TensorStoreSource",
    "WindowPlan",
    "ZarrGroupSource",
    "ZarrSource",
    "__version__",
    "compat",
    "flyvis",
    "gather_windows",
    "make_plan",
    "neighbour_union",
    "plan_epoch",
    "plans",
    "plot_timeline",
    "sample_windows",
    "split_segments",
    "staggered_observations",
    "zero_neurons_with_neighbours",
]


_lazy_getattr, __dir__ = lazy_names(__name__, __all__)


def __getattr__(name: str) -> object:
    """The public names, imported on first use; ``cs.ChunkMixer``, ``cs.WindowSampler`` and
    ``cs.LoaderConfig`` (private now) found for one release with a ``FutureWarning`` naming
    their replacement."""
    if name in ("ChunkMixer", "WindowSampler"):
        from .consumer import moved

        return moved(name, "chunkstream")
    if name == "LoaderConfig":
        from .pipeline import moved as moved_pipeline

        return moved_pipeline(name, "chunkstream")
    return _lazy_getattr(name)
