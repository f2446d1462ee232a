// A decode-only program: applies a delta to its base checkpoint (decoded chunk by chunk into a host
// buffer, proven by the target content hash) and compares the result with the expected target.
// Linked against dcr::format alone; link_test.sh checks what that pulls in.
//   dcr_decode_only BASE.safetensors DELTA.dcr TARGET.safetensors OUT.safetensors
// Exit status: 0 when OUT equals TARGET byte for byte, tensor for tensor; 1 otherwise (message on
// stderr); 2 usage.
#include <cstdio>
#include <cstring>
#include <memory>

#include "dcr/apply.h"
#include "dcr/checkpoint.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s BASE DELTA TARGET OUT\n", argv[0]);
    return 2;
  }
  dcr::ApplyOptions options;
  options.verify_full = true;
  auto stats = dcr::ApplyDeltaFile(argv[1], argv[2], argv[4], options);
  if (!stats.ok()) {
    std::fprintf(stderr, "apply: %s\n", stats.status().ToString().c_str());
    return 1;
  }
  auto out = dcr::Checkpoint::Open(argv[4]);
  auto target = dcr::Checkpoint::Open(argv[3]);
  if (!out.ok() || !target.ok()) {
    std::fprintf(stderr, "open: %s %s\n", out.status().ToString().c_str(),
                 target.status().ToString().c_str());
    return 1;
  }
  const auto& got = (*out)->tensors();
  const auto& want = (*target)->tensors();
  if (got.size() != want.size()) {
    std::fprintf(stderr, "result has %zu tensors, the target %zu\n", got.size(), want.size());
    return 1;
  }
  for (const dcr::TensorInfo& t : want) {
    const dcr::TensorInfo* g = (*out)->Find(t.name);
    if (g == nullptr || g->nbytes != t.nbytes ||
        std::memcmp((*out)->data(*g), (*target)->data(t), t.nbytes) != 0) {
      std::fprintf(stderr, "tensor %s differs from the target\n", t.name.c_str());
      return 1;
    }
  }
  std::printf("applied %llu chunks, %llu changes; result equals the target\n",
              static_cast<unsigned long long>(stats->chunks),
              static_cast<unsigned long long>(stats->changes));
  return 0;
}
