"""Loaders and streams from flat keywords, for tests that vary the common settings and
the options alike (``pieces=4`` beside ``seed=3``): each keyword that is a field of the
options object goes into it, the rest are the constructor's own."""

from __future__ import annotations

from dataclasses import fields

import chunkstream as cs

_LOADER = {f.name for f in fields(cs.LoaderOptions)}
_STREAM = {f.name for f in fields(cs.StreamOptions)}


def _split(keywords: dict, names: set[str]) -> tuple[dict, dict]:
    moved = {k: v for k, v in keywords.items() if k in names}
    return {k: v for k, v in keywords.items() if k not in names}, moved


def loader_from(source, chunk_size=None, **keywords) -> cs.ChunkLoader:
    own, moved = _split(keywords, _LOADER)
    return cs.ChunkLoader(source, chunk_size, **own, options=cs.LoaderOptions(**moved))


def stream_from(loader, **keywords) -> cs.BatchStream:
    own, moved = _split(keywords, _STREAM)
    return cs.BatchStream(loader, **own, options=cs.StreamOptions(**moved))
