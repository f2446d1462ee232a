"""dcr.encode_delta / dcr.apply_delta: byte-exact round trips and all-or-nothing failures."""

import os
import struct
import subprocess
import sys
import threading
import time

import pytest
import torch

import dcr
from conftest import mutate, random_tensor, raw, raw_set, read_safetensors, write_safetensors

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int8, torch.uint8]


def model(gen, dtype=torch.bfloat16):
    return {
        "embed.weight": random_tensor((97, 64), dtype, gen),
        "layers.0.qkv.weight": random_tensor((192, 64), dtype, gen),
        "layers.0.norm.weight": random_tensor((64,), dtype, gen),
        "head.bias": random_tensor((97,), torch.float32, gen),
        "scalar": random_tensor((), torch.int8, gen),
        "empty": random_tensor((0, 3), torch.float32, gen),
    }


def changed(base, rate, gen):
    return {k: mutate(v, rate, gen) for k, v in base.items()}


def clone(ts):
    return {k: v.clone() for k, v in ts.items()}


SMALL = dict(chunk_elems=2048, small_tensor_elems=256)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rate", [0.0, 0.01, 0.03, 1.0])
def test_round_trip_is_byte_exact(dtype, rate, gen):
    base = model(gen, dtype)
    target = changed(base, rate, gen)
    delta = dcr.encode_delta(base, target, **SMALL)
    assert isinstance(delta, bytes) and len(delta) > 0
    live = clone(base)
    assert dcr.apply_delta(live, delta) is None
    assert raw_set(live) == raw_set(target)


@pytest.mark.parametrize("policy", ["auto", "xor", "ulp", "absolute"])
@pytest.mark.parametrize("wan_context", [False, True])
def test_every_value_policy_and_context_coding(policy, wan_context, gen):
    base = model(gen)
    target = changed(base, 0.05, gen)
    delta = dcr.encode_delta(base, target, value_policy=policy, wan_context=wan_context, **SMALL)
    live = clone(base)
    r = dcr.apply_delta_stats(live, delta, threads=2)
    assert raw_set(live) == raw_set(target)
    assert r.target_hash == dcr.tensors_hash(target)
    assert r.target_version == 1 and r.base_version == 0


def test_special_values_bf16():
    # +0, -0, +inf, -inf, quiet and signalling NaNs with payloads, subnormals, max.
    pats = [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7FC1, 0xFFFF, 0x7F81, 0x0001, 0x8001, 0x7F7F]
    n = len(pats)
    base_bits = torch.tensor([struct.unpack("<h", struct.pack("<H", p))[0] for p in pats],
                             dtype=torch.int16)
    target_bits = base_bits.roll(1)
    base = {"w": base_bits.view(torch.bfloat16).repeat(300)}
    target = {"w": target_bits.view(torch.bfloat16).repeat(300)}
    for policy in ["auto", "xor", "ulp"]:
        delta = dcr.encode_delta(base, target, value_policy=policy)
        live = clone(base)
        dcr.apply_delta(live, delta)
        assert raw(live["w"]) == raw(target["w"]), policy
    assert n == 11


def test_fp8_as_uint8_with_dtype_names(gen):
    base = {"w8": random_tensor((64, 128), torch.uint8, gen),
            "scale": random_tensor((64, 1), torch.float32, gen)}
    target = changed(base, 0.1, gen)
    names = {"w8": "F8_E4M3"}
    delta = dcr.encode_delta(base, target, dtypes=names)
    live = clone(base)
    with pytest.raises(dcr.InvalidArgumentError, match="w8"):
        dcr.apply_delta(live, delta)  # U8 is not the delta's F8_E4M3
    assert raw_set(live) == raw_set(base)
    dcr.apply_delta(live, delta, dtypes=names)
    assert raw_set(live) == raw_set(target)
    if hasattr(torch, "float8_e4m3fn"):  # torch >= 2.1 names the dtype itself
        f8 = {k: (v.view(torch.float8_e4m3fn) if k == "w8" else v) for k, v in base.items()}
        dcr.apply_delta(f8, delta)


def test_numpy_arrays(gen):
    np = pytest.importorskip("numpy")
    base = {"a": np.arange(5000, dtype=np.float32), "b": np.ones((10, 10), dtype=np.int8)}
    target = {"a": base["a"] + 1, "b": base["b"].copy()}
    target["b"][3, 4] = 7
    delta = dcr.encode_delta(base, target)
    live = {k: v.copy() for k, v in base.items()}
    dcr.apply_delta(live, delta)
    assert all(live[k].tobytes() == target[k].tobytes() for k in live)


def test_full_frame_applies_over_any_bits(gen):
    target = model(gen)
    delta = dcr.encode_delta(None, target, full=True)
    other = model(gen)
    dcr.apply_delta(other, delta)
    assert raw_set(other) == raw_set(target)
    with pytest.raises(dcr.InvalidArgumentError):
        dcr.encode_delta(None, target)


