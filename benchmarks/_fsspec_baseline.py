"""The baseline of the remote-store race: zarr's ``FsspecStore`` inside a retrying wrapper.

This is how chunkstream opened ``http(s)://`` and ``s3://`` URLs until the race of
issue 11 (``benchmarks/_remote.py``) made obstore the default; it lives on here, outside
the library, only so that the race can be rerun. Every request (``get``, partial
gets, ``exists``, listings) runs under ``asyncio.wait_for(..., timeout)`` (the
backend's socket timeouts set to the same value) and is retried after a transient
failure (a timeout, a reset or dropped connection, HTTP 5xx, 408 or 429) with
jittered exponential backoff; after the last retry it raises ``RemoteStoreError``
naming the URL, the attempts and the last error.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from zarr.storage import FsspecStore, WrapperStore

from chunkstream import RemoteOptions, RemoteStoreError
from chunkstream._errors import ChunkstreamError
from chunkstream.sources._remote import close_store

__all__ = ["RetryingStore", "is_transient", "open_fsspec_store"]

_R = TypeVar("_R")


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
    import aiohttp

    if isinstance(exc, aiohttp.ClientError):
        return True  # connection refused/reset, server disconnected, truncated payload
    if type(exc).__module__.split(".")[0] in ("botocore", "aiobotocore", "urllib3"):
        name = type(exc).__name__
        return any(word in name for word in ("Timeout", "Connection", "Endpoint", "Read"))
    # s3fs turns unknown service errors into plain OSError (EIO).
    return isinstance(exc, OSError)


def _status(exc: BaseException) -> int | None:
    """The HTTP status of an aiohttp or botocore error, if it has one."""
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
    """A zarr ``Store`` wrapper: every request under a timeout, transient failures retried;
    :meth:`close` also closes the wrapped store's own fsspec filesystem (its session)."""

    def __init__(self, store: Any, *, url: str, options: RemoteOptions) -> None:
        super().__init__(store)
        self.url = url.rstrip("/")
        self.options = options

    def close(self) -> None:
        close_store(self._store)

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
                        f"{exc})."
                    ) from exc
                delay = min(opts.max_backoff, opts.backoff * 2**attempt)
                await asyncio.sleep(delay * (0.5 + random.random() / 2))
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


def _backend_options(scheme: str, given: Mapping[str, Any], opts: RemoteOptions) -> dict:
    """fsspec options with timeouts (and pool sizes) set where the caller did not set them."""
    out = dict(given)
    out.setdefault("skip_instance_cache", True)  # a filesystem (and session) of its own
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
        # botocore's own retries would multiply ours
        config.setdefault("retries", {"max_attempts": 1, "mode": "standard"})
        out["config_kwargs"] = config
    return out


def open_fsspec_store(
    url: str, storage_options: Mapping[str, Any], options: RemoteOptions
) -> RetryingStore:
    """A read-only :class:`RetryingStore` over zarr's ``FsspecStore`` for ``url``."""
    scheme = url.split("://", 1)[0].lower()
    backend = _backend_options(scheme, storage_options, options)
    store = FsspecStore.from_url(url, storage_options=backend, read_only=True)
    return RetryingStore(store, url=url, options=options)
