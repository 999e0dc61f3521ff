"""Open what a user points the tools at: one zarr array, a group, or a directory
of ``*.zarr`` stores (the FlyVis run directory), always read-only.

Arrays are named by their path inside the store; a directory's children by
their stem (``run/timeseries.zarr`` -> ``timeseries``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._errors import ConfigError, NotZarrError, SourceNotFoundError
from ._fieldspec import FieldRequest, Index, validate_index

__all__ = [
    "REMOTE_ENV",
    "is_remote",
    "local_root",
    "open_arrays",
    "remote_options",
    "resolve_field",
]


def is_remote(path: str | os.PathLike) -> bool:
    """True for a URL other than ``file://``."""
    from ..sources import is_url

    return is_url(str(path))


#: The environment the tools read a remote store's bounds from (RemoteOptions' fields).
REMOTE_ENV = {"timeout": "CHUNKSTREAM_REMOTE_TIMEOUT", "retries": "CHUNKSTREAM_REMOTE_RETRIES"}


def remote_options(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The storage options the tools open a URL with: the library's ``RemoteOptions``,
    its ``timeout``/``retries`` from ``$CHUNKSTREAM_REMOTE_TIMEOUT``/``_RETRIES`` when
    set (a bad value is refused, naming the variable)."""
    from ..sources import OPTIONS_KEY, RemoteOptions

    given = {}
    for field, name in REMOTE_ENV.items():
        text = environ.get(name)
        if text:
            try:
                given[field] = float(text) if field == "timeout" else int(text)
            except ValueError:
                raise ConfigError.bad(name, text, f"a number ({field})") from None
    try:
        return {OPTIONS_KEY: RemoteOptions(**given)}
    except ConfigError as exc:
        raise ConfigError(f"${' / $'.join(REMOTE_ENV.values())}: {exc}") from None


def _open_node(path: str, storage_options: Mapping[str, Any] | None = None) -> Any:
    """The zarr array or group at ``path``, or None for a local folder that is none,
    opened by the library's opener (``sources._open``): a URL with its timeouts,
    retries, ``RemoteStoreError`` and node cache."""
    from ..sources import open_zarr_node

    if is_remote(path):
        return open_zarr_node(path, storage_options or remote_options())
    local = Path(path.removeprefix("file://")).expanduser()
    if not any((local / name).exists() for name in ("zarr.json", ".zarray", ".zgroup")):
        return None
    return open_zarr_node(path)


def _members(node: Any, prefix: str) -> dict[str, Any]:
    import zarr

    if isinstance(node, zarr.Array):
        return {prefix or Path(str(node.store).rstrip("/")).stem: node}
    found = {}
    for key, member in node.members(max_depth=None):
        if isinstance(member, zarr.Array):
            found[f"{prefix}/{key}" if prefix else key] = member
    return found


def open_arrays(
    path: str | os.PathLike, storage_options: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Every zarr array under ``path``, opened read-only, by name (module docs).

    Raises ``SourceNotFoundError`` for a missing local path and ``NotZarrError``
    when nothing under it is zarr; a URL fails as the library's sources do
    (``RemoteStoreError`` naming it, within :func:`remote_options`' bounds), and
    ``storage_options`` go to its store (default: :func:`remote_options`).
    """
    text = str(path)
    if not is_remote(text) and not Path(text.removeprefix("file://")).exists():
        raise SourceNotFoundError(
            f"path {text!r} does not exist: pass an existing zarr store, group or directory."
        )
    node = _open_node(text, storage_options)
    if node is not None:
        import zarr

        prefix = "" if not isinstance(node, zarr.Array) else Path(text.rstrip("/")).stem
        return _members(node, prefix)
    arrays: dict[str, Any] = {}
    local = Path(text.removeprefix("file://"))
    if local.is_dir():
        for child in sorted(local.iterdir()):
            sub = _open_node(str(child)) if child.is_dir() else None
            if sub is not None:
                arrays.update(_members(sub, child.stem if child.suffix == ".zarr" else child.name))
    if not arrays:
        raise NotZarrError(
            f"path {text!r} holds no zarr array or group (no zarr.json/.zarray/.zgroup "
            "found there or in its subdirectories): point at a zarr store."
        )
    return arrays


def local_root(array: Any) -> Path | None:
    """The directory holding a local array's files, or None for a remote store."""
    root = getattr(array.store, "root", None)
    if root is None:
        return None
    return Path(root) / array.path if array.path else Path(root)


def resolve_field(request: FieldRequest, arrays: dict[str, Any]) -> tuple[str, Any, Index]:
    """Pick the array a field reads and validate its index: ``(name, array, index)``.

    An unnamed array means the only array, else the one named ``timeseries``
    (the FlyVis convention); otherwise the request must name one.
    """
    if request.array is not None:
        matches = [
            n
            for n in arrays
            if n == request.array or n.removesuffix(".zarr") == request.array.removesuffix(".zarr")
        ]
        if not matches:
            raise ConfigError.bad(
                f"field {request.name!r} array", request.array, f"one of {sorted(arrays)}"
            )
        name = matches[0]
    elif len(arrays) == 1:
        name = next(iter(arrays))
    elif "timeseries" in arrays:
        name = "timeseries"
    else:
        raise ConfigError(
            f"field {request.name!r} does not say which array it reads and the store holds "
            f"{sorted(arrays)}: write it as {request.name}=ARRAY[INDEX], e.g. "
            f"{request.name}={sorted(arrays)[0]}[:,0]."
        )
    array = arrays[name]
    if array.ndim < 1:
        raise ConfigError.bad(f"field {request.name!r} array", name, "an array with a time axis")
    index = validate_index(request.name, request.index, tuple(array.shape[1:]), f"array {name!r}")
    return name, array, index
