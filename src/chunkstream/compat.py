"""Drop-in replacements for the original implementation's API (change one import).

Signatures and return values match the original (see DESIGN.md, "Drop-in
compatibility"); the machinery underneath is the public
:class:`~chunkstream.ChunkLoader`, fed by a :class:`~chunkstream.CallableSource`
over ``load_fn``.

**The same windows as the original.** Each loader keeps one
``random.Random(seed)`` and takes one draw per chunk the original would have
loaded, across epochs: ``randint(0, max(0, T - chunk_size))`` for
:class:`RandomChunkLoader`, ``randint(0, n_valid - 1) * time_units`` for
:class:`PipelineChunkLoader`. An epoch's chunk ``k`` is the draw after those
the earlier epochs consumed, so the same seed gives the same ``load_fn`` calls
in the same order. An epoch drained to its end consumed its ``num_chunks``
draws. An epoch abandoned by ``start_epoch`` after ``d`` chunks consumed
``min(num_chunks, d + depth)``: what the original's reader had loaded once it
had filled its queues, ``depth = prefetch + 1`` for ``RandomChunkLoader`` (its
queue and the chunk blocked on ``put``) and ``prefetch + gpu_prefetch + 2`` for
``PipelineChunkLoader`` (both queues and a chunk held by each thread). That is
the original's count whenever its reader was ahead of the training loop, the
usual case; a restart that came before the reader had filled its queues (e.g.
``start_epoch`` twice in a row) consumed fewer draws there, a number that
depended on thread timing, and compat then still counts ``d + depth``.

**load_fn** is called as the original calls it: only for windows of the
draws above, each ``chunk_size`` long (the whole data, ``(0, T)``, when
``chunk_size > T``). No probe call: the arrays' shapes and dtypes are learnt
from the first real window, which ``start_epoch`` starts reading in a
background thread (``chunkstream-compat-first-<epoch>``), as the original's
reader thread did; the first ``get_next_chunk()`` waits for it with a bounded
wait and then builds the pipeline, which answers that window from the arrays
already read and reads ahead from the second on.

**Where compat deliberately differs from the original:**

* a ``load_fn`` error raises :class:`~chunkstream.ChunkLoadError` in
  ``get_next_chunk`` (its ``__cause__`` the original exception) and shuts the
  loader down, where the original hung forever; a later call raises
  :class:`~chunkstream.LoaderClosedError`;
* a ``load_fn`` that does not return within the stall timeout (300 s) raises
  :class:`~chunkstream.LoaderStalledError` with the reader's stack instead of
  blocking forever;
* ``start_epoch`` mid-epoch abandons the old epoch at once: no 2 s join, and
  no stale end-of-epoch marker that made the new epoch yield nothing;
* windows read ahead for an abandoned epoch (at most the pipeline's read-ahead,
  ``prefetch + 1`` on the CPU) were passed to ``load_fn`` and are dropped; a
  first read already begun when its epoch is abandoned runs to its end, and
  the next epoch's first read starts after it (one ``load_fn`` call at a time);
* a failed read is retried like ``ChunkLoader``'s reads (transient I/O errors,
  twice), except the first window of the loader's first delivered epoch, read
  before the pipeline exists;
* ``get_stats()['chunks_transferred']`` counts chunks delivered this epoch for
  both loaders (the original ``PipelineChunkLoader`` counted copies to the
  device, up to ``gpu_prefetch + 1`` ahead), and ``chunks_loaded`` counts
  ``load_fn`` calls of this epoch that returned, which depends on compat's
  read-ahead, not the original's;
* under torchrun every rank reads the whole, unsharded sequence, as the
  original did, and pinned host memory is a fixed pool, not a copy per chunk;
* ``ChunkLatencyStats.print_summary`` prints a table of the summary's keys;
* ``cleanup()`` also closes the store that :func:`create_zarr_loader` opened,
  once no other live compat loader uses it (it reopens on its next call); a
  ``load_fn`` still running after a few seconds is left to finish in its
  daemon thread.
"""

