"""The source protocol: where a window's bytes come from.

A source is a set of named **fields** that share one time axis (axis 0 of every
field). It is opened once, at construction, and validated then. The pipeline
calls :meth:`Source.read_into` from several reader threads at once.

Contract for implementations
----------------------------
* ``len(source)`` is the number of timesteps, the same for every field.
* ``source.fields`` maps each name to a :class:`FieldSpec` (per-timestep shape
  and numpy dtype); it never changes after construction.
* ``read_into(start, stop, out)`` fills ``out[name][: stop - start]`` for every
  field with timesteps ``[start, stop)``. ``out[name]`` is a C-contiguous,
  writable numpy array of shape ``(>= stop - start, *spec.shape)`` and dtype
  ``spec.dtype``; it may be pinned host memory and may be reused between calls,
  so the source must write every element of the first ``stop - start`` rows and
  must not keep a reference to it after returning. ``0 <= start < stop <= len``.
* ``read_into`` is thread-safe for distinct ``out`` buffers: reader workers call
  it concurrently for different windows.
* Errors raise normally; the pipeline wraps them in ``ChunkLoadError`` with the
  window. A source should raise a ``SourceError`` subclass naming the path or
  chunk key where it can (see ``MissingChunkError``, ``CorruptChunkError``).
* ``close()`` releases handles and is idempotent.
* Errors raised reading one field carry its name (:func:`tag_field`), so the
  ``ChunkLoadError`` can name it too.
* Optionally, ``time_chunk``: the stored chunk length along time (an int >= 1;
  1 where the storage has no chunk grid or it is unknown). Pieced chunks start
  on multiples of it so that a piece decodes whole stored chunks; a source
  without the attribute counts as 1 (:func:`stored_time_chunk`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from .._errors import ConfigError, FieldDtypeError, FieldLengthError

__all__ = [
    "FieldSpec",
    "Source",
    "SourceBase",
    "check_dtype",
    "check_lengths",
    "check_source",
    "decode_scratch_nbytes",
    "field_context",
    "field_of",
    "settle",
    "source_caches",
    "stored_time_chunk",
    "tag_field",
    "window_nbytes",
]

_S = TypeVar("_S", bound="SourceBase")

# dtypes torch can hold without conversion.
_TORCH_DTYPES = frozenset(
    np.dtype(t)
    for t in (
        "float16",
        "float32",
        "float64",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "bool",
        "complex64",
        "complex128",
    )
)


@dataclass(frozen=True)
class FieldSpec:
    """One field: its per-timestep ``shape`` and numpy ``dtype``."""

    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def step_nbytes(self) -> int:
        """Bytes of one timestep of this field."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@runtime_checkable
class Source(Protocol):
    """Named fields on one time axis, read a window at a time (see module docs).

    ``fields`` may be ``None`` until a first read only in a source that is also
    :class:`LearnsFields`.
    """

    @property
    def fields(self) -> Mapping[str, FieldSpec] | None: ...

    def __len__(self) -> int: ...

    def read_into(self, start: int, stop: int, out: Mapping[str, np.ndarray]) -> None: ...

    def close(self) -> None: ...


class SourceBase:
    """What chunkstream's own sources share: ``fields``, ``len()``, a ``close()`` and use
    as a context manager that closes on exit.

    A convenience, not the contract: a user's source implements :class:`Source` and
    need not inherit this. A subclass sets ``_fields`` and ``_len`` when it opens, and
    overrides ``close`` where it holds something to release.
    """

    _fields: Mapping[str, FieldSpec]
    _len: int

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """Field name -> per-timestep shape and dtype."""
        return self._fields

    def __len__(self) -> int:
        return self._len

    def close(self) -> None:
        """Nothing to release; idempotent."""

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@runtime_checkable
class HandsOver(Protocol):
    """A source that can return a window as fresh arrays the caller then owns.

    Where ``hands_over`` is true, the CPU pipeline delivers a one-piece chunk as
    zero-copy tensors of ``read_owned(start, stop)`` (field name -> array of
    ``stop - start`` rows, checked as ``read_into`` checks) instead of copying it into
    its host arena, which it then never allocates. Thread-safe.
    """

    hands_over: bool

    def read_owned(self, start: int, stop: int) -> dict[str, np.ndarray]: ...


@runtime_checkable
class LearnsFields(Protocol):
    """A source whose ``fields`` are ``None`` until its first read
    (``CallableSource(..., specs="first")``).

    ``names`` are the fields' names, known at once. ``learn(start, stop)`` reads that
    window and learns the fields from it (the loader calls it in a reader thread
    before it allocates buffers); the next ``read_into(start, stop, ...)`` serves
    those arrays without reading again, unless ``forget(start, stop)`` dropped them
    because that read will not happen. Both are thread-safe.
    """

    names: tuple[str, ...]

    def learn(self, start: int, stop: int) -> None: ...

    def forget(self, start: int, stop: int) -> None: ...


