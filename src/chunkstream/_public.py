"""Everything ``chunkstream`` exports, imported at once: the package imports this
module on the first use of a public name (``chunkstream.__getattr__``), so that
``import chunkstream`` and ``chunkstream --help`` import neither torch nor zarr."""

# ruff: noqa: F401
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
from .compat import neighbour_union, zero_neurons_with_neighbours
from .consumer import (
    BatchStream,
    StreamOptions,
    gather_windows,
    sample_windows,
    staggered_observations,
)
from .pipeline import Chunk, ChunkLoader, LoaderOptions
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
