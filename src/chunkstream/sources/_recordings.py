"""``Recordings``: several recordings streamed as one dataset.

Users rarely have one recording: several simulation runs, sessions, animals or
conditions, each in its own store. :class:`Recordings` lays them end to end on
one time axis, so a :class:`~chunkstream.ChunkLoader` streams them as one
source, and gives the loader what keeps them apart:

* **Boundaries.** :attr:`Recordings.segments` holds one segment per recording
  (named after it). A loader over a ``Recordings`` uses them as its segments,
  and cuts any segments it is given at the recordings' bounds, so no piece and
  no batch window crosses from one recording into another. Segments inside a
  recording (conditions, ``split_segments``) compose with them.
* **Weights.** An epoch draws each recording's chunks in proportion to its
  length, or to ``weights`` (:attr:`Recordings.strata`, which the loader's plan
  reads): the plan stays a pure function of (seed, epoch, index), so epochs are
  deterministic, resume mid-epoch and are shared disjointly across ranks as for
  one array.
* **Which recording.** Every chunk, and so every batch, holds a field
  ``"recording"`` (int64, one value per timestep): the index of the recording
  each row came from, in :attr:`Recordings.names` order, so a model can
  condition on it (``batch["recording"][:, 0]`` is each window's recording).
* **Different shapes.** Recordings whose fields differ in the size of a
  non-time axis (neuron counts) are **padded to the largest** with zeros, and a
  field ``"<name>_mask"`` (bool, the field's padded shape) is true where the
  values are real. Padding keeps one batch shape and lets every batch mix
  recordings, which the shuffle buffer needs for model quality; batches drawn
  one recording at a time would be correlated again. Fields whose shapes agree
  get no mask and are read straight into the loader's buffers. A field missing
  from a recording, a different dtype or a different number of axes is refused
  at construction, naming the recording and the field.

Where the recordings' stored time chunks are larger than one timestep, each
recording starts on a multiple of their least common multiple, so pieces keep
decoding whole stored chunks; the few timesteps between two recordings lie in
no segment and are never streamed (read, they are zeros with recording id -1).

Reads: ``read_into`` reads each recording the window overlaps with that
recording's own ``read_into``, in the calling thread (a recording's own pools,
caches and retries apply). Thread-safety: as the recordings' ``read_into``.
The source owns its recordings: :meth:`Recordings.close` closes them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from .._errors import ConfigError, FieldDtypeError
from ..plans import Segments
from ._base import (
    FieldSpec,
    Source,
    SourceBase,
    decode_scratch_nbytes,
    describe_source,
    stored_time_chunk,
    window_nbytes,
)

__all__ = ["MASK_SUFFIX", "RECORDING_FIELD", "Recordings"]

#: The field holding each timestep's recording index.
RECORDING_FIELD = "recording"
#: The suffix of a padded field's mask.
MASK_SUFFIX = "_mask"


class Recordings(SourceBase):
    """Several sources streamed as one dataset (see the module).

    ``sources``: a sequence of sources (any :class:`~chunkstream.Source` with known
    fields: local or remote ``ZarrSource``, ``cs.flyvis.open``, groups, joins), or a
    mapping name -> source. ``weights``: ``None`` (each recording in proportion to
    its length), or one number > 0 per recording (a sequence in order, or a mapping
    name -> weight): each recording's share of an epoch's chunks. ``names``: one
    unique name per recording (default: the mapping's keys, else ``rec0``,
    ``rec1``, ...).
    """

    def __init__(
        self,
        sources: Sequence[Source] | Mapping[str, Source],
        weights: Sequence[float] | Mapping[str, float] | None = None,
        names: Sequence[str] | None = None,
    ) -> None:
        self._closed = True
        parts, names = _named(sources, names)
        self._parts = parts
        self.names: tuple[str, ...] = names
        self.lengths: tuple[int, ...] = tuple(len(p) for p in parts)
        self.weights: tuple[float, ...] = _weights(weights, names, self.lengths)
        fields, self._pads, self._masked = _merged_fields(parts, names)
        self._fields = fields
        #: The least common multiple of the recordings' stored time chunks: each
        #: recording starts on a multiple of it, so pieces aligned to it decode whole
        #: stored chunks of every recording.
        self.time_chunk = math.lcm(*(stored_time_chunk(p) for p in parts))
        #: Host bytes the recordings' decoders keep, at most (:func:`decode_scratch_nbytes`).
        self.scratch_nbytes = sum(decode_scratch_nbytes(p) for p in parts)
        offsets, at = [], 0
        for n in self.lengths:
            at = -(-at // self.time_chunk) * self.time_chunk
            offsets.append(at)
            at += n
        self.offsets: tuple[int, ...] = tuple(offsets)
        self._len = at
        self.nbytes_per_step = window_nbytes(fields, 1)
        self.read_amplification = {
            name: max(getattr(p, "read_amplification", {}).get(name, 1.0) for p in parts)
            for name in fields
        }
        self._closed = False

    # -- what the loader's plan reads -----------------------------------------------------

    @property
    def segments(self) -> Segments:
        """One segment per recording, ``[offset, offset + length)``, named after it."""
        return Segments(
            [
                (o, o + n, name)
                for o, n, name in zip(self.offsets, self.lengths, self.names, strict=True)
            ]
        )

    @property
    def strata(self) -> tuple[tuple[int, int, float], ...]:
        """``(start, stop, weight)`` per recording: what a loader's plan weighs by."""
        return tuple(
            (o, o + n, w) for o, n, w in zip(self.offsets, self.lengths, self.weights, strict=True)
        )

    @property
    def shares(self) -> dict[str, float]:
        """Name -> the share of an epoch's chunks the recording gets (sums to 1)."""
        total = sum(self.weights)
        return {n: w / total for n, w in zip(self.names, self.weights, strict=True)}

    @property
    def recordings(self) -> dict[str, Source]:
        """Name -> the recording's source."""
        return dict(zip(self.names, self._parts, strict=True))

    def recording_of(self, t: int) -> int:
        """The index of the recording holding timestep ``t`` (-1 between recordings)."""
        i = int(np.searchsorted(self.offsets, t, side="right")) - 1
        return i if i >= 0 and t < self.offsets[i] + self.lengths[i] else -1

    # -- reading ---------------------------------------------------------------------------

    def read_into(self, start: int, stop: int, out: Mapping[str, np.ndarray]) -> None:
        """Fill ``out[name][: stop - start]``: each overlapped recording's rows, padded
        and masked where its shape is smaller; rows between recordings are zeros."""
        at = start
        for i, (offset, n) in enumerate(zip(self.offsets, self.lengths, strict=True)):
            lo, hi = max(start, offset), min(stop, offset + n)
            if lo >= hi:
                continue
            if at < lo:
                self._fill_gap(at - start, lo - start, out)
            self._read_one(i, lo - offset, hi - offset, lo - start, out)
            at = hi
        if at < stop:
            self._fill_gap(at - start, stop - start, out)

    def _read_one(self, i: int, a: int, b: int, row: int, out: Mapping[str, np.ndarray]) -> None:
        part, pads = self._parts[i], self._pads[i]
        rows = slice(row, row + b - a)
        views: dict[str, np.ndarray] = {}
        for name, spec in part.fields.items():
            if name in pads:
                views[name] = np.empty((b - a, *spec.shape), dtype=self._fields[name].dtype)
            else:
                views[name] = out[name][rows]
        try:
            part.read_into(a, b, views)
        except Exception as exc:
            exc.add_note(
                f"chunkstream: recording {self.names[i]!r} ({describe_source(part)}) failed "
                f"reading its window [{a}, {b})"
            )
            raise
        for name, inner in pads.items():
            target = out[name][rows]
            target.fill(0)
            target[(slice(None), *inner)] = views[name]
            mask = out[name + MASK_SUFFIX][rows]
            mask.fill(False)
            mask[(slice(None), *inner)] = True
        for name in self._masked:
            if name not in pads:  # this recording fills the whole field
                out[name + MASK_SUFFIX][rows] = True
        out[RECORDING_FIELD][rows] = i

    def _fill_gap(self, lo: int, hi: int, out: Mapping[str, np.ndarray]) -> None:
        for name, array in out.items():
            if name in self._fields:
                array[lo:hi] = -1 if name == RECORDING_FIELD else 0

    def close(self) -> None:
        """Close every recording; idempotent."""
        if self._closed:
            return
        self._closed = True
        for part in self._parts:
            part.close()

    def __repr__(self) -> str:
        inner = ", ".join(
            f"{n}={describe_source(p)}[{len(p)}]"
            for n, p in zip(self.names, self._parts, strict=True)
        )
        return f"Recordings(T={self._len}, {inner})"


