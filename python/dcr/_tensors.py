"""Tensor sets (mappings name -> torch.Tensor or numpy.ndarray) as dcr_tensor descriptors.

Neither torch nor numpy is imported here: an object is recognised by its type's module, so the
package works with either, both, or (for the codec on bytes) neither.
"""

import ctypes
import sys

from . import _lib
from .errors import InvalidArgumentError, UnimplementedError

# torch dtype name (str(dtype) without "torch.") -> safetensors dtype.
_TORCH = {
    "bfloat16": "BF16", "float16": "F16", "float32": "F32", "float64": "F64",
    "int8": "I8", "uint8": "U8", "int16": "I16", "int32": "I32", "int64": "I64",
    "bool": "BOOL", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}
# numpy dtype name -> safetensors dtype.
_NUMPY = {
    "float16": "F16", "float32": "F32", "float64": "F64", "int8": "I8", "uint8": "U8",
    "int16": "I16", "uint16": "U16", "int32": "I32", "uint32": "U32", "int64": "I64",
    "uint64": "U64", "bool": "BOOL",
}
# Element widths of the safetensors dtypes (dcr/dtype.h).
WIDTH = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "I16": 2, "F16": 2,
         "BF16": 2, "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8}


def _kind(t):
    mod = type(t).__module__.split(".")[0]
    if mod == "torch":
        return "torch"
    if mod == "numpy":
        return "numpy"
    raise TypeError("dcr: expected a torch.Tensor or a numpy.ndarray, got %s" % type(t).__name__)


class Described:
    """One tensor as dcr sees it: descriptor fields plus the object keeping its bytes alive."""

    __slots__ = ("name", "dtype", "shape", "ptr", "nbytes", "keep")

    def __init__(self, name, dtype, shape, ptr, nbytes, keep):
        self.name, self.dtype, self.shape = name, dtype, shape
        self.ptr, self.nbytes, self.keep = ptr, nbytes, keep


def describe(name, t, dtype_override=None, writable=False):
    """Describes tensor ``t`` named ``name``. With ``writable`` the bytes are written in place, so
    ``t`` must be a contiguous CPU tensor (a copy would be written instead); otherwise a
    non-contiguous tensor is copied. ``dtype_override`` is the safetensors dtype of ``t``'s bytes
    when its own dtype does not say it (FP8 held as uint8, BF16 held as numpy uint16): it must
    have the same element width."""
    if not isinstance(name, str):
        raise TypeError("dcr: tensor names must be str, got %r" % (name,))
    if sys.byteorder != "little":
        raise UnimplementedError("dcr: tensors in memory must be little-endian")
    kind = _kind(t)
    if kind == "torch":
        if t.device.type != "cpu":
            raise UnimplementedError(
                "dcr: tensor '%s' is on %s; this build of the Python package applies to CPU "
                "tensors only" % (name, t.device))
        if getattr(t, "is_sparse", False):
            raise InvalidArgumentError("dcr: tensor '%s' is sparse" % name)
        tname = str(t.dtype).replace("torch.", "")
        dtype = _TORCH.get(tname)
        if not t.is_contiguous():
            if writable:
                raise InvalidArgumentError(
                    "dcr: tensor '%s' is not contiguous: it cannot be written in place" % name)
            t = t.contiguous()
        shape = tuple(int(s) for s in t.shape)
        width = t.element_size()
        ptr = t.data_ptr()
        nbytes = t.numel() * width
    else:
        tname = t.dtype.name
        dtype = _NUMPY.get(tname)
        if not t.flags["C_CONTIGUOUS"]:
            if writable:
                raise InvalidArgumentError(
                    "dcr: array '%s' is not C-contiguous: it cannot be written in place" % name)
            import numpy
            t = numpy.ascontiguousarray(t)
        if writable and not t.flags["WRITEABLE"]:
            raise InvalidArgumentError("dcr: array '%s' is read-only" % name)
        if t.dtype.byteorder == ">":
            raise UnimplementedError("dcr: array '%s' is big-endian" % name)
        shape = tuple(int(s) for s in t.shape)
        width = t.dtype.itemsize
        ptr = t.ctypes.data
        nbytes = t.size * width
    if dtype_override is not None:
        if dtype_override not in WIDTH:
            raise InvalidArgumentError("dcr: tensor '%s': unknown dtype %r (one of %s)"
                                       % (name, dtype_override, ", ".join(sorted(WIDTH))))
        if WIDTH[dtype_override] != width:
            raise InvalidArgumentError(
                "dcr: tensor '%s': dtype %s has %d-byte elements but the tensor's are %d bytes"
                % (name, dtype_override, WIDTH[dtype_override], width))
        dtype = dtype_override
    if dtype is None:
        raise InvalidArgumentError(
            "dcr: tensor '%s' has dtype %s, which dcr does not know; pass dtypes={'%s': ...} "
            "with the safetensors dtype of its bytes" % (name, tname, name))
    return Described(name, dtype, shape, ptr, nbytes, t)


class TensorArray:
    """A ctypes array of dcr_tensor over described tensors; keeps every buffer alive."""

    def __init__(self, described):
        self.described = list(described)
        n = len(self.described)
        self.array = (_lib.Tensor * max(n, 1))()
        self._keep = []
        for i, d in enumerate(self.described):
            name = d.name.encode("utf-8")
            dtype = d.dtype.encode("ascii")
            shape = (ctypes.c_int64 * max(len(d.shape), 1))(*d.shape)
            self._keep += [name, dtype, shape]
            e = self.array[i]
            e.name, e.dtype, e.shape, e.ndim = name, dtype, shape, len(d.shape)
            e.data, e.nbytes = d.ptr or None, d.nbytes
        self.count = n


def tensor_array(tensors, dtypes=None, writable=False):
    """A TensorArray of mapping ``tensors`` (name -> tensor). With ``writable``, tensors whose
    bytes overlap are refused (an in-place apply would write them twice)."""
    if not hasattr(tensors, "items"):
        raise TypeError("dcr: expected a mapping of name -> tensor, got %s"
                        % type(tensors).__name__)
    dtypes = dtypes or {}
    unknown = set(dtypes) - set(tensors)
    if unknown:
        raise InvalidArgumentError("dcr: dtypes names tensors that are not given: %s"
                                   % ", ".join(sorted(unknown)))
    described = [describe(k, v, dtypes.get(k), writable) for k, v in tensors.items()]
    if writable:
        spans = sorted((d.ptr, d.ptr + d.nbytes, d.name) for d in described if d.nbytes)
        for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
            if b0 < a1:
                raise InvalidArgumentError(
                    "dcr: tensors '%s' and '%s' share memory (tied weights?): pass each "
                    "storage once" % (an, bn))
    return TensorArray(described)
