// Training layouts and the placement of parameters on model-parallel ranks.
#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "dcr/status_macros.h"
#include "dcr/train.h"
#include "train/train_internal.h"

namespace dcr {

namespace internal {

uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

uint64_t HashString(const std::string& s) {
  uint64_t h = 0x243F6A8885A308D3ULL;
  for (unsigned char c : s) h = Mix64(h ^ c);
  return h;
}

namespace {
bool StartsWith(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
}  // namespace

TensorPlacement PlaceTensor(const TrainStructure& s, const TensorSpec& t) {
  TensorPlacement p;
  const std::string& n = t.name;
  const int last = s.layout().pp - 1;
  if (!StartsWith(n, "model.layers.")) {
    if (n == "model.embed_tokens.weight") {
      p.kind = ParamKind::kVocab;
      p.param = p.global = "embedding.word_embeddings.weight";
    } else if (n == "lm_head.weight") {
      p.kind = ParamKind::kVocab;
      p.stage = last;
      p.param = p.global = "output_layer.weight";
    } else if (n == "model.norm.weight") {
      p.kind = ParamKind::kNorm;
      p.stage = last;
      p.param = p.global = "decoder.final_layernorm.weight";
    } else {
      p.kind = t.shape.size() == 1 && n.find("norm") != std::string::npos ? ParamKind::kNorm
                                                                          : ParamKind::kReplicated;
      p.param = p.global = "extra." + n;
    }
    return p;
  }
  const std::string rest = n.substr(std::string("model.layers.").size());
  const size_t dot = rest.find('.');
  p.layer = std::strtoll(rest.substr(0, dot).c_str(), nullptr, 10);
  const std::string suf = rest.substr(dot + 1);
  p.stage = s.StageOfLayer(p.layer);
  const std::string lp =
      "decoder.layers." + std::to_string(p.layer - s.FirstLayerOfStage(p.stage)) + ".";
  const std::string gp = "decoder.layers#" + std::to_string(p.layer) + ".";
  std::string local;
  const ModelConfig& c = s.config();
  if (suf == "input_layernorm.weight") {
    p.kind = ParamKind::kNorm;
    local = "input_layernorm.weight";
  } else if (suf == "post_attention_layernorm.weight") {
    p.kind = ParamKind::kNorm;
    local = "pre_mlp_layernorm.weight";
  } else if (!s.is_mla() && (suf == "self_attn.q_proj.weight" || suf == "self_attn.k_proj.weight" ||
                             suf == "self_attn.v_proj.weight")) {
    p.kind = ParamKind::kQkv;
    p.part = suf[10] == 'q' ? 0 : suf[10] == 'k' ? 1 : 2;
    local = "self_attention.linear_qkv.weight";
  } else if (suf == "self_attn.o_proj.weight") {
    p.kind = ParamKind::kRow;
    local = "self_attention.linear_proj.weight";
  } else if (suf == "self_attn.q_b_proj.weight" || suf == "self_attn.kv_b_proj.weight" ||
             (s.is_mla() && suf == "self_attn.q_proj.weight")) {
    p.kind = ParamKind::kColumn;
    local = "hf." + suf;
  } else if (suf == "mlp.gate_proj.weight" || suf == "mlp.up_proj.weight") {
    p.kind = ParamKind::kFc1;
    p.part = suf == "mlp.up_proj.weight" ? 1 : 0;
    local = "mlp.linear_fc1.weight";
  } else if (suf == "mlp.down_proj.weight") {
    const int64_t dense_from_end = [&]() {
      int64_t k = 0;  // dense-MLP layers after this one
      for (int64_t i = p.layer + 1; i < c.layers; ++i)
        k += (c.is_moe() && i >= c.first_dense_layers) ? 0 : 1;
      return k;
    }();
    p.kind = dense_from_end < s.layout().fold_layers ? ParamKind::kFold : ParamKind::kRow;
    local = "mlp.linear_fc2.weight";
    if (p.kind == ParamKind::kFold) p.scale_param = lp + "mlp.linear_fc2.output_scale";
  } else if (suf == "mlp.gate.weight") {
    p.kind = ParamKind::kReplicated;
    local = "mlp.router.weight";
  } else if (suf == "mlp.gate.e_score_correction_bias") {
    p.kind = ParamKind::kReplicated;
    local = "mlp.router.expert_bias";
  } else if (StartsWith(suf, "mlp.experts.")) {
    const std::string er = suf.substr(std::string("mlp.experts.").size());
    const size_t d2 = er.find('.');
    p.expert = std::strtoll(er.substr(0, d2).c_str(), nullptr, 10);
    const std::string w = er.substr(d2 + 1);
    if (w == "down_proj.weight") {
      p.kind = ParamKind::kExpertW2;
      local = "mlp.experts.weight2";
    } else {
      p.kind = ParamKind::kExpertW1;
      p.part = w == "up_proj.weight" ? 1 : 0;
      local = "mlp.experts.weight1";
    }
  } else if (suf == "mlp.shared_experts.gate_proj.weight" ||
             suf == "mlp.shared_experts.up_proj.weight") {
    p.kind = ParamKind::kFc1;
    p.part = suf == "mlp.shared_experts.up_proj.weight" ? 1 : 0;
    local = "mlp.shared_experts.linear_fc1.weight";
  } else if (suf == "mlp.shared_experts.down_proj.weight") {
    p.kind = ParamKind::kRow;
    local = "mlp.shared_experts.linear_fc2.weight";
  } else if (suf == "self_attn.q_norm.weight") {
    p.kind = ParamKind::kNorm;
    local = "self_attention.q_layernorm.weight";
  } else if (suf == "self_attn.k_norm.weight") {
    p.kind = ParamKind::kNorm;
    local = "self_attention.k_layernorm.weight";
  } else {
    p.kind = t.shape.size() == 1 && suf.find("norm") != std::string::npos ? ParamKind::kNorm
                                                                          : ParamKind::kReplicated;
    local = "hf." + suf;
  }
  p.param = lp + local;
  p.global = gp + local;
  return p;
}

}  // namespace internal

using internal::ParamKind;
using internal::TensorPlacement;

// ---- layout text ----

StatusOr<TrainLayout> TrainLayout::Parse(const std::string& text) {
  TrainLayout l;
  std::string clean;
  for (char ch : text) {
    if (ch != ' ' && ch != '\t' && ch != '\n') clean += ch;
  }
  std::stringstream ss(clean);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      return InvalidArgumentError("layout: '" + item + "' is not key=value");
    }
    const std::string key = item.substr(0, eq), val = item.substr(eq + 1);
    char* end = nullptr;
    const long long v = std::strtoll(val.c_str(), &end, 10);
    if (val.empty() || *end != '\0') {
      return InvalidArgumentError("layout: value of '" + key + "' must be an integer, got '" + val +
                                  "'");
    }
    if (v < -(1LL << 30) || v > (1LL << 30)) {
      return InvalidArgumentError("layout: value of '" + key + "' is out of range: " + val);
    }
    auto boolean = [&](bool* out) -> Status {
      if (v != 0 && v != 1) return InvalidArgumentError("layout: '" + key + "' must be 0 or 1");
      *out = v == 1;
      return Status::OK();
    };
    if (key == "tp") {
      l.tp = static_cast<int>(v);
    } else if (key == "pp") {
      l.pp = static_cast<int>(v);
    } else if (key == "ep") {
      l.ep = static_cast<int>(v);
    } else if (key == "dp") {
      l.dp = static_cast<int>(v);
    } else if (key == "dist_opt") {
      DCR_RETURN_IF_ERROR(boolean(&l.dist_opt));
    } else if (key == "tied") {
      if (v < -1 || v > 1) return InvalidArgumentError("layout: 'tied' must be -1, 0 or 1");
      l.tied = static_cast<int>(v);
    } else if (key == "fp32_norms") {
      DCR_RETURN_IF_ERROR(boolean(&l.fp32_norms));
    } else if (key == "rope_permute") {
      DCR_RETURN_IF_ERROR(boolean(&l.rope_permute));
    } else if (key == "fold_layers") {
      l.fold_layers = static_cast<int>(v);
    } else if (key == "vocab_pad") {
      l.vocab_pad = v;
    } else if (key == "bucket_align") {
      l.bucket_align = v;
    } else {
      return InvalidArgumentError(
          "layout: unknown key '" + key +
          "' (known: tp, pp, ep, dp, dist_opt, tied, fp32_norms, rope_permute, fold_layers, "
          "vocab_pad, bucket_align)");
    }
  }
  return l;
}

