// The reference serving runtime's native loader (a rollout-engine stand-in).
//
// This translation unit is the "runtime": it knows nothing of deltas or of dcr's recorder. It
// places checkpoint tensors into its storage the way inference engines do, with ordinary memcpy
// calls: sharded row and column slices, fused QKV / gate-up buffers in its own order, padded vocab,
// transposed expert stacks; and it converts where engines convert: FP32 norms (upcast into a
// staging vector, then copied), rotary tables computed at load, FP8 E4M3 with per-tile scales.
#include "dcr/testing/reference_loader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "dcr/status_macros.h"

namespace dcr {

uint8_t FloatToE4M3(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  const uint8_t sign = static_cast<uint8_t>((b >> 24) & 0x80);
  if (std::isnan(f)) return sign | 0x7F;
  const float a = std::fabs(f);
  if (a >= 464.0f) return sign | 0x7E;  // saturate (464 would round up into NaN)
  if (a < 0.015625f) {                  // subnormal: multiples of 2^-9
    const int q = static_cast<int>(std::nearbyint(a * 512.0f));
    return sign | static_cast<uint8_t>(q);  // q == 8 is the smallest normal, 0x08
  }
  int e;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1;                    // a = (2m) * 2^exp, 2m in [1, 2)
  int mant = static_cast<int>(std::nearbyint((2.0f * m - 1.0f) * 8.0f));
  if (mant == 8) {
    mant = 0;
    ++exp;
  }
  const int biased = exp + 7;
  if (biased > 15 || (biased == 15 && mant == 7)) return sign | 0x7E;
  return sign | static_cast<uint8_t>((biased << 3) | mant);
}

float E4M3ToFloat(uint8_t b) {
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  const int exp = (b >> 3) & 0xF, mant = b & 7;
  if (exp == 15 && mant == 7) return std::nanf("");
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -9);
  return sign * std::ldexp(1.0f + mant / 8.0f, exp - 7);
}

Status ValidateServingConfig(const ServingConfig& c) {
  const ModelConfig& m = c.model;
  auto bad = [](const std::string& what) {
    return InvalidArgumentError("serving config: " + what);
  };
  if (c.tp < 1) return bad("tp must be >= 1");
  if (m.hidden <= 0 || m.vocab <= 0 || m.layers < 0) return bad("model has no hidden/vocab size");
  if (c.vocab_multiple < 1) return bad("vocab_multiple must be >= 1");
  if (!m.is_mla()) {
    if (m.heads % c.tp != 0) return bad("heads (" + std::to_string(m.heads) + ") % tp != 0");
    if (m.kv_heads % c.tp != 0 && c.tp % m.kv_heads != 0) {
      return bad("kv_heads and tp must divide one another");
    }
    if (c.fused == FusedLayout::kInterleaved && m.kv_heads < c.tp && c.fp8) {
      return bad("fp8 requires fused = concat");
    }
  }
  if (m.intermediate % c.tp != 0) return bad("intermediate % tp != 0");
  if (m.is_moe() && m.moe_intermediate % c.tp != 0) return bad("moe_intermediate % tp != 0");
  if (c.fp8) {
    const int64_t b = c.fp8_block;
    if (b < 1) return bad("fp8_block must be >= 1");
    if (c.fused != FusedLayout::kConcat) return bad("fp8 requires fused = concat");
    const int64_t kv_rank = std::max<int64_t>(1, m.kv_heads / c.tp);
    if (!m.is_mla() && ((m.heads / c.tp * m.head_dim) % b || (kv_rank * m.head_dim) % b)) {
      return bad("fp8_block must divide the per-rank q and kv rows");
    }
    if ((m.intermediate / c.tp) % b) return bad("fp8_block must divide intermediate / tp");
    if (m.hidden % b) return bad("fp8_block must divide hidden");
    if (m.is_moe() && (m.moe_intermediate / c.tp) % b) {
      return bad("fp8_block must divide moe_intermediate / tp");
    }
  }
  return Status::OK();
}

namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

float ToFloat(DType dt, const uint8_t* p, uint64_t i) {
  if (dt == DType::kBF16) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    uint32_t b = uint32_t{h} << 16;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  }
  if (dt == DType::kF32) {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  if (dt == DType::kF16) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0    ? std::ldexp(static_cast<float>(m), -24)
              : e == 31 ? (m ? std::nanf("") : INFINITY)
                        : std::ldexp(1.0f + m / 1024.0f, e - 15);
    return s ? -v : v;
  }
  return 0.0f;
}

