"""The keywords issue 43 moved into ``cs.LoaderOptions`` / ``cs.StreamOptions`` still run
until 0.3: each warns (``FutureWarning``) naming its new spelling and is merged into the
options object, so both spellings build the same loader or stream; the old keyword
beside the same field in ``options=`` is a ``ConfigError``."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import chunkstream as cs
from chunkstream._options import MOVED_REMOVED_IN

DATA = np.arange(4000, dtype=np.float32).reshape(1000, 4)

# One valid, non-default value per moved keyword (all 23).
LOADER = {
    "host_slots": 4,
    "host_memory": 1 << 24,
    "device_memory": 1 << 24,
    "resident": True,
    "pieces": 2,
    "segments": [(0, 500), (500, 1000)],
    "window": 10,
    "rank": 0,
    "world_size": 1,
    "stall_timeout": 60.0,
    "close_timeout": 3.0,
    "check_finite": True,
    "read_retries": 1,
    "stats": "new",  # a fresh cs.LatencyStats per call
    "close_source": True,
}
STREAM = {
    "chunks_per_epoch": 3,
    "batches_per_epoch": 5,
    "seed": 9,
    "dtype": "float64",  # torch.float64, imported lazily below
    "align": 2,
    "host_memory": 1 << 24,
    "batch_prefetch": 1,
    "gather_threads": 1,
}


def _value(name: str, value: object) -> object:
    if value == "new":
        return cs.LatencyStats()
    if name == "dtype":
        import torch

        return torch.float64
    return value


def test_the_lists_hold_every_field():
    assert set(LOADER) == {f.name for f in dataclasses.fields(cs.LoaderOptions)}
    assert set(STREAM) == {f.name for f in dataclasses.fields(cs.StreamOptions)}
    assert len(LOADER) + len(STREAM) == 23


def _loader(**keywords):
    return cs.ChunkLoader(cs.NumpySource({"x": DATA}), 100, device="cpu", **keywords)


def _message(owner: str, kind: str, name: str) -> str:
    return (
        f"{owner}({name}=...) is deprecated and will be removed in {MOVED_REMOVED_IN}; "
        f"pass options=cs.{kind}({name}=...)"
    )


@pytest.mark.parametrize("name", sorted(LOADER))
def test_an_old_loader_keyword_warns_and_equals_the_option(name):
    value = _value(name, LOADER[name])
    with pytest.warns(FutureWarning) as caught:
        old = _loader(**{name: value})
    with old:
        assert [str(w.message) for w in caught] == [_message("ChunkLoader", "LoaderOptions", name)]
        assert caught[0].filename == __file__  # points at the caller's line
        assert old.options == cs.LoaderOptions(**{name: value})
    with _loader(options=cs.LoaderOptions(**{name: value})) as new:
        assert new.config == old.config and new.plan == old.plan
        assert (new.rank, new.world_size) == (old.rank, old.world_size)


@pytest.mark.parametrize("name", sorted(STREAM))
def test_an_old_stream_keyword_warns_and_equals_the_option(name):
    value = _value(name, STREAM[name])
    common = dict(window=10, batch_size=4, batches_per_chunk=2, mix=1)
    with _loader() as loader:
        with pytest.warns(FutureWarning) as caught:
            old = cs.BatchStream(loader, **common, **{name: value})
        assert [str(w.message) for w in caught] == [_message("BatchStream", "StreamOptions", name)]
        assert old.options == cs.StreamOptions(**{name: value})
        new = cs.BatchStream(loader, **common, options=cs.StreamOptions(**{name: value}))
        assert (old.chunks_per_epoch, old.batches_per_epoch, old.seed, old.align) == (
            new.chunks_per_epoch,
            new.batches_per_epoch,
            new.seed,
            new.align,
        )


def test_old_keywords_merge_into_the_options_given():
    options = cs.LoaderOptions(pieces=2, window=10)
    with pytest.warns(FutureWarning, match=r"ChunkLoader\(read_retries=\.\.\.\)"):
        loader = _loader(read_retries=0, options=options)
    with loader:
        assert loader.options == dataclasses.replace(options, read_retries=0)
        assert loader.config.read_retries == 0 and loader.plan.pieces == 2


def test_the_old_loader_form_of_the_migration_guide_runs():
    with pytest.warns(FutureWarning) as caught:
        loader = _loader(segments=[(0, 400), (600, 1000)], window=10, pieces=2)
    with loader:
        chunks = list(loader.epoch(4))
    assert {str(w.message).split("(")[1].split("=")[0] for w in caught} == {
        "segments",
        "window",
        "pieces",
    }
    assert len(chunks) == 4


def test_both_spellings_of_one_setting_are_refused():
    with pytest.raises(cs.ConfigError, match=r"ChunkLoader\(pieces=\.\.\.\) and options=cs\."):
        _loader(pieces=2, options=cs.LoaderOptions(pieces=3))
    with _loader() as loader, pytest.raises(cs.ConfigError, match=r"holds 2"):
        cs.BatchStream(loader, window=10, batch_size=4, seed=1, options=cs.StreamOptions(seed=2))


def test_an_unknown_keyword_is_still_a_type_error():
    with pytest.raises(TypeError, match="unexpected keyword argument 'chunk_sise'"):
        _loader(chunk_sise=5)
