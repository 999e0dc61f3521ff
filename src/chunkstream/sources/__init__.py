"""Sources: where a window's bytes come from (see :mod:`._base` for the protocol)."""

from ._base import FieldSpec, Source
from ._base import window_nbytes as window_nbytes  # the pipeline's memory model uses it
from ._callable import CallableSource
from ._group import ZarrGroupSource
from ._join import JoinSource
from ._numpy import NumpySource
from ._remote import RemoteOptions, RemotePermissionError, RemoteStoreError
from ._tensorstore import TensorStoreSource
from ._zarr import ZarrSource

__all__ = [
    "CallableSource",
    "FieldSpec",
    "JoinSource",
    "NumpySource",
    "RemoteOptions",
    "RemotePermissionError",
    "RemoteStoreError",
    "Source",
    "TensorStoreSource",
    "ZarrGroupSource",
    "ZarrSource",
]
