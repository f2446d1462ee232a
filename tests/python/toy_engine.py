"""A toy inference engine (CPU torch) whose loader follows the patterns real engines use.

Its ``load_weights(iterable of (name, tensor))`` takes a Hugging Face style checkpoint and places
it the way vLLM/SGLang loaders do:
  * fused QKV with grouped-query attention (q, k, v rows into one parameter, sharded by head);
  * merged gate/up (two column-parallel halves of one parameter);
  * row-parallel o_proj and down_proj (``narrow(1, ...)`` of the source: a non-contiguous copy);
  * a vocab-parallel embedding padded to a multiple of 8 rows (padding zero-filled) and an
    lm_head tied to it (one Parameter under two names; the checkpoint has no lm_head);
  * stacked MoE experts written with ``param.data[e] = w`` (setitem);
  * one converted tensor: the layernorm weight, BF16 in the checkpoint, cast to FP32;
  * FP8 (E4M3, carried as uint8) weights with FP32 per-block scales (block 16 x 16);
  * tensor parallelism: rank r of ``tp`` holds its shard (two instances make TP=2).
"""

import torch

from conftest import raw

FP8 = {"layers.0.fp8_proj.weight": "F8_E4M3"}


class Config:
    def __init__(self, vocab=50, hidden=32, heads=4, kv_heads=2, head_dim=8, inter=48,
                 experts=3, fp8_rows=64):
        self.vocab, self.hidden, self.heads, self.kv_heads = vocab, hidden, heads, kv_heads
        self.head_dim, self.inter, self.experts, self.fp8_rows = head_dim, inter, experts, fp8_rows


def checkpoint(cfg, gen):
    """A random canonical checkpoint of the model (BF16 weights, FP8 as uint8, FP32 scales)."""
    h, d = cfg.hidden, cfg.head_dim

    def w(*shape):
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    ck = {
        "model.embed_tokens.weight": w(cfg.vocab, h),
        "layers.0.self_attn.q_proj.weight": w(cfg.heads * d, h),
        "layers.0.self_attn.k_proj.weight": w(cfg.kv_heads * d, h),
        "layers.0.self_attn.v_proj.weight": w(cfg.kv_heads * d, h),
        "layers.0.self_attn.o_proj.weight": w(h, cfg.heads * d),
        "layers.0.mlp.gate_proj.weight": w(cfg.inter, h),
        "layers.0.mlp.up_proj.weight": w(cfg.inter, h),
        "layers.0.mlp.down_proj.weight": w(h, cfg.inter),
        "layers.0.input_layernorm.weight": (1 + torch.randn(h, generator=gen) * 0.05).to(
            torch.bfloat16),
        "layers.0.fp8_proj.weight": torch.randint(0, 256, (cfg.fp8_rows, h), dtype=torch.uint8,
                                                  generator=gen),
        "layers.0.fp8_proj.weight_scale_inv": torch.rand(cfg.fp8_rows // 16, h // 16,
                                                         generator=gen),
    }
    for e in range(cfg.experts):
        ck["layers.0.moe.experts.%d.w1.weight" % e] = w(cfg.inter, h)
    return ck


