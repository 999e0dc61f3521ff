"""Delivery stages: how a window's pieces become a chunk's tensors on the loader's device.

The loader picks one stage at construction and orchestrates it; an
:class:`~chunkstream.pipeline._run.EpochRun` runs the stage's ``read`` on the
reader threads and, where the stage has one, its ``transfer`` on the single
transfer thread, in window order. The consumer side of a delivery (waiting for
its copy, telling the allocator where tensors are used) is the stage's
``receive``. Three stages exist:

* :class:`HostStage` (CPU): a reader fills a host buffer set, which becomes the
  user's zero-copy tensors.
* :class:`CopyStage` (CUDA or another accelerator): a reader fills a pinned slot,
  taken in window order; the transfer thread copies it to fresh device tensors on
  the transfer stream between two events and gives the slot back behind the second.
* :class:`ResidentStage`: the rows were read once onto the device; a reader serves
  a view (one piece) or a gather (several, on the transfer stream).

A decoder on the device would be one more stage: ``read`` fetches the compressed
bytes into a host buffer, ``transfer`` copies and decodes them on the stream.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from ._chunk import hand_over
from ._jobs import Delivery, copy_job, read_job, read_to_host
from ._resident import ResidentStore

__all__ = ["CopyStage", "DeliveryStage", "HostStage", "ResidentStage", "receive"]


def receive(delivery: Delivery, device: torch.device) -> Any:
    """The consumer's side of a delivery: its tensors, and the event they are ready at.

    With events (a copy or gather on the transfer stream) the consumer's current
    stream waits on the done event (the host does not) and ``record_stream`` tells the
    caching allocator the tensors are used there, so their blocks are not reused
    before the consumer's queued work has run.
    """
    if delivery.events is None:
        return delivery.tensors, None
    ready = delivery.events[1]
    hand_over(delivery.tensors.values(), ready, torch.cuda.current_stream(device))
    return delivery.tensors, ready


@dataclass(frozen=True)
class DeliveryStage:
    """What an :class:`EpochRun` needs from a stage.

    ``read(pieces, dropped, trip[, turn=])`` runs on a reader;
    ``transfer(result, dropped, trip)`` (``None``: no transfer thread) on the transfer
    thread after its read, and gives the read's buffer back (both stamp their timings on
    the window's :class:`~chunkstream.stats.Trip`); ``reclaim(result)`` gives back the buffer of a read no
    transfer will follow. ``depth``: reads in flight; ``ordered``: reads take their
    buffers in window order (pinned slots).
    """

    name: str
    read: Callable[..., Any]
    depth: int
    transfer: Callable[..., Delivery | None] | None = None
    reclaim: Callable[[Any], None] | None = None
    ordered: bool = False


def HostStage(pool: Future, depth: int, **reading: Any) -> DeliveryStage:
    """CPU: the readers' buffer sets become the user's tensors. ``pool``: the future of
    the host buffers (made at construction, or by the first epoch's learning job)."""
    return DeliveryStage("host", partial(read_to_host, pool=pool, **reading), depth)


def CopyStage(
    pool: Future,
    depth: int,
    *,
    device: torch.device,
    stream: Any,
    **reading: Any,
) -> DeliveryStage:
    """An accelerator: pinned slots (on CUDA) copied on the transfer thread."""
    return DeliveryStage(
        "copy",
        partial(read_job, pool=pool, **reading),
        depth,
        transfer=partial(copy_job, device=device, stream=stream),
        reclaim=lambda loaded: loaded.pool.release(loaded.buffers),
        ordered=True,
    )


def ResidentStage(store: ResidentStore, depth: int) -> DeliveryStage:
    """Resident rows: views and gathers of the device tensors, served by the readers."""
    return DeliveryStage("resident", store.serve, depth)