std::string TrainLayout::ToString() const {
  std::ostringstream o;
  o << "tp=" << tp << ",pp=" << pp << ",ep=" << ep << ",dp=" << dp << ",dist_opt=" << dist_opt
    << ",tied=" << tied << ",fp32_norms=" << fp32_norms << ",rope_permute=" << rope_permute
    << ",fold_layers=" << fold_layers << ",vocab_pad=" << vocab_pad
    << ",bucket_align=" << bucket_align;
  return o.str();
}

int RankSpec::FindParam(const std::string& name) const {
  auto it = index.find(name);
  return it == index.end() ? -1 : it->second;
}

int TrainStructure::StageOfLayer(int64_t layer) const {
  for (int s = static_cast<int>(stage_begin_.size()) - 2; s >= 0; --s) {
    if (layer >= stage_begin_[s]) return s;
  }
  return 0;
}

int64_t TrainStructure::FirstLayerOfStage(int stage) const { return stage_begin_[stage]; }

void TrainStructure::OwnedRange(int r, int b, int d, uint64_t* begin, uint64_t* end) const {
  const uint64_t n = ranks_[r].buffers[b].numel;
  if (!layout_.dist_opt) {
    *begin = 0;
    *end = d == 0 ? n : 0;
    return;
  }
  const uint64_t dp = static_cast<uint64_t>(layout_.dp);
  const uint64_t per = (n + dp - 1) / dp;
  *begin = std::min<uint64_t>(n, per * static_cast<uint64_t>(d));
  *end = std::min<uint64_t>(n, *begin + per);
}

