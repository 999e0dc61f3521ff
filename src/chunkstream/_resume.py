"""Does a saved state fit the object resuming it? The checks of every ``load_state_dict``.

A state from another configuration, or out of its own range, is refused with a
:class:`ConfigError` naming what differs (the saved value and the one here) and
how to resume; these run before anything changes, so a refused state leaves the
object as it was. Settings that change only which windows are drawn (a seed) are
warned about by the objects themselves, not refused here.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

from ._errors import ConfigError

__all__ = ["check_checkpoint_config", "check_loader_state", "check_stream_state"]

#: TrainConfig settings that fix the epoch's chunks and batches: a checkpoint resumes
#: only under the same ones (the others, e.g. ``epochs`` or ``lr``, may change).
RESUME_SETTINGS = (
    "chunk_size",
    "batch_size",
    "passes_per_epoch",
    "time_units",
    "evolve_multiple_steps",
    "latent_dim",
    "hidden_dim",
    "val_fraction",
    "sampling",
    "pieces",
    "mix",
    "segments",
    "batches_per_epoch",
    "data_field",
    "stim_field",
)


def check_loader_state(state: object) -> None:
    """Refuse what ``ChunkLoader.load_state_dict`` cannot resume: a ``BatchStream`` state
    (with the hint to pass its ``'loader'``), and a ``step`` past its ``num_chunks``."""
    if isinstance(state, Mapping) and "loader" in state and "epoch" not in state:
        raise ConfigError.bad(
            "state",
            _short(state),
            "a dict from ChunkLoader.state_dict()",
            "This is a BatchStream state: pass state['loader'] to ChunkLoader.load_state_dict, "
            "or load it whole with BatchStream.load_state_dict.",
        )
    if not isinstance(state, Mapping):
        return  # the cursor refuses it with its own message
    step, num = state.get("step"), state.get("num_chunks")
    if _int(step) and _int(num) and num > 0 and step > num:
        raise ConfigError.bad(
            "state",
            _short(state),
            f"'step'={step} at most 'num_chunks'={num}",
            "The state was not saved by ChunkLoader.state_dict(): pass the one it returned.",
        )


def check_stream_state(
    state: object, *, batches_per_chunk: int, mix: int, seed: int, align: int | None
) -> tuple[Mapping[str, object], int, int]:
    """``(loader state, batch, refill)`` of a ``BatchStream`` state, checked against the
    stream resuming it: one saved under another configuration is refused naming the
    setting that differs (before a range check would blame the value), another ``seed``
    or ``align`` is warned of (every batch is still valid, the draws differ)."""
    if isinstance(state, Mapping):
        if "epoch" in state and "loader" not in state:
            raise ConfigError.bad(
                "state",
                _short(state),
                "a dict from BatchStream.state_dict() with 'loader'",
                "This is a ChunkLoader state: pass it to loader.load_state_dict, or save the "
                "stream's own state with BatchStream.state_dict().",
            )
        saved = state.get("batches_per_chunk")
        if saved is not None and saved != batches_per_chunk:
            raise ConfigError(
                f"state saved with batches_per_chunk={saved} cannot resume a BatchStream with "
                f"batches_per_chunk={batches_per_chunk}: its 'batch' counts batches of a chunk "
                f"of that run. Resume with batches_per_chunk={saved} (the interrupted run's "
                "settings), or start the epoch afresh."
            )
    try:
        loader_state, batch = state["loader"], state["batch"]  # type: ignore[index]
        refill = state.get("refill", 0)  # type: ignore[union-attr]
    except (KeyError, TypeError, AttributeError) as exc:
        raise ConfigError.bad(
            "state", state, "a dict from BatchStream.state_dict() with 'loader' and 'batch'"
        ) from exc
    per = batches_per_chunk
    if isinstance(batch, bool) or not isinstance(batch, int) or not 0 <= batch < per:
        raise ConfigError.bad("state", state, f"'batch' in [0, batches_per_chunk={per})")
    if isinstance(refill, bool) or not isinstance(refill, int) or not 0 <= refill < mix:
        raise ConfigError.bad(
            "state",
            state,
            f"'refill' in [0, mix={mix})",
            "Resume with the stream's settings (mix) of the interrupted run.",
        )
    for name, own in (("seed", seed), ("align", align)):
        saved = state.get(name)
        if saved is not None and saved != own:
            warnings.warn(
                f"resuming a BatchStream state saved with {name}={saved} on a stream with "
                f"{name}={own}: the remaining batches will differ from the interrupted run",
                stacklevel=3,
            )
    return loader_state, batch, refill


def check_checkpoint_config(
    saved: Mapping[str, object] | None, config: Mapping[str, object]
) -> None:
    """Refuse a trainer checkpoint written under other :data:`RESUME_SETTINGS`."""
    if not saved:
        return
    differ = [
        (k, saved[k], config.get(k))
        for k in RESUME_SETTINGS
        if k in saved and saved[k] != config.get(k)
    ]
    if differ:
        listed = ", ".join(f"{k}={a!r} (now {b!r})" for k, a, b in differ)
        raise ConfigError(
            f"the checkpoint was written with {listed}: resuming would replay another "
            "epoch plan. Resume with the checkpoint's settings, or start afresh "
            "(resume=False, or another out_dir)."
        )


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _short(state: Mapping) -> dict:
    """The state for a message: nested dicts shown by their keys only."""
    return {
        k: (f"{{{', '.join(map(str, v))}}}" if isinstance(v, Mapping) else v)
        for k, v in state.items()
    }
