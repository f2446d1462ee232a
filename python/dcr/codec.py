"""Deltas between tensor sets in memory: :func:`encode_delta` and :func:`apply_delta`.

Tensors on CUDA go through the same calls: a call over CUDA tensors (``t.is_cuda``) passes their
device pointers (``t.data_ptr()``) and device ordinal to the ``*_device`` functions of
``dcr/codec_c.h``, which hash and apply on the GPU (only the changed elements move between host
and device) and encode by downloading the tensors in pieces of at most 64 MiB. Stream order:
before the call, torch's current stream of that device is synchronized, so every write queued to
the tensors is complete; dcr runs on its own streams and returns with its work complete, so
whatever is queued on any stream after the call sees the new bytes (no synchronization is needed
after it). All tensors of one call must be on one device (:class:`dcr.InvalidArgumentError`
otherwise). The option ``device="host"`` runs the same device path on CPU tensors through dcr's
host backend: what CI, without a GPU, runs to test it.
"""

import collections
import ctypes

from . import _lib
from ._tensors import WIDTH, call_device, tensor_array, where
from .errors import FailedPreconditionError, InternalError, InvalidArgumentError

_POLICIES = {"auto": 0, "xor": 1, "ulp": 2, "absolute": 3}

#: What :func:`apply_delta_stats` returns.
ApplyResult = collections.namedtuple(
    "ApplyResult", "chunks changes base_version target_version target_hash")

_ENCODE_OPTIONS = ("threads", "chunk_elems", "small_tensor_elems", "zstd_level", "value_policy",
                   "base_version", "target_version", "wan_context", "context_classes", "full")
_APPLY_OPTIONS = ("threads", "known_base_hash")
# Options of every call that are not codec options.
_CALL_OPTIONS = ("dtypes", "device")


def _options(options, allowed, what):
    unknown = set(options) - set(allowed) - set(_CALL_OPTIONS)
    if unknown:
        raise TypeError("dcr.%s: unknown option(s) %s (accepted: %s)"
                        % (what, ", ".join(sorted(unknown)), ", ".join(allowed + _CALL_OPTIONS)))
    o = _lib.CodecOptions()
    _lib.lib().dcr_codec_options_init(ctypes.byref(o))
    for k, v in options.items():
        if k in _CALL_OPTIONS:
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


def _device(place):
    """The dcr_device of ``place`` ((kind, ordinal)), or None for host memory."""
    if place[0] == "cpu":
        return None
    return ctypes.byref(_lib.Device(_lib.DEVICE_KINDS[place[0]], place[1]))


def _synchronize(place):
    """Waits for the work queued on torch's current stream of CUDA device ``place`` (a no-op for
    host memory): the bytes dcr reads or writes are then those the caller's program order
    says."""
    if place[0] == "cuda":
        import torch
        torch.cuda.current_stream(place[1]).synchronize()


def _places(arr, label=None):
    return {(d.name if label is None else "%s (%s)" % (d.name, label)): d.place
            for d in arr.described}


