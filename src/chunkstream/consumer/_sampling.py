"""Batches of short windows drawn inside a chunk, on the chunk's device.

A chunk of ``L`` timesteps holds ``L - window + 1`` windows of length ``window``;
their starts are ``0 .. L - window``. A pieced chunk (``chunk.pieces``, see
:class:`~chunkstream.Chunk`) holds only the windows that lie inside one piece:
``offset .. offset + length - window`` for each piece (a piece shorter than the
window gives none), and every draw is uniform over all of them. With
``align=k`` only starts whose absolute timestep (the piece's ``start`` plus the
row's offset in the piece, counted within its recording for a
:class:`~chunkstream.Recordings`; for a bare tensor or length, the row itself) is a
multiple of ``k`` are drawn, uniformly over all such starts: windows aligned to
an acquisition period (``time_units``). ``align=1`` (the default) is every start,
drawn exactly as when ``align`` is not passed. Two ways to draw them:

* :func:`sample_windows`: one batch of starts, uniform, with replacement by
  default (the original behaviour) or distinct within the batch;
* :class:`WindowSampler`: an iterable over one pass of the chunk; without
  replacement it yields every start exactly once per pass (the last batch may be
  short unless ``drop_last``), with replacement ``len(sampler)`` uniform batches.

:func:`gather_windows` turns starts into a ``(B, window, *rest)`` batch: on a
device with one ``index_select`` over an ``unfold`` view of the chunk (no host
round trip, no index tensor, nothing allocated but the batch, or nothing at all
with ``out=``); on the CPU with one slice copy per window in the calling thread
(:mod:`chunkstream.pipeline._held`), which keeps its speed on a busy machine.
With ``dtype=`` a float16 chunk stays float16 on the device and only the batch
is converted (bool and integer fields keep their dtype).

Random numbers come from ``generator`` (which must live on the chunk's device, so
that drawing never copies between host and device) or torch's default generator
for that device. A trainer that wants resumable batches seeds a generator per
chunk from ``(seed, epoch, chunk index)``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from .._errors import ConfigError, check_int
from ..pipeline import Chunk, check_host_starts, compute_dtype, gather_on_lent
from ..plans import Piece, window_in_chunk

__all__ = [
    "WindowSampler",
    "check_align",
    "gather_windows",
    "local_pieces",
    "piece_starts",
    "sample_windows",
]


def _positive_int(name: str, value: object) -> int:
    return check_int(name, value, 1, f"Pass a positive {name}.")


def check_align(align: object) -> int:
    """``align`` as an int >= 1, or a :class:`ConfigError` naming it."""
    return check_int(
        "align",
        align,
        1,
        "Use align=1 for every window start, or the period (e.g. time_units) that window "
        "starts must be multiples of.",
    )


def _num_starts(length: int, window: int) -> int:
    window = window_in_chunk(_positive_int("window", window), length)
    return length - window + 1


def piece_starts(
    pieces: Sequence[Piece],
    window: int,
    device: str | torch.device | None = None,
    *,
    align: int = 1,
) -> torch.Tensor:
    """Every valid window start of a pieced chunk, ascending, as a long tensor on ``device``.

    Starts are row offsets ``p.offset .. p.offset + p.length - window`` of each
    piece ``p`` long enough for the window, keeping those whose timestep
    ``p.start + row - p.offset`` is a multiple of ``align``. Raises
    :class:`ConfigError` when no piece holds one (naming ``window`` when no
    piece is long enough, else ``align``).
    """
    window = _positive_int("window", window)
    align = check_align(align)
    ranges = []
    for p in pieces:
        first = -(-p.start // align) * align  # the first aligned timestep in the piece
        last = p.stop - window  # the last timestep a window may start at
        if first <= last:
            shift = p.offset - p.start  # timestep -> row
            ranges.append(torch.arange(first + shift, last + shift + 1, align))
    if not ranges:
        longest = max((p.stop - p.start for p in pieces), default=0)
        if longest >= window:  # windows fit, but none starts on the grid
            raise ConfigError.bad(
                "align",
                align,
                f"a period that leaves a window start on a multiple of it in some piece "
                f"(pieces of up to {longest} timesteps, window={window})",
                "Lower align, use longer pieces or chunks (fewer pieces, a larger chunk_size), "
                "a shorter window, or align the chunks too (ChunkLoader(align=...)).",
            )
        raise ConfigError.bad(
            "window",
            window,
            f"at most the chunk's longest piece ({longest} timesteps)",
            "No window fits inside one piece: use fewer pieces, a larger chunk_size, longer "
            "segments or a shorter window.",
        )
    starts = torch.cat(ranges)
    device = torch.device(device or "cpu")
    if device.type == "cuda":
        # From page-locked memory, asynchronously: a pageable host-to-device copy is a
        # synchronizing CUDA call, once per chunk in a training loop. torch's caching host
        # allocator keeps the pinned block until the copy has run.
        return starts.pin_memory().to(device, non_blocking=True)
    return starts.to(device)


def local_pieces(chunk: Chunk) -> tuple[Piece, ...]:
    """``chunk``'s pieces with their timesteps counted within their own recording
    (:attr:`~chunkstream.Chunk.origins`), so that ``align`` holds per recording."""
    if chunk.offsets == (0,):
        return chunk.pieces
    return tuple(
        Piece(p.offset, o.start, o.stop, p.segment)
        for p, o in zip(chunk.pieces, chunk.origins, strict=True)
    )


def _starts_table(
    chunk_or_length, window: int, align: int, length: int, device: torch.device
) -> torch.Tensor | None:
    """The valid window starts as a table (cached on a chunk), or None when they are ``0 .. n-1``.

    A table is needed for a pieced chunk or ``align > 1``; a tensor or an int
    length is one piece starting at timestep 0.
    """
    is_chunk = isinstance(chunk_or_length, Chunk)
    if align == 1 and (not is_chunk or len(chunk_or_length.pieces) == 1):
        return None  # every row start: drawn as today, without a table
    if not is_chunk:
        _num_starts(length, window)  # the plain "window longer than the chunk" error first
        return piece_starts((Piece(0, 0, length),), window, device, align=align)
    if len(chunk_or_length.pieces) == 1:
        _num_starts(length, window)
    key = window if align == 1 else (window, align)
    cache = chunk_or_length._starts
    if key not in cache:
        cache[key] = piece_starts(local_pieces(chunk_or_length), window, device, align=align)
    return cache[key]


def _length_and_device(chunk_or_length, device) -> tuple[int, torch.device]:
    if isinstance(chunk_or_length, torch.Tensor):
        return int(chunk_or_length.shape[0]), chunk_or_length.device
    length = getattr(chunk_or_length, "length", None)
    if length is not None:  # a Chunk
        return int(length), chunk_or_length.device
    if isinstance(chunk_or_length, bool) or not isinstance(chunk_or_length, int):
        raise ConfigError.bad(
            "chunk_or_length", type(chunk_or_length).__name__, "a Chunk, a tensor or an int length"
        )
    return _positive_int("chunk_or_length", chunk_or_length), torch.device(device or "cpu")


def _check_generator(generator: torch.Generator | None, device: torch.device) -> None:
    if generator is not None and generator.device.type != device.type:
        raise ConfigError.bad(
            "generator",
            f"a generator on {generator.device}",
            f"a generator on the chunk's device ({device})",
            f"Create it with torch.Generator(device={str(device)!r}): drawing on another "
            "device would copy every batch between host and device.",
        )


def sample_windows(
    chunk_or_length,
    batch_size: int,
    window: int,
    generator: torch.Generator | None = None,
    *,
    replacement: bool = True,
    device: str | torch.device | None = None,
    align: int = 1,
) -> torch.Tensor:
    """``batch_size`` window starts in ``[0, L - window]`` as a long tensor on the chunk's device.

    ``chunk_or_length`` is a :class:`~chunkstream.Chunk`, a tensor (its axis 0 is
    time) or an int length (then ``device``, default CPU). A pieced chunk's
    starts are uniform over the windows that lie inside one piece. With
    ``align=k`` only starts at absolute timesteps that are multiples of ``k``
    are drawn (a chunk's timesteps come from its pieces; a tensor's or a
    length's rows count from 0); a chunk with none raises :class:`ConfigError`.
    With ``replacement=False`` the starts in one batch are distinct, which
    needs ``batch_size`` at most the number of valid starts.
    """
    length, dev = _length_and_device(chunk_or_length, device)
    batch_size = _positive_int("batch_size", batch_size)
    table = _starts_table(chunk_or_length, window, check_align(align), length, dev)
    n = _num_starts(length, window) if table is None else int(table.numel())
    _check_generator(generator, dev)
    if replacement:
        idx = torch.randint(0, n, (batch_size,), generator=generator, device=dev)
        return idx if table is None else table[idx]
    if batch_size > n:
        raise ConfigError.bad(
            "batch_size",
            batch_size,
            f"at most {n} (the windows in a chunk of {length}) when replacement=False",
            "Use replacement=True, a smaller batch_size or a larger chunk.",
        )
    idx = torch.randperm(n, generator=generator, device=dev)[:batch_size]
    return idx if table is None else table[idx]


class WindowSampler:
    """Batches of window starts over one pass of a chunk of ``chunk_len`` timesteps.

    Without replacement (the default) one pass is one random permutation of all
    ``chunk_len - window + 1`` starts, cut into batches of ``batch_size``
    (views of the permutation: no allocation per batch): every start appears
    exactly once per pass. With replacement a pass is ``len(self)`` independent
    uniform batches of ``batch_size``, the same count as without. Iterating again starts a new pass with fresh randomness.

    ``pieces`` (a pieced chunk's ``chunk.pieces``) limits the starts to the windows
    inside one piece; ``chunk_len`` is then the chunk's ``length``. ``align=k``
    keeps only starts at absolute timesteps that are multiples of ``k``, counted
    from the pieces (pass ``pieces=chunk.pieces``, also for a contiguous chunk, so
    that the chunk's start counts) or, without ``pieces``, from row 0.
    """

    def __init__(
        self,
        chunk_len: int,
        window: int,
        batch_size: int,
        generator: torch.Generator | None = None,
        replacement: bool = False,
        *,
        drop_last: bool = False,
        device: str | torch.device | None = None,
        pieces: Sequence[Piece] | None = None,
        align: int = 1,
    ) -> None:
        self.chunk_len = _positive_int("chunk_len", chunk_len)
        self.window = window
        self.batch_size = _positive_int("batch_size", batch_size)
        self.device = (
            torch.device(device)
            if device is not None
            else (generator.device if generator is not None else torch.device("cpu"))
        )
        _check_generator(generator, self.device)
        self.align = check_align(align)
        if self.align > 1 and not pieces:
            _num_starts(self.chunk_len, window)
            pieces = (Piece(0, 0, self.chunk_len),)
        tabled = pieces and (len(pieces) > 1 or self.align > 1)
        self._table = (
            piece_starts(pieces, window, self.device, align=self.align) if tabled else None
        )
        self.num_starts = (
            _num_starts(self.chunk_len, window) if self._table is None else self._table.numel()
        )
        self.generator = generator
        self.replacement = bool(replacement)
        self.drop_last = bool(drop_last)

    def __len__(self) -> int:
        """Batches per pass."""
        full, rest = divmod(self.num_starts, self.batch_size)
        return full if (self.drop_last or rest == 0) else full + 1

    def __iter__(self) -> Iterator[torch.Tensor]:
        n, b, gen, dev = self.num_starts, self.batch_size, self.generator, self.device
        table = self._table
        if self.replacement:
            for _ in range(len(self)):
                idx = torch.randint(0, n, (b,), generator=gen, device=dev)
                yield idx if table is None else table[idx]
            return
        perm = torch.randperm(n, generator=gen, device=dev)
        if table is not None:
            perm = table[perm]
        for i in range(len(self)):
            yield perm[i * b : (i + 1) * b]

    def __repr__(self) -> str:
        return (
            f"WindowSampler(chunk_len={self.chunk_len}, window={self.window}, "
            f"batch_size={self.batch_size}, replacement={self.replacement}, "
            f"align={self.align}, device={self.device})"
        )


def gather_windows(
    tensor: torch.Tensor,
    starts: torch.Tensor,
    window: int,
    *,
    out: torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``out[b] = tensor[starts[b] : starts[b] + window]``: shape ``(B, window, *rest)``.

    Runs on ``tensor``'s device: ``starts`` must be a long tensor there, with
    values in ``[0, len(tensor) - window]`` (on a device checked by the kernel,
    so no value is read back to the host; on the CPU checked here, a
    :class:`ConfigError`). The CPU gather copies each window in the calling
    thread (one slice copy each, :mod:`chunkstream.pipeline._held`), not on
    torch's intra-op pool; a tensor
    that requires grad takes ``index_select``. ``out``, when given, is filled and
    returned (shape ``(B, window, *rest)``, the result's dtype, ``tensor``'s
    device), so a loop can reuse one batch buffer.

    ``dtype`` is the compute dtype of a floating-point chunk (``torch.float16``,
    ``bfloat16``, ``float32`` or ``float64``): the batch is gathered in the
    stored dtype and converted on the device, so only the batch, never the
    chunk, exists in ``dtype`` (float16 -> float32 is exact, as
    ``x.half().float()``). Chunks of bool or integer dtype (masks, indices)
    gather as stored whatever ``dtype`` says; ``None`` keeps the stored dtype.
    """
    if tensor.dim() < 1:
        raise ConfigError.bad("tensor", "a 0-d tensor", "a tensor with a time axis 0")
    _num_starts(int(tensor.shape[0]), window)
    target = compute_dtype(dtype, tensor.dtype)
    if starts.device != tensor.device or starts.dtype != torch.long or starts.dim() != 1:
        raise ConfigError.bad(
            "starts",
            f"{starts.dtype} {tuple(starts.shape)} on {starts.device}",
            f"a 1-d torch.long tensor on {tensor.device}",
            "Draw it with cs.sample_windows(chunk, ...) or a WindowSampler on the chunk's device.",
        )
    if tensor.device.type == "cpu" and not tensor.requires_grad:
        return _gather_on_host(tensor, starts, window, out, target)
    # unfold gives every window as a view (n, *rest, window); movedim puts time second.
    windows = tensor.unfold(0, window, 1).movedim(-1, 1)
    if target == tensor.dtype:
        if out is None:
            return torch.index_select(windows, 0, starts)
        return torch.index_select(windows, 0, starts, out=out)
    # index_select cannot convert: gather the batch as stored, then convert it alone.
    batch = torch.index_select(windows, 0, starts)
    if out is None:
        return batch.to(target)
    if out.dtype != target:
        raise ConfigError.bad(
            "out",
            f"a {out.dtype} tensor",
            f"a {target} tensor (dtype={target})",
            "Allocate out with the dtype the batch is converted to.",
        )
    return out.copy_(batch)


def _gather_on_host(
    tensor: torch.Tensor,
    starts: torch.Tensor,
    window: int,
    out: torch.Tensor | None,
    target: torch.dtype,
) -> torch.Tensor:
    """The CPU gather: one slice copy per window, in this thread and the readers of an open
    CPU loader (:func:`~chunkstream.pipeline._held.gather_on_lent`)."""
    values = check_host_starts(starts, int(tensor.shape[0]), window)
    shape = (len(values), window, *tensor.shape[1:])
    if out is None:
        out = torch.empty(shape, dtype=target)
    elif out.dtype != target or tuple(out.shape) != shape or out.device.type != "cpu":
        raise ConfigError.bad(
            "out",
            f"a {out.dtype} tensor of shape {tuple(out.shape)} on {out.device}",
            f"a {target} tensor of shape {shape} on the cpu",
            "Allocate out with the batch's shape and the dtype it is converted to.",
        )
    gather_on_lent(tensor, out, values, window)
    return out
