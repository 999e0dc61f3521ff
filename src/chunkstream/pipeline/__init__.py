"""The streaming pipeline: an epoch as a run of futures, host buffers, and ``ChunkLoader``."""

from ._chunk import Chunk
from ._config import LoaderConfig, resolve_device
from ._loader import ChunkLoader
from ._options import LoaderOptions

# The package's internal face for the rest of chunkstream (not public API).
from ._chunk import hand_over as hand_over  # isort: skip
from ._jobs import Delivery as Delivery  # isort: skip
from ._jobs import copy_to_device as copy_to_device  # isort: skip
from ._run import EpochRun as EpochRun  # isort: skip
from ._run import Turn as Turn  # isort: skip
from ._stages import receive as receive  # isort: skip
from ._times import RECORDING_KEY as RECORDING_KEY  # isort: skip
from ._times import START_KEY as START_KEY  # isort: skip
from ._times import TimeTable as TimeTable  # isort: skip
from ._times import recording_offsets as recording_offsets  # isort: skip
from ._times import times_to as times_to  # isort: skip

__all__ = ["Chunk", "ChunkLoader", "LoaderConfig", "LoaderOptions", "resolve_device"]
