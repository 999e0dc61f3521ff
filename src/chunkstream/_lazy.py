"""A package's public names, imported on first use (PEP 562).

``chunkstream`` and ``chunkstream.tools`` list their names in ``__all__`` and import
them from one ``_public`` module only when a name is first used, so ``import
chunkstream`` and ``chunkstream --help`` import neither torch nor zarr (a second).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping

__all__ = ["lazy_names"]


def lazy_names(
    package: str, names: list[str], light: Mapping[str, str] | None = None
) -> tuple[Callable, Callable]:
    """``__getattr__`` and ``__dir__`` for ``package``: the first name asked for imports
    ``package._public`` and binds each of its names in the package (``names``, its
    ``__all__``, and the few it re-exports for the command line only). A name in
    ``light`` (name -> module) comes from that module alone: what an argument parser
    needs before anything runs."""

    def __getattr__(name: str) -> object:
        if name.startswith("__"):  # a probe (copy, inspect, pickle): never an import
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if light and name in light:
            return getattr(importlib.import_module(light[name], package), name)
        module = importlib.import_module(package)
        public = importlib.import_module(f"{package}._public")
        for n, value in vars(public).items():
            if not n.startswith("_"):
                setattr(module, n, value)
        if name not in vars(public) or name.startswith("_"):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(module, name)

    def __dir__() -> list[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(names))

    return __getattr__, __dir__