class ReferenceLoader : public ModelLoader {
 public:
  ReferenceLoader(const ServingConfig& c, int rank) : c_(c), m_(c_.model), r_(rank) {
    tp_ = c.tp;
    vocab_padded_ = (m_.vocab + c.vocab_multiple * tp_ - 1) / (c.vocab_multiple * tp_) *
                    (c.vocab_multiple * tp_);
    vocab_shard_ = vocab_padded_ / tp_;
    if (!m_.is_mla()) {
      q_heads_ = m_.heads / tp_;
      if (m_.kv_heads >= tp_) {
        kv_heads_ = m_.kv_heads / tp_;
        kv_first_ = r_ * kv_heads_;
      } else {
        kv_heads_ = 1;
        kv_first_ = r_ / (tp_ / m_.kv_heads);  // replicated kv head
      }
    }
    wdt_ = c.fp8 ? "F8_E4M3" : m_.dtype;
  }

  Status Init(Storage* s) override {
    const int64_t H = m_.hidden, D = m_.head_dim;
    DCR_RETURN_IF_ERROR(Alloc(s, "embed_tokens", m_.dtype, {vocab_shard_, H}));
    DCR_RETURN_IF_ERROR(Alloc(s, "lm_head", m_.dtype, {vocab_shard_, H}));
    // Padding rows are zero.
    const int64_t valid = std::clamp<int64_t>(m_.vocab - r_ * vocab_shard_, 0, vocab_shard_);
    for (const char* name : {"embed_tokens", "lm_head"}) {
      Storage::Buffer* b = s->Find(name);
      std::memset(b->data + valid * H * 2, 0, (vocab_shard_ - valid) * H * 2);
    }
    DCR_RETURN_IF_ERROR(Alloc(s, "norm", NormDtype(), {H}));
    // Rotary tables, computed from the configuration at load.
    const int64_t rot = m_.is_mla() ? m_.qk_rope_head_dim : D;
    if (rot > 0) {
      std::vector<float> cos_t(c_.max_positions * (rot / 2)), sin_t(cos_t.size());
      for (int64_t p = 0; p < c_.max_positions; ++p) {
        for (int64_t i = 0; i < rot / 2; ++i) {
          const double inv = std::pow(c_.rope_theta, -2.0 * static_cast<double>(i) / rot);
          cos_t[p * (rot / 2) + i] = static_cast<float>(std::cos(p * inv));
          sin_t[p * (rot / 2) + i] = static_cast<float>(std::sin(p * inv));
        }
      }
      DCR_ASSIGN_OR_RETURN(uint8_t * cb,
                           s->Allocate("rope_cos", "F32", {c_.max_positions, rot / 2}));
      DCR_ASSIGN_OR_RETURN(uint8_t * sb,
                           s->Allocate("rope_sin", "F32", {c_.max_positions, rot / 2}));
      std::memcpy(cb, cos_t.data(), cos_t.size() * 4);
      std::memcpy(sb, sin_t.data(), sin_t.size() * 4);
    }
    // Tensors without a sharding rule get replicated buffers under their canonical names.
    for (const TensorSpec& t : ModelInventory(m_)) {
      if (IsReplicated(t.name)) {
        const bool norm = IsNorm(t.name, t.shape);
        DCR_RETURN_IF_ERROR(Alloc(s, t.name, norm ? NormDtype() : t.dtype, t.shape));
      }
    }
    for (int64_t l = 0; l < m_.layers; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".";
      DCR_RETURN_IF_ERROR(Alloc(s, p + "input_norm", NormDtype(), {H}));
      DCR_RETURN_IF_ERROR(Alloc(s, p + "post_norm", NormDtype(), {H}));
      if (!m_.is_mla()) {
        DCR_RETURN_IF_ERROR(AllocW(s, p + "qkv", {(q_heads_ + 2 * kv_heads_) * D, H}));
        DCR_RETURN_IF_ERROR(AllocW(s, p + "o", {H, q_heads_ * D}));
        if (m_.qk_norm) {
          DCR_RETURN_IF_ERROR(Alloc(s, p + "q_norm", NormDtype(), {D}));
          DCR_RETURN_IF_ERROR(Alloc(s, p + "k_norm", NormDtype(), {D}));
        }
      }
      if (m_.is_moe_layer(l)) {
        const int64_t E = m_.experts, I = m_.moe_intermediate / tp_;
        DCR_RETURN_IF_ERROR(Alloc(s, p + "router", m_.dtype, {E, H}));
        if (c_.transpose_experts) {
          DCR_RETURN_IF_ERROR(AllocW(s, p + "w13", {E, H, 2 * I}));
          DCR_RETURN_IF_ERROR(AllocW(s, p + "w2", {E, I, H}));
        } else {
          DCR_RETURN_IF_ERROR(AllocW(s, p + "w13", {E, 2 * I, H}));
          DCR_RETURN_IF_ERROR(AllocW(s, p + "w2", {E, H, I}));
        }
        if (m_.shared_experts > 0) {
          const int64_t SI = m_.shared_experts * m_.moe_intermediate / tp_;
          DCR_RETURN_IF_ERROR(AllocW(s, p + "shared_gate_up", {2 * SI, H}));
          DCR_RETURN_IF_ERROR(AllocW(s, p + "shared_down", {H, SI}));
        }
      } else {
        const int64_t I = m_.intermediate / tp_;
        DCR_RETURN_IF_ERROR(AllocW(s, p + "gate_up", {2 * I, H}));
        DCR_RETURN_IF_ERROR(AllocW(s, p + "down", {H, I}));
      }
    }
    return Status::OK();
  }