from __future__ import annotations

import functools
import logging
import random
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, wait
from concurrent.futures import TimeoutError as FutureTimeout
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ._errors import ChunkLoadError, ConfigError, LoaderClosedError, LoaderStalledError
from .pipeline import ChunkLoader, LoaderConfig, resolve_device
from .plans import RandomPlan, calculate_chunk_params
from .sources import CallableSource, FieldSpec
from .stats import LatencyStats

_POLL_S = 0.1  # how often the wait for the first window looks at cleanup() and the clock
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


class _OriginalDraws:
    """A :class:`~chunkstream.WindowPlan` holding the original's window sequence.

    Draw ``k`` is the ``k``-th ``randint`` of ``random.Random(seed)`` (see the
    module docstring); ``begin(epoch, draw)`` says that the loader's epoch
    ``epoch`` starts at draw ``draw``, so ``window(epoch, index)`` is draw
    ``draw + index``. Draws are made on demand, in order, under a lock; a
    registered window never changes, so the answers are pure and thread-safe.
    """

    windows_per_pass = None  # drawn with replacement: no natural pass

    def __init__(self, total_timesteps: int, chunk_size: int, units: int, seed: Any) -> None:
        self.total_timesteps = total_timesteps
        self.chunk_size = chunk_size
        # The original's bound: the last start that fits, rounded down to ``units``.
        self.max_start = (max(0, total_timesteps - chunk_size) // units) * units
        self._units = units
        try:
            self._rng = random.Random(seed)
        except TypeError as exc:
            raise ConfigError.bad("seed", seed, "an int, str, bytes or None") from exc
        self._starts: list[int] = []
        self._first: dict[int, int] = {}
        self._lock = threading.Lock()

    def begin(self, epoch: int, draw: int) -> None:
        self._first[epoch] = draw

    def draw(self, k: int) -> tuple[int, int]:
        """The window of draw ``k`` (drawing up to it if needed)."""
        with self._lock:
            while len(self._starts) <= k:
                self._starts.append(self._rng.randint(0, self.max_start // self._units) * self._units)
            start = self._starts[k]
        return start, min(start + self.chunk_size, self.total_timesteps)

    def window(self, epoch: int, index: int) -> tuple[int, int]:
        return self.draw(self._first[epoch] + index)

    def windows(self, epoch: int, indices: np.ndarray) -> np.ndarray:
        rows = [self.window(epoch, int(i)) for i in np.asarray(indices).reshape(-1)]
        return np.asarray(rows, dtype=np.int64).reshape(-1, 2)

    def rank_window(
        self, epoch: int, step: int, rank: int = 0, world_size: int = 1
    ) -> tuple[int, int]:
        return self.window(epoch, step * world_size + rank)


@dataclass
class _Epoch:
    """One ``start_epoch`` call: its place in the draws and what it delivered."""

    index: int
    first_draw: int
    num_chunks: int
    delivered: int = 0
    loaded: int = 0  # load_fn calls for this epoch that returned


class _Claims:
    """The ``create_zarr_loader`` functions one compat loader has called."""

    def __init__(self) -> None:
        self.users: set[_ZarrLoadFn] = set()


# The compat loader on whose behalf this thread is calling load_fn (None: a direct call).
_CALLER: ContextVar[_Claims | None] = ContextVar("chunkstream_compat_caller", default=None)


class RandomChunkLoader:
    """Uniform random windows ``[start, start + chunk_size)`` read ahead in a background thread.

    ``get_next_chunk()`` returns ``(data, stim)`` tensors on ``device``, then
    ``(None, None)`` once the epoch's ``num_chunks`` chunks were delivered.
    Windows and ``load_fn`` calls follow the original's draws (see the module
    docstring); ``device`` is a :class:`torch.device`; ``source`` is ``None``
    until the first chunk taught the loader the shapes.
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
        # Everything is checked now, as the original's constructor would have failed now;
        # only the pipeline itself waits for the first window's shapes.
        RandomPlan(total_timesteps=total_timesteps, chunk_size=chunk_size)
        if isinstance(_align, bool) or not isinstance(_align, int) or _align < 1:
            raise ConfigError.bad("time_units", _align, "an int >= 1", "Use 1 for no alignment.")
        self._config = LoaderConfig(
            chunk_size=chunk_size, prefetch=prefetch, gpu_prefetch=_gpu_prefetch, workers=1,
            stall_timeout=_stall_timeout,
        )  # fmt: skip
        self._device = resolve_device(device)
        self.load_fn = load_fn
        self.total_timesteps = total_timesteps
        self.chunk_size = chunk_size
        # As the original: a torch.device, "cuda" left without an index.
        self.device = torch.device(device) if isinstance(device, str) else device
        self.prefetch = prefetch
        self.seed = seed
        self._draws = _OriginalDraws(total_timesteps, chunk_size, _align, seed)
        self.max_start_idx = self._draws.max_start
        # Chunks the original had loaded beyond those delivered once its reader was ahead.
        self._depth = prefetch + 1
        self._stats = LatencyStats()
        self._claims = _Claims()
        self.source: CallableSource | None = None
        self._loader: ChunkLoader | None = None
        self._loader_epochs = 0  # epoch() calls made on the loader
        self._iterator: Any = None
        self._epoch: _Epoch | None = None
        self._first: tuple[tuple[int, int], Future, threading.Thread] | None = None
        self._first_arrays: tuple[tuple[int, int], tuple] | None = None
        self._first_read_times = (0.0, 0.0)  # perf_counter span of the first read delivered
        self._closed = False

    # -- epochs -----------------------------------------------------------------------

    def start_epoch(self, num_chunks: int) -> None:
        """Begin an epoch of ``num_chunks`` chunks; abandons any epoch in progress."""
        if self._closed:
            raise LoaderClosedError("the loader was cleaned up; create a new one")
        if isinstance(num_chunks, bool) or not isinstance(num_chunks, int) or num_chunks < 0:
            raise ConfigError.bad(
                "num_chunks", num_chunks, "an int >= 0", "Use calculate_chunk_params(...)[0]."
            )
        previous = self._epoch
        if previous is None:
            epoch = _Epoch(0, 0, num_chunks)
        else:
            consumed = min(previous.num_chunks, previous.delivered + self._depth)
            epoch = _Epoch(previous.index + 1, previous.first_draw + consumed, num_chunks)
        self._epoch = epoch
        if self._loader is not None:
            self._draws.begin(self._loader_epochs, epoch.first_draw)
            self._loader_epochs += 1
            self._iterator = self._loader.epoch(num_chunks)
            return
        # No pipeline yet: read the epoch's first window in the background.
        after = None
        if self._first is not None:
            _, after, _ = self._first
            after.cancel()  # its epoch is abandoned; a read already begun runs to its end
            self._first = None
        if num_chunks > 0:
            window = self._draws.draw(epoch.first_draw)
            self._first = (window, *_in_background(
                lambda: self._timed_call(epoch, *window),
                name=f"chunkstream-compat-first-{epoch.index}", after=after,
            ))  # fmt: skip

    def _timed_call(self, epoch: _Epoch, start: int, end: int) -> tuple[tuple, float, float]:
        begin = time.perf_counter()
        arrays = self._call(epoch, start, end)
        return arrays, begin, time.perf_counter()

    def _call(self, epoch: _Epoch, start: int, end: int):
        """``load_fn(start, end)``, counted for ``epoch``; a store it opens is this loader's."""
        token = _CALLER.set(self._claims)
        try:
            arrays = self.load_fn(start, end)
        finally:
            _CALLER.reset(token)
        epoch.loaded += 1
        return arrays

    def _read(self, start: int, end: int):
        """The pipeline's ``load_fn``: the first window from the arrays already read, once.

        One reader worker, so no two calls run at once.
        """
        first = self._first_arrays
        if first is not None and first[0] == (start, end):
            self._first_arrays = None
            return first[1]
        return self._call(self._epoch, start, end)

    def _await_first(self, window: tuple[int, int], future: Future, thread: threading.Thread):
        """The first window's ``(arrays, begin, end)``; a bounded wait that sees cleanup()."""
        begin = time.perf_counter()
        timeout = self._config.stall_timeout
        while True:
            try:
                return future.result(timeout=_POLL_S)
            except FutureTimeout:
                pass
            except Exception as exc:
                start, end = window
                raise ChunkLoadError(
                    f"reading window [{start}, {end}) of load_fn failed: "
                    f"{type(exc).__name__}: {exc}",
                    window=window,
                ) from exc
            if self._closed:
                raise LoaderClosedError("the loader was cleaned up while waiting for a chunk")
            if timeout is not None and time.perf_counter() - begin >= timeout:
                raise LoaderStalledError(
                    f"load_fn{window} did not return within {timeout:.1f} s (stall_timeout); "
                    "the loader is shut down. Stuck reader:\n"
                    + (_stack(thread) or "(its thread has just ended)"),
                    window=window,
                )

    def _build(self, epoch: _Epoch) -> None:
        """Wait for the epoch's first window, learn the shapes from it, start the pipeline."""
        window, future, thread = self._first
        arrays, read_begin, read_end = self._await_first(window, future, thread)
        self._first = None
        if not isinstance(arrays, (tuple, list)) or len(arrays) != 2:
            got = len(arrays) if isinstance(arrays, (tuple, list)) else type(arrays).__name__
            raise ChunkLoadError(
                f"load_fn{window} returned {got!r} values, expected a pair "
                "(data, stim) of numpy arrays.",
                window=window,
            )
        specs = {
            name: FieldSpec(tuple(np.shape(a)[1:]), np.asarray(a).dtype)
            for name, a in zip(("data", "stim"), arrays, strict=True)
        }
        self.source = CallableSource(
            self._read, self.total_timesteps, names=("data", "stim"), specs=specs
        )
        self._first_arrays = (window, tuple(arrays))
        self._loader = ChunkLoader(
            self.source,
            self.chunk_size,
            device=self._device,
            prefetch=self._config.prefetch,
            gpu_prefetch=self._config.gpu_prefetch,
            workers=1,  # one load_fn call at a time, in window order, as the original
            sampling=self._draws,
            stats=self._stats,
            stall_timeout=self._config.stall_timeout,
            # The original never sharded: under torchrun every rank reads the whole sequence.
            rank=0,
            world_size=1,
        )
        self._draws.begin(0, epoch.first_draw)
        self._loader_epochs = 1
        self._iterator = self._loader.epoch(epoch.num_chunks)
        self._first_read_times = (read_begin, read_end)

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
                self._build(epoch)
                chunk = next(self._iterator, None)
            except BaseException:
                self._closed = True  # as the pipeline shuts down after a failed read
                raise
            # The pipeline answered this window from the arrays read in the background:
            # its record gets that read's times and the caller's whole wait.
            record = self._stats.chunks[-1]
            record.read_begin, record.read_end = self._first_read_times
            record.read_s = record.read_end - record.read_begin
            record.wait_s = record.received - asked
        else:
            chunk = next(self._iterator, None)
        if chunk is not None:
            epoch.delivered += 1
        return chunk

    def get_next_chunk(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The next chunk as ``(data, stim)`` on ``device``; ``(None, None)`` after the epoch's last.

        Raises :class:`~chunkstream.ChunkLoadError` if a read failed (it never hangs).
        """
        chunk = self._next()
        if chunk is None:
            return None, None
        return chunk["data"], chunk["stim"]

    def get_stats(self) -> dict[str, int]:
        """``{'chunks_loaded': int, 'chunks_transferred': int}`` for the current epoch.

        ``chunks_transferred`` counts chunks delivered by ``get_next_chunk`` since
        the last ``start_epoch``; ``chunks_loaded`` counts that epoch's ``load_fn``
        calls that returned (delivered and read ahead).
        """
        epoch = self._epoch
        if epoch is None:
            return {"chunks_loaded": 0, "chunks_transferred": 0}
        return {"chunks_loaded": epoch.loaded, "chunks_transferred": epoch.delivered}

    # -- shutdown ---------------------------------------------------------------------

    def cleanup(self) -> None:
        """Stop the background threads and close what this loader opened (idempotent).

        A first read in flight is waited for at most a few seconds, then left to
        finish in its daemon thread. A store opened by :func:`create_zarr_loader`
        is closed once no other live compat loader uses it.
        """
        self._closed = True
        busy = []
        if self._first is not None:
            window, future, thread = self._first
            self._first = None
            future.cancel()  # a read not yet begun is skipped
            thread.join(_JOIN_S)
            if thread.is_alive():
                busy.append(thread)
                _log.warning(
                    "chunkstream: load_fn%s is still running after cleanup(); its thread %r "
                    "is left to finish on its own", window, thread.name,
                )  # fmt: skip
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
    """``call()`` in a daemon thread named ``name``, begun once ``after`` is done.

    Returns ``(future, thread)``; the future holds the result or the exception.
    A future cancelled before its call begins skips it. A daemon thread, not an
    executor's: a ``load_fn`` that never returns must not keep the process alive.
    """
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


def _stack(thread: threading.Thread) -> str:
    """``thread``'s current stack, for a stall error; empty if it has ended."""
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None:
        return ""
    return f"thread {thread.name!r}:\n" + "".join(traceback.format_stack(frame))


class PipelineChunkLoader(RandomChunkLoader):
    """As :class:`RandomChunkLoader`, with starts a multiple of ``time_units``.

    ``get_next_chunk()`` returns ``(start, data, stim)``, then ``(None, None, None)``.
    """

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
        self.time_units = time_units
        self.gpu_prefetch = gpu_prefetch
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
        # The original's reader and transfer threads each held a chunk beyond their queues.
        self._depth = prefetch + gpu_prefetch + 2

    def get_next_chunk(self):  # type: ignore[override]
        """The next chunk as ``(start, data, stim)``; ``(None, None, None)`` after the epoch's last."""
        chunk = self._next()
        if chunk is None:
            return None, None, None
        return chunk.start, chunk["data"], chunk["stim"]


def _also_chunk_stim(function):
    """Accept the keyword ``chunk_stim=`` (the integration guide's name) for ``_chunk_stim=``."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        if "chunk_stim" in kwargs:
            if "_chunk_stim" in kwargs or len(args) > 1:
                raise TypeError(
                    "sample_batch_within_chunk() got the stimulus twice (_chunk_stim and chunk_stim)"
                )
            kwargs["_chunk_stim"] = kwargs.pop("chunk_stim")
        return function(*args, **kwargs)

    return wrapper


@_also_chunk_stim
def sample_batch_within_chunk(
    chunk_data: torch.Tensor,
    _chunk_stim: torch.Tensor,
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
    that many neurons drawn uniformly with replacement (so repeats are possible,
    and more than the chunk has may be asked for) and the sorted unique union of
    them with their CSR neighbours; else two empty long tensors. The draws are the
    original's ``torch.randint`` calls, so the same torch seed gives the same
    tensors. The stimulus may be passed as ``_chunk_stim=`` or ``chunk_stim=``; it
    is not used.
    """
    chunk_len = int(chunk_data.shape[0])
    high = chunk_len - int(total_steps)
    if high <= 0:
        raise ConfigError(
            f"total_steps={total_steps} does not fit in a chunk of {chunk_len} timesteps: "
            "batch starts are drawn from [0, chunk_len - total_steps), which is empty. "
            "Use a larger chunk_size or a shorter rollout."
        )
    batch_indices = torch.randint(low=0, high=high, size=(int(batch_size),), device=device)
    if num_neurons_to_zero <= 0:
        empty = torch.empty(0, dtype=torch.long, device=device)
        return batch_indices, empty, empty.clone()
    from .consumer import neighbour_union

    num_neurons = int(chunk_data.shape[1])
    selected = torch.randint(
        low=0, high=num_neurons, size=(int(num_neurons_to_zero),), device=device
    )
    needed = neighbour_union(selected, wmat_indices, wmat_indptr)
    return batch_indices, selected, needed


@dataclass
class ChunkLatencyStats:
    """The original's latency recorder: seconds in, milliseconds in the summary.

    ``chunk_load_times`` and ``chunk_transfer_times`` are kept for code that
    appends to them; the summary, as the original's, reads the other lists.
    """

    chunk_load_times: list[float] = field(default_factory=list)
    chunk_transfer_times: list[float] = field(default_factory=list)
    chunk_get_times: list[float] = field(default_factory=list)
    batch_forward_times: list[float] = field(default_factory=list)
    batch_backward_times: list[float] = field(default_factory=list)
    batch_step_times: list[float] = field(default_factory=list)

    def record_chunk_get(self, duration_s: float) -> None:
        """Record one wait for ``get_next_chunk``, in seconds."""
        self.chunk_get_times.append(float(duration_s))

    def record_batch_times(self, forward_s: float, backward_s: float, step_s: float) -> None:
        """Record one batch's forward, backward and optimizer-step times, in seconds."""
        self.batch_forward_times.append(float(forward_s))
        self.batch_backward_times.append(float(backward_s))
        self.batch_step_times.append(float(step_s))

    def get_summary(self) -> dict[str, float]:
        """Means/max/min in ms and counts under the original keys, all floats as the
        original's; 0.0 where nothing was recorded."""

        def ms(values: list[float], reduce: Callable[[list[float]], float]) -> float:
            return float(reduce(values)) * 1e3 if values else 0.0

        return {
            "chunk_get_mean_ms": ms(self.chunk_get_times, np.mean),
            "chunk_get_max_ms": ms(self.chunk_get_times, max),
            "chunk_get_min_ms": ms(self.chunk_get_times, min),
            "batch_forward_mean_ms": ms(self.batch_forward_times, np.mean),
            "batch_backward_mean_ms": ms(self.batch_backward_times, np.mean),
            "batch_step_mean_ms": ms(self.batch_step_times, np.mean),
            "num_chunks": float(len(self.chunk_get_times)),
            "num_batches_sampled": float(len(self.batch_forward_times)),
        }

    def print_summary(self) -> None:
        """Print the summary as a small table (this API prints by contract)."""
        summary = self.get_summary()
        width = max(len(k) for k in summary)
        print("chunk latency summary")
        for key, value in summary.items():
            text = f"{value:.3f}" if key.endswith("_ms") else str(int(value))
            print(f"  {key:<{width}}  {text}")


class _ZarrLoadFn:
    """:func:`create_zarr_loader`'s ``load_fn``: a FlyVis store, open while in use.

    The store is opened at creation (a bad path fails there). Every compat
    loader that calls it claims it, through the wrapper it calls it from (a
    lambda around it included); when the last claimant's ``cleanup()`` releases
    it and no call is in flight, the store and its decode threads are closed.
    A later call reopens it. Thread-safe.
    """

    def __init__(self, open_fn: Callable[[], Callable]) -> None:
        self._open_fn = open_fn
        self._fn = open_fn()
        self._open = True
        self._users: set[_Claims] = set()
        self._in_flight = 0
        self._close_pending = False  # released by its last claimant while a call ran
        self._lock = threading.Lock()

    @property
    def source(self):
        """The :class:`~chunkstream.ZarrSource` it reads (``source.close()`` closes it)."""
        return self._fn.source

    def __call__(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        claims = _CALLER.get()
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

    def release(self, claims: _Claims) -> None:
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

    The compat loaders that call it (directly or through a wrapper) close its
    store in their ``cleanup()``, once none of them uses it any more; it
    reopens on its next call. ``load_fn.source`` is the open
    :class:`~chunkstream.ZarrSource`.
    """
    from . import flyvis

    return _ZarrLoadFn(
        lambda: flyvis.make_load_fn(data_path, column_idx, stim_column_idx, num_stim_dims)
    )
