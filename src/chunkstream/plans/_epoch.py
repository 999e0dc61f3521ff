"""Epoch arithmetic: how many chunks an epoch has and how many batches each chunk feeds.

The rule is the original implementation's ``calculate_chunk_params`` (kept exact, so
the compat layer and native code agree)::

    batches_per_epoch = (T // batch_size) * passes
    if T < chunk_size:       # the data is shorter than a chunk: each chunk is all of it
        chunks_per_epoch  = passes
        batches_per_chunk = T // batch_size
    else:
        batches_per_chunk = chunk_size // batch_size
        chunks_per_epoch  = batches_per_epoch // batches_per_chunk

With ``world_size = W`` ranks, :func:`plan_epoch` splits the epoch's chunks evenly:
each rank gets ``chunks_per_epoch = total // W`` (floor, so every rank has the same
count and none waits at the epoch's end), and one epoch across all ranks is one
epoch's worth of data, less at most ``W - 1`` chunks. Fewer chunks than ranks is an
error rather than a silent repeat.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._errors import ConfigError, check_int

__all__ = ["EpochPlan", "calculate_chunk_params", "plan_epoch"]


@dataclass(frozen=True, kw_only=True)
class EpochPlan:
    """The result of :func:`plan_epoch`.

    ``chunks_per_epoch`` is per rank (what ``loader.epoch(n)`` takes on every rank);
    ``global_chunks_per_epoch = chunks_per_epoch * world_size`` is the epoch's length
    in global window indices; ``batches_per_chunk`` is per chunk; ``batches_per_epoch``
    is the formula's count for the whole data (all ranks together).
    """

    total_timesteps: int
    chunk_size: int
    batch_size: int
    passes_per_epoch: int
    world_size: int
    chunks_per_epoch: int
    batches_per_chunk: int
    batches_per_epoch: int

    @property
    def global_chunks_per_epoch(self) -> int:
        """Chunks per epoch over all ranks together."""
        return self.chunks_per_epoch * self.world_size

    @property
    def chunk_batches(self) -> int:
        """Batches per epoch (per rank) of a consumer that draws ``batches_per_chunk`` from
        each of ``chunks_per_epoch`` chunks, as the trainer does: at most
        ``batches_per_epoch`` (the formula's, which floors ``T // batch_size`` once)."""
        return self.chunks_per_epoch * self.batches_per_chunk

    def describe(self) -> str:
        """A one-line summary for logs: the batches that run, then the formula's count."""
        per_rank = f" per rank (world_size={self.world_size})" if self.world_size > 1 else ""
        passes = "pass" if self.passes_per_epoch == 1 else "passes"
        return (
            f"{self.chunks_per_epoch} chunks/epoch{per_rank} x {self.batches_per_chunk} "
            f"batches/chunk = {self.chunk_batches} batches/epoch (T={self.total_timesteps}, "
            f"chunk_size={self.chunk_size}, batch_size={self.batch_size}, "
            f"{self.passes_per_epoch} {passes}; T // batch_size x passes = "
            f"{self.batches_per_epoch})"
        )

    def __str__(self) -> str:
        return self.describe()


def plan_epoch(
    total_timesteps: int,
    chunk_size: int,
    batch_size: int,
    passes_per_epoch: int = 1,
    *,
    world_size: int = 1,
    segments: object = None,
    pieces: int = 1,
) -> EpochPlan:
    """Chunks per epoch (per rank), batches per chunk and batches per epoch.

    See the module docstring for the rule. With ``segments`` (anything
    :class:`~chunkstream.Segments` takes, or a CSV/JSON path), checked against
    ``[0, total_timesteps)``, an epoch is ``passes_per_epoch`` passes of a
    loader with these ``segments`` and ``pieces`` (``align=1``, no skipped
    segments): ``chunks_per_epoch`` counts the chunks a pass reads, every chunk
    feeds ``batches_per_chunk`` batches, and ``total_timesteps`` is what a pass
    reads: the whole tiles of ``chunk_size // pieces`` in each segment at least
    that long, and all of every shorter one (they are pooled, so a chunk holds
    pieces of several of them). Raises :class:`ConfigError` (a
    ``ValueError``) naming the input to change when any count would be zero.
    """
    total = check_int(
        "total_timesteps", total_timesteps, 1, "Pass a positive total_timesteps.", numpy=True
    )
    chunk = check_int("chunk_size", chunk_size, 1, "Pass a positive chunk_size.", numpy=True)
    k = check_int("pieces", pieces, 1, "Pass the loader's pieces (1: contiguous).", numpy=True)
    if chunk % k:
        raise ConfigError.bad(
            "pieces", k, f"a divisor of chunk_size={chunk}", "Pass the loader's pieces."
        )
    pass_chunks = None  # with segments: the chunks of one pass of the plan
    if segments is not None:
        from ._segments import as_segments

        piece = chunk // k
        lengths = [len(s) for s in as_segments(segments, total)]
        pool = sum(n for n in lengths if n < piece)
        total = sum(n // piece * piece for n in lengths if n >= piece) + pool
        tiles = sum(n // piece for n in lengths if n >= piece) + -(-pool // piece)
        pass_chunks = -(-tiles // k)
    batch = check_int("batch_size", batch_size, 1, "Pass a positive batch_size.", numpy=True)
    passes = check_int(
        "passes_per_epoch", passes_per_epoch, 1, "Pass a positive passes_per_epoch.", numpy=True
    )
    world = check_int("world_size", world_size, 1, "Pass a positive world_size.", numpy=True)

    batches_per_epoch = (total // batch) * passes
    if batches_per_epoch == 0:
        raise ConfigError.bad(
            "batch_size",
            batch,
            f"at most total_timesteps={total}",
            "Lower batch_size: not one batch fits in the data.",
        )
    if total < chunk:
        chunks_total = passes
        batches_per_chunk = total // batch
    else:
        batches_per_chunk = chunk // batch
        if batches_per_chunk == 0:
            raise ConfigError.bad(
                "chunk_size",
                chunk,
                f"at least batch_size={batch}",
                "Raise chunk_size or lower batch_size: not one batch fits in a chunk.",
            )
        chunks_total = batches_per_epoch // batches_per_chunk
    if pass_chunks is not None:  # whole passes, the last chunk of each (maybe part full) too
        chunks_total = pass_chunks * passes
        batches_per_epoch = chunks_total * batches_per_chunk
    if chunks_total == 0:  # unreachable for valid ints; kept so the rule is total
        raise ConfigError.bad(
            "passes_per_epoch", passes, "enough passes for one chunk", "Raise passes_per_epoch."
        )
    if chunks_total < world:
        raise ConfigError.bad(
            "world_size",
            world,
            f"at most the epoch's {chunks_total} chunks",
            "Lower world_size, or lower chunk_size / raise passes_per_epoch so every "
            "rank gets at least one chunk.",
        )
    return EpochPlan(
        total_timesteps=total,
        chunk_size=chunk,
        batch_size=batch,
        passes_per_epoch=passes,
        world_size=world,
        chunks_per_epoch=chunks_total // world,
        batches_per_chunk=batches_per_chunk,
        batches_per_epoch=batches_per_epoch,
    )


def calculate_chunk_params(
    total_timesteps: int, chunk_size: int, batch_size: int, data_passes_per_epoch: int
) -> tuple[int, int, int]:
    """``(chunks_per_epoch, batches_per_chunk, batches_per_epoch)``, as the original."""
    passes = check_int(
        "data_passes_per_epoch",
        data_passes_per_epoch,
        1,
        "Pass a positive data_passes_per_epoch.",
        numpy=True,
    )
    plan = plan_epoch(total_timesteps, chunk_size, batch_size, passes)
    return plan.chunks_per_epoch, plan.batches_per_chunk, plan.batches_per_epoch
