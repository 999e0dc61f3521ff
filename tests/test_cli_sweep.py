"""Every option of every subcommand, once sensibly and once badly (issue 30).

``GOOD`` runs each option with a sensible value and checks its documented effect in
the ``--json`` output (or the files written); ``BAD`` gives it a zero, negative,
wrong-typed, out-of-range, conflicting or dependency-less value, a value the
command would otherwise adjust to fit another option (a chunk larger than the
array: refused, never cut in silence), or a path that cannot be used: the run must exit 2 with one line, ``chunkstream CMD: error: ...``,
that names the option as typed and the value, with no traceback and nothing
written. A test reads every option from the argparse parsers and fails when one
has no row here. Commands run in-process through ``main()`` on tiny stores made
once per module; the demo rows share three short runs.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import zarr

from chunkstream import ReadAmplificationWarning
from chunkstream.cli import build_parser, main
from chunkstream.tools import write_synthetic
from tests.faults import serve
from tests.stores import make_array, random_data

T, N, STIM = 256, 16, 4


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    write_synthetic(root / "run", timesteps=T, neurons=N, stim_dims=STIM, chunks=(32, N, 1),
                    progress=False)  # fmt: skip
    make_array(root / "arr.zarr", random_data((T, 8)), (32, 8), codec=None)
    make_array(root / "arr2.zarr", random_data((T // 2, 8), seed=1), (32, 8), codec=None)
    (root / "seg.csv").write_text("start,stop,name\n0,128,a\n128,256,b\n")
    (root / "afile").write_text("not a folder")
    return root


@pytest.fixture(scope="module")
def http_url(stores):
    """The module's stores over HTTP (for ``bench --local``, which needs PATH to be a URL)."""
    yield from (server.url for server in serve(stores))


def _fill(argv: list[str], stores: Path, tmp: Path, url: str = "") -> list[str]:
    return [a.format(run=stores / "run", arr=stores / "arr.zarr", arr2=stores / "arr2.zarr",
                     seg=stores / "seg.csv",
                     afile=stores / "afile", tmp=tmp, url=url) for a in argv]  # fmt: skip


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        with warnings.catch_warnings():  # the module's tiny stores are chunked for speed
            warnings.simplefilter("ignore", ReadAmplificationWarning)
            rc = main(argv)
    except SystemExit as exc:  # argparse's refusals and --help
        rc = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _files(*roots: Path) -> set[tuple[str, int]]:
    return {(str(p), p.stat().st_size) for r in roots for p in r.rglob("*") if p.is_file()}


# -- the table ----------------------------------------------------------------------------


@dataclass
class Good:
    """``argv`` runs; ``check(json_output, tmp)`` asserts the option's documented effect."""

    option: str
    argv: list[str]
    check: Callable[[dict, Path], object] | None = None
    note: str = ""  # a stderr note the run must print (an option that changes nothing)


@dataclass
class Bad:
    """``argv`` is refused in one line naming ``option`` and holding every ``says``."""

    option: str
    argv: list[str]
    says: list[str] = field(default_factory=list)


def synth(*extra: str) -> list[str]:
    return ["synth", "{tmp}/s", "-T", "64", "-N", "8", "--stim-dims", "2", "--no-progress",
            "--json", *extra]  # fmt: skip


def convert(*extra: str) -> list[str]:
    return ["convert", "{run}", "{tmp}/c", "--no-progress", "--json", *extra]


def plan(*extra: str, data: tuple[str, ...] = ("--shape", "1024,8")) -> list[str]:
    return ["plan", *data, "--chunk-size", "128", "--batch-size", "16", "--json", *extra]


def bench(*extra: str, data: tuple[str, ...] = ("{arr}",)) -> list[str]:
    return ["bench", *data, "--chunks", "2", "--prefetch", "1", "--workers", "1",
            "--train-ms", "1", "--device", "cpu", "--no-progress", "--json", *extra]  # fmt: skip


def demo(*extra: str) -> list[str]:
    return ["demo", "--timesteps", "512", "--neurons", "16", "--stim-dims", "4", "--epochs", "1",
            "--chunk-size", "64", "--batch-size", "8", "--device", "cpu", "--out", "{tmp}/d",
            "--no-progress", *extra]  # fmt: skip


def _starts(seed: int) -> list[int]:
    """The first two window starts of a loader over the module's T steps (bench's plan)."""
    import chunkstream as cs

    source = cs.NumpySource({"x": np.zeros((T, 1), np.float32)})
    with cs.ChunkLoader(source, 32, device="cpu", seed=seed, sampling="random") as loader:
        return [chunk.start for chunk in loader.epoch(2)]


def _field(report: dict, name: str) -> dict:
    return next(f for f in report["fields"] if f["name"] == name)


