"""A process killed (SIGKILL) in the middle of dcr.apply_delta over tensors in a shared file: the
half-applied tensors refuse the delta again (another base, nothing written), and an overwrite
(the full frame of the target) repairs them to the target, byte for byte."""

import os
import signal
import subprocess
import sys
import time

import torch

import dcr
from conftest import ROOT, mutate, random_tensor, raw

CHILD = r"""
import sys, numpy, dcr
path, n, delta_path, lo, hi = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
w = numpy.memmap(path, dtype=numpy.uint16, mode="r+", shape=(n,))
delta = open(delta_path, "rb").read()
print("start", flush=True)
dcr.apply_delta({"w": w}, delta, threads=1, known_base_hash=(lo, hi), dtypes={"w": "BF16"})
"""


def test_sigkill_mid_apply_then_repair_by_overwrite(tmp_path):
    g = torch.Generator()
    g.manual_seed(3)
    n = 1 << 23
    base = random_tensor((n,), torch.bfloat16, g)
    target = mutate(base, 0.6, g)
    delta = dcr.encode_delta({"w": base}, {"w": target}, threads=2, chunk_elems=1 << 16)
    path, dpath = tmp_path / "w.bin", tmp_path / "d.dcr"
    dpath.write_bytes(delta)
    for attempt in range(5):
        path.write_bytes(raw(base))
        lo, hi = dcr.tensors_hash({"w": base})
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        p = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(n), str(dpath),
                              str(lo), str(hi)], stdout=subprocess.PIPE, env=env)
        assert p.stdout.readline().strip() == b"start"
        time.sleep(0.02 * (attempt + 1))
        p.send_signal(signal.SIGKILL)
        p.wait()
        w = torch.from_file(str(path), shared=True, size=n, dtype=torch.bfloat16)
        now = raw(w)
        if now != raw(base) and now != raw(target):
            break  # killed half-way
        del w
    else:
        raise AssertionError("the child was never killed half-way through an apply")
    # Half-applied: the delta is refused (its base is gone) and nothing is written.
    try:
        dcr.apply_delta({"w": w}, delta)
        raise AssertionError("a half-applied tensor accepted the delta")
    except dcr.FailedPreconditionError:
        pass
    assert raw(w) == now
    # Repair: an overwrite of every element, applicable over any bits.
    dcr.apply_delta({"w": w}, dcr.encode_delta(None, {"w": target}, full=True))
    assert raw(w) == raw(target)
    del w
    assert path.read_bytes() == raw(target)
