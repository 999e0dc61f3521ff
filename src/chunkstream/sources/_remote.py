"""Remote zarr stores (``http(s)://``, ``s3://``, ``gs://``, ... or any zarr ``Store``):
latency-tuned, every request under a timeout, transient failures retried with backoff.

:func:`open_remote_store` builds zarr's fsspec store for a URL (or takes a store
you built, e.g. ``zarr.storage.ObjectStore`` over obstore) and wraps it in a
:class:`RetryingStore`. Every request the store makes (``get``, partial gets,
``exists``, listings) then:

* runs under ``asyncio.wait_for(..., options.timeout)``, so a stalled server
  cannot hang a reader; the backend's own socket timeouts are set to the same
  value where the backend has them (aiohttp for HTTP, botocore for S3, gcsfs);
* is retried up to ``options.retries`` times after a *transient* failure
  (a timeout, a reset or dropped connection, HTTP 5xx, 408 or 429), waiting
  ``backoff * 2**attempt`` seconds (capped at ``max_backoff``, with jitter so
  many ranks do not retry in step). Missing keys (404), permission errors and
  bad data are not retried;
* after the last retry raises :class:`RemoteStoreError` naming the URL, the
  number of attempts and the last error. Inside a :class:`ChunkLoader` it
  arrives wrapped in ``ChunkLoadError`` naming the window and field; being a
  ``ChunkstreamError`` it is not retried again by the loader.

Latency: a window needs many zarr chunks, and zarr fetches them concurrently up
to its ``async.concurrency`` setting (10 by default). Opening a remote store
raises that process-wide setting to ``options.concurrency`` (64 by default)
when it is lower, and sizes the S3 connection pool to match, so a window's
chunk requests are in flight together instead of ten at a time.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from zarr.storage import WrapperStore

from .._errors import ChunkstreamError, ConfigError, RemoteStoreError

__all__ = [
    "RemoteOptions",
    "RemoteStoreError",
    "RetryingStore",
    "ThroughputReport",
    "compare_throughput",
    "is_transient",
    "open_remote_store",
]

_log = logging.getLogger("chunkstream.sources.remote")
_R = TypeVar("_R")
#: The ``storage_options`` key that carries :class:`RemoteOptions` through ``ZarrSource``.
OPTIONS_KEY = "chunkstream"


@dataclass(frozen=True, kw_only=True)
class RemoteOptions:
    """Timeouts, retries and concurrency for a remote store.

    ``timeout``: seconds per request attempt. ``retries``: attempts after the
    first. ``backoff``/``max_backoff``: the first retry delay in seconds, doubled
    per attempt up to the cap. ``concurrency``: chunk requests in flight per read.
    """

    timeout: float = 30.0
    retries: int = 4
    backoff: float = 0.2
    max_backoff: float = 5.0
    concurrency: int = 64

    def __post_init__(self) -> None:
        for name in ("timeout", "backoff", "max_backoff"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError.bad(name, value, "a positive number of seconds")
        for name, low in (("retries", 0), ("concurrency", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError.bad(name, value, f"an int >= {low}")


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is worth retrying: timeouts, dropped connections, HTTP 5xx/408/429."""
    if isinstance(exc, ChunkstreamError):
        return False
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    status = _status(exc)
    if status is not None:
        return status >= 500 or status in (408, 429)
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    try:
        import aiohttp
    except ImportError:  # only the HTTP backend needs it
        aiohttp = None
    if aiohttp is not None and isinstance(exc, aiohttp.ClientError):
        return True  # connection refused/reset, server disconnected, truncated payload
    if type(exc).__module__.split(".")[0] in ("botocore", "aiobotocore", "urllib3"):
        name = type(exc).__name__
        return any(word in name for word in ("Timeout", "Connection", "Endpoint", "Read"))
    # s3fs and gcsfs turn unknown service errors into plain OSError (EIO).
    return isinstance(exc, OSError)


def _status(exc: BaseException) -> int | None:
    """The HTTP status of an aiohttp, botocore or requests-style error, if it has one."""
    for attr in ("status", "status_code", "code"):
        value = getattr(exc, attr, None)
        if isinstance(value, int) and 100 <= value < 600:
            return value
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):  # botocore ClientError
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(status, int):
            return status
    return None


