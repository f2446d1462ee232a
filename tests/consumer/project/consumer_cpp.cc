// A C++ program built against an installed dcr through its CMake package (find_package(dcr),
// dcr::dcr), never against the source tree: applies a delta file to its base with the C++ API
// (dcr/apply.h) and compares the result with the target byte for byte.
//
//   consumer_cpp BASE DELTA OUT TARGET
//
// Exit 0 when the apply succeeds and OUT equals TARGET; 1 otherwise, saying why.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "dcr/apply.h"
#include "dcr/dcr_c.h"
#include "dcr/status.h"

namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s BASE DELTA OUT TARGET\n", argv[0]);
    return 2;
  }
  dcr::ApplyOptions options;
  options.threads = 1;
  options.verify_full = true;
  dcr::StatusOr<dcr::ApplyStats> st = dcr::ApplyDeltaFile(argv[1], argv[2], argv[3], options);
  if (!st.ok()) {
    std::fprintf(stderr, "apply: %s\n", st.status().ToString().c_str());
    return 1;
  }
  const std::string out = ReadAll(argv[3]), target = ReadAll(argv[4]);
  if (out.empty() || out != target) {
    std::fprintf(stderr, "%s differs from %s (%zu and %zu bytes)\n", argv[3], argv[4], out.size(),
                 target.size());
    return 1;
  }
  // A bad input is an error value across the library boundary, not an exception or an abort.
  st = dcr::ApplyDeltaFile(argv[1], argv[4], argv[3] + std::string(".bad"), options);
  if (st.ok()) {
    std::fprintf(stderr, "a safetensors file applied as a delta\n");
    return 1;
  }
  std::printf("applied %s: %zu bytes equal to the target; a non-delta refused: %s (C ABI %d)\n",
              argv[2], out.size(), st.status().ToString().c_str(), dcr_c_abi_version());
  return 0;
}
