"""The surface of vLLM's weight-transfer interface that dcr.adapters.vllm calls, written from its
documentation, over the toy engine: the WeightTransferEngine base class of both documented
generations, a registry, and a worker running the lifecycle init -> start -> update x N ->
finish -> shutdown the way vLLM's workers do."""

import abc
import types

from toy_engine import ToyEngine


class WeightTransferInitInfo:
    pass


class WeightTransferUpdateInfo:
    pass


class WeightTransferEngine(abc.ABC):
    """vLLM's newer generation: the engine gets the model; start/finish bracket each update."""

    init_info_cls = None
    update_info_cls = None

    def __init__(self, config, vllm_config, device, model):
        self.config, self.vllm_config, self.device, self.model = config, vllm_config, device, model

    def parse_init_info(self, init_dict):
        return self.init_info_cls(**init_dict)

    def parse_update_info(self, update_dict):
        return self.update_info_cls(**update_dict)

    def update_weights(self, update_info_dict):
        self.receive_weights(self.parse_update_info(update_info_dict))

    @abc.abstractmethod
    def init_transfer_engine(self, init_info): ...

    @abc.abstractmethod
    def start_weight_update(self): ...

    @abc.abstractmethod
    def receive_weights(self, update_info): ...

    @abc.abstractmethod
    def finish_weight_update(self): ...

    @abc.abstractmethod
    def shutdown(self): ...

    @staticmethod
    @abc.abstractmethod
    def trainer_send_weights(iterator, trainer_args): ...


class WeightTransferEngineLoaderOnly(abc.ABC):
    """vLLM's older generation: no model; each receive gets the model's load_weights."""

    init_info_cls = None
    update_info_cls = None

    def __init__(self, config, parallel_config):
        self.config, self.parallel_config = config, parallel_config

    def parse_init_info(self, init_dict):
        return self.init_info_cls(**init_dict)

    def parse_update_info(self, update_dict):
        return self.update_info_cls(**update_dict)

    @abc.abstractmethod
    def init_transfer_engine(self, init_info): ...

    @abc.abstractmethod
    def receive_weights(self, update_info, load_weights): ...

    @abc.abstractmethod
    def shutdown(self): ...

    @staticmethod
    @abc.abstractmethod
    def trainer_send_weights(iterator, trainer_args): ...


class Factory:
    def __init__(self):
        self._registry = {}

    def register_engine(self, name, cls):
        if name in self._registry:
            raise ValueError("Weight transfer engine %s already registered" % name)
        self._registry[name] = cls

    def get(self, name):
        return self._registry[name]


def vllm_config(quantization=None, enforce_eager=True):
    return types.SimpleNamespace(model_config=types.SimpleNamespace(
        quantization=quantization, enforce_eager=enforce_eager))


class Worker:
    """One inference worker: its model (a ToyEngine shard) and its transfer engine."""

    def __init__(self, factory, backend, cfg, rank=0, tp=1, config=None, loader_only=False):
        self.model = ToyEngine(cfg, rank, tp)
        self.loader_only = loader_only
        cls = factory.get(backend)
        if loader_only:
            self.engine = cls(types.SimpleNamespace(backend=backend), None)
        else:
            self.engine = cls(types.SimpleNamespace(backend=backend), config or vllm_config(),
                              "cpu", self.model)

    def load(self, checkpoint):
        self.model.load_weights(checkpoint.items())

    def init(self, init_info):
        self.engine.init_transfer_engine(self.engine.parse_init_info(init_info))

    def update(self, update_info):
        if self.loader_only:
            self.engine.receive_weights(self.engine.parse_update_info(update_info),
                                        self.model.load_weights)
            return
        self.engine.start_weight_update()
        self.engine.update_weights(update_info)
        self.engine.finish_weight_update()

    def shutdown(self):
        self.engine.shutdown()
