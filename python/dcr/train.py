"""Per-rank shards of a training run (dcr/publisher_c.h, "Per-rank shards"): :class:`TrainLayout`
over the ``dcr_train_layout_*`` functions, the exporter callback, and :class:`SpecExporter`.

A layout is dcr's placement of a model's canonical tensors on model-parallel ranks: a built-in
preset under a parallel layout (:meth:`TrainLayout.open`), or any checkpoint's tensors placed by a
JSON layout spec (:meth:`TrainLayout.open_spec`)::

    {"ranks": 2, "tensors": [{"tensor": "w", "split": "rows", "ranks": [0, 1]},
                             {"tensor": "b", "split": "whole", "ranks": [0, 1]}, ...]}

Each rank holds buffers (bytes); a version's *shards* are the bytes of every buffer of every
rank, given as a mapping ``{(rank, buffer): data}`` (``buffer`` an index or the buffer's name;
``data`` bytes, a bytearray, a contiguous numpy array or CPU torch tensor of the buffer's size).

An *exporter* turns shards into canonical tensors: a callable ``exporter(reader, tensor, out)``
that writes canonical tensor number ``tensor`` (index into :meth:`TrainLayout.tensors`) into the
writable memoryview ``out``, reading shards only through ``reader.read(rank, buffer, begin,
count)`` (a read-only memoryview of ``count`` elements from element ``begin``). dcr calls it from
its own threads, concurrently for distinct tensors, and on probe shards (map discovery) besides
the trainer's. :class:`SpecExporter` is the exporter of a layout spec (rows / columns joined,
whole tensors from their owner).

Errors are :class:`dcr.Error` subclasses with the library's message. Thread safety: a layout is
immutable once open and may be read from any thread; close it from one.
"""

import ctypes
import json

from . import _lib
from ._tensors import WIDTH
from .errors import InternalError, InvalidArgumentError, error_for_code

_DCR_INTERNAL = 8


class TrainBuffer(ctypes.Structure):
    """dcr_train_buffer."""
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_char_p), ("numel", ctypes.c_uint64)]


class TrainParam(ctypes.Structure):
    """dcr_train_param."""
    _fields_ = [("name", ctypes.c_char_p), ("buffer", ctypes.c_int), ("offset", ctypes.c_uint64),
                ("numel", ctypes.c_uint64), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("ndim", ctypes.c_size_t), ("replica", ctypes.c_int)]


class Shard(ctypes.Structure):
    """dcr_shard."""
    _fields_ = [("rank", ctypes.c_int), ("buffer", ctypes.c_int), ("data", ctypes.c_void_p),
                ("nbytes", ctypes.c_uint64)]


#: dcr_export_fn: int (*)(void* user, const dcr_shard_reader* shards, size_t tensor, void* out)
EXPORT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                             ctypes.c_void_p)


class Buffer:
    """One buffer of a rank: ``name``, safetensors ``dtype``, element count ``numel`` and
    ``nbytes``."""

    def __init__(self, name, dtype, numel):
        self.name, self.dtype, self.numel = name, dtype, numel
        self.nbytes = numel * WIDTH.get(dtype, 0)

    def __repr__(self):
        return "Buffer(%r, %r, %d)" % (self.name, self.dtype, self.numel)


class Param:
    """One training parameter of a rank: ``name``, the ``buffer`` index it lives in, its element
    ``offset`` there, ``numel``, local ``shape`` and ``replica`` (a copy held elsewhere)."""

    def __init__(self, name, buffer, offset, numel, shape, replica):
        self.name, self.buffer, self.offset = name, buffer, offset
        self.numel, self.shape, self.replica = numel, shape, replica

    def __repr__(self):
        return "Param(%r, buffer=%d, offset=%d, shape=%r%s)" % (
            self.name, self.buffer, self.offset, self.shape, ", replica" if self.replica else "")


class TensorInfo:
    """A canonical tensor of the layout: ``name``, ``dtype``, ``shape``, ``nbytes``."""

    def __init__(self, name, dtype, shape, nbytes):
        self.name, self.dtype, self.shape, self.nbytes = name, dtype, shape, nbytes

    def __repr__(self):
        return "TensorInfo(%r, %r, %r)" % (self.name, self.dtype, self.shape)