# The tables read better one row per line.
# fmt: off
GOOD: dict[str, list[Good]] = {
    "synth": [
        Good("OUT", synth(), lambda j, t: j["out"] == str(t / "s") and (t / "s/timeseries.zarr").is_dir()),
        Good("--layout", synth("--layout", "arrays"), lambda j, t: set(j["shapes"]) == {"voltage", "stimulus"}),
        Good("--timesteps", synth("-T", "40"), lambda j, t: j["shapes"]["timeseries"][0] == 40),
        Good("--neurons", synth("-N", "6"), lambda j, t: j["shapes"]["timeseries"][1] == 6),
        Good("--stim-dims", synth("--stim-dims", "3"), lambda j, t: j["stim_dims"] == 3),
        # left out with -N below its default of 64: every neuron gets a channel, no refusal
        Good("--stim-dims", ["synth", "{tmp}/s", "-T", "64", "-N", "8", "--no-progress", "--json"],
             lambda j, t: j["stim_dims"] == 8),
        Good("--dtype", synth("--dtype", "float16"),
             lambda j, t: zarr.open_array(str(t / "s/timeseries.zarr")).dtype == np.float16),
        Good("--zarr-format", synth("--zarr-format", "2"), lambda j, t: (t / "s/timeseries.zarr/.zarray").is_file()),
        Good("--codec", synth("--codec", "zstd"), lambda j, t: j["codec"] == "zstd"),
        Good("--chunks", synth("--chunks", "16,8,4"),
             lambda j, t: zarr.open_array(str(t / "s/timeseries.zarr")).chunks == (16, 8, 4)),
        Good("--seed", synth("--seed", "7"), lambda j, t: j["seed"] == 7),
        Good("--regimes", synth("--regimes", "2"), lambda j, t: (t / "s/regimes.csv").read_text().count("\n") == 3),
        Good("--overwrite", synth("--overwrite"), lambda j, t: j["timesteps"] == 64),
        Good("--no-progress", synth(), None),
        Good("--json", synth(), lambda j, t: j["layout"] == "flyvis"),
    ],
    "inspect": [
        Good("PATH", ["inspect", "{arr}", "--json"], lambda j, t: j["arrays"][0]["shape"] == [T, 8]),
        Good("--fields", ["inspect", "{run}", "--fields", "v=timeseries[:,0]", "--json"],
             lambda j, t: j["fields"][0]["amplification"] == pytest.approx(1.0)),
        Good("--window", ["inspect", "{arr}", "--fields", "x=:", "--window", "48", "--json"],
             lambda j, t: j["fields"][0]["window_amplification"] > 1.0),
        Good("--json", ["inspect", "{arr}", "--json"], lambda j, t: "verdicts" in j),
    ],
    "convert": [
        Good("IN", ["convert", "{arr}", "{tmp}/c", "--fields", "x=:", "--no-progress", "--json"],
             lambda j, t: j["fields"][0]["shape"] == [T, 8]),
        Good("OUT", convert("--flyvis", "--stim-dims", "2"), lambda j, t: (t / "c/voltage").is_dir()),
        Good("--fields", convert("--fields", "v=timeseries[:,0]"), lambda j, t: [f["name"] for f in j["fields"]] == ["v"]),
        Good("--flyvis", convert("--flyvis"),
             lambda j, t: [f["name"] for f in j["fields"]] == ["voltage", "stimulus"]
             and _field(j, "stimulus")["shape"] == [T, N]),  # default: all N (< 1736) neurons
        Good("--column", convert("--flyvis", "--column", "calcium"), lambda j, t: j["fields"][0]["name"] == "calcium"),
        Good("--stim-dims", convert("--flyvis", "--stim-dims", "2"), lambda j, t: _field(j, "stimulus")["shape"] == [T, 2]),
        # 8 KiB per chunk: 64 B per float32 step = 128 steps; the same MiB in float16 hold 256
        Good("--chunk-mb", convert("--fields", "v=timeseries[:,0]", "--chunk-mb", "0.0078125"),
             lambda j, t: j["fields"][0]["chunks"][0] == 128),
        Good("--dtype", convert("--fields", "v=timeseries[:,0]", "--chunk-mb", "0.0078125", "--dtype", "float16"),
             lambda j, t: j["fields"][0]["dtype"] == "float16" and j["fields"][0]["chunks"][0] == 256),
        Good("--codec", convert("--fields", "v=timeseries[:,0]", "--codec", "none"), lambda j, t: j["codec"] == "none"),
        Good("--zarr-format", convert("--fields", "v=timeseries[:,0]", "--zarr-format", "2"),
             lambda j, t: (t / "c/v/.zarray").is_file()),
        Good("--workers", convert("--fields", "v=timeseries[:,0]", "--workers", "1"), lambda j, t: j["verified"]),
        Good("--overwrite", convert("--fields", "v=timeseries[:,0]", "--overwrite"), lambda j, t: j["slabs_skipped"] == 0),
        Good("--no-verify", convert("--fields", "v=timeseries[:,0]", "--no-verify"), lambda j, t: not j["verified"]),
        Good("--no-progress", convert("--fields", "v=timeseries[:,0]"), None),
        Good("--json", convert("--fields", "v=timeseries[:,0]"), lambda j, t: j["verified"]),
    ],
    "plan": [
        Good("PATH", plan(data=("{arr}",)), lambda j, t: j["total_timesteps"] == T),
        Good("--weights", plan("--weights", "1", "3", data=("{arr}", "{arr2}")),
             lambda j, t: [r["share"] for r in j["pieces"]["recordings"]] == [0.25, 0.75]),
        Good("--shape", plan(), lambda j, t: j["total_timesteps"] == 1024 and j["fields"]["data"][0] == [8]),
        Good("--dtype", plan("--dtype", "float16"), lambda j, t: j["step_bytes"] == 16),
        Good("--fields", plan("--fields", "a=0:3", "b=5"),
             lambda j, t: j["fields"] == {"a": [[3], "float32"], "b": [[], "float32"]}),
        Good("--flyvis", plan("--flyvis", data=("{run}",)), lambda j, t: set(j["fields"]) == {"voltage", "stimulus"}),
        Good("--column", plan("--flyvis", "--column", "calcium", data=("{run}",)), lambda j, t: "calcium" in j["fields"]),
        Good("--stim-dims", plan("--stim-dims", "3"), lambda j, t: j["fields"]["stimulus"][0] == [3]),
        Good("--chunk-size", plan("--chunk-size", "256"), lambda j, t: j["epoch"]["batches_per_chunk"] == 16),
        Good("--batch-size", plan("--batch-size", "32"), lambda j, t: j["epoch"]["batches_per_chunk"] == 4),
        Good("--window", plan("--window", "5"), lambda j, t: j["window"] == 5),
        Good("--prefetch", plan("--prefetch", "3"), lambda j, t: j["host_slots"] == 5),
        Good("--gpu-prefetch", plan("--gpu-prefetch", "2"), lambda j, t: j["streaming"]["device_bytes"] == 3 * j["chunk_bytes"]),
        Good("--gpu-prefetch", plan("--gpu-prefetch", "2", "--device", "cpu"), lambda j, t: j["device"] == "cpu",
             note="--gpu-prefetch 2 changes nothing with --device cpu"),
        Good("--workers", plan("--workers", "3"), lambda j, t: j["host_slots"] == 5),
        Good("--host-slots", plan("--host-slots", "6"), lambda j, t: j["streaming"]["pinned_bytes"] == 6 * j["chunk_bytes"]),
        Good("--passes", plan("--passes", "2"), lambda j, t: j["epoch"]["chunks_per_epoch"] == 16),
        Good("--world-size", plan("--world-size", "2"), lambda j, t: j["epoch"]["chunks_per_epoch"] == 4),
        Good("--ranks-per-node", plan("--ranks-per-node", "4"),
             lambda j, t: "4 ranks on this node (--ranks-per-node)" in j["node"]),
        Good("--align", plan("--align", "4", "--pieces", "2"), lambda j, t: j["pieces"]["piece_align"] == 4),
        Good("--pieces", plan("--pieces", "4"), lambda j, t: j["pieces"]["piece_size"] == 32),
        Good("--segments", plan("--segments", "{seg}", data=("{arr}",)),
             lambda j, t: set(j["pieces"]["valid_starts"]) == {"a", "b"}),
        Good("--sampling", plan("--pieces", "2", "--sampling", "random"), lambda j, t: j["pieces"]["sampling"] == "random"),
        Good("--sampling", plan("--sampling", "random"), lambda j, t: j["pieces"] is None,
             note="--sampling random changes no figure here"),
        Good("--val-fraction", plan("--val-fraction", "0.25"), lambda j, t: j["val_timesteps"] == 256),
        Good("--device", plan("--device", "cpu"), lambda j, t: j["device"] == "cpu" and j["streaming"]["device_bytes"] is None),
        Good("--mix", plan("--mix", "4"), lambda j, t: j["buffer"]["mix"] == 4 and j["buffer"]["pieces"] == 4
             and j["buffer"]["split_share"] == 0.5),
        Good("--mix", plan("--mix", "auto", "--device", "cpu"), lambda j, t: j["buffer"]["tier"] == "host"
             and j["buffer"]["mix"] >= 1),
        Good("--buffer", plan("--mix", "2", "--buffer", "host"), lambda j, t: j["buffer"]["tier"] == "host"
             and j["buffer"]["nbytes"] == 2 * j["chunk_bytes"]),
        Good("--buffer", plan("--mix", "2", "--buffer", "device"), lambda j, t: j["buffer"]["tier"] == "device"),
        Good("--gpu-mem", plan("--gpu-mem", "1MB"), lambda j, t: j["budget"]["gpu_mem"] == 1_000_000),
        Good("--host-mem", plan("--host-mem", "1MB"), lambda j, t: j["budget"]["host_mem"] == 1_000_000),
        Good("--json", plan(), lambda j, t: j["epoch"]["chunk_batches"] == 8 * 8),
    ],
    "bench": [
        Good("PATH", bench(), lambda j, t: j["path"].endswith("arr.zarr")),
        Good("--weights", bench("--weights", "1", "1", data=("{arr}", "{arr2}")),
             lambda j, t: " + " in j["path"]),
        Good("--fields", bench("--fields", "v=timeseries[0:2,0]", data=("{run}",)),
             lambda j, t: j["chunk_bytes"] == T * 2 * 4),
        Good("--flyvis", bench("--flyvis", data=("{run}",)), lambda j, t: j["chunk_bytes"] == T * 2 * N * 4),
        Good("--column", bench("--flyvis", "--column", "calcium", data=("{run}",)),
             lambda j, t: j["chunk_bytes"] == T * 2 * N * 4),
        Good("--stim-dims", bench("--flyvis", "--stim-dims", "2", data=("{run}",)),
             lambda j, t: j["chunk_bytes"] == T * (N + 2) * 4),
        Good("--chunk-size", bench("--chunk-size", "64"), lambda j, t: j["chunk_size"] == 64),
        Good("--prefetch", bench("--prefetch", "1,2"), lambda j, t: [s["prefetch"] for s in j["settings"]] == [1, 2]),
        Good("--workers", bench("--workers", "1,2"), lambda j, t: [s["workers"] for s in j["settings"]] == [1, 2]),
        Good("--gpu-prefetch", bench("--gpu-prefetch", "2"), lambda j, t: j["settings"][0]["gpu_prefetch"] == 2,
             note="--gpu-prefetch 2 changes nothing on the CPU"),
        Good("--chunks", bench("--chunks", "3"), lambda j, t: j["num_chunks"] == 3),
        Good("--train", bench("--train", "matmul", "--train-ms", "50"), lambda j, t: j["train"].startswith("matmul")),
        Good("--train-ms", bench("--train-ms", "2"), lambda j, t: j["train"] == "sleep 2 ms"),
        Good("--train-steps", bench("--train", "matmul", "--train-ms", "50", "--train-steps", "2"),
             lambda j, t: j["train"].startswith("matmul x2")),
        Good("--device", bench(), lambda j, t: j["device"] == "cpu"),
        Good("--seed", bench("--seed", "3", "--chunk-size", "32"),
             lambda j, t: [c["start"] for c in j["settings"][0]["chunks"]] == _starts(seed=3) != _starts(seed=0)),
        Good("--plot", bench("--plot", "{tmp}/t.png"), lambda j, t: (t / "t.png").is_file()),
        Good("--plot-setting", bench("--prefetch", "1,2", "--plot", "{tmp}/t.png", "--plot-setting", "2,1"),
             lambda j, t: (t / "t.png").is_file()),
        Good("--local", bench("--local", "{arr}", data=("{url}/arr.zarr",)),
             lambda j, t: j["remote"]["windows"] == 2 and j["remote"]["ratio"] > 0),
        Good("--cache", bench("--cache", "{tmp}/cache", data=("{url}/arr.zarr",)),
             lambda j, t: j["cache"]["windows"] == 2 and j["cache"]["misses"][1] == 0),
        Good("--no-progress", bench(), None),
        Good("--json", bench(), lambda j, t: j["num_chunks"] == 2),
    ],
}

