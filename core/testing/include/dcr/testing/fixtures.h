// Small fixtures shared by tests and benches: a tensor that owns its bytes, the TensorView list of
// a model made of them, and a temporary directory removed with the test. Header-only.
#ifndef DCR_CORE_TESTING_INCLUDE_DCR_TESTING_FIXTURES_H_
#define DCR_CORE_TESTING_INCLUDE_DCR_TESTING_FIXTURES_H_

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/dtype.h"

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

}  // namespace dcr::testing

#endif  // DCR_CORE_TESTING_INCLUDE_DCR_TESTING_FIXTURES_H_