class RetryingStore(WrapperStore):
    """A zarr ``Store`` wrapper: every request under a timeout, transient failures retried.

    ``url`` names the store in error messages. Thread-safe as the wrapped store
    is (zarr runs all requests on its own event loop). ``owns_filesystem``: the
    wrapped store's fsspec filesystem was made for this store alone (as
    :func:`open_remote_store` does for a URL), so :meth:`close` also closes its
    HTTP session; a filesystem shared with others is left open.
    """

    def __init__(
        self,
        store: Any,
        *,
        url: str,
        options: RemoteOptions | None = None,
        owns_filesystem: bool = False,
    ) -> None:
        super().__init__(store)
        self.url = url.rstrip("/")
        self.options = options or RemoteOptions()
        self.owns_filesystem = owns_filesystem

    def _with_store(self, store: Any) -> RetryingStore:
        # A derived store (e.g. read-only) shares the filesystem: closing it must not close that.
        return type(self)(store, url=self.url, options=self.options)

    def close(self) -> None:
        """Close the wrapped store and, when owned, its filesystem's sessions; idempotent.

        Closing the session here, on zarr's event loop, is what keeps aiohttp from
        warning about an unclosed client session when the process exits.
        """
        super().close()
        fs = getattr(self._store, "fs", None)
        if self.owns_filesystem and fs is not None:
            self.owns_filesystem = False
            _close_filesystem(fs, self.options.timeout)

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"RetryingStore({self.url!r}, {self.options})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RetryingStore) and other._store == self._store

    __hash__ = None  # type: ignore[assignment]  # mutable wrapper, like zarr's stores

    async def _retry(self, what: str, call: Callable[[], Awaitable[_R]]) -> _R:
        opts = self.options
        for attempt in range(opts.retries + 1):
            try:
                return await asyncio.wait_for(call(), opts.timeout)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                if attempt == opts.retries:
                    kind = "timed out" if isinstance(exc, TimeoutError) else "failed"
                    raise RemoteStoreError(
                        f"request for {self.url}/{what} {kind} {attempt + 1} times "
                        f"(timeout {opts.timeout:g} s each; last error {type(exc).__name__}: "
                        f"{exc}). Check the server and network, or raise retries/timeout "
                        f"with storage_options={{{OPTIONS_KEY!r}: RemoteOptions(...)}}."
                    ) from exc
                delay = min(opts.max_backoff, opts.backoff * 2**attempt)
                delay *= 0.5 + random.random() / 2
                _log.warning(
                    "chunkstream: %s/%s: %s: %s; retry %d/%d in %.2f s",
                    self.url, what, type(exc).__name__, exc, attempt + 1, opts.retries, delay,
                )  # fmt: skip
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # the loop returns or raises

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        return await self._retry(key, lambda: self._store.get(key, prototype, byte_range))

    async def get_partial_values(
        self, prototype: Any, key_ranges: Iterable[tuple[str, Any]]
    ) -> list[Any]:
        key_ranges = list(key_ranges)
        what = key_ranges[0][0] if len(key_ranges) == 1 else f"{{{len(key_ranges)} ranges}}"
        return await self._retry(
            what, lambda: self._store.get_partial_values(prototype, key_ranges)
        )

    async def exists(self, key: str) -> bool:
        return await self._retry(key, lambda: self._store.exists(key))

    async def _collect(self, what: str, listing: Callable[[], AsyncIterator[str]]) -> list[str]:
        async def collect() -> list[str]:
            return [key async for key in listing()]

        return await self._retry(what, collect)

    async def list(self) -> AsyncIterator[str]:
        for key in await self._collect("(list)", self._store.list):
            yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        for key in await self._collect(prefix, lambda: self._store.list_prefix(prefix)):
            yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        for key in await self._collect(prefix, lambda: self._store.list_dir(prefix)):
            yield key


def _close_filesystem(fs: Any, timeout: float) -> None:
    """Close the aiohttp session (http, gcsfs) or botocore client (s3fs) of an async fsspec
    filesystem on zarr's event loop; the next request on ``fs`` would open a new one."""
    from zarr.core.sync import sync

    async def close() -> None:
        # Private attributes of the backends: fsspec offers no public async close.
        session = getattr(fs, "_session", None)
        if session is not None and not getattr(session, "closed", True):
            await session.close()
        creator = getattr(fs, "_s3creator", None)
        if creator is not None:
            await creator.__aexit__(None, None, None)
            fs._s3, fs._s3creator = None, None

    try:
        sync(close(), timeout=timeout)
    except (OSError, RuntimeError, TimeoutError) as exc:  # a dead loop or network at exit
        _log.debug("chunkstream: closing the session of %r failed: %s", fs, exc)


def _backend_options(scheme: str, given: Mapping[str, Any], opts: RemoteOptions) -> dict:
    """fsspec options with timeouts (and pool sizes) set where the user did not set them."""
    out = dict(given)
    # A filesystem of this store's own (not fsspec's shared instance), so closing the
    # store can close its session without breaking another store's requests.
    out.setdefault("skip_instance_cache", True)
    if scheme in ("http", "https"):
        import aiohttp

        client = dict(out.get("client_kwargs") or {})
        client.setdefault(
            "timeout", aiohttp.ClientTimeout(sock_connect=opts.timeout, sock_read=opts.timeout)
        )
        out["client_kwargs"] = client
    elif scheme in ("s3", "s3a"):
        config = dict(out.get("config_kwargs") or {})
        config.setdefault("connect_timeout", opts.timeout)
        config.setdefault("read_timeout", opts.timeout)
        config.setdefault("max_pool_connections", opts.concurrency)
        # botocore's own retries would multiply ours; the bounds are ours alone.
        config.setdefault("retries", {"max_attempts": 1, "mode": "standard"})
        out["config_kwargs"] = config
    elif scheme in ("gs", "gcs"):
        out.setdefault("requests_timeout", opts.timeout)
    return out


