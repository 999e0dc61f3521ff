"""Data tools behind the CLI: ``synth``, ``inspect``, ``convert``, ``plan`` and ``bench``.

Each is an importable function returning a report dataclass; the CLI modules
only parse arguments, call these and print. ``tools.synth``, ``tools.inspect``
and ``tools.convert`` name the modules.
"""

# ruff: noqa: F405
from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:  # what tools that read the code see; at run time, lazy_names below
    from ._public import *  # noqa: F403

__all__ = [
    "ArrayReport",
    "BenchChunk",
    "BenchReport",
    "BudgetFit",
    "ConvertReport",
    "DataLayout",
    "FieldReport",
    "FieldRequest",
    "FieldResult",
    "MemoryRow",
    "PlanReport",
    "SettingResult",
    "StoreReport",
    "SynthInfo",
    "bench",
    "convert",
    "convert_store",
    "default_chunks",
    "ensure_synthetic",
    "fit_budget",
    "flyvis_fields",
    "format_bytes",
    "inspect",
    "inspect_store",
    "layout_from_shape",
    "layout_from_store",
    "open_bench_source",
    "parse_bytes",
    "parse_field",
    "parse_fields",
    "parse_index",
    "plan",
    "plan_memory",
    "plot_bench",
    "read_amplification",
    "run_bench",
    "synth",
    "write_synthetic",
]

# What the command line's parsers need, without the tools' imports of torch and zarr
__getattr__, __dir__ = lazy_names(
    __name__, __all__, light={"CODECS": "._codecs", "OUT_DTYPES": "._codecs"}
)