uint64_t TrainStructure::total_shard_bytes() const {
  uint64_t n = 0;
  for (const auto& r : ranks_) {
    for (const auto& b : r.buffers) n += b.numel * static_cast<uint64_t>(b.width());
  }
  return n;
}

namespace {

Status Invalid(const std::string& msg) { return InvalidArgumentError("layout: " + msg); }

struct Builder {
  TrainStructure* s;
  const TrainLayout& l;
  std::vector<RankSpec>* ranks;

  // Adds a parameter to rank r (no-op if it exists).
  void Add(int r, const std::string& name, const std::vector<int64_t>& shape, DType dtype,
           bool expert, uint64_t key, bool replica) {
    RankSpec& rk = (*ranks)[r];
    if (rk.index.count(name)) return;
    uint64_t numel = 1;
    for (int64_t d : shape) numel *= static_cast<uint64_t>(d);
    LocalParam p;
    p.name = name;
    p.shape = shape;
    p.numel = numel;
    p.key = key;
    p.replica = replica;
    if (l.dist_opt) {
      const std::string bname = dtype == DType::kF32 ? "flat.f32"
                                : expert ? "flat.expert." + std::string(DTypeName(dtype))
                                         : "flat.dense." + std::string(DTypeName(dtype));
      int b = -1;
      for (size_t i = 0; i < rk.buffers.size(); ++i) {
        if (rk.buffers[i].name == bname) b = static_cast<int>(i);
      }
      if (b < 0) {
        rk.buffers.push_back(BufferSpec{bname, dtype, 0});
        b = static_cast<int>(rk.buffers.size()) - 1;
      }
      BufferSpec& buf = rk.buffers[b];
      const uint64_t a = static_cast<uint64_t>(l.bucket_align);
      p.buffer = b;
      p.offset = (buf.numel + a - 1) / a * a;
      buf.numel = p.offset + numel;
    } else {
      rk.buffers.push_back(BufferSpec{name, dtype, numel});
      p.buffer = static_cast<int>(rk.buffers.size()) - 1;
      p.offset = 0;
    }
    rk.index[name] = static_cast<int>(rk.params.size());
    rk.params.push_back(std::move(p));
  }
};

uint64_t Key(const std::string& global, int tp, int ep) {
  return internal::Mix64(internal::HashString(global) ^
                         (static_cast<uint64_t>(tp + 1) * 0x100000001B3ULL) ^
                         (static_cast<uint64_t>(ep + 1) << 40));
}

}  // namespace

