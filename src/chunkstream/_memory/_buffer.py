"""Where the shuffle buffer lives, how many chunks it holds, and what that costs the model.

Two tiers (``BatchStream(buffer=)``):

* ``"device"``: the buffer's chunks on the loader's device, each batch gathered
  there (``index_select`` on CUDA). Device memory: ``mix`` chunks.
* ``"host"``: the buffer's chunks in one host arena allocated at the first
  chunk, each batch read on the host by the loader's batch readers into a few
  reused buffer sets and, on CUDA, copied to the device on the loader's transfer
  stream (:mod:`chunkstream.pipeline._lane`). The loader then runs on the CPU (``ChunkLoader(device="cpu")``)
  and ``BatchStream(device="cuda")`` names where batches go; device memory is
  the batches in flight. Host memory is the larger and cheaper one, so the
  buffer can hold a large share of the training split.

``"auto"`` takes the host tier when the loader is on the CPU (batches to the
CPU or to a CUDA device), the device tier when it is on a CUDA device. On the
CPU both tiers are host memory and draw the same windows; the host tier
gathers into reused slots (no fresh pages per batch) and ahead of the consumer.
``mix="auto"`` sizes the buffer by the defaults' policy (:mod:`._defaults`): on
the host tier from ``host_memory`` (default :data:`HOST_SHARE` of what this
rank's share of the job's host memory leaves beside the loader's own arena,
cgroup limits and the ranks on the node included), up to the chunks of one pass
over the split; on the device tier
:data:`DEVICE_MIX` chunks, fewer when they would take more than
:data:`DEVICE_SHARE` of the device's memory.

What decides model quality is the share of the training split the buffer holds
(:func:`quality_note`; figures from the quality race in BENCHMARKS.md).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from .._errors import ConfigError, check_int
from .._text import format_bytes
from ._defaults import DEVICE_MIX, DEVICE_SHARE, HOST_SHARE, device_fit, host_fit, host_terms
from ._node import NodeShare, node_share

__all__ = [
    "DEVICE_MIX",
    "DEVICE_SHARE",
    "HOST_SHARE",
    "BufferInfo",
    "check_buffer",
    "check_mix",
    "choose_tier",
    "default_buffer",
    "host_tier_hint",
    "plan_buffer",
    "quality_note",
]

_log = logging.getLogger(__name__)

#: Below this share of the split the buffer's quality cost is worth a note.
NOTE_BELOW = 0.10

# Measured validation loss over i.i.d. at a buffer share (issue 28's race at 8x the
# demo's length, pieces=32, 2 seeds): (share, "how much worse").
_QUALITY = ((0.02, "~6%"), (0.09, "~2-3%"), (0.25, "~1%"))

_BUFFERS = ("auto", "host", "device")


def check_mix(mix: object) -> int:
    """``mix`` as an int >= 1, or a :class:`ConfigError` naming it."""
    return check_int(
        "mix",
        mix,
        1,
        "Pass mix=1 to draw each batch from one chunk, or e.g. mix=8 to draw it over "
        "the last 8 chunks (memory: mix chunks held by the consumer; BatchStream also "
        "takes mix='auto').",
        expected="an int >= 1 (chunks held and mixed per batch; 1: no mixing)",
    )


def check_buffer(buffer: object) -> str:
    if buffer not in _BUFFERS:
        raise ConfigError.bad(
            "buffer",
            buffer,
            "one of 'auto', 'host', 'device'",
            "Use buffer='host' to hold the shuffle buffer in host memory (loader on the "
            "CPU, batches to BatchStream(device=)), 'device' to hold it with the chunks, "
            "or 'auto'.",
        )
    return str(buffer)


def quality_note(share: float) -> str:
    """A one-line note on the measured quality cost at ``share`` of the split ('' at >= 10%)."""
    if share >= NOTE_BELOW:
        return ""
    near = min(_QUALITY, key=lambda q: abs(q[0] - share))
    return (
        f"note: the shuffle buffer holds {share:.1%} of the training split; measured, a buffer "
        f"of {near[0]:.0%} gave {near[1]} worse validation loss than i.i.d. batches (25%: ~1%). "
        "A larger mix (buffer='host' for host memory) brings it closer."
    )


@dataclass(frozen=True)
class BufferInfo:
    """The shuffle buffer a :class:`~chunkstream.BatchStream` uses, and why.

    ``tier``: ``"host"`` or ``"device"``; ``mix``: chunks held; ``nbytes``: the
    buffer's bytes (``mix`` chunks of the chosen fields; 0 with ``mix=1``, which
    holds the loader's chunk); ``split_share``: the share of one pass over the
    training split it holds (``mix`` chunks over the chunks of a pass, at most
    1); ``pieces``: the independent pieces a batch is drawn from (``mix`` times
    the pieces per chunk); ``reason``: how the tier and ``mix`` were chosen;
    ``memory``: this process's share of the node that ``mix="auto"`` sized from,
    and where each figure came from (:meth:`chunkstream._memory.NodeShare.describe`,
    e.g. ``host memory: 1.2 GiB for this rank: 2.4 GiB left under the job's limit
    of 3 GiB (...), 2 ranks on this node (LOCAL_WORLD_SIZE); 1 CPU of 2 (affinity),
    1 thread for this rank``; '' when no host memory was read); ``terms``: on the
    host tier, every term of this rank's host memory as ``(what, bytes)``
    (:func:`~chunkstream._memory._defaults.host_terms`: the process when it sized,
    the loader's arena, the batch sets, the source's decode scratch and whatever
    else the caller counted, the buffer, what is left), one line each in
    :meth:`describe`.
    """

    tier: str
    mix: int
    nbytes: int
    split_share: float
    pieces: int
    reason: str
    memory: str = ""
    terms: tuple[tuple[str, int], ...] = ()

    @property
    def note(self) -> str:
        """The quality note below 10% of the split (:func:`quality_note`), else ''."""
        return quality_note(self.split_share)

    def describe(self) -> str:
        """A line with tier, size, share of the split and pieces per batch; then a line per
        term of this rank's host memory (``terms``)."""
        head = (
            f"shuffle buffer: {self.tier} tier, mix={self.mix} chunks, "
            f"{format_bytes(self.nbytes)}, {self.split_share:.1%} of the split, "
            f"each batch over {self.pieces} pieces ({self.reason})"
            + (f"; {self.memory}" if self.memory else "")
        )
        lines = [f"  {what}: {format_bytes(n, binary=True)}" for what, n in self.terms]
        return "\n".join([head, *lines])


