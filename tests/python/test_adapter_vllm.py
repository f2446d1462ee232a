"""dcr.adapters.vllm: the "dcr" weight-transfer backend over the toy engine, through the interface
vLLM's workers call (tests/python/toy_vllm.py). Every worker's parameters equal a dense load of
the trainer's state, byte for byte, after every update. With vLLM installed, the last tests check
the backend against the real interface; without it they skip and say so."""

import os
import subprocess
import sys

import pytest

import dcr
from dcr.adapters import vllm as dvllm
from dcr.adapters.engine import DeltaSender
from conftest import ROOT, mutate, raw, write_safetensors
from toy_engine import FP8, Config, ToyEngine, checkpoint, dense, same_params
import toy_vllm


def make_workers(tmp_path, gen, tp=1, loader_only=False, config=None, in_place=True):
    cfg = Config()
    ck = checkpoint(cfg, gen)
    base = tmp_path / "base.safetensors"
    write_safetensors(base, ck, dtypes=FP8)
    factory = toy_vllm.Factory()
    parent = toy_vllm.WeightTransferEngineLoaderOnly if loader_only else \
        toy_vllm.WeightTransferEngine
    cls = dvllm.engine_class(parent, toy_vllm.WeightTransferInitInfo,
                             toy_vllm.WeightTransferUpdateInfo)
    factory.register_engine(dvllm.BACKEND, cls)
    workers = [toy_vllm.Worker(factory, dvllm.BACKEND, cfg, r, tp, config=config,
                               loader_only=loader_only) for r in range(tp)]
    for w in workers:
        w.load(ck)
        w.init({"base_path": str(base), "version": 0, "in_place": in_place})
    sender = DeltaSender(ck, str(tmp_path / "deltas"), dtypes=FP8)
    return cfg, ck, cls, workers, sender


@pytest.mark.parametrize("tp", [1, 2])
def test_in_place_updates_match_dense_loads(tmp_path, gen, tp):
    cfg, ck, cls, workers, sender = make_workers(tmp_path, gen, tp)
    total = sum(p.numel() * p.element_size() for p in workers[0].model.parameters())
    for step, rate in enumerate([0.01, 0.2, 0.0, 1.0]):
        ck = {k: mutate(v, rate, gen) for k, v in ck.items()}
        info = cls.trainer_send_weights(ck.items(), {"sender": sender})
        assert info["version"] == step + 1 and os.path.exists(info["delta_path"])
        for r, w in enumerate(workers):
            w.update(info)
            assert w.engine.sync.mode == "in_place" and w.engine.sync.version == step + 1
            same_params(w.model, dense(cfg, ck, r, tp))
            if rate == 0.01:
                assert 0 < w.engine.sync.last_update["written_bytes"] < total / 10
    for w in workers:
        w.shutdown()


@pytest.mark.parametrize("loader_only,in_place", [(True, True), (False, False)])
def test_reload_mode_matches_dense_loads(tmp_path, gen, loader_only, in_place):
    cfg, ck, cls, workers, sender = make_workers(tmp_path, gen, loader_only=loader_only,
                                          in_place=in_place)
    (w,) = workers
    for rate in (0.0, 0.05, 1.0):
        ck2 = {k: mutate(v, rate, gen) for k, v in ck.items()}
        # One tensor left as it was: the reload passes over it.
        ck2["layers.0.mlp.down_proj.weight"] = ck["layers.0.mlp.down_proj.weight"]
        ck = ck2
        w.update(cls.trainer_send_weights(ck.items(), {"sender": sender}))
        assert w.engine.sync.mode == "reload", w.engine.sync.reasons
        assert "layers.0.mlp.down_proj.weight" not in w.engine.sync.last_update["reloaded"]
        same_params(w.model, dense(cfg, ck, 0, 1))


def test_quantized_model_is_refused(tmp_path, gen):
    with pytest.raises(dcr.FailedPreconditionError, match="quantization=fp8 repacks"):
        make_workers(tmp_path, gen, config=toy_vllm.vllm_config(quantization="fp8"))


