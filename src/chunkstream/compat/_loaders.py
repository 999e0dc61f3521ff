"""The drop-in loaders: the original's window draws, streamed by :class:`~chunkstream.ChunkLoader`.

The first ``start_epoch`` builds a :class:`~chunkstream.ChunkLoader` over a
:class:`~chunkstream.CallableSource` of ``load_fn`` that learns the arrays' shapes
from the first window it reads (``specs="first"``); every epoch is then a
``ChunkLoader.epoch()`` call. Until a chunk was delivered, an epoch starts as a
one-chunk epoch (only its first window is read ahead) and goes on with
``epoch(n, at=1)`` once that chunk arrives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch

from .._errors import ConfigError, LoaderClosedError, check_int
from ..pipeline import Chunk, ChunkLoader, LoaderOptions, ResolvedSettings, resolve_device
from ..plans import RandomPlan
from ..sources import CallableSource
from ..stats import LatencyStats
from ._draws import Epoch, OriginalDraws
from ._helpers import CALLER, Claims

__all__ = ["GuideRandomChunkLoader", "PipelineChunkLoader", "RandomChunkLoader"]

_CLOSE_S = 2.0  # how long cleanup() waits for a load_fn call in flight, as the original's join
_CLOSED = "the loader was cleaned up (or a read failed); create a new one"


class GuideRandomChunkLoader:
    """The integration guide's loader (NeuralGraph commit b4c18b94): random windows
    ``[start, start + chunk_size)`` read ahead in a background thread.

    ``get_next_chunk()`` returns ``(data, stim)`` tensors on ``device``, then
    ``(None, None)`` once the epoch's ``num_chunks`` chunks were delivered; starts are
    ``randint(0, max(0, T - chunk_size))`` of one ``random.Random(seed)``, and
    ``load_fn`` calls follow those draws (see the package docs). ``device`` is a
    :class:`torch.device`; ``source`` is the :class:`~chunkstream.CallableSource` the
    loader reads (its ``fields`` are ``None`` until the first window was read).
    The loaders of the merged code, :class:`RandomChunkLoader` and
    :class:`PipelineChunkLoader`, share all of this and return the start too.
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
        _pipelined: bool = False,
    ) -> None:
        if not callable(load_fn):
            raise ConfigError.bad("load_fn", load_fn, "a callable load_fn(start, end)")
        # Everything is checked now, as the original's constructor would have failed now.
        RandomPlan(total_timesteps=total_timesteps, chunk_size=chunk_size)
        check_int("time_units", _align, 1, "Use 1 for no alignment.", expected="an int >= 1")
        config = ResolvedSettings(
            chunk_size=chunk_size,
            prefetch=prefetch,
            workers=1,
            gpu_prefetch=_gpu_prefetch,
            stall_timeout=_stall_timeout,
            close_timeout=_CLOSE_S,
        )
        self._device = resolve_device(device)
        # Chunks the original had loaded beyond those delivered once its reader was ahead
        # (the pipeline loader's reader and transfer threads each held one beyond its queues).
        self._depth = prefetch + 1 + (_gpu_prefetch + 1 if _pipelined else 0)
        # One load_fn call at a time, in window order. On CUDA the copies in flight count
        # too: reads plus copies stay within the draws an abandoned epoch consumes.
        on_cuda = self._device.type == "cuda"
        slots = max(1, self._depth - _gpu_prefetch) if on_cuda else None
        self._config = dataclasses.replace(config, host_slots=slots)
        self.load_fn, self.total_timesteps, self.chunk_size = load_fn, total_timesteps, chunk_size
        # As the original: a torch.device, "cuda" left without an index.
        self.device = torch.device(device) if isinstance(device, str) else device
        self.prefetch, self.seed = prefetch, seed
        self._draws = OriginalDraws(total_timesteps, chunk_size, _align, seed)
        self.max_start_idx = self._draws.max_start
        self._stats = LatencyStats()
        self._claims = Claims()
        # load_fn's arrays become the chunk's tensors on the CPU, as the original's did.
        self.source = CallableSource(
            self._call, total_timesteps, names=("data", "stim"), specs="first", _hand_over=True
        )
        self._loader: ChunkLoader | None = None  # built by the first start_epoch
        self._loader_epochs = 0  # epoch() calls made on it
        self._iterator: object = iter(())
        self._epoch: Epoch | None = None
        self._delivered = False  # whether any chunk was ever delivered
        self._closed = False

    def start_epoch(self, num_chunks: int) -> None:
        """Begin an epoch of ``num_chunks`` chunks; abandons any epoch in progress."""
        if self._closed:
            raise LoaderClosedError(_CLOSED)
        check_int(
            "num_chunks",
            num_chunks,
            0,
            "Use calculate_chunk_params(...)[0].",
            expected="an int >= 0",
        )
        previous = self._epoch
        if previous is None:
            self._epoch = Epoch(0, 0, num_chunks)
        else:
            consumed = min(previous.num_chunks, previous.delivered + self._depth)
            self._epoch = Epoch(previous.index + 1, previous.first_draw + consumed, num_chunks)
        if self._loader is None:  # under torchrun every rank reads the whole sequence, as
            # the original did
            c = self._config
            self._loader = ChunkLoader(
                self.source,
                c.chunk_size,
                device=self._device,
                prefetch=c.prefetch,
                gpu_prefetch=c.gpu_prefetch,
                workers=c.workers,
                sampling=self._draws,
                options=LoaderOptions(
                    host_slots=c.host_slots,
                    stall_timeout=c.stall_timeout,
                    close_timeout=c.close_timeout,
                    stats=self._stats,
                    rank=0,
                    world_size=1,
                ),
            )
        self._begin(num_chunks if self._delivered else min(num_chunks, 1))

    def _begin(self, num_chunks: int, at: int = 0) -> None:
        """Start the loader's next epoch over this epoch's draws, from its step ``at``."""
        assert self._loader is not None and self._epoch is not None
        self._draws.begin(self._loader_epochs, self._epoch.first_draw)
        self._loader_epochs += 1
        self._iterator = self._loader.epoch(num_chunks, at=at)

    def _call(self, start: int, end: int):
        """``load_fn(start, end)``, counted for the epoch current when it starts; a store it
        opens is this loader's (the source's ``load_fn``, run by the reader thread)."""
        epoch = self._epoch  # the epoch the read is for, not the one current when it returns
        token = CALLER.set(self._claims)
        try:
            arrays = self.load_fn(start, end)
        finally:
            CALLER.reset(token)
        if epoch is not None:
            epoch.loaded += 1
        return arrays

    def _next(self) -> Chunk | None:
        if self._closed:
            raise LoaderClosedError(_CLOSED)
        epoch = self._epoch
        if epoch is None or self._loader is None:
            raise RuntimeError("call start_epoch(num_chunks) before get_next_chunk()")
        try:
            chunk = next(self._iterator, None)  # type: ignore[call-overload]
        except LoaderClosedError:  # shut down after a failed read, or cleaned up meanwhile
            self._closed = True
            raise LoaderClosedError(_CLOSED) from None
        except BaseException:
            self._closed = self._loader.closed
            raise
        if chunk is None:
            return None
        epoch.delivered += 1
        if not self._delivered:  # the epoch's first chunk: read the rest of it ahead now
            self._delivered = True
            if epoch.num_chunks > 1:
                self._begin(epoch.num_chunks, at=1)
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
        """Stop the background thread and close what this loader opened (idempotent).

        A ``load_fn`` call in flight is waited for at most a few seconds, then left
        to finish in its daemon thread (``ChunkLoader.close``, which warns). A store
        opened by :func:`create_zarr_loader` is closed once no other live compat
        loader uses it.
        """
        self._closed = True
        if self._loader is not None:
            self._loader.close()
            if any(t.is_alive() for t in self._loader.threads):
                return  # closing a store under a read in flight would wait for that read
        for user in list(self._claims.users):
            user.release(self._claims)

    @property
    def stats(self) -> LatencyStats:
        """The underlying :class:`~chunkstream.LatencyStats` (waits, reads, transfers)."""
        return self._stats

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


