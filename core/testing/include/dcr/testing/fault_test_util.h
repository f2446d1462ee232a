// Test helpers of the fault area: small in-memory checkpoints, version chains, receivers over
// BufferReceiver. Header-only; used by *_test.cc here and by tests/fault.
#ifndef DCR_CORE_TESTING_INCLUDE_DCR_TESTING_FAULT_TEST_UTIL_H_
#define DCR_CORE_TESTING_INCLUDE_DCR_TESTING_FAULT_TEST_UTIL_H_

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dcr/apply.h"
#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/hash.h"
#include "dcr/receiver.h"
#include "dcr/testing/fixtures.h"

namespace dcr::testing {

// The safetensors image of a model (tensors back to back in the given order).
inline std::vector<uint8_t> SafetensorsBytes(const Model& m) {
  std::vector<uint64_t> offsets;
  std::string header = BuildSafetensorsHeader(Views(m), {}, &offsets);
  std::vector<uint8_t> out(header.begin(), header.end());
  size_t data_start = out.size();
  uint64_t total = 0;
  for (size_t i = 0; i < m.size(); ++i) total = std::max(total, offsets[i] + m[i].bytes.size());
  out.resize(data_start + total, 0);
  for (size_t i = 0; i < m.size(); ++i) {
    std::memcpy(out.data() + data_start + offsets[i], m[i].bytes.data(), m[i].bytes.size());
  }
  return out;
}

inline std::unique_ptr<Checkpoint> MakeCheckpoint(const Model& m) {
  auto c = Checkpoint::FromBytes(SafetensorsBytes(m));
  if (!c.ok()) {
    std::fprintf(stderr, "MakeCheckpoint: %s\n", c.status().ToString().c_str());
    std::abort();
  }
  return std::move(c).value();
}

inline uint64_t GetBits(const std::vector<uint8_t>& b, int w, uint64_t i) {
  uint64_t v = 0;
  std::memcpy(&v, b.data() + i * w, w);
  return v;
}
inline void PutBits(std::vector<uint8_t>* b, int w, uint64_t i, uint64_t v) {
  std::memcpy(b->data() + i * w, &v, w);
}

// A model with large BF16 matrices (several chunks each at small chunk_elems), an F32 tensor, an
// I8 tensor and small tensors that the grid batches together. Names sort in declaration order.
inline Model RandomModel(uint64_t seed, uint64_t scale = 1) {
  std::mt19937_64 rng(seed);
  Model m;
  auto add = [&](const std::string& name, const std::string& dtype, std::vector<int64_t> shape) {
    OwnedTensor t{name, dtype, shape, {}};
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    t.bytes.resize(n * t.width());
    for (auto& b : t.bytes) b = static_cast<uint8_t>(rng());
    if (dtype == "BF16") {
      // Realistic weights: small magnitudes (exponent around 2^-6).
      for (uint64_t i = 0; i < n; ++i) {
        uint64_t v = (rng() & 0x807F) | (0x3C00 + (rng() % 0x100));
        PutBits(&t.bytes, 2, i, v);
      }
    }
    m.push_back(std::move(t));
  };
  add("a.embed", "BF16", {static_cast<int64_t>(64 * scale), 512});
  add("b.layer0.attn", "BF16", {static_cast<int64_t>(96 * scale), 384});
  add("c.layer0.norm", "F32", {512});
  add("d.layer0.scale", "I8", {static_cast<int64_t>(40 * scale), 100});
  add("e.layer1.bias", "BF16", {300});
  add("f.layer1.mlp", "BF16", {static_cast<int64_t>(128 * scale), 256});
  add("g.head", "F16", {static_cast<int64_t>(50 * scale), 200});
  return m;
}

// The next version: about `rate` of the elements change (floats by a few ulp, ints randomly).
inline Model NextVersion(const Model& prev, uint64_t seed, double rate) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  Model m = prev;
  for (auto& t : m) {
    int w = t.width();
    bool is_float = DTypeIsFloat(DTypeFromName(t.dtype));
    for (uint64_t i = 0; i < t.n(); ++i) {
      if (u(rng) >= rate) continue;
      uint64_t v = GetBits(t.bytes, w, i);
      if (is_float) {
        v = (v + 1 + rng() % 3) & ((w == 8) ? ~0ull : ((1ull << (8 * w)) - 1));
      } else {
        v ^= 1 + rng() % 255;
      }
      PutBits(&t.bytes, w, i, v);
    }
  }
  return m;
}

