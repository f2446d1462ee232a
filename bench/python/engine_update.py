"""Engine updates through dcr.torch.EngineReceiver: in place at the changed elements against a
rewrite of every placed element of each changed tensor, in the same run.

    PYTHONPATH=python:tests/python DCR_LIBRARY=build/libdcr.so /usr/bin/python3 \
        bench/python/engine_update.py [--rates 0.01,0.1] [--updates 4] [--threads 1] [--scale 1]

The toy engine of tests/python (fused QKV with GQA, merged gate/up, row-parallel narrow(1),
padded vocabulary with tied head, stacked MoE experts, a converted norm, FP8 with block scales) at
about 8.3M elements x scale, seeded BF16 weights; a chain of `updates` versions, each with about
`rate` of the elements of every tensor moved by a few ulps. Every variant applies the same chain
to its own engine (time per update: median and min over the chain; every engine is compared byte for byte with a dense
load of the last version at the end):
  * in_place:      EngineReceiver.apply (dcr_apply_delta_placed: the delta on the canonical copy,
                   then the new bits of the changed elements alone into the engine);
  * rewrite_c:     the delta on the canonical copy (dcr.apply_delta), a per-tensor hash to find
                   the changed tensors, then every placed element of those rewritten from the
                   canonical copy through the same placement map (dcr_placement_map_write);
  * rewrite_torch: the same rewrite as a torch gather/scatter over the recorded index arrays.
Bytes written are engine bytes (converted tensors re-loaded by the engine not counted: the same
for every variant).
"""

import argparse
import json
import time

import torch

import dcr
from dcr import codec
from dcr.torch import EngineReceiver, PlacementRecorder
from toy_engine import FP8, Config, ToyEngine, checkpoint

_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t):
    flat = t.reshape(-1)
    return flat.view(_INT[flat.element_size()])


def step(ck, rate, gen):
    out = {}
    for k, v in ck.items():
        if v.dtype == torch.uint8 or v.dtype == torch.float32:
            b = bits(v).clone()
            m = torch.rand(b.numel(), generator=gen) < rate
            b[m] ^= 1
        else:
            b = bits(v).clone()
            m = torch.rand(b.numel(), generator=gen) < rate
            b[m] += torch.randint(1, 3, (int(m.sum()),), generator=gen).to(b.dtype)
        out[k] = b.view(v.dtype).reshape(v.shape)
    return out


class Rewrite:
    """The rewrite baselines over one engine: apply to the canonical copy, find the changed
    tensors by hash, rewrite their placements (through the C map, or torch index arrays)."""

    def __init__(self, engine, base, use_torch):
        self.e, self.use_torch = engine, use_torch
        self.params = engine.params()
        self.canonical = {k: v.clone() for k, v in base.items()}
        rec = PlacementRecorder(self.params, self.canonical)
        with torch.no_grad(), rec:
            engine.load_weights(iter(list(self.canonical.items())))
        self.placements, self.converted = rec.result()
        self.map = codec.PlacementMap(
            self.canonical, [(p.tensor, self.params[p.param], p.src, p.dst)
                             for p in self.placements], dtypes=FP8)
        self.hash = dcr.tensors_hash(self.canonical, dtypes=FP8)
        self.tensor_hash = self.hashes()

    def hashes(self):
        return {n: dcr.tensors_hash({n: t}, dtypes={n: FP8[n]} if n in FP8 else None)
                for n, t in self.canonical.items()}

    def apply(self, delta, threads):
        r = dcr.apply_delta_stats(self.canonical, delta, threads=threads,
                                  known_base_hash=self.hash, dtypes=FP8)
        self.hash = r.target_hash
        h = self.hashes()
        changed = {n for n in h if h[n] != self.tensor_hash[n]}
        self.tensor_hash = h
        written = 0
        if self.use_torch:
            with torch.no_grad():
                for p in self.placements:
                    if p.tensor in changed:
                        bits(self.params[p.param].data)[p.dst] = bits(self.canonical[p.tensor])[
                            p.src]
                        written += p.dst.numel() * self.canonical[p.tensor].element_size()
        else:
            for n, k in self.map.write(self.canonical, sorted(changed), threads).items():
                written += k * self.canonical[n].element_size()
        conv = [n for n in self.converted if n in changed]
        if conv:
            self.e.load_weights([(n, self.canonical[n]) for n in conv])
        return written


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default="0.01,0.1")
    ap.add_argument("--updates", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--scale", type=int, default=1)
    a = ap.parse_args()
    s = a.scale
    cfg = Config(vocab=4096 * s, hidden=512, heads=8, kv_heads=2, head_dim=64, inter=1536 * s,
                 experts=4, fp8_rows=512)
    g = torch.Generator()
    g.manual_seed(1)
    base = checkpoint(cfg, g)
    elements = sum(v.numel() for v in base.values())
    out = []
    for rate in [float(x) for x in a.rates.split(",")]:
        chain = [base]
        for _ in range(a.updates):
            chain.append(step(chain[-1], rate, g))
        deltas = [dcr.encode_delta(chain[i], chain[i + 1], dtypes=FP8, base_version=i,
                                   target_version=i + 1, threads=a.threads)
                  for i in range(a.updates)]
        row = {"elements": elements, "rate": rate, "updates": a.updates, "threads": a.threads,
               "delta_bytes": sum(len(d) for d in deltas) // a.updates}
        engines = {}
        for name in ("in_place", "rewrite_c", "rewrite_torch"):
            e = ToyEngine(cfg)
            if name == "in_place":
                rx = EngineReceiver(e.params(), e.load_weights, base, dtypes=FP8)

                def run(d, rx=rx):
                    rx.apply(d, threads=a.threads)
                    return rx.last_update["written_bytes"]
            else:
                rw = Rewrite(e, base, name == "rewrite_torch")

                def run(d, rw=rw):
                    return rw.apply(d, a.threads)
            ts, written = [], 0
            for d in deltas:
                t0 = time.perf_counter()
                written += run(d)
                ts.append(time.perf_counter() - t0)
            ts.sort()
            row[name + "_median_s"] = round(ts[len(ts) // 2], 5)
            row[name + "_min_s"] = round(ts[0], 5)
            row[name + "_written_bytes"] = written // a.updates
            engines[name] = e
        ref = ToyEngine(cfg)
        ref.load_weights(chain[-1].items())
        for name, e in engines.items():
            for k, p in ref.params().items():
                if not torch.equal(bits(p.data), bits(e.params()[k].data)):
                    raise SystemExit("%s: parameter %s differs from the dense load" % (name, k))
        row["byte_exact"] = True
        out.append(row)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
