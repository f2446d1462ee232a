"""dcr.adapters.nemo_rl: NeMo-RL's non-colocated refit (tests/python/toy_nemo_rl.py) through the
dcr proxies, into two toy-engine workers running the dcr vLLM backend (toy_vllm.py). Every
worker's parameters equal a dense load of the trainer's weights, byte for byte, after every
refit; a worker that fails makes the refit fail and is repaired by the next one. With NeMo-RL
installed, the last test probes the real refit; without it it skips and says so."""

import pytest

import dcr
from dcr.adapters import nemo_rl as dnr
from dcr.adapters import vllm as dvllm
from dcr.adapters.engine import DeltaSender
from conftest import mutate, raw, write_safetensors
from toy_engine import FP8, Config, ToyEngine, checkpoint, dense, same_params
import toy_nemo_rl
import toy_vllm


def make(tmp_path, gen):
    cfg = Config()
    ck = checkpoint(cfg, gen)
    base = tmp_path / "base.safetensors"
    write_safetensors(base, ck, dtypes=FP8)
    factory = toy_vllm.Factory()
    factory.register_engine(dvllm.BACKEND, dvllm.engine_class(toy_vllm.WeightTransferEngine))
    workers = [toy_vllm.Worker(factory, dvllm.BACKEND, cfg, r, 2) for r in range(2)]
    for w in workers:
        w.load(ck)
        w.init({"base_path": str(base)})
    policy = toy_nemo_rl.Policy(ck)
    dp = dnr.DeltaPolicy(policy, lambda: policy.state,
                         DeltaSender(ck, str(tmp_path / "deltas"), dtypes=FP8))
    dg = dnr.DeltaGeneration(toy_nemo_rl.Generation(), [w.update for w in workers], dp)
    return cfg, policy, dp, dg, workers


def test_refits_match_dense_loads(tmp_path, gen):
    cfg, policy, dp, dg, workers = make(tmp_path, gen)
    for step, rate in enumerate([0.02, 0.0, 1.0]):
        policy.state = {k: mutate(v, rate, gen) for k, v in policy.state.items()}
        toy_nemo_rl.refit_policy_generation(dp, dg, colocated_inference=False)
        for r, w in enumerate(workers):
            assert w.engine.sync.version == step + 1
            same_params(w.model, dense(cfg, policy.state, r, 2))
    dg.prepare_for_generation(tags=["kv_cache"])  # forwarded to NeMo-RL's object
    assert dg.prepared == 1


def test_failed_worker_fails_the_refit_and_the_next_repairs(tmp_path, gen):
    cfg, policy, dp, dg, workers = make(tmp_path, gen)
    rx = workers[1].engine.sync._rx
    real = rx._load

    def failing(weights):
        raise RuntimeError("worker 1 loader interrupted")
    rx._load = failing
    policy.state = {k: mutate(v, 1.0, gen) for k, v in policy.state.items()}
    with pytest.raises(RuntimeError, match="Updating weights for the generation policy failed"):
        toy_nemo_rl.refit_policy_generation(dp, dg, colocated_inference=False)
    assert [i for i, _ in dg.errors] == [1] and not workers[1].engine.sync.consistent
    same_params(workers[0].model, dense(cfg, policy.state, 0, 2))
    rx._load = real
    policy.state = {k: mutate(v, 0.05, gen) for k, v in policy.state.items()}
    toy_nemo_rl.refit_policy_generation(dp, dg, colocated_inference=False)
    for r, w in enumerate(workers):
        same_params(w.model, dense(cfg, policy.state, r, 2))
    # The same version twice is refused, not re-applied.
    with pytest.raises(dcr.FailedPreconditionError, match="no new version"):
        dg.update_weights_from_collective()


def test_colocated_refit_and_kv_scales_are_refused(tmp_path, gen):
    cfg, policy, dp, dg, workers = make(tmp_path, gen)
    with pytest.raises(dcr.FailedPreconditionError, match="colocated refit"):
        toy_nemo_rl.refit_policy_generation(dp, dg, colocated_inference=True)
    with pytest.raises(dcr.FailedPreconditionError, match="kv_scales"):
        dp.broadcast_weights_for_collective(kv_scales={"layers.0.k_scale": 1.0})


def test_real_nemo_rl_refit():
    pytest.importorskip("nemo_rl", reason="NeMo-RL is not installed")
    dnr.probe()


def test_probe_without_nemo_rl_says_so():
    try:
        import nemo_rl  # noqa: F401
        pytest.skip("NeMo-RL is installed: test_real_nemo_rl_refit covers it")
    except ImportError:
        pass
    with pytest.raises(dcr.UnimplementedError, match="NeMo-RL is not importable"):
        dnr.probe()
