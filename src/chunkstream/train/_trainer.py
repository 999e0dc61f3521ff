"""A reference trainer: a latent-dynamics model trained on batches streamed from a source.

Usable on any source with a ``(T, N)`` data field and, optionally, a
``(T, S)`` stimulus field (``cs.flyvis.open(path)`` gives both)::

    trainer = Trainer(source, TrainConfig(epochs=10, device="cuda"), out_dir="runs/a")
    result = trainer.fit()            # fit(resume=True) continues a killed run

The trainer draws and moves no batch itself: a :class:`~chunkstream.BatchStream`
built from the source, owning its :class:`~chunkstream.ChunkLoader`, does (its
shuffle buffer on the tier :attr:`Trainer.buffer` names, its batch starts a hash
of ``(seed, epoch, chunk index, batch, rank)``, so a resumed run draws the same
batches; on CUDA with the host tier each batch is read on the host into pinned
sets and copied on the loader's transfer stream). The trainer keeps the model, the
loss, validation and reporting: it trains on each batch, and merges the rows
of the first epoch's batches into the per-neuron running moments (the constant
baseline: the mean of the training rows the model saw). On a
:class:`~chunkstream.Recordings` of different widths the losses, the moments and
the validation metrics count only the neurons each window's recording has (the
data's ``<field>_mask``), so the zero padding trains and scores nothing. Per
epoch it evaluates on the held-out range, logs to TensorBoard, and writes
``checkpoint.pt``: model, optimizer, the stream's state
(:meth:`BatchStream.state_dict`), moments (per-neuron counts; a checkpoint whose
moments counted the padding is refused on a masked source) and history.

**Under DDP** (``torchrun``; the process group initialised before the
``Trainer`` is built) the model is wrapped in ``DistributedDataParallel``, the
plan is per rank (``plan_epoch(..., world_size=W)``: one epoch is one pass
across ranks), each rank streams its own share of the windows and its stream draws its
own batches, the per-neuron moments are all-reduced across ranks (exactly: the
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

Host syncs: none per batch from the trainer. Per chunk, only the progress bar's loss text, and
only while the bar is shown (a terminal); checkpoints, validation and the
moments' all-reduce sync at their own boundaries. A resumed run loads the
checkpoint to the CPU first, so Adam's ``step`` counters stay on the host as in
a fresh run (on the GPU every step would read each of them back).
"""

from __future__ import annotations

import logging
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._errors import ConfigError
from .._memory import arena_bytes, default_buffer, stream_held
from .._progress import progress_bar
from .._resume import check_checkpoint_config
from ..consumer import BatchStream, StreamOptions
from ..distributed import is_distributed, resolve_rank
from ..pipeline import ChunkLoader, LoaderOptions
from ..plans import plan_epoch
from ..sources import decode_scratch_nbytes, stored_time_chunk
from ._config import EpochRecord, TrainConfig, TrainResult
from ._data import TimeSlice
from ._heldout import HeldOut, evaluate, held_out_parts, recordings_config, split_source
from ._metrics import LossMeter, RunningMoments, all_reduce_moments, masked_field, masked_mse
from ._model import LatentDynamics
from ._report import log_epoch, open_writer
from ._setup import field_sizes, fit_pieces, trainer_device

__all__ = ["Trainer"]

_log = logging.getLogger("chunkstream.train")
CHECKPOINT = "checkpoint.pt"