  Status LoadWeight(const WeightRef& w, Storage* s) override {
    const std::string& n = w.name;
    const int64_t H = m_.hidden;
    if (n == "model.embed_tokens.weight" || n == "lm_head.weight") {
      DCR_RETURN_IF_ERROR(ExpectShape(w, {m_.vocab, H}));
      const int64_t row0 = r_ * vocab_shard_;
      const int64_t rows = std::clamp<int64_t>(m_.vocab - row0, 0, vocab_shard_);
      std::vector<const char*> targets;
      if (n == "lm_head.weight")
        targets = {"lm_head"};
      else if (m_.tied_embeddings)
        targets = {"embed_tokens", "lm_head"};
      else
        targets = {"embed_tokens"};
      for (const char* t : targets) {
        std::memcpy(s->Find(t)->data, w.data + row0 * H * w.nbytes / (m_.vocab * H),
                    rows * H * (w.nbytes / (m_.vocab * H)));
      }
      return Status::OK();
    }
    if (n == "model.norm.weight") return LoadNorm(w, s, "norm");
    const std::string lp = "model.layers.";
    if (n.compare(0, lp.size(), lp) != 0) return Replicate(w, s);
    const size_t dot = n.find('.', lp.size());
    const std::string layer = n.substr(lp.size(), dot - lp.size());
    const std::string rest = n.substr(dot + 1);
    const std::string p = "layers." + layer + ".";
    if (rest == "input_layernorm.weight") return LoadNorm(w, s, p + "input_norm");
    if (rest == "post_attention_layernorm.weight") return LoadNorm(w, s, p + "post_norm");
    if (!m_.is_mla()) {
      const int64_t D = m_.head_dim;
      if (rest == "self_attn.q_norm.weight") return LoadNorm(w, s, p + "q_norm");
      if (rest == "self_attn.k_norm.weight") return LoadNorm(w, s, p + "k_norm");
      if (rest == "self_attn.q_proj.weight" || rest == "self_attn.k_proj.weight" ||
          rest == "self_attn.v_proj.weight") {
        const int which = rest[10] == 'q' ? 0 : rest[10] == 'k' ? 1 : 2;
        const int64_t heads = which == 0 ? m_.heads : m_.kv_heads;
        DCR_RETURN_IF_ERROR(ExpectShape(w, {heads * D, H}));
        const int64_t per = which == 0 ? q_heads_ : kv_heads_;
        const int64_t first = which == 0 ? r_ * q_heads_ : kv_first_;
        // Destination rows of each local head.
        std::vector<Part> parts;
        if (c_.fused == FusedLayout::kConcat) {  // the local heads are one block of rows
          const int64_t dst_row = which == 0   ? 0
                                  : which == 1 ? q_heads_ * D
                                               : (q_heads_ + kv_heads_) * D;
          return Place(w, s, p + "qkv", {Part{dst_row, 0, 1, per * D, H, false, first * D, 0}});
        }
        for (int64_t h = 0; h < per; ++h) {
          int64_t dst_row;
          if (c_.fused == FusedLayout::kConcat) {
            dst_row = (which == 0 ? 0 : which == 1 ? q_heads_ : q_heads_ + kv_heads_) * D + h * D;
          } else {  // grouped: per local kv head g: [q heads of g | k_g | v_g]
            const int64_t qpg = q_heads_ / kv_heads_ > 0 ? q_heads_ / kv_heads_ : 1;
            const int64_t g = which == 0 ? h / qpg : h;
            const int64_t group_rows = (qpg + 2) * D;
            dst_row = g * group_rows + (which == 0   ? (h % qpg) * D
                                        : which == 1 ? qpg * D
                                                     : (qpg + 1) * D);
          }
          parts.push_back(Part{dst_row, 0, 1, D, H, false, (first + h) * D, 0});
        }
        return Place(w, s, p + "qkv", parts);
      }
      if (rest == "self_attn.o_proj.weight") {
        DCR_RETURN_IF_ERROR(ExpectShape(w, {H, m_.heads * D}));
        return Place(w, s, p + "o", {Part{0, 0, 1, H, q_heads_ * D, false, 0, r_ * q_heads_ * D}});
      }
    }
    if (rest == "mlp.gate.weight" && m_.is_moe()) {
      DCR_RETURN_IF_ERROR(ExpectShape(w, {m_.experts, H}));
      std::memcpy(s->Find(p + "router")->data, w.data, w.nbytes);
      return Status::OK();
    }
    const std::string ex = "mlp.experts.";
    if (rest.compare(0, ex.size(), ex) == 0) {
      const size_t d2 = rest.find('.', ex.size());
      const int64_t e = std::stoll(rest.substr(ex.size(), d2 - ex.size()));
      const std::string proj = rest.substr(d2 + 1);
      const int64_t I = m_.moe_intermediate / tp_, E = m_.experts;
      if (e < 0 || e >= E) return InvalidArgumentError("expert index out of range: " + n);
      const bool tr = c_.transpose_experts;
      if (proj == "gate_proj.weight" || proj == "up_proj.weight") {
        DCR_RETURN_IF_ERROR(ExpectShape(w, {m_.moe_intermediate, H}));
        const int64_t half = proj[0] == 'g' ? 0 : 1;
        // Stored [E, H, 2I] (transposed) or [E, 2I, H].
        const int64_t mat_rows = tr ? H : 2 * I;
        Part pt = tr ? Part{e * mat_rows, half * I, 1, H, I, true, r_ * I, 0}
                     : Part{e * mat_rows + half * I, 0, 1, I, H, false, r_ * I, 0};
        return Place(w, s, p + "w13", {pt}, mat_rows);
      }
      if (proj == "down_proj.weight") {
        DCR_RETURN_IF_ERROR(ExpectShape(w, {H, m_.moe_intermediate}));
        const int64_t mat_rows = tr ? I : H;
        Part pt = tr ? Part{e * mat_rows, 0, 1, I, H, true, 0, r_ * I}
                     : Part{e * mat_rows, 0, 1, H, I, false, 0, r_ * I};
        return Place(w, s, p + "w2", {pt}, mat_rows);
      }
      return InvalidArgumentError("reference loader: no rule for " + n);
    }
    const bool shared = rest.compare(0, 19, "mlp.shared_experts.") == 0;
    const std::string mlp_proj = shared                            ? rest.substr(19)
                                 : rest.compare(0, 4, "mlp.") == 0 ? rest.substr(4)
                                                                   : "";
    if (mlp_proj == "gate_proj.weight" || mlp_proj == "up_proj.weight" ||
        mlp_proj == "down_proj.weight") {
      const int64_t full = shared ? m_.shared_experts * m_.moe_intermediate : m_.intermediate;
      const int64_t I = full / tp_;
      const std::string gu = p + (shared ? "shared_gate_up" : "gate_up");
      const std::string dn = p + (shared ? "shared_down" : "down");
      if (mlp_proj[0] == 'd') {
        DCR_RETURN_IF_ERROR(ExpectShape(w, {H, full}));
        return Place(w, s, dn, {Part{0, 0, 1, H, I, false, 0, r_ * I}});
      }
      DCR_RETURN_IF_ERROR(ExpectShape(w, {full, H}));
      const int64_t half = mlp_proj[0] == 'g' ? 0 : 1;
      Part pt = c_.fused == FusedLayout::kConcat ? Part{half * I, 0, 1, I, H, false, r_ * I, 0}
                                                 : Part{half, 0, 2, I, H, false, r_ * I, 0};
      return Place(w, s, gu, {pt});
    }
    return Replicate(w, s);
  }