def encode_delta(base, target, **options):
    """The delta (bytes) turning tensor set ``base`` into ``target``, bit for bit.

    ``base`` and ``target`` map names to torch tensors (CPU or CUDA, all on one device) or numpy
    arrays with the same names, dtypes and shapes; the bytes equal those of ``dcr diff`` over the two sets written as
    safetensors files with the same options. ``base`` may be None with ``full=True`` (a full frame,
    applicable over any bits).

    Options: ``threads`` (0 = all cores), ``chunk_elems`` (2**22), ``small_tensor_elems``
    (2**16), ``zstd_level`` (1), ``value_policy`` ('auto', 'xor', 'ulp', 'absolute'),
    ``base_version`` (0), ``target_version`` (1), ``wan_context`` (False: context-code chunks
    against the base's exponents where smaller, as ``dcr diff --wan-context``),
    ``context_classes`` (16), ``full`` (False),
    ``dtypes`` (name -> safetensors dtype for tensors whose torch/numpy dtype does not say it,
    e.g. FP8 held as uint8; applies to both sets), ``device`` (None: the tensors' own;
    ``"host"``: CPU tensors through the device path, see the module comment).

    Raises :class:`dcr.FailedPreconditionError` when the sets differ in names, dtypes or shapes,
    :class:`dcr.InvalidArgumentError` for bad tensors or options.
    """
    o = _options(options, _ENCODE_OPTIONS, "encode_delta")
    dtypes = options.get("dtypes")
    tgt = tensor_array(target, dtypes, devices=True)
    places = _places(tgt, "target")
    if base is None:
        if not options.get("full"):
            raise InvalidArgumentError("dcr.encode_delta: base is None without full=True")
        b_arr, b_n = None, 0
    else:
        b = tensor_array(base, dtypes, devices=True)
        b_arr, b_n = b.array, b.count
        places.update(_places(b, "base"))
    place = call_device(places, options.get("device"), "encode_delta")
    out = ctypes.c_void_p()
    size = ctypes.c_size_t()
    lib = _lib.lib()
    if place[0] == "cpu":
        _lib.check(lib.dcr_encode_delta(b_arr, b_n, tgt.array, tgt.count, ctypes.byref(o),
                                        ctypes.byref(out), ctypes.byref(size)))
    else:
        _synchronize(place)
        _lib.check(lib.dcr_encode_delta_device(_device(place), b_arr, b_n, tgt.array, tgt.count,
                                               ctypes.byref(o), ctypes.byref(out),
                                               ctypes.byref(size)))
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
    arr = tensor_array(tensors, options.get("dtypes"), writable=True, devices=True)
    place = call_device(_places(arr), options.get("device"), "apply_delta")
    buf, size = _delta_buffer(delta)
    r = _lib.ApplyResult()
    if place[0] == "cpu":
        _lib.check(_lib.lib().dcr_apply_delta(arr.array, arr.count, buf, size, ctypes.byref(o),
                                              ctypes.byref(r)))
    else:
        _synchronize(place)
        _lib.check(_lib.lib().dcr_apply_delta_device(_device(place), arr.array, arr.count, buf,
                                                     size, ctypes.byref(o), ctypes.byref(r)))
    return ApplyResult(r.chunks, r.changes, r.base_version, r.target_version,
                       (r.target_hash[0], r.target_hash[1]))


def apply_delta(tensors, delta, **options):
    """Applies ``delta`` (bytes) in place to ``tensors`` (name -> contiguous torch tensor, CPU or
    CUDA, all on one device, or writable numpy array), which must hold the delta's base.
    Afterwards their bytes equal a dense load of the delta's target. CUDA tensors are applied on
    their GPU by device pointer (see the module comment); a delta for them must be built without
    ``wan_context`` (the device path refuses context-coded deltas).

    All or nothing: on any error the tensors hold exactly their bytes from before the call and a
    :class:`dcr.Error` subclass is raised: :class:`dcr.FailedPreconditionError` (not the delta's
    base), :class:`dcr.DataLossError` (corrupt or truncated delta),
    :class:`dcr.InvalidArgumentError` (names, dtypes or shapes differ from the delta's; a
    non-contiguous tensor; tensors sharing memory).

    Options: ``threads`` (0 = all cores), ``known_base_hash`` ((lo, hi) of the tensors' content
    hash, as :func:`tensors_hash` or the previous :func:`apply_delta_stats` gives it: skips one
    read of every tensor), ``dtypes`` and ``device`` (as for :func:`encode_delta`). The GIL is
    released during the work.
    """
    apply_delta_stats(tensors, delta, **options)


def tensors_hash(tensors, threads=0, dtypes=None, device=None):
    """The content hash (lo, hi) of a tensor set: what a delta built from it names as its
    base. CUDA tensors are hashed on their GPU; ``device`` as for :func:`encode_delta`."""
    arr = tensor_array(tensors, dtypes, devices=True)
    place = call_device(_places(arr), device, "tensors_hash")
    h = (ctypes.c_uint64 * 2)()
    if place[0] == "cpu":
        _lib.check(_lib.lib().dcr_tensors_hash(arr.array, arr.count, threads, h))
    else:
        _synchronize(place)
        _lib.check(_lib.lib().dcr_tensors_hash_device(_device(place), arr.array, arr.count,
                                                      threads, h))
    return (h[0], h[1])


