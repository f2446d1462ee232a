"""The device path of dcr.encode_delta / apply_delta / tensors_hash and dcr.torch.EngineReceiver.

Without a GPU the device path runs on dcr's host backend (``device="host"``: the same code as
CUDA, the CPU doing each device operation over the caller's CPU tensors): byte-exact against the
CPU path and a dense load over random layouts, dtypes, special values and 0-100% change;
all-or-nothing on corrupt deltas; devices mixed in one call refused. The tests of real CUDA
tensors at the end run only where ``torch.cuda.is_available()`` (a CUDA build of torch and a GPU)
and are skipped, saying so, elsewhere.
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dcr
from dcr._tensors import call_device
from dcr.adapters.engine import EngineSync
from dcr.torch import EngineReceiver
from conftest import mutate, random_tensor, raw, raw_set
from toy_engine import FP8, Config, ToyEngine, checkpoint, dense, same_params

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int8, torch.uint8,
          torch.int32]
SMALL = dict(chunk_elems=2048, small_tensor_elems=256)
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(
    not CUDA, reason="torch.cuda.is_available() is False (no CUDA build of torch or no GPU here): "
    "the device path is covered by the host backend tests above")


def layout(seed):
    """A random tensor set: 1..6 tensors of random dtypes and shapes (scalars, empty and
    multi-chunk tensors among them), random bits of every pattern (NaN payloads, infs, -0,
    subnormals)."""
    g = torch.Generator()
    g.manual_seed(seed)
    r = lambda n: int(torch.randint(0, n, (1,), generator=g))  # noqa: E731
    out = {}
    for i in range(1 + r(6)):
        dtype = DTYPES[r(len(DTYPES))]
        shape = tuple(r(40) for _ in range(r(4)))
        if r(4) == 0:
            shape = (3000 + r(9000),)
        out["t%d.%s" % (i, str(dtype)[6:])] = random_tensor(shape, dtype, g)
    return out, g


def clone(ts):
    return {k: v.clone() for k, v in ts.items()}


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), rate=st.sampled_from([0.0, 0.01, 0.3, 1.0]),
       policy=st.sampled_from(["auto", "xor", "ulp", "absolute"]))
def test_host_device_path_is_byte_exact_over_random_layouts(seed, rate, policy):
    base, g = layout(seed)
    target = {k: mutate(v, rate, g) for k, v in base.items()}
    delta = dcr.encode_delta(base, target, value_policy=policy, **SMALL)
    # The device encode (tensors downloaded) gives the same bytes.
    assert dcr.encode_delta(base, target, value_policy=policy, device="host", **SMALL) == delta
    assert dcr.tensors_hash(base, device="host") == dcr.tensors_hash(base)
    live = clone(base)
    r = dcr.apply_delta_stats(live, delta, device="host", threads=2)
    assert raw_set(live) == raw_set(target)
    assert r.target_hash == dcr.tensors_hash(target)


def test_host_device_chained_versions_with_known_hash(gen):
    base, g = layout(7)
    live = clone(base)
    cur, known = base, None
    for v in range(3):
        nxt = {k: mutate(t, 0.05, g) for k, t in cur.items()}
        delta = dcr.encode_delta(cur, nxt, base_version=v, target_version=v + 1, **SMALL)
        r = dcr.apply_delta_stats(live, delta, device="host", known_base_hash=known)
        assert r.target_version == v + 1 and raw_set(live) == raw_set(nxt)
        cur, known = nxt, r.target_hash


def test_host_device_failures_leave_the_tensors_unchanged(gen):
    base, g = layout(11)
    base["big"] = random_tensor((20000,), torch.bfloat16, g)
    target = {k: mutate(v, 0.05, g) for k, v in base.items()}
    for policy in ("auto", "absolute"):
        delta = dcr.encode_delta(base, target, value_policy=policy, **SMALL)
        # A flip near the end: the last chunk record or the trailer, after earlier chunks applied.
        bad = bytearray(delta)
        bad[len(bad) - 60] ^= 0x40
        live = clone(base)
        with pytest.raises((dcr.DataLossError, dcr.FailedPreconditionError)) as e:
            dcr.apply_delta(live, bytes(bad), device="host", threads=1)
        assert "on host" in str(e.value)
        assert raw_set(live) == raw_set(base)

    delta = dcr.encode_delta(base, target, **SMALL)
    other = {k: mutate(v, 0.001, g) if v.numel() else v for k, v in base.items()}
    before = raw_set(other)
    with pytest.raises(dcr.FailedPreconditionError):
        dcr.apply_delta(other, delta, device="host")
    assert raw_set(other) == before

    # A base that drifted inside the last chunks while the caller vouched for its hash: chunks
    # were applied, then one is refused and every applied one is taken back.
    drifted = clone(base)
    drifted["big"].view(torch.int16)[-5000:] ^= 3
    before = raw_set(drifted)
    with pytest.raises(dcr.FailedPreconditionError):
        dcr.apply_delta(drifted, delta, device="host", threads=1,
                        known_base_hash=dcr.tensors_hash(base))
    assert raw_set(drifted) == before

    # Context-coded deltas are refused by the device path, nothing written.
    ctx = dcr.encode_delta(base, target, wan_context=True, **SMALL)
    live = clone(base)
    with pytest.raises(dcr.Error):
        dcr.apply_delta(live, ctx, device="host")
    assert raw_set(live) == raw_set(base)


def test_devices_mixed_or_misnamed_are_refused():
    t = {"a": torch.zeros(4), "b": torch.ones(3)}
    with pytest.raises(dcr.InvalidArgumentError, match="device must be"):
        dcr.tensors_hash(t, device="gpu")
    # CPU tensors are not CUDA tensors.
    with pytest.raises(dcr.InvalidArgumentError, match="device='cuda' but the tensors are on cpu"):
        dcr.apply_delta(t, b"", device="cuda")
    # Tensors of two devices in one call (places as dcr._tensors.where gives them).
    with pytest.raises(dcr.InvalidArgumentError, match="more than one device.*'a' on cpu.*'b' "
                       "on cuda:0"):
        call_device({"a": ("cpu", 0), "b": ("cuda", 0)}, None, "apply_delta")
    with pytest.raises(dcr.InvalidArgumentError, match="cuda:0.*cuda:1"):
        call_device({"a": ("cuda", 0), "b": ("cuda", 1)}, None, "apply_delta")
    assert call_device({"a": ("cuda", 1)}, None, "x") == ("cuda", 1)
    assert call_device({"a": ("cpu", 0)}, "host", "x") == ("host", 0)
    # Other torch devices are refused by name.
    with pytest.raises(dcr.UnimplementedError, match="meta"):
        dcr.tensors_hash({"m": torch.empty(3, device="meta")})


def test_cuda_kind_without_cuda_is_unavailable():
    if CUDA:
        pytest.skip("a GPU is present: the refusal is for machines without one")
    from dcr import _lib
    import ctypes
    t = torch.zeros(8)
    arr = dcr._tensors.tensor_array({"t": t})
    h = (ctypes.c_uint64 * 2)()
    rc = _lib.lib().dcr_tensors_hash_device(ctypes.byref(_lib.Device(2, 0)), arr.array, 1, 0, h)
    with pytest.raises(dcr.UnavailableError, match="CUDA"):
        _lib.check(rc)


def receivers(cfg, ck, tp, device):
    out = []
    for r in range(tp):
        e = ToyEngine(cfg, r, tp)
        out.append((e, EngineReceiver(e.params(), e.load_weights, ck, dtypes=FP8,
                                      device=device)))
    return out


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("rate", [0.0, 0.02, 1.0])
def test_engine_receiver_on_the_host_device_matches_dense_loads(tp, rate, gen):
    cfg = Config()
    cur = checkpoint(cfg, gen)
    engines = receivers(cfg, cur, tp, "host")
    assert all(rx._map.place == ("host", 0) for _, rx in engines)
    for v in range(2):
        nxt = {k: mutate(t, rate, gen) for k, t in cur.items()}
        delta = dcr.encode_delta(cur, nxt, dtypes=FP8, base_version=v, target_version=v + 1,
                                 chunk_elems=512, small_tensor_elems=64)
        for r, (e, rx) in enumerate(engines):
            rx.apply(delta)
            same_params(e, dense(cfg, nxt, r, tp))
        cur = nxt


def test_engine_receiver_on_the_host_device_refuses_and_repairs(gen):
    cfg = Config()
    cur = checkpoint(cfg, gen)
    (e, rx), = receivers(cfg, cur, 1, "host")
    nxt = {k: mutate(t, 0.05, gen) for k, t in cur.items()}
    delta = dcr.encode_delta(cur, nxt, dtypes=FP8, chunk_elems=512, small_tensor_elems=64)
    bad = bytearray(delta)
    bad[len(bad) - 60] ^= 0x40
    with pytest.raises(dcr.Error):
        rx.apply(bytes(bad))
    assert rx.consistent and rx.version == 0
    same_params(e, dense(cfg, cur, 0, 1))
    rx.apply(delta)
    # Scribbled parameters (not the padded ones: padding is the engine's, not a placement).
    for name in ("qkv", "gate_up", "down", "experts_w1", "norm"):
        e.params()[name].data.view(torch.uint8).fill_(0xAB)
    rx.repair()
    same_params(e, dense(cfg, nxt, 0, 1))


# ---- real CUDA tensors (skipped without a GPU) ----

def on_cuda(ts):
    return {k: v.to("cuda") for k, v in ts.items()}


def cuda_raw_set(ts):
    return {k: raw(v.cpu()) for k, v in ts.items()}


@needs_cuda
@pytest.mark.parametrize("rate", [0.0, 0.01, 0.3, 1.0])
def test_cuda_tensors_by_device_pointer_are_byte_exact(rate):
    base, g = layout(int(rate * 1000) + 5)
    target = {k: mutate(v, rate, g) for k, v in base.items()}
    delta = dcr.encode_delta(base, target, **SMALL)
    gb, gt = on_cuda(base), on_cuda(target)
    assert dcr.encode_delta(gb, gt, **SMALL) == delta
    assert dcr.tensors_hash(gb) == dcr.tensors_hash(base)
    live = on_cuda(base)
    r = dcr.apply_delta_stats(live, delta)
    assert cuda_raw_set(live) == raw_set(target)
    assert r.target_hash == dcr.tensors_hash(target)
    # Torch's queued work is ordered around the call: a kernel queued just before is seen.
    live2 = on_cuda(base)
    for v in live2.values():
        v.view(torch.uint8).add_(0)
    dcr.apply_delta(live2, delta)
    assert cuda_raw_set(live2) == raw_set(target)


@needs_cuda
def test_cuda_failures_leave_the_device_tensors_unchanged():
    base, g = layout(31)
    base["big"] = random_tensor((20000,), torch.bfloat16, g)
    target = {k: mutate(v, 0.05, g) for k, v in base.items()}
    for policy in ("auto", "absolute"):
        bad = bytearray(dcr.encode_delta(base, target, value_policy=policy, **SMALL))
        bad[len(bad) - 60] ^= 0x40
        live = on_cuda(base)
        with pytest.raises(dcr.Error):
            dcr.apply_delta(live, bytes(bad), threads=1)
        assert cuda_raw_set(live) == raw_set(base)


@needs_cuda
def test_cuda_and_cpu_tensors_in_one_call_are_refused():
    t = {"a": torch.zeros(4), "b": torch.zeros(4, device="cuda")}
    with pytest.raises(dcr.InvalidArgumentError, match="more than one device"):
        dcr.tensors_hash(t)
    with pytest.raises(dcr.InvalidArgumentError, match="more than one device"):
        dcr.encode_delta({"a": torch.zeros(4)}, {"a": torch.zeros(4, device="cuda")})


@needs_cuda
def test_engine_receiver_with_cuda_parameters_matches_dense_loads(gen):
    cfg = Config()
    cur = checkpoint(cfg, gen)
    e = ToyEngine(cfg).to("cuda")
    rx = EngineReceiver(e.params(), e.load_weights, cur, dtypes=FP8)
    assert rx._map.place[0] == "cuda"
    for v in range(2):
        nxt = {k: mutate(t, 0.05, gen) for k, t in cur.items()}
        rx.apply(dcr.encode_delta(cur, nxt, dtypes=FP8, base_version=v, target_version=v + 1))
        ref = dense(cfg, nxt, 0, 1).params()
        for k, p in e.params().items():
            assert raw(p.data.cpu()) == raw(ref[k].data), k
        cur = nxt


# ---- the engine adapters' sync on device parameters ----

def test_engine_sync_writes_device_parameters_in_place(gen):
    cfg = Config()
    cur = checkpoint(cfg, gen)
    e = ToyEngine(cfg, 0, 1)
    sync = EngineSync(e.load_weights, cur, params=e.params(), dtypes=FP8, device="host")
    assert sync.mode == "in_place", sync.reasons
    assert sync._rx._map.place == ("host", 0)
    for v in range(2):
        nxt = {k: mutate(t, 0.03, gen) for k, t in cur.items()}
        sync.apply(dcr.encode_delta(cur, nxt, dtypes=FP8, base_version=v, target_version=v + 1,
                                    chunk_elems=512, small_tensor_elems=64))
        assert sync.version == v + 1
        same_params(e, dense(cfg, nxt, 0, 1))
        cur = nxt


def test_engine_sync_on_mixed_or_odd_devices_reloads_and_says_why(gen):
    cfg = Config()
    cur = checkpoint(cfg, gen)
    e = ToyEngine(cfg, 0, 1)
    params = dict(e.params())
    name = sorted(params)[0]
    params[name] = torch.empty(params[name].shape, dtype=params[name].dtype, device="meta")
    sync = EngineSync(e.load_weights, cur, params=params, dtypes=FP8)
    assert sync.mode == "reload"
    assert sync.reasons == ["parameter '%s' is on meta: in-place apply writes CPU or CUDA "
                            "tensors" % name]