def test_chained_applies_with_known_base_hash(gen):
    base = model(gen)
    live = clone(base)
    h = dcr.tensors_hash(live)
    cur = base
    for step in range(3):
        nxt = changed(cur, 0.02, gen)
        delta = dcr.encode_delta(cur, nxt, base_version=step, target_version=step + 1, **SMALL)
        r = dcr.apply_delta_stats(live, delta, known_base_hash=h)
        assert raw_set(live) == raw_set(nxt)
        assert r.target_version == step + 1
        h, cur = r.target_hash, nxt


# ---- errors: mapped to dcr.Error subclasses, tensors unchanged ----

def test_wrong_base(gen):
    base = model(gen)
    delta = dcr.encode_delta(base, changed(base, 0.03, gen))
    wrong = changed(base, 0.001, gen)
    before = raw_set(wrong)
    with pytest.raises(dcr.FailedPreconditionError) as e:
        dcr.apply_delta(wrong, delta)
    assert e.value.code == 4 and "base" in e.value.message
    assert isinstance(e.value, dcr.Error)
    assert raw_set(wrong) == before


def test_truncated_and_corrupted(gen):
    base = model(gen)
    delta = dcr.encode_delta(base, changed(base, 0.03, gen), **SMALL)
    for bad in (delta[: len(delta) // 2], delta[:10], b""):
        live = clone(base)
        with pytest.raises(dcr.DataLossError) as e:
            dcr.apply_delta(live, bad)
        assert e.value.code == 3
        assert raw_set(live) == raw_set(base)
    # A flipped byte anywhere: refused (data loss or a check of base bits), tensors unchanged.
    for pos in range(0, len(delta), max(1, len(delta) // 40)):
        bad = bytearray(delta)
        bad[pos] ^= 0x20
        live = clone(base)
        try:
            dcr.apply_delta(live, bad)
        except dcr.Error as e:
            assert e.code in (1, 3, 4), (pos, e)
            assert raw_set(live) == raw_set(base), pos
        else:  # a byte no check covers must not change the outcome
            assert False, "corruption at %d applied" % pos


def test_wrong_shape_dtype_names(gen):
    base = model(gen)
    delta = dcr.encode_delta(base, changed(base, 0.03, gen))
    bad = clone(base)
    bad["layers.0.qkv.weight"] = bad["layers.0.qkv.weight"].reshape(64, 192).contiguous()
    with pytest.raises(dcr.InvalidArgumentError, match="qkv"):
        dcr.apply_delta(bad, delta)
    bad = clone(base)
    bad["head.bias"] = bad["head.bias"].view(torch.int32)
    with pytest.raises(dcr.InvalidArgumentError, match="head.bias"):
        dcr.apply_delta(bad, delta)
    bad = clone(base)
    del bad["scalar"]
    with pytest.raises(dcr.InvalidArgumentError, match="scalar"):
        dcr.apply_delta(bad, delta)
    bad = clone(base)
    bad["extra"] = torch.zeros(3)
    with pytest.raises(dcr.InvalidArgumentError, match="extra"):
        dcr.apply_delta(bad, delta)
    with pytest.raises(dcr.FailedPreconditionError):
        dcr.encode_delta(base, {**base, "head.bias": torch.zeros(5)})


def test_refused_inputs(gen):
    base = model(gen)
    delta = dcr.encode_delta(base, changed(base, 0.03, gen))
    live = clone(base)
    live["embed.weight"] = live["embed.weight"].t()
    with pytest.raises(dcr.InvalidArgumentError, match="contiguous"):
        dcr.apply_delta(live, delta)
    tied = clone(base)
    tied["layers.0.qkv.weight"] = tied["embed.weight"]
    with pytest.raises(dcr.InvalidArgumentError, match="share memory"):
        dcr.apply_delta(tied, delta)
    with pytest.raises(TypeError):
        dcr.apply_delta(base, delta, chunk_elems=5)
    with pytest.raises(TypeError):
        dcr.apply_delta([1, 2], delta)
    with pytest.raises(dcr.InvalidArgumentError):
        dcr.encode_delta(base, base, value_policy="nope")
    with pytest.raises(dcr.InvalidArgumentError):
        dcr.encode_delta(base, base, chunk_elems=0)
    with pytest.raises(dcr.InvalidArgumentError):
        dcr.encode_delta(base, base, wan_context=True, context_classes=99)
    with pytest.raises(dcr.InvalidArgumentError, match="dtypes"):
        dcr.encode_delta({"a": torch.zeros(3, dtype=torch.complex64)},
                         {"a": torch.zeros(3, dtype=torch.complex64)})


def test_kill_mid_apply_restores_every_chunk(gen):
    """A delta whose last chunk is corrupt fails after the others were written: all taken back."""
    base = model(gen)
    for policy, ctx in (("auto", False), ("absolute", False), ("auto", True)):
        delta = dcr.encode_delta(base, changed(base, 0.05, gen), value_policy=policy,
                                 wan_context=ctx, **SMALL)
        # The chunk table sits before the 24-byte tail; the last chunk's record ends right
        # before the trailer: flip a byte a little before the trailer offset.
        (trailer_off,) = struct.unpack("<Q", delta[-24:-16])
        bad = bytearray(delta)
        bad[trailer_off - 3] ^= 0x55
        live = clone(base)
        with pytest.raises((dcr.DataLossError, dcr.FailedPreconditionError)):
            dcr.apply_delta(live, bad, threads=1)
        assert raw_set(live) == raw_set(base), (policy, ctx)


def _samples_inside(call, margin=0.02):
    """Runs call() while a second thread notes the time every millisecond; returns the number of
    notes well inside the call (beyond the 5 ms switch interval at either end) and its length."""
    stamps = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            stamps.append(time.perf_counter())
            time.sleep(0.001)

    t = threading.Thread(target=sample)
    t.start()
    try:
        time.sleep(0.02)
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
    finally:
        stop.set()
        t.join()
    assert t1 - t0 > 3 * margin, "call too short to tell: %.3f s" % (t1 - t0)
    return len([s for s in stamps if t0 + margin < s < t1 - margin]), t1 - t0


def test_gil_released_during_apply():
    g = torch.Generator()
    g.manual_seed(7)
    # Half the elements changed; the tensor grows (x4 from 4M elements, at most 128M) until one
    # apply on one thread takes 0.2 s, long enough to sample inside it on a fast machine too.
    n = 1 << 22
    while True:
        base = {"w": random_tensor((n,), torch.bfloat16, g)}
        target = {"w": mutate(base["w"], 0.5, g)}
        delta = dcr.encode_delta(base, target, threads=2)
        live = clone(base)
        t0 = time.perf_counter()
        dcr.apply_delta(live, delta, threads=1)
        if time.perf_counter() - t0 >= 0.2 or n >= 1 << 27:
            break
        del base, target, delta, live
        n = min(n * 4, 1 << 27)
    live = clone(base)
    inside, took = _samples_inside(lambda: dcr.apply_delta(live, delta, threads=1))
    assert raw(live["w"]) == raw(target["w"])
    assert inside >= 3, (inside, took)

    # Control: the same C call through ctypes.PyDLL, which keeps the GIL: nothing runs inside.
    import ctypes
    from dcr import _lib, _tensors
    held = ctypes.PyDLL(dcr.library_path())
    fn = held.dcr_apply_delta
    fn.restype, fn.argtypes = _lib._SIGNATURES["dcr_apply_delta"]
    live = clone(base)
    arr = _tensors.tensor_array(live, writable=True)
    opts = _lib.CodecOptions()
    _lib.lib().dcr_codec_options_init(ctypes.byref(opts))
    opts.threads = 1
    rc = []
    inside, took = _samples_inside(
        lambda: rc.append(fn(arr.array, arr.count, delta, len(delta), ctypes.byref(opts), None)))
    assert rc == [0] and raw(live["w"]) == raw(target["w"])
    assert inside == 0, (inside, took)


def test_delta_of_dcr_diff_applies_like_dcr_apply(tmp_path, gen, dcr_bin):
    base = model(gen)
    target = changed(base, 0.03, gen)
    b, t = tmp_path / "base.safetensors", tmp_path / "target.safetensors"
    write_safetensors(b, {k: v for k, v in base.items()})
    write_safetensors(t, {k: v for k, v in target.items()})
    d, out = tmp_path / "d.dcr", tmp_path / "out.safetensors"
    subprocess.run([dcr_bin, "diff", str(b), str(t), "-o", str(d), "-q"], check=True)
    subprocess.run([dcr_bin, "apply", str(b), str(d), "-o", str(out), "-q"], check=True)
    live = clone(base)
    dcr.apply_delta(live, d.read_bytes())
    cli = read_safetensors(out)
    assert {k: v[2] for k, v in cli.items()} == raw_set(live) == raw_set(target)
    # And the same bytes from Python as from the CLI (the header carries the target's
    # safetensors JSON, tensors in the order given: the files list them sorted).
    ordered = lambda ts: {k: ts[k] for k in sorted(ts)}  # noqa: E731
    assert dcr.encode_delta(ordered(base), ordered(target)) == d.read_bytes()


def test_library_lookup_and_abi(tmp_path):
    assert dcr.c_abi_version() == dcr.ABI_VERSION
    assert dcr.library_path().endswith("libdcr.so")
    code = ("import dcr\n"
            "try:\n dcr.tensors_hash({})\nexcept dcr.LibraryError as e:\n print('LE', e)\n")
    notlib = tmp_path / "libdcr.so"
    notlib.write_bytes(b"not a shared object")
    for path in ("/nonexistent/libdcr.so", str(notlib)):
        env = dict(os.environ, DCR_LIBRARY=path)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True).stdout
        assert out.startswith("LE") and path in out, out
