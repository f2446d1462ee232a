"""What the engine adapters share: a canonical checkpoint kept at a version, deltas applied to it
all or nothing, and the engine's own parameters moved with it.

:class:`EngineSync` runs in one of two modes:

* ``"in_place"``: the engine's parameters are tensors of one device (the CPU or one GPU) and its
  loader places weights bit for bit: a :class:`dcr.torch.EngineReceiver` writes the changed
  elements alone into the parameters (CUDA ones by device pointer) and re-runs the loader for
  converted tensors;
* ``"reload"``: the delta goes to the canonical copy, then the engine's loader is called with the
  changed tensors only (parameters on several devices, or an engine whose loader is all we are
  given).
  The result is what the engine's loader makes of the target's bytes: a dense load of the
  changed tensors.

In both, a failure after the canonical copy moved (the engine's loader raising, a parameter
re-allocated under an engine that needs stable pointers) leaves the sync *dirty*:
:meth:`EngineSync.check_serving` raises until :meth:`EngineSync.repair` has loaded the whole
canonical version again.

:class:`DeltaSender` is the trainer side: it keeps the last version sent and writes the delta
of each new state dict to a file (written to a temporary name, then renamed: a reader never sees
half a delta).
"""

import json
import os
import struct
import threading

import torch

from .. import codec
from ..errors import (DataLossError, FailedPreconditionError, InvalidArgumentError,
                      NotFoundError)
from ..torch import EngineReceiver

# safetensors dtype -> torch dtype holding its bytes (FP8 as uint8, named through ``dtypes``).
_ST_TORCH = {
    "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
    "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16, "I32": torch.int32,
    "I64": torch.int64, "BOOL": torch.bool, "F8_E4M3": torch.uint8, "F8_E5M2": torch.uint8,
}


def load_safetensors(path):
    """Reads a safetensors file, or every ``*.safetensors`` file of a directory, into CPU tensors.
    Returns ``(tensors, dtypes)``: name -> tensor (in file order), and name -> safetensors dtype
    for the tensors whose torch dtype does not say it (FP8 held as uint8)."""
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path)
                       if f.endswith(".safetensors"))
        if not files:
            raise NotFoundError("dcr: no .safetensors file in %s" % path)
    elif os.path.exists(path):
        files = [path]
    else:
        raise NotFoundError("dcr: no checkpoint at %s" % path)
    tensors, dtypes = {}, {}
    for f in files:
        with open(f, "rb") as fh:
            data = fh.read()
        if len(data) < 8:
            raise DataLossError("dcr: %s: truncated safetensors header" % f)
        (n,) = struct.unpack("<Q", data[:8])
        try:
            header = json.loads(data[8:8 + n])
        except ValueError as e:
            raise DataLossError("dcr: %s: bad safetensors header: %s" % (f, e)) from None
        body = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            st = info["dtype"]
            if st not in _ST_TORCH:
                raise InvalidArgumentError("dcr: %s: tensor '%s' has dtype %s, which dcr does "
                                           "not read" % (f, name, st))
            lo, hi = info["data_offsets"]
            if body + hi > len(data) or lo > hi:
                raise DataLossError("dcr: %s: tensor '%s' lies past the end of the file"
                                    % (f, name))
            raw = bytearray(data[body + lo:body + hi])
            t = torch.frombuffer(raw, dtype=_ST_TORCH[st]) if raw else torch.empty(
                0, dtype=_ST_TORCH[st])
            tensors[name] = t.reshape(info["shape"])
            if st.startswith("F8"):
                dtypes[name] = st
    return tensors, dtypes


def read_delta(update):
    """The delta of an update description: ``delta`` (bytes) or ``delta_path`` (a file)."""
    if update.get("delta") is not None:
        return update["delta"]
    path = update.get("delta_path")
    if not path:
        raise InvalidArgumentError("dcr: an update names its delta as 'delta_path' (a file) or "
                                   "'delta' (bytes); got %s" % sorted(update))
    with open(path, "rb") as f:
        return f.read()


def _placement_refusal(params):
    """Why the in-place mode cannot write ``params`` (name -> tensor), or None: it writes tensors
    of one device, the CPU or one CUDA device."""
    devices = {}
    for name, p in params.items():
        devices.setdefault(p.device, name)
    odd = sorted((str(d), n) for d, n in devices.items() if d.type not in ("cpu", "cuda"))
    if odd:
        return ("parameter '%s' is on %s: in-place apply writes CPU or CUDA tensors"
                % (odd[0][1], odd[0][0]))
    if len(devices) > 1:
        (da, na), (db, nb) = sorted((str(d), n) for d, n in devices.items())[:2]
        return ("parameters on more than one device ('%s' on %s, '%s' on %s): in-place apply "
                "writes the tensors of one device" % (na, da, nb, db))
    return None


