"""Engine side: a receiver that keeps an inference engine's own parameters at a version, in place.

:class:`EngineReceiver` learns where the engine puts each checkpoint element by running the engine's
own ``load_weights`` on the base checkpoint under a :class:`torch.utils._python_dispatch.
TorchDispatchMode` (:class:`PlacementRecorder`). Every write the loader makes into a parameter is an
aten op there (``copy_`` from a slice, a ``narrow``, a transpose, ``param.data[...] = x``,
``fill_`` of padding, ...), and the mode sees it with its source and destination views. A
``copy_`` whose source is a view of a checkpoint tensor of the destination's dtype is a
*bit-preserving* placement: element i of the checkpoint tensor lands on element j of the
parameter, recorded as two index arrays. Any other write whose inputs derive from a checkpoint
tensor (a cast, an arithmetic op, a repack) makes the tensor *converted*: the engine's loader is
re-run for it. Writes from no checkpoint tensor (zero padding) are constants.

A version moves as one. :meth:`EngineReceiver.apply` hands the delta, the canonical copy of the
checkpoint and the recorded placements (a :class:`dcr.codec.PlacementMap`) to
``dcr_apply_delta_placed``: the delta is applied all or nothing to the canonical copy (on failure
nothing changes, engine included), then the new bits of the changed elements alone are copied to
every parameter element that holds them; elements the delta does not change are neither read nor
written in the engine. The engine's loader is then re-run for the converted tensors that changed.
A failure in that second step (the engine's loader raising, the process interrupted) leaves the
receiver *dirty*: :meth:`EngineReceiver.check_serving` raises until :meth:`EngineReceiver.repair`
has rewritten every placement (an overwrite from the canonical copy) and re-run every converted
load, so the engine never serves a mix of two versions when it checks before serving.

Costs: the canonical copy is one more copy of the checkpoint in host memory, and the placement
map 16 bytes per placed element; an update writes the engine's elements the delta changes (times
the places each lies in: tied or replicated weights) and re-loads the converted tensors that
changed. ``last_update`` says what the last update wrote.

Devices: the engine's parameters are CPU tensors or CUDA tensors of one GPU. The canonical copy
is always in host memory (no second copy of the model on the GPU); with CUDA parameters the
placement map's destinations are device pointers, and an update scatters the changed elements to
the GPU (dcr_placement_map_create_device of dcr/codec_c.h), after synchronizing torch's current
stream of that GPU (the engine's queued work on the parameters is complete first; dcr's writes
are complete when the update returns). ``device="host"`` drives that device path on CPU
parameters through dcr's host backend (tests, CI).

Limits: a write other than ``copy_`` counts as writing its whole destination view;
writes into storage that is not a registered parameter are not tracked (an engine cache derived
from the weights must be rebuilt by the engine: :class:`EngineReceiver` takes ``after_update`` for
that); parameters must keep their storage (an engine that re-allocates a parameter gets
:class:`dcr.FailedPreconditionError` on the next update and needs a new receiver).

Thread safety: one receiver is used from one thread at a time.
"""

import collections
import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import codec
from .errors import FailedPreconditionError, InternalError, InvalidArgumentError

def _storage_ptr(t):
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage().data_ptr()
    return t.storage().data_ptr()


def _tensors_in(x, out):
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for y in x:
            _tensors_in(y, out)
    elif isinstance(x, dict):
        for y in x.values():
            _tensors_in(y, out)
    return out


def _positions(view, base):
    """Element indices, within contiguous tensor ``base``, of the elements of ``view`` (a view of
    the same storage, same dtype), shaped like ``view``."""
    idx = torch.arange(base.numel(), dtype=torch.int64)
    return torch.as_strided(idx, view.size(), view.stride(),
                            view.storage_offset() - base.storage_offset())


Placement = collections.namedtuple("Placement", "tensor src param dst")


