#include "dcr/fault_kind.h"

#include <string>

#include "dcr/status.h"

namespace dcr {
namespace {

constexpr const char* kKindNames[kNumFaultKinds] = {"kill_receiver_boundary",
                                                    "kill_receiver_inside_chunk",
                                                    "kill_receiver_lose_memory",
                                                    "torn_journal",
                                                    "kill_relay",
                                                    "corrupt_chunk",
                                                    "duplicate_chunk",
                                                    "reorder_chunks",
                                                    "delay_chunk",
                                                    "store_write_fail",
                                                    "partition_long_link",
                                                    "restart_sender",
                                                    "stale_delta"};

}  // namespace

const char* FaultKindName(FaultKind kind) {
  int k = static_cast<int>(kind);
  return k >= 0 && k < kNumFaultKinds ? kKindNames[k] : "unknown";
}

StatusOr<FaultKind> FaultKindFromName(const std::string& name) {
  std::string known;
  for (int k = 0; k < kNumFaultKinds; ++k) {
    if (name == kKindNames[k]) return static_cast<FaultKind>(k);
    known += (k ? ", " : "") + std::string(kKindNames[k]);
  }
  return InvalidArgumentError("unknown fault kind '" + name + "' (known: " + known + ")");
}

}  // namespace dcr
