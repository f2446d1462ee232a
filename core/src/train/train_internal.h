// Private helpers of the training side: the framework's naming rules (which Megatron-style
// parameter a Hugging Face tensor comes from) and a small parallel loop.
#ifndef DCR_CORE_SRC_TRAIN_TRAIN_INTERNAL_H_
#define DCR_CORE_SRC_TRAIN_TRAIN_INTERNAL_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "dcr/train.h"

namespace dcr::internal {

// How a canonical tensor is held by the training framework.
enum class ParamKind {
  kReplicated,  // full copy on every tensor-parallel rank
  kNorm,        // replicated; FP32 on ranks when layout.fp32_norms
  kColumn,      // rows split over tp
  kRow,         // columns split over tp
  kVocab,       // rows split over tp, padded to padded_vocab
  kQkv,         // fused q/k/v, part 0/1/2
  kFc1,         // fused gate/up, part 0/1
  kFold,        // row-parallel down_proj with an FP32 per-row scale folded in at export
  kExpertW1,    // grouped transposed expert gate/up, part 0/1
  kExpertW2,    // grouped transposed expert down
};

struct TensorPlacement {
  ParamKind kind = ParamKind::kReplicated;
  int part = 0;
  int64_t layer = -1;       // global layer index, -1 for non-layer tensors
  int64_t expert = -1;      // global expert index for expert tensors
  int stage = 0;            // pipeline stage holding it
  std::string param;        // local parameter name on the stage (layer index local)
  std::string global;       // stage-independent parameter name (for init/gradient keys)
  std::string scale_param;  // kFold: the FP32 scale parameter
};

// Classifies canonical tensor `t` (REQUIRES: s's canonical inventory, layers assigned).
TensorPlacement PlaceTensor(const TrainStructure& s, const TensorSpec& t);

uint64_t Mix64(uint64_t x);
uint64_t HashString(const std::string& s);

// Runs fn(i) for i in [0, n) on up to `threads` threads (0 = hardware concurrency).
inline void ParallelForEach(uint64_t n, int threads, const std::function<void(uint64_t)>& fn) {
  unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  uint64_t nt = threads > 0 ? static_cast<uint64_t>(threads) : hw;
  nt = std::min<uint64_t>(nt, n);
  if (nt <= 1) {
    for (uint64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<uint64_t> next{0};
  std::vector<std::thread> pool;
  for (uint64_t k = 0; k < nt; ++k) {
    pool.emplace_back([&]() {
      for (uint64_t i = next++; i < n; i = next++) fn(i);
    });
  }
  for (auto& th : pool) th.join();
}

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_TRAIN_TRAIN_INTERNAL_H_
