"""The trainer's held-out split and the rollout validation on it.

:func:`split_source` divides a source's timesteps into the streamed training
range (or training segments) and the held-out ranges; :func:`held_out_parts`
loads those ranges onto the device with the window starts each rank validates;
:func:`evaluate` sums the model's rollout error and the constant baseline's on
them. Under torch.distributed each rank takes every ``world_size``-th window of
each range and the sums are all-reduced, so every rank gets the totals over all
of them.
"""

from __future__ import annotations

import dataclasses

import torch

from .._errors import ConfigError
from ..consumer import gather_windows
from ..distributed import is_distributed
from ..plans import HeldOutSplit, held_out_split, within_recordings
from ._config import TrainConfig, val_runs
from ._data import load_range

__all__ = [
    "HeldOut",
    "Split",
    "evaluate",
    "held_out_parts",
    "recordings_config",
    "split_source",
]

#: One held-out range on the device: ``(name, fields, this rank's window starts)``.
HeldOut = tuple[str, dict[str, torch.Tensor], torch.Tensor]


#: Where the trainer streams from and what it holds out (``plans.HeldOutSplit``).
Split = HeldOutSplit


def recordings_config(config: TrainConfig, source) -> TrainConfig:
    """``config`` for a :class:`~chunkstream.Recordings` ``source``: its recordings'
    bounds become the segments (given segments are cut at them), so the last
    ``val_fraction`` of every recording is held out and validated on its own
    (``<recording>/val``); ``config`` itself for any other source."""
    strata = getattr(source, "strata", None)
    if strata is None:
        return config
    if config.segments is None:
        segments = source.segments
    else:
        segments = within_recordings(config.segments, strata, len(source))
    return dataclasses.replace(config, segments=segments)


def split_source(config: TrainConfig, total: int) -> Split:
    """The train/validation split of ``total`` timesteps under ``config``: the one rule
    (:func:`chunkstream.plans.held_out_split`) that ``chunkstream plan`` reports too.

    Raises :class:`ConfigError` naming ``val_fraction`` when the split leaves
    fewer than ``config.window`` training timesteps, or (with segments) no
    held-out range of at least a window.
    """
    c = config
    split = held_out_split(total, c.val_fraction, c.window, c.segments)
    if c.segments is None and split.train_len < c.window:
        raise ConfigError.bad(
            "val_fraction",
            c.val_fraction,
            f"a split leaving >= {c.window} training timesteps",
        )
    if not split.val_ranges and c.val_data is None:
        raise ConfigError.bad(
            "val_fraction",
            c.val_fraction,
            f"held-out ranges of >= {c.window} timesteps (the window) in some segment",
            "Raise val_fraction or use longer segments.",
        )
    return split


def held_out_parts(
    source, split: Split, config: TrainConfig, device: torch.device, rank: int, world_size: int
) -> list[HeldOut]:
    """Each held-out range read onto ``device``, with this rank's share of window starts,
    then each run of ``config.val_data`` whole (named after it).

    About ``config.val_windows`` windows in all, evenly strided over the ranges;
    rank ``r`` keeps every ``world_size``-th of them from the ``r``-th on.
    """
    window = config.window
    ranges = [(name, source, start, stop) for name, start, stop in split.val_ranges]
    for name, run in held_out_runs(source, config).items():
        ranges.append((name, run, 0, len(run)))
    n_val = sum(stop - start - window + 1 for _, _, start, stop in ranges)
    stride = max(1, -(-n_val // config.val_windows))
    parts = []
    for name, src, start, stop in ranges:
        starts = torch.arange(0, stop - start - window + 1, stride, device=device)
        parts.append((name, load_range(src, start, stop, device), starts[rank::world_size]))
    return parts


def held_out_runs(source, config: TrainConfig) -> dict:
    """``config.val_data``'s runs (name -> source), each checked to hold the trained
    fields in the training source's shapes and a window; ``{}`` without ``val_data``."""
    if config.val_data is None:
        return {}
    runs = val_runs(config.val_data)
    used = [f for f in (config.data_field, config.stim_field) if f]
    for name, run in runs.items():
        fields = getattr(run, "fields", None) or {}
        for f in used:
            want, got = source.fields[f], fields.get(f)
            if got is None or got.shape != want.shape or got.dtype != want.dtype:
                what = "lacks it" if got is None else f"has {got.shape} {got.dtype}"
                raise ConfigError.bad(
                    "val_data",
                    name,
                    f"a run whose field {f!r} is {want.shape} {want.dtype} per timestep, as "
                    f"in the training data (run {name!r} {what})",
                    "Validate on runs of the same network (or pad them: cs.Recordings).",
                )
        if len(run) < config.window:
            raise ConfigError.bad(
                "val_data", name, f"a run of at least a window ({config.window} timesteps)"
            )
    return runs


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` summed over the ranks, in place (unchanged without a process group)."""
    if is_distributed():
        torch.distributed.all_reduce(tensor)
    return tensor


@torch.no_grad()
def evaluate(
    model,
    parts: list[HeldOut],
    mean: torch.Tensor,
    config: TrainConfig,
    neurons: int,
    mask_field: str | None = None,
) -> torch.Tensor:
    """Per held-out range, ``[model squared error, baseline squared error, count]`` summed
    over every rank's windows (a collective call under torch.distributed), on the CPU.

    The baseline predicts ``mean`` at every target frame; ``count`` is the number
    of predicted values, so a row's first two entries over its third are MSEs;
    where a part holds ``mask_field`` (padded recordings), only the values it marks
    real are summed and counted.
    The model is put in eval mode for the call and back in train mode after it.
    """
    c = config
    model.eval()
    sums = []
    for _, val, val_starts in parts:
        x_all = val[c.data_field]
        s_all = val.get(c.stim_field) if c.stim_field else None
        total = torch.zeros((), dtype=torch.float64, device=x_all.device)
        base = torch.zeros_like(total)
        mask_all = val.get(mask_field) if mask_field else None
        count = torch.zeros_like(total)
        m = mean.to(x_all.dtype)  # once per part, not per batch
        step = slice(c.time_units, None, c.time_units)
        for starts in val_starts.split(c.batch_size * 4):
            x = gather_windows(x_all, starts, c.window)
            s = gather_windows(s_all, starts, c.window) if s_all is not None else None
            target = x[:, step]
            pred = model.rollout(x[:, 0], s, c.evolve_multiple_steps, c.time_units)
            if mask_all is None:
                total += ((pred - target) ** 2).sum(dtype=torch.float64)
                base += ((target - m) ** 2).sum(dtype=torch.float64)
                count += target.numel()
            else:
                w = gather_windows(mask_all, starts, c.window)[:, step].to(x.dtype)
                total += ((pred - target) ** 2 * w).sum(dtype=torch.float64)
                base += ((target - m) ** 2 * w).sum(dtype=torch.float64)
                count += w.sum(dtype=torch.float64)
        sums.append(torch.stack([total, base, count]))
    model.train()
    return all_reduce_sum(torch.stack(sums)).cpu()
