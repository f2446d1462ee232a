// Device kinds, the local rank, and the host backend of dcr/device.h.
#include "dcr/device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "dcr/hash.h"
#include "dcr/status_macros.h"
#include "internal/element_ops.h"
#include "internal/parallel.h"
#include "receivers/codec_device.h"

namespace dcr {

StatusOr<DeviceKind> ParseDeviceKind(const std::string& name) {
  if (name == "cpu") return DeviceKind::kCpu;
  if (name == "host") return DeviceKind::kHost;
  if (name == "cuda") return DeviceKind::kCuda;
  return InvalidArgumentError("unknown device '" + name + "' (expected cpu, host or cuda)");
}

const char* DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kHost:
      return "host";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "?";
}

int LocalRankFromEnvironment() {
  for (const char* var : {"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"}) {
    const char* v = std::getenv(var);
    if (v == nullptr || *v == '\0') continue;
    char* end = nullptr;
    const long r = std::strtol(v, &end, 10);
    if (*end != '\0' || r < 0 || r > (1 << 20)) return -1;
    return static_cast<int>(r);
  }
  return -1;
}

namespace {

bool ValidWidth(int w) { return w == 1 || w == 2 || w == 4 || w == 8; }

// The host backend: allocations are 256-byte aligned host memory, every operation a loop over
// element_ops.h on the calling thread (Diff splits large arrays over worker threads).
class HostDevice : public Device {
 public:
  explicit HostDevice(const HostDeviceOptions& o,
                      std::vector<std::pair<const void*, uint64_t>> adopted = {})
      : options_(o) {
    for (const auto& [p, bytes] : adopted) {
      if (bytes > 0) adopted_[reinterpret_cast<uintptr_t>(p)] = bytes;
    }
  }
  ~HostDevice() override {
    for (const auto& [p, bytes] : allocs_) std::free(reinterpret_cast<void*>(p));
  }

  std::string name() const override { return "host"; }
  DeviceKind kind() const override { return DeviceKind::kHost; }

  StatusOr<void*> Allocate(uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (options_.memory_bytes != 0 &&
        (bytes > options_.memory_bytes || used_ > options_.memory_bytes - bytes)) {
      return ResourceExhaustedError("out of device memory on host: " + std::to_string(bytes) +
                                    " bytes requested, " +
                                    std::to_string(options_.memory_bytes - used_) + " of " +
                                    std::to_string(options_.memory_bytes) + " bytes free");
    }
    const uint64_t rounded = (std::max<uint64_t>(bytes, 1) + 255) / 256 * 256;
    void* p = rounded < bytes ? nullptr : std::aligned_alloc(256, rounded);
    if (p == nullptr) {
      return ResourceExhaustedError("out of device memory on host: " + std::to_string(bytes) +
                                    " bytes requested, the host allocation failed");
    }
    allocs_[reinterpret_cast<uintptr_t>(p)] = bytes;
    used_ += bytes;
    return p;
  }

  void Free(void* p) override {
    if (p == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = allocs_.find(reinterpret_cast<uintptr_t>(p));
    if (it == allocs_.end()) return;  // not ours: ignored rather than corrupting the heap
    used_ -= it->second;
    allocs_.erase(it);
    std::free(p);
  }

  Status Upload(void* dst, const void* src, uint64_t bytes) override {
    DCR_RETURN_IF_ERROR(CheckRange(dst, bytes, "Upload destination"));
    if (bytes) std::memcpy(dst, src, bytes);
    return Status::OK();
  }
  Status Download(void* dst, const void* src, uint64_t bytes) override {
    DCR_RETURN_IF_ERROR(CheckRange(src, bytes, "Download source"));
    if (bytes) std::memcpy(dst, src, bytes);
    return Status::OK();
  }
  Status Copy(void* dst, const void* src, uint64_t bytes) override {
    DCR_RETURN_IF_ERROR(CheckRange(dst, bytes, "Copy destination"));
    DCR_RETURN_IF_ERROR(CheckRange(src, bytes, "Copy source"));
    if (bytes) std::memmove(dst, src, bytes);
    return Status::OK();
  }

  Status Gather(const uint64_t* read_addr, const uint64_t* values, uint64_t n, int width,
                ValueMode mode, uint64_t* old_bits, uint64_t* new_bits) override {
    if (!ValidWidth(width))
      return InvalidArgumentError("Gather: element width must be 1, 2, 4 or 8");
    const uint8_t op = static_cast<uint8_t>(mode);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t o =
          internal::LoadElem(reinterpret_cast<const uint8_t*>(read_addr[i]), width, 0);
      old_bits[i] = o;
      new_bits[i] = internal::ApplyOp(op, width, o, values[i]);
    }
    return Status::OK();
  }

  Status Scatter(const uint64_t* write_addr, const uint64_t* write_begin, const uint64_t* new_bits,
                 uint64_t n, int width) override {
    if (!ValidWidth(width))
      return InvalidArgumentError("Scatter: element width must be 1, 2, 4 or 8");
    for (uint64_t i = 0; i < n; ++i) {
      for (uint64_t k = write_begin[i]; k < write_begin[i + 1]; ++k) {
        internal::StoreElem(reinterpret_cast<uint8_t*>(write_addr[k]), width, 0, new_bits[i]);
      }
    }
    return Status::OK();
  }

