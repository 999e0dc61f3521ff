"""The room in a node-local cache folder (:mod:`._cache`): what its entries hold, and what
goes when a new entry needs room.

* the **ledger** file holds the bytes the entries hold (8 bytes), read and written only
  under an exclusive ``flock`` on it (:class:`Room` methods are called holding it);
* a **scan** lists every entry with its mtime and size and sets the ledger to their
  true sum; it also sweeps the ``partial`` files of dead writers (nobody holds their
  lock);
* **eviction** removes the least recently used entries first (oldest mtime), down to
  90% of the budget less the incoming entry, skipping any entry a reader holds a shared
  ``flock`` on (:func:`remove_unlocked` takes an exclusive one without blocking).

Waits for a lock poll (:func:`poll_lock`, ``asyncio.sleep`` from 1 ms growing to
:data:`~chunkstream._executor.POLL_S`) up to a deadline: nothing waits without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import struct
import time
from pathlib import Path

from .._executor import POLL_S

__all__ = ["DEFAULT_SHARE", "FIRST_POLL", "Room", "default_budget", "poll_lock", "same_file"]

#: The share of the free space of DIR's file system a cache takes when no budget is given.
DEFAULT_SHARE = 0.5
_LOW_WATER = 0.9  # eviction frees down to this share of the budget, so scans stay rare
#: The first interval of every poll, doubled each time up to POLL_S.
FIRST_POLL = 0.001


def default_budget(root: Path, held: int = 0) -> int:
    """:data:`DEFAULT_SHARE` of the free space of ``root``'s file system, plus what the
    cache there already holds (``held`` bytes)."""
    return max(1, int(DEFAULT_SHARE * (shutil.disk_usage(root).free + held)))


async def poll_lock(fd: int, how: int, deadline: float) -> bool:
    """Take ``flock(fd, how)`` polling until ``deadline`` (monotonic); whether it was taken."""
    delay = FIRST_POLL
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
        await asyncio.sleep(delay)
        delay = min(2 * delay, POLL_S)


def same_file(fd: int, path: str | Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (not removed or replaced)."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def remove_unlocked(path: str | Path) -> bool:
    """Unlink ``path`` if no process holds a lock on it; whether it was removed."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    try:
        if not same_file(fd, path):
            return False
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(fd)


class Room:
    """The ledger (open as ``fd``) and the ``entries``/``partial`` folders of one cache;
    every method but :meth:`lock` is called holding the ledger's lock."""

    def __init__(self, fd: int, entries: Path, partial: Path) -> None:
        self.fd = fd
        self._entries, self._partial = entries, partial

    async def lock(self, deadline: float) -> bool:
        """Take the ledger's lock (polling until ``deadline``); whether it was taken."""
        return await poll_lock(self.fd, fcntl.LOCK_EX, deadline)

    def unlock(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def total(self) -> int:
        raw = os.pread(self.fd, 8, 0)
        return struct.unpack("<Q", raw)[0] if len(raw) == 8 else 0

    def set_total(self, total: int) -> None:
        os.pwrite(self.fd, struct.pack("<Q", max(0, total)), 0)

    def scan(self) -> list[tuple[int, int, str]]:
        """``(mtime_ns, size, path)`` of every entry; removes dead writers' partial files."""
        with os.scandir(self._partial) as partial:
            for item in partial:
                remove_unlocked(item.path)
        found = []
        with os.scandir(self._entries) as folders:
            for folder in folders:
                with os.scandir(folder.path) as entries:
                    for entry in entries:
                        with contextlib.suppress(FileNotFoundError):
                            st = entry.stat()
                            found.append((st.st_mtime_ns, st.st_size, entry.path))
        return found

    def evict(
        self, found: list[tuple[int, int, str]], budget: int, incoming: int
    ) -> tuple[int, int]:
        """Remove the least recently used entries of ``found`` until ``incoming`` more
        bytes fit under the low-water mark of ``budget``: ``(bytes left, bytes removed)``."""
        total = sum(size for _, size, _ in found)
        goal = min(budget - incoming, int(_LOW_WATER * budget) - incoming)
        removed = 0
        for _, size, path in sorted(found):
            if total <= goal:
                break
            if remove_unlocked(path):
                total -= size
                removed += size
        return total, removed
