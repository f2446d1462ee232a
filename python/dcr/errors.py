"""Exceptions raised by dcr: one class per dcr status code (core/include/dcr/status.h).

Every failure of the library reaches Python as an instance of a subclass of :class:`Error`
carrying the status code (``code``) and the library's message (``message``).
"""

__all__ = [
    "Error", "InvalidArgumentError", "NotFoundError", "DataLossError",
    "FailedPreconditionError", "UnavailableError", "DeadlineExceededError",
    "UnimplementedError", "InternalError", "ResourceExhaustedError", "AbortedError",
    "LibraryError", "error_for_code",
]


class Error(Exception):
    """A dcr failure: ``code`` is the dcr status code, ``message`` the library's message."""

    code = -1
    code_name = "UNKNOWN"

    def __init__(self, message, code=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self):
        return self.message


class InvalidArgumentError(Error, ValueError):
    """Malformed input: descriptors, options, shapes, a tensor set that is not the delta's."""
    code, code_name = 1, "INVALID_ARGUMENT"


class NotFoundError(Error, LookupError):
    """A missing file, object or tensor."""
    code, code_name = 2, "NOT_FOUND"


class DataLossError(Error):
    """Corrupt or truncated delta or checkpoint bytes."""
    code, code_name = 3, "DATA_LOSS"


class FailedPreconditionError(Error):
    """The tensors are not the delta's base (or another state was expected)."""
    code, code_name = 4, "FAILED_PRECONDITION"


class UnavailableError(Error):
    """A transport failure or a dead peer."""
    code, code_name = 5, "UNAVAILABLE"


class DeadlineExceededError(Error):
    """A timeout."""
    code, code_name = 6, "DEADLINE_EXCEEDED"


class UnimplementedError(Error, NotImplementedError):
    """A feature this build or this call does not provide (e.g. tensors on a GPU)."""
    code, code_name = 7, "UNIMPLEMENTED"


class InternalError(Error):
    """A broken internal invariant."""
    code, code_name = 8, "INTERNAL"


class ResourceExhaustedError(Error, MemoryError):
    """Out of memory or disk."""
    code, code_name = 9, "RESOURCE_EXHAUSTED"


class AbortedError(Error):
    """Cancelled (shutdown, fault injection)."""
    code, code_name = 10, "ABORTED"


class LibraryError(Error, ImportError):
    """libdcr.so could not be found or loaded, or has another C ABI than this package."""
    code, code_name = 8, "INTERNAL"


_BY_CODE = {c.code: c for c in (
    InvalidArgumentError, NotFoundError, DataLossError, FailedPreconditionError,
    UnavailableError, DeadlineExceededError, UnimplementedError, InternalError,
    ResourceExhaustedError, AbortedError)}


def error_for_code(code, message):
    """The exception for dcr status ``code`` (an :class:`Error` for codes this package does not
    know, keeping the code)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return Error(message, code)
    return cls(message)
