"""dcr: bit-exact delta-compressed refit of model weights, from Python.

A ctypes layer over libdcr (the library's C API, ``dcr._lib``, mirrors it one to one) with a small
Pythonic layer on top:

    delta = dcr.encode_delta(base_state_dict, new_state_dict)   # bytes
    dcr.apply_delta(engine_state_dict, delta)                    # in place, all or nothing

Errors are :class:`dcr.Error` subclasses carrying the dcr status code. Long calls release the GIL.
"""

from .codec import ApplyResult, apply_delta, apply_delta_stats, encode_delta, tensors_hash
from .errors import (AbortedError, DataLossError, DeadlineExceededError, Error,
                     FailedPreconditionError, InternalError, InvalidArgumentError, LibraryError,
                     NotFoundError, ResourceExhaustedError, UnavailableError,
                     UnimplementedError)
from ._lib import ABI_VERSION
from .publisher import Publisher
from .train import SpecExporter, TrainLayout

__version__ = "0.1.0"


def library_path():
    """The path libdcr.so was loaded from (loads it if needed)."""
    from . import _lib
    return _lib.path()


def c_abi_version():
    """dcr_c_abi_version() of the loaded library (equal to ABI_VERSION once loaded)."""
    from . import _lib
    return _lib.lib().dcr_c_abi_version()


__all__ = [
    "ABI_VERSION", "AbortedError", "ApplyResult", "DataLossError", "DeadlineExceededError",
    "Error", "FailedPreconditionError", "InternalError", "InvalidArgumentError", "LibraryError",
    "NotFoundError", "ResourceExhaustedError", "UnavailableError", "UnimplementedError",
    "Publisher", "SpecExporter", "TrainLayout", "apply_delta", "apply_delta_stats",
    "c_abi_version", "encode_delta", "library_path", "tensors_hash",
]