class PlacementRecorder(TorchDispatchMode):
    """Records the writes of a loader into ``params`` (name -> contiguous tensor) from
    ``sources`` (name -> contiguous checkpoint tensor). Use as a context manager around the
    loader; then :meth:`result`."""

    def __init__(self, params, sources):
        super().__init__()
        self._params = {}      # storage ptr -> [(name, tensor)]
        for name, p in params.items():
            if not p.is_contiguous():
                raise InvalidArgumentError("dcr: parameter '%s' is not contiguous" % name)
            self._params.setdefault(_storage_ptr(p), []).append((name, p))
        self._sources = {}     # storage ptr -> (name, tensor)
        for name, s in sources.items():
            self._sources[_storage_ptr(s)] = (name, s)
        self._derived = {}     # storage ptr -> frozenset of source names
        self._records = []     # (param name, dst positions, kind, payload)

    def _provenance(self, tensors):
        names = set()
        for t in tensors:
            ptr = _storage_ptr(t)
            if ptr in self._sources:
                names.add(self._sources[ptr][0])
            elif ptr in self._derived:
                names |= self._derived[ptr]
        return frozenset(names)

    def _param_of(self, view):
        """(name, tensor) of the registered parameter holding ``view``'s elements, or None."""
        cands = self._params.get(_storage_ptr(view))
        if not cands:
            return None
        off = view.storage_offset()
        for name, p in cands:
            if p.dtype == view.dtype and p.storage_offset() <= off < p.storage_offset() + max(
                    p.numel(), 1):
                return name, p
        return cands[0]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        written = []
        schema = func._schema
        for i, a in enumerate(schema.arguments):
            if a.alias_info is None or not a.alias_info.is_write:
                continue
            v = args[i] if i < len(args) else kwargs.get(a.name)
            _tensors_in(v, written)
        inputs = [t for t in _tensors_in((args, kwargs), []) if all(t is not w for w in written)]
        for dst in written:
            self._note_write(func, dst, inputs, args)
        out = func(*args, **kwargs)
        if not written:
            prov = self._provenance(inputs)
            for t in _tensors_in(out, []):
                ptr = _storage_ptr(t)
                if ptr in self._sources or ptr in self._params:
                    continue
                if prov:
                    self._derived[ptr] = prov
                else:
                    self._derived.pop(ptr, None)
        return out

    def _note_write(self, func, dst, inputs, args):
        hit = self._param_of(dst)
        if hit is None:
            return
        pname, p = hit
        if dst.dtype != p.dtype:
            # A reinterpreting view of the parameter: attribute the whole parameter.
            dst_pos = torch.arange(p.numel(), dtype=torch.int64)
            kind = "converted"
        else:
            dst_pos = _positions(dst, p)
            kind = None
        if kind is None and func is torch.ops.aten.copy_.default:
            src = args[1]
            ptr = _storage_ptr(src) if isinstance(src, torch.Tensor) else None
            if ptr in self._sources and src.dtype == dst.dtype:
                sname, s = self._sources[ptr]
                src_pos = torch.broadcast_to(_positions(src, s), dst.shape)
                self._records.append((pname, dst_pos.reshape(-1), "placed",
                                      (sname, src_pos.reshape(-1))))
                return
        prov = self._provenance(inputs)
        if prov:
            self._records.append((pname, dst_pos.reshape(-1), "converted", prov))
        else:
            self._records.append((pname, dst_pos.reshape(-1), "constant", None))

    def result(self):
        """(placements: list of Placement with int64 index arrays, converted: sorted names).
        Later writes to an element replace earlier ones."""
        owner = {}
        for i, (pname, dst, _, _) in enumerate(self._records):
            if pname not in owner:
                numel = next(p.numel() for ps in self._params.values() for n, p in ps
                             if n == pname)
                owner[pname] = torch.full((numel,), -1, dtype=torch.int64)
            owner[pname][dst] = i
        placements, converted = [], set()
        for i, (pname, dst, kind, payload) in enumerate(self._records):
            keep = owner[pname][dst] == i
            if not bool(keep.any()):
                continue
            if kind == "placed":
                sname, src = payload
                placements.append(Placement(sname, src[keep], pname, dst[keep]))
            elif kind == "converted":
                converted |= payload
        return placements, sorted(converted)


