// AdamW on FP32 masters and the FP32 -> BF16 cast.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>

#include "dcr/testing/synth.h"

namespace dcr {

void AdamWStep(float* master, float* m, float* v, const float* grad, uint64_t n,
               const AdamWHyper& h, int64_t step) {
  // PyTorch's AdamW: p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
  // p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps).
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(step));
  const float decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
  const float b1 = static_cast<float>(h.beta1), c1 = static_cast<float>(1.0 - h.beta1);
  const float b2 = static_cast<float>(h.beta2), c2 = static_cast<float>(1.0 - h.beta2);
  const float step_size = static_cast<float>(h.lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float eps = static_cast<float>(h.eps);
  // Blocks small enough to stay in L1 between the three array statements.
  constexpr uint64_t kBlock = 1024;
  for (uint64_t off = 0; off < n; off += kBlock) {
    const Eigen::Index len = static_cast<Eigen::Index>(std::min(kBlock, n - off));
    Eigen::Map<Eigen::ArrayXf> p(master + off, len), mm(m + off, len), vv(v + off, len);
    Eigen::Map<const Eigen::ArrayXf> g(grad + off, len);
    mm = b1 * mm + c1 * g;
    vv = b2 * vv + c2 * g.square();
    p = p * decay - step_size * mm / (vv.sqrt() * inv_sqrt_bc2 + eps);
  }
}

uint16_t FloatToBF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float BF16ToFloat(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

void FloatsToBF16(const float* in, uint16_t* out, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, in + i, sizeof(u));
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet = (u >> 16) | 0x0040u;
    out[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
  }
}

}  // namespace dcr