class Trainer:
    """Train :class:`LatentDynamics` on ``source`` by streaming (module docs).

    ``on_batch(trainer, batch)`` runs after each batch's step (``batch``: the
    stream's dict of the data and stimulus fields, with each window's ``"start"``
    and, for a ``Recordings``, ``"recording"``); ``on_epoch(trainer,
    record)`` after each epoch. ``out_dir`` receives checkpoints and TensorBoard
    logs (``None``: neither).
    """

    def __init__(
        self,
        source: Any,
        config: TrainConfig | None = None,
        out_dir: str | os.PathLike | None = None,
        *,
        on_batch: Callable[[Trainer, dict[str, torch.Tensor]], None] | None = None,
        on_epoch: Callable[[Trainer, EpochRecord], None] | None = None,
    ) -> None:
        self.config = c = recordings_config(config or TrainConfig(), source)
        self.source = source
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.on_batch, self.on_epoch = on_batch, on_epoch
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
        #: The data field's mask (a ``Recordings`` of different widths pads the data with
        #: zeros and says where values are real): losses and metrics count only those.
        self.mask_field = masked_field(source, c.data_field)
        self._mixed_fields = (
            [c.data_field]
            + ([c.stim_field] if c.stim_field else [])
            + ([self.mask_field] if self.mask_field else [])
        )
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
        #: (``default_buffer``, as ``BatchStream``'s) and handed to the stream as is:
        #: its tier, chunks (``mix``), share of the split and the host memory it read.
        self.buffer = default_buffer(
            c.mix,
            tier=c.buffer,
            device=self.device,
            chunk_nbytes=self._mixer_chunk_bytes(),
            pass_chunks=max(1, self.plan.chunks_per_epoch // c.passes_per_epoch),
            pieces=self.pieces,
            loader_nbytes=self._loader_nbytes(),
            held=stream_held(
                source.fields,
                self._mixed_fields,
                batch_size=c.batch_size,
                window=c.window,
                batch_prefetch=StreamOptions().batch_prefetch,
                cuda=self.device.type == "cuda",
                decode_scratch=decode_scratch_nbytes(source),
            ),
        )
        self.mix = self.buffer.mix
        #: Batches gathered on the host and copied to a CUDA device through pinned slots
        #: (the host tier there); the loader then reads to host memory.
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
        ).to(device=self.device)  # the model; batches come from the stream
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
        self.loader: ChunkLoader | None = None
        #: The batches: set while fit() runs (its buffer held across epochs), then None.
        self.stream: BatchStream | None = None

    # -- losses ---------------------------------------------------------------------

    def _losses(
        self, x: torch.Tensor, s: torch.Tensor | None, warm: bool, mask: torch.Tensor | None = None
    ) -> dict:
        """The step's losses; with ``mask`` (the data's, padded recordings) only the
        neurons a window's recording has count (:func:`masked_mse`)."""
        c = self.config
        recon_x, pred = self.net(x, s, c.evolve_multiple_steps, c.time_units, rollout=not warm)
        recon = masked_mse(recon_x, x, mask)
        if warm:
            return {"loss": recon, "recon": recon}
        step = slice(c.time_units, None, c.time_units)
        rollout = masked_mse(pred, x[:, step], None if mask is None else mask[:, step])
        return {"loss": rollout + c.recon_weight * recon, "recon": recon, "rollout": rollout}

    def validate(self) -> tuple[float, float]:
        """``(model rollout MSE, constant-baseline MSE)`` on the held-out windows.

        The baseline predicts the streamed per-neuron training mean at every target frame.
        The model's loss per held-out range is left in :attr:`val_segments`.
        Under torch.distributed each rank evaluates its share of the windows and the
        sums are all-reduced, so every rank returns the mean over all of them.
        """
        per_part = evaluate(
            self.model,
            self.val_parts,
            self.moments.mean,
            self.config,
            self.neurons,
            self.mask_field,
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

    def save_checkpoint(self, stream_state: dict | None = None) -> None:
        """Write model, optimizer, the stream's state, moments and history (atomically).

        ``stream_state``: where a resumed run goes on (default: right after the
        last batch the stream handed out). Under torch.distributed every rank
        must call it (the moments are all-reduced first); only rank 0 writes.
        """
        path = self.checkpoint_path
        if path is None or self.stream is None:
            return
        self.sync_moments()
        if not self.is_main:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "stream": stream_state if stream_state is not None else self.stream.state_dict(),
            "moments": self.moments.state_dict(),
            "history": [vars(r) for r in self.history],
            "config": self.config.to_dict(),
        }
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)

    def _load_checkpoint(self, path: Path, stream: BatchStream) -> None:
        # To the CPU: load_state_dict moves each tensor to its parameter's device,
        # except Adam's `step`, which stays where it was loaded, and on the GPU it
        # costs a host sync per parameter per step (Adam reads it with .item()).
        state = torch.load(path, map_location="cpu", weights_only=True)
        check_checkpoint_config(state.get("config"), self.config.to_dict())
        if "stream" not in state:
            raise ConfigError(
                f"{path} holds no 'stream' state: it was written by a trainer before "
                "chunkstream's trainer drew its batches from a BatchStream. Start afresh "
                "(resume=False, or another out_dir)."
            )
        if self.mask_field is not None and "counts" not in state["moments"]:
            # Exact to convert where every value is real (RunningMoments.load_state_dict);
            # here the saved baseline counted the padded zeros as data.
            raise ConfigError(
                f"{path} holds moments without per-neuron counts: it was written by a "
                "trainer whose baseline counted the zero padding of narrower recordings "
                f"as data (before it read {self.mask_field!r}). Its baseline and metrics "
                "cannot be corrected from the checkpoint: start afresh (resume=False, or "
                "another out_dir)."
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.moments.load_state_dict(state["moments"])
        self._pending = RunningMoments(self.neurons, self.device)
        self.history = [EpochRecord(**r) for r in state["history"]]
        saved_world = int(state["stream"]["loader"].get("world_size", self.world_size))
        # Another world size may split the rest of the epoch unevenly; DDP needs equal counts.
        uneven = "pad" if self.world_size > 1 and saved_world != self.world_size else "exact"
        # The stream re-reads the chunks its buffer held when its next epoch starts.
        stream.load_state_dict(state["stream"], uneven=uneven)
        _log.info("resumed from %s at %s", path, state["stream"])

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
        # The stream builds and owns the loader its tier needs (the host tier on CUDA: the
        # loader reads to host memory) and closes it with close().
        try:
            self.stream = stream = self._batch_stream(source)
        except BaseException:
            if writer is not None:
                writer.close()
            raise
        self.loader = loader = stream.loader
        try:
            path = Path(resume) if isinstance(resume, (str, os.PathLike)) else self.checkpoint_path
            if resume and path is not None and path.is_file():
                self._load_checkpoint(path, stream)
            timer = loader.stats.batch_timer(self.device, every=c.time_every)
            # The history holds every finished epoch, also of the run a checkpoint resumes.
            for epoch in range(len(self.history), c.epochs):
                record = self._epoch(stream, epoch, timer)
                self.history.append(record)
                self.save_checkpoint()
                if writer is not None:
                    log_epoch(writer, record, loader.stats)
                if self.on_epoch is not None:
                    self.on_epoch(self, record)
        finally:
            self.stream = None  # the held chunks and the batch sets go with it
            stream.close()
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
            val_segments=dict(self.val_segments),
            buffer=self.buffer,
        )

    def _batch_stream(self, source: Any) -> BatchStream:
        """The stream of this run's batches over ``source``, with the loader it owns: the
        trainer's plan, fields, seed, buffer and reading settings."""
        c = self.config
        return BatchStream(
            source,
            plan=self.plan,
            loader_options={
                "prefetch": c.prefetch,
                "workers": c.workers,
                "sampling": c.sampling,
                "seed": c.seed,
                "align": self._align,
                "options": LoaderOptions(
                    pieces=self.pieces, segments=self.train_segments, window=c.window
                ),
            },
            window=c.window,
            batch_size=c.batch_size,
            batches_per_chunk=self.plan.batches_per_chunk,
            mix=self.mix,  # as sized above: the stream does not size it again
            buffer=self.buffer.tier,
            device=self.device,
            fields=self._mixed_fields,
            options=StreamOptions(batches_per_epoch=self._batch_budget(), seed=c.seed),
        )

    def _epoch(self, stream: BatchStream, epoch: int, timer: Any) -> EpochRecord:
        c, began, meter = self.config, time.perf_counter(), LossMeter()
        warm = epoch < c.warmup_epochs
        chunks = batches = 0
        bar = _progress(stream.chunks_per_epoch, f"epoch {epoch}", c.progress and self.is_main)
        # The state after a chunk's last batch, checkpointed once the next batch shows that
        # the epoch goes on: not after the epoch's last chunk, whose state is the next
        # epoch's (a resume from it would skip this epoch's validation and record; the
        # checkpoint written after them follows at once).
        due: dict | None = None
        for batch in stream:
            if due is not None:
                self.save_checkpoint(due)  # the model is still that of due's batch
                due = None
            x = batch[c.data_field]
            s = batch[c.stim_field] if c.stim_field else None
            mask = batch[self.mask_field] if self.mask_field else None
            if epoch == 0:  # the baseline's moments, over the neurons each recording has
                n = x.shape[-1]
                self._pending.update(
                    x.reshape(-1, n), None if mask is None else mask.reshape(-1, n)
                )
            with timer.batch() as timed:
                losses = self._losses(x, s, warm, mask)
                timed.mark("forward")
                self.optimizer.zero_grad(set_to_none=True)
                losses["loss"].backward()
                timed.mark("backward")
                self.optimizer.step()
            for name, value in losses.items():
                meter.add(name, value)
            batches += 1
            state = stream.state_dict()
            if state["batch"] == 0:  # this batch was its chunk's last
                chunks += 1
                if c.checkpoint_every and chunks % c.checkpoint_every == 0:
                    due = state
                if bar is not None:  # only a shown bar: reading the loss is a host sync
                    bar.update(1)
                    bar.set_postfix(loss=f"{meter.mean('loss'):.4f}")
            if self.on_batch is not None:
                self.on_batch(self, batch)
            # Dropped before asking for the next batch, so that its slot can be refilled.
            del batch, x, s, mask
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
            # the chunk shuffle buffer's own copies (the stream's), on its tier (self.buffer)
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
    # Off the terminal the bar is disabled; it is returned as None then, so nothing
    # computes its text (a host sync).
    bar = progress_bar(desc=desc, unit="chunk", total=total, leave=False)
    if bar.disable:
        bar.close()
        return None
    return bar
