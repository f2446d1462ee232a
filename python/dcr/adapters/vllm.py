"""vLLM: a weight-transfer backend named ``"dcr"`` (``WeightTransferConfig(backend="dcr")``).

vLLM's ``vllm.distributed.weight_transfer`` runs a pluggable ``WeightTransferEngine`` on every
inference worker: ``init_transfer_engine(init_info)`` once, then per version
``start_weight_update()``, ``update_weights(update_info_dict)`` (which parses the dict into the
backend's ``update_info_cls`` and calls ``receive_weights``), ``finish_weight_update()``, and
``shutdown()``; the trainer calls the static ``trainer_send_weights(iterator, trainer_args)``.
The backend here:

* ``init_info``: ``{"base_path": <safetensors file or directory of the version the engine was
  started from>, "version": 0, "in_place": True}``;
* ``update_info``: ``{"delta_path": <a dcr delta file>, "version": n}`` (or ``"delta"``: bytes);
* ``trainer_send_weights(named_tensors, {"sender": DeltaSender(base, out_dir)})`` writes the
  delta of the state dict against the last version sent and returns that ``update_info``.

Each worker keeps the canonical checkpoint in host memory and applies every delta to it all or
nothing (:class:`dcr.adapters.engine.EngineSync`). Where vLLM hands the backend its model
(``__init__(config, vllm_config, device, model)``) and the parameters are CPU tensors, the changed
elements alone are written into them; otherwise (GPU parameters; the interface generation whose
``receive_weights(update_info, load_weights)`` gives the loader only) the changed tensors go
through the model's ``load_weights``. A failed update leaves the worker refusing to finish
(``finish_weight_update`` raises) until the next ``start_weight_update`` repairs it by loading the
whole canonical version.

Refused, with :class:`dcr.FailedPreconditionError` at ``init_transfer_engine``: a quantized model
(``model_config.quantization``): vLLM repacks such weights after loading (Marlin / MoE layouts,
swizzled FP8 scales), so neither a placement nor a partial load of checkpoint bytes is right; use
vLLM's own reload backends there. CUDA graphs (``enforce_eager`` off) keep parameter addresses:
every update checks that no parameter storage moved.

Registration: :func:`register` (the ``vllm.general_plugins`` entry point ``dcr`` of the installed
package calls it in every vLLM process) probes the installed vLLM and registers the class
:func:`engine_class` builds over its ``WeightTransferEngine``. Tested here against the toy engine
of tests/python through the same interface only: vLLM is not installable on this machine.
"""

import dataclasses
import inspect

from ..errors import FailedPreconditionError, InvalidArgumentError, UnimplementedError
from .engine import DeltaSender, EngineSync, load_safetensors, read_delta

BACKEND = "dcr"

__all__ = ["BACKEND", "DeltaSender", "engine_class", "probe", "register", "unsafe_reasons"]


def probe():
    """Imports the installed vLLM and finds its weight-transfer interface. Returns
    ``(version, WeightTransferEngine, register_fn)``; raises :class:`dcr.UnimplementedError`
    naming the version and what is missing."""
    try:
        import vllm
    except ImportError as e:
        raise UnimplementedError("dcr.adapters.vllm: vLLM is not importable here (%s)"
                                 % e) from None
    version = getattr(vllm, "__version__", "unknown")
    try:
        from vllm.distributed.weight_transfer import base
    except ImportError as e:
        raise UnimplementedError(
            "dcr.adapters.vllm: vLLM %s has no vllm.distributed.weight_transfer.base (%s): the "
            "dcr backend needs a vLLM with pluggable weight-transfer engines"
            % (version, e)) from None
    wte = getattr(base, "WeightTransferEngine", None)
    if wte is None:
        raise UnimplementedError("dcr.adapters.vllm: vLLM %s has no WeightTransferEngine" % version)
    reg = None
    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
        reg = WeightTransferEngineFactory.register_engine
    except ImportError:
        import vllm.distributed.weight_transfer as wt
        reg = getattr(wt, "register_weight_transfer_engine", None)
    if reg is None:
        raise UnimplementedError("dcr.adapters.vllm: vLLM %s has no way to register a weight-"
                                 "transfer engine (no WeightTransferEngineFactory.register_engine "
                                 "nor register_weight_transfer_engine)" % version)
    return version, base, reg


def register():
    """Registers the ``"dcr"`` backend with the installed vLLM (the plugin entry point)."""
    _, base, reg = probe()
    try:
        reg(BACKEND, engine_class(base.WeightTransferEngine,
                                  getattr(base, "WeightTransferInitInfo", None),
                                  getattr(base, "WeightTransferUpdateInfo", None)))
    except ValueError as e:  # registered before in this process
        if "already" not in str(e):
            raise


def unsafe_reasons(vllm_config):
    """Why placing checkpoint bytes into this vLLM configuration's weights is wrong (empty when
    it is not): quantization methods that repack weights after loading."""
    reasons = []
    mc = getattr(vllm_config, "model_config", None)
    quant = getattr(mc, "quantization", None) if mc is not None else None
    if quant:
        reasons.append("quantization=%s repacks weights after loading (kernel-private layouts: "
                       "repacked MoE, swizzled FP8 scales)" % quant)
    return reasons


