"""A reference trainer: a latent-dynamics model trained by streaming chunks (see ``_trainer``)."""

from ._config import (
    PIECES_AUTO,
    EpochRecord,
    TrainConfig,
    TrainResult,
)
from ._data import TimeSlice, load_range
from ._metrics import LossMeter, RunningMoments
from ._model import LatentDynamics, rollout_window
from ._trainer import Trainer

__all__ = [
    "PIECES_AUTO",
    "EpochRecord",
    "LatentDynamics",
    "LossMeter",
    "RunningMoments",
    "TimeSlice",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "load_range",
    "rollout_window",
]
