"""mkdocs hook: pull README fragments (``docs/_*.md``) into pages, links fixed.

A page line ``<!-- include: _guarantees.md -->`` is replaced by that file's
text. The fragments are also pasted into the README, so their relative links
are written from the repository root (``docs/parameters.md``); here they are
rewritten relative to the including page, and links to files outside ``docs/``
(which the site cannot serve) become the path in code, so a strict build stays
clean. A missing fragment is an error: the build fails instead of dropping it.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

_INCLUDE = re.compile(r"^<!-- include: (?P<name>_[\w.-]+\.md) -->$", re.M)
_LINK = re.compile(r"(?P<bang>!?)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)")


def _rewrite(text: str, page_dir: str) -> str:
    def fix(match: re.Match) -> str:
        target = match.group("target")
        if "://" in target or target.startswith(("#", "/", "mailto:")):
            return match.group(0)
        path, _, anchor = target.partition("#")
        if not path.startswith("docs/"):
            return f"`{path}`" if not match.group("bang") else match.group("text")
        relative = posixpath.relpath(path.removeprefix("docs/"), page_dir or ".")
        suffix = f"#{anchor}" if anchor else ""
        return f"{match.group('bang')}[{match.group('text')}]({relative}{suffix})"

    return _LINK.sub(fix, text)


def on_page_markdown(markdown: str, page, config, files) -> str:
    docs_dir = Path(config["docs_dir"])
    page_dir = posixpath.dirname(page.file.src_uri)

    def include(match: re.Match) -> str:
        fragment = docs_dir / match.group("name")
        if not fragment.is_file():
            raise FileNotFoundError(
                f"{page.file.src_uri} includes {match.group('name')}, which does not exist in "
                f"{docs_dir}: add the file or remove the include line."
            )
        return _rewrite(fragment.read_text(encoding="utf-8"), page_dir)

    return _INCLUDE.sub(include, markdown)
