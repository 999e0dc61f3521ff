"""Staggered acquisition: each neuron observed at its own phase of every period.

On a scanning microscope neuron ``n`` is sampled once per acquisition period of
``time_units`` timesteps, at its own phase ``0 <= phase_n < time_units`` (drawn
once per run). For a batch of windows that start on the period grid
(``BatchStream(..., options=StreamOptions(align=time_units))``, so
``batch["start"] % time_units == 0``), neuron ``n`` of window ``b`` is observed
at timesteps::

    batch["start"][b] + phase_n + m * time_units        for m = 0 .. steps

which are rows ``phase_n + m * time_units`` of the window.
:func:`staggered_observations` gathers those values in one device-side
``torch.gather`` (no loop over neurons, nothing read back when the phases live
on the host): ``out[b, m, n] = x[b, phase_n + m * time_units, n]``. The window
must hold the last one: ``max(phase) + steps * time_units < window``, which
``window >= (steps + 1) * time_units`` guarantees for any phases.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .._errors import ConfigError, check_int

__all__ = ["staggered_observations"]


def _phases(phases: object, neurons: int, time_units: int) -> torch.Tensor:
    """``phases`` as a 1-d long tensor of ``neurons`` values in ``[0, time_units)``."""
    if isinstance(phases, torch.Tensor):
        values = phases
    else:
        array = np.asarray(phases)
        if array.dtype.kind not in "iu":
            raise ConfigError.bad(
                "phases",
                f"<{type(phases).__name__} of dtype {array.dtype}>",
                "integers (one phase per neuron)",
                "Draw them as integers, e.g. torch.randint(0, time_units, (neurons,)).",
            )
        values = torch.from_numpy(array.astype(np.int64, copy=False))
    if values.is_floating_point() or values.is_complex() or values.dtype == torch.bool:
        raise ConfigError.bad(
            "phases",
            f"<tensor of dtype {values.dtype}>",
            "an integer tensor (one phase per neuron)",
            "Cast it with .long().",
        )
    if values.dim() != 1 or values.numel() != neurons:
        raise ConfigError.bad(
            "phases",
            f"<shape {tuple(values.shape)}>",
            f"one phase per neuron: shape ({neurons},), as x's axis 2",
            "Pass a 1-d tensor with one phase per neuron.",
        )
    values = values.long()
    # On the host this reads nothing back from a device; on a device it is one sync.
    bad = ((values < 0) | (values >= time_units)).nonzero()
    if bad.numel():
        n = int(bad[0, 0])
        raise ConfigError.bad(
            f"phases[{n}]",
            int(values[n]),
            f"a phase in [0, time_units={time_units}) (neuron {n}'s offset in each period)",
            "Draw phases with torch.randint(0, time_units, (neurons,)), or reduce them "
            "modulo time_units.",
        )
    return values


def staggered_observations(
    x: torch.Tensor,
    phases: torch.Tensor | Sequence[int] | np.ndarray,
    time_units: int,
    steps: int,
) -> torch.Tensor:
    """Neuron ``n``'s values at rows ``phase_n + m * time_units`` of each window (module docs).

    ``x``: windows ``(B, window, N, *rest)`` starting on the period grid (a
    batch's field from a stream with ``align=time_units``); ``phases``: ``N``
    integers in ``[0, time_units)`` (a host tensor, list or array is checked
    on the host and copied to ``x``'s device without a sync; a device tensor
    costs one host sync for the check); ``steps``: the last ``m``. Returns
    ``(B, steps + 1, N, *rest)`` with ``out[b, m, n] = x[b, phase_n + m *
    time_units, n]``: the observation at timestep ``start[b] + phase_n + m *
    time_units`` of its recording. A phase outside ``[0, time_units)`` raises
    :class:`~chunkstream.ConfigError` naming it and its neuron; a window too
    short for the last observation names ``steps``.
    """
    if not isinstance(x, torch.Tensor) or x.dim() < 3:
        raise ConfigError.bad(
            "x",
            f"<{type(x).__name__} of shape {tuple(getattr(x, 'shape', ()))}>",
            "a tensor (batch, window, neurons, ...)",
            "Pass a batch's field, e.g. batch['voltage'].",
        )
    time_units = check_int("time_units", time_units, 1, "Pass the acquisition period (>= 1).")
    steps = check_int("steps", steps, 0, "Pass the last period index m to observe (>= 0).")
    batch, window, neurons = x.shape[:3]
    values = _phases(phases, neurons, time_units)
    last = int(values.max()) + steps * time_units if neurons else 0
    if last >= window:
        raise ConfigError.bad(
            "steps",
            steps,
            f"at most {(window - 1 - int(values.max())) // time_units} for windows of "
            f"{window} timesteps (the last observation is row max(phase) + steps * "
            f"time_units = {last})",
            f"Use windows of at least (steps + 1) * time_units = {(steps + 1) * time_units} "
            "timesteps, or fewer steps.",
        )
    rows = values[None, :] + time_units * torch.arange(steps + 1, dtype=torch.long)[:, None]
    if rows.device != x.device:
        if x.device.type == "cuda" and rows.device.type == "cpu":
            rows = rows.pin_memory().to(x.device, non_blocking=True)
        else:
            rows = rows.to(x.device)
    rest = x.shape[3:]
    index = rows.view(1, steps + 1, neurons, *(1,) * len(rest))
    return torch.gather(x, 1, index.expand(batch, steps + 1, neurons, *rest))