def _named(sources: object, names: Sequence[str] | None) -> tuple[list[Source], tuple[str, ...]]:
    """The recordings and their names, checked."""
    if isinstance(sources, Mapping):
        if names is not None:
            raise ConfigError.bad(
                "names", names, "None when sources is a mapping (its keys are the names)"
            )
        names, parts = [str(k) for k in sources], list(sources.values())
    elif isinstance(sources, (str, bytes, Path)) or not isinstance(sources, Sequence):
        raise ConfigError.bad(
            "sources",
            type(sources).__name__,
            "a sequence of sources, or a mapping name -> source",
            "Open each recording first, e.g. cs.Recordings([cs.ZarrSource(a), cs.ZarrSource(b)]).",
        )
    else:
        parts = list(sources)
        names = [f"rec{i}" for i in range(len(parts))] if names is None else list(names)
    if not parts:
        raise ConfigError.bad("sources", sources, "at least one recording")
    if len(names) != len(parts):
        raise ConfigError.bad(
            "names", names, f"one name per recording ({len(parts)})", "Pass a name for each."
        )
    if len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
        raise ConfigError.bad("names", names, "unique, non-empty strings")
    for name, part in zip(names, parts, strict=True):
        if not isinstance(part, Source) or isinstance(part, Mapping):
            raise ConfigError.bad(
                f"sources[{name!r}]",
                type(part).__name__,
                "a source (fields, __len__, read_into, close)",
                "Open each store as a source first, e.g. cs.ZarrSource(path).",
            )
        if part.fields is None:
            raise ConfigError.bad(
                f"sources[{name!r}]",
                describe_source(part),
                "a source whose fields are known",
                "Pass the field specs to the source (a CallableSource's specs=...).",
            )
        if len(part) < 1:
            raise ConfigError.bad(f"sources[{name!r}]", f"{len(part)} timesteps", "at least 1")
    return parts, tuple(names)


