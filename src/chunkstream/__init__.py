"""chunkstream: stream random windows of huge zarr time series to the GPU while the model trains.

The flow mirrors the package layout: ``sources`` (where bytes come from) ->
``plans`` (which windows an epoch visits) -> ``pipeline`` (reader threads,
pinned slots, the transfer stream, :class:`ChunkLoader`) -> ``consumer``
(batches sampled inside a chunk on the device) and ``stats``; ``cli`` and
``tools`` hold the command line.
"""

from . import compat, flyvis, plans
from ._errors import (
    CacheWarning,
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
    ReadAmplificationWarning,
    RemotePermissionError,
    RemoteStoreError,
    SourceError,
    SourceNotFoundError,
)
from .consumer import (
    BatchStream,
    StreamOptions,
    gather_windows,
    neighbour_union,
    sample_windows,
    zero_neurons_with_neighbours,
)
from .pipeline import Chunk, ChunkLoader, LoaderConfig, LoaderOptions
from .plans import (
    EpochPlan,
    Piece,
    PiecePlan,
    RandomPlan,
    Segments,
    SequentialPlan,
    ShuffledPlan,
    WindowPlan,
    make_plan,
    plan_epoch,
    split_segments,
)
from .sources import (
    CallableSource,
    FieldSpec,
    JoinSource,
    NumpySource,
    Recordings,
    RemoteOptions,
    Source,
    TensorStoreSource,
    ZarrGroupSource,
    ZarrSource,
)
from .stats import BatchTimer, LatencyStats, plot_timeline

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
    "LoaderConfig",
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
    "zero_neurons_with_neighbours",
]


def __getattr__(name: str) -> object:
    """``cs.ChunkMixer`` and ``cs.WindowSampler``: private now, found for one release with
    a ``FutureWarning`` naming their replacement."""
    from .consumer import _MOVED, moved

    if name in _MOVED:
        return moved(name, "chunkstream")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
