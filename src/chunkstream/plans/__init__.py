"""Window plans (which windows an epoch visits) and epoch arithmetic."""

from ._epoch import EpochPlan, calculate_chunk_params, plan_epoch
from ._windows import (
    RandomPlan,
    SequentialPlan,
    ShuffledPlan,
    WindowPlan,
    make_plan,
    remaining_indices,
)

__all__ = [
    "EpochPlan",
    "RandomPlan",
    "SequentialPlan",
    "ShuffledPlan",
    "WindowPlan",
    "calculate_chunk_params",
    "make_plan",
    "plan_epoch",
    "remaining_indices",
]
