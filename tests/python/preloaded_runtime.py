"""dcr.runtime over the C API of dcr_c.h: recording a loader's copies into runtime buffers,
applying a delta blob by blob, the reload callback of converted tensors (and one that raises),
the receiver's queries, and the process-wide copy hook.

Recording needs the copy interposers in the process: test_runtime.py runs this file in a Python
started with LD_PRELOAD=libdcr_preload.so (it is not collected by itself).
"""

import ctypes

import pytest
import torch

import dcr
import dcr.runtime as rt
from conftest import mutate, raw, write_safetensors


def files(tmp_path, gen):
    base = {"k": (torch.randn(4, 4, generator=gen) * 0.02).bfloat16(),
            "norm": (1 + torch.randn(4, generator=gen) * 0.05).bfloat16(),
            "q": (torch.randn(8, 4, generator=gen) * 0.02).bfloat16()}
    target = {k: mutate(v, 0.3, gen) for k, v in base.items()}
    bp, tp = tmp_path / "base.safetensors", tmp_path / "target.safetensors"
    write_safetensors(bp, base)
    write_safetensors(tp, target)
    return base, target, bp, tp


def record(bp, reload):
    """A runtime with fused q/k storage (bit-preserving) and an FP32 norm (converted)."""
    fused = torch.empty(48, dtype=torch.bfloat16)
    norm = torch.empty(4, dtype=torch.float32)
    rec = rt.Recorder(bp)
    rec.add_buffer("fused", fused)
    rec.add_buffer("norm", norm)
    rec.set_tensor("q")
    rec.copy(fused[:32], "q")
    rec.set_tensor("k")
    rec.copy(fused[32:], "k")
    rec.set_tensor("norm")
    conv = torch.frombuffer(bytearray(rec.tensor_bytes("norm")), dtype=torch.bfloat16).float()
    ctypes.memmove(norm.data_ptr(), conv.data_ptr(), 16)  # from scratch: a converted write
    rec.set_tensor(None)

    def on_reload(name, data):
        assert name == "norm"
        norm.copy_(torch.frombuffer(bytearray(data), dtype=torch.bfloat16).float())
        reload(name, data)

    return fused, norm, rec.end(reload=on_reload)


def test_record_apply_verify_round_trip(tmp_path, gen):
    base, target, bp, tp = files(tmp_path, gen)
    reloads = []
    fused, norm, rx = record(bp, lambda n, d: reloads.append(n))
    assert raw(fused) == raw(base["q"]) + raw(base["k"])
    assert rx.stats() == (96, 16, 0)  # q and k placed (BF16); the FP32 norm converted
    v0 = rx.version()
    assert v0[0] == 0 and v0[1] == dcr.tensors_hash(base) and v0[2] is False
    delta = dcr.encode_delta(base, target, small_tensor_elems=8, chunk_elems=16)
    header, chunks, trailer = rt.delta_parts(delta)
    assert len(chunks) >= 2
    rx.begin(header)
    assert rx.version()[2] is True
    for c in reversed(chunks):
        rx.apply_chunk(c)
    rx.finish(trailer)
    assert reloads == ["norm"]
    assert raw(fused) == raw(target["q"]) + raw(target["k"])
    assert raw(norm) == raw(target["norm"].float())
    assert rx.version() == (1, dcr.tensors_hash(target), False)
    rx.verify(tp)
    with pytest.raises(dcr.DataLossError):
        rx.verify(bp)
    with pytest.raises(dcr.FailedPreconditionError):  # the old delta: another base now
        rx.apply(delta)
    rx.close()
    with pytest.raises(dcr.InvalidArgumentError):
        rx.version()


def test_a_reload_callback_that_raises_fails_the_commit(tmp_path, gen):
    base, target, bp, tp = files(tmp_path, gen)

    def boom(name, data):
        raise ValueError("loader broke on " + name)

    fused, norm, rx = record(bp, boom)
    with pytest.raises(ValueError, match="loader broke on norm") as e:
        rx.apply(dcr.encode_delta(base, target))
    assert isinstance(e.value.__cause__, dcr.Error)
    assert rx.version()[0] == 0  # not committed


def test_recorder_errors(tmp_path, gen):
    _, _, bp, _ = files(tmp_path, gen)
    with pytest.raises(dcr.NotFoundError):
        rt.Recorder(tmp_path / "missing.safetensors")
    rec = rt.Recorder(bp)
    with pytest.raises(dcr.NotFoundError, match="nope"):
        rec.set_tensor("nope")
    with pytest.raises(KeyError):
        rec.tensor_data("nope")
    with pytest.raises(dcr.InvalidArgumentError):
        rec.add_source(rec.tensor_data("q")[0], 3)
    rec.end().close()


def test_delta_parts_refuses_corrupt_bytes(gen):
    base = {"w": torch.zeros(100)}
    delta = dcr.encode_delta(base, {"w": torch.ones(100)})
    with pytest.raises(dcr.DataLossError):
        rt.delta_parts(delta[:-1])
