"""The consumer side: batches of windows drawn inside a chunk or a shuffle buffer, on a device."""

from .._memory import BufferInfo
from .._options import moved_names
from ._batches import BatchStream
from ._options import StreamOptions
from ._sampling import gather_windows, sample_windows
from ._staggered import staggered_observations

__all__ = [
    "BatchStream",
    "BufferInfo",
    "StreamOptions",
    "gather_windows",
    "sample_windows",
    "staggered_observations",
]

# Public until 0.x: now private, still found for one release with a FutureWarning naming
# what replaces them (name -> (private module, its name there, replacement)).
_MOVED = {
    "ChunkMixer": (
        "._mixing",
        "ChunkMixer",
        "cs.BatchStream(loader, window=..., mix=M) (its shuffle buffer of the last M chunks)",
    ),
    "neighbour_union": (
        "chunkstream.compat",
        "neighbour_union",
        "cs.neighbour_union (the original's augmentation now lives in chunkstream.compat)",
    ),
    "zero_neurons_with_neighbours": (
        "chunkstream.compat",
        "zero_neurons_with_neighbours",
        "cs.zero_neurons_with_neighbours (the original's augmentation now lives in "
        "chunkstream.compat)",
    ),
    "WindowSampler": (
        "._sampling",
        "WindowSampler",
        "cs.sample_windows(chunk, batch_size, window) and cs.gather_windows(x, starts, window), "
        "or cs.BatchStream",
    ),
}


moved, __getattr__ = moved_names(__name__, _MOVED)
