"""SGLang: a custom weight loader that applies dcr deltas, through
``update_weights_from_tensor(named_tensors, load_format=LOAD_FORMAT)``.

SGLang calls a custom loader as ``loader(model, named_tensors)`` on every tensor-parallel rank
when ``load_format`` is its import path and the server was started with that path in
``--custom-weight-loader``. The tensors reach the loader moved to the rank's device; the loader
here reads two entries from them:

* ``"dcr.init"``: UTF-8 JSON ``{"base_path": <safetensors file or directory of the version the
  server started from>, "version": 0, "in_place": true}``: sets up this rank (once);
* ``"dcr.delta"``: the bytes of a dcr delta (a uint8 tensor): moves the rank to its target.

:func:`init_tensors` and :func:`delta_tensors` build those lists on the trainer side, e.g.::

    engine.update_weights_from_tensor(dcr.adapters.sglang.init_tensors(base_path),
                                      load_format=dcr.adapters.sglang.LOAD_FORMAT)
    engine.update_weights_from_tensor(dcr.adapters.sglang.delta_tensors(delta),
                                      load_format=dcr.adapters.sglang.LOAD_FORMAT)

Each rank keeps the canonical checkpoint in host memory (:class:`dcr.adapters.engine.EngineSync`):
the delta is applied to it all or nothing; CPU parameters get the changed elements alone, GPU
parameters get the changed tensors through the model's own ``load_weights``. SGLang captures CUDA
graphs, so every update checks that no parameter storage moved. A rank whose previous update
failed half-way is repaired (the whole canonical version loaded) before the next delta.

Refused with :class:`dcr.FailedPreconditionError`: a model with a quantization config
(``model.quant_config``): SGLang repacks such weights after loading (kernel-private layouts),
so checkpoint bytes are not what the kernels read. Keep ``flush_cache=True`` (SGLang's default):
the prefix cache holds KV entries computed with the old weights.
"""

import ctypes
import json
import weakref

import torch

from ..errors import FailedPreconditionError, InvalidArgumentError, UnimplementedError
from .engine import EngineSync, load_safetensors

#: The ``load_format`` (and ``--custom-weight-loader`` entry) naming :func:`load_delta`.
LOAD_FORMAT = "dcr.adapters.sglang.load_delta"
INIT, DELTA = "dcr.init", "dcr.delta"

_SYNCS = weakref.WeakKeyDictionary()  # model -> EngineSync

__all__ = ["DELTA", "INIT", "LOAD_FORMAT", "delta_tensors", "init_tensors", "load_delta", "probe",
           "sync_of"]


def probe():
    """Imports the installed SGLang and checks that it takes custom weight loaders. Returns its
    version; raises :class:`dcr.UnimplementedError` naming the version and what is missing."""
    try:
        import sglang
    except ImportError as e:
        raise UnimplementedError("dcr.adapters.sglang: SGLang is not importable here (%s)"
                                 % e) from None
    version = getattr(sglang, "__version__", "unknown")
    try:
        from sglang.srt.server_args import ServerArgs
    except ImportError as e:
        raise UnimplementedError("dcr.adapters.sglang: SGLang %s has no sglang.srt.server_args "
                                 "(%s)" % (version, e)) from None
    fields = getattr(ServerArgs, "__dataclass_fields__", {})
    if "custom_weight_loader" not in fields:
        raise UnimplementedError(
            "dcr.adapters.sglang: SGLang %s has no ServerArgs.custom_weight_loader: "
            "update_weights_from_tensor cannot call a custom loader there" % version)
    return version


def _bytes_tensor(b):
    return torch.frombuffer(bytearray(b), dtype=torch.uint8) if b else torch.empty(
        0, dtype=torch.uint8)


def init_tensors(base_path, version=0, in_place=True):
    """The named tensors that set every rank up on the checkpoint at ``base_path``."""
    spec = {"base_path": str(base_path), "version": int(version), "in_place": bool(in_place)}
    return [(INIT, _bytes_tensor(json.dumps(spec).encode()))]


def delta_tensors(delta):
    """The named tensors carrying ``delta`` (bytes, or an update description with
    ``delta_path``/``delta`` as :class:`dcr.adapters.engine.DeltaSender` returns)."""
    if isinstance(delta, dict):
        from .engine import read_delta
        delta = read_delta(delta)
    return [(DELTA, _bytes_tensor(bytes(delta)))]


def sync_of(model):
    """The :class:`dcr.adapters.engine.EngineSync` of ``model`` (None before ``dcr.init``)."""
    return _SYNCS.get(model)


def _payload(t):
    c = t.detach().to("cpu").contiguous()
    if c.dtype != torch.uint8:
        raise InvalidArgumentError("dcr.adapters.sglang: entries are uint8 tensors, got %s"
                                   % c.dtype)
    return ctypes.string_at(c.data_ptr(), c.numel()) if c.numel() else b""


def load_delta(model, named_tensors):
    """SGLang's custom-loader entry: handles ``dcr.init`` and ``dcr.delta`` (see the module)."""
    entries = list(named_tensors)
    unknown = sorted(n for n, _ in entries if n not in (INIT, DELTA))
    if unknown:
        raise InvalidArgumentError("dcr.adapters.sglang: unknown entry '%s' (the dcr loader "
                                   "takes '%s' and '%s')" % (unknown[0], INIT, DELTA))
    for name, t in entries:
        if name == INIT:
            _init(model, json.loads(_payload(t).decode()))
        else:
            sync = _SYNCS.get(model)
            if sync is None:
                raise FailedPreconditionError("dcr.adapters.sglang: a delta before '%s' on this "
                                              "rank" % INIT)
            if not sync.consistent:
                sync.repair()
            sync.apply(_payload(t))


def _init(model, spec):
    extra = sorted(set(spec) - {"base_path", "version", "in_place"})
    if extra or not spec.get("base_path"):
        raise InvalidArgumentError("dcr.adapters.sglang: '%s' takes base_path, version, in_place "
                                   "(got %s)" % (INIT, sorted(spec)))
    quant = getattr(model, "quant_config", None)
    if quant is not None:
        raise FailedPreconditionError(
            "dcr.adapters.sglang: refusing a quantized model (%s): SGLang repacks its weights "
            "after loading (kernel-private layouts); use SGLang's own reload for it"
            % type(quant).__name__)
    base, dtypes = load_safetensors(spec["base_path"])
    _SYNCS[model] = EngineSync(model.load_weights, base, params=dict(model.named_parameters()),
                               dtypes=dtypes, in_place=spec.get("in_place", True),
                               stable_pointers=True, version=spec.get("version", 0))