# The demo's options share three short runs (see test_demo_options_take_effect).
# (--val-data's effect, runs held out and validated whole, is tests/test_recordings_train.py's.)
DEMO_OPTIONS = {"--data", "--timesteps", "--neurons", "--stim-dims", "--epochs", "--chunk-size",
                "--pieces", "--mix", "--buffer", "--segments", "--batch-size", "--device", "--out",
                "--seed", "--resume", "--no-progress", "--json", "--val-data", "--val-fraction"}  # fmt: skip

BAD: dict[str, list[Bad]] = {
    "synth": [
        Bad("OUT", ["synth", "{afile}/x", "--no-progress"], ["afile' is not", "writable"]),
        Bad("OUT", ["synth", "{run}", "--no-progress"], ["already holds timeseries.zarr", "--overwrite"]),
        Bad("--layout", synth("--layout", "zarr"), ["invalid choice: 'zarr'", "flyvis"]),
        Bad("--timesteps", synth("-T", "0"), [" 0 is invalid", ">= 1"]),
        Bad("--timesteps", synth("-T", "x"), ["--timesteps x is invalid", "an integer"]),
        Bad("--neurons", synth("-N", "-3"), [" -3 is invalid", ">= 1"]),
        Bad("--stim-dims", synth("-N", "8", "--stim-dims", "9"), ["--stim-dims 9", "--neurons=8"]),
        Bad("--stim-dims", synth("--stim-dims", "-1"), [" -1 is invalid", ">= 0"]),
        Bad("--dtype", synth("--dtype", "int32"), ["'int32'", "float32"]),
        Bad("--zarr-format", synth("--zarr-format", "4"), ["invalid choice: 4"]),
        Bad("--codec", synth("--codec", "lzma"), ["'lzma'", "zstd"]),
        Bad("--chunks", synth("--chunks", "16,8"), ["--chunks 16,8", "3 positive ints"]),
        Bad("--chunks", synth("--chunks", "0,8,4"), ["--chunks 0,8,4"]),
        Bad("--chunks", synth("--chunks", "a,b"), ["'a,b'", "comma-separated ints"]),
        # a value adjusted to fit another option: a chunk larger than the array
        Bad("--chunks", synth("--chunks", "128,8,4"), ["--chunks 128,8,4", "64,8,4", "--chunks 64,8,4"]),
        Bad("--chunks", synth("--layout", "arrays", "--chunks", "16,9"), ["--chunks 16,9", "Pass --chunks 16,8"]),
        Bad("--seed", synth("--seed", "-1"), [" -1 is invalid", ">= 0"]),
        Bad("--regimes", synth("--regimes", "0"), [" 0 is invalid", ">= 1"]),
        Bad("--regimes", synth("--regimes", "65"), ["--regimes 65", "--timesteps=64"]),
    ],
    "inspect": [
        Bad("PATH", ["inspect", "{tmp}/nope"], ["nope", "does not exist"]),
        Bad("--fields", ["inspect", "{arr}", "--fields", "x=9"], ["'x'", "index 9", "use 0..7"]),
        Bad("--fields", ["inspect", "{arr}", "--fields", "x=:,0"], ["'x'", "drop the extra index"]),
        Bad("--fields", ["inspect", "{arr}", "--fields", "x"], ["--fields", "'x'", "NAME=INDEX"]),
        Bad("--window", ["inspect", "{arr}", "--fields", "x=:", "--window", "0"], [" 0 is invalid", ">= 1"]),
        Bad("--window", ["inspect", "{arr}", "--fields", "x=:", "--window", "-4"], [" -4 is invalid", ">= 1"]),
        Bad("--window", ["inspect", "{arr}", "--fields", "x=:", "--window", "100000"],
            ["--window 100000", f"at most the {T} timesteps"]),
        Bad("--window", ["inspect", "{arr}", "--window", "8"], ["--window 8", "without --fields"]),
    ],
    "convert": [
        Bad("IN", ["convert", "{tmp}/nope", "{tmp}/c", "--fields", "x=:"], ["nope", "does not exist"]),
        Bad("OUT", ["convert", "{arr}", "{afile}/c", "--fields", "x=:"], ["afile' is not", "writable"]),
        Bad("--fields", convert(), ["no fields to convert", "--fields", "--flyvis"]),
        Bad("--fields", convert("--fields", "v=timeseries[:,9]"), ["'v'", "9", "use 0..3"]),
        Bad("--flyvis", convert("--flyvis", "--fields", "v=:"), ["--flyvis", "--fields", "one or the other"]),
        Bad("--column", convert("--column", "calcium", "--fields", "v=timeseries[:,0]"),
            ["--column calcium", "without --flyvis"]),
        Bad("--column", convert("--flyvis", "--column", "xpos"), ["column='xpos'", "voltage"]),
        Bad("--stim-dims", convert("--flyvis", "--stim-dims", "100"), ["--stim-dims=100", f"at most the {N} neurons"]),
        Bad("--stim-dims", convert("--stim-dims", "2", "--fields", "v=timeseries[:,0]"),
            ["--stim-dims 2", "without --flyvis"]),
        Bad("--stim-dims", convert("--flyvis", "--stim-dims", "0"), [" 0 is invalid", ">= 1"]),
        Bad("--chunk-mb", convert("--flyvis", "--chunk-mb", "0"), [" 0 is invalid", "> 0"]),
        Bad("--chunk-mb", convert("--flyvis", "--chunk-mb", "-2"), [" -2 is invalid", "> 0"]),
        Bad("--codec", convert("--flyvis", "--codec", "lzma"), ["'lzma'"]),
        Bad("--zarr-format", convert("--flyvis", "--zarr-format", "1"), ["invalid choice: 1"]),
        Bad("--dtype", convert("--flyvis", "--dtype", "int8"), ["'int8'", "float16"]),
        Bad("--workers", convert("--flyvis", "--workers", "0"), [" 0 is invalid", ">= 1"]),
    ],
    "plan": [
        Bad("PATH", plan(data=("{tmp}/nope",)), ["nope", "does not exist"]),
        Bad("--weights", plan("--weights", "0", "1", data=("{arr}", "{arr2}")),
            ["--weights=['0', '1']", "> 0"]),
        Bad("--weights", plan("--weights", "1", data=("{arr}",)), ["--weights 1", "several PATHs"]),
        Bad("PATH", plan(data=("{arr}", "--shape", "8,2")), ["PATH or --shape, not both"]),
        Bad("--shape", plan(data=("--shape", "8,x")), ["'8,x'", "comma-separated ints"]),
        Bad("--shape", plan(data=("--shape", "0,8")), ["--shape", "positive sizes"]),
        Bad("--dtype", plan("--dtype", "float16", data=("{arr}",)), ["--dtype float16", "without --shape"]),
        Bad("--dtype", plan("--dtype", "f9"), ["--dtype", "'f9'"]),
        Bad("--fields", plan("--fields", "a=9"), ["'a'", "index 9", "use 0..7"]),
        Bad("--fields", plan("--fields", "a=x[0]"), ["--fields", "drop the array name"]),
        Bad("--fields", plan("--fields", "a=0", "--stim-dims", "2"), ["--stim-dims", "--fields"]),
        Bad("--flyvis", plan("--flyvis"), ["--flyvis", "without a run directory PATH"]),
        Bad("--flyvis", plan("--flyvis", "--fields", "a=0", data=("{run}",)), ["--flyvis", "drop --fields"]),
        Bad("--column", plan("--column", "calcium"), ["--column calcium", "without --flyvis"]),
        Bad("--column", plan("--flyvis", "--column", "xpos", data=("{run}",)), ["--column='xpos'", "dynamic column"]),
        Bad("--stim-dims", plan("--stim-dims", "0"), [" 0 is invalid", ">= 1"]),
        Bad("--stim-dims", plan("--flyvis", "--stim-dims", "99", data=("{run}",)), ["--stim-dims=99", f"{N} neurons"]),
        Bad("--stim-dims", plan("--stim-dims", "2", data=("{arr}",)), ["--stim-dims 2", "without --flyvis"]),
        Bad("--chunk-size", plan("--chunk-size", "0"), [" 0 is invalid", ">= 1"]),
        Bad("--chunk-size", plan("--chunk-size", "8"), ["--chunk-size=8", "--batch-size=16"]),
        Bad("--batch-size", plan("--batch-size", "2000"), ["--batch-size=2000", "1024 training timesteps"]),
        Bad("--batch-size", plan("--batch-size", "1.5"), ["--batch-size 1.5 is invalid", "an integer"]),
        Bad("--window", plan("--window", "200"), ["--window=200", "--chunk-size=128"]),
        Bad("--prefetch", plan("--prefetch", "0"), [" 0 is invalid", ">= 1"]),
        Bad("--mix", plan("--mix", "0"), ["--mix 0 is invalid", "'auto'"]),
        Bad("--mix", plan("--mix", "many"), ["--mix many is invalid", "--mix 16"]),
        Bad("--buffer", plan("--buffer", "gpu"), ["--buffer", "'gpu'"]),
        Bad("--gpu-prefetch", plan("--gpu-prefetch", "-1"), [" -1 is invalid", ">= 1"]),
        Bad("--workers", plan("--workers", "0"), [" 0 is invalid", ">= 1"]),
        Bad("--host-slots", plan("--host-slots", "1", "--workers", "2"), ["--host-slots=1", "--workers=2"]),
        Bad("--passes", plan("--passes", "0"), [" 0 is invalid", ">= 1"]),
        Bad("--world-size", plan("--world-size", "9"), ["--world-size=9", "Lower --world-size"]),
        Bad("--ranks-per-node", plan("--ranks-per-node", "0"), [" 0 is invalid", ">= 1"]),
        Bad("--align", plan("--align", "3"), ["--chunk-size=128", "--align=3"]),
        Bad("--pieces", plan("--pieces", "3"), ["--pieces=3", "[2, 4, 8, 16, 32, 64, 128]"]),
        Bad("--segments", plan("--segments", "{tmp}/nope.csv"), ["nope.csv", "readable CSV or JSON"]),
        Bad("--sampling", plan("--sampling", "sorted"), ["invalid choice: 'sorted'"]),
        Bad("--val-fraction", plan("--val-fraction", "1"), ["--val-fraction 1.0", "[0, 1)"]),
        Bad("--val-fraction", plan("--val-fraction", "-0.1"), [" -0.1 is invalid", ">= 0"]),
        Bad("--device", plan("--device", "tpu"), ["invalid choice: 'tpu'"]),
        Bad("--gpu-mem", plan("--gpu-mem", "lots"), ["--gpu-mem", "'lots'"]),
        Bad("--gpu-mem", plan("--gpu-mem", "8GB", "--device", "cpu"), ["--gpu-mem 8GB", "without --device cuda"]),
        Bad("--host-mem", plan("--host-mem", "1kB"), ["--host-mem"]),
    ],
    "bench": [
        Bad("PATH", bench(data=("{tmp}/nope",)), ["nope", "does not exist"]),
        Bad("--weights", bench("--weights", "1"), ["--weights 1", "several PATHs"]),
        Bad("--fields", bench("--fields", "x=9"), ["'x'", "index 9", "use 0..7"]),
        Bad("--flyvis", bench("--flyvis", "--fields", "x=:", data=("{run}",)), ["--flyvis", "drop --fields"]),
        Bad("--column", bench("--column", "calcium"), ["--column calcium", "without --flyvis"]),
        Bad("--column", bench("--flyvis", "--column", "xpos", data=("{run}",)), ["--column='xpos'"]),
        Bad("--cache", bench("--cache", "{tmp}/cache"), ["--cache", "expected PATH to be a URL", "drop --cache"]),
        Bad("--stim-dims", bench("--flyvis", "--stim-dims", "99", data=("{run}",)), ["--stim-dims=99", f"{N} neurons"]),
        Bad("--stim-dims", bench("--stim-dims", "2"), ["--stim-dims 2", "without --flyvis"]),
        Bad("--chunk-size", bench("--chunk-size", "0"), [" 0 is invalid", ">= 1"]),
        Bad("--chunk-size", bench("--chunk-size", "100000"), ["--chunk-size 100000", f"at most the {T} timesteps"]),
        Bad("--prefetch", bench("--prefetch", "0,2"), ["--prefetch 0,2", ">= 1"]),
        Bad("--prefetch", bench("--prefetch", "a"), ["'a'", "comma-separated ints"]),
        Bad("--workers", bench("--workers", "-1"), ["--workers -1", ">= 1"]),
        Bad("--gpu-prefetch", bench("--gpu-prefetch", "0"), [" 0 is invalid", ">= 1"]),
        Bad("--chunks", bench("--chunks", "1"), [" 1 is invalid", ">= 2"]),
        Bad("--train", bench("--train", "gpu"), ["invalid choice: 'gpu'"]),
        Bad("--train-ms", bench("--train-ms", "-5"), [" -5 is invalid", ">= 0"]),
        Bad("--train-ms", bench("--train", "matmul", "--train-ms", "5"), ["--train-ms 5.0", "without --train sleep"]),
        Bad("--train-steps", bench("--train-steps", "0"), [" 0 is invalid", ">= 1"]),
        Bad("--train-steps", bench("--train-steps", "8"), ["--train-steps 8", "without --train matmul"]),
        Bad("--device", bench("--device", "tpu"), ["device='tpu'"]),
        Bad("--seed", bench("--seed", "-2"), [" -2 is invalid", ">= 0"]),
        Bad("--plot", bench("--plot", "{tmp}/no/such/dir/t.png"), ["--plot", "mkdir -p"]),
        Bad("--plot", bench("--plot", "{tmp}"), ["--plot", "not a folder"]),
        Bad("--plot-setting", bench("--plot-setting", "1,1"), ["--plot-setting 1,1", "without --plot"]),
        Bad("--plot-setting", bench("--plot", "{tmp}/t.png", "--plot-setting", "4,1"), ["--plot-setting 4,1", "--prefetch 1"]),
        Bad("--plot-setting", bench("--plot-setting", "4"), ["'4'", "PREFETCH,WORKERS"]),
        Bad("--local", bench("--local", "{arr}"), ["--local", "PATH to be a URL", "drop --local"]),
    ],
    "demo": [
        Bad("--data", ["demo", "--data", "{tmp}/nope", "--out", "{tmp}/d"], ["--data", "no timeseries.zarr"]),
        Bad("--data", demo("--data", "{run}", "--timesteps", "100"), ["--timesteps 100", "with --data"]),
        Bad("--timesteps", demo("--timesteps", "0"), [" 0 is invalid", ">= 1"]),
        Bad("--neurons", demo("--neurons", "-1"), [" -1 is invalid", ">= 1"]),
        Bad("--stim-dims", demo("--stim-dims", "17"), ["--stim-dims 17", "--neurons=16"]),
        Bad("--stim-dims", ["demo", "--data", "{run}", "--stim-dims", "99", "--out", "{tmp}/d"],
            ["--stim-dims=99", f"{N} neurons"]),
        Bad("--epochs", demo("--epochs", "0"), [" 0 is invalid", ">= 1"]),
        Bad("--chunk-size", demo("--chunk-size", "4"), ["--chunk-size 4", "--batch-size=8"]),
        Bad("--pieces", demo("--pieces", "0"), ["--pieces=0", "auto"]),
        Bad("--pieces", demo("--pieces", "many"), ["'many'", "auto"]),
        Bad("--mix", demo("--mix", "0"), ["--mix=0", "auto"]),
        Bad("--buffer", demo("--buffer", "gpu"), ["--buffer", "invalid choice: 'gpu'", "'host'"]),
        Bad("--segments", demo("--segments", "{tmp}/nope.csv"), ["--segments='", "nope.csv", "readable"]),
        Bad("--segments", demo("--timesteps", "100", "--segments", "{seg}"), ["--segments=", "[0, 100)"]),
        Bad("--batch-size", demo("--batch-size", "0"), [" 0 is invalid", ">= 1"]),
        Bad("--device", demo("--device", "tpu"), ["--device='tpu'", "'cpu'"]),
        Bad("--out", demo("--out", "{afile}/d"), ["--out", "afile' is not", "writable"]),
        Bad("--seed", demo("--seed", "-1"), [" -1 is invalid", ">= 0"]),
        Bad("--val-data", demo("--val-data", "{run}"), ["--val-data", "with --data"]),
        Bad("--val-data", ["demo", "--data", "{run}", "--val-data", "{run}", "--out", "{tmp}/d"],
            ["name a run twice"]),
        Bad("--val-fraction", demo("--val-fraction", "1.5"), ["--val-fraction=1.5", "(0, 1)"]),
    ],
}