def _dataclass(name, fields, parent):
    bases = (parent,) if parent is not None and dataclasses.is_dataclass(parent) else ()
    return dataclasses.make_dataclass(name, fields, bases=bases)


class _DcrTransfer:
    """The backend's behaviour, mixed over the installed ``WeightTransferEngine``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        bound = inspect.signature(super().__init__).bind_partial(*args, **kwargs).arguments
        self._model = bound.get("model")
        self._vllm_config = bound.get("vllm_config")
        self._sync = None
        self._loader = None
        self._init = None

    # ---- parsing: unknown keys are errors, not ignored ----

    def parse_init_info(self, init_dict):
        return self._parse(self.init_info_cls, init_dict)

    def parse_update_info(self, update_dict):
        return self._parse(self.update_info_cls, update_dict)

    @staticmethod
    def _parse(cls, d):
        known = {f.name for f in dataclasses.fields(cls)}
        extra = sorted(set(d) - known)
        if extra:
            raise InvalidArgumentError("dcr backend: unknown field '%s' (known: %s)"
                                       % (extra[0], ", ".join(sorted(known))))
        return cls(**d)

    # ---- lifecycle ----

    def init_transfer_engine(self, init_info):
        if isinstance(init_info, dict):
            init_info = self.parse_init_info(init_info)
        if not init_info.base_path:
            raise InvalidArgumentError("dcr backend: init_info needs base_path, the checkpoint "
                                       "the engine was started from")
        reasons = unsafe_reasons(self._vllm_config)
        if reasons:
            raise FailedPreconditionError(
                "dcr backend: refusing this vLLM configuration: %s; use vLLM's reload backend "
                "for it" % "; ".join(reasons))
        self._init = init_info
        if self._model is not None:
            self._make_sync(self._model.load_weights, self._model)
        # Otherwise the loader arrives with each receive_weights call.

    def _make_sync(self, load_weights, model):
        base, dtypes = load_safetensors(self._init.base_path)
        mc = getattr(self._vllm_config, "model_config", None)
        eager = getattr(mc, "enforce_eager", True) if mc is not None else True
        params = dict(model.named_parameters()) if model is not None else None
        self._sync = EngineSync(load_weights, base, params=params, dtypes=dtypes,
                                in_place=self._init.in_place, stable_pointers=not eager,
                                version=self._init.version)

    def start_weight_update(self):
        self._need_sync()
        if not self._sync.consistent:
            self._sync.repair()

    def receive_weights(self, update_info, load_weights=None):
        if isinstance(update_info, dict):
            update_info = self.parse_update_info(update_info)
        if self._sync is None and self._init is not None and load_weights is not None:
            self._loader = load_weights
            self._make_sync(lambda ws: self._loader(ws), None)
        self._need_sync()
        if load_weights is not None:
            self._loader = load_weights
        delta = read_delta(dataclasses.asdict(update_info))
        r = self._sync.apply(delta)
        if update_info.version is not None and r.target_version != update_info.version:
            raise InvalidArgumentError("dcr backend: the delta leads to version %d, the update "
                                       "names %d" % (r.target_version, update_info.version))

    def finish_weight_update(self):
        self._need_sync()
        self._sync.check_serving()

    def shutdown(self):
        self._sync = None
        self._loader = None

    def _need_sync(self):
        if self._sync is None:
            raise FailedPreconditionError("dcr backend: init_transfer_engine first")

    @property
    def sync(self):
        """The worker's :class:`dcr.adapters.engine.EngineSync` (mode, version, last_update)."""
        return self._sync

    @staticmethod
    def trainer_send_weights(iterator, trainer_args):
        sender = trainer_args.get("sender") if isinstance(trainer_args, dict) else None
        if not isinstance(sender, DeltaSender):
            raise InvalidArgumentError("dcr backend: trainer_args needs 'sender', a "
                                       "dcr.adapters.engine.DeltaSender")
        return sender.send(iterator)


def engine_class(wte, init_info_base=None, update_info_base=None):
    """The ``"dcr"`` backend class over ``wte`` (vLLM's ``WeightTransferEngine``, or any class
    with its constructor)."""
    init_cls = _dataclass("DcrInitInfo", [("base_path", str, dataclasses.field(default="")),
                                          ("version", int, dataclasses.field(default=0)),
                                          ("in_place", bool, dataclasses.field(default=True))],
                          init_info_base)
    update_cls = _dataclass("DcrUpdateInfo", [("delta_path", str, dataclasses.field(default="")),
                                              ("delta", bytes, dataclasses.field(default=None)),
                                              ("version", int, dataclasses.field(default=None))],
                            update_info_base)
    ns = {"init_info_cls": init_cls, "update_info_cls": update_cls,
          "__doc__": "dcr's weight-transfer backend (dcr.adapters.vllm)."}
    cls = type("DcrWeightTransferEngine", (_DcrTransfer, wte), ns)
    # The interface's abstract methods are implemented by the mixin.
    cls.__abstractmethods__ = frozenset(
        m for m in getattr(cls, "__abstractmethods__", ()) if not hasattr(_DcrTransfer, m))
    return cls
