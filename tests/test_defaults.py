"""The defaults (issue 36): the shortest code holds the largest share of the split memory allows."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import chunkstream as cs
from chunkstream._memory import ENV_HOST_MEMORY, choose_tier
from chunkstream._memory._defaults import DEVICE_MIX
from tests.flat import loader_from

T, CHUNK, WINDOW = 4000, 200, 16
STEP = 3 * 4  # bytes per timestep of the source's fields


def source():
    t = np.arange(T, dtype=np.float32)
    return cs.NumpySource({"x": np.stack([t, -t], axis=1), "s": (2 * t)[:, None]})


def loader(**kwargs):
    options = {"device": "cpu", "workers": 1, "prefetch": 1, "sampling": "shuffled", "seed": 3}
    return loader_from(source(), CHUNK, **{**options, **kwargs})


PLAN = cs.plan_epoch(total_timesteps=T, chunk_size=CHUNK, batch_size=8)


def test_the_shortest_code_holds_the_whole_split_where_memory_allows(caplog):
    with caplog.at_level(logging.INFO, logger="chunkstream"), loader() as ld:
        stream = cs.BatchStream(ld, window=WINDOW, plan=PLAN)
        info = stream.buffer
        assert (info.tier, info.mix, info.split_share) == ("host", T // CHUNK, 1.0)
        assert info.memory.startswith("host memory: ") and info.memory in info.describe()
        batches = list(stream)
    assert len(batches) == len(stream)
    # shown once: the choice, with the memory it read
    assert sum("shuffle buffer: host tier" in r.getMessage() for r in caplog.records) == 1
    # once the buffer has filled, a batch comes from many chunks, not one
    spans = {int(s) // CHUNK for s in batches[-1]["x"][:, 0, 0].tolist()}
    assert len(spans) > 1


def test_the_jobs_memory_bounds_the_default_and_says_so(monkeypatch):
    loader_nbytes = (1 + 1 + 2) * CHUNK * STEP  # prefetch + workers + the two a loop holds
    # the batch lane's sets: those read ahead, the one received, the one the user holds
    sets_nbytes = (cs.StreamOptions().batch_prefetch + 2) * PLAN.batch_size * WINDOW * STEP
    # half of what the cap leaves beside the loader's arena and the batch sets: 5 chunks.
    # The loader reads the share before it allocates; BatchStream sizes from that
    # reading, so the arena is counted once.
    monkeypatch.setenv(ENV_HOST_MEMORY, str(loader_nbytes + sets_nbytes + 2 * 5 * CHUNK * STEP))
    with loader() as ld:
        assert ld.config.arena_bytes(CHUNK * STEP, on_cuda=False) == loader_nbytes
        stream = cs.BatchStream(ld, window=WINDOW, plan=PLAN)
        assert dict(stream.buffer.terms)["the batch sets"] == sets_nbytes
        assert stream.mix == 5 and stream.buffer.split_share == 5 / (T // CHUNK)
        assert f"capped by {ENV_HOST_MEMORY}" in stream.buffer.memory
        assert "1 rank on this node" in stream.buffer.memory
        assert len(list(stream)) == len(stream)
    # not even the loader's own buffers fit: the loader refuses before it allocates
    monkeypatch.setenv(ENV_HOST_MEMORY, str(loader_nbytes // 2))
    with pytest.raises(cs.ConfigError, match="do not fit this rank's share"):
        loader()
    monkeypatch.setenv(ENV_HOST_MEMORY, "plenty")
    with pytest.raises(cs.ConfigError, match=ENV_HOST_MEMORY):
        loader()


def test_mix_1_stays_the_originals_and_a_large_int_is_kept_and_said(caplog):
    with loader() as ld:
        one = cs.BatchStream(ld, window=WINDOW, plan=PLAN, mix=1)
        assert one.mix == 1 and one.buffer.nbytes == 0 and one.buffer.memory == ""
        batch = next(iter(one))
        assert len({int(s) // CHUNK for s in batch["x"][:, 0, 0].tolist()}) <= 2
        with caplog.at_level(logging.WARNING, logger="chunkstream"):
            many = cs.BatchStream(ld, window=WINDOW, plan=PLAN, mix=1000)
        assert many.mix == 1000 and "kept as given" in many.buffer.reason
        assert any("mix=1000 is more than the 20 chunks" in r.getMessage() for r in caplog.records)


def test_on_cuda_the_host_tier_wins_where_it_holds_more():
    cuda = torch.device("cuda")  # sized from the budgets given: no GPU needed
    chunk = 10**9
    tier, why = choose_tier("auto", cuda, chunk_nbytes=chunk, pass_chunks=100,
                            host_memory=40 * chunk, device_memory=80 * chunk)  # fmt: skip
    assert tier == "host" and "the host holds 40 chunks where the device tier may hold 10" in why
    tier, _ = choose_tier("auto", cuda, chunk_nbytes=chunk, pass_chunks=100,
                          host_memory=8 * chunk, device_memory=800 * chunk)  # fmt: skip
    assert tier == "device" and DEVICE_MIX == 16
    assert choose_tier("auto", torch.device("cpu"), chunk_nbytes=1, pass_chunks=1)[0] == "host"


@pytest.mark.gpu
def test_the_default_on_cuda_sends_batches_from_a_host_tier_buffer():
    with loader() as ld:  # the loader reads to the host, batches go to the GPU
        stream = cs.BatchStream(ld, window=WINDOW, plan=PLAN, device="cuda")
        assert stream.buffer.tier == "host" and stream.buffer.split_share == 1.0
        batches = list(stream)
        assert all(b["x"].device.type == "cuda" for b in batches)
        x = batches[0]["x"]
        starts = x[:, 0, 0]
        torch.testing.assert_close(
            x[:, :, 0], starts[:, None] + torch.arange(WINDOW, device="cuda")
        )


@pytest.mark.gpu
def test_the_trainer_on_cuda_takes_the_host_tier_where_it_holds_more(tmp_path):
    from chunkstream.tools import write_synthetic
    from chunkstream.train import TrainConfig, Trainer

    write_synthetic(tmp_path, timesteps=4096, neurons=16, stim_dims=4, chunks=(64, 4, 1),
                    progress=False)  # fmt: skip
    src = cs.flyvis.open(str(tmp_path), column="voltage", stim_dims=4)
    try:
        # 57 chunks of 64 steps per pass: more than the device tier's 16, all on the host
        config = TrainConfig(chunk_size=64, batch_size=16, epochs=2, device="cuda",
                             progress=False, tensorboard=False, workers=1)  # fmt: skip
        trainer = Trainer(src, config)
        assert trainer.buffer.tier == "host" and trainer.host_tier
        assert trainer.mix == trainer.plan.chunks_per_epoch
        result = trainer.fit()
        assert trainer.loader.device.type == "cpu" and result.memory["loader_device"] == 0
        assert result.val_loss < result.baseline_val
        # an int keeps the device tier, as before
        assert Trainer(src, TrainConfig(**{**config.to_dict(), "mix": 4})).buffer.tier == "device"
    finally:
        src.close()


def test_a_cuda_loaders_device_tier_says_what_the_host_tier_would_hold(monkeypatch):
    from chunkstream._memory._buffer import host_tier_hint
    from chunkstream.consumer import BufferInfo

    monkeypatch.setenv(ENV_HOST_MEMORY, str(2 * 40 * 10**7))
    info = BufferInfo("device", 4, 4 * 10**7, 0.05, 4, "as sized")  # 4 of 80 chunks of 10 MB
    hint = host_tier_hint(info, torch.device("cuda:0"))
    assert "the host tier would hold 50.0%" in hint and "device='cpu'" in hint
    monkeypatch.setenv(ENV_HOST_MEMORY, str(2 * 3 * 10**7))
    assert "would hold" not in host_tier_hint(info, torch.device("cuda:0"))


def test_a_zarr_sources_decode_scratch_is_a_term_of_the_budget(tmp_path, monkeypatch):
    """The fast path's decode threads each keep one stored chunk and a read buffer per
    source they decode for: counted in the rank's budget beside the loader's arena and the
    batch sets (issue 47: every byte the library allocates counted once), and said."""
    from chunkstream.sources import decode_scratch_nbytes
    from chunkstream.sources._fastzarr import READ_BUFFER
    from tests.stores import make_array, random_data

    make_array(tmp_path / "a.zarr", random_data((T, 8)), chunks=(CHUNK, 8))
    make_array(tmp_path / "b.zarr", random_data((T, 8), seed=1), chunks=(CHUNK // 2, 8))
    per_chunk = CHUNK * 8 * 4 + READ_BUFFER
    with cs.ZarrSource(str(tmp_path / "a.zarr"), read_threads=3) as a:
        assert a.uses_fast_path and decode_scratch_nbytes(a) == 3 * per_chunk
    a = cs.ZarrSource(str(tmp_path / "a.zarr"), read_threads=2)
    b = cs.ZarrSource(str(tmp_path / "b.zarr"), read_threads=2)
    both = cs.Recordings([a, b])  # each recording's reader keeps its own per thread
    scratch = 2 * per_chunk + 2 * (CHUNK // 2 * 8 * 4 + READ_BUFFER)
    assert decode_scratch_nbytes(both) == scratch
    assert decode_scratch_nbytes(cs.NumpySource({"x": np.zeros((T, 8), np.float32)})) == 0
    with cs.ChunkLoader(both, CHUNK, device="cpu") as ld:
        plan = cs.plan_epoch(total_timesteps=len(both), chunk_size=CHUNK, batch_size=8)
        stream = cs.BatchStream(ld, window=WINDOW, plan=plan)
        terms = dict(stream.buffer.terms)
        assert terms["decode scratch"] == scratch
        assert "  decode scratch: " in stream.buffer.describe()
        # the buffer is sized from what is left beside every term
        shown = stream.buffer.describe().splitlines()
        assert [line.split(":")[0].strip() for line in shown[1:]] == [
            "this process when it sized",
            "the loader's arena",
            "the batch sets",
            "decode scratch",
            "the shuffle buffer",
            "left for the model, the heap and the page cache",
        ]
