"""``ZarrSource``: named fields of one zarr array (format 2 or 3), local or remote.

The array is opened once, at construction, and validated then: the path exists,
holds zarr, every field's selection is in range, every dtype can become a
tensor. Reads take one of two paths (``engine=`` picks; BENCHMARKS.md "decode
engines" has the race that set the default):

* the **fast path** (:mod:`._fastzarr`, engine ``"chunkstream"``) for local
  stores with a plain codec chain, sharded or not: chunk files decoded on a
  thread pool straight into ``out``; the default wherever the array suits it,
  also for an unsharded remote array read through the node-local cache
  (``cache=``, :mod:`._cached_store`), whose chunk bytes are fetched, not read;
* the **general path** for everything else (remote, other codecs):
  zarr's basic selection with ``out=NDBuffer``, which writes into the caller's
  buffer without an extra copy (:func:`._leave.read_selection`: a dropped run leaves
  it, and a failed one leaves no request running), decoded by zarr's own pipeline
  (engine ``"zarr"``) or by the zarrs Rust pipeline (engine ``"zarrs"``,
  :mod:`._zarrs`, opt-in).

One integrity rule holds on every engine (``engine="auto"`` never picks an
engine that would break it, and an explicit engine that would is refused at
open with a ``ConfigError`` saying why):

* **Missing chunks.** zarr reads an absent chunk as the fill value, which would
  train a model on zeros. ``check_missing="auto"`` lists a local store's chunk
  files once at open (``"open"``) and every read raises ``MissingChunkError`` for
  a file that has vanished since; an inner chunk that a shard's index marks empty
  (zarr leaves out inner chunks equal to the fill value unless
  ``write_empty_chunks=True``) is missing too, found from the index at read on
  every engine. Remote stores are not checked unless asked (``True``: each
  window's chunk keys and shard indices are checked at read time; ``False``:
  never).
* **Damaged chunks.** A chunk that is truncated, fails a checksum or does not
  decode raises ``CorruptChunkError`` naming the store (our reader: the file) and
  the window, whatever the codec raised; it is never retried as an I/O error.
  Decoded sizes are checked wherever a codec can return short output (blosc
  trusts its header: :mod:`._checked_codecs` checks it on zarr's pipeline; the
  checks zarr and zarrs lack before each read are :mod:`._read_checks`). A shard
  read on zarr's pipeline, local or remote, is held to its index as our reader
  holds a shard file (:mod:`._checked_codecs`): a damaged remote shard is corrupt,
  not a network error.
* **Byte order.** Big-endian arrays (v2 ``'>f4'``, v3 ``bytes`` codec with
  ``endian="big"``) arrive in native order.

**Threads.** zarr-python runs store operations on one process-wide event loop (threads
``zarr_io``, ``asyncio_<n>``) from first use to exit, by design; a local array is opened
from its metadata file (:func:`._open._local_array`), so the fast path never starts it.
"""

from __future__ import annotations

import lzma
import os
import warnings
import weakref
import zlib
from collections.abc import Callable, Mapping
from gzip import BadGzipFile
from pathlib import Path
from typing import Any, Literal

import numpy as np
import zarr

from .._errors import (
    ChunkstreamError,
    ConfigError,
    CorruptChunkError,
    NotZarrError,
    ReadAmplificationWarning,
    check_int,
)
from .._memory import thread_budget
from ._base import FieldSpec, SourceBase, check_dtype, check_lengths, field_context, window_nbytes
from ._cache import NodeCache
from ._cached_store import CachedObjectStore, chunk_fetcher
from ._checked_codecs import FrameError
from ._engines import ENGINES, choose_engine, read_checks
from ._fastzarr import DecodePool, FastChunkReader, decode_pool
from ._leave import read_selection
from ._open import open_zarr_array
from ._read_checks import ReadChecks, check_all_chunks
from ._remote import (
    is_url,
    own_store,
    store_errors,
)
from ._select import (
    Selection,
    chunk_ranges,
    iter_chunk_coords,
    normalize_selection,
    read_amplification,
)

__all__ = ["ENGINES", "ZarrSource"]

#: What codecs raise for a bad frame (bz2 and zarrs: a bare ``OSError``, see _is_decode;
#: zstd: ``MemoryError`` for a damaged size field; blosc: ``SystemError``).
_DECODE_ERRORS: tuple[type[Exception], ...] = (
    ValueError,
    RuntimeError,
    EOFError,
    OSError,
    zlib.error,
    lzma.LZMAError,
    MemoryError,
    SystemError,
)
#: The zarrs engine's: its Rust codecs also raise ``IndexError`` for a chunk they cannot
#: decode. zarr's own pipeline raises none for a damaged chunk, so there an
#: ``IndexError`` is a bug and propagates as one.
_ZARRS_DECODE_ERRORS = (*_DECODE_ERRORS, IndexError)

