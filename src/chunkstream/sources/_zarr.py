"""``ZarrSource``: named fields of one zarr array (format 2 or 3), local or remote.

The array is opened once, at construction, and validated then: the path exists,
holds zarr, every field's selection is in range, every dtype can become a
tensor. Reads take one of two paths (``engine=`` picks; BENCHMARKS.md "decode
engines" has the race that set the default):

* the **fast path** (:mod:`._fastzarr`, engine ``"chunkstream"``) for local
  stores with a plain codec chain, sharded or not: chunk files decoded on a
  thread pool straight into ``out``; the default wherever the array suits it;
* the **general path** for everything else (remote, other codecs):
  ``zarr.Array.get_basic_selection(..., out=NDBuffer)``, which writes into the
  caller's buffer without an extra copy, decoded by zarr's own pipeline
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
  trusts its header: :mod:`._checked` checks it on zarr's pipeline).
* **Byte order.** Big-endian arrays (v2 ``'>f4'``, v3 ``bytes`` codec with
  ``endian="big"``) arrive in native order.
"""

from __future__ import annotations

import lzma
import math
import os
import warnings
import zlib
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from gzip import BadGzipFile
from pathlib import Path
from typing import Any, Literal

import numpy as np
import zarr

from .._errors import (
    ChunkstreamError,
    ConfigError,
    CorruptChunkError,
    MissingChunkError,
    NotZarrError,
    ReadAmplificationWarning,
    SourceNotFoundError,
)
from ._base import FieldSpec, check_dtype, check_lengths, field_context, window_nbytes
from ._checked import FrameError, with_checked_codecs
from ._fastzarr import FastChunkReader, declared_size, decode_pool, fast_decoder
from ._remote import close_store, open_remote_store, own_store, store_errors
from ._select import (
    Selection,
    chunk_ranges,
    iter_chunk_coords,
    normalize_selection,
    read_amplification,
)
from ._shards import ShardLayout, corrupt_error, is_empty, parse_index, shard_layout
from ._zarrs import with_zarrs_pipeline, zarrs_defect, zstd_frame_bound

__all__ = ["ENGINES", "ZarrSource", "open_zarr_array"]

#: The values of ``ZarrSource(engine=...)``.
ENGINES = ("auto", "chunkstream", "zarrs", "zarr")
#: What codecs raise for a bad frame (bz2 and zarrs: a bare ``OSError``, see _is_decode;
#: zstd: ``MemoryError`` for a damaged size field; blosc: ``SystemError``; zarrs: ``IndexError``)
_DECODE_ERRORS: tuple[type[Exception], ...] = (
    ValueError, RuntimeError, EOFError, OSError, zlib.error, lzma.LZMAError, MemoryError,
    SystemError, IndexError,
)  # fmt: skip

_METADATA_FILES = ("zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata")
_AMPLIFICATION_LIMIT = 1.5
_AMPLIFICATION_WARNED: set[tuple[str, str]] = set()  # (store, field) already warned about


def is_url(path: str) -> bool:
    """True for ``scheme://...`` paths other than ``file://``."""
    return "://" in path and not path.startswith("file://")


def open_zarr_array(
    path: str | Path, array: str | None = None, storage_options: Mapping[str, Any] | None = None
) -> zarr.Array:
    """Open the zarr array at ``path`` (or member ``array`` of the group there), read-only.

    Local paths are checked first so that the errors say what is wrong; URLs go
    through :func:`~chunkstream.sources._remote.open_remote_store` (obstore for
    object stores and HTTP). This is the one place a store is opened, so retries
    and timeouts for remote stores belong here. A URL's store belongs to the
    caller, who closes it with ``_remote.close_store(array.store)``; when opening
    fails it is closed here.
    """
    text = str(path)
    if not is_url(text):
        return _select_array(_open_local(text), array, text)
    store = open_remote_store(text, storage_options)
    try:
        try:
            with store_errors(text, "the zarr metadata"):
                node = zarr.open(store, mode="r")
        except FileNotFoundError as exc:
            raise SourceNotFoundError(
                f"no zarr array or group at {text!r}. Check the URL and credentials "
                "(storage_options)."
            ) from exc
        return _select_array(node, array, text)
    except BaseException:
        close_store(store)
        raise