 private:
  // Destination sub-matrix D (rows x cols) of a buffer viewed as a matrix of the buffer's last
  // dimension: D[i][j] at matrix row dst_row + i * row_step, column dst_col + j, filled from source
  // S[src_row + i][src_col + j] (or, transposed, S[src_row + j][src_col + i]).
  struct Part {
    int64_t dst_row, dst_col, row_step, rows, cols;
    bool transposed;
    int64_t src_row, src_col;
  };

  std::string NormDtype() const { return c_.fp32_norms ? "F32" : m_.dtype; }

  Status Alloc(Storage* s, const std::string& name, const std::string& dt,
               const std::vector<int64_t>& shape) {
    return s->Allocate(name, dt, shape).status();
  }
  // A weight matrix (stack); in FP8 mode with a scale buffer of one FP32 per tile.
  Status AllocW(Storage* s, const std::string& name, const std::vector<int64_t>& shape) {
    DCR_RETURN_IF_ERROR(Alloc(s, name, wdt_, shape));
    if (c_.fp8) {
      const int64_t cols = shape.back();
      int64_t rows = 1;
      for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
      const int64_t b = c_.fp8_block;
      DCR_RETURN_IF_ERROR(
          Alloc(s, name + ".scale", "F32", {(rows + b - 1) / b, (cols + b - 1) / b}));
    }
    return Status::OK();
  }