def resolve_mix(
    mix: object,
    tier: str,
    *,
    chunk_nbytes: int,
    pass_chunks: int,
    device: torch.device,
    host_memory: int | None,
    loader_nbytes: int,
    device_memory: int | None = None,
    share: NodeShare | None = None,
    held: Mapping[str, int] | None = None,
) -> tuple[object, str, str]:
    """``(mix, why, memory line)``: an int kept, ``"auto"`` sized for ``tier`` (:mod:`._defaults`)."""
    if mix != "auto":
        return mix, f"mix={mix} as given", ""
    if tier == "host":
        return host_fit(
            chunk_nbytes=chunk_nbytes,
            pass_chunks=pass_chunks,
            loader_nbytes=loader_nbytes,
            host_memory=host_memory,
            share=share,
            held=held,
        )
    fit, why = device_fit(
        chunk_nbytes=chunk_nbytes,
        pass_chunks=pass_chunks,
        device=device,
        device_memory=device_memory,
    )
    return fit, why, ""


def choose_tier(
    buffer: str,
    device: torch.device,
    *,
    loader_device: torch.device | None = None,
    mix: object = "auto",
    chunk_nbytes: int = 0,
    pass_chunks: int = 1,
    loader_nbytes: int = 0,
    host_memory: int | None = None,
    device_memory: int | None = None,
    share: NodeShare | None = None,
    held: Mapping[str, int] | None = None,
) -> tuple[str, str]:
    """``(tier, why)``: where the shuffle buffer lives for batches on ``device``; the one
    place the tier is chosen (``BatchStream``, the trainer, ``chunkstream plan``).

    ``loader_device``: the device of a loader already built (``BatchStream``'s):
    a CUDA loader holds the device tier, a CPU loader the host tier for batches on
    CUDA and ``buffer``'s choice on the CPU. ``None``: the caller builds its loader
    for the tier (the trainer, ``plan``): ``buffer`` when given; on CUDA with
    ``mix="auto"`` the host tier where it holds more chunks than the device tier may
    (sized from the other arguments, :mod:`._defaults`; each batch then costs a host
    gather and one copy to the device), else the device tier; on the CPU the host tier.
    """
    buffer = check_buffer(buffer)
    if loader_device is not None:
        return _loader_tier(buffer, loader_device, device)
    if buffer != "auto":
        return buffer, f"buffer={buffer!r}"
    if device.type != "cuda":
        return "host", "batches on the CPU: the buffer is host memory"
    if mix != "auto":
        return "device", f"mix={mix} given, held on {device}"
    on_host, _, _ = host_fit(
        chunk_nbytes=chunk_nbytes,
        pass_chunks=pass_chunks,
        loader_nbytes=loader_nbytes,
        host_memory=host_memory,
        share=share,
        held=held,
    )
    on_device, _ = device_fit(
        chunk_nbytes=chunk_nbytes,
        pass_chunks=pass_chunks,
        device=device,
        device_memory=device_memory,
    )
    if on_host > on_device:
        return "host", (
            f"the host holds {on_host} chunks where the device tier may hold {on_device}: "
            f"batches gathered on the host, each copied to {device}"
        )
    return "device", f"the device tier holds {on_device} chunks, the host no more"


