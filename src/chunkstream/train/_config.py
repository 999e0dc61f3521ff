"""The trainer's configuration and results (frozen, keyword-only)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .._errors import ConfigError, check_int

__all__ = [
    "PIECES_AUTO",
    "EpochRecord",
    "TrainConfig",
    "TrainResult",
]

#: Pieces per chunk ``pieces="auto"`` asks for: the best setting of the quality race
#: (BENCHMARKS.md, "batch correlation"), fewer where a piece would be shorter than the
#: source's stored time chunk.
PIECES_AUTO = 128


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """What :class:`~chunkstream.train.Trainer` trains, and how it streams.

    A rollout covers ``time_units * evolve_multiple_steps`` timesteps (a window
    of one more, the start frame). The last ``val_fraction`` of the timesteps
    (at least one window) is held out for validation and kept on the device;
    the rest is streamed in chunks of ``chunk_size``, each made of ``pieces``
    pieces from independent places (``LoaderOptions(pieces=)``: batches drawn
    from one chunk are then far less correlated; fewer pieces when
    ``chunk_size // pieces`` would not hold a window or ``pieces`` does not
    divide ``chunk_size``). ``pieces="auto"`` asks for :data:`PIECES_AUTO`
    and also takes fewer where a piece would be shorter than the source's
    stored time chunk, so that no piece decodes a stored chunk for a part of
    it (read amplification). ``mix`` > 1 draws every batch over the windows of
    the last ``mix`` chunks (``BatchStream(mix=)``, a
    shuffle buffer of chunks, kept across epochs), each chunk still feeding
    its share of batches; ``mix="auto"`` is ``BatchStream``'s default, sized by
    the same policy (:mod:`chunkstream._memory._defaults`): the largest share
    of the training split the job's host memory allows (cgroup limits
    included), on the host tier where that holds more than the device tier
    may (on CUDA each batch is then gathered on the host and copied to the
    device), else up to 16 chunks on the device; ``buffer`` (``"host"`` or
    ``"device"``, as ``BatchStream(buffer=)``) picks the tier instead. Batches
    come from a :class:`~chunkstream.BatchStream` over the loader, drawn
    uniformly (with replacement) over the held chunks' windows. A checkpoint resumes exactly
    where ``"auto"`` resolves to the same count (an int pins it across
    machines; an int above the chunks of one pass is refused). With ``segments`` (anything
    :class:`~chunkstream.Segments` takes, or a CSV/JSON path) the last
    ``val_fraction`` of *every* segment is held out instead
    (:func:`~chunkstream.split_segments`, with a gap of ``window - 1``), no
    window crosses a segment, and validation is also reported per segment; a
    :class:`~chunkstream.Recordings` source does the same for each recording.
    ``val_data`` (a source, a ``Recordings`` or a mapping name -> source, with the
    training source's fields) is held out entirely: each of its runs is validated
    whole and reported under its name (``val_fraction`` may then be 0: no tail held
    out of the training data).
    ``batches_per_epoch`` (default: the plan's ``chunks_per_epoch *
    batches_per_chunk``) fixes the batches an epoch trains, so that runs with
    different chunkings train equally long. The first
    ``warmup_epochs`` train the reconstruction loss only. ``checkpoint_every``
    also checkpoints every that many chunks (0: at each epoch's end only), with the
    stream's state (:meth:`~chunkstream.BatchStream.state_dict`).
    ``tensorboard=None`` logs when tensorboard is installed. ``time_every``
    times every that many batches (forward, backward, step).
    """

    data_field: str = "voltage"
    stim_field: str | None = "stimulus"
    chunk_size: int = 2048
    batch_size: int = 64
    passes_per_epoch: int = 1
    time_units: int = 1
    evolve_multiple_steps: int = 4
    latent_dim: int = 32
    hidden_dim: int = 128
    epochs: int = 4
    warmup_epochs: int = 1
    recon_weight: float = 0.1
    lr: float = 2e-3
    val_fraction: float = 0.1
    val_windows: int = 512
    sampling: str = "shuffled"
    pieces: int | str = "auto"
    mix: int | str = "auto"
    segments: Any = None
    val_data: Any = None
    batches_per_epoch: int | None = None
    buffer: str = "auto"
    prefetch: int = 2
    workers: int = 2
    seed: int = 0
    device: str | None = None
    checkpoint_every: int = 0
    time_every: int = 4
    tensorboard: bool | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        for name in (
            "chunk_size",
            "batch_size",
            "passes_per_epoch",
            "time_units",
            "evolve_multiple_steps",
            "latent_dim",
            "hidden_dim",
            "val_windows",
            "prefetch",
            "workers",
            "time_every",
        ):
            check_int(name, getattr(self, name), expected="an int >= 1")
        if self.pieces != "auto":
            check_int(
                "pieces",
                self.pieces,
                1,
                f'Pass pieces="auto" (up to {PIECES_AUTO}, each at least a stored time chunk), '
                "or e.g. pieces=1 (contiguous chunks).",
                expected='an int >= 1 (pieces per chunk) or "auto"',
            )
        if self.mix != "auto":
            check_int(
                "mix",
                self.mix,
                1,
                'Pass mix="auto" (the largest share of the split the memory allows), or '
                "e.g. mix=1 (no mixing).",
                expected='an int >= 1 (chunks held and mixed per batch) or "auto"',
            )
        if self.buffer not in ("auto", "host", "device"):
            raise ConfigError.bad(
                "buffer",
                self.buffer,
                "'auto', 'host' or 'device' (where the shuffle buffer lives)",
                "Pass buffer='auto' (the defaults' policy), or name a tier.",
            )
        for name in ("epochs", "warmup_epochs", "checkpoint_every"):
            check_int(name, getattr(self, name), 0, expected="an int >= 0")
        if self.batches_per_epoch is not None:
            check_int(
                "batches_per_epoch",
                self.batches_per_epoch,
                expected="an int >= 1, or None (the plan's)",
            )
        if not 0.0 <= self.val_fraction < 1.0 or (self.val_fraction == 0 and self.val_data is None):
            raise ConfigError.bad(
                "val_fraction",
                self.val_fraction,
                "a fraction in (0, 1), or 0 with val_data (runs held out entirely)",
            )
        if self.lr <= 0 or self.recon_weight < 0:
            raise ConfigError.bad("lr/recon_weight", (self.lr, self.recon_weight), "lr > 0, >= 0")

    @property
    def window(self) -> int:
        """Timesteps per training window: ``time_units * evolve_multiple_steps + 1``."""
        return self.time_units * self.evolve_multiple_steps + 1

    def to_dict(self) -> dict[str, Any]:
        """The settings as plain data (a checkpoint stores it): segments as
        ``[start, stop, name]`` rows; ``val_data``, where given, as its runs' names
        (sources are not data: ``TrainConfig(**to_dict())`` then needs them again)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "val_data"}
        segments = self.segments
        if segments is not None and not isinstance(segments, str) and hasattr(segments, "names"):
            out["segments"] = [[s.start, s.stop, s.name] for s in segments]
        if self.val_data is not None:
            out["val_data"] = list(val_runs(self.val_data))
        return out


def val_runs(val_data: Any) -> dict[str, Any]:
    """``TrainConfig.val_data`` as name -> source: a mapping as it is, a
    :class:`~chunkstream.Recordings` by its recordings, another source as ``"val_data"``."""
    if isinstance(val_data, Mapping):
        return {str(k): v for k, v in val_data.items()}
    recordings = getattr(val_data, "recordings", None)
    if isinstance(recordings, Mapping):
        return dict(recordings)
    return {"val_data": val_data}


@dataclass(frozen=True, kw_only=True)
class EpochRecord:
    """One epoch: mean train loss components, validation and baseline losses, timing;
    ``val_segments`` is the model's validation loss per held-out segment."""

    epoch: int
    losses: dict[str, float]
    val_loss: float
    baseline_val: float
    baseline_train: float
    chunks: int
    batches: int
    seconds: float
    val_segments: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class TrainResult:
    """What :meth:`Trainer.fit` returns.

    ``memory`` holds bytes: ``device_peak`` (CUDA allocator peak, else ``None``),
    ``loader_device`` (chunks on the device at once), ``loader_host`` (pinned
    slots on CUDA, the in-flight bound on CPU), ``mixer`` (the ``Trainer.mix``
    chunks of the trained fields the shuffle buffer holds, 0 with ``mix=1``),
    ``validation`` (the held-out range on the device), ``train_split`` (holding the whole training split),
    and ``host_peak_rss`` (the process's peak resident set).
    """

    history: list[EpochRecord]
    val_loss: float
    baseline_val: float
    baseline_train: float
    latency: dict[str, float]
    memory: dict[str, int | None]
    device: str
    seconds: float
    checkpoint: str | None
    val_segments: dict[str, float] = field(default_factory=dict)  # model MSE per held-out segment
    #: The shuffle buffer (a :class:`~chunkstream.consumer.BufferInfo`: tier, chunks, share
    #: of the split, the host memory it was sized from); ``None`` where not recorded.
    buffer: Any = None