StatusOr<std::shared_ptr<const TrainStructure>> TrainStructure::Create(const ModelConfig& cfg_in,
                                                                       const TrainLayout& l) {
  auto s = std::shared_ptr<TrainStructure>(new TrainStructure());
  ModelConfig cfg = cfg_in;
  if (l.tied >= 0) cfg.tied_embeddings = l.tied == 1;
  if (l.tp < 1 || l.tp > 1024) return Invalid("tp must be in 1..1024, got " + std::to_string(l.tp));
  if (l.pp < 1) return Invalid("pp must be >= 1, got " + std::to_string(l.pp));
  if (l.ep < 1) return Invalid("ep must be >= 1, got " + std::to_string(l.ep));
  if (l.dp < 1) return Invalid("dp must be >= 1, got " + std::to_string(l.dp));
  if (l.vocab_pad < 1) return Invalid("vocab_pad must be >= 1");
  if (l.bucket_align < 1) return Invalid("bucket_align must be >= 1");
  if (l.fold_layers < 0) return Invalid("fold_layers must be >= 0");
  if (cfg.layers < l.pp) {
    return Invalid("pp=" + std::to_string(l.pp) + " exceeds the " + std::to_string(cfg.layers) +
                   " layers of " + cfg.name);
  }
  if (l.ep > 1 && !cfg.is_moe()) {
    return Invalid("ep=" + std::to_string(l.ep) + " needs a MoE model; " + cfg.name + " is dense");
  }
  if (cfg.is_moe() && cfg.experts % l.ep != 0) {
    return Invalid("ep=" + std::to_string(l.ep) + " does not divide the " +
                   std::to_string(cfg.experts) + " experts of " + cfg.name);
  }
  for (const auto& t : ModelInventory(cfg)) {
    if (t.name.find("kv_a_proj_with_mqa") != std::string::npos) s->mla_ = true;
  }
  if (!s->mla_) {
    if (cfg.kv_heads < 1 || cfg.heads % cfg.kv_heads != 0) {
      return Invalid("heads=" + std::to_string(cfg.heads) +
                     " not a multiple of kv_heads=" + std::to_string(cfg.kv_heads));
    }
    if (cfg.kv_heads % l.tp != 0) {
      return Invalid("tp=" + std::to_string(l.tp) + " does not divide kv_heads=" +
                     std::to_string(cfg.kv_heads) + " of " + cfg.name);
    }
    if (l.rope_permute && cfg.head_dim % 2 != 0) {
      return Invalid("rope_permute needs an even head_dim, got " + std::to_string(cfg.head_dim));
    }
  } else if (cfg.heads % l.tp != 0) {
    return Invalid("tp=" + std::to_string(l.tp) +
                   " does not divide heads=" + std::to_string(cfg.heads) + " of " + cfg.name);
  }
  int64_t dense_layers = 0;
  for (int64_t i = 0; i < cfg.layers; ++i)
    dense_layers += (cfg.is_moe() && i >= cfg.first_dense_layers) ? 0 : 1;
  if (l.fold_layers > dense_layers) {
    return Invalid("fold_layers=" + std::to_string(l.fold_layers) + " exceeds the " +
                   std::to_string(dense_layers) + " dense-MLP layers of " + cfg.name);
  }
  s->cfg_ = cfg;
  s->layout_ = l;
  s->canonical_ = ModelInventory(cfg);
  const int64_t vp = l.vocab_pad * l.tp;
  s->padded_vocab_ = (cfg.vocab + vp - 1) / vp * vp;
  s->stage_begin_.resize(l.pp + 1);
  for (int st = 0; st <= l.pp; ++st) s->stage_begin_[st] = cfg.layers * st / l.pp;

  std::vector<RankSpec> ranks(static_cast<size_t>(l.pp) * l.ep * l.tp);
  for (int p = 0; p < l.pp; ++p) {
    for (int e = 0; e < l.ep; ++e) {
      for (int t = 0; t < l.tp; ++t) {
        RankSpec& r = ranks[s->RankId(p, e, t)];
        r.pp = p;
        r.ep = e;
        r.tp = t;
      }
    }
  }
  Builder b{s.get(), l, &ranks};
  const int64_t tp = l.tp;
  for (const TensorSpec& spec : s->canonical_) {
    const TensorPlacement pl = internal::PlaceTensor(*s, spec);
    const DType dt = DTypeFromName(spec.dtype);
    if (spec.shape.empty()) return UnimplementedError("train: scalar tensor " + spec.name);
    if (dt != DType::kBF16 && dt != DType::kF32) {
      return UnimplementedError("train: tensor " + spec.name + " has dtype " + spec.dtype +
                                "; the reference state trains BF16 and F32 tensors");
    }
    auto rows = spec.shape[0];
    auto cols = spec.shape.size() > 1 ? spec.shape[1] : 1;
    auto need = [&](int64_t v, const std::string& what) -> Status {
      if (v % tp != 0) {
        return Invalid("tp=" + std::to_string(tp) + " does not divide " + what + "=" +
                       std::to_string(v) + " of " + spec.name);
      }
      return Status::OK();
    };
    std::vector<int> stages = {pl.stage};
    if (pl.kind == ParamKind::kVocab && spec.name == "model.embed_tokens.weight" &&
        cfg.tied_embeddings && l.pp > 1) {
      stages.push_back(l.pp - 1);  // the output layer's replica of the tied embedding
    }
    for (int stage : stages) {
      const bool tied_replica = stage != pl.stage;
      const std::string pname =
          tied_replica ? "output_layer.tied_word_embeddings.weight" : pl.param;
      for (int e = 0; e < l.ep; ++e) {
        for (int t = 0; t < l.tp; ++t) {
          const int r = s->RankId(stage, e, t);
          const bool ep_rep =
              e > 0 && pl.kind != ParamKind::kExpertW1 && pl.kind != ParamKind::kExpertW2;
          switch (pl.kind) {
            case ParamKind::kReplicated:
            case ParamKind::kNorm: {
              DType d = pl.kind == ParamKind::kNorm && l.fp32_norms && dt == DType::kBF16
                            ? DType::kF32
                            : dt;
              b.Add(r, pname, spec.shape, d, false, Key(pl.global, -1, -1), ep_rep || t > 0);
              break;
            }
            case ParamKind::kColumn:
              DCR_RETURN_IF_ERROR(need(rows, "rows"));
              b.Add(r, pname, {rows / tp, cols}, dt, false, Key(pl.global, t, -1), ep_rep);
              break;
            case ParamKind::kRow:
            case ParamKind::kFold:
              DCR_RETURN_IF_ERROR(need(cols, "columns"));
              b.Add(r, pname, {rows, cols / tp}, dt, false, Key(pl.global, t, -1), ep_rep);
              if (pl.kind == ParamKind::kFold) {
                b.Add(r, pl.scale_param, {rows}, DType::kF32, false,
                      Key(pl.global + ".output_scale", -1, -1), ep_rep || t > 0);
              }
              break;
            case ParamKind::kVocab:
              b.Add(r, pname, {s->padded_vocab_ / tp, cols}, dt, false,
                    Key("embedding.word_embeddings.weight" == pl.global || tied_replica
                            ? std::string("embedding.word_embeddings.weight")
                            : pl.global,
                        t, -1),
                    ep_rep || tied_replica);
              break;
            case ParamKind::kQkv: {
              const int64_t d = cfg.head_dim;
              b.Add(r, pname, {(cfg.heads + 2 * cfg.kv_heads) * d / tp, cfg.hidden}, dt, false,
                    Key(pl.global, t, -1), ep_rep);
              break;
            }
            case ParamKind::kFc1:
              DCR_RETURN_IF_ERROR(need(rows, "rows"));
              b.Add(r, pname, {2 * rows / tp, cols}, dt, false, Key(pl.global, t, -1), ep_rep);
              break;
            case ParamKind::kExpertW1:
              DCR_RETURN_IF_ERROR(need(rows, "moe_intermediate"));
              b.Add(r, pname, {cfg.experts / l.ep, cols, 2 * rows / tp}, dt, true,
                    Key(pl.global, t, e), false);
              break;
            case ParamKind::kExpertW2:
              DCR_RETURN_IF_ERROR(need(cols, "moe_intermediate"));
              b.Add(r, pname, {cfg.experts / l.ep, cols / tp, rows}, dt, true, Key(pl.global, t, e),
                    false);
              break;
          }
        }
      }
    }
  }
  s->ranks_ = std::move(ranks);
  return std::shared_ptr<const TrainStructure>(std::move(s));
}

ShardSet ShardSet::Zeros(const TrainStructure& s) {
  ShardSet set;
  set.buffers.resize(s.ranks().size());
  for (size_t r = 0; r < s.ranks().size(); ++r) {
    for (const auto& b : s.ranks()[r].buffers) {
      set.buffers[r].emplace_back(b.numel * static_cast<uint64_t>(b.width()), 0);
    }
  }
  return set;
}

const uint8_t* ShardSetReader::Read(int r, int b, uint64_t begin, uint64_t count) const {
  const int w = s_.ranks()[r].buffers[b].width();
  return set_.buffers[r][b].data() + begin * static_cast<uint64_t>(w);
}

}  // namespace dcr