def _loader_tier(buffer: str, source_device: torch.device, device: torch.device) -> tuple[str, str]:
    """``(tier, why)`` for ``buffer`` with the loader on ``source_device``, batches to ``device``."""
    if source_device.type == "cuda":
        if device != source_device:
            raise ConfigError.bad(
                "device",
                str(device),
                f"the loader's device {source_device} (or None)",
                "Batches of a CUDA loader stay on its device; for the host tier build the "
                "loader with device='cpu' and pass BatchStream(device='cuda', buffer='host').",
            )
        if buffer == "host":
            raise ConfigError.bad(
                "buffer",
                buffer,
                "'device' or 'auto' with a loader on a CUDA device",
                "The host tier holds host chunks: build the loader with device='cpu' and pass "
                "BatchStream(device='cuda', buffer='host').",
            )
        return "device", "the loader delivers chunks to the device"
    if device.type == "cuda":
        if buffer == "device":
            raise ConfigError.bad(
                "buffer",
                buffer,
                "'host' or 'auto' with a CPU loader and batches on CUDA",
                "Use buffer='host', or build the loader with device='cuda' for the device tier.",
            )
        return "host", f"the loader reads to host memory and batches go to {device}"
    if device.type != "cpu":
        raise ConfigError.bad("device", str(device), "None, 'cpu' or a CUDA device")
    if buffer == "device":
        return "device", "buffer='device'"
    # On the CPU both tiers are host memory; the host tier gathers into reused slots.
    return "host", f"buffer={buffer!r}: the loader and the batches are on the CPU"