_AMPLIFICATION_LIMIT = 1.5
_LOCATE_LIMIT = 64  # chunks of a failed window decoded one by one to name the bad one
_AMPLIFICATION_WARNED: set[tuple[str, str]] = set()  # (store, field) already warned about


class ZarrSource(SourceBase):
    """Named fields of one zarr array; see the module docs.

    ``fields`` maps a name to an index tuple on the non-time axes (ints and
    step-1 slices), e.g. ``{"voltage": (slice(None), 0)}``; ``None`` is one
    field ``"data"``, the whole array. ``engine`` picks who decodes: ``"auto"``
    is chunkstream's reader where the array suits it, else zarr's pipeline;
    ``"chunkstream"`` insists on our reader; ``"zarrs"`` is zarr with the zarrs
    Rust codec pipeline (the ``zarrs`` extra; not for URLs, whose I/O zarrs would do
    outside chunkstream's retries and error mapping); ``"zarr"`` is zarr's default
    pipeline. Every engine keeps the integrity rule of the module docs (an
    engine that cannot is refused with a ``ConfigError`` saying why); the engine
    in use is :attr:`engine`. ``read_threads`` sizes our reader's decode pool, or the
    threads zarrs decodes on (default: the process's thread budget, shared by every
    source: :func:`chunkstream._memory.node_share`). Thread-safe for distinct
    ``out``.

    ``cache``: a folder for the node-local cache of a remote URL's stored bytes
    (:mod:`._cache`; default ``$CHUNKSTREAM_CACHE``), shared by every process on the
    node; ``cache_bytes`` its budget (default: half the free space of its disk). The
    folder is used only if nobody else may write it; ``cache_group`` (a group name or
    id; default ``$CHUNKSTREAM_CACHE_GROUP`` for ``$CHUNKSTREAM_CACHE``) shares it with
    that group's members instead (:mod:`._cache_trust`).
    :attr:`cache` is the cache in use, with its counters, or ``None``.
    """

    def __init__(
        self,
        path_or_array: str | Path | zarr.Array,
        fields: Mapping[str, tuple[int | slice, ...] | int | slice] | None = None,
        *,
        array: str | None = None,
        check_missing: bool | Literal["auto", "open"] = "auto",
        storage_options: Mapping[str, Any] | None = None,
        read_threads: int | None = None,
        engine: Literal["auto", "chunkstream", "zarrs", "zarr"] = "auto",
        cache: str | os.PathLike | None = None,
        cache_bytes: int | None = None,
        cache_group: str | int | None = None,
    ) -> None:
        if check_missing not in (True, False, "auto", "open"):
            raise ConfigError.bad("check_missing", check_missing, '"auto", "open", True or False')
        if not isinstance(engine, str) or engine not in ENGINES:
            raise ConfigError.bad("engine", engine, " or ".join(f'"{e}"' for e in ENGINES))
        if read_threads is not None:
            check_int("read_threads", read_threads, expected="a positive int or None")
        self._closed = False
        self._pool: DecodePool | None = None
        #: Closes the store opened here from a URL (on close(), collection or exit);
        #: a caller's array's store is the caller's.
        self._close_store: Callable[[], Any] | None = None
        if isinstance(path_or_array, zarr.Array):
            given = {"cache": cache, "cache_bytes": cache_bytes, "cache_group": cache_group}
            given = {k: v for k, v in given.items() if v is not None}
            if given:
                raise ConfigError.bad(
                    *next(iter(given.items())),
                    "None for an opened zarr.Array",
                    "Pass the store's URL instead, so the source opens it through the cache.",
                )
            self.array = path_or_array
            self.path = str(path_or_array.store_path)
        else:
            self.array = open_zarr_array(
                path_or_array,
                array,
                storage_options,
                cache=cache,
                cache_bytes=cache_bytes,
                cache_group=cache_group,
            )
            self.path = str(path_or_array) if array is None else f"{path_or_array}/{array}"
            if is_url(str(path_or_array)):
                self._close_store = own_store(self, self.array.store)
        store = self.array.store
        #: The node-local cache the store reads through (its ``counters``), or ``None``.
        self.cache: NodeCache | None = store.cache if isinstance(store, CachedObjectStore) else None
        try:
            self._setup(fields, check_missing, read_threads, engine)
        except BaseException:
            self.close()  # the remote session of a source that failed validation
            raise

    def _setup(
        self,
        fields: Mapping[str, tuple[int | slice, ...] | int | slice] | None,
        check_missing: bool | Literal["auto", "open"],
        read_threads: int | None,
        engine: str,
    ) -> None:
        """Validate the fields and pick the read path (the rest of ``__init__``)."""
        arr = self.array
        if arr.ndim < 1:
            raise NotZarrError(f"zarr array {self.path!r} is 0-d: it has no time axis.")
        self.chunks: tuple[int, ...] = tuple(arr.chunks)
        #: The stored chunk length along time (the inner chunk of a sharded array).
        self.time_chunk = max(1, int(self.chunks[0]))
        where = f"zarr array {self.path!r} (shape {arr.shape})"
        raw_fields = {"data": ()} if fields is None else dict(fields)
        if not raw_fields:
            raise ConfigError.bad("fields", fields, "at least one field, or None")
        dtype = check_dtype(next(iter(raw_fields)), arr.dtype, where)
        self._selections: dict[str, Selection] = {
            name: normalize_selection(name, index, arr.shape, where)
            for name, index in raw_fields.items()
        }
        self._fields = {n: FieldSpec(s.shape, dtype) for n, s in self._selections.items()}
        self._len = check_lengths({n: arr.shape[0] for n in self._fields}, where)
        self.nbytes_per_step = window_nbytes(self._fields, 1)
        self.read_amplification = {
            n: read_amplification(s, arr.shape, self.chunks) for n, s in self._selections.items()
        }
        self._warn_amplification()
        local = self._root = self._local_root()
        mode = check_missing
        if mode == "auto":
            mode = "open" if local is not None else False
        if mode == "open":
            check_all_chunks(arr, self._selections, self._len, self.path, local)
        self._fast: FastChunkReader | None = None
        #: Host bytes the decode threads keep for this source, at most (0 off the fast path).
        self.scratch_nbytes = 0
        self._checks: ReadChecks | None = None
        chosen = choose_engine(arr, engine, self.path, local, read_threads)
        #: Which engine decodes: "chunkstream", "zarrs" or "zarr".
        self.engine, self.array = chosen.name, chosen.array
        self._decode_errors = _ZARRS_DECODE_ERRORS if self.engine == "zarrs" else _DECODE_ERRORS
        if chosen.decoder is None:
            self._checks = read_checks(
                arr,
                self.path,
                local,
                self._selections,
                mode,
                check_missing,
                zarrs=chosen.name == "zarrs",
            )
        else:
            self._pool = decode_pool(read_threads)
            # A source collected unclosed gives its decode threads back as well.
            self._release_pool = weakref.finalize(self, self._pool.release)
            # At exit the threads end with the process: no wait on one hung in a read.
            self._release_pool.atexit = False
            self._fast = FastChunkReader(
                arr,
                chosen.decoder[0],
                self._selections,
                fill_missing=mode is False,
                pool=self._pool,
                shards=chosen.decoder[1],
                # a remote store through the cache: chunk bytes fetched, not read from files
                fetch=None if local is not None else chunk_fetcher(arr, self.path),
                where=self.path,
            )
            threads = read_threads if read_threads is not None else thread_budget()
            self.scratch_nbytes = threads * self._fast.thread_scratch_nbytes

    @property
    def uses_fast_path(self) -> bool:
        """Whether reads go through the thread-pool chunk decoder."""
        return self._fast is not None

    def __repr__(self) -> str:
        names = ", ".join(f"{n}{s.shape}" for n, s in self._fields.items())
        return f"ZarrSource({self.path!r}, T={self._len}, fields=[{names}])"

    def read_into(self, start: int, stop: int, out: Mapping[str, np.ndarray]) -> None:
        """Fill ``out[name][: stop - start]`` with timesteps ``[start, stop)`` of every field."""
        if self._fast is not None:
            self._fast.read_into(start, stop, out)
            return
        from zarr.core.buffer import default_buffer_prototype

        nd_buffer = default_buffer_prototype().nd_buffer
        for name, sel in self._selections.items():
            with field_context(name):
                if self._checks is not None:
                    self._checks.check(name, start, stop)
                index, shape = sel.as_slab(start, stop)
                view = out[name][: stop - start].reshape(shape)  # the same memory
                try:
                    # zarr writes into the wrapped array in place: no intermediate copy
                    with store_errors(self.path, f"timesteps [{start}, {stop}) of field {name!r}"):
                        read_selection(self.array, index, nd_buffer.from_numpy_array(view))
                except FrameError as exc:
                    raise self._corrupt(name, sel, start, stop, str(exc)) from exc
                except ChunkstreamError:
                    raise  # already says what failed (a RemoteStoreError is an OSError too)
                except self._decode_errors as exc:
                    if not _is_decode(exc):
                        raise
                    what = f"a chunk does not decode ({type(exc).__name__}: {exc})"
                    raise self._corrupt(name, sel, start, stop, what) from exc

    def _corrupt(
        self, name: str, sel: Selection, start: int, stop: int, what: str
    ) -> CorruptChunkError:
        """The error for a window that does not decode, naming the chunk where it is found."""
        chunk = self._find_bad_chunk(sel, start, stop)
        return CorruptChunkError(
            f"{chunk or 'a zarr chunk'} of {self.path!r} needed by field {name!r} for "
            f"timesteps [{start}, {stop}): {what}. A chunk file is truncated or corrupt: "
            "rewrite the array (or restore that file) and retry."
        )

    def _find_bad_chunk(self, sel: Selection, start: int, stop: int) -> str | None:
        """Which of the window's chunks fails to decode on its own ("zarr chunk 'c/1/0'"),
        or ``None`` if that cannot be told (too many chunks to try, or each decodes).

        zarr's pipeline says what failed but not which chunk; this runs only after a
        failure, so the extra reads cost nothing on the normal path.
        """
        coords = list(iter_chunk_coords(chunk_ranges(sel, self.chunks, start, stop)))
        if len(coords) > _LOCATE_LIMIT:
            return None
        shards = getattr(self.array, "shards", None)
        shape = self.array.shape
        for chunk in coords:
            # The chunk's region, not get_block_selection: on a sharded array zarr's
            # blocks are whole shards, and a region reads only its inner chunks.
            region = tuple(
                slice(c * n, min((c + 1) * n, size))
                for c, n, size in zip(chunk, self.chunks, shape, strict=True)
            )
            try:
                self.array.get_basic_selection(region)
            except Exception:  # any failure marks the chunk; the caller raises the error
                if shards is None:
                    return f"zarr chunk {self.array.metadata.encode_chunk_key(chunk)!r}"
                per_shard = [s // c for s, c in zip(shards, self.chunks, strict=True)]
                shard = tuple(c // n for c, n in zip(chunk, per_shard, strict=True))
                position = tuple(c % n for c, n in zip(chunk, per_shard, strict=True))
                key = self.array.metadata.encode_chunk_key(shard)
                return f"inner chunk {position} of zarr shard {key!r}"
        return None

    def close(self) -> None:
        """Stop the decode pool and close a store opened from a URL (with any HTTP
        session); idempotent. A local store, or an array the caller passed, is left
        as it is. A source never closed closes its URL's store when it is collected
        or at interpreter exit."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._release_pool()
        if self._close_store is not None:
            self._close_store()

    # -- validation -------------------------------------------------------

    def _warn_amplification(self) -> None:
        # Once per store and field per process: a loop that opens the same store
        # again (compat's create_zarr_loader per loader) is told once, not each time.
        store = self.path if is_url(self.path) else os.path.abspath(self.path)
        for name, factor in self.read_amplification.items():
            if factor > _AMPLIFICATION_LIMIT and (store, name) not in _AMPLIFICATION_WARNED:
                warnings.warn(
                    f"field {name!r} of {self.path!r} decodes {factor:.1f}x the bytes it uses: "
                    f"the zarr chunks {self.chunks} span more of the non-time axes than the "
                    f"field's selection. Rechunk so each field has its own chunks (e.g. "
                    f"`chunkstream convert`, chunks of 1 along the column axis).",
                    ReadAmplificationWarning,
                    stacklevel=3,
                )
                _AMPLIFICATION_WARNED.add((store, name))

    def _local_root(self) -> Path | None:
        from zarr.storage import LocalStore

        store = self.array.store
        if isinstance(store, LocalStore):
            return Path(store.root) / self.array.store_path.path
        return None


def _is_decode(exc: BaseException) -> bool:
    """Whether a codec's exception means a bad frame, not an I/O failure.

    zarrs raises a bare ``OSError`` with no errno for a truncated zstd or gzip frame
    ("incomplete frame", "unexpected end of file") and bz2 and lz4 one for a bad
    stream ("Invalid data stream"); a real I/O error is an ``OSError`` subclass or
    carries an errno (a ``PermissionError`` stays one), and a Rust I/O error inside
    a ``RuntimeError`` names its "(os error N)".
    """
    if isinstance(exc, OSError) and not isinstance(exc, BadGzipFile):
        return type(exc) is OSError and exc.errno is None
    return "(os error " not in str(exc)
