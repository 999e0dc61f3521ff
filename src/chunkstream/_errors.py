"""The chunkstream exception tree.

Every error the library raises on purpose is a :class:`ChunkstreamError`, and
each subclass also inherits the built-in a caller would naturally catch::

    ChunkstreamError
    ├── ConfigError(ValueError)          a parameter out of its accepted range
    ├── SourceError                      a store or array that cannot be streamed
    │   ├── SourceNotFoundError(FileNotFoundError)   missing path or URL
    │   ├── NotZarrError(ValueError)                 the path is not a zarr store
    │   ├── FieldSelectionError(IndexError)          selection out of range
    │   ├── FieldDtypeError(TypeError)               dtype cannot become a tensor
    │   ├── FieldLengthError(ValueError)             fields disagree on time length
    │   ├── MissingChunkError(FileNotFoundError)     a zarr chunk file is absent
    │   ├── CorruptChunkError(ValueError)            a chunk file does not decode
    │   └── RemoteStoreError(ConnectionError)        a remote request kept failing
    │       └── RemotePermissionError(PermissionError)   denied, or bad credentials
    ├── ChunkLoadError(RuntimeError)     a background read or copy failed;
    │   │                                ``__cause__`` is the original exception
    │   └── LoaderStalledError(TimeoutError)  no progress within ``stall_timeout``
    ├── NonFiniteError(ValueError)       NaN or Inf found by the optional check
    └── LoaderClosedError(RuntimeError)  the loader was used after ``close()``

Warnings: ``ReadAmplificationWarning(UserWarning)``, a field decodes much more than it
uses because of the zarr chunk layout; ``CacheWarning(UserWarning)``, the node-local
cache of a remote store dropped a damaged entry or fell back to reading through.

Messages say what was received, what was expected and what to do.
"""

from __future__ import annotations

import operator

__all__ = [
    "CacheWarning",
    "ChunkLoadError",
    "ChunkstreamError",
    "ConfigError",
    "CorruptChunkError",
    "FieldDtypeError",
    "FieldLengthError",
    "FieldSelectionError",
    "LoaderClosedError",
    "LoaderStalledError",
    "MissingChunkError",
    "NonFiniteError",
    "NotZarrError",
    "ReadAmplificationWarning",
    "RemotePermissionError",
    "RemoteStoreError",
    "SourceError",
    "SourceNotFoundError",
]


class ChunkstreamError(Exception):
    """Root of every error chunkstream raises on purpose."""


class ConfigError(ChunkstreamError, ValueError):
    """A parameter is outside its accepted range."""

    @classmethod
    def bad(cls, name: str, value: object, expected: str, fix: str = "") -> ConfigError:
        """Build the standard message: ``name=value``, what is expected, what to do."""
        message = f"{name}={value!r} is invalid: expected {expected}."
        if fix:
            message += f" {fix}"
        return cls(message)


def check_int(
    name: str,
    value: object,
    minimum: int = 1,
    fix: str = "",
    *,
    maximum: int | None = None,
    expected: str = "",
    numpy: bool = False,
) -> int:
    """``value`` as an ``int`` in ``[minimum, maximum]``, else :class:`ConfigError`.

    The one integer check of the library. Bools are never integers here; numpy
    integers (anything ``operator.index`` takes) are accepted only with
    ``numpy=True``, and returned as a Python ``int``. The error names ``name``
    and the value, says what was expected (``expected``, or the range) and adds
    ``fix``.
    """
    if not expected:
        expected = (
            f"an integer >= {minimum}"
            if maximum is None
            else f"an integer in [{minimum}, {maximum}]"
        )
    if isinstance(value, bool) or not (numpy or isinstance(value, int)):
        raise ConfigError.bad(name, value, expected, fix)
    try:
        result = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigError.bad(name, value, expected, fix) from None
    if result < minimum or (maximum is not None and result > maximum):
        raise ConfigError.bad(name, value, expected, fix)
    return result


class SourceError(ChunkstreamError):
    """A store, array or callable cannot be streamed as given."""


class SourceNotFoundError(SourceError, FileNotFoundError):
    """The path or URL does not exist."""


class NotZarrError(SourceError, ValueError):
    """The path exists but holds no zarr array or group."""


class FieldSelectionError(SourceError, IndexError):
    """A field's selection does not fit the array's non-time axes."""


class FieldDtypeError(SourceError, TypeError):
    """A field's dtype cannot be streamed into a torch tensor."""


class FieldLengthError(SourceError, ValueError):
    """The fields of one source do not share one time length."""


class MissingChunkError(SourceError, FileNotFoundError):
    """A zarr chunk file is absent; zarr would silently read it as the fill value."""


class CorruptChunkError(SourceError, ValueError):
    """A zarr chunk file is truncated or does not decode."""


class RemoteStoreError(SourceError, ConnectionError):
    """A remote request kept failing after every retry (or failed permanently).

    The message names the URL and key, the attempts and the last error.
    """


class RemotePermissionError(RemoteStoreError, PermissionError):
    """The store refused the request (HTTP 401/403): missing or wrong credentials, or a
    policy that denies the read. Not retried; the message names the URL and key."""


class ChunkLoadError(ChunkstreamError, RuntimeError):
    """A background read or copy failed.

    ``window`` is the ``(start, stop)`` being read, ``field`` the field name where
    known, and ``__cause__`` the original exception with its traceback.
    """

    def __init__(
        self,
        message: str,
        *,
        window: tuple[int, int] | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.window = window
        self.field = field


class LoaderStalledError(ChunkLoadError, TimeoutError):
    """No chunk arrived within ``stall_timeout``; the message holds the workers' stacks."""


class NonFiniteError(ChunkstreamError, ValueError):
    """The optional finite check found NaN or Inf."""


class LoaderClosedError(ChunkstreamError, RuntimeError):
    """The loader was used after ``close()``."""


class ReadAmplificationWarning(UserWarning):
    """A field decodes many more bytes than it uses, given the zarr chunk grid.

    Issued when a ``ZarrSource`` opens, once per store and field in a process.
    """


class CacheWarning(UserWarning):
    """The node-local cache of a remote store (``ZarrSource(url, cache=DIR)``) found a
    damaged entry (dropped and fetched again) or cannot write (reads go through to the
    store from then on). Reads never fail because of the cache."""
