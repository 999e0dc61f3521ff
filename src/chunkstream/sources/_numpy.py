"""``NumpySource``: named in-memory arrays or ``.npy`` memmaps sharing axis 0."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .._errors import ConfigError, NotZarrError, SourceNotFoundError
from ._base import FieldSpec, SourceBase, check_dtype, check_lengths, field_context

__all__ = ["NumpySource"]


def _load(name: str, value: np.ndarray | str | Path) -> np.ndarray:
    if isinstance(value, (str, Path)):
        path = Path(value).expanduser()
        if not path.exists():
            raise SourceNotFoundError(f"field {name!r}: path {str(path)!r} does not exist.")
        if path.suffix != ".npy" or path.is_dir():
            raise NotZarrError(
                f"field {name!r}: {str(path)!r} is not a .npy file. Pass a .npy path, a numpy "
                "array, or use ZarrSource for a zarr store."
            )
        return np.load(path, mmap_mode="r")
    if not isinstance(value, np.ndarray):
        raise ConfigError.bad(
            f"arrays[{name!r}]", type(value).__name__, "a numpy array or .npy path"
        )
    return value


class NumpySource(SourceBase):
    """Fields backed by numpy arrays or memmaps (``.npy`` paths open with ``mmap_mode="r"``).

    Every array needs at least one dimension (time) and at least one timestep,
    and all share the time length. The arrays are only read, never written, and
    ``read_into`` is thread-safe.
    """

    #: No stored chunk grid along time: pieces may start anywhere.
    time_chunk = 1

    def __init__(self, arrays: Mapping[str, np.ndarray | str | Path]) -> None:
        if not isinstance(arrays, Mapping):  # an array's truth value would raise numpy's error
            raise ConfigError.bad(
                "arrays",
                type(arrays).__name__,
                "a mapping of field name -> array or .npy path",
                "Name the array: cs.NumpySource({'data': array}).",
            )
        if not arrays:
            raise ConfigError.bad("arrays", arrays, "a non-empty mapping of name -> array")
        self._arrays: dict[str, np.ndarray] = {}
        fields: dict[str, FieldSpec] = {}
        for name, value in arrays.items():
            arr = _load(name, value)
            where = f"NumpySource field {name!r} (shape {arr.shape})"
            if arr.ndim == 0 or arr.shape[0] == 0:
                raise ConfigError.bad(
                    f"arrays[{name!r}].shape", arr.shape, "at least one timestep on axis 0"
                )
            fields[name] = FieldSpec(tuple(arr.shape[1:]), check_dtype(name, arr.dtype, where))
            self._arrays[name] = arr
        self._len = check_lengths({n: a.shape[0] for n, a in self._arrays.items()}, "NumpySource")
        self._fields = fields

    def read_into(self, start: int, stop: int, out: Mapping[str, np.ndarray]) -> None:
        """Copy rows ``[start, stop)`` of every array into ``out[name][: stop - start]``."""
        for name, arr in self._arrays.items():
            with field_context(name):
                np.copyto(out[name][: stop - start], arr[start:stop])

    def close(self) -> None:
        """Drop the references (memmaps close when unreferenced); idempotent."""
        self._arrays = {}
