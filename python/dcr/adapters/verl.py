"""verl: a checkpoint engine named ``"dcr"`` for verl's ``CheckpointEngineRegistry``.

verl moves weights from trainer to rollout through a registered ``CheckpointEngine``: each
worker's engine is built as ``CheckpointEngineRegistry.new(backend, bucket_size=...,
**engine_kwargs[backend])``; per sync the manager calls ``prepare()`` on every worker, the class's
``build_topology(trainer_world_size, rollout_world_size, metadata)``, ``init_process_group(**kw)``
per worker, then at once the trainer's ``send_weights(generator of (name, tensor))`` and the
rollout's ``server_adapter.update_weights(engine.receive_weights())``, and ``finalize()``.

The dcr engine (``engine_kwargs={"dcr": {"work_dir": <a directory both sides see>,
"base_path": <the checkpoint both start from>}}``):

* trainer rank 0 encodes the delta of the weights it is given against the last version sent and
  writes it to ``work_dir/v<n>.dcr`` (temporary name, then rename); other trainer ranks drain their
  generator;
* every rollout worker waits for the next version's file (``timeout_s``, default 600 s), applies it
  all or nothing to its canonical copy, and yields the tensors the delta changed, whole, to the
  server adapter, which loads them through the rollout engine's own loader: the engine holds a
  dense load of the target's changed tensors. A delta that does not apply (another base, a
  corrupt file) raises before anything is yielded.

Only the tensors that changed travel to the engine; the network carries the compressed delta.
"""

import asyncio
import os
import time

from ..errors import DeadlineExceededError, FailedPreconditionError, UnimplementedError
from .. import codec
from .engine import DeltaSender, load_safetensors

BACKEND = "dcr"

__all__ = ["BACKEND", "engine_class", "probe", "register"]


def probe():
    """Imports the installed verl and finds its checkpoint-engine registry. Returns
    ``(version, CheckpointEngine, CheckpointEngineRegistry)``; raises
    :class:`dcr.UnimplementedError` naming the version and what is missing."""
    try:
        import verl
    except ImportError as e:
        raise UnimplementedError("dcr.adapters.verl: verl is not importable here (%s)"
                                 % e) from None
    version = getattr(verl, "__version__", "unknown")
    try:
        from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
    except ImportError as e:
        raise UnimplementedError("dcr.adapters.verl: verl %s has no verl.checkpoint_engine.base "
                                 "(CheckpointEngine, CheckpointEngineRegistry): %s"
                                 % (version, e)) from None
    return version, CheckpointEngine, CheckpointEngineRegistry


def register():
    """Registers the ``"dcr"`` checkpoint engine with the installed verl; returns the class."""
    _, base, registry = probe()
    cls = engine_class(base)
    registry.register(BACKEND)(cls)
    return cls


class _DcrCheckpoint:
    def __init__(self, bucket_size=0, work_dir=None, base_path=None, timeout_s=600.0,
                 is_master=False, **encode_options):
        if not work_dir or not base_path:
            raise FailedPreconditionError(
                "dcr checkpoint engine: engine_kwargs['dcr'] needs work_dir (a directory the "
                "trainer and the rollout both see) and base_path (the checkpoint both start from)")
        self.work_dir, self.base_path = work_dir, base_path
        self.timeout_s = float(timeout_s)
        self._encode = encode_options
        self._role = None
        self._rank = 0
        self._sender = None
        self._canonical = None
        self._map = None
        self._hash = None
        self._dtypes = {}
        self.version = 0

    # ---- topology: the file system is the transport ----

    def prepare(self):
        return {"work_dir": self.work_dir}

    @classmethod
    def build_topology(cls, trainer_world_size, rollout_world_size, metadata):
        dirs = {m.get("work_dir") for m in metadata}
        if len(dirs) != 1:
            raise FailedPreconditionError("dcr checkpoint engine: workers name different "
                                          "work_dir: %s" % sorted(map(str, dirs)))
        return ({"role": ["trainer"] * trainer_world_size, "rank": list(range(trainer_world_size))},
                {"role": ["rollout"] * rollout_world_size, "rank": list(range(rollout_world_size))})

    def init_process_group(self, role="rollout", rank=0, **kwargs):
        self._role, self._rank = role, int(rank)

    def finalize(self):
        pass

    # ---- trainer ----

    async def send_weights(self, weights):
        if self._rank != 0:
            for _ in weights:  # the generator may gather across ranks: run it to the end
                pass
            return
        if self._sender is None:
            base, dtypes = load_safetensors(self.base_path)
            self._sender = DeltaSender(base, self.work_dir, dtypes=dtypes, **self._encode)
        named = [(n, t.detach().to("cpu")) for n, t in weights]
        info = await asyncio.get_running_loop().run_in_executor(None, self._sender.send, named)
        self.version = info["version"]

    # ---- rollout ----

    async def receive_weights(self):
        if self._canonical is None:
            base, self._dtypes = load_safetensors(self.base_path)
            self._canonical = {k: v.clone() for k, v in base.items()}
            self._map = codec.PlacementMap(self._canonical, [], dtypes=self._dtypes)
            self._hash = codec.tensors_hash(self._canonical, dtypes=self._dtypes)
        path = os.path.join(self.work_dir, "v%d.dcr" % (self.version + 1))
        deadline = time.monotonic() + self.timeout_s
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise DeadlineExceededError("dcr checkpoint engine: no %s after %.0f s"
                                            % (path, self.timeout_s))
            await asyncio.sleep(0.01)
        with open(path, "rb") as f:
            delta = f.read()
        loop = asyncio.get_running_loop()
        r, changed, _ = await loop.run_in_executor(
            None, lambda: self._map.apply(self._canonical, delta, known_base_hash=self._hash,
                                          dtypes=self._dtypes))
        self._hash, self.version = r.target_hash, r.target_version
        for name in changed:
            yield name, self._canonical[name]


def engine_class(checkpoint_engine):
    """The ``"dcr"`` checkpoint engine class over ``checkpoint_engine`` (verl's base class)."""
    cls = type("DcrCheckpointEngine", (_DcrCheckpoint, checkpoint_engine),
               {"__doc__": "dcr's checkpoint engine for verl (dcr.adapters.verl)."})
    cls.__abstractmethods__ = frozenset(
        m for m in getattr(cls, "__abstractmethods__", ()) if not hasattr(_DcrCheckpoint, m))
    return cls
