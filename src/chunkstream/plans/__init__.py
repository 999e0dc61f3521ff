"""Window plans (which windows an epoch visits), pieced chunks, segments, epoch arithmetic."""

from ._epoch import EpochPlan, calculate_chunk_params, plan_epoch
from ._pieces import Piece, PiecePlan, chunk_pieces
from ._segments import Segment, Segments, split_segments
from ._windows import (
    RandomPlan,
    SequentialPlan,
    ShuffledPlan,
    WindowPlan,
    make_plan,
    remaining_indices,
)

# The package's internal face for the rest of chunkstream (not public API).
from ._cursor import EpochCursor as EpochCursor  # isort: skip
from ._cursor import EpochShare as EpochShare  # isort: skip
from ._cursor import EpochSpan as EpochSpan  # isort: skip
from ._cursor import Position as Position  # isort: skip
from ._cursor import Uneven as Uneven  # isort: skip
from ._cursor import epoch_share as epoch_share  # isort: skip
from ._hash import M64 as M64  # isort: skip
from ._hash import hash_words as hash_words  # isort: skip
from ._hash import seed_key as seed_key  # isort: skip
from ._pieces import epoch_pieces as epoch_pieces  # isort: skip
from ._pieces import loader_plan as loader_plan  # isort: skip
from ._plan import Layout as Layout  # isort: skip
from ._plan import Plan as Plan  # isort: skip
from ._sampling import SAMPLINGS as SAMPLINGS  # isort: skip
from ._sampling import Sampling as Sampling  # isort: skip
from ._segments import as_segments as as_segments  # isort: skip
from ._segments import HeldOutSplit as HeldOutSplit  # isort: skip
from ._segments import held_out_split as held_out_split  # isort: skip
from ._windows import window_in_chunk as window_in_chunk  # isort: skip

__all__ = [
    "EpochPlan",
    "Piece",
    "PiecePlan",
    "RandomPlan",
    "Segment",
    "Segments",
    "SequentialPlan",
    "ShuffledPlan",
    "WindowPlan",
    "calculate_chunk_params",
    "chunk_pieces",
    "make_plan",
    "plan_epoch",
    "remaining_indices",
    "split_segments",
]
