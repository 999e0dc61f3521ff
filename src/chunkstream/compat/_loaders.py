"""The drop-in loaders: the original's window draws, streamed by :class:`~chunkstream.ChunkLoader`.

Before the first ``get_next_chunk()`` there is no pipeline (its buffers need the
arrays' shapes): ``start_epoch`` reads the epoch's first window in a daemon
thread (``chunkstream-compat-first-<epoch>``, after the abandoned epoch's first
read, so one ``load_fn`` call runs at a time); ``get_next_chunk()`` waits for it
(bounded by the stall timeout, seeing ``cleanup()``), builds the loader over a
:class:`~chunkstream.CallableSource` that answers that window from the arrays
already read, and from then on every epoch is a ``ChunkLoader.epoch()`` call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import numpy as np
import torch

from .._errors import ChunkLoadError, ConfigError, LoaderClosedError, LoaderStalledError, check_int
from ..pipeline import POLL_S, ChunkLoader, LoaderConfig, resolve_device, thread_stack
from ..plans import RandomPlan
from ..sources import CallableSource, FieldSpec
from ..stats import LatencyStats
from ._draws import Epoch, OriginalDraws
from ._helpers import CALLER, Claims

__all__ = ["PipelineChunkLoader", "RandomChunkLoader"]

_JOIN_S = 2.0  # how long cleanup() waits for a first read in flight
_log = logging.getLogger("chunkstream.compat")


class RandomChunkLoader:
    """Uniform random windows ``[start, start + chunk_size)`` read ahead in a background thread.

    ``get_next_chunk()`` returns ``(data, stim)`` tensors on ``device``, then
    ``(None, None)`` once the epoch's ``num_chunks`` chunks were delivered; windows
    and ``load_fn`` calls follow the original's draws (see the package docs).
    ``device`` is a :class:`torch.device`; ``source`` is ``None`` until the first
    chunk taught the loader the shapes.
    """

    def __init__(
        self,
        load_fn: Callable[[int, int], tuple[np.ndarray, np.ndarray]],
        total_timesteps: int,
        chunk_size: int,
        device: str | torch.device = "cuda",
        prefetch: int = 1,
        seed: int | None = None,
        *,
        _gpu_prefetch: int = 1,
        _align: int = 1,
        _stall_timeout: float | None = 300.0,
    ) -> None:
        if not callable(load_fn):
            raise ConfigError.bad("load_fn", load_fn, "a callable load_fn(start, end)")
        # Everything is checked now, as the original's constructor would have failed now.
        RandomPlan(total_timesteps=total_timesteps, chunk_size=chunk_size)
        check_int("time_units", _align, 1, "Use 1 for no alignment.", expected="an int >= 1")
        self._config = LoaderConfig(chunk_size=chunk_size, prefetch=prefetch, workers=1,
                                    gpu_prefetch=_gpu_prefetch, stall_timeout=_stall_timeout)  # fmt: skip
        self._device = resolve_device(device)
        self.load_fn, self.total_timesteps, self.chunk_size = load_fn, total_timesteps, chunk_size
        # As the original: a torch.device, "cuda" left without an index.
        self.device = torch.device(device) if isinstance(device, str) else device
        self.prefetch, self.seed = prefetch, seed
        self._draws = OriginalDraws(total_timesteps, chunk_size, _align, seed)
        self.max_start_idx = self._draws.max_start
        # Chunks the original had loaded beyond those delivered once its reader was ahead.
        self._depth = prefetch + 1
        self._stats = LatencyStats()
        self._claims = Claims()
        self.source: CallableSource | None = None
        self._loader: ChunkLoader | None = None
        self._loader_epochs = 0  # epoch() calls made on the loader
        self._iterator: Any = None
        self._epoch: Epoch | None = None
        # The latest first-window read: its window, its future, and its thread followed
        # by the abandoned epochs' first reads it waits for (for stacks and joins).
        self._first: tuple[tuple[int, int], Future, list[threading.Thread]] | None = None
        self._first_arrays: tuple[tuple[int, int], tuple] | None = None
        self._closed = False

    def start_epoch(self, num_chunks: int) -> None:
        """Begin an epoch of ``num_chunks`` chunks; abandons any epoch in progress."""
        if self._closed:
            raise LoaderClosedError("the loader was cleaned up; create a new one")
        check_int("num_chunks", num_chunks, 0, "Use calculate_chunk_params(...)[0].",
                  expected="an int >= 0")  # fmt: skip
        previous = self._epoch
        if previous is None:
            epoch = Epoch(0, 0, num_chunks)
        else:
            consumed = min(previous.num_chunks, previous.delivered + self._depth)
            epoch = Epoch(previous.index + 1, previous.first_draw + consumed, num_chunks)
        self._epoch = epoch
        if self._loader is not None:
            self._draws.begin(self._loader_epochs, epoch.first_draw)
            self._loader_epochs += 1
            self._iterator = self._loader.epoch(num_chunks)
            return
        after, older = None, []
        if self._first is not None:
            _, after, older = self._first
            after.cancel()  # its epoch is abandoned; a read already begun runs to its end
            self._first = None
        if num_chunks > 0:
            window = self._draws.draw(epoch.first_draw)

            def timed() -> tuple[tuple, float, float]:
                begin = time.perf_counter()
                return self._call(epoch, *window), begin, time.perf_counter()

            future, thread = _in_background(timed, after=after,
                                            name=f"chunkstream-compat-first-{epoch.index}")  # fmt: skip
            self._first = (window, future, [thread, *(t for t in older if t.is_alive())])

    def _call(self, epoch: Epoch, start: int, end: int):
        """``load_fn(start, end)``, counted for ``epoch``; a store it opens is this loader's."""
        token = CALLER.set(self._claims)
        try:
            arrays = self.load_fn(start, end)
        finally:
            CALLER.reset(token)
        epoch.loaded += 1
        return arrays

    def _read(self, start: int, end: int):
        """The source's ``load_fn`` (one reader worker): the first window from the arrays
        already read, once; then ``load_fn``."""
        first = self._first_arrays
        if first is not None and first[0] == (start, end):
            self._first_arrays = None
            return first[1]
        return self._call(self._epoch, start, end)

    def _await_first(self, window: tuple[int, int], future: Future,
                     threads: list[threading.Thread]) -> tuple[tuple, float, float]:  # fmt: skip
        """The first window's ``(arrays, begin, end)``; a bounded wait that sees cleanup()."""
        begin, timeout = time.perf_counter(), self._config.stall_timeout
        while True:
            try:
                return future.result(timeout=POLL_S)
            except FutureTimeout:
                pass
            except Exception as exc:
                raise ChunkLoadError(
                    f"reading window [{window[0]}, {window[1]}) of load_fn failed: "
                    f"{type(exc).__name__}: {exc}",
                    window=window,
                ) from exc
            if self._closed:
                raise LoaderClosedError("the loader was cleaned up while waiting for a chunk")
            if timeout is not None and time.perf_counter() - begin >= timeout:
                stacks = filter(None, (thread_stack(t, "load_fn") for t in threads))
                raise LoaderStalledError(
                    f"load_fn{window} did not return within {timeout:.1f} s (stall_timeout); "
                    "the loader is shut down. Stuck reader:\n"
                    + ("\n".join(stacks) or "(it has just ended)"),
                    window=window,
                )

    def _build(self, epoch: Epoch) -> tuple[float, float]:
        """Wait for the epoch's first window, learn the shapes from it, start the pipeline;
        returns that read's ``(begin, end)``."""
        window = self._first[0]  # type: ignore[index]
        arrays, read_begin, read_end = self._await_first(*self._first)  # type: ignore[misc]
        self._first = None
        if not isinstance(arrays, (tuple, list)) or len(arrays) != 2:
            got = len(arrays) if isinstance(arrays, (tuple, list)) else type(arrays).__name__
            raise ChunkLoadError(f"load_fn{window} returned {got!r} values, expected a pair "
                                 "(data, stim) of numpy arrays.", window=window)  # fmt: skip
        specs = {name: FieldSpec(tuple(np.shape(a)[1:]), np.asarray(a).dtype)
                 for name, a in zip(("data", "stim"), arrays, strict=True)}  # fmt: skip
        self.source = CallableSource(self._read, self.total_timesteps, names=("data", "stim"),
                                     specs=specs)  # fmt: skip
        self._first_arrays = (window, tuple(arrays))
        c = self._config
        # One load_fn call at a time, in window order; under torchrun every rank reads the
        # whole sequence, as the original did.
        self._loader = ChunkLoader(
            self.source, self.chunk_size, device=self._device, prefetch=c.prefetch,
            gpu_prefetch=c.gpu_prefetch, workers=1, sampling=self._draws, stats=self._stats,
            stall_timeout=c.stall_timeout, rank=0, world_size=1,
        )  # fmt: skip
        self._draws.begin(0, epoch.first_draw)
        self._loader_epochs = 1
        self._iterator = self._loader.epoch(epoch.num_chunks)
        return read_begin, read_end

    def _next(self):
        if self._closed:
            raise LoaderClosedError("the loader was cleaned up (or a read failed)")
        epoch = self._epoch
        if epoch is None:
            raise RuntimeError("call start_epoch(num_chunks) before get_next_chunk()")
        if self._loader is None:
            if epoch.num_chunks == 0:
                return None
            asked = time.perf_counter()
            try:
                read = self._build(epoch)
                chunk = next(self._iterator, None)
            except BaseException:
                self._closed = True  # as the pipeline shuts down after a failed read
                raise
            # The pipeline answered this window from the arrays read in the background:
            # its record gets that read's times and the caller's whole wait.
            record = self._stats.chunks[-1]
            record.read_begin, record.read_end = read
            record.read_s = record.read_end - record.read_begin
            record.wait_s = record.received - asked
        else:
            chunk = next(self._iterator, None)
        if chunk is not None:
            epoch.delivered += 1
        return chunk

    def get_next_chunk(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The next chunk as ``(data, stim)`` on ``device``; ``(None, None)`` after the epoch's
        last. Raises :class:`~chunkstream.ChunkLoadError` if a read failed (never hangs)."""
        chunk = self._next()
        if chunk is None:
            return None, None
        return chunk["data"], chunk["stim"]

    def get_stats(self) -> dict[str, int]:
        """``{'chunks_loaded': int, 'chunks_transferred': int}`` for the current epoch: its
        ``load_fn`` calls that returned (read ahead included) and its chunks delivered."""
        epoch = self._epoch
        if epoch is None:
            return {"chunks_loaded": 0, "chunks_transferred": 0}
        return {"chunks_loaded": epoch.loaded, "chunks_transferred": epoch.delivered}

    def cleanup(self) -> None:
        """Stop the background threads and close what this loader opened (idempotent).

        A first read in flight is waited for at most a few seconds, then left to
        finish in its daemon thread. A store opened by :func:`create_zarr_loader`
        is closed once no other live compat loader uses it.
        """
        self._closed = True
        busy = []
        if self._first is not None:
            _, future, threads = self._first
            self._first = None
            future.cancel()  # a read not yet begun is skipped
            deadline = time.monotonic() + _JOIN_S
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            busy = [t for t in threads if t.is_alive()]
            if busy:
                _log.warning("chunkstream: load_fn is still running after cleanup() in %s; "
                             "left to finish on its own", [t.name for t in busy])  # fmt: skip
        if self._loader is not None:
            self._loader.close()
            busy += [t for t in self._loader.threads if t.is_alive()]
        if not busy:  # closing a store under a read in flight would wait for that read
            for user in list(self._claims.users):
                user.release(self._claims)
        self._first_arrays = None

    @property
    def stats(self) -> LatencyStats:
        """The underlying :class:`~chunkstream.LatencyStats` (waits, reads, transfers)."""
        return self._stats

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def _in_background(call: Callable[[], Any], *, name: str, after: Future | None):
    """``(future, thread)``: ``call()`` in a daemon thread (a ``load_fn`` that never returns
    must not keep the process alive) begun once ``after`` is done; a future cancelled
    before then skips the call."""
    future: Future = Future()

    def run() -> None:
        if after is not None:
            wait([after])  # until it has ended or was cancelled; its outcome is not ours
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(call())
        except BaseException as exc:  # thread boundary: handed on in the future
            future.set_exception(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return future, thread


class PipelineChunkLoader(RandomChunkLoader):
    """As :class:`RandomChunkLoader`, with starts a multiple of ``time_units``;
    ``get_next_chunk()`` returns ``(start, data, stim)``, then ``(None, None, None)``."""

    def __init__(
        self,
        load_fn: Callable[[int, int], tuple[np.ndarray, np.ndarray]],
        total_timesteps: int,
        chunk_size: int,
        device: str | torch.device = "cuda",
        prefetch: int = 1,
        seed: int | None = None,
        time_units: int = 1,
        gpu_prefetch: int = 1,
        *,
        _stall_timeout: float | None = 300.0,
    ) -> None:
        self.time_units, self.gpu_prefetch = time_units, gpu_prefetch
        super().__init__(load_fn, total_timesteps, chunk_size, device=device, prefetch=prefetch,
                         seed=seed, _gpu_prefetch=gpu_prefetch, _align=time_units,
                         _stall_timeout=_stall_timeout)  # fmt: skip
        # The original's reader and transfer threads each held a chunk beyond their queues.
        self._depth = prefetch + gpu_prefetch + 2

    def get_next_chunk(self):  # type: ignore[override]
        """The next chunk as ``(start, data, stim)``; ``(None, None, None)`` after the epoch's last."""
        chunk = self._next()
        if chunk is None:
            return None, None, None
        return chunk.start, chunk["data"], chunk["stim"]
