"""Streaming statistics for the trainer: per-neuron moments and loss accumulators.

:class:`RunningMoments` merges each chunk's count, mean and sum of squared
deviations into the running ones (Chan et al.'s parallel form of Welford's
update, in float64), so the per-neuron mean and variance of the training split
come from the streamed chunks alone. The constant model that predicts that mean
everywhere has a training loss equal to the mean variance: the baseline the
original implementation could not compute without holding all the data.
Counts are per neuron: with a mask (a :class:`~chunkstream.Recordings` of
different widths pads the narrower recordings with zeros and marks the real
values in ``<field>_mask``) a neuron counts only the timesteps of recordings
that have it, so the padding moves neither the baseline's mean nor its loss.
Under torch.distributed, :func:`all_reduce_moments` combines every rank's
moments the same way (counts summed, means count-weighted, each M2 shifted by
``count * (mean_r - mean)**2``), so every rank ends with the moments of all
ranks' rows.

Each chunk is merged in blocks of rows (:attr:`RunningMoments.block_bytes` of
float64 per block), and the block's float64 copy is centred and squared in
place: at most ``3 * block_bytes`` of temporaries whatever the chunk size (the
copy plus what torch's column reductions allocate: 3.0 blocks measured on an
H200 by ``tests/test_gpu.py``, 4.0 before the in-place update), where converting a whole 3.6 GB float32 chunk at once would take
~14 GB of device memory for a moment (a float64 copy plus a temporary of the
same size) and break the streaming memory bound.

:class:`LossMeter` sums loss components on the device (no host sync per batch)
and reports means; a component with nothing accumulated has mean 0.0 and is
left out of :meth:`LossMeter.means`, never a division by zero.
"""

from __future__ import annotations

import torch

from ..sources import MASK_SUFFIX

__all__ = ["LossMeter", "RunningMoments", "all_reduce_moments", "masked_field", "masked_mse"]


def masked_field(source: object, field: str) -> str | None:
    """The name of ``field``'s mask in ``source`` (a ``Recordings`` of different widths
    pads the field and adds ``<field>_mask``), or ``None`` where every value is real."""
    name = field + MASK_SUFFIX
    fields = getattr(source, "fields", None) or {}
    return name if name in fields else None


