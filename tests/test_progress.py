"""Progress bars: every long command shows one on standard error, on a terminal only.

``chunkstream._progress.progress_bar`` is the one convention (tqdm, ``disable=None``):
these tests give the process a standard error that says it is a terminal and read
what the real commands wrote there: ``convert``'s verification and every ``bench``
mode (the settings grid, ``--local``'s two copies, ``--cache``'s two epochs).
"""

from __future__ import annotations

import io
import re
import sys

import numpy as np
import pytest
import zarr

from chunkstream._progress import progress_bar
from chunkstream.cli import main
from tests.faults import serve


class Terminal(io.StringIO):
    """A standard error that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def terminal(monkeypatch) -> Terminal:
    """Standard error made a terminal, from here to the test's end (called in the test:
    pytest sets its own capture again between a fixture's setup and the test)."""
    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    return err


def finished(text: str, desc: str) -> int:
    """The total of the bar ``desc`` in ``text``, which must have reached it."""
    found = re.findall(rf"{re.escape(desc)}: 100%\|[^|]*\| (\d+)/(\d+) ", text)
    assert found, f"no finished {desc!r} bar in {text!r}"
    done, total = found[-1]
    assert done == total
    return int(total)


def test_a_bar_shows_on_a_terminal_only_and_never_when_disabled(monkeypatch):
    shown = terminal(monkeypatch)
    assert sum(progress_bar(range(3), desc="work", unit="item")) == 3
    assert finished(shown.getvalue(), "work") == 3

    quiet = Terminal()  # --no-progress, progress=False: nothing even on a terminal
    monkeypatch.setattr(sys, "stderr", quiet)
    assert sum(progress_bar(range(3), desc="off", unit="item", enabled=False)) == 3
    assert quiet.getvalue() == ""

    log = io.StringIO()  # a log file or a pipe: not a terminal
    monkeypatch.setattr(sys, "stderr", log)
    with progress_bar(desc="piped", unit="item", total=2) as bar:
        bar.update(2)
    assert log.getvalue() == ""


def test_convert_shows_its_verification(tmp_path, monkeypatch, capsys):
    err = terminal(monkeypatch)
    run, out = tmp_path / "run", tmp_path / "out"
    assert (
        main(
            [
                "synth",
                str(run),
                "-T",
                "200",
                "-N",
                "30",
                "--stim-dims",
                "6",
                "--chunks",
                "40,30,4",
                "--no-progress",
            ]
        )
        == 0
    )
    assert err.getvalue() == ""  # --no-progress: no bar, terminal or not
    argv = ["convert", str(run), str(out), "--flyvis", "--stim-dims", "6", "--chunk-mb", "0.01"]
    assert main(argv) == 0
    text = err.getvalue()
    slabs = finished(text, "convert")
    # every slab read back and counted, after the copy's bar closed
    assert finished(text, "verify") == slabs > 1
    assert text.rindex("convert: 100%") < text.index("verify:")
    assert "verify" not in capsys.readouterr().out  # the result stays on stdout, alone


@pytest.fixture
def served(tmp_path) -> tuple[str, str]:
    data = np.random.default_rng(0).standard_normal((400, 8)).astype(np.float32)
    zarr.create_array(tmp_path / "x.zarr", shape=data.shape, chunks=(50, 8), dtype="f4")[:] = data
    for server in serve(tmp_path):
        yield f"{server.url}/x.zarr", str(tmp_path / "x.zarr")


def test_every_bench_mode_shows_progress(served, tmp_path, monkeypatch, capsys):
    url, local = served
    err = terminal(monkeypatch)
    argv = [
        "bench",
        url,
        "--local",
        local,
        "--cache",
        str(tmp_path / "cache"),
        "--chunk-size",
        "100",
        "--chunks",
        "3",
        "--prefetch",
        "1,2",
        "--workers",
        "1",
        "--train-ms",
        "0",
        "--device",
        "cpu",
    ]
    assert main(argv) == 0
    text = err.getvalue()
    assert finished(text, "bench") == 2  # the (prefetch, workers) settings
    for desc in ("local", "remote", "cache epoch 1", "cache epoch 2"):
        assert finished(text, desc) == 3, desc  # --chunks windows each
    assert "epoch 2 / epoch 1" in capsys.readouterr().out

    err.seek(0)
    err.truncate()
    assert main([*argv, "--no-progress"]) == 0
    assert err.getvalue() == ""
