"""Opening a zarr array, local or remote: the one place a store is opened.

A local path is checked first so that its errors say what is wrong (no such
path, not zarr, unreadable metadata), and a local array is built from its
metadata file without zarr's event loop (:func:`_local_array`). A URL goes
through :func:`~chunkstream.sources._remote.open_remote_store` (obstore for
object stores and HTTP; retries and timeouts) and, with a cache folder, through
the node-local cache (:mod:`._cached_store`). A group's member is chosen by
``array=``, with the group's arrays named when it is missing or wrong.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import zarr

from .._errors import ConfigError, NotZarrError, SourceNotFoundError
from ._cached_store import cache_folder, cached_store
from ._remote import (
    OPTIONS_KEY,
    RemoteOptions,
    close_store,
    is_url,
    open_remote_store,
    store_errors,
)

__all__ = ["open_zarr_array", "open_zarr_node"]


def open_zarr_array(
    path: str | Path,
    array: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    *,
    cache: str | os.PathLike | None = None,
    cache_bytes: int | None = None,
    cache_group: str | int | None = None,
) -> zarr.Array:
    """Open the zarr array at ``path`` (or member ``array`` of the group there), read-only.

    Local paths are checked first so that the errors say what is wrong; URLs go
    through :func:`~chunkstream.sources._remote.open_remote_store` (obstore for
    object stores and HTTP). This is the one place a store is opened, so retries
    and timeouts for remote stores belong here. A URL's store belongs to the
    caller, who closes it with ``_remote.close_store(array.store)``; when opening
    fails it is closed here. ``cache``/``cache_bytes``/``cache_group``: the node-local
    cache the store reads through (:mod:`._cached_store`; ``cache=None`` takes
    ``$CHUNKSTREAM_CACHE`` for a remote URL).
    """
    node = open_zarr_node(
        path, storage_options, cache=cache, cache_bytes=cache_bytes, cache_group=cache_group
    )
    try:
        return _select_array(node, array, str(path))
    except BaseException:
        if is_url(str(path)):
            close_store(node.store)
        raise


def open_zarr_node(
    path: str | Path,
    storage_options: Mapping[str, Any] | None = None,
    *,
    cache: str | os.PathLike | None = None,
    cache_bytes: int | None = None,
    cache_group: str | int | None = None,
) -> zarr.Array | zarr.Group:
    """The zarr array or group at ``path``, read-only, opened as :func:`open_zarr_array`
    opens it (the tools open groups and directories of stores through this)."""
    text = str(path)
    folder = cache_folder(text, cache, cache_bytes, cache_group)
    if not is_url(text):
        return _open_local(text)
    store = open_remote_store(text, storage_options)
    try:
        if folder is not None:
            opts = (storage_options or {}).get(OPTIONS_KEY) or RemoteOptions()
            # wait for another process's fetch as long as a fetch of our own may take
            wait_s = (opts.retries + 1) * (opts.timeout + opts.max_backoff)
            root, trust = folder
            store = cached_store(store, text, root, cache_bytes, wait_s, trust)
        try:
            with store_errors(text, "the zarr metadata"):
                return zarr.open(store, mode="r")
        except FileNotFoundError as exc:
            raise SourceNotFoundError(
                f"no zarr array or group at {text!r}. Check the URL and credentials "
                "(storage_options)."
            ) from exc
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
        node = _local_array(local) or zarr.open(local, mode="r")
    except (ValueError, KeyError, TypeError) as exc:  # unreadable or incomplete metadata
        raise NotZarrError(
            f"the zarr metadata of {str(local)!r} is unreadable "
            f"({type(exc).__name__}: {exc}): zarr.json, .zarray or .zgroup is corrupt or "
            "incomplete. Restore the metadata file or rewrite the array."
        ) from exc
    return node


def _local_array(local: Path) -> zarr.Array | None:
    """The array at ``local`` built from its metadata file as zarr builds it, without
    zarr's event loop (module docs, "Threads"); ``None`` for a group or both formats'
    metadata, which ``zarr.open`` resolves."""
    from zarr.core.array import AsyncArray, parse_array_metadata
    from zarr.storage import LocalStore, StorePath

    v3, v2 = local / "zarr.json", local / ".zarray"
    if v3.exists() == v2.exists():
        return None
    if v3.exists():
        document = json.loads(v3.read_bytes())
        if document.get("node_type") != "array":
            return None
    else:  # zarr v2: .zarray, its attributes in .zattrs
        document = json.loads(v2.read_bytes())
        attrs = local / ".zattrs"
        document["attributes"] = json.loads(attrs.read_bytes()) if attrs.exists() else {}
    store_path = StorePath(LocalStore(local, read_only=True), "")
    return zarr.Array(AsyncArray(metadata=parse_array_metadata(document), store_path=store_path))


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
            "array",
            None,
            f"the name of an array, since {text!r} is a zarr group",
            f"Pass array= one of {members}.",
        )
    return node