class ToyEngine(torch.nn.Module):
    def __init__(self, cfg, rank=0, tp=1):
        super().__init__()
        self.cfg, self.rank, self.tp = cfg, rank, tp
        h, d = cfg.hidden, cfg.head_dim
        assert cfg.heads % tp == 0 and cfg.kv_heads % tp == 0 and cfg.inter % tp == 0
        padded = (cfg.vocab + 8 * tp - 1) // (8 * tp) * (8 * tp)
        self.vocab_per_rank = padded // tp
        self.q_rows = cfg.heads // tp * d
        self.kv_rows = cfg.kv_heads // tp * d
        self.inter_rank = cfg.inter // tp
        bf = torch.bfloat16

        def p(*shape, dtype=bf):
            return torch.nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)

        self.embed = p(self.vocab_per_rank, h)
        self.lm_head = self.embed  # tied
        self.qkv = p(self.q_rows + 2 * self.kv_rows, h)
        self.o_proj = p(h, self.q_rows)
        self.gate_up = p(2 * self.inter_rank, h)
        self.down = p(h, self.inter_rank)
        self.experts_w1 = p(cfg.experts, self.inter_rank, h)
        self.norm = p(h, dtype=torch.float32)
        self.fp8_w = p(cfg.fp8_rows, h, dtype=torch.uint8)
        self.fp8_scale = p(cfg.fp8_rows // 16, h // 16, dtype=torch.float32)

    def params(self):
        """name -> parameter, tied ones under both names."""
        out = dict(self.named_parameters())
        out["lm_head"] = self.lm_head
        return out

    def load_weights(self, weights):
        r = self.rank
        for name, w in weights:
            if name == "model.embed_tokens.weight":
                lo = r * self.vocab_per_rank
                n = max(0, min(self.vocab_per_rank, self.cfg.vocab - lo))
                self.embed.data[n:].fill_(0)  # padding rows
                if n:
                    self.embed.data.narrow(0, 0, n).copy_(w.narrow(0, lo, n))
            elif name.endswith("q_proj.weight"):
                self.qkv.data.narrow(0, 0, self.q_rows).copy_(
                    w.narrow(0, r * self.q_rows, self.q_rows))
            elif name.endswith("k_proj.weight"):
                self.qkv.data.narrow(0, self.q_rows, self.kv_rows).copy_(
                    w.narrow(0, r * self.kv_rows, self.kv_rows))
            elif name.endswith("v_proj.weight"):
                self.qkv.data.narrow(0, self.q_rows + self.kv_rows, self.kv_rows).copy_(
                    w.narrow(0, r * self.kv_rows, self.kv_rows))
            elif name.endswith("o_proj.weight"):
                self.o_proj.data.copy_(w.narrow(1, r * self.q_rows, self.q_rows))
            elif name.endswith("gate_proj.weight") or name.endswith("up_proj.weight"):
                half = 0 if "gate" in name else 1
                n = self.inter_rank
                self.gate_up.data[half * n:(half + 1) * n] = w.narrow(0, r * n, n)
            elif name.endswith("down_proj.weight"):
                n = self.inter_rank
                self.down.data.copy_(w.narrow(1, r * n, n))
            elif ".moe.experts." in name:
                e = int(name.split(".")[4])
                n = self.inter_rank
                self.experts_w1.data[e] = w.narrow(0, r * n, n)
            elif name.endswith("input_layernorm.weight"):
                self.norm.data.copy_(w.to(torch.float32))  # converted: a cast
            elif name == "layers.0.fp8_proj.weight":
                self.fp8_w.data.copy_(w)
            elif name == "layers.0.fp8_proj.weight_scale_inv":
                self.fp8_scale.data.copy_(w)
            else:
                raise KeyError("toy engine: unexpected weight %s" % name)

    @torch.no_grad()
    def logits(self, tokens):
        """A tiny forward pass (TP=1): embedding, norm, attention-free MLP, tied head."""
        x = self.embed[tokens].float()
        x = x * self.norm
        g, u = self.gate_up.float().chunk(2)
        x = x + torch.nn.functional.silu(x @ g.t()) * (x @ u.t()) @ self.down.float().t()
        return x @ self.lm_head.float().t()

    @torch.no_grad()
    def generate(self, prompt, steps):
        out = list(prompt)
        for _ in range(steps):
            logits = self.logits(torch.tensor(out))[-1, :self.cfg.vocab]
            out.append(int(logits.argmax()))
        return out


def dense(cfg, ck, rank, tp):
    """A ToyEngine of rank `rank` of `tp` loaded densely from the checkpoint `ck`: the reference."""
    e = ToyEngine(cfg, rank, tp)
    e.load_weights(ck.items())
    return e


def same_params(a, b):
    """Asserts that two engines hold the same parameters, byte for byte."""
    pa, pb = a.params(), b.params()
    assert pa.keys() == pb.keys()
    for k in pa:
        assert raw(pa[k].data) == raw(pb[k].data), k