class RandomChunkLoader(GuideRandomChunkLoader):
    """The merged code's loader (NeuralGraph chunk_loader.py as of commit 3701037, which
    its training script calls): starts a multiple of ``time_units`` (drawn as the package
    docs say), ``get_next_chunk()`` gives ``(start, data, stim)``, then three ``None``."""

    def __init__(
        self,
        load_fn: Callable[[int, int], tuple[np.ndarray, np.ndarray]],
        total_timesteps: int,
        chunk_size: int,
        device: str | torch.device = "cuda",
        prefetch: int = 1,
        seed: int | None = None,
        time_units: int = 1,
        *,
        _gpu_prefetch: int = 1,
        _stall_timeout: float | None = 300.0,
        _pipelined: bool = False,
    ) -> None:
        self.time_units = time_units
        super().__init__(
            load_fn,
            total_timesteps,
            chunk_size,
            device=device,
            prefetch=prefetch,
            seed=seed,
            _gpu_prefetch=_gpu_prefetch,
            _align=time_units,
            _stall_timeout=_stall_timeout,
            _pipelined=_pipelined,
        )

    def get_next_chunk(self):  # type: ignore[override]
        """The next chunk as ``(start, data, stim)``; ``(None, None, None)`` after the epoch's last."""
        chunk = self._next()
        if chunk is None:
            return None, None, None
        return chunk.start, chunk["data"], chunk["stim"]


class PipelineChunkLoader(RandomChunkLoader):
    """As :class:`RandomChunkLoader`, with a second stage of ``gpu_prefetch`` chunks on
    the device (NeuralGraph pipeline_chunk_loader.py)."""

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
        self.gpu_prefetch = gpu_prefetch
        super().__init__(
            load_fn,
            total_timesteps,
            chunk_size,
            device=device,
            prefetch=prefetch,
            seed=seed,
            time_units=time_units,
            _gpu_prefetch=gpu_prefetch,
            _stall_timeout=_stall_timeout,
            _pipelined=True,
        )
