// Shared pieces of the fuzz targets: a fixed small inventory with every element width, and
// receiver storage over it.
#ifndef DCR_TESTS_FUZZ_FUZZ_COMMON_H_
#define DCR_TESTS_FUZZ_FUZZ_COMMON_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "dcr/apply.h"
#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/hash.h"
#include "dcr/receiver.h"

namespace dcr::fuzz {

// The Ed25519 seed of the key that signs the signed seeds (dcr_fuzz_signed trusts it).
inline constexpr std::array<uint8_t, 32> kSigningSeed = {7,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10,
                                                         11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                                         22, 23, 24, 25, 26, 27, 28, 29, 30, 31};

// Tensors (sorted by name) of the fixed fuzz inventory: widths 2, 4, 1, 8, 2.
struct FixedModel {
  std::vector<std::string> names = {"a.bf16", "b.f32", "c.i8", "d.f64", "e.f16"};
  std::vector<std::string> dtypes = {"BF16", "F32", "I8", "F64", "F16"};
  std::vector<int64_t> sizes = {4096, 700, 3000, 100, 257};
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<TensorBuffer> Buffers() {
    std::vector<TensorBuffer> out;
    if (bufs.empty()) {
      for (size_t i = 0; i < names.size(); ++i) {
        int w = DTypeWidth(DTypeFromName(dtypes[i]));
        bufs.emplace_back(static_cast<size_t>(sizes[i]) * w);
        for (size_t b = 0; b < bufs.back().size(); ++b)
          bufs.back()[b] = static_cast<uint8_t>(b * 131 + i);
      }
    }
    for (size_t i = 0; i < names.size(); ++i) {
      int w = DTypeWidth(DTypeFromName(dtypes[i]));
      out.push_back({bufs[i].data(), static_cast<uint64_t>(sizes[i]), w, TensorSalt(names[i])});
    }
    return out;
  }
  // The buffers as a BufferReceiver's storage. REQUIRES: Buffers() called once.
  std::vector<ReceiverTensor> Tensors() {
    std::vector<ReceiverTensor> out;
    for (size_t i = 0; i < names.size(); ++i) {
      ReceiverTensor t;
      t.info.name = names[i];
      t.info.dtype_name = dtypes[i];
      t.info.dtype = DTypeFromName(dtypes[i]);
      t.info.shape = {sizes[i]};
      t.info.nbytes = bufs[i].size();
      t.data = bufs[i].data();
      out.push_back(std::move(t));
    }
    return out;
  }
  std::vector<TensorView> Views() const {
    std::vector<TensorView> v;
    for (size_t i = 0; i < names.size(); ++i) {
      v.push_back({names[i], dtypes[i], {sizes[i]}, bufs[i].data(), bufs[i].size()});
    }
    return v;
  }
};

}  // namespace dcr::fuzz

#endif  // DCR_TESTS_FUZZ_FUZZ_COMMON_H_