class ShardReader:
    """What an exporter reads shards through (dcr_shard_read); valid during the exporter call."""

    def __init__(self, layout, handle):
        self._layout, self._h = layout, handle

    def read(self, rank, buffer, begin, count):
        """Elements [begin, begin + count) of buffer ``buffer`` of rank ``rank``, as a read-only
        memoryview of bytes. Raises InvalidArgumentError for a range outside the buffer."""
        width = self._layout._width(rank, buffer)
        p = _lib.lib().dcr_shard_read(self._h, rank, buffer, begin, count)
        if not p:
            raise InvalidArgumentError("dcr: shard read outside rank %d buffer %d: [%d, %d)"
                                       % (rank, buffer, begin, begin + count))
        view = memoryview((ctypes.c_uint8 * (count * width)).from_address(p))
        return view.cast("B").toreadonly()


class _Exporter:
    """A Python exporter as a dcr_export_fn; the first exception it raised is kept for the call
    that ran it."""

    def __init__(self, layout, fn):
        self.layout, self.fn, self.error = layout, fn, None
        self.nbytes = [t.nbytes for t in layout.tensors()]

        def call(_user, reader, tensor, out):
            try:
                view = memoryview((ctypes.c_uint8 * self.nbytes[tensor]).from_address(out))
                view = view.cast("B")
                self.fn(ShardReader(self.layout, reader), tensor, view)
                return 0
            except BaseException as e:  # noqa: B902 -- every error is returned to the library
                if self.error is None:
                    self.error = e
                return _DCR_INTERNAL
        self.c = EXPORT_FN(call)

    def raise_kept(self, err):
        """Raises ``err`` (the library's) with the exporter's exception as its cause, if any."""
        e, self.error = self.error, None
        if e is not None:
            raise err from e
        raise err


def _shard_array(layout, shards):
    """(dcr_shard array, count, objects kept alive) for a mapping {(rank, buffer): data}."""
    items = list(shards.items()) if hasattr(shards, "items") else list(shards)
    arr = (Shard * max(len(items), 1))()
    keep = []
    for i, ((rank, buffer), data) in enumerate(items):
        if isinstance(buffer, str):
            names = [b.name for b in layout.buffers(rank)]
            if buffer not in names:
                raise InvalidArgumentError("dcr: rank %d has no buffer %r" % (rank, buffer))
            buffer = names.index(buffer)
        ptr, nbytes, owner = _address(data)
        keep.append(owner)
        arr[i] = Shard(rank, buffer, ptr, nbytes)
    return arr, len(items), keep