def _weights(
    weights: object, names: tuple[str, ...], lengths: tuple[int, ...]
) -> tuple[float, ...]:
    """One weight > 0 per recording (its length without ``weights``)."""
    if weights is None:
        return tuple(float(n) for n in lengths)
    if isinstance(weights, Mapping):
        unknown = sorted(set(weights) - set(names))
        missing = [n for n in names if n not in weights]
        if unknown or missing:
            raise ConfigError.bad(
                "weights",
                dict(weights),
                f"one weight per recording {list(names)}",
                f"Unknown: {unknown}; missing: {missing}.",
            )
        values = [weights[n] for n in names]
    elif isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise ConfigError.bad(
            "weights", weights, "None, a sequence of numbers, or a mapping name -> number"
        )
    else:
        values = list(weights)
    if len(values) != len(names):
        raise ConfigError.bad(
            "weights", weights, f"one weight per recording ({len(names)})", "Pass one for each."
        )
    out = []
    for name, w in zip(names, values, strict=True):
        if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)):
            raise ConfigError.bad(f"weights[{name!r}]", w, "a number > 0")
        if not (math.isfinite(float(w)) and float(w) > 0):
            raise ConfigError.bad(
                f"weights[{name!r}]", w, "a finite number > 0", "Leave a recording out instead."
            )
        out.append(float(w))
    return tuple(out)


def _merged_fields(
    parts: list[Source], names: tuple[str, ...]
) -> tuple[dict[str, FieldSpec], list[dict[str, tuple[slice, ...]]], tuple[str, ...]]:
    """The fields every recording shares (padded to the largest shape, with a mask
    field where shapes differ, and the recording id); per recording the fields it
    pads (name -> the slices its own values fill); the fields that have a mask."""
    first, first_name = parts[0].fields, names[0]
    for name, part in zip(names, parts, strict=True):
        if RECORDING_FIELD in part.fields:
            raise ConfigError.bad(
                f"sources[{name!r}]",
                f"a field named {RECORDING_FIELD!r}",
                f"no field called {RECORDING_FIELD!r} (Recordings adds it: each row's recording)",
                "Rename the field (e.g. ZarrSource(..., fields={...})).",
            )
        missing = [f for f in first if f not in part.fields]
        extra = [f for f in part.fields if f not in first]
        if missing or extra:
            field = (missing or extra)[0]
            where = (
                f"lacks field {field!r} that recording {first_name!r} has"
                if missing
                else f"has field {field!r} that recording {first_name!r} lacks"
            )
            raise ConfigError(
                f"recording {name!r} ({describe_source(part)}) {where}: every recording "
                f"must hold the same fields ({list(first)}). Select the same fields from "
                "each store (ZarrSource(..., fields=...)) or join what is missing."
            )
        for field, spec in part.fields.items():
            ref = first[field]
            if spec.dtype != ref.dtype:
                raise FieldDtypeError(
                    f"recording {name!r} ({describe_source(part)}) field {field!r} has dtype "
                    f"{spec.dtype}, but recording {first_name!r} has {ref.dtype}: every "
                    "recording must store a field in one dtype. Convert one (`chunkstream "
                    "convert IN OUT --dtype ...`)."
                )
            if len(spec.shape) != len(ref.shape):
                raise ConfigError(
                    f"recording {name!r} ({describe_source(part)}) field {field!r} has shape "
                    f"{spec.shape} per timestep, but recording {first_name!r} has {ref.shape}: "
                    "recordings may differ in the size of an axis (they are padded), not in "
                    "the number of axes. Select the same axes from each store."
                )
    fields: dict[str, FieldSpec] = {}
    padded: set[str] = set()
    for field, ref in first.items():
        shapes = [p.fields[field].shape for p in parts]
        largest = tuple(max(sizes) for sizes in zip(*shapes, strict=True))
        fields[field] = FieldSpec(largest, ref.dtype)
        if any(s != largest for s in shapes):
            padded.add(field)
    for field in sorted(padded):
        mask = field + MASK_SUFFIX
        if mask in fields:
            raise ConfigError(
                f"field {field!r} differs in shape between recordings and needs a mask field "
                f"{mask!r}, but the recordings already hold a field of that name. Rename it."
            )
        fields[mask] = FieldSpec(fields[field].shape, np.dtype(bool))
    fields[RECORDING_FIELD] = FieldSpec((), np.dtype(np.int64))
    pads = [
        {
            f: tuple(slice(0, n) for n in part.fields[f].shape)
            for f in padded
            if part.fields[f].shape != fields[f].shape
        }
        for part in parts
    ]
    return fields, pads, tuple(sorted(padded))
