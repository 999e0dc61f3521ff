"""``JoinSource``: the fields of several sources over one time axis.

Datasets often keep what one timestep needs in separate stores: activity traces
in a zarr v3 array read through tensorstore, a boolean "observed" mask in a zarr
v2 array, per-frame covariates in numpy, per-frame integer indices in another
zarr array. A :class:`JoinSource` exposes the fields of all of them as one
source, so one window of the loader is one chunk holding every field.

Reads: ``read_into`` reads every part concurrently, the first in the calling
thread and the others on a small pool owned by the join (an
:class:`~chunkstream._executor.Executor` of daemon threads named
``chunkstream-join-<n>``, stopped by :meth:`JoinSource.close` within
:data:`CLOSE_S`). It returns only
after every part has finished, also when one fails, so nothing writes into
``out`` after it returns; the first failing part's exception (in part order)
is raised as it is (its type decides retries and what callers catch), tagged
with the field it was reading and with a note naming the part, its store and
the window.

Thread-safety: as the parts' ``read_into``; the parts see distinct ``out``
arrays (each field belongs to one part), and each part is called from one
thread per window.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Mapping
from functools import partial

import numpy as np

from .._errors import ConfigError, FieldLengthError, check_int
from .._executor import Executor
from ._base import (
    FieldSpec,
    Source,
    SourceBase,
    decode_scratch_nbytes,
    describe_source,
    field_of,
    settle,
    stored_time_chunk,
    tag_field,
    window_nbytes,
)

__all__ = ["JoinSource"]

#: How long :meth:`JoinSource.close` waits for its threads (a part's read that never
#: returns is left to its daemon thread, which ends with the process).
CLOSE_S = 5.0


def _stop(pool: Executor) -> None:
    """Stop ``pool``'s threads without waiting for them (a collected join's)."""
    pool.close(time.monotonic())


class JoinSource(SourceBase):
    """Every field of several sources, on the time axis they share.

    ``JoinSource(a, b, c)`` joins the parts in that order; the fields keep their
    names, and ``fields`` lists them part by part.
    ``JoinSource({"traces": a, "mask": b})`` labels each part: a part with
    exactly one field exposes it under its label (so two stores that each hold
    one array called ``"data"`` become ``"traces"`` and ``"mask"``); a part with
    several fields keeps their names. Labels appear in error messages.

    Field names must be unique across the parts (``ConfigError`` otherwise) and
    every part must have the same number of timesteps (``FieldLengthError``
    naming each store and its length). Any :class:`~chunkstream.sources.Source`
    may be a part, a ``JoinSource`` included. The join owns its parts:
    :meth:`close` closes them. ``read_threads`` (default: one per part after
    the first, times four, for concurrent reader workers) sizes the pool that
    reads the parts after the first.
    """

    def __init__(
        self, *sources: Source | Mapping[str, Source], read_threads: int | None = None
    ) -> None:
        if len(sources) == 1 and isinstance(sources[0], Mapping):
            labelled = dict(sources[0])
            rename = True
        else:
            labelled = {f"part {i}": s for i, s in enumerate(sources)}
            rename = False
        if not labelled:
            raise ConfigError.bad(
                "sources",
                sources,
                "at least one source, or a non-empty mapping label -> source",
                "Pass the sources to join: cs.JoinSource(traces, mask, ...).",
            )
        for label, part in labelled.items():
            if not isinstance(part, Source) or isinstance(part, Mapping):
                raise ConfigError.bad(
                    f"sources[{label!r}]",
                    type(part).__name__,
                    "a source (fields, __len__, read_into, close)",
                    "Open each store as a source first, e.g. cs.ZarrSource(path).",
                )
        if read_threads is None:
            read_threads = max(1, 4 * (len(labelled) - 1))
        check_int(
            "read_threads",
            read_threads,
            1,
            "Pass None for one thread per extra part and reader worker.",
            expected="an int >= 1, or None",
        )
        lengths = {label: len(part) for label, part in labelled.items()}
        if len(set(lengths.values())) != 1:
            detail = ", ".join(
                f"{label} {describe_source(labelled[label])} has {n}"
                for label, n in lengths.items()
            )
            raise FieldLengthError(
                f"the sources of a JoinSource must share one time length, but {detail} "
                "timesteps. Slice the longer store to the common length (or pass a "
                "tensorstore spec with a transform that does)."
            )
        # part label -> (part, {exposed name: the part's own name})
        self._parts: list[tuple[str, Source, dict[str, str]]] = []
        fields: dict[str, FieldSpec] = {}
        owner: dict[str, str] = {}
        for label, part in labelled.items():
            own = list(part.fields)
            names = {label: own[0]} if rename and len(own) == 1 else {n: n for n in own}
            for exposed, inner in names.items():
                if exposed in fields:
                    raise ConfigError.bad(
                        "sources",
                        f"field {exposed!r} in both {owner[exposed]} and {label}",
                        "unique field names across the joined sources",
                        "Rename a field in one source (e.g. fields={'mask': ...}), or pass a "
                        "mapping label -> source so that one-field sources take their label.",
                    )
                fields[exposed] = part.fields[inner]
                owner[exposed] = f"{label} {describe_source(part)}"
            self._parts.append((label, part, names))
        self._fields = fields
        self._len = next(iter(lengths.values()))
        self.nbytes_per_step = window_nbytes(fields, 1)
        self.read_amplification = {
            exposed: getattr(part, "read_amplification", {}).get(inner, 1.0)
            for _, part, names in self._parts
            for exposed, inner in names.items()
        }
        #: The least common multiple of the parts' stored time chunks: the smallest grid
        #: whose every point is on each part's grid, so a piece aligned to it decodes
        #: whole stored chunks of every part (a part without a grid counts as 1).
        self.time_chunk = math.lcm(*(stored_time_chunk(part) for _, part, _ in self._parts))
        #: Host bytes its parts' decoders keep, at most (:func:`decode_scratch_nbytes`).
        self.scratch_nbytes = sum(decode_scratch_nbytes(part) for _, part, _ in self._parts)
        self._pool = Executor("join", read_threads)
        # A join collected unclosed stops its idle threads too (they are not waited for).
        weakref.finalize(self, _stop, self._pool).atexit = False
        self._closed = False

    @property
    def parts(self) -> dict[str, Source]:
        """Label -> joined source (labels are ``"part 0"``, ... without a mapping)."""
        return {label: part for label, part, _ in self._parts}

    def read_into(self, start: int, stop: int, out: Mapping[str, np.ndarray]) -> None:
        """Fill ``out[name][: stop - start]`` for every field; the parts read concurrently."""
        jobs = [
            (label, part, {inner: out[exposed] for exposed, inner in names.items()}, names)
            for label, part, names in self._parts
        ]
        what = f"read [{start}, {stop})"
        pending = [
            (job, self._pool.submit(self._read_part, job, start, stop, what=what))
            for job in jobs[1:]
        ]
        # The first part in this thread; then every other part's end, errors or not.
        settle([partial(self._read_part, jobs[0], start, stop), *(f.result for _, f in pending)])

    @staticmethod
    def _read_part(job: tuple, start: int, stop: int) -> None:
        label, part, views, names = job
        try:
            part.read_into(start, stop, views)
        except Exception as exc:
            inner = field_of(exc)
            exposed = next((e for e, i in names.items() if i == inner), None)
            if exposed is None and len(names) == 1:  # the part's only field
                exposed = next(iter(names))
            tag_field(exc, exposed, replace=True)  # the field as the join exposes it
            exc.add_note(
                f"chunkstream: JoinSource part {label} ({describe_source(part)}), fields "
                f"{list(names)}, failed reading window [{start}, {stop})"
            )
            raise

    def close(self) -> None:
        """Stop the pool (joining its threads up to :data:`CLOSE_S`) and close every part;
        idempotent."""
        if self._closed:
            return
        self._closed = True
        self._pool.close_within(CLOSE_S, "JoinSource", "a part's read that never returns")
        for _, part, _ in self._parts:
            part.close()

    def __repr__(self) -> str:
        parts = ", ".join(f"{label}={describe_source(part)}" for label, part, _ in self._parts)
        return f"JoinSource(T={self._len}, {parts})"
