"""The fast zarr reader: chunk files read and decoded on a thread pool, straight into ``out``.

zarr-python decodes a window's chunks on one asyncio loop and copies each into
the output; for a local store with a plain codec chain we can do better: read
each chunk file the window needs, decode it with numcodecs on a shared pool of
``chunkstream-decode-<n>`` threads (numcodecs releases the GIL), and decode
*directly into the caller's buffer* whenever the chunk lies whole inside the
window and covers the field's non-time extent (the destination rows are then
one contiguous block). Other chunks decode into a per-thread scratch buffer and
the needed sub-block is copied out.

Eligible arrays (:func:`fast_decoder` returns ``None`` otherwise): a local
store; zarr v3 with a ``bytes`` codec (either byte order), at most one of
blosc / zstd / gzip and an optional trailing ``crc32c``, no transpose; zarr v3
sharded (``sharding_indexed`` the only codec) with such a chain inside the
shards and an index of ``bytes`` (+ zarr's default ``crc32c``) at either end
(:mod:`._shards`); zarr v2 in either order, with any numcodecs compressor (or
none) and any numcodecs filters, in either byte order. A big-endian chunk is
swapped to native order as it is decoded into ``out``. Every chunk's decoded
size and any checksum is checked, so a truncated file raises
``CorruptChunkError`` instead of leaving stale bytes in ``out``, and any codec's
exception for a bad frame becomes ``CorruptChunkError`` naming the file and
window.

Sharded arrays: the chunks are the inner chunks. Each shard file a window
needs is mapped once per read and its index checked (checksum, bounds); the
inner chunks are then decoded on the pool like chunk files, straight from the
map, into ``out`` where whole. A missing shard file, or an inner chunk its
index marks empty (zarr leaves out inner chunks equal to the fill value unless
``write_empty_chunks=True``), is a missing chunk, as an absent chunk file is.

Why our own reader and not a library's: it stays the default engine while no
library reads every benchmark store within 5% of its speed (the rule and the
figures: BENCHMARKS.md "decode engines", ``python -m benchmarks.run --only
engines``). What it does that they do not: a chunk that several fields need is
decoded once (field-by-field engines decode each interleaved chunk twice), the
chunks of all fields go to one pool together, and whole chunks decode, and
uncompressed files are read, straight into ``out``.

Concurrency: :meth:`FastChunkReader.read_into` may be called from many threads;
each call waits for all of its own decode tasks before returning or raising, so
no pool thread touches ``out`` after the call returns.
"""

from __future__ import annotations

import itertools
import mmap
import os
import struct
import sys
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numcodecs
import numpy as np
import zarr
from numcodecs.compat import ensure_contiguous_ndarray

from .._errors import CorruptChunkError, MissingChunkError
from .._executor import Executor
from .._memory import thread_budget
from ._base import field_context, settle
from ._checked_codecs import blosc_frame_error
from ._select import Selection, chunk_ranges, iter_chunk_coords
from ._shards import Shard, ShardLayout, check_crc32c, corrupt_error, open_shard, shard_layout

__all__ = [
    "ChunkCodec",
    "DecodePool",
    "FastChunkReader",
    "declared_size",
    "decode_pool",
    "fast_decoder",
]

#: How long releasing a decode pool waits for its threads (a read hung on a dead mount
#: never returns: its daemon thread is left to end with the process).
RELEASE_S = 5.0
#: Stored chunks up to this size are read into one reused buffer per decode thread;
#: larger ones are mapped, so what a thread keeps is this buffer (and, where a chunk is
#: decoded aside to copy part of it, one decoded chunk).
READ_BUFFER = 1 << 20

_numbers = itertools.count()  # decode threads of several pools keep distinct names
_numbers_lock = threading.Lock()
_shared_lock = threading.Lock()
_shared: Executor | None = None
_users = 0  # sources holding the shared pool (in this process: see DecodePool._pid)


def _forget_shared() -> None:
    """In a forked child: the parent's decode threads do not exist here, so a fresh pool."""
    global _shared, _shared_lock, _users
    _shared, _shared_lock, _users = None, threading.Lock(), 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_shared)


