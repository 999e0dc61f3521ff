"""The user guide's examples run, and the public API is documented.

Convention for the pages listed in ``EXECUTED``: every fenced ``python`` block is
run, in page order, in one namespace (a page reads as one script), in a fresh
directory in which the page's ``chunkstream synth|convert|inspect ...`` command
lines (from its ``bash`` blocks, in order) have been run first, so the blocks open the same small stores a
reader would make. A block that must not run uses another fence language
(```text, ```console, ```bash). Blocks run with ``device`` resolving to the CPU
here; sizes on the pages are small on purpose.
"""

from __future__ import annotations

import inspect
import re
import shlex
from pathlib import Path

import pytest

import chunkstream
from chunkstream.cli import main as cli_main

DOCS = Path(__file__).resolve().parents[1] / "docs"
EXECUTED = ("getting-started.md", "guide/migrate.md", "guide/data-layout.md")
# The commands a page's bash blocks may run before its python blocks (fast, local).
COMMANDS = ("synth", "convert", "inspect")
_FENCE = re.compile(r"^```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^```\s*$", re.M | re.S)


def blocks(page: str, lang: str) -> list[tuple[int, str]]:
    """``(line number, code)`` of every fenced block of language ``lang`` on ``page``."""
    text = (DOCS / page).read_text(encoding="utf-8")
    return [
        (text.count("\n", 0, m.start("body")) + 1, m.group("body"))
        for m in _FENCE.finditer(text)
        if m.group("lang") == lang
    ]


def cli_commands(page: str) -> list[list[str]]:
    """The page's ``chunkstream <COMMANDS>`` lines in bash blocks, as argv lists (no prefix)."""
    commands = []
    for _, body in blocks(page, "bash"):
        for line in body.splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["chunkstream"] and words[1:2] and words[1] in COMMANDS:
                commands.append(words[1:])
    return commands


@pytest.mark.parametrize("page", EXECUTED)
def test_page_examples_run(page, tmp_path, monkeypatch, capsys):
    code = blocks(page, "python")
    assert code, f"{page} has no python blocks"
    monkeypatch.chdir(tmp_path)
    for argv in cli_commands(page):
        assert cli_main(argv) == 0, f"{page}: chunkstream {shlex.join(argv)} failed"
    namespace: dict[str, object] = {"__name__": f"docs:{page}"}
    for line, body in code:
        # Pad with newlines so a traceback's line number is the line on the page.
        compiled = compile("\n" * (line - 1) + body, str(DOCS / page), "exec")
        exec(compiled, namespace)
    capsys.readouterr()  # the pages print summaries; keep the test log short
    loader = namespace.get("loader")
    if isinstance(loader, chunkstream.ChunkLoader):
        assert loader.closed, f"{page} leaves its loader open"


def test_executed_pages_parse_their_fences():
    # A typo in a fence (```pyhton) would silently skip a block: every fence is known.
    known = {"python", "bash", "text", "console", "yaml", "toml", ""}
    for page in EXECUTED:
        text = (DOCS / page).read_text(encoding="utf-8")
        langs = {m.group("lang") for m in _FENCE.finditer(text)}
        assert langs <= known, f"{page}: unknown fence languages {langs - known}"
        assert text.count("```") % 2 == 0, f"{page}: unbalanced code fences"


def _public_objects():
    for name in chunkstream.__all__:
        if name.startswith("__"):
            continue
        yield f"chunkstream.{name}", getattr(chunkstream, name)
    from chunkstream import compat, flyvis

    for module in (compat, flyvis):
        for name in module.__all__:
            yield f"{module.__name__}.{name}", getattr(module, name)


PUBLIC = dict(_public_objects())


@pytest.mark.parametrize("qualname", sorted(PUBLIC))
def test_public_object_has_a_docstring(qualname):
    # The API reference is generated from these; a public name without one is a gap.
    doc = inspect.getdoc(PUBLIC[qualname])
    assert doc and len(doc.split()) >= 3, f"{qualname} needs a docstring stating its contract"


_TEST_REF = re.compile(r"`(?P<file>test_\w+\.py)?(?:::(?P<name>test_\w+\*?))?`")


def test_referenced_tests_exist():
    # The guarantees name the test behind each promise: a renamed or deleted test
    # must not leave the docs pointing at nothing. ``::name`` alone refers to the
    # file named last before it; ``name*`` is a prefix.
    tests = Path(__file__).resolve().parent
    missing = []
    for page in sorted(DOCS.rglob("*.md")):
        current = None
        for m in _TEST_REF.finditer(page.read_text(encoding="utf-8")):
            file, name = m.group("file"), m.group("name")
            if file is None and name is None:
                continue
            current = file or current
            if current is None or not (tests / current).is_file():
                missing.append(f"{page.name}: {m.group(0)} (no such test file)")
                continue
            if name is None:
                continue
            defined = re.findall(r"^def (test_\w+)", (tests / current).read_text(), re.M)
            ok = (
                any(d.startswith(name[:-1]) for d in defined)
                if name.endswith("*")
                else name in defined
            )
            if not ok:
                missing.append(f"{page.name}: {current}::{name}")
    assert not missing, "docs name tests that do not exist:\n" + "\n".join(missing)
