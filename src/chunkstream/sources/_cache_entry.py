"""The file format of one node-local cache entry (:mod:`._cache`): the bytes, then a
trailer that binds them to what they answer.

The trailer (36 bytes) holds a magic (``CSC2``), the crc32c of the bytes, their
length, and the entry's **key**: the 20-byte digest its name spells in hex (the digest
of the store's URL and generation, the object's key and the byte range, or of a
metadata document's URL and key: :mod:`._cached_store`). A reader checks all four
against the file and the name it opened, so a torn or damaged file, and an entry moved
or copied under another name (by hand, a restore, a copy of another cache), are
dropped and fetched again, never served. An entry of the format before the key was
bound (``CSC1``, 16 bytes) is dropped the same way.

The key is not a secret: anyone who may write the folder can forge a trailer. That is
what the folder's trust check (:mod:`._cache_trust`) is for.
"""

from __future__ import annotations

import os
import struct

import numpy as np

from ._shards import crc32c

__all__ = ["OLD_FORMAT", "TRAILER_SIZE", "entry_problem", "read_all", "trailer"]

_TRAILER = struct.Struct("<4sIQ20s")  # magic, crc32c of the bytes, their length, the key
_MAGIC = b"CSC2"
_OLD = struct.Struct("<4sIQ")  # the format without the key
#: The bytes a trailer adds to an entry.
TRAILER_SIZE = _TRAILER.size
#: What :func:`entry_problem` says of an entry of the format without a key.
OLD_FORMAT = "was written by an older chunkstream, without its key"


def trailer(name: str, data: bytes | memoryview) -> bytes:
    """The trailer that follows ``data`` in entry ``name`` (a hex digest)."""
    return _TRAILER.pack(_MAGIC, crc32c(data), len(data), bytes.fromhex(name))


def entry_problem(raw: bytes, name: str) -> str | None:
    """What is wrong with ``raw``, the bytes of entry file ``name``, or ``None``."""
    new = len(raw) >= _TRAILER.size and raw[len(raw) - _TRAILER.size : -32] == _MAGIC
    if not new and len(raw) >= _OLD.size:
        magic, _crc, length = _OLD.unpack_from(raw, len(raw) - _OLD.size)
        if magic == b"CSC1" and length == len(raw) - _OLD.size:
            return OLD_FORMAT
    if len(raw) < _TRAILER.size:
        return f"holds {len(raw)} bytes, fewer than its trailer"
    magic, crc, length, key = _TRAILER.unpack_from(raw, len(raw) - _TRAILER.size)
    if magic != _MAGIC or length != len(raw) - _TRAILER.size:
        return f"holds {len(raw)} bytes, its trailer says {length} + {_TRAILER.size}"
    if key != bytes.fromhex(name):
        return f"holds the entry {key.hex()}, not {name} (moved or copied under another name)"
    # a read-only array, not a slice: the checksum takes no copy of the bytes
    if crc32c(np.frombuffer(raw, dtype=np.uint8, count=length)) != crc:
        return "fails its crc32c"
    return None


def read_all(fd: int, size: int) -> bytes:
    """The first ``size`` bytes of the file open as ``fd`` (fewer if it is shorter)."""
    raw = os.pread(fd, size, 0)
    while len(raw) < size:  # a read larger than the kernel returns at once
        more = os.pread(fd, size - len(raw), len(raw))
        if not more:
            break
        raw += more
    return raw
