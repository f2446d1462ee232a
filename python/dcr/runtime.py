"""The serving-runtime C API (dcr/dcr_c.h) from Python: record where a runtime's loader places a
safetensors checkpoint, then apply deltas to the runtime's own buffers blob by blob.

    # in a process started with LD_PRELOAD=<dcr package>/libdcr_preload.so (the copy interposers)
    rec = dcr.runtime.Recorder("step0.safetensors")
    rec.add_buffer("qkv", qkv_tensor)              # the runtime's storage
    rec.set_tensor("q_proj.weight")                # what the loader places now
    rec.copy(qkv_tensor[:n], "q_proj.weight")      # a copy dcr sees (an interposed memmove)
    rx = rec.end(reload=fn)                        # fn(name, bytes): re-load a converted tensor
    rx.apply(delta)                                # header, every chunk, trailer

A callback that raises makes the call that invoked it fail: the exception is re-raised from that
call (its __cause__ is the dcr.Error the library returned).

Thread safety: as dcr_c.h (one receiver per thread at a time; the copy hook is process-wide).
"""

import ctypes

from . import _lib
from ._tensors import describe
from .errors import InvalidArgumentError

COPY_HOST, COPY_HOST_TO_DEVICE, COPY_DEVICE_TO_DEVICE, COPY_DEVICE_TO_HOST, COPY_FILL = range(5)


def delta_parts(delta):
    """The blobs of ``delta`` as a transport sends them: (header, [chunk records], trailer), each
    a memoryview of ``delta``."""
    buf = memoryview(bytes(delta) if not isinstance(delta, bytes) else delta)
    lib = _lib.lib()
    n = ctypes.c_size_t()
    _lib.check(lib.dcr_delta_parts(bytes(buf), len(buf), None, 0, ctypes.byref(n)))
    parts = (_lib.DeltaPart * n.value)()
    _lib.check(lib.dcr_delta_parts(bytes(buf), len(buf), parts, n.value, ctypes.byref(n)))
    blobs = [buf[p.offset:p.offset + p.size] for p in parts]
    return blobs[0], blobs[1:-1], blobs[-1]


def _ptr(blob):
    b = bytes(blob)
    return b, len(b)


class _Callbacks:
    """Holds a callback's first exception until the C call that ran it returns."""

    def __init__(self):
        self.error = None

    def check(self, rc):
        err, self.error = self.error, None
        if err is not None:
            try:
                _lib.check(rc)
            except Exception as dcr_error:
                raise err from dcr_error
            raise err
        _lib.check(rc)