class EngineSync:
    """One engine's weights kept at the version of a canonical checkpoint.

    ``load_weights``: the engine's loader, called with an iterable of (name, CPU tensor).
    ``base``: name -> tensor of the version the engine holds (copied). ``params``: the engine's
    parameters (name -> tensor) for the in-place mode: all on the CPU or all on one CUDA device
    (written there by device pointer, :class:`dcr.torch.EngineReceiver`); None,
    ``in_place=False``, parameters on several devices or on another kind of device give the
    reload mode (the reason is in ``reasons``). ``device``: ``"host"`` writes CPU parameters
    through the device path (as CI tests the CUDA route), else None. ``stable_pointers``: the engine captured its parameters' addresses (CUDA
    graphs): an update after which a parameter's storage moved fails with
    :class:`dcr.FailedPreconditionError` and leaves the sync dirty. ``after_update``: called
    with the changed names after each update (caches derived from the weights).
    """

    def __init__(self, load_weights, base, params=None, dtypes=None, in_place=True,
                 stable_pointers=False, after_update=None, version=0, device=None):
        self._load = load_weights
        self._dtypes = dict(dtypes or {})
        self._after = after_update
        self._lock = threading.Lock()
        self.reasons = []
        if params is None:
            self.reasons.append("the engine gives its loader only, not its parameters")
        elif not in_place:
            self.reasons.append("in-place apply turned off")
        else:
            reason = _placement_refusal(params)
            if reason:
                self.reasons.append(reason)
        self._params = dict(params or {})
        self._pointers = ({n: p.data_ptr() for n, p in self._params.items()}
                          if stable_pointers else None)
        self.last_update = None
        self.version = version
        if not self.reasons:
            self.mode = "in_place"
            self._rx = EngineReceiver(self._params, load_weights, base, dtypes=self._dtypes,
                                      after_update=after_update, version=version, device=device)
            return
        self.mode = "reload"
        self._rx = None
        self.canonical = {k: v.detach().clone().contiguous() for k, v in base.items()}
        # A map with no placements: the delta's apply, all or nothing, naming what changed.
        self._map = codec.PlacementMap(self.canonical, [], dtypes=self._dtypes)
        self._hash = codec.tensors_hash(self.canonical, dtypes=self._dtypes)
        self.version = version
        self._dirty = False

    # ---- state ----

    @property
    def consistent(self):
        return self._rx.consistent if self._rx else not self._dirty

    def check_serving(self):
        """Raises :class:`dcr.FailedPreconditionError` while the engine may hold a mix of two
        versions (call :meth:`repair`)."""
        if self._rx:
            return self._rx.check_serving()
        if self._dirty:
            raise FailedPreconditionError(
                "dcr: the engine's parameters are between versions (an update failed half-way); "
                "repair() before serving")

    def _check_pointers(self):
        if self._pointers is None:
            return
        moved = sorted(n for n, p in self._params.items() if p.data_ptr() != self._pointers[n])
        if moved:
            raise FailedPreconditionError(
                "dcr: the engine re-allocated parameter '%s' during an update, but it runs with "
                "captured parameter addresses (CUDA graphs): the graphs would read the old "
                "storage" % moved[0])

    # ---- updates ----

    def apply(self, delta, threads=0):
        """Moves the engine to the delta's target (bytes). A :class:`dcr.Error` before the
        canonical copy moved leaves everything as it was; one after leaves the sync dirty."""
        if self._rx:
            r = self._rx.apply(delta, threads=threads)
            self.version = self._rx.version
            self.last_update = self._rx.last_update
            try:
                self._check_pointers()
            except FailedPreconditionError:
                self._rx._dirty = True
                raise
            return r
        with self._lock:
            self.check_serving()
            r, changed, _ = self._map.apply(self.canonical, delta, threads=threads,
                                            known_base_hash=self._hash, dtypes=self._dtypes)
            self._hash, self.version = r.target_hash, r.target_version
            self._dirty = True
            self._reload(changed)
            return r

    def repair(self):
        """Loads the whole canonical version into the engine again."""
        if self._rx:
            self._rx.repair()
            self.last_update = self._rx.last_update
            self._check_pointers()
            return
        with self._lock:
            self._dirty = True
            self._reload(list(self.canonical))

    def _reload(self, changed):
        with torch.no_grad():
            self._load(iter([(n, self.canonical[n]) for n in changed]))
        self._check_pointers()
        self.last_update = {
            "changed": list(changed), "reloaded": list(changed), "written": {},
            "written_bytes": sum(self.canonical[n].numel() * self.canonical[n].element_size()
                                 for n in changed),
        }
        if self._after is not None:
            self._after(sorted(changed))
        self._dirty = False


class DeltaSender:
    """Trainer side: the delta from the last version sent to each new state dict, as a file.

    ``base``: name -> tensor of the version the engines start from (copied). ``out_dir``: where
    the delta files go (``v<version>.dcr``). :meth:`send` returns the update description an
    engine adapter takes: ``{"delta_path": ..., "version": ...}``.
    """

    def __init__(self, base, out_dir, dtypes=None, version=0, **encode_options):
        self._last = {k: v.detach().to("cpu").clone().contiguous() for k, v in base.items()}
        self._dir = out_dir
        self._dtypes = dict(dtypes or {})
        self._options = encode_options
        self.version = version
        os.makedirs(out_dir, exist_ok=True)

    def send(self, named_tensors):
        """Encodes the delta to ``named_tensors`` (a dict or an iterable of (name, tensor), the
        base's tensors in any order) and writes it; returns the update description."""
        given = {k: v.detach().to("cpu").contiguous() for k, v in dict(named_tensors).items()}
        if given.keys() != self._last.keys():
            extra = sorted(set(given) - set(self._last))
            missing = sorted(set(self._last) - set(given))
            raise InvalidArgumentError(
                "dcr: the state dict sent is not the base's tensor set (%s)"
                % ("'%s' not in the base" % extra[0] if extra else "'%s' missing" % missing[0]))
        target = {k: given[k] for k in self._last}  # the base's order: the delta's tensor order
        delta = codec.encode_delta(self._last, target, dtypes=self._dtypes,
                                   base_version=self.version, target_version=self.version + 1,
                                   **self._options)
        path = os.path.join(self._dir, "v%d.dcr" % (self.version + 1))
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(delta)
        os.replace(tmp, path)
        self._last = {k: v.clone() for k, v in target.items()}
        self.version += 1
        return {"delta_path": path, "version": self.version}
