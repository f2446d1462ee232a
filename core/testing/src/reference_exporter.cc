// The reference framework's exporter: rank shards -> canonical Hugging Face tensors. Ordinary
// conversion code (gathers, un-fuses, drops vocab padding, converts FP32 norms, folds scales,
// undoes the RoPE pair layout); it knows nothing about deltas.
#include <cstring>

#include "dcr/status_macros.h"
#include "dcr/testing/reference_trainer.h"
#include "dcr/testing/synth.h"
#include "train/train_internal.h"

namespace dcr {

using internal::ParamKind;

namespace {

struct Ctx {
  const TrainStructure& s;
  const ShardReader& in;
  const internal::TensorPlacement& pl;
  const TensorSpec& spec;
  uint8_t* out;
  int w;

  StatusOr<const uint8_t*> Param(int stage, int ep, int tp, const std::string& name,
                                 const LocalParam** lp) const {
    const int r = s.RankId(stage, ep, tp);
    const RankSpec& rk = s.ranks()[r];
    const int i = rk.FindParam(name);
    if (i < 0) {
      return InternalError("exporter: rank " + std::to_string(r) + " has no parameter " + name);
    }
    *lp = &rk.params[i];
    return in.Read(r, (*lp)->buffer, (*lp)->offset, (*lp)->numel);
  }
};

Status Export(const Ctx& c) {
  const TrainStructure& s = c.s;
  const ModelConfig& cfg = s.config();
  const int64_t tp = s.layout().tp;
  const int w = c.w;
  const auto& pl = c.pl;
  const int64_t rows = c.spec.shape[0];
  const int64_t cols = c.spec.shape.size() > 1 ? c.spec.shape[1] : 1;
  const LocalParam* lp = nullptr;
  switch (pl.kind) {
    case ParamKind::kReplicated: {
      DCR_ASSIGN_OR_RETURN(const uint8_t* src, c.Param(pl.stage, 0, 0, pl.param, &lp));
      std::memcpy(c.out, src, c.spec.nbytes());
      return Status::OK();
    }
    case ParamKind::kNorm: {
      DCR_ASSIGN_OR_RETURN(const uint8_t* src, c.Param(pl.stage, 0, 0, pl.param, &lp));
      const RankSpec& rk = s.ranks()[s.RankId(pl.stage, 0, 0)];
      if (rk.buffers[lp->buffer].dtype == DType::kF32 && w == 2) {
        // Trained in FP32, stored as BF16 (round to nearest even).
        for (uint64_t i = 0; i < lp->numel; ++i) {
          float f;
          std::memcpy(&f, src + 4 * i, 4);
          uint16_t b = FloatToBF16(f);
          std::memcpy(c.out + 2 * i, &b, 2);
        }
      } else {
        std::memcpy(c.out, src, c.spec.nbytes());
      }
      return Status::OK();
    }
    case ParamKind::kColumn: {
      const uint64_t part = static_cast<uint64_t>(rows / tp * cols) * w;
      for (int t = 0; t < tp; ++t) {
        DCR_ASSIGN_OR_RETURN(const uint8_t* src, c.Param(pl.stage, 0, t, pl.param, &lp));
        std::memcpy(c.out + t * part, src, part);
      }
      return Status::OK();
    }
    case ParamKind::kRow:
    case ParamKind::kFold: {
      const int64_t lc = cols / tp;
      const float* scale = nullptr;
      if (pl.kind == ParamKind::kFold) {
        DCR_ASSIGN_OR_RETURN(const uint8_t* sp, c.Param(pl.stage, 0, 0, pl.scale_param, &lp));
        scale = reinterpret_cast<const float*>(sp);
      }
      for (int t = 0; t < tp; ++t) {
        DCR_ASSIGN_OR_RETURN(const uint8_t* src, c.Param(pl.stage, 0, t, pl.param, &lp));
        for (int64_t o = 0; o < rows; ++o) {
          uint8_t* dst = c.out + (o * cols + t * lc) * w;
          const uint8_t* row = src + o * lc * w;
          if (scale == nullptr) {
            std::memcpy(dst, row, lc * w);
          } else {
            // A per-output-row scale folded into the weight: a whole row changes with it.
            float sc;
            std::memcpy(&sc, scale + o, 4);
            for (int64_t j = 0; j < lc; ++j) {
              uint16_t b;
              std::memcpy(&b, row + 2 * j, 2);
              b = FloatToBF16(BF16ToFloat(b) * sc);
              std::memcpy(dst + 2 * j, &b, 2);
            }
          }
        }
      }
      return Status::OK();
    }
    case ParamKind::kVocab: {
      const int64_t local_rows = s.padded_vocab() / tp;
      for (int t = 0; t < tp; ++t) {
        DCR_ASSIGN_OR_RETURN(const uint8_t* src, c.Param(pl.stage, 0, t, pl.param, &lp));
        const int64_t first = t * local_rows;
        const int64_t n = std::max<int64_t>(0, std::min(local_rows, rows - first));
        if (n > 0) std::memcpy(c.out + first * cols * w, src, n * cols * w);  // padding dropped
      }
      return Status::OK();
    }
    case ParamKind::kQkv: {
      const int64_t d = cfg.head_dim, qpg = cfg.heads / cfg.kv_heads, groups = cfg.kv_heads / tp;
      const int64_t h = cfg.hidden;
      const bool rope = s.layout().rope_permute && pl.part < 2;
      for (int t = 0; t < tp; ++t) {
        DCR_ASSIGN_OR_RETURN(const uint8_t* src, c.Param(pl.stage, 0, t, pl.param, &lp));
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t gg = t * groups + g;
          const int64_t heads = pl.part == 0 ? qpg : 1;
          for (int64_t hq = 0; hq < heads; ++hq) {
            const int64_t src_head = g * (qpg + 2) + (pl.part == 0 ? hq : qpg + pl.part - 1);
            const int64_t dst_head = pl.part == 0 ? gg * qpg + hq : gg;
            for (int64_t rr = 0; rr < d; ++rr) {
              // HF keeps q/k heads half-split; the rank keeps rotary pairs interleaved.
              const int64_t sr = rope ? (rr % (d / 2)) * 2 + rr / (d / 2) : rr;
              std::memcpy(c.out + (dst_head * d + rr) * h * w, src + (src_head * d + sr) * h * w,
                          h * w);
            }
          }
        }
      }
      return Status::OK();
    }
    case ParamKind::kFc1: {
      const int64_t lr = rows / tp;
      for (int t = 0; t < tp; ++t) {
        DCR_ASSIGN_OR_RETURN(const uint8_t* src, c.Param(pl.stage, 0, t, pl.param, &lp));
        std::memcpy(c.out + t * lr * cols * w, src + pl.part * lr * cols * w, lr * cols * w);
      }
      return Status::OK();
    }
    case ParamKind::kExpertW1: {
      // canonical [m, hidden]; local [El, hidden, 2m/tp]
      const int64_t el = cfg.experts / s.layout().ep, m = rows, h = cols, lm = m / tp;
      const int e = static_cast<int>(pl.expert / el);
      const int64_t le = pl.expert % el;
      for (int t = 0; t < tp; ++t) {
        DCR_ASSIGN_OR_RETURN(const uint8_t* src, c.Param(pl.stage, e, t, pl.param, &lp));
        for (int64_t hh = 0; hh < h; ++hh) {
          const uint8_t* row = src + ((le * h + hh) * 2 * lm + pl.part * lm) * w;
          for (int64_t j = 0; j < lm; ++j) {
            std::memcpy(c.out + ((t * lm + j) * h + hh) * w, row + j * w, w);
          }
        }
      }
      return Status::OK();
    }
    case ParamKind::kExpertW2: {
      // canonical [hidden, m]; local [El, m/tp, hidden]
      const int64_t el = cfg.experts / s.layout().ep, h = rows, m = cols, lm = m / tp;
      const int e = static_cast<int>(pl.expert / el);
      const int64_t le = pl.expert % el;
      for (int t = 0; t < tp; ++t) {
        DCR_ASSIGN_OR_RETURN(const uint8_t* src, c.Param(pl.stage, e, t, pl.param, &lp));
        for (int64_t j = 0; j < lm; ++j) {
          const uint8_t* row = src + ((le * lm + j) * h) * w;
          for (int64_t o = 0; o < h; ++o) {
            std::memcpy(c.out + (o * m + t * lm + j) * w, row + o * w, w);
          }
        }
      }
      return Status::OK();
    }
  }
  return InternalError("exporter: unhandled kind");
}

}  // namespace

Status ReferenceExporter::ExportTensor(const ShardReader& shards, size_t t, uint8_t* out) const {
  if (t >= structure().canonical().size())
    return InvalidArgumentError("exporter: tensor index out of range");
  const TensorSpec& spec = structure().canonical()[t];
  const internal::TensorPlacement pl = internal::PlaceTensor(structure(), spec);
  Ctx c{structure(), shards, pl, spec, out, DTypeWidth(DTypeFromName(spec.dtype))};
  return Export(c).WithContext("exporting " + spec.name);
}

}  // namespace dcr