def _address(data):
    """(address, nbytes, object to keep) of bytes-like or contiguous CPU array ``data``."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data) if not isinstance(
            data, bytearray) else (ctypes.c_uint8 * len(data)).from_buffer(data)
        return ctypes.addressof(buf), len(data), buf
    mod = type(data).__module__.split(".")[0]
    if mod == "torch":
        if data.device.type != "cpu" or not data.is_contiguous():
            raise InvalidArgumentError("dcr: a shard must be a contiguous CPU tensor")
        return data.data_ptr(), data.numel() * data.element_size(), data
    if mod == "numpy":
        if not data.flags["C_CONTIGUOUS"]:
            raise InvalidArgumentError("dcr: a shard must be a C-contiguous array")
        return data.ctypes.data, data.nbytes, data
    raise TypeError("dcr: a shard must be bytes, a numpy array or a torch tensor, got %s"
                    % type(data).__name__)


class TrainLayout:
    """A dcr_train_layout: the placement of canonical tensors on model-parallel ranks."""

    def __init__(self, handle):
        self._h = handle
        self._widths = {}

    @classmethod
    def open(cls, model, layout):
        """The placement of model preset ``model`` ("tiny", ...) under ``layout`` (TrainLayout
        text, "tp=2,pp=1"). Raises NotFoundError for an unknown preset, InvalidArgumentError
        naming a layout field."""
        h = ctypes.c_void_p()
        rc = _lib.lib().dcr_train_layout_open(str(model).encode(), str(layout).encode(),
                                              ctypes.byref(h))
        return cls._opened(rc, h)

    @classmethod
    def open_spec(cls, spec_path, checkpoint_path):
        """The placement the layout spec at ``spec_path`` (JSON) describes for the tensors of the
        checkpoint at ``checkpoint_path``. Raises InvalidArgumentError naming the spec's entry
        (unknown tensor, a tensor placed twice or not at all, ...), the checkpoint's errors."""
        h = ctypes.c_void_p()
        rc = _lib.lib().dcr_train_layout_open_spec(str(spec_path).encode(),
                                                   str(checkpoint_path).encode(), ctypes.byref(h))
        return cls._opened(rc, h)

    @classmethod
    def _opened(cls, rc, h):
        if rc != 0:
            msg = ""
            if h.value:
                msg = (_lib.lib().dcr_train_layout_error(h) or b"").decode("utf-8", "replace")
                _lib.lib().dcr_train_layout_close(h)
            raise error_for_code(rc, msg)
        return cls(h)

    def _handle(self):
        if not self._h:
            raise InvalidArgumentError("dcr: train layout is closed")
        return self._h

    def _check(self, rc):
        if rc != 0:
            msg = (_lib.lib().dcr_train_layout_error(self._h) or b"").decode("utf-8", "replace")
            raise error_for_code(rc, msg)

    @property
    def handle(self):
        """The dcr_train_layout* (for the publisher)."""
        return self._handle()

    @property
    def ranks(self):
        """Model-parallel ranks."""
        return _lib.lib().dcr_train_layout_ranks(self._handle())

    def buffers(self, rank):
        """The buffers of rank ``rank`` (a list of :class:`Buffer`)."""
        out = []
        for i in range(_lib.lib().dcr_train_layout_buffers(self._handle(), rank)):
            b = TrainBuffer()
            self._check(_lib.lib().dcr_train_layout_buffer(self._h, rank, i, ctypes.byref(b)))
            out.append(Buffer(b.name.decode(), b.dtype.decode(), b.numel))
        return out

    def params(self, rank):
        """The parameters of rank ``rank`` (a list of :class:`Param`)."""
        out = []
        for i in range(_lib.lib().dcr_train_layout_params(self._handle(), rank)):
            p = TrainParam()
            self._check(_lib.lib().dcr_train_layout_param(self._h, rank, i, ctypes.byref(p)))
            out.append(Param(p.name.decode(), p.buffer, p.offset, p.numel,
                             tuple(p.shape[d] for d in range(p.ndim)), bool(p.replica)))
        return out

    def find_param(self, rank, name):
        """Index of the parameter called ``name`` on rank ``rank``, or -1."""
        return _lib.lib().dcr_train_layout_find_param(self._handle(), rank, str(name).encode())

    def tensors(self):
        """The canonical tensors, sorted by name (a list of :class:`TensorInfo`)."""
        out = []
        for t in range(_lib.lib().dcr_train_layout_tensors(self._handle())):
            d = _lib.Tensor()
            self._check(_lib.lib().dcr_train_layout_tensor(self._h, t, ctypes.byref(d)))
            out.append(TensorInfo(d.name.decode(), d.dtype.decode(),
                                  tuple(d.shape[i] for i in range(d.ndim)), d.nbytes))
        return out

    def _width(self, rank, buffer):
        key = (rank, buffer)
        if key not in self._widths:
            bufs = self.buffers(rank)
            if buffer < 0 or buffer >= len(bufs):
                raise InvalidArgumentError("dcr: rank %d has no buffer %d" % key)
            self._widths[key] = WIDTH[bufs[buffer].dtype]
        return self._widths[key]

    def export(self, exporter, shards, path):
        """Exports ``shards`` (one per buffer of every rank) with ``exporter`` as the canonical
        safetensors file at ``path`` (written atomically): the dense checkpoint deltas are
        checked against. Raises the library's error, caused by the exporter's exception if it
        raised one."""
        ex = _Exporter(self, exporter)
        arr, n, keep = _shard_array(self, shards)
        rc = _lib.lib().dcr_train_layout_export(self._handle(), ex.c, None, arr, n,
                                                str(path).encode())
        del keep
        if rc != 0:
            msg = (_lib.lib().dcr_train_layout_error(self._h) or b"").decode("utf-8", "replace")
            ex.raise_kept(error_for_code(rc, msg))

    def close(self):
        if self._h:
            h, self._h = self._h, None
            _lib.lib().dcr_train_layout_close(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- interpreter shutdown
            pass


class SpecExporter:
    """The exporter of a layout spec (a dict, JSON text or a path to the JSON file) over
    ``layout`` (opened from that spec): "rows" parts joined along dimension 0, "columns" parts
    along dimension 1, in the order of the entry's ranks; a "whole" tensor from its owner (the
    first rank listed)."""

    def __init__(self, layout, spec):
        if isinstance(spec, (str, bytes)) and not str(spec).lstrip().startswith("{"):
            with open(spec) as f:
                spec = json.load(f)
        elif isinstance(spec, (str, bytes)):
            spec = json.loads(spec)
        elif hasattr(spec, "read_text"):
            spec = json.loads(spec.read_text())
        self._tensors = layout.tensors()
        by_name = {e["tensor"]: e for e in spec["tensors"]}
        self._plan = []
        for t in self._tensors:
            e = by_name[t.name]
            parts = []
            for r in e["ranks"]:
                i = layout.find_param(r, t.name)
                if i < 0:
                    raise InvalidArgumentError("dcr: rank %d holds no %r" % (r, t.name))
                p = layout.params(r)[i]
                parts.append((r, p.buffer, p.offset, p.numel, p.shape))
            self._plan.append((e["split"], parts, WIDTH[t.dtype]))

    def __call__(self, reader, tensor, out):
        split, parts, width = self._plan[tensor]
        t = self._tensors[tensor]
        if split == "whole" or len(parts) == 1:
            r, b, off, numel, _ = parts[0]
            out[:] = reader.read(r, b, off, numel)
            return
        if split == "rows":
            at = 0
            for r, b, off, numel, _ in parts:
                n = numel * width
                out[at:at + n] = reader.read(r, b, off, numel)
                at += n
            return
        # columns: each row of the canonical tensor is the parts' rows side by side.
        rows = t.shape[0]
        views = [(reader.read(r, b, off, numel), numel * width // rows)
                 for r, b, off, numel, _ in parts]
        at = 0
        for row in range(rows):
            for v, n in views:
                out[at:at + n] = v[row * n:(row + 1) * n]
                at += n
        if at != len(out):
            raise InternalError("dcr: %s: columns export wrote %d of %d bytes"
                                % (t.name, at, len(out)))


def shards_of(layout, spec, tensors):
    """The shards a layout spec places, cut from canonical ``tensors`` (name -> bytes-like or
    contiguous CPU array, as a dense checkpoint holds them): ``{(rank, buffer): bytes}``. The
    inverse of :class:`SpecExporter`, for tests and trainers that hold canonical tensors."""
    if not isinstance(spec, dict):
        spec = json.loads(open(spec).read() if not str(spec).lstrip().startswith("{") else spec)
    infos = {t.name: t for t in layout.tensors()}
    out = {}
    for e in spec["tensors"]:
        t = infos[e["tensor"]]
        data = bytes(memoryview(_as_bytes(tensors[t.name])))
        k = len(e["ranks"])
        for i, r in enumerate(e["ranks"]):
            b = layout.params(r)[layout.find_param(r, t.name)].buffer
            if e["split"] == "whole":
                out[(r, b)] = data
            elif e["split"] == "rows":
                n = len(data) // k
                out[(r, b)] = data[i * n:(i + 1) * n]
            else:
                rows = t.shape[0]
                row = len(data) // rows
                n = row // k
                out[(r, b)] = b"".join(data[j * row + i * n:j * row + (i + 1) * n]
                                       for j in range(rows))
    return out


def _as_bytes(x):
    if isinstance(x, (bytes, bytearray, memoryview)):
        return x
    ptr, nbytes, _ = _address(x)
    return ctypes.string_at(ptr, nbytes)