# fmt: on

#: Flags with no value to get wrong; what takes their place is said here.
NO_BAD = {
    ("synth", "--overwrite"): "OUT's row: an existing dataset without it is refused",
    ("synth", "--no-progress"): "a flag", ("synth", "--json"): "a flag",
    ("inspect", "--json"): "a flag",
    ("convert", "--overwrite"): "a flag; a different earlier run is refused without it (test_tools_convert)",
    ("convert", "--no-verify"): "a flag", ("convert", "--no-progress"): "a flag",
    ("convert", "--json"): "a flag",
    ("plan", "--json"): "a flag",
    ("bench", "--no-progress"): "a flag", ("bench", "--json"): "a flag",
    ("demo", "--resume"): "without a checkpoint it notes that the run starts afresh",
    ("demo", "--no-progress"): "a flag", ("demo", "--json"): "a flag",
}  # fmt: skip


# -- the tests ----------------------------------------------------------------------------


def _options(parser) -> set[str]:
    names = set()
    for action in parser._actions:
        if action.dest == "help":
            continue
        longs = [o for o in action.option_strings if o.startswith("--")]
        names.add(longs[0] if longs else action.metavar or action.dest)
    return names


def test_the_sweep_lists_every_option_of_every_subcommand():
    commands = build_parser()._subparsers._group_actions[0].choices
    assert set(commands) == set(BAD)
    for name, parser in commands.items():
        options = _options(parser)
        good = DEMO_OPTIONS if name == "demo" else {g.option for g in GOOD[name]}
        bad = {b.option for b in BAD[name]} | {o for c, o in NO_BAD if c == name}
        assert options - good == set(), f"{name}: options without a sensible-value row"
        assert options - bad == set(), f"{name}: options without a bad-value row"
        assert (good | bad) - options == set(), f"{name}: rows for options the parser lacks"


