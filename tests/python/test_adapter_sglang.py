"""dcr.adapters.sglang: the custom weight loader over the toy engine, through the dispatch of
SGLang's update_weights_from_tensor (tests/python/toy_sglang.py). Every rank's parameters equal a
dense load of the trainer's state, byte for byte, after every update. With SGLang installed, the
last test checks the real interface; without it it skips and says so."""

import pytest

import dcr
from dcr.adapters import sglang as dsg
from dcr.adapters.engine import DeltaSender
from conftest import mutate, raw, write_safetensors
from toy_engine import FP8, Config, ToyEngine, checkpoint, dense, same_params
import toy_sglang


def make_server(tmp_path, gen, tp=1, in_place=True, init=True):
    cfg = Config()
    ck = checkpoint(cfg, gen)
    base = tmp_path / "base.safetensors"
    write_safetensors(base, ck, dtypes=FP8)
    server = toy_sglang.Engine(cfg, tp, custom_weight_loader=[dsg.LOAD_FORMAT])
    server.update_weights_from_tensor(ck.items())  # the server's start: a dense load
    if init:
        server.update_weights_from_tensor(dsg.init_tensors(base, in_place=in_place),
                                          load_format=dsg.LOAD_FORMAT)
    return cfg, ck, server, DeltaSender(ck, str(tmp_path / "deltas"), dtypes=FP8)


@pytest.mark.parametrize("tp,in_place", [(1, True), (2, True), (2, False)])
def test_updates_match_dense_loads(tmp_path, gen, tp, in_place):
    cfg, ck, server, sender = make_server(tmp_path, gen, tp, in_place)
    for rate in (0.01, 0.3, 0.0, 1.0):
        ck = {k: mutate(v, rate, gen) for k, v in ck.items()}
        ok, _ = server.update_weights_from_tensor(dsg.delta_tensors(sender.send(ck)),
                                                  load_format=dsg.LOAD_FORMAT)
        assert ok
        for r, runner in enumerate(server.runners):
            sync = dsg.sync_of(runner.model)
            assert sync.mode == ("in_place" if in_place else "reload")
            assert sync.version == sender.version
            same_params(runner.model, dense(cfg, ck, r, tp))


def test_refusals_and_errors(tmp_path, gen):
    cfg, ck, server, sender = make_server(tmp_path, gen, init=False)
    delta = dsg.delta_tensors(sender.send({k: mutate(v, 0.1, gen) for k, v in ck.items()}))
    with pytest.raises(dcr.FailedPreconditionError, match="a delta before 'dcr.init'"):
        server.update_weights_from_tensor(delta, load_format=dsg.LOAD_FORMAT)
    with pytest.raises(dcr.InvalidArgumentError, match="unknown entry 'weights'"):
        server.update_weights_from_tensor([("weights", delta[0][1])], load_format=dsg.LOAD_FORMAT)
    with pytest.raises(dcr.InvalidArgumentError, match="takes base_path"):
        server.update_weights_from_tensor(dsg.init_tensors(""), load_format=dsg.LOAD_FORMAT)
    server.runners[0].model.quant_config = object()
    with pytest.raises(dcr.FailedPreconditionError, match="refusing a quantized model"):
        server.update_weights_from_tensor(dsg.init_tensors(tmp_path / "base.safetensors"),
                                          load_format=dsg.LOAD_FORMAT)
    assert dsg.sync_of(server.runners[0].model) is None
    same_params(server.runners[0].model, dense(cfg, ck, 0, 1))


def test_failed_update_is_repaired_before_the_next(tmp_path, gen):
    cfg, ck, server, sender = make_server(tmp_path, gen)
    model = server.runners[0].model
    sync = dsg.sync_of(model)
    # A delta of another base: refused before any write.
    other = {k: mutate(v, 0.1, gen) for k, v in ck.items()}
    stray = dcr.encode_delta(other, {k: mutate(v, 0.1, gen) for k, v in other.items()},
                             dtypes=FP8)
    with pytest.raises(dcr.FailedPreconditionError):
        server.update_weights_from_tensor(dsg.delta_tensors(stray), load_format=dsg.LOAD_FORMAT)
    same_params(model, dense(cfg, ck, 0, 1))
    # The engine's loader failing on the converted tensor: the rank is between versions.
    real = sync._rx._load

    def failing(weights):
        raise RuntimeError("loader interrupted")
    sync._rx._load = failing
    ck = {k: mutate(v, 1.0, gen) for k, v in ck.items()}
    with pytest.raises(RuntimeError, match="loader interrupted"):
        server.update_weights_from_tensor(dsg.delta_tensors(sender.send(ck)),
                                          load_format=dsg.LOAD_FORMAT)
    with pytest.raises(dcr.FailedPreconditionError, match="between versions"):
        sync.check_serving()
    sync._rx._load = real
    ck = {k: mutate(v, 0.05, gen) for k, v in ck.items()}
    server.update_weights_from_tensor(dsg.delta_tensors(sender.send(ck)),
                                      load_format=dsg.LOAD_FORMAT)
    sync.check_serving()
    same_params(model, dense(cfg, ck, 0, 1))


def test_real_sglang_interface():
    """Runs where SGLang imports: it takes custom weight loaders, and the dcr loader imports by
    the path given to --custom-weight-loader."""
    pytest.importorskip("sglang", reason="SGLang is not installed (pip install sglang on a GPU "
                                         "host)")
    dsg.probe()
    from sglang.srt.utils import dynamic_import
    assert dynamic_import(dsg.LOAD_FORMAT) is dsg.load_delta


def test_probe_without_sglang_says_so():
    try:
        import sglang  # noqa: F401
        pytest.skip("SGLang is installed: test_real_sglang_interface covers it")
    except ImportError:
        pass
    with pytest.raises(dcr.UnimplementedError, match="SGLang is not importable"):
        dsg.probe()