def _open_local(text: str) -> zarr.Array | zarr.Group:
    """The zarr node at a local path, with errors that say what is wrong."""
    local = Path(text.removeprefix("file://")).expanduser()
    if not local.exists():
        raise SourceNotFoundError(f"path {str(local)!r} does not exist. Check the path.")
    if not any((local / name).exists() for name in ("zarr.json", ".zarray", ".zgroup")):
        raise NotZarrError(
            f"path {str(local)!r} is not a zarr store: it has no zarr.json, .zarray or "
            ".zgroup. Point at the .zarr folder itself, or convert the data to zarr."
        )
    try:
        node = zarr.open(local, mode="r")
    except (ValueError, KeyError, TypeError) as exc:  # unreadable or incomplete metadata
        raise NotZarrError(
            f"the zarr metadata of {str(local)!r} is unreadable "
            f"({type(exc).__name__}: {exc}): zarr.json, .zarray or .zgroup is corrupt or "
            "incomplete. Restore the metadata file or rewrite the array."
        ) from exc
    return node


def _select_array(node: zarr.Array | zarr.Group, array: str | None, text: str) -> zarr.Array:
    """``node`` itself, or its member ``array``; a clear error for a group or a wrong name."""
    if array is not None:
        if not isinstance(node, zarr.Group):
            raise ConfigError.bad("array", array, f"None, since {text!r} is an array, not a group")
        if array not in node or not isinstance(node[array], zarr.Array):
            members = sorted(k for k, v in node.members() if isinstance(v, zarr.Array))
            raise ConfigError.bad("array", array, f"one of the arrays in {text!r}: {members}")
        return node[array]
    if isinstance(node, zarr.Group):
        members = sorted(k for k, v in node.members() if isinstance(v, zarr.Array))
        raise ConfigError.bad(
            "array", None, f"the name of an array, since {text!r} is a zarr group",
            f"Pass array= one of {members}.",
        )  # fmt: skip
    return node


