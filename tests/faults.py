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
