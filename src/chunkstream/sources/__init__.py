"""Sources: where a window's bytes come from (see :mod:`._base` for the protocol)."""

from ._base import FieldSpec, Source
from ._callable import CallableSource
from ._group import ZarrGroupSource
from ._join import JoinSource
from ._numpy import NumpySource
from ._recordings import Recordings
from ._remote import RemoteOptions, RemotePermissionError, RemoteStoreError
from ._tensorstore import TensorStoreSource
from ._zarr import ZarrSource

# The package's internal face for the rest of chunkstream (not public API).
from ._base import check_lengths as check_lengths  # isort: skip
from ._base import check_source as check_source  # isort: skip
from ._base import HandsOver as HandsOver  # isort: skip
from ._base import LearnsFields as LearnsFields  # isort: skip
from ._base import describe_source as describe_source  # isort: skip
from ._base import decode_scratch_nbytes as decode_scratch_nbytes  # isort: skip
from ._base import stored_time_chunk as stored_time_chunk  # isort: skip
from ._base import source_caches as source_caches  # isort: skip
from ._base import window_nbytes as window_nbytes  # isort: skip
from ._read import call_with_retries as call_with_retries  # isort: skip
from ._read import read_owned_window as read_owned_window  # isort: skip
from ._read import read_window as read_window  # isort: skip
from ._read import reading as reading  # isort: skip
from ._remote import close_store as close_store  # isort: skip
from ._remote import store_errors as store_errors  # isort: skip
from ._select import read_amplification as read_amplification  # isort: skip
from ._remote import is_url as is_url  # isort: skip
from ._recordings import MASK_SUFFIX as MASK_SUFFIX  # isort: skip
from ._recordings import RECORDING_FIELD as RECORDING_FIELD  # isort: skip
from ._open import open_zarr_array as open_zarr_array  # isort: skip
from ._open import open_zarr_node as open_zarr_node  # isort: skip
from ._remote import OPTIONS_KEY as OPTIONS_KEY  # isort: skip

__all__ = [
    "CallableSource",
    "FieldSpec",
    "JoinSource",
    "NumpySource",
    "Recordings",
    "RemoteOptions",
    "RemotePermissionError",
    "RemoteStoreError",
    "Source",
    "TensorStoreSource",
    "ZarrGroupSource",
    "ZarrSource",
]
