"""The surface of verl's checkpoint engines that dcr.adapters.verl is called through, written from
its documented interface: the CheckpointEngine base class, the registry, and one weight sync as
verl's manager runs it (prepare on every worker, build_topology, init_process_group, the
trainer's send_weights and the rollout's server-adapter load of receive_weights at once,
finalize). The rollout's server adapter loads the tensors it is given through the toy engine's
load_weights."""

import abc
import asyncio


class CheckpointEngine(abc.ABC):
    @abc.abstractmethod
    def prepare(self): ...

    @classmethod
    @abc.abstractmethod
    def build_topology(cls, trainer_world_size, rollout_world_size, metadata): ...

    @abc.abstractmethod
    def init_process_group(self, **kwargs): ...

    @abc.abstractmethod
    def finalize(self): ...

    @abc.abstractmethod
    async def send_weights(self, weights): ...

    @abc.abstractmethod
    async def receive_weights(self): ...


class Registry:
    def __init__(self):
        self._registry = {}

    def register(self, backend):
        def wrapper(cls):
            self._registry[backend] = cls
            return cls
        return wrapper

    def get(self, backend):
        return self._registry[backend]

    def new(self, backend, *args, **kwargs):
        if backend not in self._registry:
            raise ValueError("Checkpoint engine %s not registered" % backend)
        return self._registry[backend](*args, **kwargs)


class ServerAdapter:
    """The rollout side's weight update: every tensor received goes to the engine's loader."""

    def __init__(self, engine):
        self.engine = engine
        self.loaded = []

    async def update_weights(self, weights):
        async for name, tensor in weights:
            self.engine.load_weights([(name, tensor)])
            self.loaded.append(name)


def sync(backend_cls, trainers, rollouts, adapters, weights_of_rank):
    """One weight sync: ``trainers`` and ``rollouts`` are checkpoint engines, ``adapters`` the
    rollouts' server adapters, ``weights_of_rank(r)`` the trainer rank's generator."""
    metadata = [e.prepare() for e in trainers + rollouts]
    tk, rk = backend_cls.build_topology(len(trainers), len(rollouts), metadata)
    for i, e in enumerate(trainers):
        e.init_process_group(**{k: v[i] for k, v in tk.items()})
    for i, e in enumerate(rollouts):
        e.init_process_group(**{k: v[i] for k, v in rk.items()})

    async def run():
        await asyncio.gather(
            *[e.send_weights(weights_of_rank(i)) for i, e in enumerate(trainers)],
            *[a.update_weights(e.receive_weights()) for e, a in zip(rollouts, adapters)])
    asyncio.run(run())
    for e in trainers + rollouts:
        e.finalize()
