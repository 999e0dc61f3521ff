"""The original's ``create_zarr_loader``: a FlyVis ``load_fn`` whose store the compat loaders close."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextvars import ContextVar

import numpy as np

__all__ = ["CALLER", "Claims", "create_zarr_loader"]


class Claims:
    """The ``create_zarr_loader`` functions one compat loader has called."""

    def __init__(self) -> None:
        self.users: set[_ZarrLoadFn] = set()


# The compat loader on whose behalf this thread is calling load_fn (None: a direct call).
CALLER: ContextVar[Claims | None] = ContextVar("chunkstream_compat_caller", default=None)


class _ZarrLoadFn:
    """:func:`create_zarr_loader`'s ``load_fn``: a FlyVis store, open while in use.

    Opened at creation (a bad path fails there). Every compat loader that calls it,
    also through a wrapper, claims it (:data:`CALLER`); once the last claimant's
    ``cleanup()`` released it and no call is in flight, the store is closed, and a
    later call reopens it. Thread-safe.
    """

    def __init__(self, open_fn: Callable[[], Callable]) -> None:
        self._open_fn = open_fn
        self._fn = open_fn()
        self._open = True
        self._users: set[Claims] = set()
        self._in_flight = 0
        self._close_pending = False  # released by its last claimant while a call ran
        self._lock = threading.Lock()

    @property
    def source(self):
        """The :class:`~chunkstream.ZarrSource` it reads (``source.close()`` closes it)."""
        return self._fn.source

    def __call__(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        claims = CALLER.get()
        with self._lock:
            if claims is not None and claims not in self._users:
                self._users.add(claims)
                claims.users.add(self)
                self._close_pending = False
            if not self._open:
                self._fn, self._open = self._open_fn(), True
            fn = self._fn
            self._in_flight += 1
        try:
            return fn(start, end)
        finally:
            with self._lock:
                self._in_flight -= 1
                self._close_if_unused()

    def release(self, claims: Claims) -> None:
        """``claims``' loader is done with it: close the store if nobody else uses it."""
        with self._lock:
            self._users.discard(claims)
            claims.users.discard(self)
            # Only a store some loader claimed closes by itself; a load_fn only ever
            # called directly stays open, as the original's.
            self._close_pending = not self._users
            self._close_if_unused()

    def _close_if_unused(self) -> None:  # called under the lock
        if self._open and self._close_pending and not self._users and not self._in_flight:
            self._fn.source.close()
            self._open = self._close_pending = False


def create_zarr_loader(
    data_path: str, column_idx: int, stim_column_idx: int, num_stim_dims: int
) -> Callable[[int, int], tuple[np.ndarray, np.ndarray]]:
    """``load_fn(start, end) -> (data, stim)`` over a FlyVis store, opened once.

    The compat loaders that call it close its store in their ``cleanup()`` once
    none of them uses it (it reopens on its next call); ``load_fn.source`` is the
    open :class:`~chunkstream.ZarrSource`.
    """
    from .. import flyvis

    return _ZarrLoadFn(
        lambda: flyvis.make_load_fn(data_path, column_idx, stim_column_idx, num_stim_dims)
    )