def _executor(threads: int) -> Executor:
    """A pool of ``threads`` decode threads, numbered after every earlier pool's."""
    with _numbers_lock:
        first = next(_numbers)
        for _ in range(threads - 1):
            next(_numbers)
    return Executor("decode", threads, first=first)


def _close(pool: Executor) -> None:
    """Stop ``pool``'s threads, waiting up to :data:`RELEASE_S`; a thread still inside a
    read is a daemon, left to end with the process, and said in a warning."""
    why = "a read that never returns, e.g. on a dead mount"
    pool.close_within(RELEASE_S, "decode", why, stacklevel=4)


class DecodePool:
    """A source's handle on its decode threads (``pool``, an :class:`~chunkstream._executor.
    Executor` of ``chunkstream-decode-<n>`` daemon threads, started at the first
    :meth:`submit`); :meth:`release` once done.

    ``threads=None``: the process's one decode pool, shared by every source and every
    array of a group, as many threads as the process's thread budget
    (:func:`chunkstream._memory.node_share`: its CPUs over the job's ranks on the node);
    it lives while a source holds it (the last :meth:`release` ends its threads, and a
    source collected unclosed releases it through a finalizer). An int: a pool of that
    many threads for this source alone, stopped by :meth:`release`. Daemon threads, so a
    decode stuck on a read that never returns does not keep the process from exiting;
    started on demand, so a source that never reads (one refused, one only inspected)
    holds none.
    """

    def __init__(self, threads: int | None) -> None:
        global _users
        self._threads = threads
        self._own: Executor | None = None
        self._lock = threading.Lock()
        self._released = False
        self._pid = os.getpid()  # a handle inherited by a forked child counts in its parent
        self.shared = threads is None
        if self.shared:
            with _shared_lock:
                _users += 1

    @property
    def pool(self) -> Executor:
        """The executor, its threads started at the first use."""
        global _shared
        if self.shared:
            with _shared_lock:
                if _shared is None:
                    _shared = _executor(thread_budget())
                return _shared
        with self._lock:
            if self._own is None:
                self._own = _executor(self._threads or 1)
            return self._own

    def submit(self, fn: Callable[[], None], what: str) -> Future:
        """Run ``fn`` on a decode thread; its error travels in the future."""
        return self.pool.submit(fn, what=what)

    def release(self) -> None:
        """Done with the threads: the own pool stopped, the shared one given back (the last
        holder stops it); each waits up to :data:`RELEASE_S` for its threads. Idempotent."""
        global _shared, _users
        if self._released:
            return
        self._released = True
        if not self.shared:
            with self._lock:
                own, self._own = self._own, None
            if own is not None:
                _close(own)
            return
        if self._pid != os.getpid():
            return  # a handle from before a fork: the parent's pool, not this process's
        with _shared_lock:
            _users -= 1
            if _users > 0 or _shared is None:
                return
            pool, _shared = _shared, None
        # No source submits to it any more: its threads end now (a finalizer of a source
        # collected in one of them does not join that thread itself: Executor.close).
        _close(pool)


def decode_pool(threads: int | None) -> DecodePool:
    """The decode threads a reader submits to, named ``chunkstream-decode-<n>``
    (:class:`DecodePool`)."""
    return DecodePool(threads)


@dataclass(frozen=True)
class ChunkCodec:
    """How one stored (inner) chunk decodes to its C-order bytes in native byte order.

    The stored bytes are checked against a trailing crc32c (``checksum``), then
    decompressed by ``compressor`` (``None``: raw), then passed back through the v2
    ``filters`` in reverse; the result is the chunk in ``order`` ("C" or "F"), in
    the other byte order when ``swap``.
    """

    compressor: numcodecs.abc.Codec | None
    filters: tuple[numcodecs.abc.Codec, ...] = ()
    checksum: bool = False
    swap: bool = False
    order: str = "C"

    @property
    def raw(self) -> bool:
        """Whether the stored bytes are the decoded chunk (byte order aside)."""
        return self.compressor is None and not self.filters and not self.checksum

    @property
    def direct(self) -> bool:
        """Whether the compressor's output is the chunk's C-order bytes (swap aside)."""
        return not self.filters and self.order == "C"


