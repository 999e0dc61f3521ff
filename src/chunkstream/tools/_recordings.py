"""Several runs for ``plan``, ``inspect`` and ``bench``: a :class:`~chunkstream.Recordings`
from paths, its layout, and what one pass of a plan draws from each recording.

:func:`open_recordings` opens each path as ``bench`` does (:func:`open_bench_source`:
metadata only, no chunk read) and lays them end to end; :func:`recordings_layout`
is the :class:`DataLayout` ``plan`` sizes; :func:`pass_shares` counts one pass's
pieces and timesteps per recording, the figures a user checks the weights by.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._errors import ConfigError
from .._text import format_table
from ..plans import Plan
from ..sources import Recordings
from ._bench import open_bench_source
from ._layout import DataLayout

__all__ = [
    "RecordingShare",
    "open_recordings",
    "pass_shares",
    "recording_names",
    "recordings_layout",
]

# Random sampling has no passes: its shares are counted over this many chunks.
_RANDOM_CHUNKS = 1000


def recording_names(paths: Sequence[str | os.PathLike]) -> list[str]:
    """A short unique name per path: the store's name, or its run directory's where
    the store is a FlyVis ``timeseries.zarr``; the whole path where those repeat."""
    names = []
    for path in paths:
        p = Path(str(path).rstrip("/"))
        names.append(p.parent.name if p.name == "timeseries.zarr" and p.parent.name else p.name)
    if len(set(names)) != len(names) or not all(names):
        names = [str(p) for p in paths]
    if len(set(names)) != len(names):
        raise ConfigError.bad(
            "PATH", list(map(str, paths)), "distinct stores", "Give each run once."
        )
    return names


def parse_weights(text: Sequence[str] | None, count: int) -> list[float] | None:
    """``--weights`` as numbers, one per run (``None`` when not given)."""
    if text is None:
        return None
    try:
        values = [float(w) for w in text]
    except ValueError:
        raise ConfigError.bad(
            "--weights", list(text), "one number > 0 per run", "E.g. --weights 1 1 2."
        ) from None
    if not all(math.isfinite(w) and w > 0 for w in values):
        raise ConfigError.bad(
            "--weights", list(text), "numbers > 0, one per run", "Leave a run out instead of 0."
        )
    if len(values) != count:
        raise ConfigError.bad(
            "--weights", list(text), f"one number per run ({count} runs)", "Give one for each."
        )
    return values


def open_recordings(
    paths: Sequence[str | os.PathLike],
    fields: Sequence[str] | None = None,
    *,
    flyvis: bool = False,
    column: str | int = "voltage",
    stim_dims: int | None = None,
    weights: Sequence[float] | Mapping[str, float] | None = None,
) -> Recordings:
    """The runs at ``paths`` as one :class:`Recordings` (named by :func:`recording_names`)."""
    names = recording_names(paths)
    sources = [
        open_bench_source(p, fields, flyvis=flyvis, column=column, stim_dims=stim_dims)
        for p in paths
    ]
    return Recordings(sources, weights=weights, names=names)


def recordings_layout(recs: Recordings) -> DataLayout:
    """What ``plan`` needs of several runs: their joint length and fields (padded, with
    masks and the recording id), and the stored time chunk they are aligned to."""
    chunk_bytes = [
        int(np.prod(a.chunks)) * a.dtype.itemsize
        for src in recs.recordings.values()
        if (a := getattr(src, "array", None)) is not None
    ]
    return DataLayout(
        total_timesteps=len(recs),
        fields=dict(recs.fields),
        where=f"{len(recs.names)} recordings ({', '.join(recs.names)})",
        zarr_chunk_bytes=max(chunk_bytes) if chunk_bytes else None,
        time_chunk=recs.time_chunk,
    )


@dataclass(frozen=True)
class RecordingShare:
    """One recording in one pass of a plan: its length, its weight's share, and the
    pieces and timesteps the pass draws from it (``drawn``: their share)."""

    name: str
    timesteps: int
    share: float
    pieces: int
    drawn_timesteps: int
    drawn: float


def pass_shares(plan: Plan, recs: Recordings) -> list[RecordingShare]:
    """Per recording, what one pass of ``plan`` (a loader's plan over ``recs``) draws
    (random sampling: :data:`_RANDOM_CHUNKS` chunks)."""
    n = plan.survey_chunks(_RANDOM_CHUNKS)
    pieces = np.zeros(len(recs.names), dtype=np.int64)
    steps = np.zeros(len(recs.names), dtype=np.int64)
    for chunk in plan.chunks(0, np.arange(n)):
        for p in chunk:
            r = recs.recording_of(p.start)
            pieces[r] += 1
            steps[r] += p.length
    total = max(1, int(steps.sum()))
    return [
        RecordingShare(
            name=name,
            timesteps=recs.lengths[i],
            share=recs.shares[name],
            pieces=int(pieces[i]),
            drawn_timesteps=int(steps[i]),
            drawn=float(steps[i]) / total,
        )
        for i, name in enumerate(recs.names)
    ]


def format_shares(shares: Sequence[RecordingShare], title: str) -> list[str]:
    """The recordings table ``plan`` and ``inspect`` print."""
    rows = [("recording", "timesteps", "weight share", "pieces", "timesteps drawn", "drawn share")]
    for s in shares:
        rows.append(
            (
                s.name,
                str(s.timesteps),
                f"{s.share:.1%}",
                str(s.pieces),
                str(s.drawn_timesteps),
                f"{s.drawn:.1%}",
            )
        )
    return [title, *format_table(rows, align="<>>>>>")]
