// The store jobs of a node: Put / List / Fetch actions on its ObjectStore, run on a pool; uploads
// cross the emulated long link; completions are posted to the node's EventQueue.
//
// Thread safety: the methods are called from the node's event thread; the jobs run on the pool.
#ifndef DCR_CORE_SRC_NODE_STORE_JOBS_H_
#define DCR_CORE_SRC_NODE_STORE_JOBS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dcr/node.h"
#include "dcr/object_store.h"
#include "dcr/relay_policy.h"
#include "dcr/status.h"
#include "dcr/status_macros.h"
#include "dcr/statusor.h"
#include "node/event_queue.h"
#include "node/node_state.h"
#include "node/work_pool.h"
#include "transport/net.h"

namespace dcr::internal {

class StoreJobs {
 public:
  StoreJobs(const NodePlan& plan, NodeState* state, EventQueue* queue)
      : plan_(plan), state_(state), queue_(queue) {}

  Status Open(int parallel) {
    DCR_ASSIGN_OR_RETURN(store_, OpenObjectStore(plan_.store));
    pool_.Start(parallel);
    return Status();
  }
  void Put(const BlobPtr& b, const std::string& key) {
    pool_.Submit([this, b, key] { PutJob(b, key); });
  }
  // From now on, a put of an object the store already holds at `key` with the same size is
  // skipped (the sender filling what the in-region copy lacks: its bytes are the stream's,
  // built deterministically): `prefix` is listed once here, and a key not listed is looked up
  // (Head) just before its put, since the long-link relay's copy may still be growing.
  Status SkipHeld(const std::string& prefix);
  uint64_t skipped() const { return skipped_.load(); }
  void Drain() { pool_.Drain(); }
  // Synchronous store calls of the loop thread (commit reports).
  Status PutNow(const std::string& key, const std::vector<uint8_t>& bytes) {
    Status st = store_->Put(key, bytes.data(), bytes.size());
    if (!st.ok()) CountFailure(st);
    return st;
  }
  StatusOr<std::vector<ObjectInfo>> ListNow(const std::string& prefix) {
    auto l = store_->List(prefix);
    if (!l.ok()) CountFailure(l.status());
    return l;
  }
  StatusOr<std::vector<uint8_t>> GetNow(const std::string& key) {
    auto g = store_->Get(key);
    if (!g.ok() && !g.status().IsNotFound()) CountFailure(g.status());
    return g;
  }
  bool open() const { return store_ != nullptr; }
  void List(const std::string& prefix) {
    pool_.Submit([this, prefix] { ListJob(prefix); });
  }
  void Fetch(const BlobInfo& info, const std::string& key) {
    pool_.Submit([this, info, key] { FetchJob(info, key); });
  }
  void Stop() { pool_.Stop(); }
  // Fetches continue from the bytes of a blob the node holds (node/blob_resume.h): pieces its
  // parent sent before the stream moved to the store, ranges of a fetch that was cut, what a
  // restarted process read back from its spool. (An edge relay drops the chunks it holds,
  // which are of another form than the store's, when its stream moves to the store.)
  void set_resume(bool on) { resume_ = on; }

 private:
  // A failed store call (an absent object aside), in the node's result.
  void CountFailure(const Status& s);

  void PutJob(const BlobPtr& b, const std::string& key);

  // The fetch of listed blob `info` (info.size within the plan's limit) in ranges from the first
  // byte not held, into the blob's buffer (one of the listed size, created when the node holds
  // none of it); the buffer keeps what arrived when a range fails, and the retry continues
  // there. Returns false, having posted nothing, when the object is not of the listed size
  // (the caller fetches it whole, dropping what was held).
  bool FetchResumed(const BlobInfo& info, const std::string& key);

  void ListJob(const std::string& prefix);

  void FetchJob(const BlobInfo& info, const std::string& key);

  const NodePlan& plan_;
  NodeState* state_;
  EventQueue* queue_;
  std::unique_ptr<ObjectStore> store_;
  // Burst: one segment, so the rate holds at fine time scales.
  TokenBucket long_bucket_{plan_.long_bandwidth_Bps, 64 << 10};
  std::mutex held_mu_;
  std::map<std::string, uint64_t> held_;  // SkipHeld: key -> size
  bool filling_ = false;                  // SkipHeld was called: look before each put
  std::atomic<uint64_t> skipped_{0};
  bool resume_ = false;
  WorkPool pool_;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_STORE_JOBS_H_
