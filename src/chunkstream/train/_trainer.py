"""A reference trainer: a latent-dynamics model trained by streaming chunks of a source.

Usable on any source with a ``(T, N)`` data field and, optionally, a
``(T, S)`` stimulus field (``cs.flyvis.open(path)`` gives both)::

    trainer = Trainer(source, TrainConfig(epochs=10, device="cuda"), out_dir="runs/a")
    result = trainer.fit()            # fit(resume=True) continues a killed run

Per chunk it draws ``batches_per_chunk`` batches of windows on the device
(seeded by ``(seed, epoch, chunk index)``, so a resumed run draws the same
batches; with ``mix > 1`` over that chunk and the ``mix - 1`` before it, see
:class:`chunkstream.ChunkMixer`, and a checkpoint also records how many of
them a resumed run re-reads), trains on each, and merges the chunk into the per-neuron running
moments during the first epoch (the constant baseline). Per epoch it evaluates
on the held-out range, logs to TensorBoard, and writes ``checkpoint.pt``:
model, optimizer, loader state, moments and history.

**Under DDP** (``torchrun``; the process group initialised before the
``Trainer`` is built) the model is wrapped in ``DistributedDataParallel``, the
plan is per rank (``plan_epoch(..., world_size=W)``: one epoch is one pass
across ranks), each rank streams its own share of the windows and draws its own
batches, the per-neuron moments are all-reduced across ranks (exactly: the
baseline is that of all ranks' rows), and validation splits the held-out
windows across ranks and averages over all of them. Only rank 0 writes the
checkpoint, TensorBoard logs and progress bars; every rank restores the
checkpoint on resume (from another world size, the interrupted epoch is padded
with ``uneven="pad"``, so that every rank trains as many chunks and DDP's
collectives stay in step). Every checkpoint and validation is a collective
call: all ranks make them at the same chunks. Each rank runs on its own GPU:
``device=None`` or ``"cuda"`` becomes ``cuda:{LOCAL_RANK}``, the trainer calls
``torch.cuda.set_device`` on it and gives DDP ``device_ids=[LOCAL_RANK]``
(NCCL refuses two ranks on one GPU: "Duplicate GPU detected").

Host syncs: none per batch. Per chunk, only the progress bar's loss text, and
only while the bar is shown (a terminal); checkpoints, validation and the
moments' all-reduce sync at their own boundaries. A resumed run loads the
checkpoint to the CPU first, so Adam's ``step`` counters stay on the host as in
a fresh run (on the GPU every step would read each of them back).
"""

from __future__ import annotations

import itertools
import logging
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._memory import arena_bytes
from .._resume import check_checkpoint_config
from ..consumer import ChunkMixer, default_buffer
from ..distributed import is_distributed, resolve_rank
from ..pipeline import Chunk, ChunkLoader, LoaderOptions
from ..plans import plan_epoch
from ..sources import stored_time_chunk
from ._batches import batch_seed, batch_starts
from ._config import EpochRecord, TrainConfig, TrainResult
from ._data import TimeSlice
from ._heldout import HeldOut, evaluate, held_out_parts, split_source
from ._metrics import LossMeter, RunningMoments, all_reduce_moments
from ._model import LatentDynamics
from ._report import log_epoch, open_writer
from ._setup import field_sizes, fit_pieces, trainer_device

__all__ = ["Trainer"]

_log = logging.getLogger("chunkstream.train")
CHECKPOINT = "checkpoint.pt"


