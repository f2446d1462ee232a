#include "dcr/hash.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "dcr/device.h"
#include "internal/element_ops.h"
#include "internal/parallel.h"
#include "internal/simd.h"

namespace dcr {

uint64_t TensorSalt(std::string_view name) { return XXH3_64bits(name.data(), name.size()); }

uint64_t LoadBits(const uint8_t* data, int width, uint64_t i) {
  return internal::LoadElem(data, width, i);
}

Hash128 TensorIdentityTerm(std::string_view name, std::string_view dtype_name,
                           const std::vector<int64_t>& shape) {
  std::string id(name);
  id.push_back('\0');
  id.append(dtype_name);
  id.push_back('\0');
  for (int64_t d : shape) id.append(reinterpret_cast<const char*>(&d), sizeof d);
  XXH128_hash_t h = XXH3_128bits(id.data(), id.size());
  return Hash128{h.low64, h.high64};
}

namespace {
template <typename T>
Hash128 RangeHashT(uint64_t salt, const uint8_t* data, uint64_t begin, uint64_t count) {
  Hash128 acc;
  const T* p = reinterpret_cast<const T*>(data);
  for (uint64_t i = begin; i < begin + count; ++i) {
    T v;
    std::memcpy(&v, p + i, sizeof(T));
    HashAdd(&acc, ElementTerm(salt, i, static_cast<uint64_t>(v)));
  }
  return acc;
}
}  // namespace

Hash128 RangeHash(uint64_t salt, const uint8_t* data, int width, uint64_t begin, uint64_t count) {
  if (width <= 4 && internal::CpuHasAvx2()) {
    Hash128 h;
    internal::ElementTermSumAvx2(salt, data, width, begin, count, &h.lo, &h.hi);
    return h;
  }
  switch (width) {
    case 1:
      return RangeHashT<uint8_t>(salt, data, begin, count);
    case 2:
      return RangeHashT<uint16_t>(salt, data, begin, count);
    case 4:
      return RangeHashT<uint32_t>(salt, data, begin, count);
    default:
      return RangeHashT<uint64_t>(salt, data, begin, count);
  }
}

namespace {

// Identity terms plus range(view, salt, width, begin, count) over (tensor, group) items of up to
// `group` elements, `threads` items at a time. The sum is commutative, so the split and the thread
// count do not change the result. The first error of `range` ends the sum.
template <typename Range>
StatusOr<Hash128> SumContentTerms(const std::vector<TensorView>& tensors, int threads,
                                  uint64_t group, const Range& range) {
  struct Item {
    size_t t;
    uint64_t begin, count;
  };
  std::vector<Item> items;
  std::vector<uint64_t> salts(tensors.size());
  std::vector<int> widths(tensors.size());
  Hash128 total;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    HashAdd(&total, TensorIdentityTerm(t.name, t.dtype_name, t.shape));
    salts[i] = TensorSalt(t.name);
    widths[i] = DTypeWidth(DTypeFromName(t.dtype_name));
    const uint64_t n = t.nbytes / static_cast<uint64_t>(widths[i]);
    for (uint64_t b = 0; b < n; b += group) items.push_back({i, b, std::min(group, n - b)});
  }
  std::mutex mu;
  Status first;
  internal::ParallelFor(items.size(), threads, [&](uint64_t k) {
    const Item& it = items[k];
    StatusOr<Hash128> h = range(tensors[it.t], salts[it.t], widths[it.t], it.begin, it.count);
    std::lock_guard<std::mutex> lock(mu);
    if (!h.ok()) {
      if (first.ok()) first = h.status();
      return false;
    }
    HashAdd(&total, *h);
    return true;
  });
  if (!first.ok()) return first;
  return total;
}

}  // namespace

Hash128 ContentHashOf(const std::vector<TensorView>& tensors, int threads) {
  // Groups of up to 1M elements; a host range hash cannot fail.
  return *SumContentTerms(tensors, threads, uint64_t{1} << 20,
                          [](const TensorView& t, uint64_t salt, int width, uint64_t begin,
                             uint64_t count) -> StatusOr<Hash128> {
                            return RangeHash(salt, static_cast<const uint8_t*>(t.data), width,
                                             begin, count);
                          });
}

StatusOr<Hash128> DeviceContentHashOf(Device* device, const std::vector<TensorView>& tensors,
                                      int threads) {
  // Groups of up to 4M elements: each is one device call.
  return SumContentTerms(
      tensors, threads, uint64_t{1} << 22,
      [device](const TensorView& t, uint64_t salt, int width, uint64_t begin,
               uint64_t count) -> StatusOr<Hash128> {
        StatusOr<Hash128> h = device->RangeHash(salt, t.data, width, begin, count);
        if (!h.ok()) {
          return h.status().WithContext("hashing tensor '" + t.name + "' on " + device->name());
        }
        return h;
      });
}

Hash128 PackedBitsHash(const uint64_t* bits, size_t k, int width) {
  // Pack in blocks so the hash streams without a k-sized buffer.
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  alignas(8) uint8_t buf[4096];
  size_t per = sizeof(buf) / static_cast<size_t>(width);
  // Little-endian low `width` bytes of each value (typed stores: a per-element memcpy of a
  // runtime width was a library call per element).
  auto pack = [&](auto tag, size_t i, size_t m) {
    using T = decltype(tag);
    T* out = reinterpret_cast<T*>(buf);
    for (size_t j = 0; j < m; ++j) out[j] = static_cast<T>(bits[i + j]);
  };
  for (size_t i = 0; i < k; i += per) {
    size_t m = std::min(per, k - i);
    switch (width) {
      case 1:
        pack(uint8_t{}, i, m);
        break;
      case 2:
        pack(uint16_t{}, i, m);
        break;
      case 4:
        pack(uint32_t{}, i, m);
        break;
      case 8:
        pack(uint64_t{}, i, m);
        break;
      default:
        for (size_t j = 0; j < m; ++j) std::memcpy(buf + j * width, &bits[i + j], width);
        break;
    }
    XXH3_128bits_update(st, buf, m * width);
  }
  XXH128_hash_t h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  return Hash128{h.low64, h.high64};
}

Hash128 BytesHash128(const void* data, size_t size) {
  XXH128_hash_t h = XXH3_128bits(data, size);
  return Hash128{h.low64, h.high64};
}

}  // namespace dcr
