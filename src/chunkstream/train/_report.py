"""The trainer's TensorBoard logging: opening the writer and one epoch's scalars.

TensorBoard is optional: ``tensorboard=None`` logs when it is installed and
says so in the log when it is not; ``tensorboard=True`` without it raises
``ImportError`` naming the extra to install; ``False`` never logs.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ._config import EpochRecord

__all__ = ["log_epoch", "open_writer"]

_log = logging.getLogger("chunkstream.train")


def open_writer(out_dir: Path | None, tensorboard: bool | None) -> Any:
    """A ``SummaryWriter`` on ``out_dir/tensorboard``, or ``None`` when not logging."""
    if out_dir is None or tensorboard is False:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        if tensorboard:
            raise ImportError(
                "TensorBoard logging needs tensorboard: pip install chunkstream[tensorboard]"
            ) from exc
        _log.info(
            "tensorboard is not installed; not logging (pip install chunkstream[tensorboard])"
        )
        return None
    return SummaryWriter(log_dir=str(out_dir / "tensorboard"))


def log_epoch(writer: Any, record: EpochRecord, stats: Any) -> None:
    """Write ``record``'s losses and timing and the loader's ``stats`` at step ``record.epoch``."""
    for name, value in record.losses.items():
        writer.add_scalar(f"train/{name}", value, record.epoch)
    writer.add_scalar("val/loss", record.val_loss, record.epoch)
    for name, value in record.val_segments.items():  # per recording, segment or held-out run
        writer.add_scalar(f"val/{name}", value, record.epoch)
    writer.add_scalar("val/constant_baseline", record.baseline_val, record.epoch)
    writer.add_scalar("train/constant_baseline", record.baseline_train, record.epoch)
    writer.add_scalar("time/epoch_s", record.seconds, record.epoch)
    stats.log_to(writer, record.epoch)
    writer.flush()
