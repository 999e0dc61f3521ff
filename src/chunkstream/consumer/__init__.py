"""The consumer side: batches of windows drawn inside a chunk, on its device, and augmentation."""

from ._augment import neighbour_union, zero_neurons_with_neighbours
from ._batches import BatchStream
from ._mixing import ChunkMixer
from ._options import StreamOptions
from ._sampling import WindowSampler, gather_windows, sample_windows
from ._staggered import staggered_observations
from ._tiers import BufferInfo

# The package's internal face for the rest of chunkstream (not public API).
from ._augment import sample_batch_within_chunk as sample_batch_within_chunk  # isort: skip
from ._defaults import HOST_SHARE as HOST_SHARE  # isort: skip
from ._tiers import choose_tier as choose_tier  # isort: skip
from ._tiers import default_buffer as default_buffer  # isort: skip
from ._tiers import plan_buffer as plan_buffer  # isort: skip
from ._tiers import quality_note as quality_note  # isort: skip

__all__ = [
    "BatchStream",
    "BufferInfo",
    "ChunkMixer",
    "StreamOptions",
    "WindowSampler",
    "gather_windows",
    "neighbour_union",
    "sample_windows",
    "staggered_observations",
    "zero_neurons_with_neighbours",
]
