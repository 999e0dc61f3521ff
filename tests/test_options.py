"""The loader's and the stream's less common settings as option objects (issue 43).

``ChunkLoader`` and ``BatchStream`` take their common settings as keywords (those of
the native API in DESIGN.md and the README) and the rest in one frozen, keyword-only
``LoaderOptions`` / ``StreamOptions``: one settings type per class. ``loader.config``
holds the loader's resolved settings (read-only); ``ChunkLoader(config=...)`` still takes
one until 0.3, with a ``FutureWarning``; the compat loaders pass keywords and options.
"""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest

import chunkstream as cs
from chunkstream import compat

DATA = np.arange(4000, dtype=np.float32).reshape(1000, 4)


def _source():
    return cs.NumpySource({"x": DATA})


def test_the_signatures_keep_the_native_keywords_and_move_the_rest():
    loader = inspect.signature(cs.ChunkLoader).parameters
    native = ["source", "chunk_size", "device", "prefetch", "gpu_prefetch", "workers",
              "sampling", "align", "seed"]  # fmt: skip
    assert list(loader)[: len(native)] == native
    assert [p for p in loader if p not in native] == ["options", "config", "moved"]
    stream = inspect.signature(cs.BatchStream).parameters
    common = ["loader", "window", "batch_size", "batches_per_chunk", "plan", "mix", "buffer",
              "device", "fields"]  # fmt: skip
    assert list(stream) == [*common, "options", "loader_options", "moved"]
    moved = {f.name for f in dataclasses.fields(cs.LoaderOptions)}
    assert moved.isdisjoint(loader) and {"stall_timeout", "pieces", "resident"} <= moved
    assert {f.name for f in dataclasses.fields(cs.StreamOptions)}.isdisjoint(stream)


@pytest.mark.parametrize("kind", [cs.LoaderOptions, cs.StreamOptions])
def test_options_are_frozen_keyword_only_data(kind):
    options = kind()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.seed = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        kind(1)  # keyword-only
    first = dataclasses.fields(kind)[0].name
    assert dataclasses.replace(options, **{first: 3}) == kind(**{first: 3}) != options


def test_options_reach_the_loader():
    stats = cs.LatencyStats()
    options = cs.LoaderOptions(pieces=2, window=10, stall_timeout=None, read_retries=0,
                               stats=stats, rank=1, world_size=2)  # fmt: skip
    with cs.ChunkLoader(_source(), 100, device="cpu", seed=3, options=options) as loader:
        assert loader.options is options and loader.stats is stats
        assert loader.config.stall_timeout is None and loader.config.read_retries == 0
        assert (loader.rank, loader.world_size, loader.plan.pieces) == (1, 2, 2)
        chunks = [c.pieces for c in loader.epoch(2)]
    assert all(len(p) == 2 for p in chunks) and stats.summary()["num_chunks"] == 2


def test_another_loaders_settings_are_its_keywords_and_options():
    options = cs.LoaderOptions(host_slots=3, close_timeout=2.0)
    with cs.ChunkLoader(_source(), 100, device="cpu", prefetch=3, workers=1, seed=5,
                        options=options) as first:  # fmt: skip
        c = first.config
        starts = [chunk.start for chunk in first.epoch()]
    assert (c.prefetch, c.workers, c.host_slots) == (3, 1, 3)
    with cs.ChunkLoader(
        _source(),
        chunk_size=c.chunk_size,
        device="cpu",
        prefetch=c.prefetch,
        gpu_prefetch=c.gpu_prefetch,
        workers=c.workers,
        seed=5,
        options=first.options,
    ) as second:
        assert second.config == c and second.options is first.options
        assert [chunk.start for chunk in second.epoch()] == starts
    with pytest.raises(dataclasses.FrozenInstanceError):  # the resolved settings: read-only
        c.prefetch = 1  # type: ignore[misc]


def test_config_still_stands_for_the_depths_for_one_release():
    """``ChunkLoader(config=...)`` is deprecated (issue 47 part 5): it warns, naming the
    keywords and ``options=``, and still gives the same loader until 0.3."""
    with cs.ChunkLoader(
        _source(),
        100,
        device="cpu",
        prefetch=3,
        workers=1,
        seed=5,
        options=cs.LoaderOptions(host_slots=3),
    ) as first:
        config = first.config
        starts = [c.start for c in first.epoch()]
    says = r"ChunkLoader\(config=\.\.\.\) is deprecated .* 0\.3; pass the keywords and options="
    with pytest.warns(FutureWarning, match=says):
        second = cs.ChunkLoader(_source(), device="cpu", seed=5, config=config)
    with second:
        assert second.config == config
        assert [c.start for c in second.epoch()] == starts
    # A chunk_size equal to the config's is not a second value.
    with pytest.warns(FutureWarning, match=says):
        third = cs.ChunkLoader(_source(), 100, device="cpu", config=config)
    with third:
        assert third.config == config


def test_compat_builds_its_loader_from_keywords_and_options(monkeypatch):
    seen = {}
    real = cs.ChunkLoader.__init__

    def spy(self, source, chunk_size=None, **kwargs):
        seen.update(kwargs, chunk_size=chunk_size)
        real(self, source, chunk_size, **kwargs)

    monkeypatch.setattr(cs.ChunkLoader, "__init__", spy)
    loader = compat.RandomChunkLoader(lambda s, e: (DATA[s:e], DATA[s:e, :1]), 1000, 100,
                                      device="cpu", prefetch=2, seed=1)  # fmt: skip
    with loader:
        loader.start_epoch(2)
        assert loader.get_next_chunk()[0] is not None
        assert "config" not in seen and seen["chunk_size"] == 100
        assert (seen["prefetch"], seen["gpu_prefetch"], seen["workers"]) == (2, 1, 1)
        options = seen["options"]
        assert (options.rank, options.world_size, options.stats) == (0, 1, loader._stats)
        assert loader._loader.config == loader._config
        assert loader._loader.config.prefetch == 2 and loader._loader.config.workers == 1


def test_stream_options_reach_the_stream():
    options = cs.StreamOptions(chunks_per_epoch=3, seed=9, align=2, batch_prefetch=0)
    with cs.ChunkLoader(_source(), 100, device="cpu", seed=1) as loader:
        stream = cs.BatchStream(loader, window=10, batch_size=4, batches_per_chunk=2, mix=1,
                                options=options)  # fmt: skip
        assert stream.options is options
        assert (stream.chunks_per_epoch, stream.seed, stream.align) == (3, 9, 2)
        batches = list(stream)
    assert len(batches) == 6 and all(b["x"].shape == (4, 10, 4) for b in batches)
    # every window starts on the align grid: row t holds 4t .. 4t+3
    assert all(int(b["x"][i, 0, 0]) // 4 % 2 == 0 for b in batches for i in range(4))