class ZarrSource:
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
    threads zarrs decodes on (default: all cores). Thread-safe for distinct
    ``out``.
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
    ) -> None:
        if check_missing not in (True, False, "auto", "open"):
            raise ConfigError.bad("check_missing", check_missing, '"auto", "open", True or False')
        if not isinstance(engine, str) or engine not in ENGINES:
            raise ConfigError.bad("engine", engine, " or ".join(f'"{e}"' for e in ENGINES))
        if read_threads is not None and (not isinstance(read_threads, int) or read_threads < 1):
            raise ConfigError.bad("read_threads", read_threads, "a positive int or None")
        self._closed = False
        self._pool: ThreadPoolExecutor | None = None
        #: Closes the store opened here from a URL (on close(), collection or exit);
        #: a caller's array's store is the caller's.
        self._close_store: Callable[[], Any] | None = None
        if isinstance(path_or_array, zarr.Array):
            self.array = path_or_array
            self.path = str(path_or_array.store_path)
        else:
            self.array = open_zarr_array(path_or_array, array, storage_options)
            self.path = str(path_or_array) if array is None else f"{path_or_array}/{array}"
            if is_url(str(path_or_array)):
                self._close_store = own_store(self, self.array.store)
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
        # store keys follow the shard grid when sharded (the fast path finds absent inner
        # chunks at read, from the shard's index)
        self._key_grid = tuple(getattr(arr, "shards", None) or arr.chunks)
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
            self._check_all_chunks(local)
        self._fast: FastChunkReader | None = None
        #: zarrs only: the most a zstd frame may declare (see _zarrs.zstd_frame_bound)
        self._zstd_bound = zstd_frame_bound(arr) if engine == "zarrs" else None
        decoder = fast_decoder(arr) if engine in ("auto", "chunkstream") else None
        if engine == "chunkstream" and decoder is None:
            raise ConfigError.bad(
                "engine", engine, '"auto", "zarrs" or "zarr" for this array',
                "chunkstream's reader takes local arrays: zarr v2 with any numcodecs "
                "compressor and filters; zarr v3, sharded or not, with a bytes codec, at most "
                "one of blosc, zstd or gzip and a trailing crc32c, and no transpose.",
            )  # fmt: skip
        if engine == "zarrs":
            if local is None and _is_remote_store(arr.store):
                # zarrs does a remote store's I/O in Rust and reports an HTTP 500 or a 403 as
                # a RuntimeError like a bad frame's: it could not be told from a corrupt chunk
                raise ConfigError.bad(
                    "engine", engine, f'"auto" or "zarr" for the remote array {self.path!r}',
                    'zarrs reads remote stores without chunkstream\'s error mapping (a server '
                    'error would read as a corrupt chunk); use engine="auto".',
                )  # fmt: skip
            defect = zarrs_defect(arr)
            if defect is not None:
                raise ConfigError.bad(
                    "engine", engine, f'"auto" or "zarr" for {self.path!r}',
                    f'{defect}, so it is refused for this array; engine="auto" reads it.',
                )  # fmt: skip
            self.array = with_zarrs_pipeline(arr, read_threads)
        elif decoder is None:
            self.array = with_checked_codecs(arr)
        #: Which engine decodes: "chunkstream", "zarrs" or "zarr".
        self.engine = "chunkstream" if decoder is not None else engine.replace("auto", "zarr")
        self._shards = None
        if decoder is None and (mode is not False or self._zstd_bound is not None):
            self._shards = self._shard_index_layout(check_missing)
        # A local chunk deleted after open reads as the fill value on the general path
        # (the fast path raises itself); a local existence check per read is cheap. So is
        # reading the index of each shard a window needs, to find inner chunks left out.
        # zarrs decodes an uncompressed chunk partially, reading only the bytes a window
        # needs, so a truncated file may go unnoticed: its size is checked instead
        self._raw_nbytes = _raw_file_nbytes(arr) if decoder is None and local is not None else None
        self._check_missing = mode is not False
        self._check_each_read = (
            mode is True
            or self._zstd_bound is not None
            or (
                decoder is None
                and (mode == "open" or self._raw_nbytes is not None)
                and (local is not None or self._shards is not None)
            )
        )
        if decoder is not None:
            self._pool = decode_pool(read_threads)
            self._fast = FastChunkReader(
                arr, decoder[0], self._selections, fill_missing=mode is False, pool=self._pool,
                shards=decoder[1],
            )  # fmt: skip

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """Field name -> per-timestep shape and dtype."""
        return self._fields

    @property
    def uses_fast_path(self) -> bool:
        """Whether reads go through the thread-pool chunk decoder."""
        return self._fast is not None

    def __len__(self) -> int:
        return self._len

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
                if self._check_each_read:
                    self._check_chunks(sel, start, stop)
                index, shape = sel.as_slab(start, stop)
                view = out[name][: stop - start].reshape(shape)  # the same memory
                try:
                    # zarr writes into the wrapped array in place: no intermediate copy
                    with store_errors(self.path, f"timesteps [{start}, {stop}) of field {name!r}"):
                        self.array.get_basic_selection(
                            index, out=nd_buffer.from_numpy_array(view)
                        )
                except FrameError as exc:
                    raise self._corrupt(name, start, stop, str(exc)) from exc
                except ChunkstreamError:
                    raise  # already says what failed (a RemoteStoreError is an OSError too)
                except _DECODE_ERRORS as exc:
                    if not _is_decode(exc):
                        raise
                    what = f"a chunk does not decode ({type(exc).__name__}: {exc})"
                    raise self._corrupt(name, start, stop, what) from exc

    def _corrupt(self, name: str, start: int, stop: int, what: str) -> CorruptChunkError:
        return CorruptChunkError(
            f"a zarr chunk of {self.path!r} needed by field {name!r} for timesteps "
            f"[{start}, {stop}): {what}. A chunk file is truncated or corrupt: rewrite the "
            "array (or restore that file) and retry."
        )

    def close(self) -> None:
        """Stop the decode pool and close a store opened from a URL (with any HTTP
        session); idempotent. A local store, or an array the caller passed, is left
        as it is. A source never closed closes its URL's store when it is collected
        or at interpreter exit."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._close_store is not None:
            self._close_store()

    def __enter__(self) -> ZarrSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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

    def _needed_keys(self, sel: Selection, start: int, stop: int) -> list[str]:
        ranges = chunk_ranges(sel, self._key_grid, start, stop)
        return [self.array.metadata.encode_chunk_key(c) for c in iter_chunk_coords(ranges)]

    def _missing_error(self, name: str, key: str, where: str, what: str = "") -> MissingChunkError:
        what = what or f"zarr chunk {key!r}"
        return MissingChunkError(
            f"{what} of field {name!r} is missing from {where}. zarr would read "
            "it as the fill value and train on it silently. Rewrite the array (or that "
            "chunk) with write_empty_chunks=True (zarr's default skips chunks equal to the "
            "fill value); pass check_missing=False only if absent chunks are meant to be "
            "fill values."
        )

    def _check_all_chunks(self, local: Path | None) -> None:
        """List the store once and raise ``MissingChunkError`` for the first absent chunk."""
        present = _list_local(local) if local is not None else self._list_remote()
        for name, sel in self._selections.items():
            for key in self._needed_keys(sel, 0, self._len):
                if key not in present:
                    raise self._missing_error(name, key, f"{self.path!r}")

    def _list_remote(self) -> set[str]:
        from zarr.core.sync import collect_aiterator

        prefix = self.array.store_path.path
        # collect_aiterator runs the listing on zarr's loop itself (wrapping it in sync() failed)
        with store_errors(self.path, "the list of chunk keys"):
            keys = collect_aiterator(self.array.store.list_prefix(prefix))
        cut = len(prefix) + 1 if prefix else 0
        return {k[cut:] for k in keys}

    def _check_chunks(self, sel: Selection, start: int, stop: int) -> None:
        from zarr.core.sync import sync

        if self._shards is not None:
            self._check_inner_chunks(sel, start, stop)
            return
        store, prefix = self.array.store, self.array.store_path.path
        for key in self._needed_keys(sel, start, stop):
            full = f"{prefix}/{key}" if prefix else key
            # a local file is checked directly, not through zarr's event loop: a round trip
            # per chunk file on every read of the general path adds up
            size = None
            if self._root is not None:
                try:
                    size = os.stat(self._root / key).st_size
                    present = True
                except FileNotFoundError:
                    present = False
                if present and self._zstd_bound is not None:
                    self._check_zstd_frames(self._root / key, [0], (start, stop))
            else:
                with store_errors(self.path, f"whether chunk {key!r} exists"):
                    present = sync(store.exists(full))
            if not present and self._check_missing:
                name = next(n for n, s in self._selections.items() if s is sel)
                raise self._missing_error(name, key, f"{self.path!r}")
            if present and self._raw_nbytes not in (None, size):
                raise corrupt_error(f"zarr chunk file {self._root / key}",
                                    f"holds {size} bytes, expected {self._raw_nbytes}",
                                    (start, stop))  # fmt: skip

    # -- sharded arrays on the general path: the shard index says which inner chunks exist

    def _shard_index_layout(self, check_missing: object) -> ShardLayout | None:
        """The layout of this sharded array's shard index (``None``: not sharded)."""
        arr = self.array
        if getattr(arr, "shards", None) is None:
            return None
        codecs = list(arr.metadata.codecs)
        sharded = shard_layout(codecs[0], tuple(arr.shards)) if len(codecs) == 1 else None
        if sharded is None and check_missing is False:  # only zarrs' zstd check needs it
            raise ConfigError.bad(
                "engine", "zarrs", f'"auto" or "zarr" for {self.path!r}',
                "zarrs aborts the process on a damaged zstd frame claiming a huge size, and "
                "this array's shard index is not one chunkstream reads to check the frames "
                'first; engine="auto" reads it.',
            )  # fmt: skip
        if sharded is None:
            raise ConfigError.bad(
                "check_missing", check_missing, "False for this array",
                "Its shard index is not little-endian bytes (+ crc32c), which chunkstream "
                "reads, so inner chunks left out of a shard could not be told from fill "
                "values. Rewrite the array with zarr's default index codecs, or pass "
                "check_missing=False if absent chunks are meant to be fill values.",
            )  # fmt: skip
        return sharded[0]

    def _check_inner_chunks(self, sel: Selection, start: int, stop: int) -> None:
        """Raise ``MissingChunkError`` for a shard file or inner chunk the window needs
        that is absent (an inner chunk is absent when its shard's index marks it empty)."""
        layout = self._shards
        name = next(n for n, s in self._selections.items() if s is sel)
        positions: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        for coords in iter_chunk_coords(chunk_ranges(sel, self.chunks, start, stop)):
            shard, position = layout.locate(coords)
            positions.setdefault(shard, []).append(position)
        for shard, wanted in positions.items():
            key = self.array.metadata.encode_chunk_key(shard)
            index = self._read_shard_index(key, (start, stop))
            if index is None:
                if not self._check_missing:
                    continue
                raise self._missing_error(name, key, repr(self.path), f"zarr shard {key!r}")
            offsets = []
            for position in wanted:
                if not is_empty(index, position, layout):
                    flat = int(np.ravel_multi_index(position, layout.chunks_per_shard))
                    offsets.append(int(index[flat, 0]))
                elif self._check_missing:
                    what = (f"inner chunk {position} of zarr shard {key!r} (the shard's index "
                            "marks it empty)")  # fmt: skip
                    raise self._missing_error(name, key, repr(self.path), what)
            if self._zstd_bound is not None and self._root is not None:
                self._check_zstd_frames(self._root / key, offsets, (start, stop))

    def _check_zstd_frames(self, path: Path, offsets: list[int], window: tuple[int, int]) -> None:
        """Raise ``CorruptChunkError`` for a zstd frame at ``offsets`` of ``path`` that
        declares more than ``_zstd_bound`` bytes (zarrs would abort allocating them)."""
        import numcodecs

        fd = os.open(path, os.O_RDONLY)
        try:
            for offset in offsets:
                header = os.pread(fd, 18, offset)  # the longest zstd frame header
                declared = declared_size(numcodecs.Zstd(), memoryview(header))
                if declared is not None and declared > self._zstd_bound:
                    raise corrupt_error(
                        f"zarr chunk file {path}" if offset == 0 and self._shards is None
                        else f"the inner chunk at byte {offset} of zarr shard file {path}",
                        f"holds a zstd frame declaring {declared} bytes, more than the "
                        f"chunk's {self._zstd_bound}",
                        window,
                    )  # fmt: skip
        finally:
            os.close(fd)

    def _read_shard_index(self, key: str, window: tuple[int, int]) -> Any:
        """The parsed index of shard ``key`` (``None``: no such shard), read on its own."""
        layout = self._shards
        need = layout.index_nbytes
        label = f"zarr shard {key!r} of {self.path!r}"
        if self._root is not None:
            try:
                fd = os.open(self._root / key, os.O_RDONLY)
            except FileNotFoundError:
                return None
            label = f"zarr shard file {self._root / key}"
            try:
                size = os.fstat(fd).st_size
                if size < need:
                    raise corrupt_error(label, f"holds {size} bytes, fewer than its "
                                        f"{need}-byte index", window)  # fmt: skip
                raw = os.pread(fd, need, 0 if layout.index_at_start else size - need)
            finally:
                os.close(fd)
            return parse_index(raw, layout, label, window)
        from zarr.abc.store import RangeByteRequest, SuffixByteRequest
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.sync import sync

        prefix = self.array.store_path.path
        full = f"{prefix}/{key}" if prefix else key
        request = RangeByteRequest(0, need) if layout.index_at_start else SuffixByteRequest(need)
        with store_errors(self.path, f"the index of shard {key!r}"):
            buf = sync(self.array.store.get(full, default_buffer_prototype(), byte_range=request))
        return None if buf is None else parse_index(buf.to_bytes(), layout, label, window)


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


