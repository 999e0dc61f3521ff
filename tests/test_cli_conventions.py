"""The command line's conventions (issue 48): no command is a usage error (2),
``--help`` imports neither torch nor zarr (so it is quick), help text is plain (no
reST markup from the docstrings it borrows), and ``--debug`` / ``CHUNKSTREAM_DEBUG=1``
show the traceback a user error otherwise hides."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from chunkstream.cli import _COMMANDS, main

_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "chunkstream", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env or _ENV,
    )


def test_no_command_is_a_usage_error(capsys):
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: chunkstream") and "a command is required" in err


@pytest.mark.parametrize("command", ["", *_COMMANDS])
def test_help_is_plain_text(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([command, "--help"] if command else ["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: chunkstream")
    assert "``" not in out and ":func:`" not in out and ":class:`" not in out


def test_help_imports_neither_torch_nor_zarr():
    code = (
        "import sys\nfrom chunkstream.cli import main\n"
        "for args in ([], *([c] for c in sys.argv[1:])):\n"
        "    try: main([*args, '--help'])\n"
        "    except SystemExit: pass\n"
        "print(sorted(m for m in ('torch', 'zarr', 'numcodecs') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *_COMMANDS],
        capture_output=True,
        text=True,
        timeout=120,
        env=_ENV,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


def test_debug_shows_the_traceback_a_user_error_hides(tmp_path):
    missing = str(tmp_path / "nope.zarr")
    env = {k: v for k, v in _ENV.items() if k != "CHUNKSTREAM_DEBUG"}
    plain = _run("inspect", missing, env=env)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert plain.stderr.startswith("chunkstream inspect: error: path")
    for run in (
        _run("--debug", "inspect", missing, env=env),
        _run("inspect", missing, env={**env, "CHUNKSTREAM_DEBUG": "1"}),
    ):
        assert run.returncode != 0
        assert "Traceback (most recent call last)" in run.stderr
        assert "SourceNotFoundError" in run.stderr
