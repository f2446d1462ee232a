#!/usr/bin/python3
"""Context-coded delta sizes on real PyTorch AdamW checkpoints, against bound0 and bound2.

Trains a small model (a 4-layer GELU MLP with LayerNorm, 2.17M parameters, regressing a fixed
random teacher on fresh Gaussian batches) with torch.optim.AdamW on FP32 master weights, and
saves the BF16 cast of the weights (round to nearest even, as torch's .to(torch.bfloat16)) after
each of a few consecutive steps as .safetensors (written directly: the safetensors package is not
needed). For each consecutive pair it runs

    dcr diff BASE TARGET -o DELTA --wan-context      (and without --wan-context)
    dcr inspect DELTA --base BASE --json

and prints the delta's size against bound0 (order-0 positions + XOR values) and bound2
(positions and ulp values conditioned on the base element's exponent), both computed by
`dcr inspect` on the pair itself. Deterministic for a given torch build (seeded, one thread).

Usage: bench/real_checkpoints.py [--dcr build/dcr] [--dir DIR] [--steps 4] [--warmup 20]
                                 [--lr 3e-6] [--hidden 768] [--json OUT]
Needs Debian's python3-torch (torch 1.13); takes about a minute on two loaded cores.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import torch


def save_bf16_safetensors(path, named):
    """Writes {name: tensor} as BF16 .safetensors (8-byte header length, JSON header, data)."""
    header, blobs, offset = {}, [], 0
    for name, t in named:
        raw = t.detach().to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


class Mlp(torch.nn.Module):
    def __init__(self, d_in, hidden, d_out, layers):
        super().__init__()
        dims = [d_in] + [hidden] * layers
        self.blocks = torch.nn.ModuleList()
        for a, b in zip(dims[:-1], dims[1:]):
            self.blocks.append(torch.nn.Sequential(torch.nn.Linear(a, b), torch.nn.LayerNorm(b),
                                                   torch.nn.GELU()))
        self.head = torch.nn.Linear(hidden, d_out)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dcr", default="build/dcr")
    ap.add_argument("--dir", default=None, help="where checkpoints and deltas go (default: a temp dir)")
    ap.add_argument("--steps", type=int, default=4, help="consecutive saved steps (pairs = steps - 1)")
    ap.add_argument("--warmup", type=int, default=20, help="optimizer steps before the first save")
    ap.add_argument("--lr", type=float, default=3e-6)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--json", default=None, help="write the rows as JSON here")
    a = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    d_in, d_out, layers, batch = 256, 256, 4, 256
    model = Mlp(d_in, a.hidden, d_out, layers)
    teacher = Mlp(d_in, 256, d_out, 2)
    for p in teacher.parameters():
        p.requires_grad_(False)
    # AdamW's defaults (betas 0.9/0.999, eps 1e-8) with decoupled weight decay 0.01.
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    params = sum(p.numel() for p in model.parameters())
    out_dir = a.dir or tempfile.mkdtemp(prefix="dcr-real-")
    os.makedirs(out_dir, exist_ok=True)

    def step():
        x = torch.randn(batch, d_in)
        loss = torch.nn.functional.mse_loss(model(x), teacher(x))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(a.warmup):
        step()
    paths = []
    for s in range(a.steps):
        if s > 0:
            step()
        path = os.path.join(out_dir, f"step{s}.safetensors")
        save_bf16_safetensors(path, list(model.named_parameters()))
        paths.append(path)

    rows = []
    for i in range(len(paths) - 1):
        base, target = paths[i], paths[i + 1]
        row = {"pair": f"step{i}->step{i + 1}"}
        for ctx in (False, True):
            delta = os.path.join(out_dir, f"d{i}{'_ctx' if ctx else ''}.dcr")
            run([a.dcr, "diff", base, target, "-o", delta] + (["--wan-context"] if ctx else []))
            tot = json.loads(run([a.dcr, "inspect", delta, "--base", base, "--json"]))["total"]
            key = "context" if ctx else "plain"
            row[key + "_bytes"] = tot["payload_bytes"]
            row["change_rate"] = tot["change_rate"]
            row["dense_bytes"] = tot["dense_bytes"]
            row["bound0_bytes"] = tot["bound_bytes"]
            row["bound2_bytes"] = tot["bound2_bytes"]
        row["context_vs_bound2"] = row["context_bytes"] / row["bound2_bytes"]
        row["context_vs_bound0"] = row["context_bytes"] / row["bound0_bytes"]
        row["plain_vs_bound0"] = row["plain_bytes"] / row["bound0_bytes"]
        rows.append(row)

    print(f"{params} parameters ({params * 2} bytes BF16), AdamW lr {a.lr:g}, wd 0.01, "
          f"{a.warmup} warm-up steps, torch {torch.__version__}; files in {out_dir}\n")
    print("| pair | changed | plain bytes | context bytes | bound0 bytes | bound2 bytes | "
          "context / bound2 | context / bound0 | plain / bound0 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['pair']} | {100 * r['change_rate']:.2f}% | {r['plain_bytes']} | "
              f"{r['context_bytes']} | {r['bound0_bytes']:.0f} | {r['bound2_bytes']:.0f} | "
              f"{r['context_vs_bound2']:.3f} | {r['context_vs_bound0']:.3f} | "
              f"{r['plain_vs_bound0']:.3f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"parameters": params, "lr": a.lr, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