def test_every_documented_cli_row_has_a_bad_case():
    text = (Path(__file__).resolve().parents[1] / "docs" / "parameters.md").read_text()
    rows = re.findall(r"^\| `chunkstream (\w+) (\S+)` \|", text, flags=re.MULTILINE)
    assert len(rows) > 10, "no CLI rows found in docs/parameters.md"
    missing = [(c, o) for c, o in rows if o not in {b.option for b in BAD.get(c, [])}]
    assert missing == [], "documented CLI refusals without a case here"


@pytest.mark.parametrize(
    ("command", "row"),
    [(c, r) for c, rows in GOOD.items() for r in rows],
    ids=[f"{c}{r.option}-{i}" for c, rows in GOOD.items() for i, r in enumerate(rows)],
)
def test_a_sensible_value_takes_effect(request, stores, tmp_path, capsys, command, row):
    url = request.getfixturevalue("http_url") if any("{url}" in a for a in row.argv) else ""
    if row.option == "--overwrite":  # a first run for it to replace
        assert _cli(_fill(row.argv[:-1], stores, tmp_path), capsys)[0] == 0
    rc, out, err = _cli(_fill(row.argv, stores, tmp_path, url), capsys)
    assert rc == 0, err
    assert "Traceback" not in err
    if row.note:
        assert row.note in err, err
    elif "--no-progress" in row.argv:
        assert [line for line in err.splitlines() if "note:" in line] == []
    if row.check is not None:
        assert row.check(json.loads(out), tmp_path), out[:300]