  Status ExpectShape(const WeightRef& w, const std::vector<int64_t>& shape) const {
    if (w.shape != shape) {
      return InvalidArgumentError("reference loader: " + w.name + " has an unexpected shape");
    }
    return Status::OK();
  }

  // Copies (BF16 mode) or quantizes (FP8 mode) parts of `w` into buffer `name`. `tile_rows` is the
  // matrix height of one stacked matrix (tiles never straddle stacked matrices).
  Status Place(const WeightRef& w, Storage* s, const std::string& name,
               const std::vector<Part>& parts, int64_t tile_rows = 0) {
    Storage::Buffer* b = s->Find(name);
    if (b == nullptr)
      return InvalidArgumentError("reference loader: no buffer " + name + " for " + w.name);
    const int64_t src_cols = w.shape.size() == 2 ? w.shape[1] : 1;
    const int64_t pitch = b->shape.back();
    if (b->dtype != DType::kF8E4M3) {
      const uint64_t ew = DTypeWidth(w.dtype);
      if (ew != static_cast<uint64_t>(DTypeWidth(b->dtype))) {
        return InvalidArgumentError("reference loader: dtype of " + w.name + " differs from " +
                                    name);
      }
      for (const Part& p : parts) {
        if (!p.transposed) {
          for (int64_t i = 0; i < p.rows; ++i) {
            std::memcpy(b->data + ((p.dst_row + i * p.row_step) * pitch + p.dst_col) * ew,
                        w.data + ((p.src_row + i) * src_cols + p.src_col) * ew, p.cols * ew);
          }
        } else {
          // Column by column, like cudaMemcpy2D with an element-wide width: D[i][j] = S[j][i].
          for (int64_t j = 0; j < p.cols; ++j) {
            for (int64_t i = 0; i < p.rows; ++i) {
              std::memcpy(b->data + ((p.dst_row + i * p.row_step) * pitch + p.dst_col + j) * ew,
                          w.data + ((p.src_row + j) * src_cols + p.src_col + i) * ew, ew);
            }
          }
        }
      }
      return Status::OK();
    }
    // FP8: gather the part as floats (storage orientation), one scale per tile, quantize, copy.
    Storage::Buffer* sb = s->Find(name + ".scale");
    const int64_t bs = c_.fp8_block;
    const int64_t scale_cols = sb->shape[1];
    for (const Part& p : parts) {
      std::vector<float> f(p.rows * p.cols);
      for (int64_t i = 0; i < p.rows; ++i) {
        for (int64_t j = 0; j < p.cols; ++j) {
          const int64_t si = p.transposed ? p.src_row + j : p.src_row + i;
          const int64_t sj = p.transposed ? p.src_col + i : p.src_col + j;
          f[i * p.cols + j] = ToFloat(w.dtype, w.data, si * src_cols + sj);
        }
      }
      if (p.row_step != 1 || p.dst_row % bs || p.dst_col % bs) {
        return InvalidArgumentError("reference loader: fp8 part of " + w.name +
                                    " not tile aligned");
      }
      (void)tile_rows;
      std::vector<uint8_t> q(f.size());
      const int64_t trows = (p.rows + bs - 1) / bs, tcols = (p.cols + bs - 1) / bs;
      std::vector<float> scales(trows * tcols);
      for (int64_t ti = 0; ti < trows; ++ti) {
        for (int64_t tj = 0; tj < tcols; ++tj) {
          float amax = 0.0f;
          for (int64_t i = ti * bs; i < std::min(p.rows, (ti + 1) * bs); ++i) {
            for (int64_t j = tj * bs; j < std::min(p.cols, (tj + 1) * bs); ++j) {
              const float v = std::fabs(f[i * p.cols + j]);
              if (v > amax) amax = v;  // NaN never wins
            }
          }
          const float scale = (amax > 0.0f && std::isfinite(amax)) ? amax / 448.0f : 1.0f;
          scales[ti * tcols + tj] = scale;
          for (int64_t i = ti * bs; i < std::min(p.rows, (ti + 1) * bs); ++i) {
            for (int64_t j = tj * bs; j < std::min(p.cols, (tj + 1) * bs); ++j) {
              q[i * p.cols + j] = FloatToE4M3(f[i * p.cols + j] / scale);
            }
          }
        }
      }
      for (int64_t i = 0; i < p.rows; ++i) {
        std::memcpy(b->data + (p.dst_row + i) * pitch + p.dst_col, q.data() + i * p.cols, p.cols);
      }
      for (int64_t ti = 0; ti < trows; ++ti) {
        std::memcpy(sb->data + ((p.dst_row / bs + ti) * scale_cols + p.dst_col / bs) * 4,
                    scales.data() + ti * tcols, tcols * 4);
      }
    }
    return Status::OK();
  }

