"""Remote zarr stores: ``s3://``, ``gs://``, ``az://`` and ``http(s)://`` URLs through obstore.

:func:`open_remote_store` builds zarr's ``ObjectStore`` over obstore's store for the
URL (``obstore.store.from_url``), with no wrapper: obstore's Rust client does the
timeouts and retries, which :class:`RemoteOptions` sets as obstore's own
``ClientConfig`` and ``RetryConfig``:

* ``timeout`` bounds every request attempt (``timeout`` and ``connect_timeout``),
  so a stalled server cannot hang a reader;
* after a *transient* failure (a timeout, a reset or dropped connection, HTTP 5xx)
  a request is retried up to ``retries`` times, the waits growing from ``backoff``
  to ``max_backoff`` seconds with jitter; missing keys (404) and permission errors
  are not retried;
* after the last retry obstore raises; :func:`store_errors` turns that into
  :class:`RemoteStoreError` (:class:`RemotePermissionError`, also a ``PermissionError``,
  for HTTP 401/403: denied, or bad credentials) naming what was read (the window and field, or the
  listing), the URL and obstore's account of the attempts. Inside a
  :class:`ChunkLoader` it arrives wrapped in ``ChunkLoadError`` naming the window;
  being a ``ChunkstreamError`` it is not retried again by the loader.

Why obstore and not fsspec's store in a retrying wrapper: BENCHMARKS.md ("remote
stores", ``benchmarks/_remote.py``) runs both against the same servers and faults.

Other schemes fsspec knows (``memory://``, ``hf://``, ...) open as zarr's
``FsspecStore`` with fsspec's own behaviour: no timeouts or retries of ours.

Latency: a window needs many zarr chunks, and zarr fetches them concurrently up
to its ``async.concurrency`` setting (10 by default). Opening a remote store
raises that process-wide setting to ``concurrency`` (64 by default) when it is
lower, so a window's chunk requests are in flight together.

Closing: a store opened here belongs to the source that opened it
(:func:`own_store`), which closes it on ``close()``, when it is collected, or at
interpreter exit, whichever comes first. An fsspec filesystem's HTTP session is
closed then, on zarr's event loop (exit hooks run before zarr stops that loop), so
aiohttp never warns about an unclosed session; obstore holds no Python session.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import zarr.core.sync  # registers zarr's exit hook (stopping its loop) before ours below

from .._errors import ConfigError, RemotePermissionError, RemoteStoreError, check_int

try:
    from obstore.exceptions import BaseError as _ObstoreError
    from obstore.exceptions import PermissionDeniedError, UnauthenticatedError

    _DENIED: tuple[type[BaseException], ...] = (PermissionDeniedError, UnauthenticatedError)
except ImportError:  # the ``remote`` extra is not installed: no obstore errors to map
    _ObstoreError = None
    _DENIED = ()

__all__ = [
    "OBSTORE_SCHEMES",
    "RemoteOptions",
    "RemotePermissionError",
    "RemoteStoreError",
    "close_store",
    "is_url",
    "open_remote_store",
    "own_store",
    "store_errors",
]

_log = logging.getLogger("chunkstream.sources.remote")
#: The ``storage_options`` key that carries :class:`RemoteOptions` through ``ZarrSource``.
OPTIONS_KEY = "chunkstream"
#: URL schemes opened with obstore; any other goes to fsspec.
OBSTORE_SCHEMES = frozenset(
    {"s3", "s3a", "gs", "az", "azure", "abfs", "abfss", "adl", "http", "https"}
)
#: What a store raises for a request that failed for good (nothing when obstore is absent).
STORE_ERRORS: tuple[type[BaseException], ...] = () if _ObstoreError is None else (_ObstoreError,)


def is_url(path: str) -> bool:
    """True for ``scheme://...`` paths other than ``file://``."""
    return "://" in path and not path.startswith("file://")


