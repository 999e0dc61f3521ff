"""zarr's ``ObjectStore`` over obstore, with its reads through a :class:`~._cache.NodeCache`.

:class:`CachedObjectStore` is the store ``ZarrSource(url, cache=DIR)`` reads. It is
zarr's own ``ObjectStore`` (so everything above it, the checked codecs, the shard
checks and the missing-chunk checks of :mod:`._read_checks`, reads through it as it
reads the plain store), with ``get`` answered from the cache:

* **chunk objects and byte ranges** (a shard's index by suffix, its inner chunks
  by range) are entries named by the URL, the store's *generation*, the key and
  the range; a hit reads the local file and makes no request. An absent object
  (the store answers 404) is not cached: it is asked again every time, so the
  missing-chunk checks see what the store holds;
* **metadata** (``zarr.json``, ``.zarray``, ``.zgroup``, ``.zattrs``,
  ``.zmetadata``) is fetched again at every open with a conditional request: with
  the cached copy's ``ETag`` (``If-None-Match``) where the server gave one, else
  its ``Last-Modified`` (``If-Modified-Since``); a ``304 Not Modified`` is served
  from the cache. A server that gives neither sends the document again, whole.
* the **generation** is a digest of the validators of the metadata read at open
  (``ETag``, else ``Last-Modified``, else the document's own digest), so a store
  rewritten since (new metadata) files its chunks under new names and the old
  entries age out. A store whose chunks change while its metadata does not (an
  ``array[...] = ...`` on an existing array) is not noticed, nor a rewrite within
  the second of a ``Last-Modified`` without an ``ETag``: give such a store a fresh
  ``cache=`` folder, or clear the old one.

``exists`` answers from the cache where the whole object is cached (a missing-chunk
check makes no request for it), else asks the store; ``getsize`` (asked only after a
shard read fails, :mod:`._checked_codecs`) always asks the store.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import struct
from collections.abc import Callable, Iterable
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype
from zarr.storage import ObjectStore

from .._errors import ConfigError, check_int
from ._cache import NodeCache
from ._cache_trust import CACHE_GROUP_ENV, Trust, cache_trust
from ._remote import OBSTORE_SCHEMES, is_url, store_errors

__all__ = [
    "CACHE_ENV",
    "CACHE_GROUP_ENV",
    "METADATA_KEYS",
    "CachedObjectStore",
    "cache_folder",
    "cached_store",
    "chunk_fetcher",
]

#: The file names that hold zarr metadata (formats 2 and 3).
METADATA_KEYS = frozenset({"zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata"})
_LENGTH = struct.Struct("<H")  # a metadata entry starts with its validator's length


def _digest(*parts: str) -> str:
    return hashlib.blake2b("\0".join(parts).encode(), digest_size=20).hexdigest()


def _range_text(byte_range: ByteRequest | None) -> str:
    if byte_range is None:
        return "all"
    if isinstance(byte_range, RangeByteRequest):
        return f"{byte_range.start}-{byte_range.end}"
    if isinstance(byte_range, OffsetByteRequest):
        return f"{byte_range.offset}-"
    if isinstance(byte_range, SuffixByteRequest):
        return f"-{byte_range.suffix}"
    raise ValueError(f"unexpected byte range {byte_range!r}")


class CachedObjectStore(ObjectStore):
    """zarr's read-only ``ObjectStore`` over obstore's ``store`` for ``url``, its reads
    through ``cache`` (module docs)."""

    def __init__(self, store: Any, *, cache: NodeCache, url: str, read_only: bool = True) -> None:
        super().__init__(store, read_only=read_only)
        self.cache = cache
        self.url = url
        self._validators: dict[str, str] = {}  # metadata key -> its validator, as read
        self._generation: str | None = None  # fixed at the first read of a chunk

    def with_read_only(self, read_only: bool = False) -> CachedObjectStore:
        other = type(self)(self.store, cache=self.cache, url=self.url, read_only=read_only)
        other._validators, other._generation = self._validators, self._generation
        return other

    def close(self) -> None:
        super().close()
        self.cache.close()

    def __str__(self) -> str:
        return f"cached_object_store://{self.store} in {self.cache.root}"

    def entry_name(self, key: str, byte_range: ByteRequest | None) -> str:
        if self._generation is None:
            seen = sorted(self._validators.items())
            self._generation = _digest(*(f"{k}={v}" for k, v in seen))
        return _digest("chunk", self.url, self._generation, key, _range_text(byte_range))

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        if key.rsplit("/", 1)[-1] in METADATA_KEYS and byte_range is None:
            data = await self._get_metadata(key)
        else:
            data = await self.cache.get(
                self.entry_name(key, byte_range), lambda: self._fetch(key, byte_range)
            )
        return None if data is None else prototype.buffer.from_bytes(data)

    async def _fetch(self, key: str, byte_range: ByteRequest | None) -> bytes | None:
        buf = await super().get(key, default_buffer_prototype(), byte_range)
        return None if buf is None else buf.to_bytes()

    async def get_partial_values(
        self,
        prototype: BufferPrototype,
        key_ranges: Iterable[tuple[str, ByteRequest | None]],
    ) -> list[Buffer | None]:
        return list(await asyncio.gather(*(self.get(k, prototype, r) for k, r in key_ranges)))

    async def exists(self, key: str) -> bool:
        if key.rsplit("/", 1)[-1] not in METADATA_KEYS and self.cache.has(
            self.entry_name(key, None)
        ):
            return True
        return await super().exists(key)

    async def _get_metadata(self, key: str) -> bytes | memoryview | None:
        """The metadata document ``key``, revalidated with the server (module docs)."""
        import obstore as obs
        from obstore.exceptions import NotModifiedError

        name = _digest("metadata", self.url, key)
        cached = self.cache.read(name) if self.cache.active else None
        validator, document = _split(cached) if isinstance(cached, memoryview) else ("", None)
        options: dict[str, Any] = {}
        if validator.startswith("etag:"):
            options["if_none_match"] = validator.removeprefix("etag:")
        elif validator.startswith("modified:"):
            options["if_modified_since"] = datetime.fromisoformat(validator[9:])
        try:
            response = await obs.get_async(self.store, key, options=options or None)
            data = bytes(await response.bytes_async())
        except NotModifiedError:
            self._validators[key] = validator
            return document
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None  # what zarr's ObjectStore answers for these
        meta = response.meta
        if meta.get("e_tag"):
            validator = f"etag:{meta['e_tag']}"
        elif meta.get("last_modified") is not None:
            validator = f"modified:{meta['last_modified'].isoformat()}"
        else:
            validator = f"digest:{hashlib.blake2b(data, digest_size=20).hexdigest()}"
        self._validators[key] = validator
        if validator != "" and not validator.startswith("digest:"):
            tag = validator.encode()
            await self.cache.put(name, _LENGTH.pack(len(tag)) + tag + data)
        return data


def _split(entry: memoryview) -> tuple[str, memoryview | None]:
    """``(validator, document)`` of a metadata entry; ``("", None)`` if it is not one."""
    if len(entry) < _LENGTH.size:
        return "", None
    (length,) = _LENGTH.unpack_from(entry)
    end = _LENGTH.size + length
    try:
        return bytes(entry[_LENGTH.size : end]).decode(), entry[end:]
    except UnicodeDecodeError:
        return "", None


# -- the options of ZarrSource(url, cache=..., cache_bytes=...) ---------------------------

#: The environment variable that gives every remote ``ZarrSource`` a cache folder.
CACHE_ENV = "CHUNKSTREAM_CACHE"


def cache_folder(
    path: str, cache: object, cache_bytes: object, cache_group: object = None
) -> tuple[Path, Trust] | None:
    """The cache folder for a source at ``path`` (``cache``, else ``$CHUNKSTREAM_CACHE``
    for a remote URL) and who it trusts (private, or shared with ``cache_group``, else
    ``$CHUNKSTREAM_CACHE_GROUP`` beside ``$CHUNKSTREAM_CACHE``), or ``None``;
    :class:`ConfigError` for values that cannot work."""
    if cache_bytes is not None:
        check_int(
            "cache_bytes",
            cache_bytes,
            1,
            "Pass a positive number of bytes, or None for half the free space of the cache "
            "folder's disk.",
        )
    explicit = cache is not None
    folder = cache if explicit else (os.environ.get(CACHE_ENV) or None)
    if folder is None:
        for name, value in (("cache_bytes", cache_bytes), ("cache_group", cache_group)):
            if value is not None:
                raise ConfigError.bad(
                    name,
                    value,
                    "None when there is no cache",
                    f"Pass cache=DIR (or set {CACHE_ENV}) to cache a remote store on this node.",
                )
        return None
    what = "cache" if explicit else CACHE_ENV
    if not isinstance(folder, (str, os.PathLike)) or not str(folder):
        raise ConfigError.bad(what, folder, "a folder path (str or os.PathLike)")
    scheme = path.split("://", 1)[0].lower() if is_url(path) else ""
    if scheme not in OBSTORE_SCHEMES:
        if not explicit:
            return None  # the environment's cache is for the remote stores it can serve
        where = "local path" if not scheme else f"{scheme}:// URL"
        raise ConfigError.bad(
            "cache",
            folder,
            f"None for the {where} {path!r}",
            "The node-local cache keeps copies of remote stores (s3://, gs://, az://, "
            "http(s)://); a local store is read from its own disk.",
        )
    root = Path(folder).expanduser()
    try:
        is_file = root.exists() and not root.is_dir()
    except OSError:  # unreachable: the cache reads through, with a warning
        is_file = False
    if is_file:
        raise ConfigError.bad(
            what,
            str(folder),
            "a folder",
            f"{str(root)!r} is a file. Pass a folder (created if absent) on a local disk "
            "with room for the cache.",
        )
    return root, cache_trust(cache_group, from_env=not explicit)


def cached_store(
    store: ObjectStore, url: str, root: Path, budget: int | None, wait_s: float, trust: Trust
) -> CachedObjectStore:
    """``store`` (zarr's ``ObjectStore`` for ``url``) reading through the cache in ``root``,
    which trusts ``trust``."""
    cache = NodeCache(root, budget, wait_s=wait_s, trust=trust)
    cache.open(budget)
    return CachedObjectStore(store.store, cache=cache, url=url)


def chunk_fetcher(arr: Any, url: str) -> Callable[[list[str], tuple[int, int]], list]:
    """``fetch(keys, window)`` for ``FastChunkReader``: per chunk key of ``arr`` (over a
    :class:`CachedObjectStore`), its bytes, ``None`` (absent), or for an entry in the
    cache a ``load()`` that reads it in the decoding thread (so hits are read beside
    the decoding, on every pool thread). What is not in the cache is fetched at once,
    together on zarr's loop; a failed request is a ``RemoteStoreError`` naming ``url``
    and the window."""
    from zarr.core.sync import sync

    store, prefix = arr.store, arr.store_path.path
    cache: NodeCache = store.cache
    prototype = default_buffer_prototype()

    def path_of(key: str) -> str:
        return f"{prefix}/{key}" if prefix else key

    def fetched(paths: list[str], window: tuple[int, int]) -> list[memoryview | None]:
        async def get_all() -> list[Buffer | None]:
            return list(await asyncio.gather(*(store.get(p, prototype) for p in paths)))

        with store_errors(url, f"the chunks of timesteps [{window[0]}, {window[1]})"):
            found = sync(get_all())
        return [None if b is None else memoryview(b.as_numpy_array()) for b in found]

    def load(path: str, name: str, window: tuple[int, int]) -> memoryview | None:
        raw = cache.read_hit(name)
        # gone since (evicted), damaged (dropped, with a warning) or busy: ask the store
        return raw if raw is not None else fetched([path], window)[0]

    def fetch(keys: list[str], window: tuple[int, int]) -> list:
        paths = [path_of(k) for k in keys]
        found: list = [None] * len(keys)
        rest = []
        for i, path in enumerate(paths):
            name = store.entry_name(path, None)
            if cache.has(name):
                found[i] = partial(load, path, name, window)
            else:
                rest.append(i)
        if rest:
            for i, raw in zip(rest, fetched([paths[i] for i in rest], window), strict=True):
                found[i] = raw
        return found

    return fetch
