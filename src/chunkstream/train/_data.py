"""Splitting a source in time: a training range to stream, a held-out range kept on the device."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from .._errors import ConfigError
from ..sources import FieldSpec

__all__ = ["TimeSlice", "load_range"]


class TimeSlice:
    """The timesteps ``[begin, end)`` of another source, as a source of its own.

    Reads are offset into the base source (thread-safe when it is); ``close()``
    does nothing, since the base source belongs to the caller.
    """

    def __init__(self, base, begin: int, end: int) -> None:
        if not 0 <= begin < end <= len(base):
            raise ConfigError.bad(
                "time range", (begin, end), f"0 <= begin < end <= {len(base)} (the source length)"
            )
        self.base, self.begin, self.end = base, int(begin), int(end)

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        return self.base.fields

    def __len__(self) -> int:
        return self.end - self.begin

    def read_into(self, start: int, stop: int, out: Mapping[str, np.ndarray]) -> None:
        self.base.read_into(self.begin + start, self.begin + stop, out)

    def close(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"TimeSlice({self.base!r}, [{self.begin}, {self.end}))"


def load_range(source, begin: int, end: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Read ``[begin, end)`` of every field once and move it to ``device``."""
    out = {
        name: np.empty((end - begin, *spec.shape), dtype=spec.dtype)
        for name, spec in source.fields.items()
    }
    source.read_into(begin, end, out)
    return {name: torch.from_numpy(array).to(device) for name, array in out.items()}