  StatusOr<DeviceDiffResult> Diff(const void* old_data, const void* new_data, uint64_t n, int width,
                                  ValueMode mode) override {
    if (!ValidWidth(width)) return InvalidArgumentError("Diff: element width must be 1, 2, 4 or 8");
    DCR_RETURN_IF_ERROR(CheckRange(old_data, n * width, "Diff old data"));
    DCR_RETURN_IF_ERROR(CheckRange(new_data, n * width, "Diff new data"));
    const auto* a = static_cast<const uint8_t*>(old_data);
    const auto* b = static_cast<const uint8_t*>(new_data);
    const uint8_t op = static_cast<uint8_t>(mode);
    // Blocks scanned concurrently, each into its own result, concatenated in order.
    constexpr uint64_t kBlock = uint64_t{1} << 20;
    std::vector<DeviceDiffResult> parts((n + kBlock - 1) / kBlock);
    internal::ParallelFor(parts.size(), 0, [&](uint64_t k) {
      DeviceDiffResult& r = parts[k];
      const uint64_t end = std::min(n, (k + 1) * kBlock);
      for (uint64_t i = k * kBlock; i < end; ++i) {
        const uint64_t o = internal::LoadElem(a, width, i), nb = internal::LoadElem(b, width, i);
        if (o == nb) continue;
        r.positions.push_back(i);
        r.values.push_back(internal::EncodeValue(op, width, o, nb));
        r.old_bits.push_back(o);
        r.new_bits.push_back(nb);
      }
      return true;
    });
    if (parts.size() == 1) return std::move(parts[0]);
    DeviceDiffResult r;
    uint64_t total = 0;
    for (const DeviceDiffResult& p : parts) total += p.positions.size();
    r.positions.reserve(total);
    r.values.reserve(total);
    r.old_bits.reserve(total);
    r.new_bits.reserve(total);
    for (const DeviceDiffResult& p : parts) {
      r.positions.insert(r.positions.end(), p.positions.begin(), p.positions.end());
      r.values.insert(r.values.end(), p.values.begin(), p.values.end());
      r.old_bits.insert(r.old_bits.end(), p.old_bits.begin(), p.old_bits.end());
      r.new_bits.insert(r.new_bits.end(), p.new_bits.begin(), p.new_bits.end());
    }
    return r;
  }

  StatusOr<Hash128> RangeHash(uint64_t salt, const void* data, int width, uint64_t begin,
                              uint64_t count) override {
    if (!ValidWidth(width))
      return InvalidArgumentError("RangeHash: element width must be 1, 2, 4 or 8");
    DCR_RETURN_IF_ERROR(CheckRange(static_cast<const uint8_t*>(data) + begin * width, count * width,
                                   "RangeHash data"));
    return ::dcr::RangeHash(salt, static_cast<const uint8_t*>(data), width, begin, count);
  }

  StatusOr<uint64_t> FirstDifference(const void* a, const void* b, uint64_t bytes) override {
    DCR_RETURN_IF_ERROR(CheckRange(a, bytes, "FirstDifference first range"));
    DCR_RETURN_IF_ERROR(CheckRange(b, bytes, "FirstDifference second range"));
    const auto* x = static_cast<const uint8_t*>(a);
    const auto* y = static_cast<const uint8_t*>(b);
    // memcmp finds a differing block fast; the byte is then located within it.
    constexpr uint64_t kBlock = 1 << 16;
    for (uint64_t at = 0; at < bytes; at += kBlock) {
      const uint64_t n = std::min(kBlock, bytes - at);
      if (std::memcmp(x + at, y + at, n) == 0) continue;
      uint64_t i = at;
      while (x[i] == y[i]) ++i;
      return i;
    }
    return bytes;
  }

 private:
  // Whether [a, a + bytes) lies inside one range of `ranges` (address -> bytes).
  static bool Inside(const std::map<uintptr_t, uint64_t>& ranges, uintptr_t a, uint64_t bytes) {
    auto it = ranges.upper_bound(a);
    if (it == ranges.begin()) return false;
    --it;
    return a - it->first <= it->second && bytes <= it->second - (a - it->first);
  }

  // kInvalidArgument unless [p, p + bytes) lies inside one allocation or adopted range.
  Status CheckRange(const void* p, uint64_t bytes, const char* what) const {
    if (bytes == 0) return Status::OK();
    const auto a = reinterpret_cast<uintptr_t>(p);
    if (Inside(adopted_, a, bytes)) return Status::OK();  // constant after construction
    std::lock_guard<std::mutex> lock(mu_);
    if (Inside(allocs_, a, bytes)) return Status::OK();
    return InvalidArgumentError(std::string(what) + " (" + std::to_string(bytes) +
                                " bytes) is not inside an allocation of device host");
  }

  const HostDeviceOptions options_;
  mutable std::mutex mu_;
  std::map<uintptr_t, uint64_t> allocs_;   // address -> requested bytes; guarded by mu_
  std::map<uintptr_t, uint64_t> adopted_;  // the caller's ranges: address -> bytes; not freed
  uint64_t used_ = 0;                      // guarded by mu_
};

}  // namespace

std::unique_ptr<Device> MakeHostDevice(const HostDeviceOptions& options) {
  return std::make_unique<HostDevice>(options);
}

namespace internal {

std::unique_ptr<Device> MakeHostDeviceOver(std::vector<std::pair<const void*, uint64_t>> adopted) {
  return std::make_unique<HostDevice>(HostDeviceOptions{}, std::move(adopted));
}

}  // namespace internal

}  // namespace dcr
