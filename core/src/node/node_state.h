// What every thread of a node shares: the blobs' bytes (NodeState), the bounds a frame or an
// object must keep, and the node's device.
//
// Thread safety: NodeState's methods take its lock and may be called from any thread; the free
// functions are pure.
#ifndef DCR_CORE_SRC_NODE_NODE_STATE_H_
#define DCR_CORE_SRC_NODE_NODE_STATE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dcr/delta.h"
#include "dcr/device.h"
#include "dcr/node.h"
#include "dcr/receiver.h"
#include "dcr/relay_policy.h"
#include "dcr/statusor.h"
#include "dcr/transport.h"
#include "node/blob_resume.h"
#include "node/blob_spool.h"
#include "node/metrics.h"

namespace dcr::internal {

struct BlobBuf {
  BlobInfo info;
  std::vector<uint8_t> bytes;
};
using BlobPtr = std::shared_ptr<BlobBuf>;

// The largest blob of `kind` the stream of `plan` can carry; a frame or a store object that
// claims more is refused before anything is allocated. Headers carry at most a safetensors
// header (the full stream) or a delta header with its inventory, trailers a chunk table (24
// bytes per chunk): both within kMaxSafetensorsHeaderBytes + 64 KiB. A full-stream chunk is an
// 8-byte offset and full_slice_bytes of data (at least 4096: a signed stream's manifest blob). A
// delta chunk record covers at most chunk_elems elements: at most 8 value bytes, 5 position bytes
// and one 80-byte segment per element, plus fixed headers and frame overhead: chunk_elems * 96 + 1
// MiB.
uint64_t MaxBlobBytes(const NodePlan& plan, BlobKind kind);

// Seconds a connection to a receiver has to send its hello before it is dropped.
constexpr double kHelloTimeoutS = 5.0;

// "<device>:<index>" of `plan`, as errors name it.
std::string PlanDeviceName(const NodePlan& plan);

// OpenDevice(plan.device, plan.device_index) for `who` ("receiver 3", "sender"), or null when
// `use` is false or the device is "cpu" (host memory, no Device). plan.device is checked either
// way.
StatusOr<std::shared_ptr<Device>> OpenPlanDevice(const NodePlan& plan, bool use,
                                                 const std::string& who);

// What every thread of a node shares: the blobs' bytes and the result's counters.
class NodeState {
 public:
  explicit NodeState(NodeResult* result) : result_(result) {}

  // The loop thread reads result fields that only it writes (role, t_commit) without the lock.
  NodeResult* result() { return result_; }
  // Runs `fn` on the result under the lock.
  template <class Fn>
  void Update(Fn fn) {
    std::lock_guard<std::mutex> lock(mu_);
    fn(result_);
  }
  // A blob received from the network: one buffer of its size (created on its first piece).
  // Null when the buffer cannot be allocated.
  BlobPtr GetOrCreate(const BlobInfo& info);
  // A blob produced or fetched whole.
  void Store(const BlobPtr& b);
  // Bytes [offset, offset + length) of blob `id` arrived (a piece from the parent, a range
  // fetched from the store).
  void MarkHeld(BlobId id, uint64_t offset, uint64_t length) {
    std::lock_guard<std::mutex> lock(mu_);
    ranges_[id].Add(offset, length);
  }
  // The state-dir spool of the version in flight (node/blob_spool.h); null: none. Set before
  // any thread receives.
  void set_spool(internal::BlobSpool* spool) { spool_ = spool; }
  // Bytes [offset, offset + length) of blob `info`, held in `data`, go to the spool (if any).
  void Persist(const BlobInfo& info, uint64_t offset, const uint8_t* data, uint64_t length) {
    if (spool_ != nullptr) spool_->Append(info, offset, data, length);
  }
  // A blob read back from the spool by a restarted process: held in the ranges that verified.
  void Restore(internal::BlobSpool::Restored r);
  // Bytes [0, HeldPrefix(id)) of blob `id` are held (0 when it is not held).
  uint64_t HeldPrefix(BlobId id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ranges_.find(id);
    return blobs_.count(id) == 0 || it == ranges_.end() ? 0 : it->second.Prefix();
  }
  BlobPtr Find(BlobId id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blobs_.find(id);
    return it == blobs_.end() ? nullptr : it->second;
  }
  void Erase(BlobId id) {
    std::lock_guard<std::mutex> lock(mu_);
    blobs_.erase(id);
    ranges_.erase(id);
  }
  // Drops every blob (a stream left for another source).
  void Clear() {
    std::lock_guard<std::mutex> lock(mu_);
    blobs_.clear();
    ranges_.clear();
  }
  // Every blob held, in id order.
  std::vector<BlobPtr> All();
  // First / last blob times (a blob built, a piece or object received) at wall time `now`.
  static void MarkBlob(NodeResult* r, double now) {
    if (r->t_first_blob == 0) r->t_first_blob = now;
    r->t_last_blob = now;
  }
  // Runs `fn` on what the metrics endpoint reports (node/metrics.h) under the lock.
  template <class Fn>
  void UpdateMetrics(Fn fn) {
    std::lock_guard<std::mutex> lock(mu_);
    fn(&metrics_);
  }
  // The endpoint's snapshot: the fields kept by UpdateMetrics and the result's counters.
  internal::NodeMetrics Metrics();

 private:
  std::mutex mu_;
  NodeResult* result_;
  internal::NodeMetrics metrics_;
  std::map<BlobId, BlobPtr> blobs_;
  std::map<BlobId, internal::HeldRanges> ranges_;  // the bytes of each blob that arrived
  internal::BlobSpool* spool_ = nullptr;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_NODE_STATE_H_
