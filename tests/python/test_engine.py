"""dcr.torch.EngineReceiver over the toy engine: after each delta every parameter equals a dense
load of the target through the engine's own loader, byte for byte, for TP=1 and both ranks of
TP=2, over random layouts, dtypes and change rates; failures leave no mixed version."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dcr
from dcr.torch import EngineReceiver
from conftest import mutate, raw
from toy_engine import FP8, Config, ToyEngine, checkpoint, dense, same_params


def step(ck, rate, gen):
    return {k: mutate(v, rate, gen) for k, v in ck.items()}


def receivers(cfg, ck, tp):
    out = []
    for r in range(tp):
        e = ToyEngine(cfg, r, tp)
        out.append((e, EngineReceiver(e.params(), e.load_weights, ck, dtypes=FP8)))
    return out


@pytest.mark.parametrize("tp", [1, 2])
def test_recorded_placement(tp, gen):
    cfg = Config()
    ck = checkpoint(cfg, gen)
    for r, (e, rx) in enumerate(receivers(cfg, ck, tp)):
        same_params(e, dense(cfg, ck, r, tp))
        placed, converted = rx.stats()
        assert converted == ["layers.0.input_layernorm.weight"]
        # Every parameter element except the converted norm and the zero padding is placed.
        total = sum(p.numel() for n, p in e.named_parameters())
        padding = e.vocab_per_rank * cfg.hidden - max(
            0, min(e.vocab_per_rank, cfg.vocab - r * e.vocab_per_rank)) * cfg.hidden
        assert placed == total - cfg.hidden - padding


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("rate", [0.0, 0.01, 0.03, 1.0])
def test_deltas_match_dense_loads(tp, rate, gen):
    cfg = Config()
    cur = checkpoint(cfg, gen)
    engines = receivers(cfg, cur, tp)
    for v in range(3):
        nxt = step(cur, rate, gen)
        delta = dcr.encode_delta(cur, nxt, dtypes=FP8, base_version=v, target_version=v + 1)
        for r, (e, rx) in enumerate(engines):
            res = rx.apply(delta)
            assert res.target_version == v + 1 and rx.consistent
            same_params(e, dense(cfg, nxt, r, tp))
        cur = nxt


@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(heads=st.sampled_from([2, 4, 8]), kv=st.sampled_from([2]), hd=st.sampled_from([4, 16]),
       vocab=st.integers(17, 90), inter=st.sampled_from([16, 48]), experts=st.integers(1, 4),
       tp=st.sampled_from([1, 2]), rate=st.sampled_from([0.0, 0.02, 0.3, 1.0]),
       seed=st.integers(0, 2**31 - 1))
def test_conformance_over_random_layouts(heads, kv, hd, vocab, inter, experts, tp, rate, seed):
    g = torch.Generator()
    g.manual_seed(seed)
    cfg = Config(vocab=vocab, hidden=32, heads=heads, kv_heads=kv, head_dim=hd, inter=inter,
                 experts=experts, fp8_rows=32)
    cur = checkpoint(cfg, g)
    engines = receivers(cfg, cur, tp)
    nxt = step(cur, rate, g)
    delta = dcr.encode_delta(cur, nxt, dtypes=FP8, chunk_elems=512, small_tensor_elems=64)
    for r, (e, rx) in enumerate(engines):
        rx.apply(delta)
        same_params(e, dense(cfg, nxt, r, tp))


def test_failed_update_is_never_served_and_repairs(gen):
    cfg = Config()
    cur = checkpoint(cfg, gen)
    (e, rx), = receivers(cfg, cur, 1)
    nxt = step(cur, 0.05, gen)
    delta = dcr.encode_delta(cur, nxt, dtypes=FP8)

    # A corrupt delta: refused before anything moves (canonical copy and engine).
    bad = bytearray(delta)
    bad[len(bad) // 2] ^= 1
    with pytest.raises(dcr.Error):
        rx.apply(bytes(bad))
    assert rx.consistent and rx.version == 0
    same_params(e, dense(cfg, cur, 0, 1))

    # The engine's loader dies half-way through the update (the converted tensor's reload).
    real = e.load_weights

    def dying(weights):
        raise RuntimeError("killed during reload")

    rx._load = dying
    with pytest.raises(RuntimeError):
        rx.apply(delta)
    assert not rx.consistent
    with pytest.raises(dcr.FailedPreconditionError):
        rx.check_serving()
    with pytest.raises(dcr.FailedPreconditionError):
        rx.apply(delta)
    rx._load = real
    rx.repair()
    assert rx.consistent and rx.version == 1
    rx.check_serving()
    same_params(e, dense(cfg, nxt, 0, 1))

    # And the next version applies as usual.
    nn = step(nxt, 0.05, gen)
    rx.apply(dcr.encode_delta(nxt, nn, dtypes=FP8, base_version=1, target_version=2))
    same_params(e, dense(cfg, nn, 0, 1))


def test_engine_generates_with_the_new_weights(gen):
    cfg = Config()
    cur = checkpoint(cfg, gen)
    (e, rx), = receivers(cfg, cur, 1)
    nxt = step(cur, 0.5, gen)
    rx.apply(dcr.encode_delta(cur, nxt, dtypes=FP8))
    assert e.generate([1, 2, 3], 5) == dense(cfg, nxt, 0, 1).generate([1, 2, 3], 5)


def test_only_changed_converted_tensors_are_reloaded(gen):
    cfg = Config()
    cur = checkpoint(cfg, gen)
    e = ToyEngine(cfg)
    calls = []

    def loader(weights):
        weights = list(weights)
        calls.append(sorted(n for n, _ in weights))
        e.load_weights(weights)

    rx = EngineReceiver(e.params(), loader, cur, dtypes=FP8)
    calls.clear()
    nxt = dict(cur)
    nxt["layers.0.mlp.up_proj.weight"] = mutate(cur["layers.0.mlp.up_proj.weight"], 0.05, gen)
    rx.apply(dcr.encode_delta(cur, nxt, dtypes=FP8))
    assert calls == []  # the converted norm did not change: no reload
    same_params(e, dense(cfg, nxt, 0, 1))
    nn = dict(nxt)
    nn["layers.0.input_layernorm.weight"] = mutate(nxt["layers.0.input_layernorm.weight"], 0.5,
                                                   gen)
    rx.apply(dcr.encode_delta(nxt, nn, dtypes=FP8, base_version=1, target_version=2))
    assert calls == [["layers.0.input_layernorm.weight"]]
    same_params(e, dense(cfg, nn, 0, 1))


def _differing(a, b, skip):
    """Elements of the engine's parameters (each storage once) whose bits differ between two
    engines, parameters named in ``skip`` left out."""
    n, seen = 0, set()
    pa, pb = a.params(), b.params()
    for k in pa:
        if k in skip or pa[k].data_ptr() in seen:
            continue
        seen.add(pa[k].data_ptr())
        x, y = pa[k].data.reshape(-1), pb[k].data.reshape(-1)
        w = x.element_size()
        xi = x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[w])
        yi = y.view(xi.dtype)
        n += int((xi != yi).sum())
    return n


@pytest.mark.parametrize("rate", [0.0, 0.01, 0.2])
def test_update_writes_only_the_changed_elements(rate, gen):
    cfg = Config()
    cur = checkpoint(cfg, gen)
    (e, rx), = receivers(cfg, cur, 1)
    nxt = step(cur, rate, gen)
    rx.apply(dcr.encode_delta(cur, nxt, dtypes=FP8))
    same_params(e, dense(cfg, nxt, 0, 1))
    up = rx.last_update
    written = sum(up["written"].values())
    # Every written element is one whose bits moved (the converted norm is re-loaded instead).
    assert written == _differing(dense(cfg, cur, 0, 1), e, {"norm"})
    placed, _ = rx.stats()
    assert written < placed or rate == 0.0 and written == 0
    assert up["written_bytes"] == sum(
        k * cur[n].element_size() for n, k in up["written"].items())


def test_update_leaves_unchanged_elements_unread_and_unwritten(gen):
    """An engine element whose canonical element the delta does not change is not touched: a
    marker written there survives the update (a rewrite of the tensor would erase it)."""
    cfg = Config()
    cur = checkpoint(cfg, gen)
    (e, rx), = receivers(cfg, cur, 1)
    nxt = dict(cur)
    up = cur["layers.0.mlp.up_proj.weight"].clone()
    up.view(torch.int16)[0, 0] ^= 1   # gate_up row inter_rank, column 0 changes
    nxt["layers.0.mlp.up_proj.weight"] = up
    marker = e.gate_up.data.view(torch.int16)[cfg.inter, 5].item() ^ 0x55
    e.gate_up.data.view(torch.int16)[cfg.inter, 5] = marker
    rx.apply(dcr.encode_delta(cur, nxt, dtypes=FP8))
    assert rx.last_update["written"] == {"layers.0.mlp.up_proj.weight": 1}
    assert e.gate_up.data.view(torch.int16)[cfg.inter, 5].item() == marker
    assert raw(e.gate_up.data[cfg.inter, 0]) == raw(up[0, 0])
    # repair() is the overwrite: it puts every placed element back, the marker too.
    rx.repair()
    same_params(e, dense(cfg, nxt, 0, 1))


def test_reallocated_parameter_is_refused(gen):
    cfg = Config()
    cur = checkpoint(cfg, gen)
    (e, rx), = receivers(cfg, cur, 1)
    nxt = step(cur, 0.05, gen)
    delta = dcr.encode_delta(cur, nxt, dtypes=FP8)
    e.down.data = e.down.data.clone()  # the engine re-allocates a parameter
    with pytest.raises(dcr.FailedPreconditionError, match="stable"):
        rx.apply(delta)
    assert rx.consistent and rx.version == 0
