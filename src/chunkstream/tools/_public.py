"""Everything ``chunkstream.tools`` exports, imported at once on the first use of a
name (:mod:`chunkstream._lazy`): the command line parses its arguments without it."""

# ruff: noqa: F401
from . import _bench as bench
from . import _convert as convert
from . import _inspect as inspect
from . import _plan as plan
from . import _synth as synth
from ._bench import BenchChunk, BenchReport, SettingResult, open_bench_source, plot_bench, run_bench
from ._convert import ConvertReport, FieldResult, convert_store, flyvis_fields
from ._fieldspec import FieldRequest, parse_field, parse_fields, parse_index
from ._inspect import ArrayReport, FieldReport, StoreReport, inspect_store, read_amplification
from ._plan import (
    BudgetFit,
    DataLayout,
    MemoryRow,
    PlanReport,
    fit_budget,
    format_bytes,
    layout_from_shape,
    layout_from_store,
    parse_bytes,
    plan_memory,
)
from ._synth import SynthInfo, default_chunks, ensure_synthetic, write_synthetic

# The package's internal face for the CLI (not public API).
from ._bench import compare_cache as compare_cache  # isort: skip
from ._bench import compare_local as compare_local  # isort: skip
from ._codecs import CODECS as CODECS  # isort: skip
from ._plan import plan_share as plan_share  # isort: skip
from ._codecs import OUT_DTYPES as OUT_DTYPES  # isort: skip
from ._layout import check_flyvis_stim_dims as check_flyvis_stim_dims  # isort: skip
from ._recordings import RecordingShare as RecordingShare  # isort: skip
from ._recordings import format_shares as format_shares  # isort: skip
from ._recordings import open_recordings as open_recordings  # isort: skip
from ._recordings import parse_weights as parse_weights  # isort: skip
from ._recordings import pass_shares as pass_shares  # isort: skip
from ._recordings import recording_names as recording_names  # isort: skip
from ._recordings import recordings_layout as recordings_layout  # isort: skip
from ._stores import is_remote as is_remote  # isort: skip
from ._stores import open_arrays as open_arrays  # isort: skip