def fast_decoder(arr: zarr.Array) -> tuple[ChunkCodec, ShardLayout | None] | None:
    """``(codec, shards)`` if ``arr`` suits the fast path, else ``None``.

    ``codec`` decodes one (inner) chunk; ``shards`` is the shard layout of a sharded
    array, else ``None``. A remote store read through the node-local cache suits it
    when it is not sharded (its chunks come through ``FastChunkReader(fetch=...)``).
    """
    from zarr.storage import LocalStore

    from ._cached_store import CachedObjectStore

    cached = isinstance(arr.store, CachedObjectStore)
    if not isinstance(arr.store, LocalStore) and not cached:
        return None
    if cached and getattr(arr, "shards", None) is not None:
        return None
    dtype = np.dtype(arr.dtype)
    if dtype.hasobject or dtype.itemsize == 0:
        return None
    meta = arr.metadata
    if meta.zarr_format == 2:
        codec = ChunkCodec(
            meta.compressor,
            filters=tuple(meta.filters or ()),
            swap=dtype.itemsize > 1 and not dtype.isnative,
            order=meta.order,
        )
        return codec, None
    codecs = list(meta.codecs)
    layout = None
    if arr.shards is not None:
        sharded = shard_layout(codecs[0], tuple(arr.shards)) if len(codecs) == 1 else None
        if sharded is None:
            return None
        layout, codecs = sharded[0], list(sharded[1])
    codec = _v3_codec(codecs, dtype)
    return None if codec is None else (codec, layout)


def _v3_codec(codecs: list, dtype: np.dtype) -> ChunkCodec | None:
    """The :class:`ChunkCodec` of a v3 chain of ``bytes``, at most one of blosc / zstd /
    gzip and an optional trailing ``crc32c``; ``None`` for any other chain."""
    from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, ZstdCodec

    if not codecs or not isinstance(codecs[0], BytesCodec):
        return None
    endian = codecs[0].endian
    swap = endian is not None and endian.value != sys.byteorder and dtype.itemsize > 1
    rest = codecs[1:]
    checksum = bool(rest) and isinstance(rest[-1], Crc32cCodec)
    if checksum:
        rest = rest[:-1]
    if not rest:
        return ChunkCodec(None, checksum=checksum, swap=swap)
    if len(rest) > 1:
        return None
    # The blosc/zstd/gzip frames carry what decoding needs, so default codecs decode them.
    table = {BloscCodec: numcodecs.Blosc, ZstdCodec: numcodecs.Zstd, GzipCodec: numcodecs.GZip}
    factory = table.get(type(rest[0]))
    return None if factory is None else ChunkCodec(factory(), checksum=checksum, swap=swap)


