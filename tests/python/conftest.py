"""Shared helpers of the Python suite: tensor sets, byte views, safetensors files, the dcr CLI.

The package under test is the source tree's (PYTHONPATH=python) over the build's libdcr.so
(DCR_LIBRARY); CTest sets both (tests/python/CMakeLists.txt).
"""

import ctypes
import json
import os
import struct
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if os.path.join(ROOT, "python") not in sys.path:
    sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402

# torch dtype -> (safetensors dtype, integer dtype of the same width for bit manipulation)
BITS = {
    torch.bfloat16: ("BF16", torch.int16), torch.float16: ("F16", torch.int16),
    torch.float32: ("F32", torch.int32), torch.float64: ("F64", torch.int64),
    torch.int8: ("I8", torch.int8), torch.uint8: ("U8", torch.uint8),
    torch.int16: ("I16", torch.int16), torch.int32: ("I32", torch.int32),
    torch.int64: ("I64", torch.int64),
}


def raw(t):
    """The bytes of a contiguous CPU tensor (or numpy array)."""
    if hasattr(t, "data_ptr"):
        return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())
    return t.tobytes()


def raw_set(ts):
    return {k: raw(v) for k, v in ts.items()}


def random_tensor(shape, dtype, gen):
    """Random bits of every pattern (NaN payloads, infs, -0, subnormals included)."""
    n = 1
    for s in shape:
        n *= s
    b = torch.randint(0, 256, (n * torch.empty((), dtype=dtype).element_size(),),
                      dtype=torch.uint8, generator=gen)
    return b.view(dtype).reshape(shape).clone()


def mutate(t, rate, gen):
    """A copy of ``t`` with about ``rate`` of its elements set to other bits (rate 1: all)."""
    out = t.clone()
    if out.numel() == 0 or rate == 0:
        return out
    ib = BITS[t.dtype][1] if t.dtype in BITS else t.dtype
    flat = out.reshape(-1).view(ib)
    mask = torch.rand(flat.shape, generator=gen) < rate
    if rate >= 1:
        mask[:] = True
    # Low-bit flips like an optimizer step, plus a few arbitrary patterns.
    flips = torch.randint(1, 8, flat.shape, generator=gen).to(ib)
    flat[mask] = flat[mask] ^ flips[mask]
    return out


def write_safetensors(path, tensors, dtypes=None):
    """A safetensors file of ``tensors`` (name -> contiguous CPU tensor), names sorted."""
    dtypes = dtypes or {}
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name]
        b = raw(t)
        header[name] = {"dtype": dtypes.get(name, BITS[t.dtype][0]), "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    """name -> (dtype, shape, bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, d in header.items():
        if name == "__metadata__":
            continue
        b, e = d["data_offsets"]
        out[name] = (d["dtype"], d["shape"], data[base + b:base + e])
    return out


@pytest.fixture
def gen():
    g = torch.Generator()
    g.manual_seed(1234)
    return g


@pytest.fixture(scope="session")
def dcr_bin():
    path = os.environ.get("DCR_BIN", os.path.join(ROOT, "build", "dcr"))
    if not os.path.exists(path):
        pytest.skip("no dcr binary at %s (CTest sets DCR_BIN)" % path)
    return path