@dataclass(frozen=True, kw_only=True)
class RemoteOptions:
    """Timeouts, retries and concurrency for a remote store.

    ``timeout``: seconds per request attempt. ``retries``: attempts after the
    first. ``backoff``/``max_backoff``: the first retry delay in seconds, growing
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
            check_int(name, getattr(self, name), low)

    def client_config(self) -> dict[str, Any]:
        """obstore's ``ClientConfig`` for these bounds."""
        return {
            "timeout": timedelta(seconds=self.timeout),
            "connect_timeout": timedelta(seconds=self.timeout),
        }

    def retry_config(self) -> dict[str, Any]:
        """obstore's ``RetryConfig`` for these bounds."""
        # retry_timeout stops further retries once it has passed since the first attempt:
        # room for every attempt and every wait, so ``retries`` is the bound that acts.
        budget = (self.retries + 1) * (self.timeout + self.max_backoff)
        return {
            "max_retries": self.retries,
            "retry_timeout": timedelta(seconds=budget),
            "backoff": {
                "init_backoff": timedelta(seconds=self.backoff),
                "max_backoff": timedelta(seconds=self.max_backoff),
            },
        }


def _first_line(exc: BaseException) -> str:
    # obstore appends a multi-line "Debug source:" dump of its Rust error to the message
    return str(exc).split("\n\nDebug source:", 1)[0].strip()


@contextlib.contextmanager
def store_errors(url: str, what: str) -> Iterator[None]:
    """Turn a store's failed request inside the block into :class:`RemoteStoreError`
    naming ``what`` was read (e.g. a window and field) and ``url``."""
    try:
        yield
    except _DENIED as exc:
        raise RemotePermissionError(
            f"reading {what} from {url!r} was refused: {_first_line(exc)}. Check the "
            "credentials in storage_options (or the environment) and the store's access "
            "policy for this key."
        ) from exc
    except STORE_ERRORS as exc:
        raise RemoteStoreError(
            f"reading {what} from {url!r} failed: {_first_line(exc)}. Check the server, "
            "network and credentials, or raise retries/timeout with "
            f"storage_options={{{OPTIONS_KEY!r}: cs.RemoteOptions(...)}}."
        ) from exc


def _obstore_store(url: str, given: dict[str, Any], opts: RemoteOptions) -> Any:
    try:
        from obstore.store import from_url
        from zarr.storage import ObjectStore
    except ImportError as exc:
        raise ImportError(
            f"opening {url!r} needs obstore: pip install 'chunkstream[remote]'"
        ) from exc
    client = {**opts.client_config(), **(given.pop("client_options", None) or {})}
    retry = {**opts.retry_config(), **(given.pop("retry_config", None) or {})}
    endpoint = str(given.get("endpoint") or given.get("endpoint_url") or "")
    if url.startswith("http://") or endpoint.startswith("http://"):
        client.setdefault("allow_http", True)  # the URL itself asks for plain HTTP
    try:
        store = from_url(url, client_options=client, retry_config=retry, **given)
    except (*STORE_ERRORS, TypeError, ValueError) as exc:
        raise ConfigError.bad(
            "storage_options",
            sorted(given),
            f"obstore's options for {url!r}",
            f"These are obstore's store settings (e.g. for S3: access_key_id, "
            f"secret_access_key, endpoint, region, skip_signature), plus client_options "
            f"and retry_config; obstore said: {_first_line(exc)}",
        ) from exc
    return ObjectStore(store, read_only=True)


