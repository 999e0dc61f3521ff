"""``ZarrGroupSource``: fields that live in different arrays of one zarr group.

This is the layout ``chunkstream convert`` writes (one time-chunked array per
field, e.g. ``OUT/voltage`` and ``OUT/stimulus``) and the one that streams
fastest: every byte decoded is a byte used. Each array is opened once as a
:class:`~chunkstream.ZarrSource` with its own fields; a read fills every
field of every array. Thread-safety and the ``read_into`` contract are those of
``ZarrSource``; the arrays must share one time length.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from .._errors import ConfigError, NotZarrError, SourceNotFoundError
from ._base import SourceBase, check_lengths, window_nbytes
from ._cache import CacheCounters, NodeCache
from ._remote import close_store, is_url, open_remote_store, store_errors
from ._zarr import ZarrSource

__all__ = ["ZarrGroupSource"]

Index = tuple[int | slice, ...] | int | slice
FieldRef = str | tuple[str, Index]


class ZarrGroupSource(SourceBase):
    """Named fields from the arrays of the zarr group at ``path``.

    ``fields`` maps a field name to an array name (the whole array) or to
    ``(array_name, index)`` with an index on the non-time axes as in
    ``ZarrSource``; ``None`` makes one field per array, named like it. Other
    keyword arguments (``check_missing``, ``read_threads``, ``storage_options``,
    ``cache``, ``cache_bytes``, ``cache_group``) go to each array's ``ZarrSource``; :attr:`cache` is
    the node-local cache the arrays of a remote group read through (their counters
    summed, so a loader reports the group's hits and misses), or ``None``.
    """

    def __init__(
        self, path: str | Path, fields: Mapping[str, FieldRef] | None = None, **kwargs: Any
    ) -> None:
        self.path = str(path)
        if not is_url(self.path) and not Path(self.path).exists():
            raise SourceNotFoundError(
                f"no zarr group at {self.path!r}: the path does not exist. Check the path, "
                "or write one with `chunkstream convert IN OUT --fields ...`."
            )
        arrays = _array_names(self.path, kwargs.get("storage_options"))
        refs: dict[str, tuple[str, Index]] = {}
        for name, ref in (fields or {a: a for a in arrays}).items():
            array, index = (ref, ()) if isinstance(ref, str) else ref
            if array not in arrays:
                raise ConfigError.bad(
                    f"fields[{name!r}]", ref, f"an array of {self.path!r}: one of {arrays}"
                )
            refs[name] = (array, index)
        if not refs:
            raise ConfigError.bad(
                "fields", fields, f"at least one field; {self.path!r} has no arrays"
            )
        by_array: dict[str, dict[str, Index]] = {}
        for name, (array, index) in refs.items():
            by_array.setdefault(array, {})[name] = index
        self._parts: list[ZarrSource] = []
        try:
            for array, part_fields in by_array.items():
                self._parts.append(ZarrSource(self.path, part_fields, array=array, **kwargs))
            self._len = check_lengths(
                {n: len(p) for p in self._parts for n in p.fields}, f"zarr group {self.path!r}"
            )
        except BaseException:
            self.close()
            raise
        self._fields = {n: s for p in self._parts for n, s in p.fields.items()}
        self._fields = {name: self._fields[name] for name in refs}  # the caller's order
        self.nbytes_per_step = window_nbytes(self._fields, 1)
        self.read_amplification = {
            n: f for p in self._parts for n, f in p.read_amplification.items()
        }
        #: A multiple of every array's stored time chunk: a start on it is on each grid.
        self.time_chunk = math.lcm(*(p.time_chunk for p in self._parts))
        #: Host bytes the arrays' decoders keep, at most.
        self.scratch_nbytes = sum(p.scratch_nbytes for p in self._parts)
        caches = [p.cache for p in self._parts if p.cache is not None]
        self.cache: GroupCache | None = GroupCache(caches) if caches else None

    def read_into(self, start: int, stop: int, out: Mapping[str, np.ndarray]) -> None:
        """Fill ``out[name][: stop - start]`` for every field (each array decodes in parallel)."""
        for part in self._parts:
            part.read_into(start, stop, {name: out[name] for name in part.fields})

    def close(self) -> None:
        """Close every array's source; idempotent."""
        for part in self._parts:
            part.close()

    def __repr__(self) -> str:
        names = ", ".join(f"{n}{s.shape}" for n, s in self._fields.items())
        return f"ZarrGroupSource({self.path!r}, T={self._len}, fields=[{names}])"


class GroupCache:
    """The node-local caches of a group's arrays (one folder) seen as one: ``root``, and
    ``counters`` that read as one :class:`CacheCounters` (every array's summed)."""

    def __init__(self, caches: list[NodeCache]) -> None:
        self.caches = caches
        self.root = caches[0].root

    @property
    def counters(self) -> GroupCache:
        """Itself: :meth:`snapshot` and the four counts answer as a
        :class:`CacheCounters`' do (what ``LatencyStats.watch_cache`` reads)."""
        return self

    def snapshot(self) -> CacheCounters:
        total = CacheCounters()
        for cache in self.caches:
            now = cache.counters.snapshot()
            total.add(now.hits, now.misses, now.fetched_bytes, now.evicted_bytes)
        return total.snapshot()

    @property
    def hits(self) -> int:
        return self.snapshot().hits

    @property
    def misses(self) -> int:
        return self.snapshot().misses

    @property
    def fetched_bytes(self) -> int:
        return self.snapshot().fetched_bytes

    @property
    def evicted_bytes(self) -> int:
        return self.snapshot().evicted_bytes


def _array_names(path: str, storage_options: Mapping[str, Any] | None) -> list[str]:
    """The arrays of the group at ``path`` (a URL goes through the remote store).

    Over plain HTTP there is no listing (obstore's HTTPStore lists with WebDAV), so a
    group there needs consolidated metadata (``zarr.consolidate_metadata``).
    """
    store: Any = path
    if is_url(path):
        store = open_remote_store(path, storage_options)
    try:
        # plain HTTP cannot list: say what fixes it
        what = "the group's member list (over HTTP, write it with zarr.consolidate_metadata)"
        with store_errors(path, what):
            group = zarr.open_group(store, mode="r")
            return sorted(k for k, v in group.members() if isinstance(v, zarr.Array))
    except (FileNotFoundError, ValueError, TypeError) as exc:
        raise NotZarrError(
            f"{path!r} is not a zarr group ({type(exc).__name__}: {exc}); for a "
            "single array use cs.ZarrSource."
        ) from exc
    finally:
        if store is not path:
            close_store(store)  # each array's ZarrSource opens (and closes) its own store
