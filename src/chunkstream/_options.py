"""What every options object shares: the default for ``None``, and the keywords that
moved into one (the less common settings of ``ChunkLoader`` and ``BatchStream`` live
in ``LoaderOptions`` and ``StreamOptions`` since 0.1; the old keywords still run, with
a ``FutureWarning``, until :data:`MOVED_REMOVED_IN`)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import fields, replace
from importlib import import_module
from typing import Any, TypeVar

from ._errors import ConfigError

__all__ = ["MOVED_REMOVED_IN", "check_moved", "check_options", "moved_name", "moved_names"]

T = TypeVar("T")

#: The release that removes the old keyword spellings (``ChunkLoader(segments=...)``).
MOVED_REMOVED_IN = "0.3"


def check_options(options: object, kind: type[T], example: str) -> T:
    """``options`` as given, or ``kind()`` (the defaults) for ``None``; anything else is
    refused, with ``example`` (how to write one) as the fix."""
    if options is None:
        return kind()
    if not isinstance(options, kind):
        raise ConfigError.bad(
            "options",
            type(options).__name__,
            f"a cs.{kind.__name__} or None",
            f"Pass options=cs.{kind.__name__}({example}) with the settings to change.",
        )
    return options


def check_moved(owner: str, kind: type[T], moved: dict[str, object], options: object) -> object:
    """``options`` with the keywords that moved into ``kind`` merged in.

    Each such keyword (a field of ``kind``) warns with a ``FutureWarning`` naming the
    new spelling and is merged into ``options`` (``kind()`` for ``None``); one that
    ``options`` also sets (to other than its default) is a :class:`ConfigError`, as
    the two would disagree. Any other keyword is unknown: a ``TypeError`` as Python
    would raise. With no moved keyword ``options`` is returned as given (checked by
    :func:`check_options` after)."""
    if not moved:
        return options
    known = {f.name for f in fields(kind)}  # type: ignore[arg-type]
    for name in moved:
        if name not in known:
            raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}")
    given = check_options(options, kind, "...")
    defaults = kind()
    for name, value in moved.items():
        new = f"options=cs.{kind.__name__}({name}=...)"
        if getattr(given, name) is not getattr(defaults, name) and not _same(
            getattr(given, name), getattr(defaults, name)
        ):
            raise ConfigError.bad(
                name,
                value,
                f"one value, not {owner}({name}=...) and {new} (which holds "
                f"{getattr(given, name)!r}) together",
                f"Drop the keyword and keep {new}.",
            )
        warnings.warn(
            f"{owner}({name}=...) is deprecated and will be removed in {MOVED_REMOVED_IN}; "
            f"pass {new}",
            FutureWarning,
            stacklevel=3,
        )
    return replace(given, **moved)  # type: ignore[type-var]


def _same(a: object, b: object) -> bool:
    """Whether an option's value equals its default (an array's ``==`` is not a bool)."""
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


def moved_names(
    package: str, table: Mapping[str, tuple[str, str, str]]
) -> tuple[Callable[[str, str], Any], Callable[[str], Any]]:
    """``(moved, __getattr__)`` of a package whose public names in ``table`` went private
    (:func:`moved_name`): ``moved(name, where)`` finds one for a package that re-exports
    it (``where``: that package), ``__getattr__`` is the package's own module hook."""

    def moved(name: str, where: str) -> Any:
        return moved_name(package, table, name, where)

    def __getattr__(name: str) -> Any:
        if name in table:
            return moved(name, package)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return moved, __getattr__


def moved_name(
    package: str, table: Mapping[str, tuple[str, str, str]], name: str, where: str
) -> Any:
    """A public name that went private: ``table[name]`` is ``(module, its name there,
    replacement)``, the module relative to ``package``; found with a ``FutureWarning``
    naming the replacement until :data:`MOVED_REMOVED_IN` (``where``: the module the
    user reached it through)."""
    module, now, instead = table[name]
    warnings.warn(
        f"{where}.{name} is no longer public and will be removed in {MOVED_REMOVED_IN}: "
        f"use {instead}.",
        FutureWarning,
        stacklevel=3,
    )
    return getattr(import_module(module, package), now)