// Builds the delta bytes base -> target.
inline std::vector<uint8_t> DeltaBytes(const Checkpoint* base, const Checkpoint& target,
                                       const DeltaOptions& o) {
  DeltaMemorySink sink;
  auto st = BuildDelta(base, target, o, &sink);
  if (!st.ok()) {
    std::fprintf(stderr, "BuildDelta: %s\n", st.status().ToString().c_str());
    std::abort();
  }
  return sink.Release();
}

// Small grid so that the test models have tens of chunks.
inline DeltaOptions SmallGrid(uint64_t base_version, uint64_t target_version) {
  DeltaOptions o;
  o.chunk_elems = 8192;
  o.small_tensor_elems = 1024;
  o.threads = 1;
  o.base_version = base_version;
  o.target_version = target_version;
  return o;
}

// Receiver storage: one buffer per inventory tensor (sorted by name), loaded from a checkpoint.
struct Storage {
  Inventory inv;
  std::vector<std::vector<uint8_t>> bufs;

  static Storage Load(const Checkpoint& c) {
    Storage s;
    s.inv = Inventory::FromCheckpoint(c);
    for (const TensorInfo& t : s.inv.tensors) {
      const TensorInfo* ct = c.Find(t.name);
      const uint8_t* p = c.data(*ct);
      s.bufs.emplace_back(p, p + ct->nbytes);
    }
    return s;
  }
  std::vector<TensorBuffer> Buffers() {
    std::vector<TensorBuffer> out;
    for (size_t i = 0; i < bufs.size(); ++i) {
      out.push_back(
          {bufs[i].data(), inv.tensors[i].num_elements(), inv.tensors[i].width(), inv.salts[i]});
    }
    return out;
  }
  // The buffers as a BufferReceiver's storage.
  std::vector<ReceiverTensor> Tensors() {
    std::vector<ReceiverTensor> out;
    for (size_t i = 0; i < bufs.size(); ++i) out.push_back({inv.tensors[i], bufs[i].data()});
    return out;
  }
  // Byte equality with every tensor of `c`.
  bool Equals(const Checkpoint& c) const {
    for (size_t i = 0; i < bufs.size(); ++i) {
      const TensorInfo* ct = c.Find(inv.tensors[i].name);
      if (ct == nullptr || ct->nbytes != bufs[i].size()) return false;
      if (std::memcmp(c.data(*ct), bufs[i].data(), bufs[i].size()) != 0) return false;
    }
    return true;
  }
  Hash128 ContentHash() const {
    std::vector<TensorView> v;
    for (size_t i = 0; i < bufs.size(); ++i) {
      const TensorInfo& t = inv.tensors[i];
      v.push_back({t.name, t.dtype_name, t.shape, bufs[i].data(), bufs[i].size()});
    }
    return ContentHashOf(v, 1);
  }
};

// Writes the first `count` changes of a decoded chunk into `s` without any check: the state a
// process killed inside ApplyChunk leaves behind.
inline void ApplyPartially(const DecodedChunk& c, Storage* s, uint64_t count) {
  const ChunkHeader& h = c.header;
  const int w = h.elem_width;
  SegmentCursor cur(h.segments);
  bool dense = h.position_mode == PositionMode::kDense;
  for (uint64_t k = 0; k < count && k < c.values.size(); ++k) {
    uint32_t seg;
    uint64_t e;
    cur.Locate(dense ? k : c.positions[k], &seg, &e);
    auto& buf = s->bufs[h.segments[seg].tensor_index];
    uint64_t old = GetBits(buf, w, e);
    PutBits(&buf, w, e, ApplyValue(h.value_mode, w, old, c.values[k]));
  }
}

}  // namespace dcr::testing

#endif  // DCR_CORE_TESTING_INCLUDE_DCR_TESTING_FAULT_TEST_UTIL_H_
