"""End to end: a trainer process runs a few GRPO-like steps of a small PyTorch model (AdamW on FP32
masters, BF16 weights published) and sends each version as a dcr delta to two rollout workers,
each a toy engine in its own process behind dcr.torch.EngineReceiver. After every step each worker
generates with its weights and compares every parameter with a dense load of the trainer's
checkpoint file of that step, byte for byte.

    PYTHONPATH=python DCR_LIBRARY=build/libdcr.so /usr/bin/python3 tests/python/e2e_grpo.py [--steps N]

Prints one line per step and worker; exits 1 on any difference.
"""

import argparse
import multiprocessing as mp
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import dcr  # noqa: E402
from conftest import raw, read_safetensors, write_safetensors  # noqa: E402
from toy_engine import FP8, Config, ToyEngine, checkpoint  # noqa: E402

TRAINED = [  # canonical tensors the trainer updates (the FP8 projection stays frozen)
    "model.embed_tokens.weight", "layers.0.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight", "layers.0.self_attn.v_proj.weight",
    "layers.0.self_attn.o_proj.weight", "layers.0.mlp.gate_proj.weight",
    "layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight",
    "layers.0.input_layernorm.weight",
]


def load_file(path):
    """A safetensors file as name -> tensor (BF16, F32, U8 for F8_E4M3)."""
    dt = {"BF16": torch.bfloat16, "F32": torch.float32, "F8_E4M3": torch.uint8}
    out = {}
    for name, (dtype, shape, data) in read_safetensors(path).items():
        t = torch.frombuffer(bytearray(data), dtype=dt[dtype]) if data else torch.empty(
            0, dtype=dt[dtype])
        out[name] = t.reshape(shape)
    return out


def forward(m, tokens, cfg):
    """Logits of the policy on FP32 masters (the toy engine's forward plus attention and MoE
    experts as extra MLP paths, so every trained tensor gets a gradient)."""
    e = m["model.embed_tokens.weight"]
    x = e[tokens] * m["layers.0.input_layernorm.weight"]
    q = x @ m["layers.0.self_attn.q_proj.weight"].t()
    k = x @ m["layers.0.self_attn.k_proj.weight"].t()
    v = x @ m["layers.0.self_attn.v_proj.weight"].t()
    rep = q.shape[-1] // k.shape[-1]
    att = torch.softmax((q * k.repeat(1, rep)).sum(-1, keepdim=True).expand(-1, x.shape[0]), -1)
    x = x + (att @ v.repeat(1, rep)) @ m["layers.0.self_attn.o_proj.weight"].t()
    g = torch.nn.functional.silu(x @ m["layers.0.mlp.gate_proj.weight"].t())
    x = x + (g * (x @ m["layers.0.mlp.up_proj.weight"].t())) @ m[
        "layers.0.mlp.down_proj.weight"].t()
    return x @ e.t()


def trainer(cfg, steps, conns, workdir):
    torch.manual_seed(0)  # the sampling of completions
    g = torch.Generator()
    g.manual_seed(0)
    ck = checkpoint(cfg, g)
    masters = {k: v.float().clone().requires_grad_(k in TRAINED) for k, v in ck.items()
               if k in TRAINED}
    opt = torch.optim.AdamW(list(masters.values()), lr=3e-3, weight_decay=0.01)

    def publish():
        out = dict(ck)
        for k, v in masters.items():
            out[k] = v.detach().to(torch.bfloat16)
        return out

    cur = publish()
    for c in conns:
        c.send(("base", {k: v.clone() for k, v in cur.items()}))
    for step in range(1, steps + 1):
        # GRPO-like: a group of sampled completions per prompt, reward = share of even tokens,
        # advantage = reward - group mean, loss = -advantage * log-prob of the sample.
        loss = 0
        for prompt in ([1, 2, 3], [4, 5]):
            rewards, logps = [], []
            for _ in range(4):
                toks = list(prompt)
                lp = 0
                for _ in range(4):
                    logits = forward(masters | {k: v for k, v in ck.items() if k not in masters},
                                     torch.tensor(toks), cfg)[-1, :cfg.vocab]
                    dist = torch.distributions.Categorical(logits=logits.float())
                    t = dist.sample()
                    lp = lp + dist.log_prob(t)
                    toks.append(int(t))
                rewards.append(sum(1.0 for t in toks[len(prompt):] if t % 2 == 0) / 4)
                logps.append(lp)
            r = torch.tensor(rewards)
            adv = r - r.mean()
            loss = loss - sum(a * l for a, l in zip(adv, logps))
        opt.zero_grad()
        loss.backward()
        opt.step()
        nxt = publish()
        path = os.path.join(workdir, "step-%d.safetensors" % step)
        write_safetensors(path, nxt, FP8)
        delta = dcr.encode_delta(cur, nxt, dtypes=FP8, base_version=step - 1,
                                 target_version=step)
        changed = sum(int((raw(cur[k]) != raw(nxt[k]))) for k in cur)
        for c in conns:
            c.send(("delta", step, delta, path))
        print("trainer: step %d published, %d of %d tensors changed, delta %d bytes"
              % (step, changed, len(cur), len(delta)), flush=True)
        cur = nxt
    for c in conns:
        c.send(("stop",))


def worker(rank, cfg, conn, results):
    from dcr.torch import EngineReceiver
    engine = ToyEngine(cfg)
    msg = conn.recv()
    rx = EngineReceiver(engine.params(), engine.load_weights, msg[1], dtypes=FP8)
    ok = True
    log = []
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            break
        _, step, delta, path = msg
        rx.apply(delta)
        rx.check_serving()
        sample = engine.generate([1, 2, 3], 4)
        ref = ToyEngine(cfg)
        ref.load_weights(load_file(path).items())
        diff = [k for k, p in engine.params().items() if raw(p.data) != raw(ref.params()[k].data)]
        ok = ok and not diff and sample == ref.generate([1, 2, 3], 4)
        log.append("worker %d: step %d v%d %s, generated %s" % (
            rank, step, rx.version, "byte-equal to a dense load" if not diff else
            "DIFFERS in %s" % diff, sample[3:]))
    results.put((rank, ok, log))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    cfg = Config()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as workdir:
        pipes = [ctx.Pipe() for _ in range(2)]
        procs = [ctx.Process(target=worker, args=(r, cfg, pipes[r][1], results))
                 for r in range(2)]
        for p in procs:
            p.start()
        trainer(cfg, a.steps, [p[0] for p in pipes], workdir)
        got = {}
        for _ in procs:
            rank, ok, log = results.get(timeout=120)
            got[rank] = ok
            print("\n".join(log), flush=True)
        for p in procs:
            p.join(timeout=60)
    ok = all(got.get(r) for r in range(2)) and all(p.exitcode == 0 for p in procs)
    print("e2e: %s" % ("every worker byte-equal at every step" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
