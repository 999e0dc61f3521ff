"""A small latent-dynamics model: encode a frame, step a latent with the stimulus, decode.

::

    z_0     = encoder(x_t)                              (MLP: neurons -> hidden -> latent)
    z_{k+1} = z_k + evolver([z_k, s_{t + k * time_units}])     (residual MLP, k < steps)
    x̂_{t + k * time_units} = decoder(z_k)               (linear: latent -> neurons)

One evolver step covers ``time_units`` timesteps; a rollout of
``evolve_multiple_steps`` steps covers ``time_units * evolve_multiple_steps``
timesteps, so a training window holds that many plus one (the start frame).
"""

from __future__ import annotations

import torch
from torch import nn

from .._errors import ConfigError, check_int

__all__ = ["LatentDynamics", "rollout_window"]


def rollout_window(time_units: int, evolve_multiple_steps: int) -> int:
    """Timesteps a rollout window holds: ``time_units * evolve_multiple_steps + 1``."""
    for name, value in (
        ("time_units", time_units),
        ("evolve_multiple_steps", evolve_multiple_steps),
    ):
        check_int(name, value)
    return time_units * evolve_multiple_steps + 1


class LatentDynamics(nn.Module):
    """Encoder MLP, residual evolver driven by the stimulus, linear decoder (module docs)."""

    def __init__(
        self, neurons: int, stim_dims: int, *, latent_dim: int = 32, hidden_dim: int = 128
    ) -> None:
        super().__init__()
        self.neurons, self.stim_dims = neurons, stim_dims
        self.encoder = nn.Sequential(
            nn.Linear(neurons, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, latent_dim)
        )
        self.evolver = nn.Sequential(
            nn.Linear(latent_dim + stim_dims, hidden_dim),
            nn.GELU(),
            nn.Linear(hidden_dim, latent_dim),
        )
        self.decoder = nn.Linear(latent_dim, neurons)
        # Start the evolver near the identity map, so early rollouts are not divergent.
        nn.init.zeros_(self.evolver[-1].weight)
        nn.init.zeros_(self.evolver[-1].bias)

    def forward(
        self,
        x: torch.Tensor,
        stimulus: torch.Tensor | None,
        steps: int,
        time_units: int = 1,
        rollout: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(reconstruct(x), rollout(x[:, 0], ...) or None)`` for windows ``x`` ``(B, W, N)``.

        The training step's outputs in one call, so that a DistributedDataParallel
        wrapper sees the step as one forward and averages its gradients.
        """
        recon = self.reconstruct(x)
        pred = self.rollout(x[:, 0], stimulus, steps, time_units) if rollout else None
        return recon, pred

    def reconstruct(self, x: torch.Tensor) -> torch.Tensor:
        """``decoder(encoder(x))`` for frames ``(..., neurons)``."""
        return self.decoder(self.encoder(x))

    def rollout(
        self, x0: torch.Tensor, stimulus: torch.Tensor | None, steps: int, time_units: int = 1
    ) -> torch.Tensor:
        """Predicted frames ``(B, steps, neurons)`` at ``t + k * time_units``, ``k = 1..steps``.

        ``x0`` is ``(B, neurons)``; ``stimulus`` is the window's ``(B, W, stim_dims)``
        (``W > (steps - 1) * time_units``) or ``None`` when the model has no stimulus.
        """
        z = self.encoder(x0)
        out = []
        for k in range(steps):
            if self.stim_dims:
                if stimulus is None:
                    raise ConfigError.bad("stimulus", None, f"a (B, W, {self.stim_dims}) tensor")
                z = z + self.evolver(torch.cat([z, stimulus[:, k * time_units]], dim=-1))
            else:
                z = z + self.evolver(z)
            out.append(self.decoder(z))
        return torch.stack(out, dim=1)