def _index_ptr(a, what):
    """(address, length, keep) of a 1-D int64 index array (torch or numpy), contiguous."""
    mod = type(a).__module__.split(".")[0]
    if mod == "torch":
        if a.dtype.is_floating_point or a.element_size() != 8 or a.device.type != "cpu":
            raise InvalidArgumentError("dcr: %s must be a CPU int64 tensor" % what)
        a = a.reshape(-1).contiguous()
        return a.data_ptr(), int(a.numel()), a
    if mod == "numpy":
        import numpy
        a = numpy.ascontiguousarray(a, dtype=numpy.int64).reshape(-1)
        return a.ctypes.data, int(a.size), a
    raise TypeError("dcr: %s must be a torch.Tensor or numpy.ndarray, got %s"
                    % (what, type(a).__name__))


class PlacementMap:
    """Where the elements of a canonical tensor set lie, bit for bit, in other buffers (an
    engine's parameters): dcr_placement_map of dcr/codec_c.h.

    ``tensors``: the canonical set (name -> tensor; its names, dtypes and shapes are kept, in
    this order). ``placements``: iterable of ``(name, dst, src, dst_index)``: element
    ``src[i]`` of canonical tensor ``name`` is held at element ``dst_index[i]`` of the contiguous
    tensor ``dst`` (same element width; ``src`` and ``dst_index`` 1-D int64). The map keeps
    the address of each ``dst`` (and a reference to it): the storage must not move while the map
    is used. Raises :class:`dcr.InvalidArgumentError` for indices outside their tensors, two
    placements writing the same destination element, or destinations on more than one device.

    The canonical tensors are in host memory (CPU); the destinations are CPU tensors or CUDA
    tensors of one GPU: then :meth:`apply` moves the canonical set on the host and scatters the
    changed elements to the GPU by device pointer (dcr_placement_map_create_device), after
    synchronizing torch's current stream of that GPU. ``device="host"`` writes CPU destinations
    through dcr's host backend (the device path, for tests).

    Thread safety: one call at a time per map.
    """

    def __init__(self, tensors, placements, dtypes=None, device=None):
        self._dtypes = dict(dtypes or {})
        arr = tensor_array(tensors, self._dtypes)
        self.names = [d.name for d in arr.described]
        index = {n: i for i, n in enumerate(self.names)}
        self._dst = []
        keep = []
        cs = []
        places = {}
        for name, dst, src, dst_index in placements:
            if name not in index:
                raise InvalidArgumentError("dcr: placement of unknown tensor '%s'" % name)
            ptr, numel, width, place = _dst_buffer(name, dst)
            places["destination %d of '%s'" % (len(cs), name)] = place
            if width != WIDTH[arr.described[index[name]].dtype]:
                raise InvalidArgumentError(
                    "dcr: placement of '%s' into a tensor of %d-byte elements, but the tensor's "
                    "are %d bytes" % (name, width, WIDTH[arr.described[index[name]].dtype]))
            sp, sn, sk = _index_ptr(src, "src")
            dp, dn, dk = _index_ptr(dst_index, "dst_index")
            if sn != dn:
                raise InvalidArgumentError("dcr: placement of '%s': %d source and %d destination "
                                           "indices" % (name, sn, dn))
            keep += [sk, dk]
            self._dst.append((dst, ptr))
            p = _lib.Placement()
            p.tensor, p.dst, p.dst_elements, p.count = index[name], ptr or None, numel, sn
            p.src = ctypes.cast(sp, ctypes.POINTER(ctypes.c_int64))
            p.dst_index = ctypes.cast(dp, ctypes.POINTER(ctypes.c_int64))
            cs.append(p)
        c_arr = (_lib.Placement * max(len(cs), 1))(*cs)
        #: (kind, ordinal) of the destinations' memory: ("cpu", 0), ("host", 0), ("cuda", i).
        self.place = call_device(places, device, "PlacementMap")
        handle = ctypes.c_void_p()
        lib = _lib.lib()
        if self.place[0] == "cpu":
            _lib.check(lib.dcr_placement_map_create(arr.array, arr.count, c_arr, len(cs),
                                                    ctypes.byref(handle)))
        else:
            _lib.check(lib.dcr_placement_map_create_device(_device(self.place), arr.array,
                                                           arr.count, c_arr, len(cs),
                                                           ctypes.byref(handle)))
        self._handle = handle
        self._lib = lib
        self.elements = int(lib.dcr_placement_map_elements(handle))

    def close(self):
        """Frees the map (also on garbage collection)."""
        if getattr(self, "_handle", None) is not None and self._handle.value:
            self._lib.dcr_placement_map_free(self._handle)
            self._handle = None

    def __del__(self):
        self.close()

    def _check(self, tensors):
        if self._handle is None:
            raise FailedPreconditionError("dcr: the placement map is closed")
        for dst, ptr in self._dst:
            if _dst_buffer("", dst)[0] != ptr:
                raise FailedPreconditionError(
                    "dcr: a placement destination moved (0x%x -> 0x%x): the map needs stable "
                    "buffers" % (ptr, _dst_buffer("", dst)[0]))
        arr = tensor_array(tensors, self._dtypes, writable=True)
        if [d.name for d in arr.described] != self.names:
            raise InvalidArgumentError("dcr: the tensors are not the placement map's set (names "
                                       "or order differ)")
        return arr

    def apply(self, tensors, delta, **options):
        """Applies ``delta`` to ``tensors`` (the map's canonical set) as :func:`apply_delta`
        does, all or nothing, then writes the new bits of the changed elements alone to their
        destinations. Returns ``(ApplyResult, changed, written)``: the names of the tensors with
        a changed element (in map order) and name -> destination elements written. On
        :class:`dcr.InternalError` (the tensors hold the target, destinations partly written)
        the exception's ``result`` attribute is the ApplyResult: rewrite with :meth:`write`."""
        o = _options(options, _APPLY_OPTIONS, "apply_delta")
        arr = self._check(tensors)
        buf, size = _delta_buffer(delta)
        n = len(self.names)
        r = _lib.ApplyResult()
        changed = (ctypes.c_uint8 * max(n, 1))()
        written = (ctypes.c_uint64 * max(n, 1))()
        _synchronize(self.place)
        rc = self._lib.dcr_apply_delta_placed(arr.array, arr.count, buf, size, self._handle,
                                              ctypes.byref(o), ctypes.byref(r), changed, written)
        res = ApplyResult(r.chunks, r.changes, r.base_version, r.target_version,
                          (r.target_hash[0], r.target_hash[1]))
        try:
            _lib.check(rc)
        except InternalError as e:
            e.result = res
            raise
        names = [self.names[i] for i in range(n) if changed[i]]
        return res, names, {self.names[i]: int(written[i]) for i in range(n) if written[i]}

    def write(self, tensors, names=None, threads=0):
        """Writes every placed element of the tensors ``names`` (None = all) from ``tensors``
        (the map's set) to its destinations. Returns name -> destination elements written."""
        arr = self._check(tensors)
        n = len(self.names)
        which = None
        if names is not None:
            want = set(names)
            which = (ctypes.c_uint8 * max(n, 1))(*[1 if x in want else 0 for x in self.names])
        written = (ctypes.c_uint64 * max(n, 1))()
        _synchronize(self.place)
        _lib.check(self._lib.dcr_placement_map_write(self._handle, arr.array, arr.count, which,
                                                     threads, written))
        return {self.names[i]: int(written[i]) for i in range(n) if written[i]}


def _dst_buffer(name, dst):
    """(address, elements, element width, (kind, ordinal)) of a placement destination: a
    contiguous torch tensor (CPU or CUDA) or a writable C-contiguous numpy array."""
    mod = type(dst).__module__.split(".")[0]
    if mod == "torch":
        place = where(dst)
        if not dst.is_contiguous():
            raise InvalidArgumentError("dcr: placement destination of '%s' is not contiguous"
                                       % name)
        return dst.data_ptr(), int(dst.numel()), dst.element_size(), place
    if mod == "numpy":
        if not dst.flags["C_CONTIGUOUS"] or not dst.flags["WRITEABLE"]:
            raise InvalidArgumentError("dcr: placement destination of '%s' is not a writable "
                                       "C-contiguous array" % name)
        return dst.ctypes.data, int(dst.size), dst.dtype.itemsize, ("cpu", 0)
    raise TypeError("dcr: placement destination of '%s' must be a torch.Tensor or numpy.ndarray, "
                    "got %s" % (name, type(dst).__name__))