def source_caches(source: object) -> list[Any]:
    """The node-local caches ``source`` reads through: a remote ``ZarrSource``'s
    ``cache``, and those of every recording of a ``cs.Recordings`` (each once)."""
    found = [] if getattr(source, "cache", None) is None else [source.cache]
    for member in getattr(source, "recordings", {}).values():
        found += [c for c in source_caches(member) if all(c is not f for f in found)]
    return found


def decode_scratch_nbytes(source: object) -> int:
    """Host bytes ``source``'s decoders may hold beside the loader's buffers, at most: its
    ``scratch_nbytes`` (a ``ZarrSource`` on the fast path: one stored chunk and a read
    buffer per decode thread, each thread keeping its own; a composite source the sum of
    its parts'); 0 for a source that reads straight into the caller's buffer."""
    return max(0, int(getattr(source, "scratch_nbytes", 0)))


def stored_time_chunk(source: object) -> int:
    """The source's ``time_chunk`` (module docs); 1 for a source without one."""
    return max(1, int(getattr(source, "time_chunk", 1)))


def window_nbytes(fields: Mapping[str, FieldSpec], timesteps: int) -> int:
    """Bytes of ``timesteps`` rows of every field together."""
    return sum(spec.step_nbytes for spec in fields.values()) * int(timesteps)


def check_dtype(name: str, dtype: np.dtype, where: str) -> np.dtype:
    """The native-byte-order form of ``dtype`` if torch can hold it, else raise
    ``FieldDtypeError``. A big-endian stored dtype is accepted: sources swap its
    bytes as they read, so fields always hold native-order data."""
    dtype = np.dtype(dtype)
    native = dtype.newbyteorder("=") if dtype.byteorder in "<>" else dtype
    if native not in _TORCH_DTYPES:
        raise FieldDtypeError(
            f"field {name!r} of {where} has dtype {dtype}, which cannot become a torch "
            f"tensor: expected one of {sorted(str(d) for d in _TORCH_DTYPES)}. "
            "Convert the array (e.g. `chunkstream convert IN OUT --fields ... --dtype float32`, "
            "or numpy's .astype('float32'))."
        )
    return native


def check_lengths(lengths: Mapping[str, int], where: str) -> int:
    """Return the one time length shared by all fields, else raise ``FieldLengthError``."""
    distinct = set(lengths.values())
    if len(distinct) != 1:
        detail = ", ".join(f"{k}={v}" for k, v in lengths.items())
        raise FieldLengthError(
            f"fields of {where} have different time lengths ({detail}): every field "
            "must share axis 0. Slice the longer arrays to the common length."
        )
    return distinct.pop()


def tag_field(exc: BaseException, name: str | None, *, replace: bool = False) -> None:
    """Record that ``exc`` was raised reading field ``name``, for the ``ChunkLoadError``
    the pipeline raises (:func:`field_of`). A name already there is kept (the innermost
    reader knows best) unless ``replace``, which a source that renames fields uses;
    ``None`` then clears it. An exception that cannot take the attribute goes untagged."""
    if replace or field_of(exc) is None:
        with contextlib.suppress(AttributeError):
            exc.chunkstream_field = name  # type: ignore[attr-defined]


def field_of(exc: BaseException) -> str | None:
    """The field ``exc`` was raised reading (:func:`tag_field`), or ``None`` if unknown."""
    return getattr(exc, "chunkstream_field", None)


class field_context:
    """Tag an exception raised while reading one field with that field's name
    (:func:`tag_field`); sources wrap each field's read in this.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is not None:
            tag_field(exc, self.name)
        return False


def settle(waits: Iterable[Callable[[], object]]) -> None:
    """Call every wait in turn (each blocks until its task has ended), then raise the
    first error among them, if any: a read returns or raises only once none of its
    tasks can still write into the caller's buffers. An interrupt is held too."""
    error: BaseException | None = None
    for wait in waits:
        try:
            wait()
        except BaseException as exc:  # raised below, once every task has ended
            error = error or exc
    if error is not None:
        raise error


def describe_source(source: object) -> str:
    """``Type('path')`` where the source has a path, else its type name (for messages)."""
    path = getattr(source, "path", None)
    return f"{type(source).__name__}({str(path)!r})" if path is not None else type(source).__name__


def check_source(source: object) -> Source:
    """``source`` if it is a :class:`Source` with at least one timestep, else ConfigError."""
    if not isinstance(source, Source):
        raise ConfigError.bad(
            "source",
            type(source).__name__,
            "a chunkstream Source (fields, __len__, read_into, close)",
            "Wrap arrays in cs.NumpySource, zarr in cs.ZarrSource, a function in cs.CallableSource.",
        )
    if len(source) < 1:
        raise ConfigError.bad("source", f"{len(source)} timesteps", "at least 1 timestep")
    if source.fields is None and not isinstance(source, LearnsFields):
        raise ConfigError.bad(
            "source",
            f"{type(source).__name__} with fields=None",
            "a source whose fields are known, or one that learns them (names, learn, forget)",
            "Return the fields from `fields`, or use cs.CallableSource(..., specs='first').",
        )
    return source
