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


def where(t):
    """(kind, ordinal) of the memory holding ``t``: ("cpu", 0) for numpy arrays and CPU torch
    tensors, ("cuda", index) for CUDA torch tensors; other torch devices are refused."""
    if _kind(t) == "numpy" or t.device.type == "cpu":
        return ("cpu", 0)
    if t.device.type == "cuda":
        index = t.device.index
        if index is None:
            import torch
            index = torch.cuda.current_device()
        return ("cuda", int(index))
    raise UnimplementedError("dcr: tensors on %s are not supported (CPU or CUDA only)" % t.device)


def place_name(place):
    kind, ordinal = place
    return kind if kind in ("cpu", "host") else "%s:%d" % (kind, ordinal)


def call_device(places, device, what):
    """The device of a call over tensors at ``places`` (name -> (kind, ordinal) from
    :func:`where`), given the call's ``device`` option: None (the tensors' own), "cpu", "cuda"
    (the same as the tensors') or "host" (CPU tensors through the device path on the host
    backend, as CI runs it). Returns (kind, ordinal). Raises :class:`dcr.InvalidArgumentError`
    when the tensors are on more than one device or not on the device named."""
    if device not in (None, "cpu", "host", "cuda"):
        raise InvalidArgumentError("dcr.%s: device must be None, 'cpu', 'host' or 'cuda', got %r"
                                   % (what, device))
    seen = {}
    for name, p in places.items():
        seen.setdefault(p, name)
    if len(seen) > 1:
        a, b = sorted(seen.items())[:2]
        raise InvalidArgumentError(
            "dcr.%s: the tensors are on more than one device ('%s' on %s, '%s' on %s): one call "
            "takes tensors of one device" % (what, a[1], place_name(a[0]), b[1],
                                              place_name(b[0])))
    place = next(iter(seen)) if seen else ("cpu", 0)
    if device is None:
        return place
    want = "cpu" if device == "host" else device
    if seen and place[0] != want:
        raise InvalidArgumentError("dcr.%s: device=%r but the tensors are on %s"
                                   % (what, device, place_name(place)))
    return (device, place[1] if device == "cuda" else 0)


class Described:
    """One tensor as dcr sees it: descriptor fields plus the object keeping its bytes alive."""

    __slots__ = ("name", "dtype", "shape", "ptr", "nbytes", "keep", "place")

    def __init__(self, name, dtype, shape, ptr, nbytes, keep, place=("cpu", 0)):
        self.name, self.dtype, self.shape = name, dtype, shape
        self.ptr, self.nbytes, self.keep, self.place = ptr, nbytes, keep, place


def describe(name, t, dtype_override=None, writable=False, devices=False):
    """Describes tensor ``t`` named ``name``. With ``writable`` the bytes are written in place, so
    ``t`` must be contiguous (a copy would be written instead); otherwise a non-contiguous tensor
    is copied (on its device). CUDA tensors only with ``devices`` (the caller runs the device
    functions of the C API; ``data`` is then the device pointer). ``dtype_override`` is the safetensors dtype of ``t``'s bytes
    when its own dtype does not say it (FP8 held as uint8, BF16 held as numpy uint16): it must
    have the same element width."""
    if not isinstance(name, str):
        raise TypeError("dcr: tensor names must be str, got %r" % (name,))
    if sys.byteorder != "little":
        raise UnimplementedError("dcr: tensors in memory must be little-endian")
    kind = _kind(t)
    place = where(t)
    if kind == "torch":
        if place[0] != "cpu" and not devices:
            raise UnimplementedError(
                "dcr: tensor '%s' is on %s; this call takes CPU tensors only" % (name, t.device))
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
    return Described(name, dtype, shape, ptr, nbytes, t, place)


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


def tensor_array(tensors, dtypes=None, writable=False, devices=False):
    """A TensorArray of mapping ``tensors`` (name -> tensor). With ``writable``, tensors whose
    bytes overlap are refused (an in-place apply would write them twice). ``devices`` admits CUDA
    tensors (see :func:`describe`); :func:`call_device` then tells the call's device."""
    if not hasattr(tensors, "items"):
        raise TypeError("dcr: expected a mapping of name -> tensor, got %s"
                        % type(tensors).__name__)
    dtypes = dtypes or {}
    unknown = set(dtypes) - set(tensors)
    if unknown:
        raise InvalidArgumentError("dcr: dtypes names tensors that are not given: %s"
                                   % ", ".join(sorted(unknown)))
    described = [describe(k, v, dtypes.get(k), writable, devices) for k, v in tensors.items()]
    if writable:
        spans = sorted((d.ptr, d.ptr + d.nbytes, d.name) for d in described if d.nbytes)
        for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
            if b0 < a1:
                raise InvalidArgumentError(
                    "dcr: tensors '%s' and '%s' share memory (tied weights?): pass each "
                    "storage once" % (an, bn))
    return TensorArray(described)
