"""The README stays true: its set-up commands exist and its sections match the docs site."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chunkstream.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


@pytest.mark.parametrize("part", ["_demo_readme.md", "_guarantees.md", "_scaling.md"])
def test_readme_sections_are_the_docs_sections(part):
    # One text, two places: the docs site includes these files, the README copies them.
    assert (ROOT / "docs" / part).read_text().strip() in README, (
        f"README is out of date with docs/{part}"
    )


def test_setup_commands_exist():
    assert "./dev demo" in README and "./dev test" in README
    assert os.access(ROOT / "dev", os.X_OK)
    commands = build_parser()._subparsers._group_actions[0].choices
    for name in ("demo", "synth", "inspect", "convert", "plan", "bench"):
        assert name in commands
        assert f"chunkstream {name}" in README


def test_the_timeline_picture_is_in_the_repo():
    assert "docs/img/timeline.png" in README
    assert (ROOT / "docs/img/timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