class EngineReceiver:
    """Keeps an engine's parameters at the version of a canonical checkpoint, delta by delta.

    ``params``: name -> the engine's parameter tensors (contiguous, CPU or CUDA of one GPU; tied
    parameters may appear under several names). ``load_weights``: the engine's loader, called with an iterable
    of (canonical name, tensor). ``base``: name -> tensor of the checkpoint the engine starts
    from (copied: the receiver's canonical copy). The constructor runs the loader once on the
    base under :class:`PlacementRecorder` (the engine then holds the base). ``dtypes``: name ->
    safetensors dtype for canonical tensors whose torch dtype does not say it (FP8 as uint8).
    ``after_update``: called with the changed canonical names after each update (caches).
    ``device``: None (the parameters' own) or ``"host"`` (CPU parameters written through the
    device path, see the module comment).
    """

    def __init__(self, params, load_weights, base, dtypes=None, after_update=None, version=0,
                 device=None):
        self._params = dict(params)
        self._load = load_weights
        self._dtypes = dict(dtypes or {})
        self._after = after_update
        self._lock = threading.Lock()
        # In host memory whatever the engine's device.
        self.canonical = {k: v.detach().to("cpu", copy=True).contiguous()
                          for k, v in base.items()}
        rec = PlacementRecorder(self._params, self.canonical)
        with torch.no_grad(), rec:
            self._load(iter(list(self.canonical.items())))
        placements, self.converted = rec.result()
        self._map = codec.PlacementMap(
            self.canonical, [(pl.tensor, self._params[pl.param], pl.src, pl.dst)
                             for pl in placements], dtypes=self._dtypes, device=device)
        self._hash = codec.tensors_hash(self.canonical, dtypes=self._dtypes)
        self.version = version
        self._dirty = False
        #: What the last update or repair wrote: ``changed`` (canonical tensors with a changed
        #: element), ``written`` (name -> engine elements written), ``written_bytes``,
        #: ``reloaded`` (converted tensors re-loaded through the engine's loader).
        self.last_update = None

    # ---- state ----

    @property
    def consistent(self):
        """False while an update is in progress or after one failed half-way."""
        return not self._dirty

    def check_serving(self):
        """Raises :class:`dcr.FailedPreconditionError` when the engine's parameters may hold a
        mix of two versions (call :meth:`repair`)."""
        if self._dirty:
            raise FailedPreconditionError(
                "dcr: the engine's parameters are between versions (an update failed half-way); "
                "repair() before serving")

    def stats(self):
        """Elements placed bit-preserving, and the converted tensors."""
        return self._map.elements, list(self.converted)

    # ---- updates ----

    def apply(self, delta, threads=0):
        """Moves the engine to the delta's target. The delta is checked and applied to the
        canonical copy first, all or nothing (a :class:`dcr.Error` then leaves canonical copy and
        engine untouched); then its changed elements are written into the engine's parameters
        and the converted tensors it changed re-loaded. Returns the :data:`dcr.ApplyResult`."""
        with self._lock:
            self.check_serving()
            try:
                r, changed, written = self._map.apply(self.canonical, delta, threads=threads,
                                                      known_base_hash=self._hash,
                                                      dtypes=self._dtypes)
            except InternalError as e:
                # The canonical copy moved; the engine's placements are partly written.
                self._dirty = True
                self._hash, self.version = e.result.target_hash, e.result.target_version
                raise
            self._hash = r.target_hash
            self.version = r.target_version
            self._dirty = True
            self._finish(changed, written)
            return r

    def repair(self):
        """Rewrites every placement and re-runs the loader for every converted tensor from the
        canonical copy: the engine then holds the canonical version."""
        with self._lock:
            self._dirty = True
            self._finish(list(self.canonical), self._map.write(self.canonical))

    def _finish(self, changed, written):
        """Re-runs the loader for the converted tensors among ``changed``, then the
        ``after_update`` hook; the receiver is consistent again when both return."""
        converted = [n for n in self.converted if n in set(changed)]
        if converted:
            with torch.no_grad():
                self._load(iter([(n, self.canonical[n]) for n in converted]))
        self.last_update = {
            "changed": list(changed), "written": dict(written), "reloaded": converted,
            "written_bytes": sum(k * self.canonical[n].element_size() for n, k in written.items()),
        }
        if self._after is not None:
            self._after(sorted(changed))
        self._dirty = False