def _raise_concurrency(concurrency: int) -> None:
    import zarr

    current = zarr.config.get("async.concurrency")
    if current is None or current < concurrency:
        zarr.config.set({"async.concurrency": concurrency})
        _log.info("chunkstream: zarr async.concurrency %s -> %d", current, concurrency)


def open_remote_store(
    url_or_store: str | Any,
    storage_options: Mapping[str, Any] | None = None,
    *,
    options: RemoteOptions | None = None,
    url: str | None = None,
) -> RetryingStore:
    """A read-only :class:`RetryingStore` for ``url_or_store``.

    A URL string goes through ``zarr.storage.FsspecStore.from_url`` with
    ``storage_options`` (credentials, endpoint, ...); the options may also hold
    :class:`RemoteOptions` under the key ``"chunkstream"``. The fsspec filesystem
    is the store's own (``skip_instance_cache=True`` unless given), so closing the
    store closes its session. A zarr ``Store``
    (for instance ``zarr.storage.ObjectStore`` over obstore) is wrapped as it is;
    ``url`` then names it in errors.
    """
    given = dict(storage_options or {})
    extra = given.pop(OPTIONS_KEY, None)
    if extra is not None and not isinstance(extra, RemoteOptions):
        raise ConfigError.bad(
            f"storage_options[{OPTIONS_KEY!r}]", extra, "a chunkstream RemoteOptions"
        )
    opts = options or extra or RemoteOptions()
    if isinstance(url_or_store, str):
        from zarr.storage import FsspecStore

        scheme = url_or_store.split("://", 1)[0].lower()
        backend = _backend_options(scheme, given, opts)
        store = FsspecStore.from_url(url_or_store, storage_options=backend, read_only=True)
        name, owned = url_or_store, bool(backend["skip_instance_cache"])
    else:
        store, name, owned = url_or_store, url or str(url_or_store), False
    _raise_concurrency(opts.concurrency)
    return RetryingStore(store, url=name, options=opts, owns_filesystem=owned)


# -- throughput against a local copy (used by the ``bench`` command) -----------------


@dataclass(frozen=True, kw_only=True)
class ThroughputReport:
    """Decoded GB/s of the same windows read from a URL and from a local copy."""

    url: str
    local: str
    windows: int
    nbytes: int
    remote_s: float
    local_s: float

    @property
    def remote_gbps(self) -> float:
        return self.nbytes / self.remote_s / 1e9

    @property
    def local_gbps(self) -> float:
        return self.nbytes / self.local_s / 1e9

    @property
    def ratio(self) -> float:
        """Remote throughput over local (1.0: the network costs nothing)."""
        return self.local_s / self.remote_s

    def to_dict(self) -> dict[str, Any]:
        """The fields and the derived GB/s and ratio, for JSON."""
        out = asdict(self)
        out.update(remote_gbps=self.remote_gbps, local_gbps=self.local_gbps, ratio=self.ratio)
        return out


def compare_throughput(
    url: str,
    local: str | Path,
    *,
    fields: Mapping[str, Any] | None = None,
    array: str | None = None,
    chunk_size: int,
    windows: int = 8,
    workers: int = 4,
    seed: int = 0,
    storage_options: Mapping[str, Any] | None = None,
) -> ThroughputReport:
    """Stream the same ``windows`` shuffled windows through a CPU :class:`ChunkLoader`
    from ``url`` and from ``local`` (a copy of the same array), timing each.

    The local copy is read first, so it runs on a warm page cache only if it
    was read before; run it twice for a cached baseline. Both sources are
    closed before returning.
    """
    from ..pipeline import ChunkLoader
    from ._zarr import ZarrSource

    def run(path: str | Path, options: Mapping[str, Any] | None) -> tuple[float, int]:
        with (
            ZarrSource(path, fields, array=array, storage_options=options) as source,
            ChunkLoader(source, chunk_size, device="cpu", workers=workers, seed=seed) as loader,
        ):
            begin, nbytes = time.perf_counter(), 0
            for chunk in loader.epoch(windows):
                nbytes += sum(t.numel() * t.element_size() for t in chunk.values())
            return time.perf_counter() - begin, nbytes

    local_s, nbytes = run(local, None)
    remote_s, remote_bytes = run(url, storage_options)
    if remote_bytes != nbytes:
        raise ConfigError.bad(
            "local",
            str(local),
            f"a copy of {url!r} (it read {nbytes} bytes, the URL {remote_bytes})",
        )
    return ThroughputReport(
        url=url,
        local=str(local),
        windows=windows,
        nbytes=nbytes,
        remote_s=remote_s,
        local_s=local_s,
    )
