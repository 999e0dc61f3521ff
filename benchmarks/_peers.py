"""What a user would otherwise use, implemented here so it runs on the same stores.

* :class:`OriginalLoader`: the original implementation's approach: one loader
  thread that re-opens the zarr store for every read, reads each field into
  fresh pageable numpy arrays, then copies them into a fresh (on CUDA: pinned)
  tensor and on to the device with a blocking copy; a queue of depth 2.
* :class:`WindowDataset`: a map-style torch ``Dataset`` whose item ``i`` is the
  window ``[i, i + window)`` of both fields, read with zarr or tensorstore;
  :func:`dataloader_rate` drives it through ``torch.utils.data.DataLoader``.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import numpy as np
import torch
import zarr

__all__ = ["OriginalLoader", "WindowDataset", "dataloader_rate", "original_gather"]


def _read_fields(arr, start: int, stop: int, stim_dims: int) -> tuple[np.ndarray, np.ndarray]:
    return arr[start:stop, :, 0], arr[start:stop, :stim_dims, 1]


class OriginalLoader:
    """Windows ``[s, s + chunk_size)`` read by one thread, re-opening the store per read."""

    def __init__(
        self, array_path: Path, *, stim_dims: int, chunk_size: int, starts: list[int],
        device: str = "cpu", prefetch: int = 2,
    ) -> None:  # fmt: skip
        self.path, self.stim_dims, self.chunk_size = str(array_path), stim_dims, chunk_size
        self.device = torch.device(device)
        self._queue: queue.Queue = queue.Queue(maxsize=prefetch)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(list(starts),), name="original-loader", daemon=True
        )
        self._thread.start()

    def _run(self, starts: list[int]) -> None:
        try:
            for s in starts:
                arr = zarr.open_array(self.path, mode="r")  # re-opened for every read
                data, stim = _read_fields(arr, s, s + self.chunk_size, self.stim_dims)
                if self.device.type == "cuda":
                    pair = tuple(
                        torch.from_numpy(a).pin_memory().to(self.device) for a in (data, stim)
                    )  # a fresh pinned copy, then a blocking copy
                else:
                    pair = tuple(torch.from_numpy(a).clone() for a in (data, stim))
                while not self._stop.is_set():
                    try:
                        self._queue.put((s, *pair), timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as exc:  # handed to the consumer
            self._queue.put(exc)
        self._queue.put(None)

    def __iter__(self):
        while True:
            item = self._queue.get(timeout=600)
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def original_gather(x: torch.Tensor, starts: torch.Tensor, window: int) -> torch.Tensor:
    """The original's batch gather: advanced indexing into a fresh tensor per batch."""
    idx = starts[:, None] + torch.arange(window, device=x.device)
    return x[idx]


class WindowDataset(torch.utils.data.Dataset):
    """Item ``i``: ``(voltage[i:i+window], stimulus[i:i+window])``; the store opens lazily per process."""

    def __init__(self, array_path: Path, *, stim_dims: int, window: int, reader: str) -> None:
        if reader not in ("zarr", "tensorstore"):
            raise ValueError(f"reader={reader!r}: expected 'zarr' or 'tensorstore'")
        self.path, self.stim_dims, self.window, self.reader = (
            str(array_path),
            stim_dims,
            window,
            reader,
        )
        arr = zarr.open_array(self.path, mode="r")
        self.length = int(arr.shape[0]) - window + 1
        self._arr = None

    def __len__(self) -> int:
        return self.length

    def _open(self):
        if self.reader == "zarr":
            return zarr.open_array(self.path, mode="r")
        import tensorstore as ts

        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": self.path}}
        return ts.open(spec, read=True).result()

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._arr is None:
            self._arr = self._open()
        s, e = int(i), int(i) + self.window
        if self.reader == "zarr":
            v, st = _read_fields(self._arr, s, e, self.stim_dims)
        else:
            v = self._arr[s:e, :, 0].read().result()
            st = self._arr[s:e, : self.stim_dims, 1].read().result()
        return torch.from_numpy(np.ascontiguousarray(v)), torch.from_numpy(np.ascontiguousarray(st))

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_arr"] = None  # each worker opens its own handle
        return state


def dataloader_rate(
    dataset: WindowDataset,
    *,
    workers: int,
    batch_size: int,
    batches: int,
    seed: int = 0,
    max_seconds: float = 20.0,
) -> dict:
    """Windows/s of ``batches`` batches, after one warm-up batch (worker start-up excluded).

    Stops early once ``max_seconds`` have passed after the warm-up (at least one
    batch is timed): on interleaved stores every 64-step window decodes whole
    64 MB chunks, and the full run must stay within its 30 minutes.
    """
    gen = torch.Generator().manual_seed(seed)
    sampler = torch.utils.data.RandomSampler(
        dataset, replacement=True, num_samples=batch_size * (batches + 1), generator=gen
    )
    kwargs = {"multiprocessing_context": "spawn", "prefetch_factor": 2} if workers else {}
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, num_workers=workers, **kwargs
    )
    begin = time.perf_counter()
    it = iter(loader)
    next(it)
    warm = time.perf_counter()
    n = 0
    for v, _ in it:
        n += v.shape[0]
        if time.perf_counter() - warm > max_seconds:
            break
    end = time.perf_counter()
    del it, loader
    return {"windows": n, "seconds": end - warm, "startup_s": warm - begin,
            "windows_per_s": n / (end - warm)}  # fmt: skip
