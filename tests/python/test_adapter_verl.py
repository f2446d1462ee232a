"""dcr.adapters.verl: the "dcr" checkpoint engine through verl's weight-sync sequence
(tests/python/toy_verl.py): two trainer ranks, two rollout workers (TP=2 toy engines) whose server
adapters load what the engine yields. Every rollout's parameters equal a dense load of the
trainer's state, byte for byte, after every sync, and only changed tensors are loaded. With verl
installed, the last test checks the real registry; without it it skips and says so."""

import pytest

import dcr
from dcr.adapters import verl as dverl
from conftest import mutate, raw, write_safetensors
from toy_engine import FP8, Config, ToyEngine, checkpoint, dense, same_params
import toy_verl


def make(tmp_path, gen, **kwargs):
    cfg = Config()
    ck = checkpoint(cfg, gen)
    base = tmp_path / "base.safetensors"
    write_safetensors(base, ck, dtypes=FP8)
    registry = toy_verl.Registry()
    cls = registry.register(dverl.BACKEND)(dverl.engine_class(toy_verl.CheckpointEngine))
    opts = dict(work_dir=str(tmp_path / "ce"), base_path=str(base), **kwargs)
    trainers = [registry.new(dverl.BACKEND, bucket_size=1 << 20, **opts) for _ in range(2)]
    rollouts = [registry.new(dverl.BACKEND, bucket_size=1 << 20, **opts) for _ in range(2)]
    engines = [dense(cfg, ck, r, 2) for r in range(2)]
    return cfg, ck, cls, trainers, rollouts, engines


def test_syncs_match_dense_loads_and_load_only_changed_tensors(tmp_path, gen):
    cfg, ck, cls, trainers, rollouts, engines = make(tmp_path, gen)
    for step, rate in enumerate([0.01, 0.5, 0.0, 1.0]):
        new = {k: mutate(v, rate, gen) for k, v in ck.items()}
        new["layers.0.mlp.down_proj.weight"] = ck["layers.0.mlp.down_proj.weight"]
        ck = new
        adapters = [toy_verl.ServerAdapter(e) for e in engines]
        toy_verl.sync(cls, trainers, rollouts, adapters, lambda r: iter(list(ck.items())))
        for r, (e, a) in enumerate(zip(engines, adapters)):
            same_params(e, dense(cfg, ck, r, 2))
            assert "layers.0.mlp.down_proj.weight" not in a.loaded
            assert (len(a.loaded) == 0) == (rate == 0.0)
            assert rollouts[r].version == step + 1


def test_bad_delta_yields_nothing_and_timeout_is_clear(tmp_path, gen):
    cfg, ck, cls, trainers, rollouts, engines = make(tmp_path, gen, timeout_s=0.05)
    (tmp_path / "ce").mkdir()
    (tmp_path / "ce" / "v1.dcr").write_bytes(b"DCR not really a delta")
    adapters = [toy_verl.ServerAdapter(e) for e in engines]
    with pytest.raises(dcr.DataLossError, match="not a dcr delta"):
        toy_verl.sync(cls, [], rollouts[:1], adapters[:1], None)
    assert adapters[0].loaded == [] and rollouts[0].version == 0
    same_params(engines[0], dense(cfg, ck, 0, 2))
    rollouts[1].work_dir = str(tmp_path / "empty")
    with pytest.raises(dcr.DeadlineExceededError, match="v1.dcr after"):
        toy_verl.sync(cls, [], rollouts[1:], adapters[1:], None)


def test_missing_settings_are_refused():
    cls = dverl.engine_class(toy_verl.CheckpointEngine)
    with pytest.raises(dcr.FailedPreconditionError, match="needs work_dir"):
        cls(bucket_size=1)
    with pytest.raises(dcr.FailedPreconditionError, match="different work_dir"):
        cls.build_topology(1, 1, [{"work_dir": "/a"}, {"work_dir": "/b"}])


def test_real_verl_registry():
    pytest.importorskip("verl", reason="verl is not installed (pip install verl)")
    version, base, registry = dverl.probe()
    cls = dverl.register()
    assert registry.get(dverl.BACKEND) is cls and not cls.__abstractmethods__, version


def test_probe_without_verl_says_so():
    try:
        import verl  # noqa: F401
        pytest.skip("verl is installed: test_real_verl_registry covers it")
    except ImportError:
        pass
    with pytest.raises(dcr.UnimplementedError, match="verl is not importable"):
        dverl.probe()
