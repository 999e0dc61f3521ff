"""What the trainer derives before it trains: its device, the fields' sizes, the pieces.

Each is a pure function of the config, the source and (for the device) the
environment, and raises :class:`~chunkstream.ConfigError` naming the setting
that cannot work.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from .._errors import ConfigError
from ..pipeline import resolve_device
from ._config import PIECES_AUTO, TrainConfig

__all__ = ["field_sizes", "fit_pieces", "trainer_device"]

_log = logging.getLogger("chunkstream.train")


def trainer_device(
    requested: str | torch.device | None, *, distributed: bool, env: Any = None
) -> torch.device:
    """The trainer's device: under torch.distributed a CUDA request without an index
    (or ``None`` with CUDA present) becomes ``cuda:{LOCAL_RANK}``, one GPU per rank.

    An explicit ``cuda:k`` is kept. Without ``LOCAL_RANK`` in the environment (a
    launcher other than torchrun) the current device is used, as outside DDP.
    """
    env = os.environ if env is None else env
    if requested is None:
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        asked = torch.device(requested)
    except (RuntimeError, TypeError):
        return resolve_device(requested)  # raises the standard ConfigError
    if distributed and asked.type == "cuda" and asked.index is None and "LOCAL_RANK" in env:
        local = int(env["LOCAL_RANK"])
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not 0 <= local < count:
            raise ConfigError.bad(
                "device",
                f"cuda (LOCAL_RANK={local})",
                f"a GPU per rank on this node ({count} visible)",
                "Start at most one rank per visible GPU (torchrun --nproc_per_node), "
                "or pass device='cpu' with the gloo backend.",
            )
        asked = torch.device("cuda", local)
    return resolve_device(asked)


def field_sizes(source: Any, c: TrainConfig) -> tuple[int, int]:
    """``(neurons, stimulus dims)`` of the source's data and stimulus fields.

    Raises :class:`ConfigError` when a named field is missing or is not ``(T, N)``.
    """
    fields = source.fields
    if fields is None:  # a source that learns them at its first read: the model needs sizes
        raise ConfigError.bad(
            "source",
            type(source).__name__,
            "a source whose fields are known before training",
            "Pass the field specs (CallableSource(..., specs={...}) or specs=None to probe).",
        )
    for name in (c.data_field, c.stim_field):
        if name is not None and name not in fields:
            raise ConfigError.bad("data_field/stim_field", name, f"one of {sorted(fields)}")
    data_spec = fields[c.data_field]
    if len(data_spec.shape) != 1 or (c.stim_field and len(fields[c.stim_field].shape) != 1):
        raise ConfigError.bad(
            "fields", {n: s.shape for n, s in fields.items()}, "(T, N) data and (T, S) stimulus"
        )
    stim_dims = 0 if c.stim_field is None else int(fields[c.stim_field].shape[0])
    return int(data_spec.shape[0]), stim_dims


def fit_pieces(c: TrainConfig, chunk_size: int, grid: int = 1) -> tuple[int, int]:
    """``(pieces, align)``: the largest piece count up to ``c.pieces`` that divides
    ``chunk_size`` into pieces that each hold a window, and the piece-start alignment
    to give the loader; raises :class:`ConfigError` when a chunk cannot hold a window.

    ``c.pieces="auto"`` asks for :data:`PIECES_AUTO` pieces, each also at least
    ``grid`` (the source's stored time chunk), and aligns piece starts to ``grid``
    where it divides a piece: without segments the loader streams a
    :class:`TimeSlice` of the source, which hides the grid from it (the slice
    starts at 0), so a piece then decodes whole stored chunks only. An int is
    aligned to nothing (``align=1``).
    """
    if c.window > chunk_size:
        raise ConfigError.bad(
            "chunk_size",
            c.chunk_size,
            f">= the window {c.window}",
            "Raise chunk_size or shorten the rollout (time_units * evolve_multiple_steps).",
        )
    auto = c.pieces == "auto"
    want = PIECES_AUTO if auto else int(c.pieces)
    grid = grid if auto else 1
    shortest = max(c.window, grid)
    pieces = max(
        (d for d in range(1, want + 1) if chunk_size % d == 0 and chunk_size // d >= shortest),
        default=1,
    )
    if pieces != want:
        _log.info(
            "pieces=%s: using %d pieces, the most up to %d whose pieces of "
            "chunk_size=%d hold >= %d timesteps (the window%s)",
            c.pieces,
            pieces,
            want,
            chunk_size,
            shortest,
            ", a stored time chunk" if auto else "",
        )
    return pieces, grid if (chunk_size // pieces) % grid == 0 else 1