class Trainer:
    """Train :class:`LatentDynamics` on ``source`` by streaming (module docs).

    ``on_chunk(trainer, chunk)`` runs after each chunk's batches (and its
    checkpoint); ``on_epoch(trainer, record)`` after each epoch. ``out_dir``
    receives checkpoints and TensorBoard logs (``None``: neither).
    """

    def __init__(
        self,
        source: Any,
        config: TrainConfig | None = None,
        out_dir: str | os.PathLike | None = None,
        *,
        on_chunk: Callable[[Trainer, Chunk], None] | None = None,
        on_epoch: Callable[[Trainer, EpochRecord], None] | None = None,
    ) -> None:
        self.config = c = config or TrainConfig()
        self.source = source
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.on_chunk, self.on_epoch = on_chunk, on_epoch
        self.neurons, self.stim_dims = field_sizes(source, c)
        self.device = trainer_device(c.device, distributed=is_distributed())
        if is_distributed() and self.device.type == "cuda":
            # NCCL and every CUDA call without an explicit device use the current one.
            torch.cuda.set_device(self.device)
        self.rank, self.world_size = resolve_rank()
        self.is_main = self.rank == 0
        split = split_source(c, len(source))
        self.train_len, self.train_segments = split.train_len, split.train_segments
        # With segments a chunk may hold several whole segments (one piece each), so it is
        # bounded by the source, not by the training timesteps.
        self.chunk_size = min(c.chunk_size, self.train_len if c.segments is None else len(source))
        #: Pieces per chunk: ``config.pieces`` (``"auto"``: up to ``PIECES_AUTO``, each at
        #: least a stored time chunk), fewer where a piece would not hold a window
        #: (:func:`fit_pieces`).
        self.pieces, self._align = fit_pieces(c, self.chunk_size, stored_time_chunk(source))
        self._mixed_fields = [c.data_field] + ([c.stim_field] if c.stim_field else [])
        # With segments an epoch is the chunks a pass reads (plan_epoch's segments rule).
        self.plan = plan_epoch(
            total_timesteps=self.train_len if self.train_segments is None else len(source),
            chunk_size=self.chunk_size,
            batch_size=c.batch_size,
            passes_per_epoch=c.passes_per_epoch,
            world_size=self.world_size,
            segments=self.train_segments,
            pieces=self.pieces,
        )
        #: The shuffle buffer, sized by the library's one policy for defaults
        #: (:func:`chunkstream.consumer.default_buffer`, as ``BatchStream``):
        #: its tier, chunks (``mix``), share of the split and the host memory it read.
        self.buffer = default_buffer(
            c.mix,
            device=self.device,
            chunk_nbytes=self._mixer_chunk_bytes(),
            pass_chunks=max(1, self.plan.chunks_per_epoch // c.passes_per_epoch),
            pieces=self.pieces,
            loader_nbytes=self._loader_nbytes(),
        )
        self.mix = self.buffer.mix
        #: Batches gathered on the host and copied to a CUDA device (the host tier there);
        #: the loader then reads to host memory.
        self.host_tier = self.buffer.tier == "host" and self.device.type == "cuda"
        _log.info("%s", self.buffer.describe())
        if self.buffer.note and self.mix > 1:
            _log.info("%s", self.buffer.note)
        # Held-out ranges, kept on the device; each rank validates its share of the windows.
        self.val_parts: list[HeldOut] = held_out_parts(
            source, split, c, self.device, self.rank, self.world_size
        )
        self.val_segments: dict[str, float] = {}
        torch.manual_seed(c.seed)  # the same initial weights on every rank
        self.model = LatentDynamics(
            self.neurons, self.stim_dims, latent_dim=c.latent_dim, hidden_dim=c.hidden_dim
        ).to(self.device)
        #: What the training step calls: ``model``, or its DDP wrapper under torch.distributed.
        self.net: nn.Module = self.model
        if is_distributed():
            cuda = self.device.type == "cuda" and self.device.index is not None
            self.net = nn.parallel.DistributedDataParallel(
                self.model,
                device_ids=[self.device.index] if cuda else None,
                find_unused_parameters=c.warmup_epochs > 0,  # warm-up leaves the evolver idle
            )
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=c.lr)
        #: Moments of every rank's rows up to the last sync (the same on every rank).
        self.moments = RunningMoments(self.neurons, self.device)
        self._pending = RunningMoments(self.neurons, self.device)  # this rank's, since then
        self.history: list[EpochRecord] = []
        self.windows: list[tuple[int, int, int]] = []
        self.loader: ChunkLoader | None = None
        self.mixer: ChunkMixer | None = None  # held across epochs while fit() runs
        self._refill = 0

    # -- losses ---------------------------------------------------------------------

    def _losses(self, x: torch.Tensor, s: torch.Tensor | None, warm: bool) -> dict:
        c = self.config
        recon_x, pred = self.net(x, s, c.evolve_multiple_steps, c.time_units, rollout=not warm)
        recon = nn.functional.mse_loss(recon_x, x)
        if warm:
            return {"loss": recon, "recon": recon}
        rollout = nn.functional.mse_loss(pred, x[:, c.time_units :: c.time_units])
        return {"loss": rollout + c.recon_weight * recon, "recon": recon, "rollout": rollout}

    def validate(self) -> tuple[float, float]:
        """``(model rollout MSE, constant-baseline MSE)`` on the held-out windows.

        The baseline predicts the streamed per-neuron training mean at every target frame.
        The model's loss per held-out range is left in :attr:`val_segments`.
        Under torch.distributed each rank evaluates its share of the windows and the
        sums are all-reduced, so every rank returns the mean over all of them.
        """
        per_part = evaluate(
            self.model, self.val_parts, self.moments.mean, self.config, self.neurons
        )
        overall = per_part.sum(0)
        self.val_segments = {
            name: float(row[0] / row[2])
            for (name, _, _), row in zip(self.val_parts, per_part, strict=True)
            if row[2] > 0
        }
        return float(overall[0] / overall[2]), float(overall[1] / overall[2])

    def sync_moments(self) -> None:
        """Merge every rank's rows since the last sync into :attr:`moments` (collective)."""
        pending = self._pending
        if is_distributed():
            pending = all_reduce_moments(pending)
        self.moments.merge(pending)
        self._pending = RunningMoments(self.neurons, self.device)

    # -- checkpoints ----------------------------------------------------------------

    @property
    def checkpoint_path(self) -> Path | None:
        return self.out_dir / CHECKPOINT if self.out_dir is not None else None

    def save_checkpoint(self) -> None:
        """Write model, optimizer, loader state, moments and history (atomically).

        Under torch.distributed every rank must call it (the moments are
        all-reduced first); only rank 0 writes.
        """
        path = self.checkpoint_path
        if path is None or self.loader is None:
            return
        self.sync_moments()
        if not self.is_main:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        loader_state, refill = self._loader_state()
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "loader": loader_state,
            "mix_refill": refill,
            "moments": self.moments.state_dict(),
            "history": [vars(r) for r in self.history],
            "config": self.config.to_dict(),
        }
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)

    def _loader_state(self) -> tuple[dict, int]:
        """``(loader state, chunks to re-read)`` to resume after the current chunk.

        With ``mix > 1`` the next chunk's batches mix with chunks already read,
        also at an epoch's end (the buffer is kept across epochs): resume from
        the state before the oldest of them, and re-read them into the buffer
        (``ChunkMixer.resume_point``); with ``mix=1``, the loader's own state.
        """
        loader, mixer = self.loader, self.mixer
        if mixer is None or not len(mixer):
            return loader.state_dict(), 0  # type: ignore[union-attr]
        before, refill = mixer.resume_point(done=True)
        return (loader.state_dict(), 0) if before is None else (dict(before), refill)

    def _load_checkpoint(self, path: Path, loader: ChunkLoader) -> None:
        # To the CPU: load_state_dict moves each tensor to its parameter's device,
        # except Adam's `step`, which stays where it was loaded, and on the GPU it
        # costs a host sync per parameter per step (Adam reads it with .item()).
        state = torch.load(path, map_location="cpu", weights_only=True)
        check_checkpoint_config(state.get("config"), self.config.to_dict())
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.moments.load_state_dict(state["moments"])
        self._pending = RunningMoments(self.neurons, self.device)
        self.history = [EpochRecord(**r) for r in state["history"]]
        saved_world = int(state["loader"].get("world_size", self.world_size))
        # Another world size may split the rest of the epoch unevenly; DDP needs equal counts.
        uneven = "pad" if self.world_size > 1 and saved_world != self.world_size else "exact"
        loader.load_state_dict(state["loader"], uneven=uneven)
        # The held chunks of earlier epochs are re-read now, the rest by the next epoch.
        self._refill = self.mixer.refill_across(  # type: ignore[union-attr]
            loader, state["loader"], int(state.get("mix_refill", 0)), self._events_per_epoch()
        )
        _log.info("resumed from %s at %s", path, state["loader"])

    # -- the loop -------------------------------------------------------------------

    def fit(self, resume: bool | str | os.PathLike = False) -> TrainResult:
        """Train ``config.epochs`` epochs (in total, counting resumed ones); see module docs.

        ``resume=True`` continues from ``out_dir/checkpoint.pt`` when it exists;
        a path resumes from that file.
        """
        c, began = self.config, time.perf_counter()
        writer = open_writer(self.out_dir, c.tensorboard) if self.is_main else None
        source = (
            TimeSlice(self.source, 0, self.train_len)
            if self.train_segments is None
            else self.source
        )
        loader = ChunkLoader(
            source,
            self.chunk_size,
            device="cpu" if self.host_tier else self.device,
            prefetch=c.prefetch,
            workers=c.workers,
            sampling=c.sampling,
            seed=c.seed,
            align=self._align,
            options=LoaderOptions(
                pieces=self.pieces, segments=self.train_segments, window=c.window
            ),
        )
        self.loader = loader
        self.mixer = ChunkMixer(
            self.mix,
            window=c.window,
            rows=loader.rows,
            fields=self._mixed_fields,
        )  # on the host tier the loader's chunks are on the CPU, and so is the buffer
        try:
            path = Path(resume) if isinstance(resume, (str, os.PathLike)) else self.checkpoint_path
            if resume and path is not None and path.is_file():
                self._load_checkpoint(path, loader)
            timer = loader.stats.batch_timer(self.device, every=c.time_every)
            while (epoch := loader.state_dict()["epoch"]) < c.epochs:
                record = self._epoch(loader, epoch, timer)
                self.history.append(record)
                self.save_checkpoint()
                if writer is not None:
                    log_epoch(writer, record, loader.stats)
                if self.on_epoch is not None:
                    self.on_epoch(self, record)
        finally:
            self.mixer = None  # the held chunks and the buffer's storage go with it
            loader.close()
            if writer is not None:
                writer.close()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the last timed batches' events complete
        self.sync_moments()
        val_loss, baseline_val = self.validate()
        return TrainResult(
            history=list(self.history),
            val_loss=val_loss,
            baseline_val=baseline_val,
            baseline_train=self.moments.constant_loss(),
            latency=loader.stats.summary(),
            memory=self._memory(loader),
            device=str(self.device),
            seconds=time.perf_counter() - began,
            checkpoint=str(self.checkpoint_path) if self.checkpoint_path else None,
            windows=list(self.windows),
            val_segments=dict(self.val_segments),
            buffer=self.buffer,
        )

    def _epoch(self, loader: ChunkLoader, epoch: int, timer: Any) -> EpochRecord:
        c, began, meter = self.config, time.perf_counter(), LossMeter()
        warm = epoch < c.warmup_epochs
        chunks = batches = 0
        per_chunk, budget = self.plan.batches_per_chunk, self._batch_budget()
        events = self._events_per_epoch()
        iterator = loader.epoch(events)
        bar = _progress(len(iterator), f"epoch {epoch}", c.progress and self.is_main)
        mixer = self.mixer
        assert mixer is not None  # fit() made it
        refill, self._refill = self._refill, 0
        # One event per chunk (ChunkMixer.events): its share of batches, drawn over it and
        # the mix - 1 chunks before it, kept across epochs; with mix=1 the held chunk is
        # the loader's own.
        for chunk in mixer.events(iter(iterator), loader.state_dict, refill=refill, keep=True):
            x_chunk = chunk[c.data_field]
            if epoch == 0:  # at the event, not the arrival: a refilled buffer adds nothing
                self._pending.update(x_chunk.to(self.device))
            self.windows.extend((epoch, p.start, p.stop) for p in chunk.pieces)
            generator = torch.Generator(device=x_chunk.device)  # where the starts are drawn
            generator.manual_seed(batch_seed(c.seed, epoch, chunk.index, self.rank))
            count = min(per_chunk, budget - batches)
            passes = batch_starts(mixer, c, generator)
            for starts in itertools.islice(passes, count):
                x = mixer.gather(c.data_field, starts)
                s = mixer.gather(c.stim_field, starts) if c.stim_field else None
                if self.host_tier:  # the host tier's cost per batch: a gather and one copy
                    x = x.to(self.device, non_blocking=False)
                    s = None if s is None else s.to(self.device, non_blocking=False)
                with timer.batch() as timed:
                    losses = self._losses(x, s, warm)
                    timed.mark("forward")
                    self.optimizer.zero_grad(set_to_none=True)
                    losses["loss"].backward()
                    timed.mark("backward")
                    self.optimizer.step()
                for name, value in losses.items():
                    meter.add(name, value)
                batches += 1
            chunks += 1
            del x_chunk  # drop references, so the loader can reuse the buffer
            # Not after the epoch's last chunk: the loader's state is then the next epoch's,
            # and a resume from it would skip this epoch's validation and record; the
            # checkpoint written after them follows at once.
            if (
                c.checkpoint_every
                and chunks % c.checkpoint_every == 0
                and loader.state_dict()["epoch"] == epoch
            ):
                self.save_checkpoint()
            if bar is not None:  # only a shown bar: reading the loss is a host sync
                bar.update(1)
                bar.set_postfix(loss=f"{meter.mean('loss'):.4f}")
            if self.on_chunk is not None:
                self.on_chunk(self, chunk)
            # Dropped before asking for the next chunk, so the loader's device bound is
            # gpu_prefetch + 1 chunks (a loop still holding it while next() runs: + 1).
            del chunk
        if bar is not None:
            bar.close()
        self.sync_moments()
        val_loss, baseline_val = self.validate()
        return EpochRecord(
            epoch=epoch,
            losses=meter.means(),
            val_loss=val_loss,
            baseline_val=baseline_val,
            baseline_train=self.moments.constant_loss(),
            chunks=chunks,
            batches=batches,
            seconds=time.perf_counter() - began,
            val_segments=dict(self.val_segments),
        )

    def _mixer_chunk_bytes(self) -> int:
        """Bytes of one chunk of the fields the shuffle buffer copies."""
        fields = self.source.fields
        return self.chunk_size * sum(fields[n].step_nbytes for n in self._mixed_fields)

    def _loader_nbytes(self) -> int:
        """Bytes of the loader's host arena (every field of a chunk): its CPU size, the
        larger (before the tier is chosen the loader may yet run on the CPU)."""
        c, fields = self.config, self.source.fields
        chunk_bytes = self.chunk_size * sum(f.step_nbytes for f in fields.values())
        return arena_bytes(chunk_bytes, on_cuda=False, prefetch=c.prefetch, workers=c.workers)

    def _batch_budget(self) -> int:
        """Batches per epoch on this rank: ``batches_per_epoch``, else the plan's."""
        return (
            self.config.batches_per_epoch
            or self.plan.chunks_per_epoch * self.plan.batches_per_chunk
        )

    def _events_per_epoch(self) -> int:
        """Chunks per epoch on this rank, one event each: the batch budget in chunks."""
        return -(-self._batch_budget() // self.plan.batches_per_chunk)

    # -- reporting ------------------------------------------------------------------

    def _memory(self, loader: ChunkLoader) -> dict[str, int | None]:
        cfg, chunk_bytes = loader.config, loader.chunk_bytes
        cuda = self.device.type == "cuda"
        loader_cuda = loader.device.type == "cuda"  # not with the host tier on CUDA
        step_bytes = chunk_bytes // max(1, loader.rows)
        return {
            "device_peak": torch.cuda.max_memory_allocated(self.device) if cuda else None,
            "loader_device": (cfg.gpu_prefetch + 1) * chunk_bytes if loader_cuda else 0,
            "loader_host": cfg.host_sets(loader_cuda) * chunk_bytes,
            # the chunk shuffle buffer's own copies (ChunkMixer), on its tier (self.buffer)
            "mixer": self.mix * self._mixer_chunk_bytes() if self.mix > 1 else 0,
            "validation": sum(
                t.numel() * t.element_size() for _, val, _ in self.val_parts for t in val.values()
            ),
            "train_split": self.train_len * step_bytes,
            "host_peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }


def _progress(total: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    # disable=None: a bar on a terminal, nothing when output goes to a log file. A
    # disabled bar is returned as None, so nothing computes its text (a host sync).
    bar = tqdm(total=total, desc=desc, unit="chunk", leave=False, disable=None)
    if bar.disable:
        bar.close()
        return None
    return bar