class Receiver:
    """A dcr_receiver: the runtime's buffers at a version, moved by deltas."""

    def __init__(self, handle, keep, callbacks):
        self._h = handle
        self._keep = keep
        self._cb = callbacks

    def _handle(self):
        if not self._h:
            raise InvalidArgumentError("dcr: receiver is closed")
        return self._h

    def begin(self, header):
        b, n = _ptr(header)
        self._cb.check(_lib.lib().dcr_receiver_begin(self._handle(), b, n))

    def apply_chunk(self, record):
        b, n = _ptr(record)
        self._cb.check(_lib.lib().dcr_receiver_apply_chunk(self._handle(), b, n))

    def finish(self, trailer):
        """Commits: converted tensors are handed to the reload callback first. Only after this
        returns may the runtime serve the new version."""
        b, n = _ptr(trailer)
        self._cb.check(_lib.lib().dcr_receiver_finish(self._handle(), b, n))

    def apply(self, delta):
        """begin, every chunk record, finish."""
        header, chunks, trailer = delta_parts(delta)
        self.begin(header)
        for c in chunks:
            self.apply_chunk(c)
        self.finish(trailer)

    def verify(self, target_path):
        """Compares what dcr holds of the buffers with the checkpoint file, byte for byte."""
        _lib.check(_lib.lib().dcr_receiver_verify(self._handle(), str(target_path).encode()))

    def version(self):
        """(number, (hash lo, hi), in_delta) of the last committed version."""
        num = ctypes.c_uint64()
        h = (ctypes.c_uint64 * 2)()
        d = ctypes.c_int()
        _lib.check(_lib.lib().dcr_receiver_version(self._handle(), ctypes.byref(num), h,
                                                   ctypes.byref(d)))
        return num.value, (h[0], h[1]), bool(d.value)

    def stats(self):
        """Bytes placed bit-preserving, converted and constant."""
        v = [ctypes.c_uint64() for _ in range(3)]
        _lib.lib().dcr_receiver_stats(self._handle(), *[ctypes.byref(x) for x in v])
        return tuple(x.value for x in v)

    def close(self):
        if self._h:
            _lib.lib().dcr_receiver_free(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Recorder:
    """A dcr_recorder over the safetensors file at ``path``: learns where the runtime's loader
    places each tensor. Call :meth:`end` (or :meth:`close`) once."""

    def __init__(self, path):
        h = ctypes.c_void_p()
        _lib.check(_lib.lib().dcr_recorder_begin(str(path).encode(), ctypes.byref(h)))
        self._h = h
        self._keep = []

    def tensor_data(self, name):
        """(address, nbytes) of tensor ``name`` in dcr's mapping of the file; KeyError if
        absent."""
        n = ctypes.c_uint64()
        p = _lib.lib().dcr_recorder_tensor_data(self._h, name.encode(), ctypes.byref(n))
        if not p:
            raise KeyError(name)
        return p, n.value

    def tensor_bytes(self, name):
        """Tensor ``name``'s bytes in dcr's mapping (a copy)."""
        p, n = self.tensor_data(name)
        return ctypes.string_at(p, n)

    def add_source(self, address, size):
        _lib.check(_lib.lib().dcr_recorder_add_source(self._h, address, size))

    def add_buffer(self, name, tensor):
        """Declares ``tensor`` (contiguous CPU torch tensor or numpy array) as runtime storage."""
        d = describe(name, tensor, writable=True, dtype_override=_any_dtype(tensor))
        self._keep.append(d)
        _lib.check(_lib.lib().dcr_recorder_add_buffer(self._h, name.encode(), d.ptr, d.nbytes))

    def set_tensor(self, name):
        """The tensor the loader places now (None: none; writes then count as constants)."""
        _lib.check(_lib.lib().dcr_recorder_set_tensor(
            self._h, None if name is None else name.encode()))

    def note_copy(self, dst, src, n, kind=COPY_HOST):
        """Reports a copy of ``n`` bytes from address ``src`` to address ``dst`` that the
        interposers cannot see (a torch kernel, a device copy). A copy they saw too counts
        twice."""
        _lib.lib().dcr_copy_hook_note(dst, src, n, kind)

    def copy(self, dst, name, offset=0):
        """Copies tensor ``name``'s bytes [offset, offset + dst's bytes) from dcr's mapping into
        contiguous ``dst`` with memmove, which the preloaded interposers report: the
        bit-preserving placement of a loader."""
        d = describe("dst", dst, writable=True, dtype_override=_any_dtype(dst))
        p, n = self.tensor_data(name)
        if offset + d.nbytes > n:
            raise InvalidArgumentError("dcr: copy past the end of tensor '%s'" % name)
        ctypes.memmove(d.ptr, p + offset, d.nbytes)

    def end(self, reload=None):
        """Ends recording: a :class:`Receiver` over the declared buffers. ``reload(name, data)``
        (bytes of the tensor's new canonical value) re-runs the loader for a converted tensor."""
        cb = _Callbacks()
        if reload is None:
            fn = ctypes.cast(None, _lib.RELOAD_FN)
        else:
            def trampoline(ctx, name, data, nbytes):
                try:
                    reload(name.decode(), ctypes.string_at(data, nbytes))
                    return 0
                except BaseException as e:  # noqa: B902: re-raised by the calling method
                    if cb.error is None:
                        cb.error = e
                    code = getattr(e, "code", None)
                    return code if isinstance(code, int) and 0 < code < 64 else 8
            fn = _lib.RELOAD_FN(trampoline)
        out = ctypes.c_void_p()
        h, self._h = self._h, None
        _lib.check(_lib.lib().dcr_recorder_end(h, fn, None, ctypes.byref(out)))
        return Receiver(out, [fn] + self._keep, cb)


def _width(t):
    return t.element_size() if hasattr(t, "element_size") else t.dtype.itemsize


def _any_dtype(t):
    """Storage is bytes to the recorder: any dtype is accepted (named by its width)."""
    return {1: "U8", 2: "U16", 4: "U32", 8: "U64"}[_width(t)]


class CopyHook:
    """The process-wide copy observer (dcr_copy_hook_install): ``fn(dst, src, n, kind)`` is called
    for every copy dcr sees while installed. Use as a context manager. In a process with the
    interposers preloaded that is every memcpy of the interpreter itself, which a Python observer
    cannot take (it copies while it runs): there, only the Recorder observes."""

    def __init__(self, fn):
        self._fn = fn
        self._c = _lib.COPY_OBSERVER(lambda ctx, dst, src, n, kind: fn(dst, src, n, kind))

    def __enter__(self):
        _lib.check(_lib.lib().dcr_copy_hook_install(self._c, None))
        return self

    def __exit__(self, *exc):
        _lib.lib().dcr_copy_hook_remove()

    @staticmethod
    def active():
        return bool(_lib.lib().dcr_copy_hook_active())

    @staticmethod
    def note(dst, src, n, kind=COPY_HOST):
        _lib.lib().dcr_copy_hook_note(dst, src, n, kind)