def masked_mse(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The mean squared error over the values ``mask`` marks real (all without a mask):
    a padded neuron neither adds to the sum nor to the count, so a window of a
    narrower recording has the loss it would have unpadded."""
    if mask is None:
        return torch.nn.functional.mse_loss(pred, target)
    w = mask.to(pred.dtype)
    return ((pred - target) ** 2 * w).sum() / w.sum().clamp(min=1)


class RunningMoments:
    """Per-feature counts, mean and M2 over rows streamed in with :meth:`update`.

    ``count`` is the number of rows merged; ``counts`` (float64, per feature) the
    number of values each feature contributed: every row's, or with a ``mask`` only
    those it marks real, so a neuron a recording lacks (zero padding) moves neither
    its mean nor its variance nor :meth:`constant_loss`.
    """

    #: Bytes of float64 per block of rows merged at once (module docs).
    block_bytes = 32 << 20

    def __init__(self, features: int, device: str | torch.device = "cpu") -> None:
        self.count = 0
        self.counts = torch.zeros(features, dtype=torch.float64, device=device)
        self.mean = torch.zeros(features, dtype=torch.float64, device=device)
        self.m2 = torch.zeros(features, dtype=torch.float64, device=device)

    def block_rows(self, features: int | None = None) -> int:
        """Rows per block: ``block_bytes`` of float64 (at least one row)."""
        width = max(1, self.mean.numel() if features is None else features)
        return max(1, self.block_bytes // (8 * width))

    def update(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Merge rows ``x`` of shape ``(T, features)``, one block of rows at a time;
        ``mask`` (``x``'s shape, true where a value is real) leaves the others out."""
        if mask is not None and mask.shape != x.shape:
            raise ValueError(
                f"mask of shape {tuple(mask.shape)} for rows of shape {tuple(x.shape)}: "
                "pass the mask of these rows (the same shape, true where a value is real)."
            )
        n = int(x.shape[0])
        step = self.block_rows(int(x[0].numel()) if n else None)
        for begin in range(0, n, step):
            block = slice(begin, begin + step)
            self._merge_rows(x[block], None if mask is None else mask[block])

    def _merge_rows(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        rows = int(x.shape[0])
        if rows == 0:
            return
        # One float64 copy of the block, worked on in place: the block is the only
        # temporary of its size (an out-of-place ``(x - mean) ** 2`` held three or four);
        # a mask adds its own float64 block.
        x = x.to(self.mean.device, torch.float64, copy=True)
        if mask is None:
            n: torch.Tensor | float = float(rows)
            mean = x.mean(dim=0)
            m2 = x.sub_(mean).square_().sum(dim=0)
        else:
            w = mask.to(self.mean.device, torch.float64)
            n = w.sum(dim=0)
            mean = x.mul_(w).sum(dim=0) / n.clamp(min=1)
            m2 = x.sub_(mean).mul_(w).square_().sum(dim=0)
        self._combine(n, mean, m2)
        self.count += rows

    def _combine(self, n: torch.Tensor | float, mean: torch.Tensor, m2: torch.Tensor) -> None:
        """Chan et al.'s merge of ``n`` values per feature (mean, M2) into these, per feature
        (a feature that neither side counted stays at zero)."""
        total = self.counts + n
        delta = mean - self.mean
        self.mean += delta * (n / total.clamp(min=1))
        self.m2 += m2 + delta**2 * (self.counts * n / total.clamp(min=1))
        self.counts = total

    def merge(self, other: RunningMoments) -> None:
        """Merge another set of moments over the same features (Chan et al.)."""
        if other.count == 0:
            return
        device = self.mean.device
        self._combine(
            other.counts.to(device, torch.float64),
            other.mean.to(device, torch.float64),
            other.m2.to(device, torch.float64),
        )
        self.count += other.count

    @property
    def var(self) -> torch.Tensor:
        """Population variance per feature over its counted values (zero where none)."""
        return self.m2 / self.counts.clamp(min=1)

    def constant_loss(self) -> float:
        """MSE of predicting each feature's mean for every value counted (0.0 when empty):
        without a mask, the mean variance."""
        total = float(self.counts.sum())
        return float(self.m2.sum()) / total if total else 0.0

    def state_dict(self) -> dict:
        return {
            "count": self.count,
            "counts": self.counts.cpu(),
            "mean": self.mean.cpu(),
            "m2": self.m2.cpu(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`; a state without ``"counts"`` (saved before the
        counts were per feature, when every feature counted every row) is read exactly
        as ``count`` values per feature."""
        device = self.mean.device
        self.count = int(state["count"])
        if "counts" in state:
            self.counts = state["counts"].to(device, torch.float64)
        else:
            self.counts = torch.full_like(self.mean, float(self.count))
        self.mean = state["mean"].to(device, torch.float64)
        self.m2 = state["m2"].to(device, torch.float64)


def all_reduce_moments(moments: RunningMoments, group=None) -> RunningMoments:
    """Every rank's moments combined, returned on every rank (a collective call).

    Per feature ``N = sum n_r``, ``mean = sum n_r * mean_r / N`` and
    ``M2 = sum (M2_r + n_r * (mean_r - mean)**2)``: exact, in float64, and
    independent of how the rows were split across ranks.
    """
    import torch.distributed as dist

    device = moments.mean.device
    # The per-feature counts and the rows in one call.
    counts = torch.cat([moments.counts, moments.counts.new_tensor([float(moments.count)])])
    dist.all_reduce(counts, group=group)
    out = RunningMoments(moments.mean.numel(), device)
    rows = int(counts[-1].item())
    if rows == 0:
        return out
    total = counts[:-1]
    weighted = moments.mean * moments.counts
    dist.all_reduce(weighted, group=group)
    mean = weighted / total.clamp(min=1)
    m2 = moments.m2 + moments.counts * (moments.mean - mean) ** 2
    dist.all_reduce(m2, group=group)
    out.count, out.counts, out.mean, out.m2 = rows, total, mean, m2
    return out


class LossMeter:
    """Sums of named loss components kept on the device; means are safe when empty."""

    def __init__(self) -> None:
        self._sums: dict[str, torch.Tensor] = {}
        self._counts: dict[str, int] = {}

    def add(self, name: str, value: torch.Tensor) -> None:
        """Accumulate one batch's value of ``name`` (detached; stays on its device)."""
        value = value.detach()
        self._sums[name] = self._sums[name] + value if name in self._sums else value.clone()
        self._counts[name] = self._counts.get(name, 0) + 1

    def mean(self, name: str) -> float:
        """The mean of ``name`` over its batches; 0.0 when nothing was accumulated."""
        count = self._counts.get(name, 0)
        return float(self._sums[name]) / count if count else 0.0

    def means(self) -> dict[str, float]:
        """Means of every component that was accumulated at least once."""
        return {name: self.mean(name) for name in self._sums}

    def count(self, name: str) -> int:
        return self._counts.get(name, 0)