class FastChunkReader:
    """Reads windows of ``selections`` of a local zarr array (see module docs).

    ``fill_missing``: an absent chunk file is the fill value (zarr's behaviour)
    instead of raising ``MissingChunkError``; so are an absent shard file and an
    inner chunk its shard's index marks empty. ``codec`` and ``shards`` (the
    layout of a sharded array, whose chunks are then its inner chunks) come from
    :func:`fast_decoder`. ``fetch`` (a remote store read through the node-local
    cache): how a window's chunk bytes are fetched, all at once before they are
    decoded, instead of read from files; ``where`` names the store in errors.
    """

    def __init__(
        self,
        arr: zarr.Array,
        codec: ChunkCodec,
        selections: Mapping[str, Selection],
        *,
        fill_missing: bool,
        pool: DecodePool,
        shards: ShardLayout | None = None,
        fetch: Fetch | None = None,
        where: str = "",
    ) -> None:
        self._meta = arr.metadata
        self._layout = shards
        self._fetch = fetch
        self._where = where
        self._root = Path(arr.store.root) / arr.store_path.path if fetch is None else Path()
        self._codec = codec
        self._is_blosc = isinstance(codec.compressor, numcodecs.Blosc)
        self._chunks = tuple(arr.chunks)
        native = np.dtype(arr.dtype).newbyteorder("=")
        self._dtype = native
        #: how a decoded chunk's bytes are viewed: stored byte order and memory order
        self._stored = native.newbyteorder("S") if codec.swap else native
        self._chunk_nbytes = int(np.prod(self._chunks)) * native.itemsize
        self._fill = arr.fill_value if arr.fill_value is not None else 0
        self._selections = dict(selections)
        self._fill_missing = fill_missing
        self._pool = pool
        self._local = threading.local()

    def chunk_path(self, coords: tuple[int, ...]) -> Path:
        """The file holding chunk ``coords`` (shard ``coords``, if sharded)."""
        return self._root / self._meta.encode_chunk_key(coords)

    def read_into(self, start: int, stop: int, out: Mapping[str, np.ndarray]) -> None:
        """Fill ``out[name][: stop - start]`` for every field; thread-safe."""
        tasks = self._plan(start, stop, out)
        if len(tasks) == 1:
            tasks[0]()
            return
        futures = [self._pool.submit(task, f"decode [{start}, {stop})") for task in tasks]
        settle(future.result for future in futures)  # none may write after we return

    def _plan(
        self, start: int, stop: int, out: Mapping[str, np.ndarray]
    ) -> list[Callable[[], None]]:
        """One task per (inner) chunk; a chunk that several fields need is decoded once."""
        uses: dict[tuple[int, ...], list[tuple[str, tuple, tuple, bool]]] = {}
        ct = self._chunks[0]
        for name, sel in self._selections.items():
            for coords in iter_chunk_coords(chunk_ranges(sel, self._chunks, start, stop)):
                o0 = coords[0] * ct
                lo, hi = max(start, o0), min(stop, o0 + ct)
                dest: list[slice] = [slice(lo - start, hi - start)]
                src: list[int | slice] = [slice(lo - o0, hi - o0)]
                whole = o0 >= start and o0 + ct <= stop
                for item, c, chunk in zip(sel.items, coords[1:], self._chunks[1:], strict=True):
                    o = c * chunk
                    if isinstance(item, int):
                        src.append(item - o)
                        whole = whole and chunk == 1
                    else:
                        a, b = max(item.start, o), min(item.stop, o + chunk)
                        dest.append(slice(a - item.start, b - item.start))
                        src.append(slice(a - o, b - o))
                        whole = whole and o == item.start and o + chunk == item.stop
                uses.setdefault(coords, []).append((name, tuple(dest), tuple(src), whole))
        raws = None
        if self._fetch is not None:  # every chunk's bytes, fetched together, then decoded
            coords_list = list(uses)
            keys = [self._meta.encode_chunk_key(c) for c in coords_list]
            raws = dict(zip(coords_list, self._fetch(keys, (start, stop)), strict=True))
        read = _Read((start, stop), self._open_shards(uses, (start, stop)), raws)
        tasks = []
        for coords, targets in uses.items():
            if len(targets) == 1 and targets[0][3] and self._codec.direct:
                name, dest, _, _ = targets[0]
                # the chunk's decoded C-order bytes are exactly these rows of out[name]
                tasks.append(self._direct_task(coords, name, out[name][dest[0]], read))
            else:
                tasks.append(self._copy_task(coords, targets, out, read))
        return tasks

    def _open_shards(
        self, uses: Mapping[tuple[int, ...], object], window: tuple[int, int]
    ) -> dict[tuple[int, ...], Shard | None] | None:
        """Each shard file the window needs, mapped once (``None``: no file); unsharded: None.

        Opened here, before any task runs, so a damaged index is one error and each
        shard is mapped once however many of its inner chunks the tasks decode.
        """
        if self._layout is None:
            return None
        wanted = {self._layout.locate(coords)[0] for coords in uses}
        return {w: open_shard(self.chunk_path(w), self._layout, window) for w in sorted(wanted)}

    def _direct_task(
        self, coords: tuple[int, ...], name: str, view: np.ndarray, read: _Read
    ) -> Callable[[], None]:
        def run() -> None:
            with field_context(name):
                if not self._decode(coords, view.reshape(-1).view(np.uint8), read):
                    view[...] = self._fill
                elif self._codec.swap:
                    view.byteswap(inplace=True)  # decoded as stored: big-endian

        return run

    def _copy_task(
        self, coords: tuple[int, ...], targets: list, out: Mapping[str, np.ndarray], read: _Read
    ) -> Callable[[], None]:
        def run() -> None:
            scratch = self._scratch()
            with field_context(targets[0][0]):
                present = self._decode(coords, scratch, read)
            # the assignment below converts a big-endian block to native order as it copies
            block = scratch.view(self._stored).reshape(self._chunks, order=self._codec.order)
            for name, dest, src, _ in targets:
                view = out[name][dest]
                view[...] = block[src] if present else self._fill

        return run

    @property
    def thread_scratch_nbytes(self) -> int:
        """Host bytes one decode thread keeps for this reader, at most: a stored chunk
        (:meth:`_scratch`) and a read buffer (:data:`READ_BUFFER`)."""
        return self._chunk_nbytes + READ_BUFFER

    def _scratch(self) -> np.ndarray:
        scratch = getattr(self._local, "scratch", None)  # per-thread buffer, reused
        if scratch is None:
            scratch = self._local.scratch = np.empty(self._chunk_nbytes, np.uint8)
        return scratch

    def _raw(self, path: Path, into: np.ndarray | None = None) -> memoryview | None:
        """The file's bytes, or ``None`` if it is absent.

        With ``into`` (a contiguous uint8 array) and a file of exactly its size, the
        bytes are read straight into it (uncompressed chunks: no copy at all); a file
        of up to :data:`READ_BUFFER` bytes is read into a per-thread buffer of that
        size; a larger one is mapped (page cache the kernel can take back, not a
        per-thread copy of the largest chunk that every decode thread would keep).
        """
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            if into is not None and into.flags.c_contiguous and into.nbytes == size:
                view = memoryview(into).cast("B")
            elif size > READ_BUFFER:
                try:
                    return memoryview(mmap.mmap(fd, size, access=mmap.ACCESS_READ))
                except OSError:  # not mappable (a special file): read as below
                    view = memoryview(bytearray(size))
            else:
                buf = getattr(self._local, "raw", None)
                if buf is None:
                    buf = self._local.raw = bytearray(READ_BUFFER)
                view = memoryview(buf)[:size]
            got = 0
            while got < size:
                n = os.preadv(fd, [view[got:]], got)
                if n == 0:
                    break
                got += n
            return view[:got]
        finally:
            os.close(fd)

    def _decode(self, coords: tuple[int, ...], target: np.ndarray, read: _Read) -> bool:
        """Decode chunk ``coords`` into ``target`` (uint8, chunk-sized); False if absent and allowed."""
        if read.raws is not None:
            label = f"zarr chunk {self._meta.encode_chunk_key(coords)!r} of {self._where!r}"
            raw = read.raws[coords]
            if callable(raw):  # an entry of the node-local cache, read here
                raw = raw()
        elif read.shards is None:
            path = self.chunk_path(coords)
            label = f"zarr chunk file {path}"
            raw = self._raw(path, into=target if self._codec.raw else None)
        else:
            where, position = self._layout.locate(coords)
            shard = read.shards[where]
            label = f"inner chunk {position} of zarr shard file {self.chunk_path(where)}"
            raw = None if shard is None else shard.chunk(position)
        if raw is None:
            if self._fill_missing:
                return False
            raise self._missing(coords, read)

        def bad(what: str) -> CorruptChunkError:
            return corrupt_error(label, what, read.window)

        codec, expected = self._codec, self._chunk_nbytes
        if codec.checksum:
            raw = check_crc32c(raw, label, read.window)
        if codec.compressor is None and not codec.filters:
            if len(raw) != expected:
                raise bad(f"holds {len(raw)} bytes, expected {expected}")
            raw_array = np.frombuffer(raw, np.uint8)
            if not np.may_share_memory(raw_array, target):  # read via the scratch buffer
                target[:] = raw_array
            return True
        # the compressor's output is the chunk itself only without filters
        frame_size = expected if not codec.filters else None
        if self._is_blosc:
            what = blosc_frame_error(raw, frame_size)
            if what is not None:
                raise bad(what)
        elif codec.compressor is not None:
            # gzip and zstd decode a frame of the wrong size into ``out`` without error,
            # leaving stale bytes behind it (an empty gzip file decodes to nothing): check
            # the size their frames declare.
            declared = declared_size(codec.compressor, raw)
            if declared == -1 or (None not in (declared, frame_size) and declared != frame_size):
                raise bad(f"decodes to {declared} bytes, expected {frame_size}")
        try:
            if not codec.filters:
                codec.compressor.decode(raw, out=target)
                return True
            chunk = raw if codec.compressor is None else codec.compressor.decode(raw)
            for f in reversed(codec.filters):
                chunk = f.decode(chunk)
            decoded = ensure_contiguous_ndarray(chunk).view(np.uint8).reshape(-1)
        except Exception as exc:  # codecs raise assorted types (RuntimeError, OSError, ...)
            raise bad(f"does not decode ({type(exc).__name__}: {exc})") from exc
        if decoded.nbytes != expected:
            raise bad(f"decodes to {decoded.nbytes} bytes, expected {expected}")
        target[:] = decoded
        return True

    def _missing(self, coords: tuple[int, ...], read: _Read) -> MissingChunkError:
        if read.raws is not None:
            key = self._meta.encode_chunk_key(coords)
            what = f"zarr chunk {key!r} is missing from {self._where!r}"
        elif read.shards is None:
            key = self._meta.encode_chunk_key(coords)
            what = f"zarr chunk {key!r} is missing: no file {self.chunk_path(coords)}"
        else:
            where, position = self._layout.locate(coords)
            key = self._meta.encode_chunk_key(where)
            if read.shards[where] is None:
                what = f"zarr shard {key!r} is missing: no file {self.chunk_path(where)}"
            else:  # zarr skips an inner chunk equal to the fill value unless told otherwise
                what = (
                    f"inner chunk {position} of zarr shard {key!r} is missing: the "
                    "shard's index marks it empty"
                )
        start, stop = read.window
        return MissingChunkError(
            f"{what} (needed for timesteps [{start}, {stop})). zarr would read it as the fill "
            "value and train on it silently. "
            "Rewrite the array (or that chunk) with write_empty_chunks=True (zarr's default "
            "skips chunks equal to the fill value); pass check_missing=False only if absent "
            "chunks are meant to be fill values."
        )