def test_unknown_fields_and_missing_base_are_errors(tmp_path, gen):
    cfg, ck, cls, (w,), sender = make_workers(tmp_path, gen)
    with pytest.raises(dcr.InvalidArgumentError, match="unknown field 'delta_file'"):
        w.update({"delta_file": "x"})
    with pytest.raises(dcr.InvalidArgumentError, match="base_path"):
        w.init({"version": 0})
    with pytest.raises(dcr.NotFoundError):
        w.init({"base_path": str(tmp_path / "nope.safetensors")})


def test_failed_update_is_not_finished_and_next_start_repairs(tmp_path, gen):
    cfg, ck, cls, (w,), sender = make_workers(tmp_path, gen)
    # A delta from another base: refused before any write, the engine as it was.
    other = {k: mutate(v, 0.1, gen) for k, v in ck.items()}
    stray = dcr.encode_delta(other, {k: mutate(v, 0.1, gen) for k, v in other.items()},
                             dtypes=FP8)
    with pytest.raises(dcr.FailedPreconditionError):
        w.update({"delta": stray})
    same_params(w.model, dense(cfg, ck, 0, 1))
    # The engine's loader raising while re-loading the converted tensor: not served.
    real = w.model.load_weights
    calls = []

    def failing(weights):
        calls.append(1)
        raise RuntimeError("loader interrupted")
    w.model.load_weights = failing
    w.engine.sync._rx._load = failing
    ck = {k: mutate(v, 1.0, gen) for k, v in ck.items()}
    with pytest.raises(RuntimeError, match="loader interrupted"):
        w.update(cls.trainer_send_weights(ck.items(), {"sender": sender}))
    assert calls and not w.engine.sync.consistent
    with pytest.raises(dcr.FailedPreconditionError, match="between versions"):
        w.engine.finish_weight_update()
    w.model.load_weights = real
    w.engine.sync._rx._load = real
    # The next version's start repairs, then the update goes through.
    ck = {k: mutate(v, 0.05, gen) for k, v in ck.items()}
    w.update(cls.trainer_send_weights(ck.items(), {"sender": sender}))
    same_params(w.model, dense(cfg, ck, 0, 1))


def test_moved_parameter_under_cuda_graphs_is_refused(tmp_path, gen):
    cfg, ck, cls, (w,), sender = make_workers(tmp_path, gen,
                                       config=toy_vllm.vllm_config(enforce_eager=False))
    model = w.model
    real = model.load_weights

    def reallocating(weights):
        real(weights)
        model.norm.data = model.norm.data.clone()
    w.engine.sync._rx._load = reallocating
    ck = {k: mutate(v, 1.0, gen) for k, v in ck.items()}
    with pytest.raises(dcr.FailedPreconditionError, match="re-allocated parameter 'norm'"):
        w.update(cls.trainer_send_weights(ck.items(), {"sender": sender}))
    assert not w.engine.sync.consistent


def test_plugin_entry_point_is_declared():
    code = ("import importlib.metadata as m\n"
            "eps = m.entry_points()\n"
            "g = eps.select(group='vllm.general_plugins') if hasattr(eps, 'select') else "
            "eps.get('vllm.general_plugins', [])\n"
            "ep = [e for e in g if e.name == 'dcr'][0]\n"
            "import dcr.adapters.vllm as v\n"
            "print(ep.value, ep.load() is v.register)\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["dcr.adapters.vllm:register", "True"], out


def test_register_without_vllm_says_so():
    try:
        import vllm  # noqa: F401
        pytest.skip("vLLM is installed: test_real_vllm_interface covers it")
    except ImportError:
        pass
    with pytest.raises(dcr.UnimplementedError, match="vLLM is not importable"):
        dvllm.register()


def test_real_vllm_interface():
    """Runs where vLLM imports: the backend registers with it and builds over its base class."""
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm on a GPU host)")
    version, base, reg = dvllm.probe()
    dvllm.register()
    dvllm.register()  # a second registration in the process is a no-op
    cls = dvllm.engine_class(base.WeightTransferEngine,
                             getattr(base, "WeightTransferInitInfo", None),
                             getattr(base, "WeightTransferUpdateInfo", None))
    assert not cls.__abstractmethods__, (version, cls.__abstractmethods__)
