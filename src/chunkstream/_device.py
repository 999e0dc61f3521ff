"""The one device resolution: which ``torch.device`` a ``device=`` argument means,
and the hook that binds a worker thread to it.

Every part that takes a ``device`` (the loader, the batch timer, the trainer,
``bench``) resolves it here, so ``None``, a bare ``"cuda"`` and a missing GPU
mean the same everywhere.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from ._errors import ChunkLoadError, ConfigError

__all__ = ["device_binder", "resolve_device"]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device to run on, with its index resolved: ``"cuda"`` becomes ``cuda:<k>``.

    ``None`` means CUDA when present, else CPU; a missing CUDA or CUDA index is a
    :class:`ConfigError`. A bare ``"cuda"`` is fixed to the caller's current
    device now, in the caller's thread (background threads start on device 0).
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError.bad(
            "device", device, "a torch device such as 'cuda', 'cuda:1' or 'cpu'"
        ) from exc
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError.bad(
            "device",
            device,
            "a device this machine has (torch.cuda.is_available() is False)",
            "Pass device='cpu' (or None to pick CUDA when present), or install a CUDA build of torch.",
        )
    if resolved.type == "cuda":
        count = torch.cuda.device_count()
        index = torch.cuda.current_device() if resolved.index is None else resolved.index
        if not 0 <= index < count:
            raise ConfigError.bad(
                "device",
                device,
                f"a CUDA index in [0, {count}) (this machine has {count} visible GPUs)",
                "Pass 'cuda:<k>' for a visible GPU, or check CUDA_VISIBLE_DEVICES.",
            )
        resolved = torch.device("cuda", index)
    return resolved


def device_binder(device: torch.device) -> Callable[[], None]:
    """An executor thread's start hook: make ``device`` the thread's current CUDA device."""

    def bind() -> None:
        try:
            torch.cuda.set_device(device)
        except Exception as exc:  # every later future of the executor fails with this
            raise ChunkLoadError(
                f"setting the CUDA device {device} in thread "
                f"{threading.current_thread().name!r} failed: {type(exc).__name__}: {exc}. "
                "Check that the device is visible (CUDA_VISIBLE_DEVICES) and healthy."
            ) from exc

    return bind