@pytest.mark.parametrize(
    ("command", "row"),
    [(c, r) for c, rows in BAD.items() for r in rows],
    ids=[f"{c}{r.option}-{i}" for c, rows in BAD.items() for i, r in enumerate(rows)],
)
def test_a_bad_value_is_refused_in_one_line(stores, tmp_path, capsys, command, row):
    argv = _fill(row.argv, stores, tmp_path)
    before = _files(stores, tmp_path)
    rc, out, err = _cli(argv, capsys)
    assert rc == 2, (rc, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"chunkstream {command}: error:"), err
    assert "Traceback" not in err
    named = row.option if row.option.startswith("--") else None
    if named is not None:
        assert named in lines[0] or _alias(command, named) in lines[0], err
    for text in row.says:
        assert text in lines[0], f"{text!r} not in {lines[0]!r}"
    assert _files(stores, tmp_path) == before, "a refused run wrote something"
    assert not (tmp_path / "no").exists()


def _alias(command: str, option: str) -> str:
    """How argparse names an option with a short alias in its own errors (``--timesteps/-T``)."""
    parser = build_parser()._subparsers._group_actions[0].choices[command]
    action = parser._option_string_actions[option]
    return "/".join(action.option_strings)


def test_demo_options_take_effect(stores, tmp_path, capsys):
    # run 1: a synthetic dataset, every sizing option set; the header agrees with the epochs
    argv = _fill(demo("--pieces", "2", "--mix", "2", "--seed", "3", "--json"), stores, tmp_path)
    rc, out, err = _cli(argv, capsys)
    assert rc == 0, err
    info = json.loads((tmp_path / "d/result.json").read_text())
    assert info["device"] == "cpu"
    ts = zarr.open_array(str(tmp_path / "d/data/timeseries.zarr"))
    assert ts.shape == (512, 16, 4)  # --timesteps, --neurons
    header = re.search(r"(\d+) chunks/epoch x (\d+) batches/chunk = (\d+) batches/epoch", out)
    assert header, out
    epochs = re.findall(r"epoch (\d+)/(\d+) .*?; (\d+) chunks, (\d+) batches", out)
    assert [e[:2] for e in epochs] == [("1", "1")]  # --epochs
    assert epochs[0][2:] == (header[1], header[3])  # what the header says is what ran
    assert "2 pieces/chunk, batches mixed over 2 chunks" in out  # --pieces, --mix
    assert "chunk_size=64, batch_size=8" in out  # --chunk-size, --batch-size
    assert (tmp_path / "d/checkpoint.pt").is_file()  # --out
    # run 2: --resume continues the checkpoint to --epochs 2: only epoch 2 runs
    rc, out, err = _cli([*argv[:-1], "--epochs", "2", "--resume"], capsys)
    assert rc == 0, err
    assert re.findall(r"epoch (\d+)/2", out) == ["2"], out
    # run 3: --data on the module's run, --stim-dims picks its stimulus, --segments
    argv = _fill(["demo", "--data", "{run}", "--stim-dims", "2", "--epochs", "1", "--chunk-size",
                  "64", "--batch-size", "8", "--device", "cpu", "--out", "{tmp}/e", "--segments",
                  "{seg}", "--buffer", "device", "--no-progress"], stores, tmp_path)  # fmt: skip
    rc, out, err = _cli(argv, capsys)
    assert rc == 0, err
    assert "dataset:" not in out  # no synthetic data written
    assert "device tier" in out  # --buffer: the stream's tier
    # --segments: validation is reported per held-out segment
    assert re.search(r"^\s+a/val\s+\d", out, re.MULTILINE), out
    assert re.search(r"^\s+b/val\s+\d", out, re.MULTILINE), out


