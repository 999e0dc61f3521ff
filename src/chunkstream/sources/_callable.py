"""``CallableSource``: a user's ``load_fn(start, stop) -> tuple[np.ndarray, ...]``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from .._errors import ConfigError, check_int
from ._base import FieldSpec, SourceBase, check_dtype, field_context

__all__ = ["CallableSource"]


class CallableSource(SourceBase):
    """Fields produced by ``load_fn(start, stop)``, one array per name in ``names``.

    ``load_fn`` must be thread-safe when the loader has several reader workers.
    The field specs (per-timestep shape and dtype, which the loader needs to
    allocate its buffers before the first read) come from ``specs`` or, if
    ``None``, from one **probe call** ``load_fn(0, min(2, total_timesteps))``
    made here, at construction, whose result is dropped. Pass ``specs`` when
    that call is unwelcome: a ``load_fn`` that is slow, counts its calls, or
    assumes every window is ``chunk_size`` long. With ``specs`` the source
    calls ``load_fn`` only from ``read_into``, once per window read::

        cs.CallableSource(load_fn, T, names=("data", "stim"),
                          specs={"data": cs.FieldSpec((N,), np.dtype("float32")),
                                 "stim": cs.FieldSpec((S,), np.dtype("float32"))})

    ``specs="first"`` learns them from the first window the loader reads instead:
    ``fields`` is ``None`` until then, the loader allocates its buffers after that
    read (:meth:`learn`), and ``load_fn`` is still called once per window read
    (``chunkstream.compat`` runs this way). Every result is checked against the
    specs: a wrong count, shape or dtype raises ``ValueError`` naming the field,
    what came back and what was expected.

    ``_hand_over=True`` (``chunkstream.compat``, whose ``load_fn`` returns fresh arrays as
    the original's did) lets the CPU pipeline deliver ``load_fn``'s arrays themselves as
    the chunk's tensors (:class:`~._base.HandsOver`), as the original loader did, instead
    of copying them into its host arena; a ``load_fn`` that reuses its output arrays
    must leave it ``False``.
    """

    #: No stored chunk grid along time: pieces may start anywhere.
    time_chunk = 1

    def __init__(
        self,
        load_fn: Callable[[int, int], Sequence[np.ndarray]],
        total_timesteps: int,
        names: Sequence[str] = ("data", "stim"),
        *,
        specs: Mapping[str, FieldSpec] | str | None = None,
        _hand_over: bool = False,
    ) -> None:
        if not callable(load_fn):
            raise ConfigError.bad("load_fn", load_fn, "a callable load_fn(start, stop)")
        total_timesteps = check_int(
            "total_timesteps", total_timesteps, expected="a positive int", numpy=True
        )
        names = tuple(names)
        if not names or len(set(names)) != len(names):
            raise ConfigError.bad("names", names, "a non-empty sequence of distinct names")
        self._load_fn = load_fn
        self.hands_over = bool(_hand_over)
        self._len = int(total_timesteps)
        self._names = self.names = names  # the fields' names, known before their specs
        self._fields: dict[str, FieldSpec] | None = None
        # Arrays learn() fetched, per window, each answering one later read_into.
        self._learned: dict[tuple[int, int], list[tuple[np.ndarray, ...]]] = {}
        self._lock = threading.Lock()
        if isinstance(specs, str):
            if specs != "first":
                raise ConfigError.bad(
                    "specs",
                    specs,
                    "a mapping of FieldSpec, None or 'first'",
                    "Pass the specs, None to probe, or 'first' to learn them.",
                )
        elif specs is None:
            self._learn_from(self._call(0, min(2, self._len)))
        elif set(specs) != set(names):
            raise ConfigError.bad("specs", sorted(specs), f"one spec per name in {list(names)}")
        else:
            self._fields = {
                n: FieldSpec(tuple(specs[n].shape), check_dtype(n, specs[n].dtype, "load_fn"))
                for n in names
            }

    @property
    def fields(self) -> Mapping[str, FieldSpec] | None:
        """Field name -> per-timestep shape and dtype (``None`` with ``specs="first"``
        until :meth:`learn` ran)."""
        return self._fields

    def _learn_from(self, arrays: Sequence[np.ndarray]) -> None:
        specs = {
            n: FieldSpec(tuple(np.shape(a)[1:]), np.asarray(a).dtype)
            for n, a in zip(self._names, arrays, strict=True)
        }
        self._fields = {
            n: FieldSpec(s.shape, check_dtype(n, s.dtype, "load_fn")) for n, s in specs.items()
        }

    def learn(self, start: int, stop: int) -> None:
        """Call ``load_fn(start, stop)`` and, if the specs are unknown, learn them from its
        arrays; one later ``read_into(start, stop, ...)`` copies these arrays instead of
        calling ``load_fn`` again (call :meth:`forget` if that read will not happen)."""
        arrays = self._call(start, stop)
        with self._lock:
            if self._fields is None:
                self._learn_from(arrays)
            self._learned.setdefault((start, stop), []).append(arrays)

    def forget(self, start: int, stop: int) -> None:
        """Drop the arrays one :meth:`learn` of this window kept (its read was abandoned)."""
        self._take((start, stop))

    def _take(self, window: tuple[int, int]) -> tuple[np.ndarray, ...] | None:
        with self._lock:
            kept = self._learned.get(window)
            if not kept:
                return None
            arrays = kept.pop()
            if not kept:
                del self._learned[window]
            return arrays

    def _call(self, start: int, stop: int) -> tuple[np.ndarray, ...]:
        result = self._load_fn(start, stop)
        if isinstance(result, np.ndarray) and len(self._names) == 1:
            result = (result,)
        if not isinstance(result, (tuple, list)) or len(result) != len(self._names):
            got = len(result) if isinstance(result, (tuple, list)) else type(result).__name__
            raise ValueError(
                f"load_fn({start}, {stop}) returned {got!r} values, expected a tuple of "
                f"{len(self._names)} arrays, one per name in {list(self._names)}."
            )
        return tuple(result)

    def read_into(self, start: int, stop: int, out: Mapping[str, np.ndarray]) -> None:
        """Call ``load_fn(start, stop)`` and copy each array into ``out[name][: stop - start]``."""
        arrays = self._take((start, stop))
        if self._fields is None:
            raise RuntimeError("CallableSource(specs='first'): call learn() before read_into()")
        for name, arr in self._checked(start, stop, arrays).items():
            np.copyto(out[name][: stop - start], arr)

    def read_owned(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """``load_fn(start, stop)``'s arrays themselves, checked (the specs learned from
        them if unknown); copied only where torch could not share them (another byte
        order, read-only, not C-contiguous)."""
        arrays = self._take((start, stop))
        if arrays is None:
            arrays = self._call(start, stop)
        with self._lock:
            if self._fields is None:
                self._learn_from(arrays)
        owned = {}
        for name, arr in self._checked(start, stop, arrays).items():
            if not (arr.dtype.isnative and arr.flags.writeable and arr.flags.c_contiguous):
                arr = np.array(arr, dtype=arr.dtype.newbyteorder("="), order="C")
            owned[name] = arr
        return owned

    def _checked(
        self, start: int, stop: int, arrays: tuple[np.ndarray, ...] | None
    ) -> dict[str, np.ndarray]:
        """The window's ``arrays`` (``None``: call ``load_fn``), each checked against its spec."""
        fields = self._fields
        assert fields is not None  # callers learned the specs first
        values = arrays if arrays is not None else self._call(start, stop)
        checked = {}
        for name, value in zip(self._names, values, strict=True):
            with field_context(name):
                spec = fields[name]
                arr = np.asarray(value)
                expected = (stop - start, *spec.shape)
                if arr.shape != expected or arr.dtype.newbyteorder("=") != spec.dtype:
                    raise ValueError(
                        f"load_fn({start}, {stop}) returned field {name!r} with shape "
                        f"{arr.shape} and dtype {arr.dtype}; expected shape {expected} and "
                        f"dtype {spec.dtype}. Return exactly stop - start rows of a fixed dtype."
                    )
                checked[name] = arr
        return checked
