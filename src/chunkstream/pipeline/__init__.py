"""The streaming pipeline: an epoch as a run of futures, host buffers, and ``ChunkLoader``."""

from .._options import moved_names
from ._chunk import Chunk
from ._config import resolve_device
from ._loader import ChunkLoader
from ._options import LoaderOptions

# The package's internal face for the rest of chunkstream (not public API).
from ._chunk import hand_over as hand_over  # isort: skip
from ._config import ResolvedSettings as ResolvedSettings  # isort: skip
from ._held import check_host_starts as check_host_starts  # isort: skip
from ._held import compute_dtype as compute_dtype  # isort: skip
from ._held import copy_windows as copy_windows  # isort: skip
from ._held import gather_on_lent as gather_on_lent  # isort: skip
from ._jobs import Delivery as Delivery  # isort: skip
from ._jobs import copy_to_device as copy_to_device  # isort: skip
from ._lane import BatchLane as BatchLane  # isort: skip
from ._lane import Request as Request  # isort: skip
from ._lane import check_gather_threads as check_gather_threads  # isort: skip
from ._options import loader_settings as loader_settings  # isort: skip
from ._run import EpochRun as EpochRun  # isort: skip
from ._run import Turn as Turn  # isort: skip
from ._stages import receive as receive  # isort: skip
from ._times import RECORDING_KEY as RECORDING_KEY  # isort: skip
from ._times import START_KEY as START_KEY  # isort: skip
from ._times import TimeTable as TimeTable  # isort: skip
from ._times import recording_offsets as recording_offsets  # isort: skip
from ._times import times_to as times_to  # isort: skip

__all__ = ["Chunk", "ChunkLoader", "LoaderOptions", "resolve_device"]

# Public until 0.1: now the loader's internal resolved settings (``loader.config``), still
# found for one release with a FutureWarning naming what replaces it
# (name -> (private module, its name there, replacement)).
_MOVED = {
    "LoaderConfig": (
        "._config",
        "ResolvedSettings",
        "the ChunkLoader keywords and options=cs.LoaderOptions(...) (the one settings type)",
    ),
}


moved, __getattr__ = moved_names(__name__, _MOVED)
