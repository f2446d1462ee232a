"""Apply rate of a delta through the Python package against the C path, in the same run.

    PYTHONPATH=python DCR_LIBRARY=build/libdcr.so /usr/bin/python3 bench/python/apply_rate.py \
        [--elements N] [--rate R] [--threads T] [--dcr build/dcr]

A seeded BF16 tensor set (N elements over 8 tensors) and a target with about R of its elements
changed by a few ulps; the delta is applied (best of 5, fresh base copy each time):
  * python, hashed:  dcr.apply_delta(tensors, delta) (hashes the tensors first: the full check);
  * python, chained: the same with known_base_hash (what a receiver applying version after
    version does);
  * host device, hashed / chained: the same two calls with device="host": the device path of the
    C API (hash by Device::RangeHash, gather/scatter of the changes) on dcr's host backend, the
    code a CUDA tensor runs with the CPU doing the device's work;
  * cuda, hashed / chained (only where torch.cuda.is_available()): the same on CUDA tensors by
    device pointer; the base copy is made on the GPU before the clock starts;
  * C, file:         `dcr apply base.safetensors delta -o out.safetensors` (maps the base, copies
    it to the output, applies, hashes; process start included).
Rates are dense BF16 bytes of the model per second.
"""

import argparse
import json
import os
import struct
import subprocess
import tempfile
import time

import torch

import dcr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--elements", type=int, default=1 << 25)
    ap.add_argument("--rate", type=float, default=0.03)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dcr", default="build/dcr")
    a = ap.parse_args()
    g = torch.Generator()
    g.manual_seed(1)
    per = a.elements // 8
    base = {"layer.%d.weight" % i: (torch.randn(per, generator=g) * 0.02).to(torch.bfloat16)
            for i in range(8)}
    target = {}
    for k, v in base.items():
        bits = v.view(torch.int16).clone()
        m = torch.rand(per, generator=g) < a.rate
        bits[m] += torch.randint(-2, 3, (int(m.sum()),), generator=g).to(torch.int16)
        target[k] = bits.view(torch.bfloat16)
    delta = dcr.encode_delta(base, target, threads=a.threads)
    dense = a.elements * 2
    h = dcr.tensors_hash(base)

    def best(fn):
        ts = []
        for _ in range(5):
            live = {k: v.clone() for k, v in base.items()}
            t0 = time.perf_counter()
            fn(live)
            ts.append(time.perf_counter() - t0)
        return min(ts)

    res = {"elements": a.elements, "rate": a.rate, "threads": a.threads, "delta_bytes": len(delta)}
    res["python_hashed_s"] = best(lambda t: dcr.apply_delta(t, delta, threads=a.threads))
    res["python_chained_s"] = best(
        lambda t: dcr.apply_delta(t, delta, threads=a.threads, known_base_hash=h))
    res["host_device_hashed_s"] = best(
        lambda t: dcr.apply_delta(t, delta, threads=a.threads, device="host"))
    res["host_device_chained_s"] = best(
        lambda t: dcr.apply_delta(t, delta, threads=a.threads, known_base_hash=h, device="host"))
    kinds = ["python_hashed", "python_chained", "host_device_hashed", "host_device_chained"]
    if torch.cuda.is_available():
        gbase = {k: v.cuda() for k, v in base.items()}

        def best_cuda(fn):
            ts = []
            for _ in range(5):
                live = {k: v.clone() for k, v in gbase.items()}
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn(live)
                ts.append(time.perf_counter() - t0)
            return min(ts)

        res["cuda_device"] = torch.cuda.get_device_name(0)
        res["cuda_hashed_s"] = best_cuda(lambda t: dcr.apply_delta(t, delta, threads=a.threads))
        res["cuda_chained_s"] = best_cuda(
            lambda t: dcr.apply_delta(t, delta, threads=a.threads, known_base_hash=h))
        kinds += ["cuda_hashed", "cuda_chained"]
    with tempfile.TemporaryDirectory() as d:
        header, blobs, off = {}, [], 0
        for k in sorted(base):
            b = base[k].view(torch.int16).numpy().tobytes()
            header[k] = {"dtype": "BF16", "shape": [per], "data_offsets": [off, off + len(b)]}
            blobs.append(b)
            off += len(b)
        hj = json.dumps(header, separators=(",", ":")).encode()
        hj += b" " * ((8 - len(hj) % 8) % 8)
        bp = os.path.join(d, "base.safetensors")
        with open(bp, "wb") as f:
            f.write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))
        dp = os.path.join(d, "d.dcr")
        ordered = {k: target[k] for k in sorted(target)}
        with open(dp, "wb") as f:
            f.write(dcr.encode_delta({k: base[k] for k in sorted(base)}, ordered))
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            subprocess.run([a.dcr, "apply", bp, dp, "-o", os.path.join(d, "out.safetensors"),
                            "-q", "--threads", str(a.threads)], check=True)
            ts.append(time.perf_counter() - t0)
        res["c_file_s"] = min(ts)
    for k in kinds + ["c_file"]:
        res[k + "_gbps"] = round(dense / res[k + "_s"] / 1e9, 2)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
