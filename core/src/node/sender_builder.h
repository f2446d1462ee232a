// The sender's builder: loads its checkpoints and, on its own thread, builds the delta (or slices
// the target for the full-checkpoint reference), posting every blob to the node's EventQueue.
//
// Thread safety: LoadCheckpoints, Start and Join from the node's event thread.
#ifndef DCR_CORE_SRC_NODE_SENDER_BUILDER_H_
#define DCR_CORE_SRC_NODE_SENDER_BUILDER_H_

#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/device.h"
#include "dcr/node.h"
#include "dcr/relay_policy.h"
#include "dcr/signing.h"
#include "dcr/status.h"
#include "dcr/transport.h"
#include "node/event_queue.h"
#include "node/node_state.h"

namespace dcr::internal {

class SenderBuilder {
 public:
  SenderBuilder(const NodePlan& plan, NodeState* state, EventQueue* queue)
      : plan_(plan), state_(state), queue_(queue) {}
  ~SenderBuilder() { Join(); }

  // The sender holds its checkpoints in memory before the refit starts, as the trainer that
  // produced the target does and as every delta receiver holds its base (receivers.cc): both
  // files mapped with every page resident (read from disk here if the kernel evicted them), and
  // the base's content hash known. The refit clock (first blob) then times the build itself,
  // not checkpoint I/O or page faults, which depend on what the page cache kept since the files
  // were written (on a VM with proactive reclaim, cold files cost ~0.2-0.5 s of a 0.5 s refit).
  // Checkpoints that do not fit in half the free memory (or half the memory cgroup's limit) stay
  // mapped lazily and are read during the build, a window at a time (BuildDelta's advice):
  // making them resident would only evict one with the other.
  Status LoadCheckpoints();

  void Start() {
    thread_ = std::thread([this] { Build(); });
  }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  // The commitment root the stream's final manifest signs, once the build has computed it;
  // nullopt before, and for an unsigned stream. Thread-safe.
  std::optional<Sha256Digest> signed_commitment() const {
    std::lock_guard<std::mutex> lock(mu_);
    return signed_commitment_;
  }

 private:
  void Build();
  // The run id and, when the stream is signed, the target's commitment for the SigningSink.
  // Errors: the commitment's (reading the target).
  StatusOr<SignOptions> SigningOptions();

  // The base's content hash recorded in plan.base_sums once every byte of the base matches the
  // file's region hashes; zero (compute it) when the file is missing, malformed or stale.
  Hash128 BaseHashFromSums() const;

  const NodePlan& plan_;
  NodeState* state_;
  EventQueue* queue_;
  Hash128 known_base_hash_;  // from plan.base_sums; zero = BuildDelta's own (cached) hash
  std::unique_ptr<Checkpoint> base_ckpt_, target_ckpt_;
  std::shared_ptr<Device> device_;           // the delta's diff device; null = the host diff
  std::unique_ptr<SigningKey> signing_key_;  // plan.signing_key; null = an unsigned stream
  mutable std::mutex mu_;
  std::optional<Sha256Digest> signed_commitment_;  // guarded by mu_
  std::thread thread_;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_SENDER_BUILDER_H_