def plan_buffer(
    mix: object,
    tier: str,
    *,
    chunk_nbytes: int,
    pass_chunks: int,
    pieces: int,
    device: torch.device,
    host_memory: int | None = None,
    loader_nbytes: int = 0,
    device_memory: int | None = None,
    why: str = "",
    share: NodeShare | None = None,
    held: Mapping[str, int] | None = None,
) -> BufferInfo:
    """The :class:`BufferInfo` of a buffer of ``mix`` chunks (``"auto"`` sized) on ``tier``.

    ``chunk_nbytes``: one chunk of the buffered fields; ``pass_chunks``: the
    chunks of one pass over the training split; ``pieces``: per chunk;
    ``held``: what else this rank allocates beside the loader's arena, by name
    (the batch sets, decode scratch), counted before the buffer is sized.
    """
    pass_chunks = max(1, int(pass_chunks))
    if tier == "host" and host_memory is None and share is None:
        share = node_share()  # read once: the size and the terms from one reading
    mix, sized, memory = resolve_mix(
        mix,
        tier,
        chunk_nbytes=chunk_nbytes,
        pass_chunks=pass_chunks,
        device=device,
        host_memory=host_memory,
        loader_nbytes=loader_nbytes,
        device_memory=device_memory,
        share=share,
        held=held,
    )
    mix = check_mix(mix)
    if mix > pass_chunks:
        # Honoured, never cut in silence: the buffer is kept across epochs, so it then
        # holds chunks of several passes (the trainer's resume test relies on it).
        sized += (
            f"; mix={mix} is more than the {pass_chunks} chunks of one pass: kept as given, "
            f"the buffer holds chunks of the last {-(-mix // pass_chunks)} passes and is "
            "allocated in full at the first chunk"
        )
        _log.warning(
            "shuffle buffer: mix=%d is more than the %d chunks of one pass over the training "
            "split; kept as given (it holds chunks of several passes, %.3g GB allocated at the "
            "first chunk). Pass mix=%d to hold the split once, or mix='auto'.",
            mix,
            pass_chunks,
            chunk_nbytes * mix / 1e9,
            pass_chunks,
        )
    nbytes = chunk_nbytes * mix if mix > 1 else 0
    terms = ()
    if tier == "host":
        terms = host_terms(
            buffer_nbytes=nbytes,
            loader_nbytes=loader_nbytes,
            held=held,
            share=share if host_memory is None else None,
        )
    return BufferInfo(
        tier=tier,
        mix=mix,
        nbytes=nbytes,
        split_share=min(1.0, mix / pass_chunks),
        pieces=mix * max(1, int(pieces)),
        reason=f"{tier} tier: {why + '; ' if why else ''}{sized}",
        memory=memory,
        terms=terms,
    )


def default_buffer(
    mix: object,
    *,
    device: torch.device,
    chunk_nbytes: int,
    pass_chunks: int,
    pieces: int,
    loader_nbytes: int,
    host_memory: int | None = None,
    device_memory: int | None = None,
    share: NodeShare | None = None,
    tier: str = "auto",
    held: Mapping[str, int] | None = None,
) -> BufferInfo:
    """The :class:`BufferInfo` a consumer that builds its own loader (the reference
    trainer) holds for batches on ``device``: the tier :func:`choose_tier` picks (``tier``,
    ``"host"`` or ``"device"`` as ``BatchStream(buffer=)``, overrides it), ``mix``
    (``"auto"`` sized) on it. ``loader_nbytes``: the loader's arena
    (:func:`chunkstream._memory.arena_bytes`); ``held``: what else the rank allocates
    (:func:`plan_buffer`)."""
    tier, why = choose_tier(
        tier,
        device,
        mix=mix,
        chunk_nbytes=chunk_nbytes,
        pass_chunks=pass_chunks,
        loader_nbytes=loader_nbytes,
        host_memory=host_memory,
        device_memory=device_memory,
        share=share,
        held=held,
    )
    return plan_buffer(
        mix,
        tier,
        chunk_nbytes=chunk_nbytes,
        pass_chunks=pass_chunks,
        pieces=pieces,
        device=device,
        host_memory=host_memory,
        loader_nbytes=loader_nbytes,
        device_memory=device_memory,
        why=why,
        share=share,
        held=held,
    )


def host_tier_hint(info: BufferInfo, device: torch.device) -> str:
    """What a CUDA loader's device-tier default would gain on the host tier (one log line):
    a ``BatchStream`` cannot move its loader, so the defaults' rule is said, not applied."""
    chunk = info.nbytes // info.mix if info.mix > 1 else 0
    if not chunk or info.split_share >= 1.0:
        return f"shuffle buffer: the device tier holds {info.split_share:.1%} of the split"
    pass_chunks = max(1, round(info.mix / info.split_share))
    on_host, _, line = host_fit(chunk_nbytes=chunk, pass_chunks=pass_chunks, loader_nbytes=0)
    if on_host <= info.mix:
        return f"shuffle buffer: the device tier holds {info.split_share:.1%} of the split"
    return (
        f"shuffle buffer: the device tier holds {info.split_share:.1%} of the split; the host "
        f"tier would hold {min(1.0, on_host / pass_chunks):.1%} ({line}). For it, build the "
        f"loader with device='cpu' and pass BatchStream(device='{device}'): each batch then "
        "costs a host gather and one copy to the device"
    )
