"""synth, inspect and convert through the real CLI entry point."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

from chunkstream.cli import main


def _synth(tmp_path, capsys, *extra):
    out = tmp_path / "run"
    rc = main(["synth", str(out), "-T", "200", "-N", "30", "--stim-dims", "6",
               "--chunks", "40,30,4", "--no-progress", "--json", *extra])  # fmt: skip
    assert rc == 0
    return out, json.loads(capsys.readouterr().out)


def test_synth_inspect_convert_pipeline(tmp_path, capsys):
    out, info = _synth(tmp_path, capsys, "--codec", "blosc-zstd", "--zarr-format", "2")
    assert info["shapes"]["timeseries"] == [200, 30, 4] and info["zarr_format"] == 2

    assert main(["inspect", str(out), "--fields", "voltage=:,0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["fields"][0]["amplification"] == pytest.approx(4.0)

    assert main(["inspect", str(out), "--fields", "voltage=:,0"]) == 0
    text = capsys.readouterr().out
    assert "timeseries" in text and "interleaved" in text and "chunkstream convert" in text

    conv = tmp_path / "conv"
    rc = main(["convert", str(out), str(conv), "--flyvis", "--stim-dims", "6",
               "--chunk-mb", "0.01", "--no-progress", "--json"])  # fmt: skip
    assert rc == 0
    result = json.loads(capsys.readouterr().out)
    assert result["verified"] and [f["name"] for f in result["fields"]] == ["voltage", "stimulus"]
    source = zarr.open_array(str(out / "timeseries.zarr"), mode="r")[:]
    np.testing.assert_array_equal(zarr.open_array(str(conv / "stimulus"))[:], source[:, :6, 1])

    assert main(["inspect", str(conv), "--fields", "voltage=voltage[]"]) == 0
    assert "ok: reading 'voltage' decodes 1.0x" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "{tmp}/nope"],
        ["convert", "{tmp}/nope", "{tmp}/out", "--fields", "v=:,0"],
        ["convert", "{tmp}/run", "{tmp}/out"],
        ["convert", "{tmp}/run", "{tmp}/out", "--fields", "v=:,9"],
        ["convert", "{tmp}/run", "{tmp}/out", "--fields", "v=x:y"],
        ["synth", "{tmp}/run"],  # exists already
        ["synth", "{tmp}/new", "-T", "0"],
    ],
)
def test_errors_exit_2_with_one_line(tmp_path, capsys, argv):
    _synth(tmp_path, capsys)
    rc = main([a.format(tmp=tmp_path) for a in argv])
    captured = capsys.readouterr()
    assert rc == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"chunkstream {argv[0]}: error:")
    assert "Traceback" not in captured.err


@pytest.mark.parametrize("command", ["synth", "inspect", "convert"])
def test_help_is_complete(capsys, command):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "--json" in text
    if command == "convert":
        assert all(opt in text for opt in ("--fields", "--chunk-mb", "--codec", "--workers",
                                           "--flyvis", "--overwrite"))  # fmt: skip