def _raw_file_nbytes(arr: zarr.Array) -> int | None:
    """The exact size of every chunk file of an unsharded, uncompressed array; else ``None``."""
    from zarr.codecs import BytesCodec, Crc32cCodec, TransposeCodec

    meta = arr.metadata
    nbytes = math.prod(arr.chunks) * np.dtype(arr.dtype).itemsize
    if meta.zarr_format == 2:
        return nbytes if meta.compressor is None and not meta.filters else None
    if getattr(arr, "shards", None) is not None:
        return None
    codecs = list(meta.codecs)
    if not all(isinstance(c, (BytesCodec, Crc32cCodec, TransposeCodec)) for c in codecs):
        return None
    return nbytes + 4 * sum(isinstance(c, Crc32cCodec) for c in codecs)


def _is_remote_store(store: Any) -> bool:
    """Whether zarr's ``store`` reads over the network (fsspec, or obstore's remote stores)."""
    from zarr.storage import FsspecStore, ObjectStore

    if isinstance(store, FsspecStore):
        return True
    inner = type(getattr(store, "store", None)).__name__ if isinstance(store, ObjectStore) else ""
    return inner in ("HTTPStore", "S3Store", "GCSStore", "AzureStore")


def _list_local(root: Path) -> set[str]:
    """Every file under ``root`` as a ``/``-separated key, metadata files excluded."""
    keys: set[str] = set()
    stack = [(str(root), "")]
    while stack:
        folder, prefix = stack.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=True):
                    stack.append((entry.path, f"{prefix}{entry.name}/"))
                elif entry.name not in _METADATA_FILES:
                    keys.add(prefix + entry.name)
    return keys
