"""Data tools behind the CLI: ``synth``, ``inspect`` and ``convert``.

Each is an importable function returning a report dataclass; the CLI modules
only parse arguments, call these and print. ``tools.synth``, ``tools.inspect``
and ``tools.convert`` name the modules.
"""

from . import _convert as convert
from . import _inspect as inspect
from . import _synth as synth
from ._convert import ConvertReport, FieldResult, convert_store, flyvis_fields
from ._fieldspec import FieldRequest, parse_field, parse_fields, parse_index
from ._inspect import ArrayReport, FieldReport, StoreReport, inspect_store, read_amplification
from ._synth import SynthInfo, default_chunks, ensure_synthetic, write_synthetic

__all__ = [
    "ArrayReport",
    "ConvertReport",
    "FieldReport",
    "FieldRequest",
    "FieldResult",
    "StoreReport",
    "SynthInfo",
    "convert",
    "convert_store",
    "default_chunks",
    "ensure_synthetic",
    "flyvis_fields",
    "inspect",
    "inspect_store",
    "parse_field",
    "parse_fields",
    "parse_index",
    "read_amplification",
    "synth",
    "write_synthetic",
]
