"""Drop-in replacements for the original implementation's API (change one import).

Signatures and return values match the original (see DESIGN.md, "Drop-in
compatibility"); the machinery underneath is :class:`~chunkstream.ChunkLoader`.
What is fixed on the way:

* a reader exception raises :class:`~chunkstream.ChunkLoadError` in
  ``get_next_chunk`` (its ``__cause__`` the original) instead of hanging forever;
* ``start_epoch`` again, also mid-epoch, abandons the old epoch at once: no 2 s
  stall, and no stale end-of-epoch marker handed to the new epoch (each epoch is
  its own generation inside the pipeline);
* the store is opened once, and pinned slots are reused instead of re-pinned.

``load_fn`` is called as the original calls it: only for windows it delivers,
each ``chunk_size`` long (the whole data, ``(0, T)``, when ``chunk_size > T``),
the same sequence for the same seed. No probe call: the arrays' shapes and
dtypes are learnt from the first real window, which ``start_epoch`` starts
reading in a background thread (``chunkstream-compat-first-<n>``), as the
original's reader thread did; the first ``get_next_chunk()`` waits for it
(recorded in :attr:`~RandomChunkLoader.stats` as that chunk's wait), raising
:class:`~chunkstream.LoaderStalledError` with the reader's stack if ``load_fn``
has not returned within the stall timeout (300 s, as ``ChunkLoader``'s). The
pipeline is built from that window and reads ahead from the second on.

A window already read ahead when ``start_epoch`` abandons an epoch was passed
to ``load_fn`` but is not delivered: at most ``prefetch + 1`` of them per
restart, the next windows of the abandoned epoch (the original's reader thread
had read ahead as well). Before the first chunk, that is the abandoned epoch's
first window if its read had begun: the read runs to its end in its thread and
its arrays are dropped; the new epoch's first read starts after it (one
``load_fn`` call at a time), and a read not yet begun is skipped.
``cleanup()`` waits at most a few seconds for a read in flight, then leaves
its (daemon) thread to finish on its own.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ._errors import ChunkLoadError, ConfigError, LoaderClosedError, LoaderStalledError
from .pipeline import ChunkLoader, LoaderConfig
from .pipeline._config import resolve_device
from .pipeline._jobs import call_with_retries  # the reader's retry rule
from .pipeline._stage import thread_stack
from .plans import RandomPlan, calculate_chunk_params
from .sources import CallableSource, FieldSpec
from .stats import LatencyStats

_READ_RETRIES = 2  # ChunkLoader's default read_retries, for the first window read here
_POLL_S = 0.1  # how often a wait for the first window looks at cleanup() and the clock
_JOIN_S = 2.0  # how long cleanup() waits for a first read in flight
_log = logging.getLogger("chunkstream.compat")

__all__ = [
    "ChunkLatencyStats",
    "PipelineChunkLoader",
    "RandomChunkLoader",
    "calculate_chunk_params",
    "create_zarr_loader",
    "sample_batch_within_chunk",
]


class RandomChunkLoader:
    """Uniform random windows ``[start, start + chunk_size)`` read ahead in a background thread.

    ``get_next_chunk()`` returns ``(data, stim)`` tensors on ``device``, then
    ``(None, None)`` once the epoch's ``num_chunks`` chunks were delivered.
    ``load_fn`` is called only for windows to deliver (see the module docstring);
    ``source`` is ``None`` until the first chunk taught the loader the shapes.
    """

    def __init__(
        self,
        load_fn: Callable[[int, int], tuple[np.ndarray, np.ndarray]],
        total_timesteps: int,
        chunk_size: int,
        device: str = "cuda",
        prefetch: int = 1,
        seed: int | None = None,
        *,
        _gpu_prefetch: int = 1,
        _align: int = 1,
        _stall_timeout: float | None = 300.0,
    ) -> None:
        if not callable(load_fn):
            raise ConfigError.bad("load_fn", load_fn, "a callable load_fn(start, end)")
        self.total_timesteps = total_timesteps
        self.chunk_size = chunk_size
        self.device = device
        self.prefetch = prefetch
        self.seed = secrets.randbits(32) if seed is None else seed
        # Everything is checked now, as the original's constructor would have failed now;
        # only the pipeline itself waits for the first window's shapes.
        self._plan = RandomPlan(
            total_timesteps=total_timesteps, chunk_size=chunk_size, align=_align, seed=self.seed
        )
        self._stall_timeout = LoaderConfig(
            chunk_size=chunk_size, prefetch=prefetch, gpu_prefetch=_gpu_prefetch, workers=1,
            stall_timeout=_stall_timeout,
        ).stall_timeout  # fmt: skip
        resolve_device(device)
        self._load_fn = load_fn
        self._gpu_prefetch = _gpu_prefetch
        self._stats = LatencyStats()
        self.source: CallableSource | None = None
        self._loader: ChunkLoader | None = None
        self._iterator: Any = None
        self._epoch = -1  # the epoch start_epoch began last
        self._pending: int | None = None  # chunks of that epoch, while the pipeline is unbuilt
        self._first: _FirstRead | None = None  # the latest first-window read started
        self._stop = threading.Event()  # set by cleanup(): first reads not begun are skipped
        self._closed = False

    def start_epoch(self, num_chunks: int) -> None:
        """Begin an epoch of ``num_chunks`` chunks; abandons any epoch in progress."""
        if self._closed:
            raise LoaderClosedError("the loader was cleaned up; create a new one")
        self._epoch += 1
        if self._loader is None:
            self._pending = num_chunks  # the pipeline waits for the first window's shapes
            self._iterator = iter(())
            previous = self._first
            if previous is not None:
                previous.cancel.set()  # its epoch is abandoned; a read begun runs to its end
            if num_chunks > 0:
                self._first = _FirstRead(
                    self._load_fn, self._plan.window(self._epoch, 0), previous, self._stop,
                    self._epoch,
                )  # fmt: skip
            return
        self._iterator = self._loader.epoch(num_chunks)

    def _await_first(self, first: _FirstRead) -> tuple:
        """The first window's arrays, once its read ends; a bounded wait that sees cleanup()."""
        begin = time.perf_counter()
        while not first.done.wait(_POLL_S):
            if self._stop.is_set():
                raise LoaderClosedError("the loader was cleaned up while waiting for a chunk")
            timeout = self._stall_timeout
            if timeout is not None and time.perf_counter() - begin >= timeout:
                start, end = first.window
                stacks = [s for s in (first.stack(), first.after_stack()) if s]
                raise LoaderStalledError(
                    f"load_fn({start}, {end}) did not return within {timeout:.1f} s "
                    "(stall_timeout); the loader is shut down. Stuck reader:\n"
                    + ("\n".join(stacks) or "(its thread has just ended)"),
                    window=first.window,
                )
        if first.error is not None:
            raise first.error
        if first.arrays is None:  # skipped: cleanup() ran before it began
            raise LoaderClosedError("the loader was cleaned up while waiting for a chunk")
        return first.arrays

    def _build(self, num_chunks: int, first: _FirstRead) -> None:
        """Wait for the epoch's first window, learn the shapes from it, start the pipeline."""
        start, end = first.window
        arrays = self._await_first(first)
        if not isinstance(arrays, (tuple, list)) or len(arrays) != 2:
            got = len(arrays) if isinstance(arrays, (tuple, list)) else type(arrays).__name__
            raise ChunkLoadError(
                f"load_fn({start}, {end}) returned {got!r} values, expected a pair "
                "(data, stim) of numpy arrays.",
                window=(start, end),
            )
        specs = {
            name: FieldSpec(tuple(np.shape(a)[1:]), np.asarray(a).dtype)
            for name, a in zip(("data", "stim"), arrays, strict=True)
        }
        self.source = CallableSource(
            _FirstWindow(self._load_fn, (start, end), tuple(arrays)),
            self.total_timesteps,
            names=("data", "stim"),
            specs=specs,
        )
        self._loader = ChunkLoader(
            self.source,
            self.chunk_size,
            device=self.device,
            prefetch=self.prefetch,
            gpu_prefetch=self._gpu_prefetch,
            workers=1,
            sampling=self._plan,
            stats=self._stats,
            stall_timeout=self._stall_timeout,
            # The original never sharded: under torchrun every rank reads the whole
            # sequence itself (and the first window above is (epoch, 0) on every rank).
            rank=0,
            world_size=1,
        )
        self._loader.load_state_dict({"epoch": self._epoch, "step": 0})
        self._iterator = self._loader.epoch(num_chunks)

    def _next(self):
        if self._closed and self._loader is None:
            raise LoaderClosedError("the loader was cleaned up (or its first read failed)")
        if self._iterator is None:
            raise RuntimeError("call start_epoch(num_chunks) before get_next_chunk()")
        if self._pending is not None:
            num_chunks, self._pending = self._pending, None
            if num_chunks > 0:
                asked = time.perf_counter()
                first, self._first = self._first, None
                try:
                    self._build(num_chunks, first)
                except BaseException:
                    self._closed = True  # as the pipeline shuts down after a failed read
                    self._stop.set()
                    raise
                chunk = next(self._iterator, None)
                # The pipeline answered this window from the arrays read in the background:
                # its record gets that read's times and the caller's whole wait.
                record = self._stats.chunks[-1]
                record.read_begin, record.read_end = first.read_begin, first.read_end
                record.read_s = first.read_end - first.read_begin
                record.wait_s = record.received - asked
                return chunk
        return next(self._iterator, None)

    def get_next_chunk(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The next chunk as ``(data, stim)`` on ``device``; ``(None, None)`` after the epoch's last.

        Raises :class:`~chunkstream.ChunkLoadError` if a read failed (it never hangs).
        """
        chunk = self._next()
        if chunk is None:
            return None, None
        return chunk["data"], chunk["stim"]

    def get_stats(self) -> dict[str, int]:
        """``{'chunks_loaded': int, 'chunks_transferred': int}`` since construction."""
        return {
            "chunks_loaded": self._loader._reader.completed if self._loader is not None else 0,
            "chunks_transferred": len(self._stats.chunks),
        }

    def cleanup(self) -> None:
        """Stop the background threads (idempotent); a first read in flight is waited
        for at most a few seconds (see the module docs)."""
        self._closed = True
        self._stop.set()
        first, self._first = self._first, None
        if first is not None:
            first.cancel.set()
            first.thread.join(_JOIN_S)
            if first.thread.is_alive():
                _log.warning(
                    "chunkstream: load_fn%s is still running after cleanup(); its thread %r "
                    "is left to finish on its own", first.window, first.thread.name,
                )  # fmt: skip
        if self._loader is not None:
            self._loader.close()

    @property
    def stats(self) -> LatencyStats:
        """The underlying :class:`~chunkstream.LatencyStats` (waits, reads, transfers)."""
        return self._stats

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


class _FirstRead:
    """An epoch's first window, read in a thread of its own (``chunkstream-compat-first-<n>``).

    It begins once ``after`` (the abandoned epoch's first read, if any) has ended, so
    ``load_fn`` is never called twice at once, and is skipped if ``cancel`` (its own
    epoch abandoned) or ``stop`` (cleanup) is set by then. ``done`` is set when it ends,
    with ``arrays`` or ``error`` (a ``ChunkLoadError``) filled in, or neither if skipped.
    """

    def __init__(
        self, load_fn, window: tuple[int, int], after: _FirstRead | None,
        stop: threading.Event, epoch: int,
    ) -> None:  # fmt: skip
        self.window = window
        self.after = after
        self.cancel = threading.Event()
        self.done = threading.Event()
        self.arrays: tuple | None = None
        self.error: BaseException | None = None
        self.read_begin = self.read_end = time.perf_counter()
        self.thread = threading.Thread(
            target=self._run, args=(load_fn, stop), name=f"chunkstream-compat-first-{epoch}",
            daemon=True,  # a hung load_fn must not keep the interpreter from exiting
        )  # fmt: skip
        self.thread.start()

    def _run(self, load_fn, stop: threading.Event) -> None:
        try:
            after = self.after
            while after is not None and not after.done.wait(_POLL_S):
                if stop.is_set():
                    return
            self.after = None  # nothing more to wait for (and no chain of dead reads kept)
            if self.cancel.is_set() or stop.is_set():
                return
            self.read_begin = time.perf_counter()
            self.arrays = _read_first(load_fn, *self.window)
        except BaseException as exc:  # thread boundary: handed to get_next_chunk
            self.error = exc
        finally:
            self.read_end = time.perf_counter()
            self.done.set()

    def stack(self) -> str | None:
        return thread_stack(self.thread, f"load_fn{self.window}")

    def after_stack(self) -> str | None:
        after = self.after
        if after is None:
            return None
        return thread_stack(after.thread, f"load_fn{after.window}, abandoned")


class _FirstWindow:
    """``load_fn`` that answers its first window from arrays already read, once.

    The compat loader reads the first window itself to learn the shapes; handing
    those arrays to the pipeline keeps ``load_fn`` at one call per delivered window.
    """

    def __init__(self, load_fn, window: tuple[int, int], arrays: tuple[np.ndarray, ...]) -> None:
        self._load_fn = load_fn
        self._window: tuple[int, int] | None = window
        self._arrays = arrays

    def __call__(self, start: int, end: int):
        if (start, end) == self._window:
            arrays, self._window, self._arrays = self._arrays, None, ()
            return arrays
        return self._load_fn(start, end)

    @property
    def source(self):
        # create_zarr_loader's load_fn carries its source; keep it reachable.
        return getattr(self._load_fn, "source", None)


def _read_first(load_fn, start: int, end: int):
    """``load_fn(start, end)`` with the pipeline's retries and its error (a ``ChunkLoadError``)."""
    try:
        return call_with_retries(lambda: load_fn(start, end), _READ_RETRIES, (start, end))
    except Exception as exc:
        raise ChunkLoadError(
            f"reading window [{start}, {end}) of load_fn failed: {type(exc).__name__}: {exc}",
            window=(start, end),
        ) from exc


class PipelineChunkLoader(RandomChunkLoader):
    """As :class:`RandomChunkLoader`, with starts a multiple of ``time_units``.

    ``get_next_chunk()`` returns ``(start, data, stim)``, then ``(None, None, None)``.
    """

    def __init__(
        self,
        load_fn: Callable[[int, int], tuple[np.ndarray, np.ndarray]],
        total_timesteps: int,
        chunk_size: int,
        device: str = "cuda",
        prefetch: int = 1,
        seed: int | None = None,
        time_units: int = 1,
        gpu_prefetch: int = 1,
        *,
        _stall_timeout: float | None = 300.0,
    ) -> None:
        self.time_units = time_units
        super().__init__(
            load_fn,
            total_timesteps,
            chunk_size,
            device=device,
            prefetch=prefetch,
            seed=seed,
            _gpu_prefetch=gpu_prefetch,
            _align=time_units,
            _stall_timeout=_stall_timeout,
        )

    def get_next_chunk(self):  # type: ignore[override]
        """The next chunk as ``(start, data, stim)``; ``(None, None, None)`` after the epoch's last."""
        chunk = self._next()
        if chunk is None:
            return None, None, None
        return chunk.start, chunk["data"], chunk["stim"]


def sample_batch_within_chunk(
    chunk_data: torch.Tensor,
    chunk_stim: torch.Tensor,
    wmat_indices: Any,
    wmat_indptr: Any,
    batch_size: int,
    total_steps: int,
    num_neurons_to_zero: int,
    device: str | torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random batch starts inside a chunk, plus the original's neuron-zeroing augmentation.

    Returns ``(batch_indices, selected_neurons, needed_indices)``: ``batch_size``
    starts uniform in ``[0, chunk_len - total_steps)``; if ``num_neurons_to_zero > 0``,
    that many random neurons and the sorted unique union of them with their CSR
    neighbours; else two empty long tensors.
    """
    del chunk_stim
    chunk_len = int(chunk_data.shape[0])
    high = chunk_len - int(total_steps)
    if high <= 0:
        raise ConfigError(
            f"total_steps={total_steps} does not fit in a chunk of {chunk_len} timesteps: "
            "batch starts are drawn from [0, chunk_len - total_steps), which is empty. "
            "Use a larger chunk_size or a shorter rollout."
        )
    batch_indices = torch.randint(0, high, (int(batch_size),), device=device)
    if num_neurons_to_zero <= 0:
        empty = torch.empty(0, dtype=torch.long, device=device)
        return batch_indices, empty, empty.clone()
    from .consumer import neighbour_union

    num_neurons = int(chunk_data.shape[1])
    selected = torch.randperm(num_neurons, device=device)[: int(num_neurons_to_zero)]
    needed = neighbour_union(selected, wmat_indices, wmat_indptr)
    return batch_indices, selected, needed


class ChunkLatencyStats:
    """The original's latency recorder: seconds in, milliseconds in the summary."""

    def __init__(self) -> None:
        self.chunk_get_times: list[float] = []
        self.batch_forward_times: list[float] = []
        self.batch_backward_times: list[float] = []
        self.batch_step_times: list[float] = []

    def record_chunk_get(self, seconds: float) -> None:
        """Record one wait for ``get_next_chunk``, in seconds."""
        self.chunk_get_times.append(float(seconds))

    def record_batch_times(self, forward: float, backward: float, step: float) -> None:
        """Record one batch's forward, backward and optimizer-step times, in seconds."""
        self.batch_forward_times.append(float(forward))
        self.batch_backward_times.append(float(backward))
        self.batch_step_times.append(float(step))

    def get_summary(self) -> dict[str, float | int]:
        """Means/max/min in ms and counts under the original keys; 0.0 where nothing was recorded."""

        def ms(values: list[float], reduce: Callable[[list[float]], float]) -> float:
            return float(reduce(values)) * 1e3 if values else 0.0

        return {
            "chunk_get_mean_ms": ms(self.chunk_get_times, np.mean),
            "chunk_get_max_ms": ms(self.chunk_get_times, max),
            "chunk_get_min_ms": ms(self.chunk_get_times, min),
            "batch_forward_mean_ms": ms(self.batch_forward_times, np.mean),
            "batch_backward_mean_ms": ms(self.batch_backward_times, np.mean),
            "batch_step_mean_ms": ms(self.batch_step_times, np.mean),
            "num_chunks": len(self.chunk_get_times),
            "num_batches_sampled": len(self.batch_forward_times),
        }

    def print_summary(self) -> None:
        """Print the summary as a small table (this API prints by contract)."""
        summary = self.get_summary()
        width = max(len(k) for k in summary)
        print("chunk latency summary")
        for key, value in summary.items():
            text = f"{value:.3f}" if isinstance(value, float) else str(value)
            print(f"  {key:<{width}}  {text}")


def create_zarr_loader(
    data_path: str, column_idx: int, stim_column_idx: int, num_stim_dims: int
) -> Callable[[int, int], tuple[np.ndarray, np.ndarray]]:
    """``load_fn(start, end) -> (data, stim)`` over a FlyVis store, opened once."""
    from . import flyvis

    return flyvis.make_load_fn(data_path, column_idx, stim_column_idx, num_stim_dims)