class _Read(NamedTuple):
    """What the tasks of one ``read_into`` share: its window, its mapped shards, and the
    bytes of its chunks where they were fetched (``fetch=``)."""

    window: tuple[int, int]
    shards: dict[tuple[int, ...], Shard | None] | None
    raws: dict[tuple[int, ...], object] | None = None


#: ``fetch(keys, window)``: the stored bytes of each chunk key (``None``: absent), or a
#: ``load()`` that returns them, called by the task that decodes the chunk.
Fetch = Callable[[list[str], tuple[int, int]], list]


def declared_size(codec: numcodecs.abc.Codec, raw: memoryview) -> int | None:
    """The decoded size a gzip or zstd frame declares (``-1``: no valid frame); else ``None``."""
    if isinstance(codec, numcodecs.GZip):
        # RFC 1952: the last 4 bytes are the input size mod 2**32 (chunks are far smaller)
        return struct.unpack("<I", bytes(raw[-4:]))[0] if len(raw) >= 18 else -1
    if isinstance(codec, numcodecs.Zstd):
        # RFC 8878 frame header: magic, descriptor, [window], [dictionary id], [content size]
        if len(raw) < 6 or bytes(raw[:4]) != b"\x28\xb5\x2f\xfd":
            return -1
        descriptor = raw[4]
        single, fcs_flag, did_flag = descriptor >> 5 & 1, descriptor >> 6, descriptor & 3
        at = 5 + (0 if single else 1) + (0, 1, 2, 4)[did_flag]
        width = (1 if single else 0, 2, 4, 8)[fcs_flag]
        if width == 0:
            return None  # size not recorded: the decoder alone decides
        if len(raw) < at + width:
            return -1
        size = int.from_bytes(bytes(raw[at : at + width]), "little")
        return size + 256 if width == 2 else size
    return None
