"""``TensorStoreSource``: named fields of a zarr array read through tensorstore (optional extra)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import ConfigError, NotZarrError, SourceNotFoundError
from .._memory import thread_budget
from ._base import (
    FieldSpec,
    SourceBase,
    check_dtype,
    check_lengths,
    field_context,
    settle,
    window_nbytes,
)
from ._select import Selection, normalize_selection

__all__ = ["TensorStoreSource"]


def _import_tensorstore() -> Any:
    try:
        import tensorstore
    except ImportError as exc:
        raise ImportError(
            "TensorStoreSource needs tensorstore: `pip install chunkstream[tensorstore]`."
        ) from exc
    return tensorstore


def _spec_for_path(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise SourceNotFoundError(f"path {str(path)!r} does not exist. Check the path.")
    if (path / "zarr.json").exists():
        driver = "zarr3"
    elif (path / ".zarray").exists():
        driver = "zarr"
    else:
        raise NotZarrError(
            f"path {str(path)!r} is not a zarr array: it has no zarr.json or .zarray. "
            "Point at the array folder itself."
        )
    return {"driver": driver, "kvstore": {"driver": "file", "path": str(path)}}


def budget_context(ts: Any) -> Any:
    """A tensorstore context whose thread pools stay within this process's thread budget
    (:func:`chunkstream._memory.thread_budget`: its CPUs over the job's ranks on the node):
    tensorstore's own pools otherwise take every CPU of the machine in every rank."""
    threads = thread_budget()
    return ts.Context(
        {
            "data_copy_concurrency": {"limit": threads},
            "file_io_concurrency": {"limit": threads},
        }
    )


def _read_chunk_steps(store) -> int:
    """The read chunk's length along axis 0 (time); 1 when the driver reports no layout."""
    try:
        return max(1, int(store.chunk_layout.read_chunk.shape[0]))
    except (AttributeError, TypeError, IndexError, ValueError):
        return 1


class TensorStoreSource(SourceBase):
    """Fields of a zarr (v2 or v3) array opened with tensorstore.

    ``spec_or_path`` is a local path to the array (the driver is picked from its
    metadata file) or a full tensorstore spec dict (with a ``transform`` if
    wanted; its domain is counted from 0 on every axis). ``fields`` has the
    :class:`ZarrSource` meaning. Reads write straight into ``out`` through a
    tensorstore view of it. Note: like zarr, tensorstore reads absent chunks as
    the fill value; use ``ZarrSource`` where that must be detected. ``close()``
    has nothing to release beyond the handle, which tensorstore frees.
    ``context``: a ``tensorstore.Context``; by default one whose decode and file
    I/O pools hold as many threads as this process's thread budget
    (:func:`budget_context`).
    """

    def __init__(
        self,
        spec_or_path: str | Path | Mapping[str, Any],
        fields: Mapping[str, tuple[int | slice, ...] | int | slice] | None = None,
        *,
        context: Any = None,
    ) -> None:
        ts = _import_tensorstore()
        self._ts = ts
        if isinstance(spec_or_path, Mapping):
            spec = dict(spec_or_path)
            self.path = str(spec.get("kvstore", spec))
        else:
            spec = _spec_for_path(Path(spec_or_path).expanduser())
            self.path = str(spec_or_path)
        if context is None:
            context = budget_context(ts)
        store = ts.open(spec, read=True, context=context).result()
        # A spec's transform may give a domain that does not start at 0 (e.g. time
        # [5, 7905)); fields and windows count from 0, so every axis is translated.
        if any(int(origin) != 0 for origin in store.domain.origin):
            store = store[ts.d[:].translate_to[0]]
        self.store = store
        shape = tuple(int(s) for s in self.store.shape)
        where = f"tensorstore array {self.path!r} (shape {shape})"
        if not shape:
            raise NotZarrError(f"{where} is 0-d: it has no time axis.")
        raw_fields = {"data": ()} if fields is None else dict(fields)
        if not raw_fields:
            raise ConfigError.bad("fields", fields, "at least one field, or None")
        dtype = check_dtype(next(iter(raw_fields)), self.store.dtype.numpy_dtype, where)
        self._selections: dict[str, Selection] = {
            n: normalize_selection(n, index, shape, where) for n, index in raw_fields.items()
        }
        self._fields = {n: FieldSpec(s.shape, dtype) for n, s in self._selections.items()}
        self._len = check_lengths({n: shape[0] for n in self._fields}, where)
        self.nbytes_per_step = window_nbytes(self._fields, 1)
        #: The stored chunk length along time (see :func:`_read_chunk_steps`).
        self.time_chunk = _read_chunk_steps(store)

    def read_into(self, start: int, stop: int, out: Mapping[str, np.ndarray]) -> None:
        """Fill ``out[name][: stop - start]``; all fields' reads run concurrently."""
        pending = []
        for name, sel in self._selections.items():
            with field_context(name):
                target = self._ts.array(out[name][: stop - start], copy=False, write=True)
                pending.append((name, target.write(self.store[sel.as_index(start, stop)])))
        settle(partial(_result_of, name, future) for name, future in pending)


def _result_of(name: str, future: Any) -> None:
    """Wait for one field's write; its error is tagged with the field."""
    with field_context(name):
        future.result()
