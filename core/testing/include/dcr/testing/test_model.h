// Synthetic checkpoints for receiver tests and benches (internal): a model inventory filled with
// seeded BF16 weights, and steps that change a given fraction of elements by a few ulps (the
// pattern of AdamW updates on BF16 weights), optionally sprinkling special values.
#ifndef DCR_CORE_TESTING_INCLUDE_DCR_TESTING_TEST_MODEL_H_
#define DCR_CORE_TESTING_INCLUDE_DCR_TESTING_TEST_MODEL_H_

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/testing/synth.h"

namespace dcr {
namespace internal {

struct SyntheticModel {
  std::vector<TensorSpec> inventory;
  std::vector<std::vector<uint8_t>> data;  // per inventory tensor

  // Builds the safetensors image (tensors in inventory order) and parses it.
  std::unique_ptr<Checkpoint> ToCheckpoint() const {
    std::vector<TensorView> views;
    for (size_t i = 0; i < inventory.size(); ++i) {
      views.push_back(TensorView{inventory[i].name, inventory[i].dtype, inventory[i].shape,
                                 data[i].data(), data[i].size()});
    }
    std::vector<uint64_t> offsets;
    const std::string header = BuildSafetensorsHeader(views, {}, &offsets);
    std::vector<uint8_t> bytes(header.begin(), header.end());
    for (const auto& d : data) bytes.insert(bytes.end(), d.begin(), d.end());
    auto c = Checkpoint::FromBytes(std::move(bytes));
    return c.ok() ? std::move(c).value() : nullptr;
  }
};

inline uint16_t Bf16Of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<uint16_t>((b + 0x7FFF + ((b >> 16) & 1)) >> 16);
}

inline SyntheticModel MakeSyntheticModel(const ModelConfig& cfg, uint64_t seed) {
  SyntheticModel m;
  m.inventory = ModelInventory(cfg);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  for (const TensorSpec& t : m.inventory) {
    const uint64_t n = t.num_elements();
    std::vector<uint8_t> d(t.nbytes());
    const bool norm = t.name.find("norm") != std::string::npos;
    if (t.dtype == "F32") {
      for (uint64_t i = 0; i < n; ++i) {
        const float f = nd(rng);
        std::memcpy(d.data() + 4 * i, &f, 4);
      }
    } else {
      for (uint64_t i = 0; i < n; ++i) {
        const uint16_t h = Bf16Of(norm ? 1.0f + nd(rng) : nd(rng));
        std::memcpy(d.data() + 2 * i, &h, 2);
      }
    }
    m.data.push_back(std::move(d));
  }
  return m;
}

// Changes about `rate` of all elements by +-1..3 ulps (ordered-integer steps); with `specials`,
// also writes a few NaN payloads, infinities, -0 and subnormals.
inline void StepSyntheticModel(SyntheticModel* m, double rate, uint64_t seed, bool specials) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (size_t ti = 0; ti < m->inventory.size(); ++ti) {
    auto& d = m->data[ti];
    const int w = m->inventory[ti].dtype == "F32" ? 4 : 2;
    const uint64_t n = d.size() / w;
    // Geometric gaps give a Bernoulli(rate) pattern without a draw per element.
    std::geometric_distribution<uint64_t> gap(rate);
    for (uint64_t i = gap(rng); i < n; i += 1 + gap(rng)) {
      uint64_t b = 0;
      std::memcpy(&b, d.data() + i * w, w);
      const uint64_t sign = uint64_t{1} << (8 * w - 1);
      const int64_t step = static_cast<int64_t>(1 + rng() % 3) * ((rng() & 1) ? 1 : -1);
      // Step in magnitude, keep the sign (no crossing through zero: like small AdamW updates).
      uint64_t mag = b & (sign - 1);
      if (step < 0 && mag < static_cast<uint64_t>(-step))
        mag = 0;
      else
        mag += step;
      b = (b & sign) | (mag & (sign - 1));
      std::memcpy(d.data() + i * w, &b, w);
    }
    if (specials && n > 16) {
      const uint64_t pats2[] = {0x7FC1, 0xFFA5, 0x7F80, 0xFF80, 0x8000, 0x0001, 0x807F, 0x0000};
      const uint64_t pats4[] = {0x7FC00123u, 0xFF800000u, 0x80000000u, 0x00000003u};
      for (int k = 0; k < 4; ++k) {
        const uint64_t i = rng() % n;
        const uint64_t b = w == 2 ? pats2[rng() % 8] : pats4[rng() % 4];
        std::memcpy(d.data() + i * w, &b, w);
      }
    }
  }
}

}  // namespace internal
}  // namespace dcr

#endif  // DCR_CORE_TESTING_INCLUDE_DCR_TESTING_TEST_MODEL_H_