def open_remote_store(
    url: str,
    storage_options: Mapping[str, Any] | None = None,
    *,
    options: RemoteOptions | None = None,
) -> Any:
    """A read-only zarr store for ``url`` (see the module docs); the caller closes it
    with :func:`close_store`, or hands it to :func:`own_store`.

    ``storage_options`` go to ``obstore.store.from_url`` for the schemes in
    :data:`OBSTORE_SCHEMES` (store settings such as ``region`` or ``endpoint``,
    and ``client_options`` / ``retry_config`` over the ones :class:`RemoteOptions`
    gives) and to fsspec for any other. :class:`RemoteOptions` may also come under
    the key ``"chunkstream"``.
    """
    given = dict(storage_options or {})
    extra = given.pop(OPTIONS_KEY, None)
    if extra is not None and not isinstance(extra, RemoteOptions):
        raise ConfigError.bad(
            f"storage_options[{OPTIONS_KEY!r}]", extra, "a chunkstream RemoteOptions"
        )
    opts = options or extra or RemoteOptions()
    scheme = url.split("://", 1)[0].lower()
    if scheme in OBSTORE_SCHEMES:
        store = _obstore_store(url, given, opts)
    else:
        from zarr.storage import FsspecStore

        # a filesystem of the store's own, so closing it closes no one else's session
        given.setdefault("skip_instance_cache", True)
        store = FsspecStore.from_url(url, storage_options=given, read_only=True)
    _raise_concurrency(opts.concurrency)
    return store


def close_store(store: Any) -> None:
    """Close a store from :func:`open_remote_store` and, for fsspec's, its filesystem's
    session; idempotent, and safe at interpreter exit."""
    store.close()
    fs = getattr(store, "fs", None)
    if fs is not None:
        _close_filesystem(fs)


def _close_filesystem(fs: Any) -> None:
    """Close the aiohttp session (http, gcsfs) or botocore client (s3fs) of an async fsspec
    filesystem on zarr's event loop; the next request on ``fs`` would open a new one.

    ZarrSource opens s3 URLs with obstore, but an ``FsspecStore`` over s3fs still comes
    here from :func:`close_store` (``benchmarks/_fsspec_baseline.py``'s, or a caller's
    store tied with :func:`own_store`)."""

    async def close() -> None:
        # Private attributes of the backends: fsspec offers no public async close.
        session = getattr(fs, "_session", None)
        if session is not None and not getattr(session, "closed", True):
            await session.close()
        creator = getattr(fs, "_s3creator", None)
        if creator is not None:
            fs._s3, fs._s3creator = None, None
            await creator.__aexit__(None, None, None)

    try:
        zarr.core.sync.sync(close(), timeout=10)
    # a dead loop or network at exit; SyncError: a finalizer running on zarr's loop thread
    except (OSError, RuntimeError, TimeoutError, zarr.core.sync.SyncError) as exc:
        _log.debug("chunkstream: closing the session of %r failed: %s", fs, exc)


#: The stores :func:`own_store` tracks, by id, until they are closed.
_owned: dict[int, weakref.finalize] = {}


def own_store(owner: object, store: Any) -> weakref.finalize:
    """Tie ``store`` to ``owner``: the returned finalizer closes it once, when called
    (the owner's ``close()``), when ``owner`` is collected, or at interpreter exit."""
    key = id(store)
    finalizer = weakref.finalize(owner, _close_owned, key, store)
    # our own exit hook (below) closes it, while zarr's event loop still runs
    finalizer.atexit = False
    _owned[key] = finalizer
    # atexit runs hooks last-registered first; zarr's (which stops its loop) is registered
    # when the store was opened, whatever order the modules were imported in: ours again
    # now, so it runs before zarr's
    atexit.unregister(_close_owned_at_exit)
    atexit.register(_close_owned_at_exit)
    return finalizer


def _close_owned(key: int, store: Any) -> None:
    _owned.pop(key, None)
    close_store(store)


@atexit.register
def _close_owned_at_exit() -> None:
    # atexit runs hooks last-registered first: this one before zarr's, which stops its loop.
    # One store failing to close must not leave the others open.
    for finalizer in list(_owned.values()):
        try:
            finalizer()
        except Exception:  # exit-hook boundary: log it and close the rest
            _log.warning("chunkstream: closing a store at exit failed", exc_info=True)


def _raise_concurrency(concurrency: int) -> None:
    current = zarr.config.get("async.concurrency")
    if current is None or current < concurrency:
        zarr.config.set({"async.concurrency": concurrency})
        _log.info("chunkstream: zarr async.concurrency %s -> %d", current, concurrency)


# -- throughput against a local copy (used by the ``bench`` command) -----------------
