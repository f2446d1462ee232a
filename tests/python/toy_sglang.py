"""The surface of SGLang's update_weights_from_tensor that dcr.adapters.sglang is called through,
written from its documented behaviour, over the toy engine: each tensor-parallel rank's model
runner moves the named tensors to its device, then dispatches on load_format (a custom loader
allowed by the server's custom_weight_loader list is imported by its dotted path and called as
loader(model, named_tensors); None calls model.load_weights)."""

import importlib
import types

from toy_engine import ToyEngine


def dynamic_import(path):
    module, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module), attr)


class ModelRunner:
    def __init__(self, cfg, rank, tp, custom_weight_loader, device="cpu"):
        self.model = ToyEngine(cfg, rank, tp)
        self.server_args = types.SimpleNamespace(custom_weight_loader=list(custom_weight_loader))
        self.device = device

    def update_weights_from_tensor(self, named_tensors, load_format=None):
        named_tensors = [(n, t.to(self.device)) for n, t in named_tensors]
        if load_format in self.server_args.custom_weight_loader:
            dynamic_import(load_format)(self.model, named_tensors)
        elif load_format is None:
            self.model.load_weights(named_tensors)
        else:
            raise NotImplementedError("Unknown load_format=%s" % load_format)
        return True, "Success"


class Engine:
    """The server: one model runner per tensor-parallel rank."""

    def __init__(self, cfg, tp=1, custom_weight_loader=()):
        self.runners = [ModelRunner(cfg, r, tp, custom_weight_loader) for r in range(tp)]

    def update_weights_from_tensor(self, named_tensors, load_format=None):
        named_tensors = list(named_tensors)
        for r in self.runners:
            ok, msg = r.update_weights_from_tensor(named_tensors, load_format)
            if not ok:
                return ok, msg
        return True, "Success"
