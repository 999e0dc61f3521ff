"""A :class:`~chunkstream.BatchStream`'s settings checked against its loader: the plan's
defaults, the window, the epoch's length and the fields a batch holds."""

from __future__ import annotations

from .._errors import ConfigError, check_int
from ..pipeline import RECORDING_KEY, START_KEY, ChunkLoader
from ..plans import EpochPlan, window_in_chunk
from ..sources import LearnsFields, Recordings, Source

__all__ = ["check_window", "choose_fields", "epoch_length", "plan_defaults"]


def plan_defaults(
    plan: object,
    batch_size: int | None,
    batches_per_chunk: int | None,
    chunks_per_epoch: int | None,
    batches_per_epoch: int | None,
) -> tuple[int | None, int | None, int | None]:
    """``(batch_size, batches_per_chunk, batches_per_epoch)``, the plan's where not given."""
    if not isinstance(plan, EpochPlan):
        raise ConfigError.bad(
            "plan", type(plan).__name__, "a cs.EpochPlan from cs.plan_epoch(...), or None"
        )
    batch_size = plan.batch_size if batch_size is None else batch_size
    if batches_per_chunk is None:
        batches_per_chunk = plan.batches_per_chunk
    if chunks_per_epoch is None and batches_per_epoch is None:
        batches_per_epoch = max(1, plan.batches_per_epoch // plan.world_size)
    return batch_size, batches_per_chunk, batches_per_epoch


def check_window(loader: ChunkLoader, window: object) -> int:
    """``window`` checked against the loader's chunk length and piece length."""
    length = loader.rows  # every chunk's length: min(chunk_size, len(source))
    window = check_int("window", window, minimum=1, fix="Pass the timesteps one sample needs.")
    window_in_chunk(window, length)
    if window > loader.plan.piece_size:
        raise ConfigError.bad(
            "window",
            window,
            f"at most the piece length chunk_size // pieces = {loader.plan.piece_size}",
            "Use fewer pieces, a larger chunk_size or a shorter window.",
        )
    return window


def epoch_length(
    loader: ChunkLoader,
    batches_per_chunk: int,
    chunks_per_epoch: int | None,
    batches_per_epoch: int | None,
) -> tuple[int, int]:
    """``(chunks_per_epoch, batches_per_epoch)`` from whichever of the two was given."""
    if chunks_per_epoch is not None and batches_per_epoch is not None:
        raise ConfigError.bad(
            "batches_per_epoch",
            batches_per_epoch,
            f"None when chunks_per_epoch={chunks_per_epoch} is given (one epoch length)",
            "Give the epoch's length once: in batches or in chunks.",
        )
    if batches_per_epoch is not None:
        batches_per_epoch = check_int(
            "batches_per_epoch", batches_per_epoch, minimum=0, fix="Use plan.batches_per_epoch."
        )
        chunks_per_epoch = -(-batches_per_epoch // batches_per_chunk)
    elif chunks_per_epoch is None:
        chunks_per_epoch = loader.chunks_per_pass  # the loader's own rule for epoch(None)
        if chunks_per_epoch is None:
            raise ConfigError.bad(
                "chunks_per_epoch",
                None,
                "a number of chunks for sampling='random' (it has no natural pass)",
                "Pass chunks_per_epoch=plan.chunks_per_epoch, or plan=cs.plan_epoch(...).",
            )
    chunks_per_epoch = check_int(
        "chunks_per_epoch", chunks_per_epoch, minimum=0, fix="Use plan.chunks_per_epoch."
    )
    if batches_per_epoch is None:
        batches_per_epoch = chunks_per_epoch * batches_per_chunk
    return chunks_per_epoch, batches_per_epoch


def choose_fields(source: Source, fields: object) -> tuple[str, ...]:
    """The field names a batch holds: every field of the source, or those named.

    A dict batch reserves ``"start"`` and ``"recording"`` (the windows' times):
    a ``Recordings``' own per-timestep ``"recording"`` field is replaced by the
    per-window key, and another source's field of either name is refused unless
    left out (or asked for alone, ``fields="name"``: that batch is no dict).
    """
    # A source that learns its fields has only their names before its first read.
    learning = isinstance(source, LearnsFields) and source.fields is None
    names = list(source.names if learning else source.fields or ())
    recordings = isinstance(source, Recordings)
    if recordings:
        names.remove(RECORDING_KEY)
    if fields is None:
        chosen = tuple(names)
    else:
        chosen = (fields,) if isinstance(fields, str) else tuple(fields)  # type: ignore[arg-type]
    if recordings and RECORDING_KEY in chosen:
        raise ConfigError.bad(
            "fields",
            fields,
            f"fields of the Recordings without {RECORDING_KEY!r} (from {names})",
            f"Leave {RECORDING_KEY!r} out: every dict batch of a Recordings carries "
            f"batch[{RECORDING_KEY!r}], each window's recording index, shape (batch_size,).",
        )
    unknown = [f for f in chosen if not isinstance(f, str) or f not in names]
    if not chosen or unknown:
        raise ConfigError.bad(
            "fields",
            fields,
            f"None, one name or a list of names from {names}",
            "Name fields of the loader's source.",
        )
    clash = [f for f in chosen if f in (START_KEY, RECORDING_KEY)]
    if clash and not isinstance(fields, str):
        raise ConfigError.bad(
            "fields",
            fields,
            f"no field named {clash[0]!r} in a dict batch (the source has one; a dict batch "
            f"reserves {START_KEY!r} and {RECORDING_KEY!r} for each window's start and "
            "recording)",
            f"Pass fields=[...] without {clash[0]!r}, ask for it alone (fields="
            f"{clash[0]!r}), or rename the source's field.",
        )
    return chosen