  Status LoadNorm(const WeightRef& w, Storage* s, const std::string& name) {
    Storage::Buffer* b = s->Find(name);
    if (b == nullptr)
      return InvalidArgumentError("reference loader: no buffer " + name + " for " + w.name);
    const uint64_t n = w.nbytes / DTypeWidth(w.dtype);
    if (n * DTypeWidth(b->dtype) != b->nbytes) {
      return InvalidArgumentError("reference loader: " + w.name + " has an unexpected size");
    }
    if (b->dtype == w.dtype) {
      std::memcpy(b->data, w.data, w.nbytes);
      return Status::OK();
    }
    std::vector<float> up(n);
    for (uint64_t i = 0; i < n; ++i) up[i] = ToFloat(w.dtype, w.data, i);
    std::memcpy(b->data, up.data(), n * 4);
    return Status::OK();
  }

  static bool IsNorm(const std::string& name, const std::vector<int64_t>& shape) {
    return name.find("norm") != std::string::npos && shape.size() == 1;
  }
  // MLA attention tensors and router biases have no sharding rule here.
  bool IsReplicated(const std::string& name) const {
    return (m_.is_mla() && name.find(".self_attn.") != std::string::npos) ||
           EndsWith(name, ".e_score_correction_bias");
  }

  // Tensors without a sharding rule: the replicated buffer under the canonical name allocated by
  // Init; norms upcast like the others.
  Status Replicate(const WeightRef& w, Storage* s) {
    Storage::Buffer* b = IsReplicated(w.name) ? s->Find(w.name) : nullptr;
    if (b == nullptr) return InvalidArgumentError("reference loader: no rule for tensor " + w.name);
    if (IsNorm(w.name, w.shape)) return LoadNorm(w, s, w.name);
    if (b->nbytes != w.nbytes) return InvalidArgumentError("reference loader: size of " + w.name);
    std::memcpy(b->data, w.data, w.nbytes);
    return Status::OK();
  }

  ServingConfig c_;
  const ModelConfig& m_;
  int r_;
  int64_t tp_ = 1, vocab_padded_ = 0, vocab_shard_ = 0, q_heads_ = 0, kv_heads_ = 0, kv_first_ = 0;
  std::string wdt_;
};

}  // namespace

StatusOr<std::unique_ptr<ModelLoader>> MakeReferenceLoader(const ServingConfig& config, int rank) {
  DCR_RETURN_IF_ERROR(ValidateServingConfig(config));
  if (rank < 0 || rank >= config.tp) {
    return InvalidArgumentError("serving rank " + std::to_string(rank) + " out of range for tp " +
                                std::to_string(config.tp));
  }
  return std::unique_ptr<ModelLoader>(new ReferenceLoader(config, rank));
}

LoaderFactory ReferenceLoaderFactory(const ServingConfig& config) {
  return [config](int rank) { return MakeReferenceLoader(config, rank); };
}

}  // namespace dcr
