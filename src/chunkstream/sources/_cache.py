"""The node-local cache of a remote store's bytes: one folder shared by every process of a node.

:class:`NodeCache` keeps objects (or the byte ranges of them that were read) as the
store holds them, compressed, under ``DIR``, within a byte budget, evicting the
least recently used first. :mod:`._cached_store` puts it under zarr.

Layout of ``DIR``:

* ``entries/<ab>/<name>``: one object or byte range, followed by a trailer that
  binds it to ``<name>`` (:mod:`._cache_entry`). ``<name>`` is a digest of what
  was asked (the store's URL and generation, the key, the byte range);
* ``partial/<name>``: the entry being fetched. Its writer holds an exclusive
  ``flock`` on it from creation until the ``os.replace`` that makes it the entry,
  so the lock is also the fetch lock: a process that finds it held waits for the
  entry instead of fetching the object again;
* ``ledger``: the bytes the entries hold (8 bytes), read and written under an
  exclusive ``flock`` on it, which every insert and every eviction takes (the ledger,
  scans and eviction: :mod:`._cache_room`).

The rules, each held by a test in ``tests/test_cache.py`` (``tests/test_cache_trust.py``
for the first):

* The cache uses ``DIR`` only if nobody but the user (or, shared on purpose, the
  members of one group) may write it and the folders it makes in it
  (:mod:`._cache_trust`); else it reads through, with one ``CacheWarning`` saying why
  and how to fix it. An entry file that is not the user's (or the group's) is dropped,
  never served.

* An entry appears only by renaming a complete file, so no process ever reads a
  half-written one; a writer killed mid-write leaves a ``partial`` file no reader
  opens, which the next fetch of that object takes over, or a sweep (when a cache
  opens, and at each eviction) removes once its lock is free.
* A reader checks the size, the crc32c and the key in the trailer; an entry that
  fails is dropped with a :class:`~chunkstream.CacheWarning` and fetched again. The
  checksum also covers an entry whose bytes never reached the disk before a crash; the
  key, an entry moved or copied under another name.
* A reader holds a shared ``flock`` on the entry while it reads; eviction takes an
  exclusive one without blocking and skips an entry it cannot lock, so it never
  removes an entry another process is reading.
* A hit sets the entry's mtime (where it is older than a second: recency is kept to
  the second): eviction removes the oldest first, down to 90% of
  the budget, before an insert that would pass it, so the entries never hold more
  than the budget (an object larger than the budget is not kept).
* The ledger is counted up before a rename and only corrected by a scan, which
  sets it to the true sum (when a cache opens, and whenever room is needed): a
  process killed between the two leaves it too high, never too low.
* Nothing waits without bound. Waits for a lock or for another process's fetch
  poll, from 1 ms growing to :data:`~chunkstream._executor.POLL_S`, up to a
  deadline; past it the process fetches the object itself, or skips caching it.
* A folder that cannot be written, or a full disk, turns the cache into a
  read-through with one ``CacheWarning``: a read never fails because of the cache.

**Concurrency.** Everything here runs on zarr's event-loop thread (the store calls
it from ``async`` methods): the counters have that one writer. Between processes
the only primitives are the ``flock``\\ s above and ``os.replace``; waits are
``asyncio.sleep`` polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import threading
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from .._errors import CacheWarning
from .._executor import POLL_S
from ._cache_entry import OLD_FORMAT, TRAILER_SIZE, entry_problem, read_all, trailer
from ._cache_room import FIRST_POLL, Room, default_budget, same_file
from ._cache_trust import Trust, open_folder

__all__ = ["CacheCounters", "NodeCache"]

_log = logging.getLogger("chunkstream.sources.cache")
_TOUCH_NS = 1_000_000_000  # a hit moves an entry's mtime when it is older than this
_BUSY = object()  # an entry another process holds exclusively for an instant
_THROUGH = -1  # claim result: the cache cannot write, fetch without it


@dataclass
class CacheCounters:
    """What one process's cache did: objects served from DIR (``hits``) and fetched
    (``misses``), the bytes fetched, and the bytes this process evicted. Added to
    under a lock: zarr's loop thread and the readers' threads (hits read by
    :meth:`NodeCache.read_hit`) count at once."""

    hits: int = 0
    misses: int = 0
    fetched_bytes: int = 0
    evicted_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, hits: int = 0, misses: int = 0, fetched: int = 0, evicted: int = 0) -> None:
        with self._lock:
            self.hits += hits
            self.misses += misses
            self.fetched_bytes += fetched
            self.evicted_bytes += evicted

    def as_dict(self) -> dict[str, int]:
        now = self.snapshot()
        return {n: getattr(now, n) for n in ("hits", "misses", "fetched_bytes", "evicted_bytes")}

    def snapshot(self) -> CacheCounters:
        with self._lock:
            return CacheCounters(self.hits, self.misses, self.fetched_bytes, self.evicted_bytes)


class NodeCache:
    """The cache in folder ``root`` (module docs), budget ``budget`` bytes (``None``:
    :func:`default_budget`). ``wait_s``: how long to wait for another process's fetch
    of an object before fetching it too. ``trust``: who may write the folder (default:
    this user alone). ``counters`` counts this process's work; ``warnings`` holds the
    text of every ``CacheWarning`` it gave (a tool reports them)."""

    def __init__(
        self, root: Path, budget: int | None, *, wait_s: float = 60.0, trust: Trust | None = None
    ) -> None:
        self.root = root
        self.wait_s = wait_s
        self.trust = trust or Trust(os.geteuid())
        self.counters = CacheCounters()
        self.warnings: list[str] = []
        self.active = True  # False: read-through (DIR untrusted or unwritable, or disk full)
        self._old_seen = False  # an entry of the format without a key was dropped
        self._entries, self._partial = root / "entries", root / "partial"
        self._entries_text = str(self._entries)
        self._folders: set[str] = set()  # entries/<ab> folders known to exist
        self._writing: set[asyncio.Task] = set()  # entries being stored (see _fill)
        self._room = Room(-1, self._entries, self._partial)
        self.budget = budget or 1
        try:
            problem, self._room.fd, self._folders = open_folder(self.trust, root)
        except OSError as exc:
            self._through(exc)
        else:
            if problem is not None:
                self._distrust(problem)

    def open(self, budget: int | None) -> None:
        """Sweep dead writers' files, count the entries, and evict down to the budget
        (``None``: :func:`default_budget`); a coroutine's work, so run on zarr's loop."""
        from zarr.core.sync import sync

        if self.active:
            sync(self._open(budget))

    async def _open(self, budget: int | None) -> None:
        room = self._room
        if not await room.lock(time.monotonic() + self.wait_s):
            self.budget = budget or default_budget(self.root, room.total())
            return
        try:
            found = room.scan()
            self.budget = budget or default_budget(self.root, sum(s for _, s, _ in found))
            held = sum(size for _, size, _ in found)
            if held > self.budget:  # a smaller budget than the last process's
                held, removed = room.evict(found, self.budget, 0)
                self.counters.add(evicted=removed)
            room.set_total(held)
        finally:
            room.unlock()

    def close(self) -> None:
        """Wait for the entries being stored (up to ``wait_s``), then close the ledger."""
        if self._writing:
            from zarr.core.sync import SyncError, sync

            async def drain() -> None:  # on the loop: the set is the loop's
                await asyncio.gather(*list(self._writing), return_exceptions=True)

            try:
                sync(drain(), timeout=self.wait_s)
            # a stuck write, a close on zarr's loop thread (a finalizer) or after the loop
            # stopped: the writes left are lost, their partial files swept later
            except (TimeoutError, RuntimeError, SyncError) as exc:
                _log.warning("chunkstream cache: entries still being written at close: %s", exc)
        if self._room.fd >= 0:
            os.close(self._room.fd)
            self._room.fd = -1

    def __repr__(self) -> str:
        return f"NodeCache({str(self.root)!r}, budget={self.budget})"

    # -- reads ----------------------------------------------------------------------

    def entry_path(self, name: str) -> str:
        # a string, not a Path: this is on every hit's path, and pathlib costs more
        return f"{self._entries_text}/{name[:2]}/{name}"

    def has(self, name: str) -> bool:
        """Whether an entry ``name`` exists now (not read, not checked)."""
        return self.active and os.path.exists(self.entry_path(name))

    async def get(
        self, name: str, fetch: Callable[[], Awaitable[bytes | None]]
    ) -> bytes | memoryview | None:
        """The bytes of entry ``name``, from DIR or, once, from ``fetch()`` (``None``:
        the store has no such object, which is not cached)."""
        deadline = time.monotonic() + self.wait_s
        delay = FIRST_POLL
        while self.active:
            data = self.read(name)
            if isinstance(data, memoryview):
                self.counters.add(hits=1)
                return data
            claim = None if data is _BUSY else self._claim(name)
            if claim == _THROUGH:
                break
            if claim is not None:
                return await self._fill(claim, name, fetch)
            if time.monotonic() >= deadline:
                _log.info("chunkstream: waited %.0f s for entry %s; fetching it", self.wait_s, name)
                break
            await asyncio.sleep(delay)
            delay = min(2 * delay, POLL_S)
        return await self._fetch(fetch)

    def read_hit(self, name: str) -> memoryview | None:
        """Entry ``name``'s checked bytes, counted as a hit, or ``None`` (absent, damaged or
        busy: ask :meth:`get`). Safe from any thread: a reader reads its window's hits
        itself, beside the others, not one by one on zarr's loop."""
        if not self.active:
            return None
        data = self.read(name)
        if not isinstance(data, memoryview):
            return None
        self.counters.add(hits=1)
        return data

    def read(self, name: str) -> memoryview | object | None:
        """Entry ``name``'s bytes, checked; ``None`` if absent or dropped as damaged;
        ``_BUSY`` for an instant while its writer or an evictor holds it."""
        path = self.entry_path(name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return _BUSY
            st = os.fstat(fd)
            problem = self.trust.owner_problem(st)
            raw = read_all(fd, st.st_size) if problem is None else b""
            problem = problem or entry_problem(raw, name)
            if problem is not None:
                self._dropped(path, problem)
                if same_file(fd, path):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)  # the ledger stays high until the next scan: safe
                return None
            if time.time_ns() - st.st_mtime_ns > _TOUCH_NS:
                with contextlib.suppress(OSError):
                    os.utime(fd)  # recency for eviction, to the second
            return memoryview(raw)[: len(raw) - TRAILER_SIZE]
        finally:
            os.close(fd)

    async def put(self, name: str, data: bytes) -> None:
        """Store ``data`` as entry ``name`` unless another process is writing it now."""
        if self.active:
            claim = self._claim(name)
            if claim is not None and claim != _THROUGH:
                try:
                    await self._commit(claim, name, data)
                finally:
                    self._release(claim, name)

    # -- fetching and writing -------------------------------------------------------

    async def _fetch(self, fetch: Callable[[], Awaitable[bytes | None]]) -> bytes | None:
        data = await fetch()
        self.counters.add(misses=1, fetched=0 if data is None else len(data))
        return data

    async def _fill(
        self, claim: int, name: str, fetch: Callable[[], Awaitable[bytes | None]]
    ) -> bytes | memoryview | None:
        """Fetch entry ``name`` holding its claim; the bytes go to the caller at once and
        are stored by a task on the loop (holding the claim until they are in place), so
        the caller decodes while the entry is written."""
        handed = False
        try:
            data = self.read(name)  # written by another process since ours looked
            if isinstance(data, memoryview):
                self.counters.add(hits=1)
                return data
            data = await self._fetch(fetch)
            if data is not None:
                task = asyncio.get_running_loop().create_task(self._store(claim, name, data))
                self._writing.add(task)  # the loop keeps only a weak reference
                task.add_done_callback(self._writing.discard)
                handed = True
            return data
        finally:
            if not handed:
                self._release(claim, name)

    async def _store(self, claim: int, name: str, data: bytes) -> None:
        try:
            await self._commit(claim, name, data)
        finally:
            self._release(claim, name)

    def _claim(self, name: str) -> int | None:
        """The locked ``partial`` file of ``name`` (this process will fetch it); ``None``
        if another process holds it; ``_THROUGH`` if the cache cannot write."""
        path = self._partial / name
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW
        for _ in range(3):  # the file may be renamed or swept between open and lock
            try:
                fd = os.open(path, flags, self.trust.file_mode)
            except OSError as exc:
                self._through(exc)
                return _THROUGH
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            if same_file(fd, path):
                self.trust.own(fd)
                return fd
            os.close(fd)
        return None

    def _release(self, claim: int, name: str) -> None:
        """Drop a claim: its ``partial`` file goes unless it became the entry."""
        path = self._partial / name
        if same_file(claim, path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        os.close(claim)

    async def _commit(self, claim: int, name: str, data: bytes) -> None:
        """Write ``data`` into the claimed file and rename it into place, within the budget."""
        seal = trailer(name, data)
        size = len(data) + len(seal)
        if size > self.budget:
            return
        try:
            os.ftruncate(claim, 0)
            written = os.pwritev(claim, [data, seal], 0)
            if written != size:
                raise OSError(errno.ENOSPC, f"wrote {written} of {size} bytes")
        except OSError as exc:
            self._through(exc)
            return
        room = self._room
        if not await room.lock(time.monotonic() + self.wait_s):
            return  # a stuck process holds the ledger: this object goes uncached
        try:
            total = room.total()
            if total + size > self.budget:
                total, removed = room.evict(room.scan(), self.budget, size)
                self.counters.add(evicted=removed)
                if total + size > self.budget:  # every old entry is being read
                    room.set_total(total)
                    return
            room.set_total(total + size)  # before the rename: a kill leaves it high
            target = self.entry_path(name)
            folder = os.path.dirname(target)
            if folder not in self._folders:
                self.trust.make_folder(folder)  # made by a trusted process if it exists
                self._folders.add(folder)
            os.replace(self._partial / name, target)
        except OSError as exc:
            self._through(exc)
        finally:
            room.unlock()

    def _through(self, exc: OSError) -> None:
        """Turn the cache into a read-through, with one warning."""
        if self.active:
            why = "the disk is full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else str(exc)
            self._off(
                f"chunkstream cache {str(self.root)!r} cannot write ({why}); this source "
                "reads straight from the store from now on. Free space, or pass another "
                "cache= folder."
            )

    def _distrust(self, problem: str) -> None:
        """Read through a folder others may write, with one warning saying how to fix it."""
        self._off(
            f"chunkstream cache {str(self.root)!r} is not trusted: {problem}. Whoever may "
            "write a cache folder can change what this run reads, so this source reads "
            f"straight from the store. {self.trust.fix(self.root)}"
        )

    def _off(self, message: str) -> None:
        self.active = False
        self._warn(message, stacklevel=5)

    def _dropped(self, path: str, problem: str) -> None:
        """Warn of an entry dropped as ``problem`` (entries of the format without a key:
        once per cache, as a cache written by an older version holds many)."""
        if problem == OLD_FORMAT:
            if self._old_seen:
                return
            self._old_seen = True
            message = (
                f"chunkstream cache {str(self.root)!r}: entry {path} {problem}; its entries "
                "of that format are dropped and fetched again as they are read."
            )
        else:
            message = (
                f"chunkstream cache: entry {path} {problem}; dropped and fetched again "
                "(a damaged disk, or a file changed outside chunkstream)."
            )
        self._warn(message, stacklevel=4)

    def _warn(self, message: str, stacklevel: int) -> None:
        self.warnings.append(message)
        warnings.warn(message, CacheWarning, stacklevel=stacklevel)
