// Internal: a node's metrics and health endpoint. A MetricsServer answers plain HTTP/1.x on one
// address while the node runs: `GET /metrics` with the node's NodeMetrics in the Prometheus text
// exposition format (version 0.0.4), `GET /healthz` with 200 "ok" while the node has no error and
// 503 with the error otherwise (a 200 names the receivers declared dead and the children lost, a
// line each, when there are any); anything else gets 404 (405 for a method other than GET).
// Connections are served concurrently by one poll loop; each has 2 s to send a request of at most
// 8 KiB (an idle or oversized one is closed), so a hostile client cannot hold the node or its
// memory.
//
// Thread safety: Start and Stop from one thread; `snapshot` runs on the server's thread.
#ifndef DCR_CORE_SRC_NODE_METRICS_H_
#define DCR_CORE_SRC_NODE_METRICS_H_

#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/status.h"

namespace dcr::internal {

// What a node's endpoint reports. Counters count from the node's start.
struct NodeMetrics {
  int rank = 0;
  std::string role;  // "sender" | "relay" | "receiver" | "uploader" | "downloader"
  bool up = false;   // the node runs (setting up, waiting or refitting) without an error
  uint64_t run_id = 0;
  uint64_t version_target = 0;  // the version this node's refit delivers (NodePlan::version)
  bool committed = false;       // this node committed (a receiver) / its tree did (the sender)
  bool holds_version = false;   // an applying node: version_held is known
  uint64_t version_held = 0;    // Receiver::held(): the version number its storage holds
  Hash128 hash_held;            // and that version's content hash
  uint64_t bytes_received = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_sent_long = 0;
  uint64_t chunks_applied = 0;  // chunk records applied
  double apply_seconds = 0;
  double started_at = 0;    // wall seconds (CLOCK_REALTIME) the node started
  double last_byte_at = 0;  // wall seconds of the last blob byte built or received (0: none)
  double committed_at = 0;  // wall seconds of the commit (0: not yet)
  double now = 0;           // wall seconds of the snapshot
  std::string last_error;   // the node's error ("" while none)
  // Recovery actions (NodeResult's fields of the same meaning): the process's start count in
  // its state directory (1 = first start), the recoveries its RecoveryPolicy spent, doubtful
  // chunks repaired with their overwrite form, fallbacks to the object store, reloads of the
  // committed version, chunks the journal showed applied (skipped), blobs mirrored to the store.
  uint64_t starts = 1;
  uint64_t recoveries = 0;
  uint64_t repairs = 0;
  uint64_t fallbacks = 0;
  uint64_t reloads = 0;
  uint64_t chunks_skipped = 0;
  uint64_t mirror_puts = 0;
  // Retention of the store (the sender of a long-lived node, dcr/retention.h), over the
  // process's life: collections run, objects and bytes removed, collections whose budget could
  // not be met, and the bytes left after the last one.
  uint64_t gc_runs = 0;
  uint64_t gc_removed_objects = 0;
  uint64_t gc_removed_bytes = 0;
  uint64_t gc_budget_errors = 0;
  uint64_t store_bytes = 0;
  // A receiver with a freeze limit (NodePlan::freeze_after_s): seconds without a new committed
  // version once past the limit (freeze_watch.h); 0 while not frozen.
  double freeze_seconds = 0;
  // Liveness over the process's life: the receivers this sender's joint commit holds dead
  // (declared, not re-admitted), and the children this relay counted lost while connecting and
  // that are not back. Both sorted.
  std::vector<int> dead_ranks;
  std::vector<int> lost_children;
};

// The Prometheus text exposition of `m`: dcr_node_up, dcr_node_committed,
// dcr_version_target, dcr_version_held (label hash), dcr_lag_seconds (seconds since the start
// while not committed, 0 after), dcr_bytes_received_total, dcr_bytes_sent_total,
// dcr_bytes_sent_long_total, dcr_chunks_applied_total, dcr_apply_seconds_total,
// dcr_start_time_seconds, dcr_last_byte_time_seconds, dcr_commit_time_seconds, the recovery
// counters dcr_node_starts, dcr_recoveries_total, dcr_repairs_total, dcr_fallbacks_total,
// dcr_reloads_total, dcr_chunks_skipped_total, dcr_mirror_puts_total, dcr_freeze_seconds, once
// a collection ran dcr_gc_runs_total, dcr_gc_removed_objects_total, dcr_gc_removed_bytes_total,
// dcr_gc_budget_errors_total and dcr_store_bytes, dcr_receivers_dead and
// dcr_children_lost (counts) with dcr_receiver_dead{dead_rank="R"} 1 and
// dcr_child_lost{child_rank="R"} 1 for each, and, while there is an error,
// dcr_last_error_info{message="..."} 1; every sample labelled rank and role.
std::string RenderMetrics(const NodeMetrics& m);

// What the endpoint of this process shows: the node that runs now (a long-lived node runs one
// node per version, one after the other, under one endpoint), or, between two, the last
// snapshot of the one before. Counters count from the start of the node that runs.
// Thread-safe.
class MetricsBoard {
 public:
  // The board of this process.
  static MetricsBoard& Process();
  // `source` is asked for each snapshot until Detach, which keeps its last one.
  void Attach(std::function<NodeMetrics()> source);
  void Detach();
  NodeMetrics Snapshot();
  // Records one store collection of this process (its gc_* and store_bytes fields, which every
  // snapshot carries from then on).
  void AddCollection(uint64_t removed_objects, uint64_t removed_bytes, bool budget_error,
                     uint64_t store_bytes);
  // The sender's dead receivers, replacing those set before (NodeMetrics::dead_ranks).
  void SetDeadRanks(std::vector<int> ranks);
  // A child of this relay counted lost while connecting (`lost`), or back.
  void SetLostChild(int rank, bool lost);

 private:
  std::mutex mu_;
  std::function<NodeMetrics()> source_;
  NodeMetrics last_;
  NodeMetrics gc_;  // only the gc_* and store_bytes fields
  std::vector<int> dead_ranks_;
  std::set<int> lost_children_;
};

class MetricsServer {
 public:
  MetricsServer() = default;
  ~MetricsServer() { Stop(); }
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Listens on `address` ("host:port") and serves until Stop. Errors: those of Listen (net.h),
  // naming the address. Connections are served concurrently by one thread (poll): each has 2 s
  // to send its request (at most 8 KiB) and is answered as soon as it has, so silent or slow
  // clients delay no other; at most 64 are held, a new one closing the oldest.
  Status Start(const std::string& address, std::function<NodeMetrics()> snapshot);
  void Stop();

 private:
  void Loop();
  // Answers the whole request `req` (its header ends in it) on `fd`.
  void Serve(int fd, const std::string& req);

  std::function<NodeMetrics()> snapshot_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // a pipe: Stop writes, the loop wakes
  std::thread thread_;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_METRICS_H_
