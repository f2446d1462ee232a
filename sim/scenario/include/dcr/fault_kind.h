// The fault kinds of a scenario's `faults:` block (the deterministic fault harness injects them):
// the enum, and the pinned names scenario files and reports use.
//
// Thread safety: pure functions.
#ifndef DCR_SIM_SCENARIO_INCLUDE_DCR_FAULT_KIND_H_
#define DCR_SIM_SCENARIO_INCLUDE_DCR_FAULT_KIND_H_

#include <cstdint>
#include <string>

#include "dcr/statusor.h"

namespace dcr {

// Pinned names (scenario files, reports) in FaultKindName.
enum class FaultKind : uint8_t {
  kKillReceiverAtBoundary = 0,    // killed right after a chunk was applied; storage survives
  kKillReceiverInsideChunk = 1,   // killed with half of a chunk written; storage survives
  kKillReceiverLosingMemory = 2,  // killed mid-delta; storage lost, reloaded from the committed one
  kTornJournal = 3,               // killed at a boundary while appending: last journal record torn
  kKillRelay = 4,                 // a relay (node with children) killed mid-stream
  kCorruptChunk = 5,              // a byte of a piece flipped on a tree edge
  kDuplicateChunk = 6,            // a piece delivered twice and a chunk applied twice
  kReorderChunks = 7,             // pieces to a node delivered in a shuffled order
  kDelayChunk = 8,                // one piece delayed by duration_s
  kStoreWriteFail = 9,            // `count` consecutive failures of one object-store Put
  kPartitionLongLink = 10,        // long link (sender -> relays, uploads) down for duration_s
  kRestartSender = 11,            // sender killed after `at` blobs, restarted after duration_s
  kStaleDelta = 12,               // a delta for another base offered to a receiver: refused
};
inline constexpr int kNumFaultKinds = 13;

// "kill_receiver_boundary", "kill_receiver_inside_chunk", "kill_receiver_lose_memory",
// "torn_journal", "kill_relay", "corrupt_chunk", "duplicate_chunk", "reorder_chunks",
// "delay_chunk", "store_write_fail", "partition_long_link", "restart_sender", "stale_delta".
const char* FaultKindName(FaultKind kind);
// kInvalidArgument naming the known kinds for an unknown name.
StatusOr<FaultKind> FaultKindFromName(const std::string& name);

}  // namespace dcr

#endif  // DCR_SIM_SCENARIO_INCLUDE_DCR_FAULT_KIND_H_
