// Small fixtures shared by tests and benches: a tensor that owns its bytes, the TensorView list of
// a model made of them, and a temporary directory removed with the test. Header-only.
#ifndef DCR_CORE_TESTING_INCLUDE_DCR_TESTING_FIXTURES_H_
#define DCR_CORE_TESTING_INCLUDE_DCR_TESTING_FIXTURES_H_

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/dtype.h"
#include "dcr/status_macros.h"
#include "dcr/statusor.h"

namespace dcr::testing {

struct OwnedTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  int width() const { return DTypeWidth(DTypeFromName(dtype)); }
  uint64_t n() const { return bytes.size() / static_cast<uint64_t>(width()); }
};
using Model = std::vector<OwnedTensor>;

// Views over the tensors of `m`, in order; valid while `m` is unchanged.
inline std::vector<TensorView> Views(const Model& m) {
  std::vector<TensorView> v;
  for (const auto& t : m) v.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  return v;
}

// A fresh directory under the system temporary directory, named "dcr_<pid>_<random>", removed
// with everything in it by the destructor. `dir / "file"` is the path of a file in it.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() /
           ("dcr_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& f) const { return (path / f).string(); }
};

// Three checkpoints of one shape written under a fresh directory: a base, a target with about
// `change_percent`% of its elements changed, and an unrelated checkpoint (a receiver that holds
// the wrong base). The directory is kept: tests of one binary share the files across cases.
struct ChangedCheckpoints {
  std::string dir, base, target, other;  // base.safetensors, target.safetensors, other.safetensors
};
struct TensorSpec {
  std::string name, dtype;
  std::vector<int64_t> shape;
};
// Writes them under /tmp/<prefix>XXXXXX. Element i of each tensor of the base is `base_element`
// (its `width` bytes at `e`), the unrelated checkpoint's bytes are random, and each element of
// the target is, with probability change_percent / 100, the base's after `change_element`; every
// draw comes from one generator seeded with `seed`, so the files are the same on every run.
// Errors: those of WriteSafetensors; kInternal when the directory cannot be made.
inline StatusOr<ChangedCheckpoints> WriteChangedCheckpoints(
    const std::string& prefix, const std::vector<TensorSpec>& specs, uint64_t seed,
    int change_percent,
    const std::function<void(std::mt19937_64& rng, uint8_t* e, int width)>& base_element,
    const std::function<void(std::mt19937_64& rng, uint8_t* e, int width)>& change_element) {
  ChangedCheckpoints f;
  std::string tmpl = "/tmp/" + prefix + "XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return InternalError("mkdtemp " + tmpl + " failed");
  f.dir = tmpl;
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint8_t>> base, target, other;
  for (const TensorSpec& t : specs) {
    const int width = DTypeWidth(DTypeFromName(t.dtype));
    uint64_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    std::vector<uint8_t> b(n * width), o(n * width);
    for (uint64_t i = 0; i < n; ++i) base_element(rng, b.data() + i * width, width);
    for (auto& x : o) x = static_cast<uint8_t>(rng());
    std::vector<uint8_t> g = b;
    for (uint64_t i = 0; i < n; ++i) {
      if (static_cast<int>(rng() % 100) < change_percent) {
        change_element(rng, g.data() + i * width, width);
      }
    }
    base.push_back(std::move(b));
    target.push_back(std::move(g));
    other.push_back(std::move(o));
  }
  auto write = [&](const std::string& path, const std::vector<std::vector<uint8_t>>& data) {
    std::vector<TensorView> views;
    for (size_t i = 0; i < specs.size(); ++i) {
      views.push_back(TensorView{specs[i].name, specs[i].dtype, specs[i].shape, data[i].data(),
                                 data[i].size()});
    }
    return WriteSafetensors(path, views);
  };
  f.base = f.dir + "/base.safetensors";
  f.target = f.dir + "/target.safetensors";
  f.other = f.dir + "/other.safetensors";
  DCR_RETURN_IF_ERROR(write(f.base, base));
  DCR_RETURN_IF_ERROR(write(f.target, target));
  DCR_RETURN_IF_ERROR(write(f.other, other));
  return f;
}

}  // namespace dcr::testing

#endif  // DCR_CORE_TESTING_INCLUDE_DCR_TESTING_FIXTURES_H_