def test_figures_are_worded_for_what_happened(stores, capsys):
    from chunkstream.tools._diagnosis import versus_bound

    # a chunk longer than the data: streaming takes more device memory, said as such
    rc, out, err = _cli(["plan", "--shape", "8192,64", "--batch-size", "32", "--chunk-size",
                         "100000"], capsys)  # fmt: skip
    assert rc == 0, err
    assert "less device memory" not in out and "100% MORE device memory" in out
    # a run under the ideal bound (an estimate from mean times) is not "0.89x" a floor
    assert versus_bound(2.0, 1.0) == "epoch 2.00x the ideal bound"
    under = versus_bound(0.89, 1.0)
    assert "0.89x" not in under and "11% under the ideal bound's estimate" in under
    # bench's table says what a figure below 1 in its "x ideal" column means
    rc, out, err = _cli(_fill(["bench", "{arr}", "--chunks", "2", "--prefetch", "1", "--workers",
                               "1", "--train-ms", "0", "--device", "cpu", "--no-progress"],
                              stores, stores), capsys)  # fmt: skip
    assert rc == 0, err
    ratio = float(out.splitlines()[2].split()[11])  # the one setting's "x ideal", rounded
    if ratio < 0.995:
        assert "x ideal below 1: the run beat the ideal bound" in out, out
    if "x ideal below 1" in out:
        assert ratio <= 1.0, out
