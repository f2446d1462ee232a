"""Deltas between tensor sets in memory: :func:`encode_delta` and :func:`apply_delta`."""

import collections
import ctypes

from . import _lib
from ._tensors import tensor_array
from .errors import InvalidArgumentError

_POLICIES = {"auto": 0, "xor": 1, "ulp": 2, "absolute": 3}

#: What :func:`apply_delta_stats` returns.
ApplyResult = collections.namedtuple(
    "ApplyResult", "chunks changes base_version target_version target_hash")

_ENCODE_OPTIONS = ("threads", "chunk_elems", "small_tensor_elems", "zstd_level", "value_policy",
                   "base_version", "target_version", "wan_context", "context_classes", "full")
_APPLY_OPTIONS = ("threads", "known_base_hash")


def _options(options, allowed, what):
    unknown = set(options) - set(allowed) - {"dtypes"}
    if unknown:
        raise TypeError("dcr.%s: unknown option(s) %s (accepted: %s)"
                        % (what, ", ".join(sorted(unknown)), ", ".join(allowed + ("dtypes",))))
    o = _lib.CodecOptions()
    _lib.lib().dcr_codec_options_init(ctypes.byref(o))
    for k, v in options.items():
        if k == "dtypes":
            continue
        if k == "value_policy":
            if v not in _POLICIES:
                raise InvalidArgumentError("dcr: value_policy must be one of %s, got %r"
                                           % (", ".join(_POLICIES), v))
            o.value_policy = _POLICIES[v]
        elif k == "known_base_hash":
            if v is None:
                continue
            lo, hi = v
            o.known_base_hash[0], o.known_base_hash[1] = lo, hi
        elif k == "wan_context":
            o.context_coding = 1 if v else 0
        elif k == "full":
            o.full = 1 if v else 0
        else:
            if not isinstance(v, int) or v < 0:
                raise InvalidArgumentError("dcr: option %s must be a non-negative int, got %r"
                                           % (k, v))
            setattr(o, k, v)
    return o


def encode_delta(base, target, **options):
    """The delta (bytes) turning tensor set ``base`` into ``target``, bit for bit.

    ``base`` and ``target`` map names to CPU torch tensors or numpy arrays with the same names,
    dtypes and shapes; the bytes equal those of ``dcr diff`` over the two sets written as
    safetensors files with the same options. ``base`` may be None with ``full=True`` (a full frame,
    applicable over any bits).

    Options: ``threads`` (0 = all cores), ``chunk_elems`` (2**22), ``small_tensor_elems``
    (2**16), ``zstd_level`` (1), ``value_policy`` ('auto', 'xor', 'ulp', 'absolute'),
    ``base_version`` (0), ``target_version`` (1), ``wan_context`` (False: context-code chunks
    against the base's exponents where smaller, as ``dcr diff --wan-context``),
    ``context_classes`` (16), ``full`` (False),
    ``dtypes`` (name -> safetensors dtype for tensors whose torch/numpy dtype does not say it,
    e.g. FP8 held as uint8; applies to both sets).

    Raises :class:`dcr.FailedPreconditionError` when the sets differ in names, dtypes or shapes,
    :class:`dcr.InvalidArgumentError` for bad tensors or options.
    """
    o = _options(options, _ENCODE_OPTIONS, "encode_delta")
    dtypes = options.get("dtypes")
    tgt = tensor_array(target, dtypes)
    if base is None:
        if not options.get("full"):
            raise InvalidArgumentError("dcr.encode_delta: base is None without full=True")
        b_arr, b_n = None, 0
    else:
        b = tensor_array(base, dtypes)
        b_arr, b_n = b.array, b.count
    out = ctypes.c_void_p()
    size = ctypes.c_size_t()
    lib = _lib.lib()
    _lib.check(lib.dcr_encode_delta(b_arr, b_n, tgt.array, tgt.count, ctypes.byref(o),
                                    ctypes.byref(out), ctypes.byref(size)))
    try:
        return ctypes.string_at(out.value, size.value) if size.value else b""
    finally:
        lib.dcr_bytes_free(out)


def _delta_buffer(delta):
    if isinstance(delta, bytes):
        return delta, len(delta)
    if isinstance(delta, (bytearray, memoryview)):
        m = memoryview(delta).cast("B")
        if m.readonly or not m.contiguous:
            data = m.tobytes()
            return data, len(data)
        return (ctypes.c_char * m.nbytes).from_buffer(m), m.nbytes
    raise TypeError("dcr: delta must be bytes, bytearray or memoryview, got %s"
                    % type(delta).__name__)


def apply_delta_stats(tensors, delta, **options):
    """:func:`apply_delta`, returning an :data:`ApplyResult` (chunks, changes, the delta's
    version numbers, and the tensors' content hash now: pass it as ``known_base_hash`` to the
    next apply to skip hashing the tensors)."""
    o = _options(options, _APPLY_OPTIONS, "apply_delta")
    arr = tensor_array(tensors, options.get("dtypes"), writable=True)
    buf, size = _delta_buffer(delta)
    r = _lib.ApplyResult()
    _lib.check(_lib.lib().dcr_apply_delta(arr.array, arr.count, buf, size, ctypes.byref(o),
                                          ctypes.byref(r)))
    return ApplyResult(r.chunks, r.changes, r.base_version, r.target_version,
                       (r.target_hash[0], r.target_hash[1]))


def apply_delta(tensors, delta, **options):
    """Applies ``delta`` (bytes) in place to ``tensors`` (name -> contiguous CPU torch tensor or
    writable numpy array), which must hold the delta's base. Afterwards their bytes equal a dense
    load of the delta's target.

    All or nothing: on any error the tensors hold exactly their bytes from before the call and a
    :class:`dcr.Error` subclass is raised: :class:`dcr.FailedPreconditionError` (not the delta's
    base), :class:`dcr.DataLossError` (corrupt or truncated delta),
    :class:`dcr.InvalidArgumentError` (names, dtypes or shapes differ from the delta's; a
    non-contiguous tensor; tensors sharing memory).

    Options: ``threads`` (0 = all cores), ``known_base_hash`` ((lo, hi) of the tensors' content
    hash, as :func:`tensors_hash` or the previous :func:`apply_delta_stats` gives it: skips one
    read of every tensor), ``dtypes`` (as for :func:`encode_delta`). The GIL is released during
    the work.
    """
    apply_delta_stats(tensors, delta, **options)


def tensors_hash(tensors, threads=0, dtypes=None):
    """The content hash (lo, hi) of a tensor set: what a delta built from it names as its
    base."""
    arr = tensor_array(tensors, dtypes)
    h = (ctypes.c_uint64 * 2)()
    _lib.check(_lib.lib().dcr_tensors_hash(arr.array, arr.count, threads, h))
    return (h[0], h[1])
