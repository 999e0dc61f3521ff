"""Sources for timing and failure-injection tests (real threads, in-memory bytes).

Everything else in the suite reads real zarr stores; these exist because a test
about a reader that raises, sleeps or hangs needs to control exactly when.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import numpy as np

from chunkstream.sources._base import FieldSpec, field_context


class ArraySource:
    """Fields from in-memory arrays, with optional delay, failures and hangs per read.

    ``fail_at`` holds read numbers (0-based, counting every call) that raise
    ``OSError``; ``fail_windows`` holds starts whose reads raise; ``hang_at``
    read numbers block until ``release`` is set; ``delay`` sleeps per read.
    """

    def __init__(
        self,
        arrays: Mapping[str, np.ndarray],
        *,
        delay: float = 0.0,
        fail_at: set[int] | None = None,
        fail_windows: set[int] | None = None,
        transient: int = 0,
        hang_at: set[int] | None = None,
    ) -> None:
        self.arrays = dict(arrays)
        self.fields = {k: FieldSpec(tuple(v.shape[1:]), v.dtype) for k, v in self.arrays.items()}
        self.delay = delay
        self.fail_at = fail_at or set()
        self.fail_windows = fail_windows or set()
        self.transient = transient  # the first `transient` reads of each window fail
        self.hang_at = hang_at or set()
        self.release = threading.Event()
        self.calls: list[tuple[int, int]] = []
        self._attempts: dict[int, int] = {}
        self._lock = threading.Lock()
        self.closed = False

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))

    def read_into(self, start: int, stop: int, out) -> None:
        with self._lock:
            number = len(self.calls)
            self.calls.append((start, stop))
            attempt = self._attempts.get(start, 0)
            self._attempts[start] = attempt + 1
        if self.delay:
            time.sleep(self.delay)
        if number in self.hang_at:
            while not self.release.wait(0.05):
                pass
        if number in self.fail_at or start in self.fail_windows:
            with field_context(next(iter(self.arrays))):
                raise OSError(f"injected failure reading [{start}, {stop})")
        if attempt < self.transient:
            raise ConnectionError(f"injected transient failure {attempt} at {start}")
        for name, array in self.arrays.items():
            out[name][: stop - start] = array[start:stop]

    def close(self) -> None:
        self.closed = True


def make_arrays(timesteps: int = 2000, neurons: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "voltage": rng.standard_normal((timesteps, neurons), dtype=np.float32),
        "stimulus": rng.standard_normal((timesteps, 3), dtype=np.float32),
    }


# -- wrappers around real sources (additive: used by test_faults / test_integrity / test_soak) --


def chunkstream_threads() -> list[threading.Thread]:
    """Live threads the library started (loader stages and zarr decode pools)."""
    return [t for t in threading.enumerate() if t.name.startswith("chunkstream-")]


def wait_for_no_threads(timeout: float = 5.0) -> list[threading.Thread]:
    """Wait up to ``timeout`` s for every ``chunkstream-*`` thread to end; return the survivors."""
    deadline = time.monotonic() + timeout
    while chunkstream_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    return chunkstream_threads()


class Wrapped:
    """A real source whose ``read_into`` can be made to fail, fail transiently or hang.

    ``fail_windows``: starts whose every read raises ``error`` (default ``OSError`` that is
    not transient: ``PermissionError``). ``transient``: a callable ``(start, attempt) -> bool``
    saying whether that attempt raises a transient ``ConnectionError`` *after* scribbling
    garbage into ``out`` (so a retry must overwrite it). ``hang_windows``: starts whose read
    blocks until ``release`` is set (ignoring cancellation, like a stuck network call).
    """

    def __init__(
        self,
        source,
        *,
        fail_windows: set[int] | None = None,
        error: BaseException | None = None,
        transient=None,
        hang_windows: set[int] | None = None,
    ) -> None:
        self.source = source
        self.fields = source.fields
        self.fail_windows = fail_windows or set()
        self.error = error
        self.transient = transient
        self.hang_windows = hang_windows or set()
        self.release = threading.Event()
        self.attempts: dict[int, int] = {}
        self.injected = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.source)

    def read_into(self, start: int, stop: int, out) -> None:
        with self._lock:
            attempt = self.attempts.get(start, 0)
            self.attempts[start] = attempt + 1
        if start in self.hang_windows:
            while not self.release.wait(0.05):
                pass
        if start in self.fail_windows:
            raise (
                self.error
                if self.error is not None
                else PermissionError(f"injected failure reading [{start}, {stop})")
            )
        if self.transient is not None and self.transient(start, attempt):
            for array in out.values():
                array[: stop - start] = 0x5A if array.dtype.kind in "iub" else np.nan
            with self._lock:
                self.injected += 1
            raise ConnectionError(f"injected transient failure at {start}, attempt {attempt}")
        self.source.read_into(start, stop, out)

    def close(self) -> None:
        self.source.close()
