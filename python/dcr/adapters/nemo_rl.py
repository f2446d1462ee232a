"""NeMo-RL: its weight synchronization (``refit_policy_generation``) carried by dcr deltas.

NeMo-RL refits a non-colocated generation backend in two calls made at once, then waits on both
with ``ray.get``: ``policy.broadcast_weights_for_collective(kv_scales=...)`` on the trainer side
and ``policy_generation.update_weights_from_collective()`` on the inference side, whose results
must all be truthy (else NeMo-RL raises "Updating weights for the generation policy failed"). The
two proxies here stand in for ``policy`` and ``policy_generation`` in that call and forward every
other attribute to the objects they wrap:

* :class:`DeltaPolicy` ``(policy, state_dict_fn, sender)``: ``broadcast_weights_for_collective``
  takes the trainer's weights from ``state_dict_fn()`` and writes their delta against the last
  version with ``sender`` (a :class:`dcr.adapters.engine.DeltaSender`);
* :class:`DeltaGeneration` ``(generation, receivers)``: ``update_weights_from_collective`` hands
  the update description to every receiver (a callable per inference worker, e.g. one calling the
  worker's dcr vLLM backend, :mod:`dcr.adapters.vllm`) and returns one result per worker: False
  for a worker whose update raised (its error is kept in ``errors``), so NeMo-RL stops the run
  instead of generating with a worker between versions.

Results are returned as Ray object references when Ray is initialised in the process (what
NeMo-RL's ``ray.get`` takes), as plain values otherwise.

Refused with :class:`dcr.FailedPreconditionError`: colocated refit (``stream_weights_via_ipc_zmq``
/ ``update_weights_via_ipc_zmq`` share the trainer's GPU buffers through CUDA IPC: there is no
transfer to compress), and ``kv_scales`` (FP8 KV-cache scales computed from the weights: a cache
derived from the weights that the delta does not carry).
"""

import inspect

from ..errors import FailedPreconditionError, UnimplementedError
from .engine import DeltaSender

__all__ = ["DeltaGeneration", "DeltaPolicy", "DeltaSender", "probe"]


def probe():
    """Imports the installed NeMo-RL and checks that its refit calls the two methods the proxies
    implement. Returns its version; raises :class:`dcr.UnimplementedError` naming the version and
    what is missing."""
    try:
        import nemo_rl
    except ImportError as e:
        raise UnimplementedError("dcr.adapters.nemo_rl: NeMo-RL is not importable here (%s)"
                                 % e) from None
    version = getattr(nemo_rl, "__version__", "unknown")
    try:
        from nemo_rl.algorithms.grpo import refit_policy_generation
        src = inspect.getsource(refit_policy_generation)
    except (ImportError, OSError, TypeError) as e:
        raise UnimplementedError("dcr.adapters.nemo_rl: NeMo-RL %s has no readable "
                                 "nemo_rl.algorithms.grpo.refit_policy_generation (%s)"
                                 % (version, e)) from None
    missing = [m for m in ("broadcast_weights_for_collective", "update_weights_from_collective")
               if m not in src]
    if missing:
        raise UnimplementedError("dcr.adapters.nemo_rl: NeMo-RL %s refits without %s"
                                 % (version, " and ".join(missing)))
    return version


def _futures(values):
    try:
        import ray
        if ray.is_initialized():
            return [ray.put(v) for v in values]
    except ImportError:
        pass
    return list(values)


class _Proxy:
    def __init__(self, wrapped):
        object.__setattr__(self, "_wrapped", wrapped)

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "_wrapped"), name)


class DeltaPolicy(_Proxy):
    """NeMo-RL's policy, its collective broadcast replaced by a delta written with ``sender``."""

    def __init__(self, policy, state_dict_fn, sender):
        super().__init__(policy)
        object.__setattr__(self, "_state", state_dict_fn)
        object.__setattr__(self, "_sender", sender)
        object.__setattr__(self, "last_update", None)

    def broadcast_weights_for_collective(self, kv_scales=None):
        if kv_scales:
            raise FailedPreconditionError(
                "dcr.adapters.nemo_rl: kv_scales are FP8 KV-cache scales computed from the "
                "weights; the delta does not carry them (refit without FP8 KV-cache scales)")
        info = self._sender.send(self._state())
        object.__setattr__(self, "last_update", info)
        return _futures([info])

    def stream_weights_via_ipc_zmq(self, *args, **kwargs):
        raise FailedPreconditionError(
            "dcr.adapters.nemo_rl: colocated refit shares the trainer's GPU buffers through CUDA "
            "IPC; dcr carries the non-colocated refit (policy.generation.colocated.enabled=false)")


class DeltaGeneration(_Proxy):
    """NeMo-RL's generation backend, its collective receive replaced by the latest delta handed
    to each worker's receiver. ``policy``: the :class:`DeltaPolicy` whose updates it takes."""

    def __init__(self, generation, receivers, policy):
        super().__init__(generation)
        object.__setattr__(self, "_receivers", list(receivers))
        object.__setattr__(self, "_policy", policy)
        object.__setattr__(self, "errors", [])
        object.__setattr__(self, "_delivered", None)

    def update_weights_from_collective(self):
        info = self._policy.last_update
        if info is None or info["version"] == self._delivered:
            raise FailedPreconditionError("dcr.adapters.nemo_rl: no new version sent "
                                          "(broadcast_weights_for_collective first)")
        object.__setattr__(self, "_delivered", info["version"])
        results, errors = [], []
        for i, receive in enumerate(self._receivers):
            try:
                receive(info)
                results.append(True)
            except Exception as e:  # reported to NeMo-RL as a failed worker
                errors.append((i, e))
                results.append(False)
        object.__setattr__(self, "errors", errors)
        return _futures(results)

    def update_weights_via_ipc_zmq(self, *args, **kwargs):
        raise FailedPreconditionError(
            "dcr.adapters.nemo_rl: colocated refit shares the trainer's GPU buffers through CUDA "
            "IPC; dcr carries the non-colocated refit (policy.generation.colocated.enabled=false)")
