// The node driver: hosts one NodePolicy (relay_policy.h) in a PolicyHost over TCP sockets or an
// ObjectStore. See dcr/node.h for the process structure. SocketNode is the policy's
// environment; its parts are the event loop (EventQueue, one timer), the tree links (sockets,
// writers and readers of the edges the policy names), the store jobs, the apply pool and the
// sender's builder.
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "dcr/checkpoint.h"
#include "dcr/context.h"
#include "dcr/delta.h"
#include "dcr/device.h"
#include "dcr/node.h"
#include "dcr/object_store.h"
#include "dcr/policy_host.h"
#include "dcr/signing.h"
#include "dcr/status_macros.h"
#include "dcr/sums.h"
#include "dcr/transport.h"
#include "internal/mapped_file.h"
#include "internal/safetensors.h"
#include "node/blob_resume.h"
#include "node/blob_spool.h"
#include "node/commit_reports.h"
#include "node/edge_lag.h"
#include "node/edge_relay.h"
#include "node/freeze_watch.h"
#include "node/held_hellos.h"
#include "node/metrics.h"
#include "node/node_recovery.h"
#include "node/node_trust.h"
#include "node/trainer_delta.h"
#include "node/versions.h"
#include "transport/heartbeat.h"
#include "transport/net.h"

namespace dcr {

namespace {

using internal::Conn;
using internal::FrameHeader;
using internal::FrameType;
using internal::FrameWriter;
using internal::SteadyNow;
using internal::TokenBucket;
using internal::WallNow;

struct BlobBuf {
  BlobInfo info;
  std::vector<uint8_t> bytes;
};
using BlobPtr = std::shared_ptr<BlobBuf>;

// The largest blob of `kind` the stream of `plan` can carry; a frame or a store object that
// claims more is refused before anything is allocated. Headers carry at most a safetensors
// header (the full stream) or a delta header with its inventory, trailers a chunk table (24
// bytes per chunk): both within kMaxSafetensorsHeaderBytes + 64 KiB. A full-stream chunk is an
// 8-byte offset and full_slice_bytes of data (at least 4096: a signed stream's manifest blob). A delta chunk record covers at most chunk_elems
// elements: at most 8 value bytes, 5 position bytes and one 80-byte segment per element, plus
// fixed headers and frame overhead: chunk_elems * 96 + 1 MiB.
uint64_t MaxBlobBytes(const NodePlan& plan, BlobKind kind) {
  constexpr uint64_t kMetaCap = internal::kMaxSafetensorsHeaderBytes + (64 << 10);
  if (kind != BlobKind::kChunk) return kMetaCap;
  const uint64_t cap = std::numeric_limits<uint64_t>::max() / 2;
  if (plan.method == "full") return std::max<uint64_t>(std::min(cap, plan.full_slice_bytes), 4096) + 8;
  return std::min(cap / 96, plan.chunk_elems) * 96 + (1 << 20);
}

// Seconds a connection to a receiver has to send its hello before it is dropped.
constexpr double kHelloTimeoutS = 5.0;

// ---- event loop: events from every thread, one timer ----

// Events for the loop, or a fatal driver error (peer lost, builder failed, ...), or an event for
// the node's RecoveryPolicy (`recovery`; `blob` names the blob a ChunkDoubtful refused). `gen`:
// the stream generation it was posted in (Bump starts a new one; the loop drops older items).
struct QItem {
  bool fatal = false;
  Status status;
  Event event;
  bool is_recovery = false;
  recovery::Event recovery = recovery::TimerFired{};
  BlobId blob = 0;
  uint64_t gen = 0;
};

class EventQueue {
 public:
  void Post(Event e) {
    std::lock_guard<std::mutex> lock(mu_);
    q_.push_back(QItem{false, Status(), std::move(e), false, recovery::TimerFired{}, 0, gen_});
    cv_.notify_one();
  }
  void Fatal(Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    q_.push_back(QItem{true, std::move(s), event::TimerFired{}, false, recovery::TimerFired{}, 0, gen_});
    cv_.notify_one();
  }
  void PostRecovery(recovery::Event e, BlobId blob = 0) {
    std::lock_guard<std::mutex> lock(mu_);
    q_.push_back(QItem{false, Status(), event::TimerFired{}, true, std::move(e), blob, gen_});
    cv_.notify_one();
  }
  // A new stream generation: items posted before are stale.
  uint64_t Bump() {
    std::lock_guard<std::mutex> lock(mu_);
    return ++gen_;
  }
  uint64_t gen() {
    std::lock_guard<std::mutex> lock(mu_);
    return gen_;
  }
  // Waits until an item arrives or `until` (steady seconds) passes.
  bool Wait(double until, QItem* out) {
    std::unique_lock<std::mutex> lock(mu_);
    while (q_.empty()) {
      double left = until - SteadyNow();
      if (left <= 0) return false;
      cv_.wait_for(lock, std::chrono::duration<double>(std::min(left, 1.0)));
    }
    *out = std::move(q_.front());
    q_.pop_front();
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<QItem> q_;
  uint64_t gen_ = 0;
};

// A fixed pool of worker threads running closures.
class WorkPool {
 public:
  void Start(int n) {
    for (int i = 0; i < std::max(1, n); ++i) threads_.emplace_back([this] { Loop(); });
  }
  void Submit(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(fn));
    cv_.notify_one();
  }
  // Waits until no job is queued or running.
  void Drain() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [&] { return jobs_.empty() && running_ == 0; });
  }
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  ~WorkPool() {
    if (!threads_.empty()) Stop();
  }

 private:
  void Loop() {
    while (true) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        fn = std::move(jobs_.front());
        jobs_.pop_front();
        ++running_;
      }
      fn();
      std::lock_guard<std::mutex> lock(mu_);
      --running_;
      idle_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, idle_;
  int running_ = 0;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
};

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
  BlobPtr GetOrCreate(const BlobInfo& info) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blobs_.find(info.id);
    if (it != blobs_.end()) return it->second;
    auto b = std::make_shared<BlobBuf>();
    b->info = info;
    try {
      b->bytes.resize(info.size);
    } catch (const std::bad_alloc&) {
      return nullptr;
    }
    blobs_[info.id] = b;
    return b;
  }
  // A blob produced or fetched whole.
  void Store(const BlobPtr& b) {
    std::lock_guard<std::mutex> lock(mu_);
    blobs_[b->info.id] = b;
    internal::HeldRanges whole;
    whole.Add(0, b->info.size);
    ranges_[b->info.id] = whole;
  }
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
  void Restore(internal::BlobSpool::Restored r) {
    auto b = std::make_shared<BlobBuf>();
    b->info = r.info;
    b->bytes = std::move(r.bytes);
    std::lock_guard<std::mutex> lock(mu_);
    blobs_[b->info.id] = b;
    ranges_[b->info.id] = r.held;
  }
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
  std::vector<BlobPtr> All() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<BlobPtr> out;
    for (auto& [id, b] : blobs_) out.push_back(b);
    return out;
  }
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
  internal::NodeMetrics Metrics() {
    std::lock_guard<std::mutex> lock(mu_);
    internal::NodeMetrics m = metrics_;
    m.bytes_received = result_->bytes_received;
    m.bytes_sent = result_->bytes_sent;
    m.bytes_sent_long = result_->bytes_sent_long;
    m.apply_seconds = result_->apply_seconds;
    m.last_byte_at = result_->t_last_blob;
    m.starts = static_cast<uint64_t>(result_->starts);
    m.fallbacks = result_->fallbacks;
    m.reloads = result_->reloads;
    m.now = WallNow();
    return m;
  }

 private:
  std::mutex mu_;
  NodeResult* result_;
  internal::NodeMetrics metrics_;
  std::map<BlobId, BlobPtr> blobs_;
  std::map<BlobId, internal::HeldRanges> ranges_;  // the bytes of each blob that arrived
  internal::BlobSpool* spool_ = nullptr;
};

// ---- tree links: the sockets of every edge the policy names, their readers and writers ----

class TreeLinks {
 public:
  TreeLinks(const NodePlan& plan, NodeState* state, EventQueue* queue)
      : plan_(plan),
        state_(state),
        queue_(queue),
        reports_(plan.parents, plan.rank, plan.run_id, plan.version) {}
  ~TreeLinks() { Close(); }

  // Opens exactly the edges of `links` (NodePolicy::links): connects every stream to each child
  // (children listen before anything else, so this only waits for their startup) and accepts the
  // parent's streams. Edges out of the sender cross the emulated long link when plan.emulate_wan.
  // With plan.tls_* set, every stream is mutual TLS 1.3 (transport/tls.h: peers of this run, in
  // a role the edge allows, with the rank they claim).
  Status Open(const std::vector<Link>& links, double deadline) {
    const int me = plan_.rank;
    DCR_RETURN_IF_ERROR(LoadCredentials());
    if (plan_.emulate_wan && plan_.long_bandwidth_Bps > 0) {
      // Burst: one segment, so the rate holds at fine time scales.
      long_bucket_ = std::make_shared<TokenBucket>(plan_.long_bandwidth_Bps, 64 << 10);
    }
    const Link* parent = nullptr;
    for (const Link& l : links) {
      if (!l.to_child) parent = &l;
    }
    int listen_fd = -1;
    if (parent != nullptr) {
      DCR_ASSIGN_OR_RETURN(listen_fd, ListenOnOwnAddress());
    }
    const bool long_edges = me == 0 && plan_.emulate_wan;
    std::vector<event::SendFailed> lost;  // children lost while their links were set up
    for (const Link& l : links) {
      if (!l.to_child) continue;
      ChildLink link;
      link.id = l.peer;
      for (int s = 0; s < l.streams; ++s) {
        auto conn = internal::ConnectTo(plan_.addresses[l.peer], deadline, link_tls_.get(), l.peer,
                                        kHelloTimeoutS);
        if (conn.ok()) (*conn)->SetIdleTimeout(plan_.read_deadline_s);
        if (!conn.ok() && recover_ && !conn.status().IsFailedPrecondition()) {
          // A child that dies while its link is set up (e.g. mid-handshake) is lost as one that
          // dies mid-stream: the recovery policy acts on it (its subtree takes the version from
          // the store), and the link carries nothing (Send answers SendFailed). A certificate
          // refusal still ends the node.
          lost.push_back(event::SendFailed{
              l.peer, "node " + std::to_string(l.peer) + " (" + plan_.addresses[l.peer] +
                          ") lost while connecting: " + conn.status().message()});
          std::fprintf(stderr, "node %d: %s\n", me, lost.back().message.c_str());
          link.writers.clear();
          link.conns.clear();
          break;
        }
        if (!conn.ok()) {
          if (listen_fd >= 0) close(listen_fd);
          return Status(conn.status().IsFailedPrecondition() ? conn.status().code()
                                                             : StatusCode::kUnavailable,
                        "node " + std::to_string(me) + ": child node " + std::to_string(l.peer) +
                            " at " + plan_.addresses[l.peer] + ": " + conn.status().message());
        }
        FrameHeader hello = Frame(FrameType::kHello);
        hello.stream = static_cast<uint32_t>(s);
        hello.blob = static_cast<uint64_t>(l.streams);
        DCR_RETURN_IF_ERROR((*conn)->Write(&hello, sizeof(hello)));
        link.writers.push_back(std::make_unique<FrameWriter>(
            conn->get(), long_edges ? long_bucket_ : nullptr,
            long_edges ? plan_.long_latency_s : 0.0, plan_.relay.window_bytes));
        link.conns.push_back(std::move(*conn));
      }
      if (link.conns.empty()) {
        children_.push_back(std::move(link));
        continue;
      }
      Conn* conn0 = link.conns[0].get();
      const NodeId c = l.peer;
      children_.push_back(std::move(link));
      readers_.emplace_back([this, c, conn0] { ChildReader(c, conn0); });
    }
    for (event::SendFailed& f : lost) queue_->Post(std::move(f));
    // The children hear from this node from here on, however long its parent takes to come.
    StartHeartbeats();
    if (parent != nullptr) {
      DCR_RETURN_IF_ERROR(AcceptParent(*parent, listen_fd, deadline));
      if (parent_writer_) heartbeats_->Add(parent_writer_.get(), Frame(FrameType::kHeartbeat));
    }
    return Status();
  }

  // A restarted node takes its version from the store and does not rejoin the tree. Until Close
  // it listens on its address all the same, for `parent`'s connections: one of this version is
  // accepted only to be closed, so the parent counts this child lost at once (as one that died
  // mid-stream) instead of trying to connect until its deadline; one of a later version is kept
  // for that version (node/held_hellos.h). At Close the listener is kept for the next version's
  // wait rather than closed, so a parent connecting for that version just then waits in its
  // backlog instead of being reset. An address that cannot be listened on is named on stderr and
  // skipped. Errors: the credentials'.
  Status TurnAwayParent(const Link& parent, double deadline) {
    DCR_RETURN_IF_ERROR(LoadCredentials());
    auto listening = ListenOnOwnAddress();
    if (!listening.ok()) {  // the parent then finds out at its deadline, as without this
      std::fprintf(stderr, "node %d: not listening while restarted: %s\n", plan_.rank,
                   listening.status().ToString().c_str());
      return Status();
    }
    const int listen_fd = *listening;
    turn_away_ = std::thread([this, listen_fd, deadline, peer = parent.peer,
                              streams = parent.streams] {
      const int me = plan_.rank;
      internal::HeldHellos& held = internal::HeldHellos::Process();
      auto later = [&](const FrameHeader& h, const internal::TlsIdentity* id) {
        return internal::HeldHellos::IsLater(h, id, plan_.run_id, plan_.version, peer, streams);
      };
      auto refuse = [&](const FrameHeader& h, const internal::TlsIdentity* id) {
        if (!later(h, id) && static_cast<int>(h.from_rank) == peer) {
          std::fprintf(stderr, "node %d: turned parent node %d away: this node restarted and "
                       "takes version %llu from the store\n", me, peer,
                       static_cast<unsigned long long>(plan_.version));
        }
        return false;
      };
      auto hold = [&](internal::Hello* h) {
        if (!later(h->header, h->conn->tls() ? &h->conn->peer() : nullptr)) return false;
        std::fprintf(stderr, "node %d: kept parent node %d's connection for version %llu (this "
                     "node is in version %llu)\n", me, peer,
                     static_cast<unsigned long long>(h->header.version),
                     static_cast<unsigned long long>(plan_.version));
        held.Keep(me, h);
        return true;
      };
      (void)internal::AcceptHellos(listen_fd, 1, deadline, kHelloTimeoutS, link_tls_.get(),
                                   refuse, nullptr, [this] { return stopping_.load(); }, hold);
      // Still listening: the next version's wait takes it, with what came in the meantime.
      held.KeepListener(me, plan_.addresses[me], listen_fd);
    });
    return Status();
  }

  // A restarted node's children may still be waiting for it to connect for this version (it
  // died before it did). Each gets this version's hellos on connections that close at once, so
  // it counts its parent lost (the stream then comes from the store) instead of waiting for the
  // stream to appear in the store, which in `dcr run` the sender sends only after the start
  // signal that waits for that child. A child past that wait refuses the connections, or is no
  // longer listening (each connection is tried for a second). Runs beside the node until Close.
  Status LeaveChildren(const std::vector<Link>& links) {
    DCR_RETURN_IF_ERROR(LoadCredentials());
    for (const Link& l : links) {
      if (!l.to_child) continue;
      leaving_.emplace_back([this, l] {
        for (int s = 0; s < l.streams && !stopping_; ++s) {
          auto conn = internal::ConnectTo(plan_.addresses[l.peer], SteadyNow() + 1.0,
                                          link_tls_.get(), l.peer, 2.0);
          if (!conn.ok()) return;
          FrameHeader hello = Frame(FrameType::kHello);
          hello.stream = static_cast<uint32_t>(s);
          hello.blob = static_cast<uint64_t>(l.streams);
          if (!(*conn)->Write(&hello, sizeof(hello)).ok()) return;
        }
      });
    }
    return Status();
  }

  // The node's run credentials (plan.tls_*), once: they sign its reports and, with
  // plan.tls_links, secure its edges.
  Status LoadCredentials() {
    const int me = plan_.rank;
    if (tls_ != nullptr) return Status();
    if (!plan_.tls_ca.empty() || !plan_.tls_cert.empty() || !plan_.tls_key.empty()) {
      DCR_ASSIGN_OR_RETURN(tls_, internal::TlsContext::Load(plan_.tls_ca, plan_.tls_cert,
                                                            plan_.tls_key));
      if (me == 0) {
        // The sender counts only reports each rank signed itself: a relay cannot forge them.
        const internal::TlsContext* tls = tls_.get();
        reports_.set_verifier([tls](const internal::ReportRecord& r) {
          const auto body = internal::ReportBody(r);
          return tls->CheckReportSignature(r.tail.data(), r.tail.size(), body.first, body.second,
                                           r.report.rank);
        });
      }
      if (tls_->self().rank != me) {
        return FailedPreconditionError("node " + std::to_string(me) + ": TLS certificate " +
                                       plan_.tls_cert + " is for rank " +
                                       std::to_string(tls_->self().rank));
      }
      if (plan_.tls_links) link_tls_ = tls_;  // else: reports signed, edges plain TCP
    }
    return Status();
  }

  // Hands a piece to its stream's writer; SendDone (or SendFailed) is posted once accepted.
  Status Send(const action::Send& s, const BlobPtr& b) {
    ChildLink* link = FindChild(s.to);
    if (link != nullptr && link->writers.empty()) {  // lost while its link was set up
      queue_->Post(event::SendFailed{s.to, "node " + std::to_string(s.to) + " (" +
                                               plan_.addresses[s.to] + ") lost"});
      return Status();
    }
    if (link == nullptr || s.stream < 0 || s.stream >= static_cast<int>(link->writers.size())) {
      return InternalError("send to node " + std::to_string(s.to) + " stream " +
                           std::to_string(s.stream) + ": no such link");
    }
    FrameHeader h = Frame(FrameType::kPiece);
    h.blob_kind = static_cast<uint8_t>(s.blob.kind);
    h.stream = static_cast<uint32_t>(s.stream);
    h.blob = s.blob.id;
    h.blob_size = s.blob.size;
    h.offset = s.offset;
    h.length = s.length;
    const bool long_link = plan_.rank == 0 && plan_.emulate_wan;
    const action::Send send = s;
    link->writers[s.stream]->Send(h, b->bytes.data() + s.offset, b, [this, send, long_link](Status st) {
      if (!st.ok()) {
        queue_->Post(event::SendFailed{send.to, st.message()});
        return;
      }
      state_->Update([&](NodeResult* r) {
        r->bytes_sent += send.length;
        if (long_link) r->bytes_sent_long += send.length + sizeof(FrameHeader);
      });
      queue_->Post(event::SendDone{send.to, send.stream, send.blob.id, send.offset, send.length});
    });
    return Status();
  }

  // A control frame (kAck) to the parent on stream 0.
  void SendToParent(FrameType type, uint64_t value) {
    FrameHeader h = Frame(type);
    h.blob = value;
    parent_writer_->Send(h, nullptr, nullptr, [](Status) {});
  }

  // The subtree's commit report to the parent on stream 0 (commit_reports.h): `own` (this
  // node's record, when it applies) followed by every record its children reported, verbatim.
  // Nothing when the node has no parent link.
  void SendReport(const internal::ReportRecord* own) {
    if (!parent_writer_) return;
    std::vector<internal::ReportRecord> records;
    if (own != nullptr) records.push_back(*own);
    for (auto& r : reports_.records()) records.push_back(std::move(r));
    auto payload =
        std::make_shared<std::vector<uint8_t>>(internal::EncodeReportPayload(records));
    FrameHeader h = Frame(FrameType::kReport);
    h.blob = records.size();
    h.length = payload->size();
    parent_writer_->Send(h, payload->data(), payload, [](Status) {});
  }
  bool has_parent() const { return parent_writer_ != nullptr; }
  // The run's TLS context; null on plain TCP.
  const internal::TlsContext* tls() const { return tls_.get(); }
  // The records this node's children reported and it kept.
  std::vector<CommitReport> reports() const { return reports_.reports(); }

  // Tells every child that the refit is refused, with the reason (a kAbort frame on stream 0,
  // queued behind nothing: no piece was sent yet). Close() flushes it.
  void AbortChildren(const std::string& reason) {
    auto text = std::make_shared<std::string>(reason.substr(0, internal::kMaxAbortMessageBytes));
    for (auto& c : children_) {
      if (c.writers.empty()) continue;
      FrameHeader h = Frame(FrameType::kAbort);
      h.length = text->size();
      c.writers[0]->Send(h, reinterpret_cast<const uint8_t*>(text->data()), text, [](Status) {});
    }
  }

  // With recovery, a lost parent connection is reported to the node's RecoveryPolicy
  // (ParentLost) instead of ending the node.
  void set_recover(bool on) { recover_ = on; }
  // With recovery: asked while the node waits for its parent's connection at startup; true
  // ends the wait as a lost parent (ParentLost). Set before Open; null: wait until the deadline.
  void set_parent_gone(std::function<bool()> gone) { parent_gone_ = std::move(gone); }
  // An edge relay's ingress (node/edge_relay.h): pieces from the parent go to it instead of the
  // policy. Set before Open; null: none.
  void set_ingress(internal::EdgeIngress* ingress) { ingress_ = ingress; }

  // Flushes what is queued (final acks / reports), then closes every socket so readers end.
  void Close() {
    if (closed_) return;
    closed_ = true;
    stopping_ = true;
    if (heartbeats_) heartbeats_->Stop();
    if (parent_writer_) parent_writer_->Close();
    for (auto& c : children_) {
      for (auto& w : c.writers) w->Close();
    }
    for (auto& conn : parent_conns_) conn->Shutdown();
    for (auto& c : children_) {
      for (auto& conn : c.conns) conn->Shutdown();
    }
    for (auto& t : readers_) t.join();
    readers_.clear();
    if (turn_away_.joinable()) turn_away_.join();
    for (auto& t : leaving_) t.join();
    leaving_.clear();
    parent_writer_.reset();
    parent_conns_.clear();
    children_.clear();
  }

 private:
  struct ChildLink {
    NodeId id = kNoNode;
    // Writers before connections: a writer is destroyed (joined) before the connection it uses.
    std::vector<std::unique_ptr<Conn>> conns;
    std::vector<std::unique_ptr<FrameWriter>> writers;
  };
  // A frame of `type` from this node, of its run and version (transport/net.h).
  FrameHeader Frame(FrameType type) const {
    FrameHeader h;
    h.type = static_cast<uint8_t>(type);
    h.from_rank = static_cast<uint32_t>(plan_.rank);
    h.run = plan_.run_id;
    h.version = plan_.version;
    return h;
  }
  // Why `h` is not a frame of this node's wire protocol, run and version ("" when it is).
  std::string Mismatch(const FrameHeader& h) const {
    return internal::WireMismatch(h, plan_.run_id, plan_.version);
  }

  // Heartbeats on every stream to a child (transport/heartbeat.h; the parent's stream 0 joins
  // once it is up); those out of the sender cross the emulated long link and count in its bytes.
  void StartHeartbeats() {
    heartbeats_ = std::make_unique<internal::Heartbeats>(plan_.heartbeat_interval_s);
    const bool long_link = plan_.rank == 0 && plan_.emulate_wan;
    for (auto& c : children_) {
      for (size_t s = 0; s < c.writers.size(); ++s) {
        FrameHeader h = Frame(FrameType::kHeartbeat);
        h.stream = static_cast<uint32_t>(s);
        std::function<void(Status)> counted;
        if (long_link) {
          counted = [this](Status st) {
            if (st.ok()) state_->Update([](NodeResult* r) { r->bytes_sent_long += sizeof(FrameHeader); });
          };
        }
        heartbeats_->Add(c.writers[s].get(), h, std::move(counted));
      }
    }
    heartbeats_->Start();
  }

  ChildLink* FindChild(NodeId id) {
    for (auto& c : children_) {
      if (c.id == id) return &c;
    }
    return nullptr;
  }

  // The listener a restarted node kept from its previous version (TurnAwayParent), else a new
  // one on this node's address.
  StatusOr<int> ListenOnOwnAddress() {
    const int kept =
        internal::HeldHellos::Process().TakeListener(plan_.rank, plan_.addresses[plan_.rank]);
    if (kept >= 0) return kept;
    return internal::Listen(plan_.addresses[plan_.rank]);
  }

  Status AcceptParent(const Link& parent, int listen_fd, double deadline) {
    const int me = plan_.rank;
    const int expected = parent.streams;
    std::vector<bool> seen(expected, false);
    auto refused = [me](const std::string& why) {
      std::fprintf(stderr, "node %d: dropped a connection: %s\n", me, why.c_str());
    };
    auto later = [&](const FrameHeader& h, const internal::TlsIdentity* peer) {
      return internal::HeldHellos::IsLater(h, peer, plan_.run_id, plan_.version, parent.peer,
                                           expected);
    };
    auto is_parent_hello = [&](const FrameHeader& h, const internal::TlsIdentity* peer) {
      if (later(h, peer)) return false;  // kept for its version (hold below), not refused
      if (h.magic == internal::kFrameMagic && h.type == static_cast<uint8_t>(FrameType::kHello)) {
        const std::string why = Mismatch(h);
        if (!why.empty()) {
          refused(why);
          return false;
        }
      }
      if (h.magic != internal::kFrameMagic || h.type != static_cast<uint8_t>(FrameType::kHello) ||
          static_cast<int>(h.from_rank) != parent.peer ||
          h.blob != static_cast<uint64_t>(expected) ||
          h.stream >= static_cast<uint32_t>(expected) || seen[h.stream]) {
        std::fprintf(stderr, "node %d: dropped a connection without a valid hello from parent "
                     "node %d\n", me, parent.peer);
        return false;
      }
      if (peer != nullptr && peer->rank != static_cast<int>(h.from_rank)) {
        refused("its hello claims rank " + std::to_string(h.from_rank) +
                ", its TLS certificate is rank " + std::to_string(peer->rank));
        return false;
      }
      seen[h.stream] = true;
      return true;
    };
    // The per-version start barrier (node/held_hellos.h): the parent's connections for this
    // version that came while this process was in an earlier one, then the listener.
    internal::HeldHellos& held = internal::HeldHellos::Process();
    std::vector<internal::Hello> taken;
    for (internal::Hello& h : held.Take(me, plan_.run_id, plan_.version)) {
      if (is_parent_hello(h.header, h.conn->tls() ? &h.conn->peer() : nullptr)) {
        taken.push_back(std::move(h));
      }
    }
    auto hold = [&](internal::Hello* h) {
      if (!later(h->header, h->conn->tls() ? &h->conn->peer() : nullptr)) return false;
      std::fprintf(stderr, "node %d: kept parent node %d's connection for version %llu (this "
                   "node is in version %llu)\n", me, parent.peer,
                   static_cast<unsigned long long>(h->header.version),
                   static_cast<unsigned long long>(plan_.version));
      held.Keep(me, h);
      return true;
    };
    StatusOr<std::vector<internal::Hello>> hellos = std::vector<internal::Hello>();
    if (static_cast<int>(taken.size()) < expected) {
      hellos = internal::AcceptHellos(listen_fd, expected - static_cast<int>(taken.size()),
                                      deadline, kHelloTimeoutS, link_tls_.get(), is_parent_hello,
                                      refused, recover_ ? parent_gone_ : nullptr, hold);
    }
    if (hellos.ok()) {
      for (auto& h : taken) hellos->push_back(std::move(h));
    }
    if (!hellos.ok() && hellos.status().code() == StatusCode::kAborted) {
      // The tree went on without this node: its parent is lost, as one that died mid-stream.
      close(listen_fd);
      std::fprintf(stderr, "node %d: parent node %d never connected and the stream is whole in "
                   "the store: parent lost (%s)\n", me, parent.peer,
                   hellos.status().message().c_str());
      queue_->PostRecovery(recovery::ParentLost{parent.peer, kNoNode});
      return Status();
    }
    if (!hellos.ok()) {
      close(listen_fd);
      return UnavailableError("node " + std::to_string(me) + ": waiting for parent node " +
                              std::to_string(parent.peer) + ": " + hellos.status().message());
    }
    parent_conns_.resize(expected);
    for (auto& h : *hellos) {
      h.conn->SetIdleTimeout(plan_.read_deadline_s);
      parent_conns_[h.header.stream] = std::move(h.conn);
    }
    close(listen_fd);
    const bool long_up = parent.peer == 0 && plan_.emulate_wan;
    parent_writer_ = std::make_unique<FrameWriter>(parent_conns_[0].get(), nullptr,
                                                   long_up ? plan_.long_latency_s : 0.0);
    for (auto& conn : parent_conns_) {
      readers_.emplace_back([this, p = parent.peer, c = conn.get()] { ParentReader(p, c); });
    }
    return Status();
  }

  void ParentReader(NodeId parent, Conn* conn) {
    while (true) {
      FrameHeader h;
      Status s = conn->Read(&h, sizeof(h));
      if (!s.ok() && recover_) {
        if (!stopping_) queue_->PostRecovery(recovery::ParentLost{parent, kNoNode});
        return;
      }
      if (s.ok() && h.magic == internal::kFrameMagic && Mismatch(h).empty() &&
          h.type == static_cast<uint8_t>(FrameType::kAbort) &&
          h.length <= internal::kMaxAbortMessageBytes) {
        std::string reason(h.length, '\0');
        s = conn->Read(reason.data(), reason.size());
        if (s.ok()) {
          // Forwarded down before this node stops, so the whole subtree reports the cause. The
          // children then close their connections: stopping_ keeps that from being reported as
          // a lost child, whichever event the loop sees first.
          stopping_ = true;
          AbortChildren(reason);
          queue_->Fatal(AbortedError("node " + std::to_string(plan_.rank) +
                                     ": the refit was refused upstream (received from node " +
                                     std::to_string(h.from_rank) + "): " + reason));
          return;
        }
      }
      if (s.ok() && h.magic == internal::kFrameMagic) {
        const std::string why = Mismatch(h);
        if (!why.empty()) {
          s = DataLossError("frame from parent node " + std::to_string(parent) + " refused: " +
                            why);
        }
      }
      if (s.ok() && h.magic == internal::kFrameMagic &&
          h.type == static_cast<uint8_t>(FrameType::kHeartbeat) && h.length == 0) {
        continue;  // the parent is alive; the read deadline restarts
      }
      if (s.ok() && (h.magic != internal::kFrameMagic ||
                     h.type != static_cast<uint8_t>(FrameType::kPiece) || h.blob_kind > 2 ||
                     h.offset > h.blob_size || h.length > h.blob_size - h.offset)) {
        s = DataLossError("malformed frame from parent node " + std::to_string(parent));
      }
      if (!s.ok()) {
        if (!stopping_) {
          queue_->Fatal(UnavailableError("node " + std::to_string(plan_.rank) + ": parent node " +
                                         std::to_string(parent) + " (" +
                                         plan_.addresses[parent] + "): " + s.message()));
        }
        return;
      }
      BlobInfo info{h.blob, static_cast<BlobKind>(h.blob_kind), h.blob_size};
      const uint64_t limit = MaxBlobBytes(plan_, info.kind);
      if (h.blob_size > limit) {
        queue_->Fatal(DataLossError(
            "node " + std::to_string(plan_.rank) + ": parent node " + std::to_string(parent) +
            " sent a piece of blob " + std::to_string(h.blob) + " claiming " +
            std::to_string(h.blob_size) + " bytes, more than the " + std::to_string(limit) +
            " bytes the plan allows for a " + BlobKindName(info.kind)));
        return;
      }
      if (ingress_ != nullptr && ingress_->Whole(h.blob)) {
        // A duplicate of a blob the edge relay holds whole (perhaps transcoded): dropped.
        std::vector<uint8_t> skip(h.length);
        s = conn->Read(skip.data(), skip.size());
        if (s.ok()) continue;
      }
      BlobPtr b = s.ok() ? state_->GetOrCreate(info) : nullptr;
      if (!s.ok()) {
        if (recover_ && !stopping_) queue_->PostRecovery(recovery::ParentLost{parent, kNoNode});
        if (!recover_ && !stopping_) {
          queue_->Fatal(UnavailableError("node " + std::to_string(plan_.rank) + ": parent node " +
                                         std::to_string(parent) + " lost mid-piece: " +
                                         s.message()));
        }
        return;
      }
      if (b == nullptr) {
        queue_->Fatal(ResourceExhaustedError("node " + std::to_string(plan_.rank) +
                                             ": out of memory for blob " + std::to_string(h.blob) +
                                             " of " + std::to_string(h.blob_size) + " bytes"));
        return;
      }
      if (b->info.size != h.blob_size) {
        queue_->Fatal(
            DataLossError("parent sent blob " + std::to_string(h.blob) + " with two sizes"));
        return;
      }
      s = conn->Read(b->bytes.data() + h.offset, h.length);
      if (!s.ok() && recover_) {
        if (!stopping_) queue_->PostRecovery(recovery::ParentLost{parent, kNoNode});
        return;
      }
      if (!s.ok()) {
        if (!stopping_) {
          queue_->Fatal(UnavailableError("node " + std::to_string(plan_.rank) + ": parent node " +
                                         std::to_string(parent) +
                                         " lost mid-piece: " + s.message()));
        }
        return;
      }
      const double now = WallNow();
      state_->MarkHeld(h.blob, h.offset, h.length);
      // An edge relay's pieces are of another form than the store's: not kept for a restart.
      if (ingress_ == nullptr) state_->Persist(info, h.offset, b->bytes.data() + h.offset, h.length);
      state_->Update([&](NodeResult* r) {
        NodeState::MarkBlob(r, now);
        r->bytes_received += h.length;
      });
      if (ingress_ != nullptr) {
        ingress_->Piece(info, h.offset, std::shared_ptr<const std::vector<uint8_t>>(b, &b->bytes));
      } else {
        queue_->Post(event::DataReceived{info, h.offset, h.length});
      }
    }
  }

  void ChildReader(NodeId child, Conn* conn) {
    bool reported = false;
    while (true) {
      FrameHeader h;
      Status s = conn->Read(&h, sizeof(h));
      std::string why;
      if (s.ok() && h.magic == internal::kFrameMagic) why = Mismatch(h);
      if (!s.ok() || h.magic != internal::kFrameMagic || !why.empty()) {
        if (!reported && !stopping_) {
          queue_->Post(event::SendFailed{
              child, "node " + std::to_string(child) + " (" + plan_.addresses[child] +
                         ") lost: " +
                         (!s.ok() ? s.message() : why.empty() ? "bad frame" : "refused: " + why)});
        }
        return;
      }
      if (h.type == static_cast<uint8_t>(FrameType::kHeartbeat)) {
        continue;  // the child is alive
      } else if (h.type == static_cast<uint8_t>(FrameType::kAck)) {
        queue_->Post(event::AckReceived{child, h.blob});
      } else if (h.type == static_cast<uint8_t>(FrameType::kReport)) {
        bool committed = false;
        Status rs = ReadReport(child, conn, h, &committed);
        if (!rs.ok()) {
          if (!stopping_) {
            queue_->Post(event::SendFailed{child, "node " + std::to_string(child) + " (" +
                                                      plan_.addresses[child] +
                                                      "): " + rs.message()});
          }
          return;
        }
        // After a committed report the child may close; after a failure its close is the
        // failure the parent acts on.
        if (committed) reported = true;
      }
    }
  }

  // Reads the payload of report frame `h` from `child` and keeps the records the collector
  // takes (a refused one is named on stderr and left out). A report of committed records ends
  // the child's part of the commit (SubtreeCommitted with the committed records kept); one
  // that carries a failure travels on up with this node's own report and ends nothing.
  // Errors: an oversized or malformed payload (the child is then treated as lost).
  Status ReadReport(NodeId child, Conn* conn, const FrameHeader& h, bool* committed_report) {
    const uint64_t cap = internal::MaxReportPayloadBytes(plan_.parents.size());
    if (h.length > cap) {
      return DataLossError("commit report of " + std::to_string(h.length) +
                           " bytes, more than the " + std::to_string(cap) +
                           " bytes a tree of this size needs");
    }
    std::vector<uint8_t> payload(h.length);
    DCR_RETURN_IF_ERROR(conn->Read(payload.data(), payload.size()));
    DCR_ASSIGN_OR_RETURN(std::vector<internal::ReportRecord> records,
                         internal::ParseReportPayload(payload.data(), payload.size(), h.blob));
    int committed = 0;
    bool failure = false;
    for (const internal::ReportRecord& r : records) {
      Status added = reports_.Add(static_cast<int>(child), r);
      if (!added.ok()) {
        std::fprintf(stderr, "node %d: refused a commit report: %s\n", plan_.rank,
                     added.message().c_str());
        continue;
      }
      if (r.report.ok) {
        ++committed;
      } else {
        failure = true;
      }
    }
    *committed_report = !failure;
    if (!failure) queue_->Post(event::SubtreeCommitted{child, committed});
    return Status();
  }

  const NodePlan& plan_;
  NodeState* state_;
  EventQueue* queue_;
  internal::ReportCollector reports_;
  std::shared_ptr<TokenBucket> long_bucket_;
  std::shared_ptr<const internal::TlsContext> tls_;  // the node's certificate; null: none
  std::shared_ptr<const internal::TlsContext> link_tls_;  // tls_ on the edges; null: plain TCP
  std::vector<ChildLink> children_;
  std::vector<std::unique_ptr<Conn>> parent_conns_;
  std::unique_ptr<FrameWriter> parent_writer_;
  std::unique_ptr<internal::Heartbeats> heartbeats_;  // stopped first in Close
  std::vector<std::thread> readers_;
  std::thread turn_away_;  // TurnAwayParent's listener, until Close
  std::vector<std::thread> leaving_;  // LeaveChildren's connections
  std::atomic<bool> stopping_{false};
  bool recover_ = false;
  std::function<bool()> parent_gone_;
  internal::EdgeIngress* ingress_ = nullptr;
  bool closed_ = false;
};

// ---- store jobs: Put / List / Fetch on a pool ----

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
  Status SkipHeld(const std::string& prefix) {
    DCR_ASSIGN_OR_RETURN(auto listed, store_->List(prefix + "/"));
    std::lock_guard<std::mutex> l(held_mu_);
    for (const auto& o : listed) held_[o.key] = o.size;
    filling_ = true;
    return Status();
  }
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
  void CountFailure(const Status& s) {
    state_->Update([&](NodeResult* r) {
      ++r->store_failures;
      if (s.IsDataLoss()) ++r->store_refused;
    });
  }

  void PutJob(const BlobPtr& b, const std::string& key) {
    bool held = false;
    bool filling = false;
    {
      std::lock_guard<std::mutex> l(held_mu_);
      auto it = held_.find(key);
      held = it != held_.end() && it->second == b->bytes.size();
      filling = filling_;
    }
    if (!held && filling) {
      // The in-region copy may have gained the object since the listing (the mirror lags).
      auto head = store_->Head(key);
      held = head.ok() && head->size == b->bytes.size();
    }
    if (held) {
      ++skipped_;
      queue_->Post(event::PutDone{b->info.id, true, ""});
      return;
    }
    // The uploader sits in the training region: every put crosses the (emulated) long link.
    if (plan_.emulate_wan) {
      if (plan_.long_bandwidth_Bps > 0) long_bucket_.Acquire(b->bytes.size());
      if (plan_.long_latency_s > 0) {
        usleep(static_cast<useconds_t>(2 * plan_.long_latency_s * 1e6));
      }
    }
    Status s = store_->Put(key, b->bytes.data(), b->bytes.size());
    if (!s.ok()) CountFailure(s);
    if (s.ok()) {
      state_->Update([&](NodeResult* r) {
        r->bytes_sent += b->bytes.size();
        if (plan_.emulate_wan) r->bytes_sent_long += b->bytes.size();
        if (filling) r->fill_bytes += b->bytes.size();
      });
    }
    queue_->Post(event::PutDone{b->info.id, s.ok(), s.ToString()});
  }

  // The fetch of listed blob `info` (info.size within the plan's limit) in ranges from the first
  // byte not held, into the blob's buffer (one of the listed size, created when the node holds
  // none of it); the buffer keeps what arrived when a range fails, and the retry continues
  // there. Returns false, having posted nothing, when the object is not of the listed size
  // (the caller fetches it whole, dropping what was held).
  bool FetchResumed(const BlobInfo& info, const std::string& key) {
    BlobPtr b = state_->Find(info.id);
    if (b != nullptr && (b->info.size != info.size || b->info.kind != info.kind)) {
      state_->Erase(info.id);  // held under another form: not this object's bytes
      b = nullptr;
    }
    if (b == nullptr) b = state_->GetOrCreate(info);
    if (b == nullptr) {
      queue_->Post(event::FetchDone{info.id, false,
                                    ResourceExhaustedError("out of memory for blob " +
                                                           std::to_string(info.id)).ToString()});
      return true;
    }
    const uint64_t held = state_->HeldPrefix(info.id);
    uint64_t have = held, fetched = 0;
    bool other_size = false;
    Status s;
    if (have < info.size) {  // a blob held whole is not read again
      s = internal::FetchRemainder(*store_, key, info.size,
                                   std::max(plan_.relay.piece_bytes, internal::kMinFetchRangeBytes),
                                   &b->bytes, &have, &fetched, &other_size);
    }
    if (have > held) {
      state_->MarkHeld(info.id, held, have - held);
      state_->Persist(info, held, b->bytes.data() + held, have - held);
    }
    const double now = WallNow();
    state_->Update([&](NodeResult* r) {
      if (fetched > 0) NodeState::MarkBlob(r, now);
      r->bytes_received += fetched;
      r->fetched_bytes += fetched;
      if (s.ok() && held > 0) {
        ++r->resumed_blobs;
        r->resumed_bytes += held;
      }
      if (s.ok() && held > 0 && held < info.size) {
        r->recovery_log += "resumed blob " + std::to_string(info.id) + " at byte " +
                           std::to_string(held) + " of " + std::to_string(info.size) + "\n";
      }
    });
    if (other_size) {
      state_->Erase(info.id);
      return false;
    }
    if (!s.ok()) CountFailure(s);
    queue_->Post(event::FetchDone{info.id, s.ok(), s.ok() ? "" : s.ToString()});
    return true;
  }

  void ListJob(const std::string& prefix) {
    auto l = store_->List(prefix + "/");
    event::ListDone done;
    done.ok = l.ok();
    if (!l.ok()) {
      CountFailure(l.status());
      done.message = l.status().ToString();
    } else {
      for (const auto& o : *l) {
        auto b = ParseObjectKey(prefix, o.key);
        if (!b.ok()) continue;  // foreign object under the prefix
        b->size = o.size;
        done.blobs.push_back(*b);
      }
    }
    queue_->Post(std::move(done));
  }

  void FetchJob(const BlobInfo& info, const std::string& key) {
    const uint64_t limit = MaxBlobBytes(plan_, info.kind);
    // An object listed larger than the plan allows is refused unread (a sparse 1 TB file would
    // otherwise cost a read of the limit on every retry).
    if (info.size > limit) {
      queue_->Post(event::FetchDone{
          info.id, false,
          DataLossError("object " + key + " is " + std::to_string(info.size) + " bytes, larger "
                        "than the " + std::to_string(limit) + " bytes the plan allows for a " +
                        BlobKindName(info.kind)).ToString()});
      return;
    }
    if (resume_ && FetchResumed(info, key)) return;
    // One byte past the limit tells an oversized object from one of exactly the limit (the
    // listing may be older than the object).
    auto got = store_->GetRange(key, 0, limit + 1);
    if (got.ok() && got->size() > limit) {
      got = DataLossError("object " + key + " is larger than the " + std::to_string(limit) +
                          " bytes the plan allows for a " + BlobKindName(info.kind));
    }
    if (!got.ok()) {
      CountFailure(got.status());
      queue_->Post(event::FetchDone{info.id, false, got.status().ToString()});
      return;
    }
    auto b = std::make_shared<BlobBuf>();
    b->info = info;
    b->info.size = got->size();
    b->bytes = std::move(got).value();
    state_->Store(b);
    const double now = WallNow();
    state_->Update([&](NodeResult* r) {
      NodeState::MarkBlob(r, now);
      r->bytes_received += b->bytes.size();
      r->fetched_bytes += b->bytes.size();
    });
    queue_->Post(event::FetchDone{info.id, true, ""});
  }

  const NodePlan& plan_;
  NodeState* state_;
  EventQueue* queue_;
  std::unique_ptr<ObjectStore> store_;
  // Burst: one segment, so the rate holds at fine time scales.
  TokenBucket long_bucket_{plan_.long_bandwidth_Bps, 64 << 10};
  std::mutex held_mu_;
  std::map<std::string, uint64_t> held_;  // SkipHeld: key -> size
  bool filling_ = false;                   // SkipHeld was called: look before each put
  std::atomic<uint64_t> skipped_{0};
  bool resume_ = false;
  WorkPool pool_;
};

// ---- the node's device ----

// "<device>:<index>" of `plan`, as errors name it.
std::string PlanDeviceName(const NodePlan& plan) {
  return plan.device + ":" + std::to_string(plan.device_index);
}

// OpenDevice(plan.device, plan.device_index) for `who` ("receiver 3", "sender"), or null when
// `use` is false or the device is "cpu" (host memory, no Device). plan.device is checked either
// way.
StatusOr<std::shared_ptr<Device>> OpenPlanDevice(const NodePlan& plan, bool use,
                                                 const std::string& who) {
  auto kind = ParseDeviceKind(plan.device);
  if (!kind.ok()) return kind.status().WithContext("plan.device");
  if (!use || *kind == DeviceKind::kCpu) return std::shared_ptr<Device>();
  auto opened = OpenDevice(*kind, plan.device_index);
  if (!opened.ok()) return opened.status().WithContext(who + " on device " + PlanDeviceName(plan));
  return std::shared_ptr<Device>(std::move(*opened));
}

// ---- apply pool: Apply actions through the node's Receiver ----

class ApplyJobs {
 public:
  ApplyJobs(NodeState* state, EventQueue* queue) : state_(state), queue_(queue) {}

  // The receiver of `plan`, in host memory for device "cpu", else in the memory of
  // OpenDevice(plan.device, plan.device_index): delta: holds plan.receiver_base_path (a device
  // that cannot be opened or cannot hold the base fails here, before the node takes part in the
  // refit); full: the file image, loaded onto the device at commit.
  // With plan.state_dir (delta): the node_recovery.h DurableReceiver (journal; storage mapped
  // from a file on "cpu"), at start number `starts`, applying to `carried` (device storage this
  // process kept from the version before) when it holds the base.
  Status Open(const NodePlan& plan, int starts, std::unique_ptr<Receiver> carried = nullptr) {
    const std::string who = "receiver " + std::to_string(plan.rank);
    DCR_ASSIGN_OR_RETURN(std::shared_ptr<Device> device, OpenPlanDevice(plan, true, who));
    if (plan.method == "delta" && !plan.state_dir.empty()) {
      internal::KillPoint kill{plan.fault_kill_chunk, plan.fault_kill_inside};
      DCR_ASSIGN_OR_RETURN(durable_, internal::DurableReceiver::Open(plan, device, starts, kill,
                                                                     std::move(carried)));
      // Only what the trainer's key signed, never below the version floor (node_trust.h),
      // checked before the journal records anything.
      DCR_ASSIGN_OR_RETURN(backend_, internal::WithPlanTrust(plan, durable_->Handle(), &floor_));
    } else if (plan.method == "delta") {
      if (plan.receiver_base_path.empty()) {
        return InvalidArgumentError("plan.receiver_base_path: required for a delta receiver");
      }
      if (device == nullptr) {
        DCR_ASSIGN_OR_RETURN(backend_, BufferReceiver::Load(plan.receiver_base_path));
      } else {
        auto receiver = MakeDeviceReceiver(device, plan.receiver_base_path);
        if (!receiver.ok()) return receiver.status().WithContext(who + " on device " + PlanDeviceName(plan) +
                                                   ": loading the base");
        backend_ = std::move(*receiver);
      }
      // Only what the trainer's key signed, never below the version floor (node_trust.h).
      DCR_ASSIGN_OR_RETURN(backend_, internal::WithPlanTrust(plan, std::move(backend_), &floor_));
    } else {
      backend_ = device == nullptr ? MakeFullReceiver() : MakeFullReceiver(device);
      // Only slices the trainer's key signed (node_trust.h).
      DCR_ASSIGN_OR_RETURN(backend_, internal::WithPlanFullTrust(plan, std::move(backend_)));
    }
    if (rx_ == nullptr) rx_ = backend_.get();
    ReportHeld();
    pool_.Start(plan.relay.max_parallel_applies);
    return Status();
  }
  // A receiver that stays up across versions: the storage of the version before (`backend`)
  // instead of one loaded from plan.receiver_base_path.
  Status Adopt(std::unique_ptr<Receiver> backend, const NodePlan& plan) {
    backend_ = std::move(backend);
    rx_ = backend_.get();
    DCR_RETURN_IF_ERROR(internal::AdoptPlanFloor(plan, backend_.get(), &floor_));
    ReportHeld();
    pool_.Start(plan.relay.max_parallel_applies);
    return Status();
  }
  // Hands the storage back once the pool has stopped (null when none was opened; for a
  // DurableReceiver, whose journal and mapping belong to this process's single version, its
  // device storage when it holds the committed version: DurableReceiver::TakeDevice).
  std::unique_ptr<Receiver> Release() {
    pool_.Stop();
    if (durable_ != nullptr) return durable_->TakeDevice();
    internal::ReleasePlanFloor(backend_.get());  // floor_ ends with this node
    return std::move(backend_);
  }
  bool open() const { return rx_ != nullptr; }
  internal::DurableReceiver* durable() { return durable_.get(); }
  void Apply(const BlobPtr& b) {
    pool_.Submit([this, b] { ApplyJob(b); });
  }
  // RecoveryPolicy's RequestOverwrite for the refused chunk blob `b`: its overwrite form, built
  // from the base it applies to, applied in its place; ApplyDone reports the blob.
  void Repair(const BlobPtr& b) {
    pool_.Submit([this, b] {
      double t = SteadyNow();
      auto ow = durable_->OverwriteForm(b->bytes.data(), b->bytes.size());
      Status s;
      if (!ow.ok()) {
        s = ow.status().WithContext("overwrite form");
      } else if (auto* trusted = dynamic_cast<TrustedReceiver*>(rx_)) {
        // The overwrite form is built here, so no manifest lists it: the signed record it
        // comes from is what is checked.
        s = trusted->ApplyDerived(b->bytes.data(), b->bytes.size(), ow->data(), ow->size());
      } else {
        s = rx_->ApplyRecord(ow->data(), ow->size());
      }
      if (s.ok()) ++repairs_;
      const double spent = SteadyNow() - t;
      state_->Update([&](NodeResult* r) { r->apply_seconds += spent; });
      queue_->Post(event::ApplyDone{b->info.id, s.ok(), s.code(), s.message()});
    });
  }
  uint64_t repairs() const { return repairs_.load(); }
  void Drain() { pool_.Drain(); }
  Status Verify(const std::string& target_path) { return VerifyFile(*rx_, target_path); }
  // The version the storage holds (between applies).
  VersionId held() const { return rx_->held(); }
  void Stop() { pool_.Stop(); }
  // The receiver's version floor (plan.version_floor_path); null without one.
  const VersionFloor* floor() const { return floor_.get(); }

 private:
  void ApplyJob(const BlobPtr& b) {
    double t = SteadyNow();
    Status s;
    switch (b->info.kind) {
      case BlobKind::kHeader:
        s = rx_->Begin(b->bytes.data(), b->bytes.size());
        break;
      case BlobKind::kChunk:
        s = rx_->ApplyRecord(b->bytes.data(), b->bytes.size());
        break;
      case BlobKind::kTrailer:
        s = rx_->Commit(b->bytes.data(), b->bytes.size());
        break;
    }
    const double spent = SteadyNow() - t;
    state_->Update([&](NodeResult* r) { r->apply_seconds += spent; });
    if (!s.ok() && s.IsFailedPrecondition() && durable_ != nullptr &&
        b->info.kind == BlobKind::kChunk) {
      // The relative form of a chunk the journal shows doubtful: the policy decides (R6).
      size_t header_size = 0, record_size = 0;
      auto h = ParseChunkHeader(b->bytes.data(), b->bytes.size(), &header_size, &record_size);
      if (h.ok() && durable_->Doubtful(h->chunk_id)) {
        queue_->PostRecovery(recovery::ChunkDoubtful{h->chunk_id}, b->info.id);
        return;
      }
    }
    if (s.ok() && b->info.kind == BlobKind::kChunk) {
      state_->UpdateMetrics([](internal::NodeMetrics* m) { ++m->chunks_applied; });
    } else if (s.ok() && b->info.kind == BlobKind::kTrailer) {
      ReportHeld();  // committed: no other call runs
    }
    queue_->Post(event::ApplyDone{b->info.id, s.ok(), s.code(), s.message()});
  }

  // The version the storage holds, for the metrics endpoint (called when no Receiver call runs).
  void ReportHeld() {
    const VersionId held = backend_->held();
    state_->UpdateMetrics([&](internal::NodeMetrics* m) {
      m->holds_version = true;
      m->version_held = held.number;
      m->hash_held = held.hash;
    });
  }

  NodeState* state_;
  EventQueue* queue_;
  std::unique_ptr<Receiver> backend_;
  std::unique_ptr<VersionFloor> floor_;
  std::unique_ptr<internal::DurableReceiver> durable_;
  Receiver* rx_ = nullptr;  // backend_, or durable_'s journaled receiver
  std::atomic<uint64_t> repairs_{0};
  WorkPool pool_;
};

// ---- builder: the sender's checkpoints and the thread that streams the blobs ----

// Collects the streamed delta into blobs (header 0, chunks 1.., trailer last).
class StreamingSink : public DeltaSink {
 public:
  explicit StreamingSink(std::function<Status(BlobKind, std::vector<uint8_t>)> emit)
      : emit_(std::move(emit)) {}
  Status OnHeader(const std::vector<uint8_t>& bytes) override {
    return emit_(BlobKind::kHeader, bytes);
  }
  Status OnChunk(const ChunkHeader&, const std::vector<uint8_t>& bytes) override {
    return emit_(BlobKind::kChunk, bytes);
  }
  // A manifest record travels as a chunk blob: relays forward it like any record, receivers
  // tell it by its magic.
  Status OnManifest(const std::vector<uint8_t>& bytes) override {
    return emit_(BlobKind::kChunk, bytes);
  }
  Status OnTrailer(const std::vector<uint8_t>& bytes) override {
    return emit_(BlobKind::kTrailer, bytes);
  }

 private:
  std::function<Status(BlobKind, std::vector<uint8_t>)> emit_;
};

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
  Status LoadCheckpoints() {
    auto open = [](const std::string& path, std::unique_ptr<Checkpoint>* out) -> Status {
      auto c = Checkpoint::Open(path);
      if (!c.ok()) return c.status().WithContext("sender");
      *out = std::move(*c);
      return Status();
    };
    DCR_RETURN_IF_ERROR(open(plan_.target_path, &target_ckpt_));
    state_->result()->dense_bytes = target_ckpt_->total_tensor_bytes();
    // A delta built here needs the base; the trainer's delta (plan.delta_path) is streamed as
    // it is, checked against the base's hash by RunNodeVersions.
    const bool delta = plan_.method == "delta" && plan_.delta_path.empty();
    if (delta) {
      DCR_RETURN_IF_ERROR(open(plan_.base_path, &base_ckpt_));
      // Refused here, at start, not when the build reaches the tensor: headers only.
      Status compatible = CheckDeltaCompatible(*base_ckpt_, *target_ckpt_);
      if (!compatible.ok()) return compatible.WithContext("sender");
    }
    // Every file of a checkpoint (each shard of a directory).
    auto files_bytes = [](const Checkpoint& c) {
      double sum = 0;
      for (const CheckpointFile& f : c.files()) sum += static_cast<double>(f.size);
      return sum;
    };
    auto make_resident = [](const Checkpoint& c, const std::string& path) -> Status {
      for (const CheckpointFile& f : c.files()) {
        DCR_RETURN_IF_ERROR(internal::MakeResident(
            f.data, f.size, f.name.empty() ? path : path + "/" + f.name));
      }
      return Status();
    };
    const double bytes = files_bytes(*target_ckpt_) + (delta ? files_bytes(*base_ckpt_) : 0.0);
    // Free memory, or the memory cgroup's limit when that is smaller (the page cache is charged
    // against it).
    const double free_bytes =
        std::min(static_cast<double>(sysconf(_SC_AVPHYS_PAGES)) *
                     static_cast<double>(sysconf(_SC_PAGESIZE)),
                 static_cast<double>(internal::MemoryCgroupLimit()));
    if (bytes <= 0.5 * free_bytes) {
      DCR_RETURN_IF_ERROR(make_resident(*target_ckpt_, plan_.target_path));
      if (delta) DCR_RETURN_IF_ERROR(make_resident(*base_ckpt_, plan_.base_path));
    } else {
      std::fprintf(stderr, "sender: checkpoints (%.1f GB) exceed half the free memory (%.1f GB): "
                   "read during the build\n", bytes / 1e9, free_bytes / 1e9);
    }
    if (delta && !plan_.base_sums.empty()) known_base_hash_ = BaseHashFromSums();
    // Cached: BuildDelta's header uses it.
    if (delta && known_base_hash_ == Hash128{}) base_ckpt_->ContentHash(plan_.build_threads);
    // The delta's changes are found on the plan's device (plan.device "host" | "cuda"); the full
    // reference streams file bytes and needs none.
    DCR_ASSIGN_OR_RETURN(device_, OpenPlanDevice(plan_, delta, "sender"));
    if (!plan_.signing_key.empty()) {  // the delta, or the full stream (node_trust.h)
      auto key = SigningKey::Load(plan_.signing_key);
      if (!key.ok()) return key.status().WithContext("sender");
      signing_key_ = std::move(*key);
    }
    return Status();
  }

  void Start() {
    thread_ = std::thread([this] { Build(); });
  }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Build() {
    BlobId next = 0;
    std::vector<std::vector<uint8_t>> held;  // shuffle_seed: chunks held back
    std::function<Status(BlobKind, std::vector<uint8_t>)> emit_now;
    auto emit = [&](BlobKind kind, std::vector<uint8_t> bytes) -> Status {
      if (plan_.shuffle_seed == 0 || kind == BlobKind::kHeader) {
        return emit_now(kind, std::move(bytes));
      }
      if (kind == BlobKind::kChunk) {
        held.push_back(std::move(bytes));
        return Status();
      }
      std::mt19937_64 rng(plan_.shuffle_seed);
      std::shuffle(held.begin(), held.end(), rng);
      for (auto& h : held) DCR_RETURN_IF_ERROR(emit_now(BlobKind::kChunk, std::move(h)));
      return emit_now(kind, std::move(bytes));
    };
    emit_now = [&](BlobKind kind, std::vector<uint8_t> bytes) -> Status {
      auto b = std::make_shared<BlobBuf>();
      b->info = BlobInfo{next++, kind, bytes.size()};
      b->bytes = std::move(bytes);
      state_->Store(b);
      const double now = WallNow();
      state_->Update([&](NodeResult* r) {
        NodeState::MarkBlob(r, now);
        r->payload_bytes += b->info.size;
        r->blobs++;
      });
      queue_->Post(event::BlobProduced{b->info});
      return Status();
    };
    Status s;
    if (plan_.method == "delta" && !plan_.delta_path.empty()) {  // the trainer's delta
      StreamingSink stream(emit);
      SignOptions so;
      so.run_id = plan_.run_id;
      SigningSink signing(signing_key_.get(), so, &stream);
      s = internal::StreamDeltaFile(plan_.delta_path,
                                    signing_key_ ? static_cast<DeltaSink*>(&signing) : &stream);
    } else if (plan_.method == "delta") {  // checkpoints loaded by LoadCheckpoints
      DeltaOptions o;
      o.chunk_elems = plan_.chunk_elems;
      o.zstd_level = plan_.zstd_level;
      o.context_coding = plan_.context_coding;
      o.context_classes = plan_.context_classes;
      o.threads = plan_.build_threads;
      o.known_base_hash = known_base_hash_;
      if (plan_.version > 0) {  // the version this refit delivers, from its base version
        o.base_version = plan_.base_version >= 0 ? static_cast<uint64_t>(plan_.base_version)
                                                 : plan_.version - 1;
        o.target_version = plan_.version;
      }
      StreamingSink stream(emit);
      SignOptions so;
      so.run_id = plan_.run_id;
      SigningSink signing(signing_key_.get(), so, &stream);
      DeltaSink* sink = signing_key_ ? static_cast<DeltaSink*>(&signing) : &stream;
      // device_ null (device "cpu"): BuildDelta's host diff.
      auto st = BuildDeltaOnDevice(base_ckpt_.get(), *target_ckpt_, o, device_.get(), sink);
      if (st.ok()) {
        state_->Update([&](NodeResult* r) { r->dense_bytes = st->dense_bytes; });
        if (!plan_.target_sums.empty()) {
          // The refit does not depend on it: a failed write costs the next version a full hash.
          Status ws = WriteSums(plan_.target_sums,
                                ComputeSums(*target_ckpt_, st->target_hash, plan_.build_threads));
          if (!ws.ok()) {
            std::fprintf(stderr, "sender: target sums not written: %s\n", ws.ToString().c_str());
          }
        }
      }
      s = st.status();
    } else if (signing_key_ != nullptr) {  // signed slices (node_trust.h FullStreamSigner)
      internal::FullStreamSigner signer(signing_key_.get(), plan_.run_id, plan_.version, emit);
      s = FullStreamBlobs(plan_.target_path, plan_.full_slice_bytes,
                          [&signer](BlobKind k, std::vector<uint8_t> b) { return signer(k, std::move(b)); });
    } else {
      s = FullStreamBlobs(plan_.target_path, plan_.full_slice_bytes, emit);
    }
    if (!s.ok()) queue_->Fatal(s.WithContext("sender: building the stream"));
  }

  // The base's content hash recorded in plan.base_sums once every byte of the base matches the
  // file's region hashes; zero (compute it) when the file is missing, malformed or stale.
  Hash128 BaseHashFromSums() const {
    auto sums = ReadSums(plan_.base_sums);
    Status ok = sums.ok() ? CheckSums(*base_ckpt_, *sums, plan_.build_threads) : sums.status();
    if (!ok.ok()) {
      std::fprintf(stderr, "sender: base sums not used, hashing the base: %s\n",
                   ok.ToString().c_str());
      return Hash128{};
    }
    return sums->content_hash;
  }

  const NodePlan& plan_;
  NodeState* state_;
  EventQueue* queue_;
  Hash128 known_base_hash_;  // from plan.base_sums; zero = BuildDelta's own (cached) hash
  std::unique_ptr<Checkpoint> base_ckpt_, target_ckpt_;
  std::shared_ptr<Device> device_;  // the delta's diff device; null = the host diff
  std::unique_ptr<SigningKey> signing_key_;  // plan.signing_key; null = an unsigned stream
  std::thread thread_;
};

// ---- the node: the environment of its policy over the parts above ----

class SocketNode : public NodeEnvironment {
 public:
  // `carry` (may be null): a receiver's storage kept across the versions of a long-lived node;
  // a non-null *carry is applied to instead of loading plan.receiver_base_path, and the
  // storage is handed back in it when the node is done, whatever the outcome.
  SocketNode(const NodePlan& plan, NodeResult* result, std::unique_ptr<Receiver>* carry = nullptr)
      : carry_(carry),
        plan_(plan),
        state_(result),
        links_(plan, &state_, &queue_),
        store_(plan, &state_, &queue_),
        applier_(&state_, &queue_),
        builder_(plan, &state_, &queue_),
        recovery_env_(this) {}
  ~SocketNode() override { Teardown(); }

  Status Run() {
    NodeResult* r = state_.result();
    r->rank = plan_.rank;
    r->pid = static_cast<int64_t>(getpid());
    t0_ = SteadyNow();
    deadline_ = t0_ + plan_.timeout_s;
    state_.UpdateMetrics([&](internal::NodeMetrics* m) {
      m->rank = plan_.rank;
      m->run_id = plan_.run_id;
      m->version_target = plan_.version;
      m->started_at = WallNow();
      m->up = true;
    });
    if (!plan_.metrics_address.empty()) {
      internal::MetricsBoard::Process().Attach([this] {
        internal::NodeMetrics m = state_.Metrics();
        m.repairs = applier_.repairs();
        return m;
      });
    }
    Status s = Setup();
    if (s.ok()) s = Barrier();
    if (s.ok() && plan_.rank == 0) builder_.Start();
    if (s.ok()) s = Loop();
    if (!s.ok()) {
      state_.UpdateMetrics([&](internal::NodeMetrics* m) {
        m->up = false;
        m->last_error = s.ToString();
      });
    }
    if (mirror_ != nullptr) mirror_->Flush();
    next_progress_ = 0;  // the final counts, also after a failure
    WriteProgressIfDue();
    if (recovery_ != nullptr && recovery_->mode() == RecoveryPolicy::Mode::kCommitted) {
      committed_ = true;  // also a restart whose journal shows the target committed
      if (r->t_commit == 0) r->t_commit = WallNow();
    }
    RecordRecovery();
    if (s.ok() && applier_.open() && committed_ && !plan_.verify_path.empty()) {
      Status v = applier_.Verify(plan_.verify_path);
      r->verified = v.ok();
      r->verify_message = v.ok() ? "byte-for-byte equal to the target" : v.message();
    }
    // A node that fails tells its parent why, with what its subtree reported, before its
    // links close (Teardown flushes the frame).
    if (!s.ok() && links_.has_parent()) {
      const internal::ReportRecord own = OwnReport(s);
      links_.SendReport(applier_.open() ? &own : nullptr);
    }
    r->reports = links_.reports();
    // Recovering nodes also leave their report in the store, where a sender whose tree is gone
    // collects the reports that could not travel up it.
    if (recovery_ != nullptr && store_.open() && plan_.rank != 0 && applier_.open() &&
        (committed_ || !s.ok())) {
      // Retried as the stream's store operations are (RelayOptions retry_backoff_s, doubling,
      // max_retries): a store that refuses writes for a while must not lose the report.
      const std::vector<uint8_t> report = OwnReport(s).bytes;
      Status put = store_.PutNow(ReportKey(plan_.rank), report);
      for (int a = 0; !put.ok() && a < plan_.relay.max_retries; ++a) {
        ::usleep(static_cast<useconds_t>(plan_.relay.retry_backoff_s * (1u << std::min(a, 16)) * 1e6));
        put = store_.PutNow(ReportKey(plan_.rank), report);
      }
    }
    if (s.ok() && recovery_ != nullptr && plan_.rank == 0 && plan_.transport == "relay_tree" &&
        (filled_store_ || !AllReportsOk(r->reports))) {
      s = CollectStoreReports(&r->reports);
    }
    Teardown();
    if (plan_.rank != 0 && !committed_) {
      r->freeze = internal::PlanFreezeReport(plan_, applier_.floor(), r->t_start);
    }
    r->ok = s.ok();
    if (!s.ok()) r->error = s.ToString();
    return s;
  }

  // ---- NodeEnvironment (called on the loop thread) ----

  void SetTimer(TimePoint at) override { timer_at_ = at; }
  void Send(const action::Send& s) override {
    BlobPtr b;
    if (edge_lag_ != nullptr) {  // a lagging edge relay gets the plain form of what it had not
      edge_lag_->Sent(s.to, s.blob.id);
      auto r = reencoded_.find(s.to);
      if (r != reencoded_.end() && r->second.count(s.blob.id) != 0) {
        auto f = plain_forms_.find(s.blob.id);
        if (f == plain_forms_.end()) {
          return Fault(InternalError("send of blob " + std::to_string(s.blob.id) +
                                     ": its plain form is not held"));
        }
        b = f->second;
      }
    }
    if (!b) b = state_.Find(s.blob.id);
    if (!b) return Fault(InternalError("send of unknown blob " + std::to_string(s.blob.id)));
    if (b->bytes.size() != s.blob.size) {
      return Fault(InternalError("send of blob " + std::to_string(s.blob.id) + " at " +
                                 std::to_string(s.blob.size) + " bytes: " +
                                 std::to_string(b->bytes.size()) + " are held"));
    }
    MaybeKillAtBlob(s.blob.id);
    Fault(links_.Send(s, b));
  }
  void Ack(const action::Ack& ack) override {
    links_.SendToParent(FrameType::kAck, ack.blob);
    BlobPtr b = state_.Find(ack.blob);
    if (mirror_ != nullptr && b != nullptr) {
      mirror_->Put(b->info, std::shared_ptr<const std::vector<uint8_t>>(b, &b->bytes));
    }
    MaybeKillAtBlob(blobs_whole_++);
  }
  void ReportCommit(const action::ReportCommit&) override {
    if (!applier_.open()) return links_.SendReport(nullptr);
    const internal::ReportRecord own = OwnReport(Status());
    links_.SendReport(&own);
  }
  void Apply(const action::Apply& ap) override {
    BlobPtr b = state_.Find(ap.blob.id);
    if (!b) return Fault(InternalError("apply of unknown blob " + std::to_string(ap.blob.id)));
    applier_.Apply(b);
  }
  void Release(BlobId blob) override {
    // A recovering sender keeps the stream: a failed tree is followed by filling the store.
    if (plan_.rank == 0 && recovery_ != nullptr) return;
    // A recovering node keeps what it applied, up to kResumeHoldBytes, until it commits: a
    // fallback to the store then fetches none of it again (node/blob_resume.h).
    if (recovery_ != nullptr && ingress_ == nullptr && !committed_) {
      BlobPtr b = state_.Find(blob);
      if (b != nullptr && kept_bytes_ + b->bytes.size() <= kResumeHoldBytes) {
        kept_bytes_ += b->bytes.size();
        return;
      }
    }
    state_.Erase(blob);
    plain_forms_.erase(blob);
  }
  void Put(const action::Put& put) override {
    BlobPtr b = state_.Find(put.blob.id);
    if (!b) return Fault(InternalError("put of unknown blob " + std::to_string(put.blob.id)));
    if (plan_.rank == 0) MaybeKillAtBlob(put.blob.id);
    store_.Put(b, put.key);
  }
  void List(const action::List& list) override { store_.List(list.prefix); }
  void Fetch(const action::Fetch& f) override { store_.Fetch(f.blob, f.key); }
  void Committed() override {
    committed_ = true;
    if (spool_ != nullptr) spool_->Discard();  // nothing of the version is fetched again
    state_.result()->t_commit = WallNow();
    if (freeze_watch_ != nullptr) freeze_watch_->Committed(plan_.version, state_.result()->t_commit);
    MarkCommittedInMetrics();
    if (recovery_ != nullptr) pending_recovery_.emplace_back(std::in_place_type<recovery::Committed>);
  }
  void TreeCommitted(int receivers) override {
    state_.result()->t_commit = WallNow();
    state_.result()->receivers_committed = receivers;
    MarkCommittedInMetrics();
  }
  void Published() override {
    state_.result()->t_commit = WallNow();
    MarkCommittedInMetrics();
  }
  void Failed(const Status& status) override {
    if (recovery_ == nullptr) return Fault(status);
    // Decided after the policy's Handle returns (the decision may replace the policy).
    const NodeRole role = host_->policy().role();
    recovery::StreamFailed f;
    f.stream = role == NodeRole::kDownloader ? recovery::Stream::kDownload
               : role == NodeRole::kUploader ? recovery::Stream::kUpload
                                             : recovery::Stream::kTree;
    f.code = status.code();
    f.message = status.message();
    pending_recovery_.push_back(f);
  }

 private:
  // ---- recovery: the node's RecoveryPolicy and the environment that carries out its actions ----

  class RecoveryEnv : public RecoveryEnvironment {
   public:
    explicit RecoveryEnv(SocketNode* n) : n_(n) {}
    void SetTimer(TimePoint at) override { n_->recovery_timer_at_ = at; }
    void FallBackToStore(const std::string& reason) override { n_->DoFallBack(reason); }
    void LeaveTree() override { n_->DoLeaveTree(); }
    void StartDownload() override { n_->StartPolicy(MakeDownloaderPolicy(n_->plan_.relay)); }
    void Reparent(NodeId to) override {
      // ParentLost never offers an adopter here: no tree node serves a child joining mid-stream.
      n_->Fault(InternalError("re-parent to node " + std::to_string(to) + " never offered"));
    }
    void ReloadCommitted() override { n_->DoReload(); }
    void RequestOverwrite(uint64_t chunk_id, const std::string&) override {
      n_->DoRepair(chunk_id);
    }
    void StopUpload() override {
      n_->Fault(UnavailableError("sender: the store upload failed; the stream stays unpublished "
                                 "until the sender restarts"));
    }
    void Republish() override { n_->FillStore(); }
    void GiveUp(const std::string& message) override {
      n_->Fault(UnavailableError("node " + std::to_string(n_->plan_.rank) + ": " + message));
    }

   private:
    SocketNode* n_;
  };

  void Recover(const recovery::Event& e) {
    std::vector<recovery::Action> acts;
    recovery_->Handle(Now(), e, &acts);
    for (const recovery::Action& a : acts) {
      if (std::holds_alternative<recovery::SetTimer>(a)) continue;
      state_.Update([&](NodeResult* r) {
        r->recovery_log += recovery::ToString(e) + " -> " + recovery::ToString(a) + "\n";
      });
    }
    PerformRecovery(acts, &recovery_env_);
    const uint64_t spent = static_cast<uint64_t>(recovery_->recoveries());
    state_.UpdateMetrics([&](internal::NodeMetrics* m) { m->recoveries = spent; });
  }
  // Decisions on what the last Handle reported (a policy's Fail, a commit).
  Status AfterHandle() {
    while (!pending_recovery_.empty() && error_.ok()) {
      recovery::Event e = pending_recovery_.front();
      pending_recovery_.erase(pending_recovery_.begin());
      Recover(e);
    }
    return error_;
  }
  // Hosts `policy` as the node's stream policy and starts it.
  void StartPolicy(std::unique_ptr<NodePolicy> policy) {
    host_ = std::make_unique<PolicyHost>(std::move(policy), this);
    timer_at_ = -1;
    host_->Handle(Now(), event::Start{});
  }
  // FallBackToStore: the stream policy and everything in flight for it are dropped.
  void DoFallBack(const std::string& reason) {
    (void)reason;
    state_.Update([](NodeResult* r) { ++r->fallbacks; });
    links_.Close();
    if (ingress_ != nullptr) ingress_->Reset();
    applier_.Drain();
    store_.Drain();
    queue_.Bump();
    // The bytes held stay, for the download to continue from (node/blob_resume.h); an edge
    // relay's are of another form than the store's.
    if (ingress_ != nullptr) state_.Clear();
    doubtful_blobs_.clear();
    host_.reset();
    timer_at_ = -1;
    if (!store_.open()) Fault(UnavailableError("node " + std::to_string(plan_.rank) +
                                               ": no object store to fall back to"));
    // The drained applies may have finished the commit whose completion the stream bump
    // dropped: the journal says so, and the policy hears it (no second apply of the delta).
    if (!committed_ && applier_.durable() != nullptr && applier_.durable()->TargetCommittedNow()) {
      Committed();
    }
  }
  void DoLeaveTree() {
    links_.Close();
    if (plan_.rank == 0) FillStore();
  }
  // Sender: the stream goes to the store (the tree is left, or the sender restarted): an
  // uploader over every blob built so far and the rest as the builder produces them; objects
  // the store already holds (the long-link relay's copy) are not put again.
  void FillStore() {
    filled_store_ = true;
    Status st = store_.open() ? store_.SkipHeld(plan_.relay.prefix)
                              : UnavailableError("sender: no object store to publish to");
    if (!st.ok()) return Fault(st.WithContext("sender: filling the store"));
    fed_.clear();
    StartPolicy(MakeUploaderPolicy(plan_.relay));
    for (const BlobPtr& b : state_.All()) {
      fed_.insert(b->info.id);
      BlobInfo info = b->info;
      st = PlainForStore(&info);
      if (!st.ok()) return Fault(st.WithContext("sender: filling the store"));
      host_->Handle(Now(), event::BlobProduced{info});
    }
  }
  // Sender with edge relays filling the store: blob `*info`, when a context-coded chunk record,
  // is replaced by its plain record (and *info by its size), so that the store holds what every
  // receiver applies, with or without the base.
  Status PlainForStore(BlobInfo* info) {
    if (plan_.edge_relays.empty() || plan_.method != "delta" || info->kind != BlobKind::kChunk) {
      return Status();
    }
    auto held = plain_forms_.find(info->id);
    BlobPtr nb = held != plain_forms_.end() ? held->second : nullptr;
    if (nb == nullptr) {
      DCR_ASSIGN_OR_RETURN(nb, PlainForm(info->id));
    }
    if (nb == nullptr) return Status();
    state_.Store(nb);
    *info = nb->info;
    return Status();
  }
  // Sender with edge relays: the plain record of held blob `id` when it is a context-coded chunk
  // record (ContextChunkToPlain against the sender's base, which is the run's), else null.
  StatusOr<BlobPtr> PlainForm(BlobId id) {
    if (store_plain_ == nullptr) {
      DCR_ASSIGN_OR_RETURN(store_plain_,
                           internal::EdgeTranscoder::Open(plan_.base_path, plan_.zstd_level));
    }
    if (!store_plain_->has_header()) {
      BlobPtr h = state_.Find(0);
      if (h == nullptr) return InternalError("the delta header is not held");
      DCR_RETURN_IF_ERROR(store_plain_->SetHeader(h->bytes.data(), h->bytes.size()));
    }
    BlobPtr b = state_.Find(id);
    if (b == nullptr) return InternalError("blob " + std::to_string(id) + " is not held");
    if (b->info.kind != BlobKind::kChunk) return BlobPtr();
    DCR_ASSIGN_OR_RETURN(std::optional<std::vector<uint8_t>> plain,
                         store_plain_->ToPlain(b->bytes.data(), b->bytes.size()));
    if (!plain) return BlobPtr();
    auto nb = std::make_shared<BlobBuf>();
    nb->info = BlobInfo{id, b->info.kind, plain->size()};
    nb->bytes = std::move(*plain);
    return nb;
  }
  // Sender with edge relays (edge_lag.h): the link's progress to each edge relay; a lagging one
  // is sent the plain form of every chunk not started on its edge, now and as they are built,
  // until it has caught up: then the chunks not started on its edge go context-coded again.
  Status WatchEdges(const Event& ev) {
    if (const auto* d = std::get_if<event::SendDone>(&ev)) {
      if (edge_lag_->Accepted(d->to, d->blob, d->length)) return SwitchToPlain(d->to);
    } else if (const auto* a = std::get_if<event::AckReceived>(&ev)) {
      if (edge_lag_->Acked(a->from, a->blob)) SwitchToContext(a->from);
    }
    return Status();
  }
  // The open switch of `child` (the last one recorded for it), or null.
  static NodeResult::EdgeSwitch* OpenSwitch(NodeResult* r, NodeId child) {
    for (auto it = r->edge_switches.rbegin(); it != r->edge_switches.rend(); ++it) {
      if (it->child == child) return it->resumed ? nullptr : &*it;
    }
    return nullptr;
  }
  // A lagging edge relay caught up: every chunk it was to get in the plain form and has not
  // started on its edge goes back to its context-coded form (the policy's BlobReencoded with
  // the held record's size).
  void SwitchToContext(NodeId child) {
    uint64_t back = 0;
    auto r = reencoded_.find(child);
    if (r != reencoded_.end()) {
      for (auto it = r->second.begin(); it != r->second.end();) {
        BlobPtr b = edge_lag_->started(child, *it) ? nullptr : state_.Find(*it);
        if (b == nullptr) {
          ++it;
          continue;
        }
        host_->Handle(Now(), event::BlobReencoded{child, b->info});
        it = r->second.erase(it);
        ++back;
      }
    }
    const uint64_t left = edge_lag_->unacked(child);
    state_.Update([&](NodeResult* res) {
      if (NodeResult::EdgeSwitch* sw = OpenSwitch(res, child)) {
        sw->resumed = true;
        sw->resume_bytes = left;
        sw->context_chunks = back;
      }
    });
    std::fprintf(stderr, "sender: edge relay node %d caught up (%llu bytes not acknowledged, at "
                 "most %llu): the chunks it has not started go to it context-coded again\n",
                 child, static_cast<unsigned long long>(left),
                 static_cast<unsigned long long>(edge_lag_->resume_bound()));
  }
  Status SwitchToPlain(NodeId child) {
    NodeResult::EdgeSwitch sw;
    sw.child = child;
    sw.lag_bytes = edge_lag_->unacked(child);
    state_.Update([&](NodeResult* r) { r->edge_switches.push_back(sw); });
    std::fprintf(stderr, "sender: edge relay node %d lags (%llu bytes not acknowledged, bound "
                 "%llu): the chunks it has not started go to it in the plain form\n", child,
                 static_cast<unsigned long long>(sw.lag_bytes),
                 static_cast<unsigned long long>(edge_lag_->bound()));
    for (const BlobPtr& b : state_.All()) {
      if (b->info.kind == BlobKind::kChunk && !edge_lag_->started(child, b->info.id)) {
        DCR_RETURN_IF_ERROR(Reencode(child, b->info.id));
      }
    }
    return Status();
  }
  // Blob `id` to `child` in its plain form (a context-coded chunk; anything else is left).
  Status Reencode(NodeId child, BlobId id) {
    BlobPtr plain;
    auto f = plain_forms_.find(id);
    if (f != plain_forms_.end()) {
      plain = f->second;
    } else {
      DCR_ASSIGN_OR_RETURN(plain, PlainForm(id));
      if (plain == nullptr) return Status();
      plain_forms_[id] = plain;
    }
    reencoded_[child].insert(id);
    state_.Update([&](NodeResult* r) {
      if (NodeResult::EdgeSwitch* sw = OpenSwitch(r, child)) ++sw->plain_chunks;
    });
    host_->Handle(Now(), event::BlobReencoded{child, plain->info});
    return Status();
  }
  // An edge relay's ingress (plan.edge_relays names this rank): its transcoder over the
  // canonical base the node holds (receiver_base_path), fed by the parent's reader threads.
  Status StartEdgeIngress() {
    DCR_ASSIGN_OR_RETURN(std::unique_ptr<internal::EdgeTranscoder> t,
                         internal::EdgeTranscoder::Open(plan_.receiver_base_path,
                                                        plan_.zstd_level));
    internal::EdgeIngress::Callbacks cb;
    cb.replace = [this](const BlobInfo& info, std::vector<uint8_t> bytes) {
      auto b = std::make_shared<BlobBuf>();
      b->info = info;
      b->bytes = std::move(bytes);
      state_.Store(b);
    };
    cb.post = [this](const Event& e) { queue_.Post(e); };
    cb.fatal = [this](Status st) {
      queue_.Fatal(st.WithContext("node " + std::to_string(plan_.rank) + " (edge relay)"));
    };
    ingress_ = std::make_unique<internal::EdgeIngress>(
        std::move(t), plan_.relay.piece_bytes, std::max(1, plan_.relay.max_parallel_applies),
        std::move(cb));
    links_.set_ingress(ingress_.get());
    return Status();
  }
  void DoReload() {
    state_.Update([](NodeResult* r) { ++r->reloads; });
    if (applier_.durable() == nullptr) return;  // the full-stream image starts empty anyway
    Fault(applier_.durable()->ReloadCommitted().WithContext("reloading the committed version"));
  }
  void DoRepair(uint64_t chunk_id) {
    auto it = doubtful_blobs_.find(chunk_id);
    BlobPtr b = it == doubtful_blobs_.end() ? nullptr : state_.Find(it->second);
    if (b == nullptr) {
      return Fault(InternalError("overwrite of chunk " + std::to_string(chunk_id) +
                                 " requested without its refused record"));
    }
    doubtful_blobs_.erase(it);
    applier_.Repair(b);
  }
  // The fault point of plan.fault_kill_blob (first start only).
  void MaybeKillAtBlob(uint64_t blob) {
    if (starts_ == 1 && plan_.fault_kill_blob >= 0 &&
        blob >= static_cast<uint64_t>(plan_.fault_kill_blob)) {
      ::raise(SIGKILL);
    }
  }
  void RecordRecovery() {
    NodeResult* r = state_.result();
    state_.Update([&](NodeResult*) {
      if (recovery_ != nullptr) r->recoveries = recovery_->recoveries();
      if (applier_.durable() != nullptr) {
        const JournaledApplyStats st = applier_.durable()->stats();
        r->overwrite_repairs = st.repaired;
        r->chunks_skipped = st.duplicates_skipped;
        r->storage_reattached = starts_ > 1 && applier_.durable()->storage_reattached();
      }
      if (mirror_ != nullptr) {
        r->mirror_puts = mirror_->puts();
        r->mirror_put_failures = mirror_->failures();
      }
      if (ingress_ != nullptr) {
        const internal::EdgeStats e = ingress_->stats();
        r->edge_chunks = e.chunks;
        r->edge_context_bytes = e.context_bytes;
        r->edge_plain_bytes = e.plain_bytes;
        r->edge_cpu_seconds = e.cpu_seconds;
      }
    });
    state_.UpdateMetrics([&](internal::NodeMetrics* m) {
      m->recoveries = static_cast<uint64_t>(r->recoveries);
      m->chunks_skipped = r->chunks_skipped;
      m->mirror_puts = r->mirror_puts;
    });
  }
  // Whether the loop is over: the stream policy is done (a failed one only once its failure
  // left the node committed), or, recovering, the policy holds the node committed.
  bool Finished() const {
    if (recovery_ == nullptr) return host_->done();
    if (recovery_->mode() == RecoveryPolicy::Mode::kGaveUp) return true;
    if (host_ == nullptr) {
      return plan_.rank != 0 && recovery_->mode() == RecoveryPolicy::Mode::kCommitted;
    }
    if (!host_->done()) return false;
    if (!host_->failed()) return true;
    return plan_.rank != 0 && recovery_->mode() == RecoveryPolicy::Mode::kCommitted;
  }

  // While the node waits for its parent at startup: true once the stream is whole in the store
  // (its trailer listed under the prefix) and the parent has still not connected
  // read_deadline_s later. A healthy parent connects before the stream starts, so the tree went
  // on without this node (its parent counted it lost, or died before connecting), and waiting
  // on to the node's timeout would only hold back the run.
  std::function<bool()> ParentGoneCheck() {
    auto store = std::make_shared<std::unique_ptr<ObjectStore>>();
    auto seen = std::make_shared<double>(-1);
    return [this, store, seen]() {
      // A parent that connected for a later version has moved on: once the stream is whole in
      // the store nothing is left to wait for.
      const bool moved_on =
          internal::HeldHellos::Process().MovedOn(plan_.rank, plan_.run_id, plan_.version);
      if (*seen >= 0) return moved_on || SteadyNow() - *seen >= plan_.read_deadline_s;
      if (*store == nullptr) {
        auto opened = OpenObjectStore(plan_.store);
        if (!opened.ok()) return false;
        *store = std::move(*opened);
      }
      auto listed = (*store)->List(plan_.relay.prefix + "/");
      if (!listed.ok()) return false;
      for (const ObjectInfo& o : *listed) {
        auto b = ParseObjectKey(plan_.relay.prefix, o.key);
        if (b.ok() && b->kind == BlobKind::kTrailer) *seen = SteadyNow();
      }
      return false;
    };
  }

  double Now() const { return SteadyNow() - t0_; }
  // Store key of rank `rank`'s commit report: "<prefix>/reports/<rank>".
  std::string ReportKey(int rank) const {
    return plan_.relay.prefix + "/reports/" + std::to_string(rank);
  }
  // Whether every receiver rank has a committed report in `reports`.
  bool AllReportsOk(const std::vector<CommitReport>& reports) const {
    std::set<int> ok;
    for (const CommitReport& c : reports) {
      if (c.ok) ok.insert(c.rank);
    }
    return static_cast<int>(ok.size()) >= static_cast<int>(plan_.parents.size()) - 1;
  }
  // Sender whose tree is gone, or whose tree lacks a receiver's committed report (a receiver
  // that restarted recovers outside the tree, and its parent reports it failed): waits (polling
  // the store, within the node's deadline) until every receiver rank has a committed report
  // from the tree or any report from the store, which replaces the tree's. A record of another
  // run or version is not taken, nor, when this node has the run's credentials, one that its
  // rank did not sign (a store is no more trusted than a relay).
  Status CollectStoreReports(std::vector<CommitReport>* reports) {
    std::set<int> have;
    for (const CommitReport& c : *reports) {
      if (c.ok) have.insert(c.rank);
    }
    const int n = static_cast<int>(plan_.parents.size());
    while (true) {
      for (int rank = 1; rank < n; ++rank) {
        if (have.count(rank)) continue;
        auto got = store_.GetNow(ReportKey(rank));
        if (!got.ok()) continue;
        size_t consumed = 0;
        auto rec = internal::ParseReportRecord(got->data(), got->size(), &consumed);
        if (!rec.ok() || rec->report.rank != rank || rec->report.run != plan_.run_id ||
            rec->report.version != plan_.version) {
          continue;
        }
        if (const internal::TlsContext* tls = ReportCredentials(); tls != nullptr) {
          const auto body = internal::ReportBody(*rec);
          Status sig = tls->CheckReportSignature(rec->tail.data(), rec->tail.size(), body.first,
                                                 body.second, rank);
          if (!sig.ok()) {
            if (refused_store_reports_.insert(rank).second) {
              std::fprintf(stderr, "node %d: refused the store's commit report of rank %d: %s\n",
                           plan_.rank, rank, sig.message().c_str());
            }
            continue;
          }
        }
        reports->erase(std::remove_if(reports->begin(), reports->end(),
                                      [rank](const CommitReport& c) { return c.rank == rank; }),
                       reports->end());
        reports->push_back(rec->report);
        have.insert(rank);
      }
      if (static_cast<int>(have.size()) >= n - 1) return Status();
      if (SteadyNow() > deadline_) {
        return DeadlineExceededError("sender: commit reports of " +
                                     std::to_string(n - 1 - static_cast<int>(have.size())) +
                                     " receivers never reached the tree or the store");
      }
      usleep(20000);
    }
  }
  // The run credentials that sign this node's commit reports and check the store's: the tree
  // links' (when they opened TLS), else the plan's certificate loaded once (a store downloader,
  // or a node whose tree links did not open); null when the plan names none or they do not load
  // (the reports then go unsigned, and a sender checks none, as on a run without credentials).
  const internal::TlsContext* ReportCredentials() const {
    if (const internal::TlsContext* tls = links_.tls(); tls != nullptr) return tls;
    if (report_tls_ == nullptr && !report_tls_tried_ && !plan_.tls_cert.empty()) {
      report_tls_tried_ = true;
      auto loaded = internal::TlsContext::Load(plan_.tls_ca, plan_.tls_cert, plan_.tls_key);
      if (loaded.ok()) report_tls_ = *loaded;
    }
    return report_tls_.get();
  }
  // This node's commit report: committed with the hash its storage holds, or failed with `s`.
  internal::ReportRecord OwnReport(const Status& s) const {
    CommitReport r;
    r.rank = plan_.rank;
    r.run = plan_.run_id;
    r.version = plan_.version;
    r.ok = s.ok();
    if (s.ok()) {
      r.target_hash = applier_.held().hash;
    } else {
      r.code = s.code();
      r.error = s.ToString();
    }
    internal::ReportRecord record = internal::EncodeReportRecord(r);
    // Signed with this node's key (tls.h SignReport) so that the sender can attribute it: the
    // tree links' credentials, or, for a node without tree links (a store downloader), the
    // plan's certificate loaded for the purpose.
    if (const internal::TlsContext* tls = ReportCredentials(); tls != nullptr) {
      const auto body = internal::ReportBody(record);
      auto tail = tls->SignReport(body.first, body.second);
      if (tail.ok()) internal::SetReportTail(&record, std::move(*tail));
    }
    return record;
  }
  void MarkCommittedInMetrics() {
    const double at = state_.result()->t_commit;
    state_.UpdateMetrics([at](internal::NodeMetrics* m) {
      m->committed = true;
      m->committed_at = at;
    });
  }
  // Freeze reporting from here until the node ends, also while it waits for its parent: each
  // second the dcr_freeze_seconds gauge, and while frozen a line on stderr every freeze_after_s.
  void StartFreezeWatch() {
    const VersionFloor* f = applier_.floor();
    const int rank = plan_.rank;
    freeze_watch_ = std::make_unique<internal::FreezeWatch>(
        plan_.freeze_after_s, f != nullptr ? f->committed_unix() : 0, f != nullptr ? f->version() : 0,
        WallNow(), [this, rank](double frozen_s, const std::string& message) {
          state_.UpdateMetrics([frozen_s](internal::NodeMetrics* m) { m->freeze_seconds = frozen_s; });
          if (!message.empty()) std::fprintf(stderr, "node %d: %s\n", rank, message.c_str());
        });
  }
  // The first driver or policy error ends the loop.
  void Fault(const Status& s) {
    if (!s.ok() && error_.ok()) error_ = s;
  }

  Status Setup() {
    if (plan_.transport != "relay_tree" && plan_.transport != "object_store") {
      return InvalidArgumentError("plan.transport: unknown '" + plan_.transport + "'");
    }
    if (plan_.method != "delta" && plan_.method != "full") {
      return InvalidArgumentError("plan.method: unknown '" + plan_.method + "'");
    }
    DCR_RETURN_IF_ERROR(internal::CheckLiveness(
        internal::LivenessOptions{plan_.heartbeat_interval_s, plan_.read_deadline_s}, "plan"));
    const bool sender = plan_.rank == 0;
    if (!plan_.state_dir.empty()) {
      DCR_ASSIGN_OR_RETURN(starts_, internal::CountNodeStart(plan_.state_dir, plan_.rank));
    }
    state_.result()->starts = starts_;
    const bool recover = !plan_.state_dir.empty() && !plan_.store.empty();
    const bool restarted = recover && starts_ > 1;
    const bool tree = plan_.transport == "relay_tree";
    // A durable receiver opens its own storage (a carried device storage is its candidate).
    const bool durable = plan_.method == "delta" && !plan_.state_dir.empty();
    if (!sender && carry_ != nullptr && *carry_ != nullptr && !durable) {
      DCR_RETURN_IF_ERROR(applier_.Adopt(std::move(*carry_), plan_));
    } else if (!sender) {
      DCR_RETURN_IF_ERROR(applier_.Open(
          plan_, starts_, durable && carry_ != nullptr ? std::move(*carry_) : nullptr));
    }
    if (!sender && plan_.freeze_after_s > 0) StartFreezeWatch();
    if (recover) {
      RecoveryOptions ro;
      ro.prefix = plan_.relay.prefix;
      // The supervisor's restarts before this one were each a recovery of this node.
      recovery_ = std::make_unique<RecoveryPolicy>(
          sender ? RecoveryRole::kSender : RecoveryRole::kReceiver, ro, tree,
          std::max(0, starts_ - 2));
      links_.set_recover(true);
    }
    if (!restarted) {
      DCR_ASSIGN_OR_RETURN(std::unique_ptr<NodePolicy> policy, MakeNodePolicy(plan_));
      host_ = std::make_unique<PolicyHost>(std::move(policy), this);
      const std::string role = NodeRoleName(host_->policy().role());
      state_.UpdateMetrics([&](internal::NodeMetrics* m) { m->role = role; });
    }
    if (tree && static_cast<int>(plan_.addresses.size()) != static_cast<int>(plan_.parents.size())) {
      return InvalidArgumentError("plan.addresses: need one per node");
    }
    const bool edge = std::find(plan_.edge_relays.begin(), plan_.edge_relays.end(),
                                plan_.rank) != plan_.edge_relays.end();
    if (tree && !sender && edge && !restarted) DCR_RETURN_IF_ERROR(StartEdgeIngress());
    if (tree && sender && !restarted && plan_.method == "delta" && plan_.context_coding &&
        !plan_.edge_relays.empty() && plan_.edge_lag_bytes > 0) {
      std::vector<NodeId> edges;
      for (const Link& l : host_->links()) {
        if (l.to_child && std::find(plan_.edge_relays.begin(), plan_.edge_relays.end(),
                                    l.peer) != plan_.edge_relays.end()) {
          edges.push_back(l.peer);
        }
      }
      edge_lag_ = std::make_unique<internal::EdgeLagWatch>(edges, plan_.edge_lag_bytes);
    }
    if (tree && recover && !sender) links_.set_parent_gone(ParentGoneCheck());
    if (recover && !sender) DCR_RETURN_IF_ERROR(OpenSpool(restarted));
    // A restarted node does not rejoin the tree: its peers were told it left when it died.
    if (tree && !restarted) DCR_RETURN_IF_ERROR(links_.Open(host_->links(), deadline_));
    if (tree && restarted) {  // ... but its parent and its children learn so at once
      DCR_ASSIGN_OR_RETURN(std::unique_ptr<NodePolicy> tree_role, MakeNodePolicy(plan_));
      for (const Link& l : tree_role->links()) {
        if (!l.to_child) DCR_RETURN_IF_ERROR(links_.TurnAwayParent(l, deadline_));
      }
      DCR_RETURN_IF_ERROR(links_.LeaveChildren(tree_role->links()));
    }
    store_.set_resume(recover);
    if (!tree || recover) {
      DCR_RETURN_IF_ERROR(store_.Open(sender ? plan_.relay.max_parallel_puts
                                             : plan_.relay.max_parallel_fetches));
    }
    if (tree && plan_.mirror_to_store && !plan_.store.empty() && !restarted) {
      DCR_ASSIGN_OR_RETURN(std::unique_ptr<ObjectStore> mirror_store, OpenObjectStore(plan_.store));
      mirror_ = std::make_unique<internal::StoreMirror>(std::move(mirror_store),
                                                        plan_.relay.prefix);
    }
    if (sender) {
      // A refusal (checkpoints missing, unreadable, or unable to make a delta) reaches every
      // node of the tree, so each one's console names the cause rather than a closed peer.
      Status s = builder_.LoadCheckpoints();
      if (!s.ok()) {
        links_.AbortChildren(s.ToString());
        return s;
      }
    }
    state_.result()->role = host_ != nullptr ? NodeRoleName(host_->policy().role())
                            : sender                ? "sender"
                                                    : "receiver";
    state_.result()->t_start = WallNow();
    if (restarted) {
      recovery::Restarted r;
      if (!sender) {
        r = applier_.durable() != nullptr ? applier_.durable()->restart_event()
                                          : recovery::Restarted{true, false, 0, 0};
      }
      Recover(r);
      DCR_RETURN_IF_ERROR(error_);
    }
    return Status();
  }

  // A receiver with recovery keeps the bytes of the version it receives in its state dir
  // (node/blob_spool.h): a first start begins the spool, a restart reads back what verifies, so
  // its download continues by (blob, offset) from those bytes instead of fetching them again.
  Status OpenSpool(bool restarted) {
    const std::string path =
        plan_.state_dir + "/rank-" + std::to_string(plan_.rank) + ".spool";
    const std::string key = "run " + std::to_string(plan_.run_id) + " version " +
                            std::to_string(plan_.version) + " rank " +
                            std::to_string(plan_.rank) + " method " + plan_.method + " prefix " +
                            plan_.relay.prefix;
    std::vector<internal::BlobSpool::Restored> restored;
    const NodePlan& plan = plan_;
    auto opened = internal::BlobSpool::Open(
        path, key, kResumeHoldBytes, !restarted,
        [&plan](BlobKind k) { return MaxBlobBytes(plan, k); }, &restored);
    if (!opened.ok()) {
      // The transfer does not depend on the spool: without one a restart fetches everything.
      std::fprintf(stderr, "node %d: no blob spool: %s\n", plan_.rank,
                   opened.status().ToString().c_str());
      return Status();
    }
    spool_ = std::move(*opened);
    uint64_t blobs = 0, bytes = 0;
    for (internal::BlobSpool::Restored& r : restored) {
      ++blobs;
      bytes += r.held.Held();
      state_.Restore(std::move(r));
    }
    state_.set_spool(spool_.get());
    state_.Update([&](NodeResult* r) {
      r->restored_blobs = blobs;
      r->restored_bytes = bytes;
      if (blobs > 0) {
        r->recovery_log += "restored " + std::to_string(blobs) + " blobs (" +
                           std::to_string(bytes) + " bytes) from the state dir\n";
      }
    });
    return Status();
  }

  Status Barrier() {
    if (plan_.rank != 0 && !plan_.ready_path.empty()) {
      DCR_RETURN_IF_ERROR(WriteFileAtomic(plan_.ready_path, "ready\n", 6));
    }
    if (plan_.rank == 0 && !plan_.go_path.empty()) {
      while (access(plan_.go_path.c_str(), F_OK) != 0) {
        if (SteadyNow() > deadline_) {
          return DeadlineExceededError("sender: start signal " + plan_.go_path + " never came");
        }
        usleep(5000);
      }
    }
    return Status();
  }

  // Events in, one at a time, until the policy is done; the one timer and the deadline bound
  // every wait.
  Status Loop() {
    if (host_ != nullptr) host_->Handle(Now(), event::Start{});
    DCR_RETURN_IF_ERROR(AfterHandle());
    while (!Finished()) {
      double until = deadline_;
      if (timer_at_ >= 0) until = std::min(until, t0_ + timer_at_);
      if (recovery_timer_at_ >= 0) until = std::min(until, t0_ + recovery_timer_at_);
      if (!plan_.progress_path.empty()) until = std::min(until, next_progress_);
      QItem item;
      const bool got = queue_.Wait(until, &item);
      const auto* produced = got ? std::get_if<event::BlobProduced>(&item.event) : nullptr;
      if (produced != nullptr && produced->blob.kind == BlobKind::kTrailer) {
        stream_complete_ = true;
        NoteTargetHash(produced->blob.id);
      }
      WriteProgressIfDue();
      if (got && !item.fatal && item.gen != queue_.gen()) continue;  // of a stream left behind
      if (!got) {
        const double now = SteadyNow();
        if (now >= deadline_) {
          return DeadlineExceededError("node " + std::to_string(plan_.rank) + " (" +
                                       state_.result()->role + "): not done after " +
                                       std::to_string(plan_.timeout_s) + " s");
        }
        if (recovery_timer_at_ >= 0 && now >= t0_ + recovery_timer_at_) {
          recovery_timer_at_ = -1;
          Recover(recovery::TimerFired{});
          DCR_RETURN_IF_ERROR(AfterHandle());
          continue;
        }
        if (timer_at_ < 0 || now < t0_ + timer_at_) continue;  // woken for the progress file
        timer_at_ = -1;
        item.event = event::TimerFired{};
      }
      if (item.fatal) return item.status;
      if (item.is_recovery) {
        if (const auto* d = std::get_if<recovery::ChunkDoubtful>(&item.recovery)) {
          doubtful_blobs_[d->chunk_id] = item.blob;
        }
        Recover(item.recovery);
      } else if (host_ != nullptr) {
        // A blob that failed to apply is not held any more: a download fetches it whole.
        if (const auto* a = std::get_if<event::ApplyDone>(&item.event); a != nullptr && !a->ok) {
          state_.Erase(a->blob);
        }
        // A sender filling the store was fed every blob built so far.
        if (produced != nullptr && !fed_.insert(produced->blob.id).second) continue;
        if (produced != nullptr && filled_store_) {
          BlobInfo info = produced->blob;
          Status st = PlainForStore(&info);
          if (!st.ok()) return st.WithContext("sender: filling the store");
          item.event = event::BlobProduced{info};
        }
        const bool watch = edge_lag_ != nullptr && !filled_store_;
        if (watch && produced != nullptr && produced->blob.kind == BlobKind::kChunk) {
          for (NodeId c : edge_lag_->lagging_children()) {
            Status st = Reencode(c, produced->blob.id);
            if (!st.ok()) return st.WithContext("sender: the plain form for edge relay " +
                                                std::to_string(c));
          }
        }
        host_->Handle(Now(), item.event);
        if (watch) {
          Status st = WatchEdges(item.event);
          if (!st.ok()) return st.WithContext("sender: the plain form for a lagging edge relay");
        }
      }
      DCR_RETURN_IF_ERROR(AfterHandle());
    }
    return Status();
  }

  // Sender of a delta: the published version's content hash, from its trailer, which the
  // receivers' reports are checked against.
  void NoteTargetHash(BlobId trailer) {
    if (plan_.method != "delta") return;
    BlobPtr b = state_.Find(trailer);
    if (!b) return;
    auto t = ParseTrailer(b->bytes.data(), b->bytes.size());
    if (t.ok()) state_.result()->target_hash = t->target_hash;
  }

  // Rewrites plan.progress_path when a second has passed since the last write. Best effort: a
  // failed write only leaves the previous progress in place.
  void WriteProgressIfDue() {
    if (plan_.progress_path.empty()) return;
    const double now = SteadyNow();
    if (now < next_progress_) return;
    next_progress_ = now + 1.0;
    nlohmann::json j;
    state_.Update([&](NodeResult* r) {
      j["bytes_received"] = r->bytes_received;
      j["bytes_sent"] = r->bytes_sent;
      j["payload_bytes"] = r->payload_bytes;
    });
    j["stream_complete"] = stream_complete_;
    const std::string text = j.dump() + "\n";
    const std::string tmp = plan_.progress_path + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return;
    const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ::close(fd);
    if (!written || ::rename(tmp.c_str(), plan_.progress_path.c_str()) != 0) ::unlink(tmp.c_str());
  }

  void Teardown() {
    if (torn_down_) return;
    torn_down_ = true;
    freeze_watch_.reset();
    if (!plan_.metrics_address.empty()) internal::MetricsBoard::Process().Detach();
    links_.Close();
    builder_.Join();
    if (carry_ != nullptr) {
      *carry_ = applier_.Release();
    } else {
      applier_.Stop();
    }
    store_.Stop();
  }

  std::unique_ptr<Receiver>* carry_;
  const NodePlan& plan_;
  NodeState state_;
  EventQueue queue_;
  TreeLinks links_;
  StoreJobs store_;
  ApplyJobs applier_;
  SenderBuilder builder_;
  std::unique_ptr<PolicyHost> host_;  // null while a recovery waits to start the next stream
  RecoveryEnv recovery_env_;
  std::unique_ptr<RecoveryPolicy> recovery_;  // null: no recovery (no state_dir or store)
  std::vector<recovery::Event> pending_recovery_;
  std::map<uint64_t, BlobId> doubtful_blobs_;  // chunk id -> the blob whose relative form was refused
  std::unique_ptr<internal::StoreMirror> mirror_;
  // Bytes of applied blobs kept for a resumed download (Release), at most kResumeHoldBytes;
  // the spool's file is bounded by the same.
  static constexpr uint64_t kResumeHoldBytes = uint64_t{256} << 20;
  std::unique_ptr<internal::BlobSpool> spool_;  // receiver with recovery: the version's bytes
  uint64_t kept_bytes_ = 0;
  std::set<BlobId> fed_;  // sender: blobs produced that the current policy was given
  int starts_ = 1;
  mutable std::shared_ptr<const internal::TlsContext> report_tls_;  // ReportCredentials
  mutable bool report_tls_tried_ = false;
  std::set<int> refused_store_reports_;  // sender: ranks whose store report it refused (said once)
  bool filled_store_ = false;  // sender: the stream went to the store (tree left, or restarted)
  std::unique_ptr<internal::EdgeTranscoder> store_plain_;  // sender: PlainForm's transcoder
  // Sender with edge relays: their progress (null: no lag bound), the blobs each lagging one is
  // sent in the plain form, and those plain forms.
  std::unique_ptr<internal::EdgeLagWatch> edge_lag_;
  std::map<NodeId, std::set<BlobId>> reencoded_;
  std::map<BlobId, BlobPtr> plain_forms_;
  uint64_t blobs_whole_ = 0;
  double recovery_timer_at_ = -1;
  double t0_ = 0, deadline_ = 0;
  double timer_at_ = -1;  // policy time of the armed timer; -1 = none
  double next_progress_ = 0;  // steady time of the next progress file write
  bool stream_complete_ = false;  // sender: the trailer blob is produced
  bool committed_ = false;
  bool torn_down_ = false;
  Status error_;
  // A receiver's freeze reporting while it waits (freeze_watch.h); Teardown stops it first.
  std::unique_ptr<internal::FreezeWatch> freeze_watch_;
  // Last, so that its threads stop first: they post to queue_ and store into state_.
  std::unique_ptr<internal::EdgeIngress> ingress_;  // edge relay: the parent's stream, transcoded
};

}  // namespace

StatusOr<std::unique_ptr<NodePolicy>> MakeNodePolicy(const NodePlan& plan) {
  if (plan.transport == "object_store") {
    return plan.rank == 0 ? MakeUploaderPolicy(plan.relay) : MakeDownloaderPolicy(plan.relay);
  }
  if (plan.transport != "relay_tree") {
    return InvalidArgumentError("plan.transport: unknown '" + plan.transport + "'");
  }
  DCR_ASSIGN_OR_RETURN(Topology topo, Topology::FromParents(plan.parents));
  if (plan.rank < 0 || plan.rank >= topo.size()) {
    return InvalidArgumentError("plan.rank " + std::to_string(plan.rank) +
                                " outside the topology");
  }
  return MakeTreePolicy(topo, plan.rank, plan.relay);
}

namespace internal {

Status RunNodeVersion(const NodePlan& plan, NodeResult* result,
                      std::unique_ptr<Receiver>* storage) {
  *result = NodeResult();
  Status s;
  {
    SocketNode node(plan, result, storage);
    s = node.Run();
  }
  Status w = WriteResultFile(plan.result_path, *result);
  if (s.ok() && !w.ok()) s = w;
  return s;
}

}  // namespace internal

Status RunNode(const NodePlan& plan, NodeResult* result) {
  // One endpoint for the life of the process, whichever version runs (MetricsBoard).
  internal::MetricsServer metrics;
  if (!plan.metrics_address.empty()) {
    Status m = metrics.Start(plan.metrics_address,
                             [] { return internal::MetricsBoard::Process().Snapshot(); });
    if (!m.ok()) {
      *result = NodeResult();
      result->rank = plan.rank;
      result->error = m.WithContext("node " + std::to_string(plan.rank)).ToString();
      return m.WithContext("node " + std::to_string(plan.rank));
    }
  }
  if (!plan.versions.empty()) return internal::RunNodeVersions(plan, result);
  *result = NodeResult();
  Status s;
  {
    SocketNode node(plan, result);
    s = node.Run();
  }
  Status w = internal::WriteResultFile(plan.result_path, *result);
  if (s.ok() && !w.ok()) s = w;
  return s;
}

int RankFromEnvironment() {
  for (const char* v : {"SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}) {
    const char* s = std::getenv(v);
    if (s != nullptr && *s != '\0') {
      char* end = nullptr;
      long r = std::strtol(s, &end, 10);
      if (*end == '\0' && r >= 0) return static_cast<int>(r);
    }
  }
  return -1;
}

// ---- JSON ----

namespace {

// Hash128::ToHex's inverse: 32 hex digits, hi first.
StatusOr<Hash128> HashFromHex(const std::string& hex) {
  Hash128 h;
  if (hex.size() != 32) return InvalidArgumentError("hash '" + hex + "': expected 32 hex digits");
  if (!Hash128::FromHex(hex, &h)) return InvalidArgumentError("hash '" + hex + "': not hex");
  return h;
}

nlohmann::json CommitReportJson(const CommitReport& c) {
  nlohmann::json j{{"rank", c.rank},
                   {"run", c.run},
                   {"version", c.version},
                   {"target_hash", c.target_hash.ToHex()},
                   {"ok", c.ok}};
  if (!c.ok) {
    j["code"] = std::string(StatusCodeName(c.code));
    j["error"] = c.error;
  }
  return j;
}

StatusOr<CommitReport> CommitReportFromJson(const nlohmann::json& j) {
  CommitReport c;
  c.rank = j.at("rank").get<int>();
  c.run = j.at("run").get<uint64_t>();
  c.version = j.at("version").get<uint64_t>();
  DCR_ASSIGN_OR_RETURN(c.target_hash, HashFromHex(j.at("target_hash").get<std::string>()));
  c.ok = j.at("ok").get<bool>();
  if (!c.ok) {
    c.code = StatusCode::kInternal;
    const std::string name = j.value("code", std::string());
    for (int k = 1; k <= static_cast<int>(StatusCode::kAborted); ++k) {
      if (StatusCodeName(static_cast<StatusCode>(k)) == name) c.code = static_cast<StatusCode>(k);
    }
    c.error = j.value("error", std::string());
  }
  return c;
}

}  // namespace

std::string NodePlanToJson(const NodePlan& p) {
  nlohmann::json j;
  j["rank"] = p.rank;
  j["transport"] = p.transport;
  j["method"] = p.method;
  j["parents"] = p.parents;
  j["addresses"] = p.addresses;
  j["run_id"] = p.run_id;
  j["version"] = p.version;
  if (p.base_version >= 0) j["base_version"] = p.base_version;
  if (!p.versions.empty()) {
    nlohmann::json vs = nlohmann::json::array();
    for (const NodeVersion& v : p.versions) {
      vs.push_back({{"version", v.version},
                    {"target_path", v.target_path},
                    {"verify_path", v.verify_path},
                    {"prefix", v.prefix},
                    {"result_path", v.result_path}});
    }
    j["versions"] = vs;
  }
  if (!p.tls_ca.empty() || !p.tls_cert.empty() || !p.tls_key.empty()) {
    j["tls"] = {{"ca", p.tls_ca}, {"cert", p.tls_cert}, {"key", p.tls_key}};
    if (!p.tls_links) j["tls"]["links"] = false;
  }
  if (!p.signing_key.empty()) j["signing_key"] = p.signing_key;
  if (!p.trust_key.empty()) j["trust_key"] = p.trust_key;
  if (!p.version_floor_path.empty()) j["version_floor_path"] = p.version_floor_path;
  if (p.freeze_after_s > 0) j["freeze_after_s"] = p.freeze_after_s;
  j["relay"] = {{"piece_bytes", p.relay.piece_bytes},
                {"window_bytes", p.relay.window_bytes},
                {"root_streams", p.relay.root_streams},
                {"apply", p.relay.apply},
                {"max_parallel_applies", p.relay.max_parallel_applies},
                {"max_parallel_puts", p.relay.max_parallel_puts},
                {"max_parallel_fetches", p.relay.max_parallel_fetches},
                {"prefix", p.relay.prefix},
                {"poll_interval_s", p.relay.poll_interval_s},
                {"poll_timeout_s", p.relay.poll_timeout_s},
                {"retry_backoff_s", p.relay.retry_backoff_s},
                {"max_retries", p.relay.max_retries}};
  if (!p.metrics_address.empty()) j["metrics_address"] = p.metrics_address;
  j["heartbeat_interval_s"] = p.heartbeat_interval_s;
  j["read_deadline_s"] = p.read_deadline_s;
  j["emulate_wan"] = p.emulate_wan;
  j["long_bandwidth_Bps"] = p.long_bandwidth_Bps;
  j["long_latency_s"] = p.long_latency_s;
  j["store"] = p.store;
  j["base_path"] = p.base_path;
  j["target_path"] = p.target_path;
  if (!p.delta_path.empty()) j["delta_path"] = p.delta_path;
  j["chunk_elems"] = p.chunk_elems;
  j["zstd_level"] = p.zstd_level;
  j["context_coding"] = p.context_coding;
  j["context_classes"] = p.context_classes;
  if (!p.edge_relays.empty()) j["edge_relays"] = p.edge_relays;
  if (p.edge_lag_bytes > 0) j["edge_lag_bytes"] = p.edge_lag_bytes;
  j["build_threads"] = p.build_threads;
  j["full_slice_bytes"] = p.full_slice_bytes;
  j["shuffle_seed"] = p.shuffle_seed;
  j["device"] = p.device;
  j["device_index"] = p.device_index;
  j["receiver_base_path"] = p.receiver_base_path;
  j["verify_path"] = p.verify_path;
  j["timeout_s"] = p.timeout_s;
  j["result_path"] = p.result_path;
  if (!p.progress_path.empty()) j["progress_path"] = p.progress_path;
  j["ready_path"] = p.ready_path;
  j["go_path"] = p.go_path;
  if (!p.state_dir.empty()) j["state_dir"] = p.state_dir;
  if (!p.base_sums.empty()) j["base_sums"] = p.base_sums;
  if (!p.target_sums.empty()) j["target_sums"] = p.target_sums;
  if (p.mirror_to_store) j["mirror_to_store"] = true;
  if (p.retain_versions > 0) j["retain_versions"] = p.retain_versions;
  if (p.retain_budget_bytes > 0) j["retain_budget_bytes"] = p.retain_budget_bytes;
  if (!p.region_receivers.empty()) j["region_receivers"] = p.region_receivers;
  j["receiver_deadline_s"] = p.receiver_deadline_s;
  if (p.region_receiver) {
    j["region_receiver"] = {{"late_join", p.late_join},
                            {"max_replay", p.catch_up_max_replay},
                            {"full_frame_fraction", p.catch_up_full_frame_fraction}};
  }
  if (p.serve_full_frames) j["serve_full_frames"] = true;
  if (p.fault_kill_chunk >= 0 || p.fault_kill_blob >= 0) {
    j["fault"] = {{"kill_chunk", p.fault_kill_chunk},
                  {"kill_inside", p.fault_kill_inside},
                  {"kill_blob", p.fault_kill_blob},
                  {"version", p.fault_version}};
  }
  return j.dump(1);
}

StatusOr<NodePlan> NodePlanFromJson(const std::string& text) {
  NodePlan p;
  try {
    auto j = nlohmann::json::parse(text);
    p.rank = j.at("rank").get<int>();
    p.transport = j.at("transport").get<std::string>();
    p.method = j.at("method").get<std::string>();
    p.parents = j.at("parents").get<std::vector<int>>();
    p.addresses = j.at("addresses").get<std::vector<std::string>>();
    if (j.contains("run_id")) p.run_id = j["run_id"].get<uint64_t>();
    if (j.contains("version")) p.version = j["version"].get<uint64_t>();
    if (j.contains("base_version")) p.base_version = j["base_version"].get<int64_t>();
    if (j.contains("versions")) {
      for (const auto& v : j["versions"]) {
        NodeVersion nv;
        nv.version = v.at("version").get<uint64_t>();
        nv.target_path = v.at("target_path").get<std::string>();
        nv.verify_path = v.value("verify_path", std::string());
        nv.prefix = v.value("prefix", std::string());
        nv.result_path = v.value("result_path", std::string());
        p.versions.push_back(std::move(nv));
      }
    }
    if (j.contains("tls")) {
      const auto& t = j["tls"];
      p.tls_ca = t.at("ca").get<std::string>();
      p.tls_cert = t.at("cert").get<std::string>();
      p.tls_key = t.at("key").get<std::string>();
      if (t.contains("links")) p.tls_links = t["links"].get<bool>();
    }
    if (j.contains("signing_key")) p.signing_key = j["signing_key"].get<std::string>();
    if (j.contains("trust_key")) p.trust_key = j["trust_key"].get<std::string>();
    if (j.contains("version_floor_path")) {
      p.version_floor_path = j["version_floor_path"].get<std::string>();
    }
    if (j.contains("freeze_after_s")) p.freeze_after_s = j["freeze_after_s"].get<double>();
    const auto& r = j.at("relay");
    p.relay.piece_bytes = r.at("piece_bytes").get<uint64_t>();
    p.relay.window_bytes = r.at("window_bytes").get<uint64_t>();
    p.relay.root_streams = r.at("root_streams").get<int>();
    p.relay.apply = r.at("apply").get<bool>();
    p.relay.max_parallel_applies = r.at("max_parallel_applies").get<int>();
    p.relay.max_parallel_puts = r.at("max_parallel_puts").get<int>();
    p.relay.max_parallel_fetches = r.at("max_parallel_fetches").get<int>();
    p.relay.prefix = r.at("prefix").get<std::string>();
    p.relay.poll_interval_s = r.at("poll_interval_s").get<double>();
    p.relay.poll_timeout_s = r.at("poll_timeout_s").get<double>();
    p.relay.retry_backoff_s = r.at("retry_backoff_s").get<double>();
    p.relay.max_retries = r.at("max_retries").get<int>();
    if (j.contains("heartbeat_interval_s")) {
      p.heartbeat_interval_s = j["heartbeat_interval_s"].get<double>();
    }
    if (j.contains("read_deadline_s")) p.read_deadline_s = j["read_deadline_s"].get<double>();
    if (j.contains("metrics_address")) p.metrics_address = j["metrics_address"].get<std::string>();
    p.emulate_wan = j.at("emulate_wan").get<bool>();
    p.long_bandwidth_Bps = j.at("long_bandwidth_Bps").get<double>();
    p.long_latency_s = j.at("long_latency_s").get<double>();
    p.store = j.at("store").get<std::string>();
    p.base_path = j.at("base_path").get<std::string>();
    p.target_path = j.at("target_path").get<std::string>();
    if (j.contains("delta_path")) p.delta_path = j["delta_path"].get<std::string>();
    p.chunk_elems = j.at("chunk_elems").get<uint64_t>();
    p.zstd_level = j.at("zstd_level").get<int>();
    if (j.contains("context_coding")) p.context_coding = j["context_coding"].get<bool>();
    if (j.contains("context_classes")) p.context_classes = j["context_classes"].get<int>();
    if (j.contains("edge_relays")) p.edge_relays = j["edge_relays"].get<std::vector<int>>();
    if (j.contains("edge_lag_bytes")) p.edge_lag_bytes = j["edge_lag_bytes"].get<uint64_t>();
    p.build_threads = j.at("build_threads").get<int>();
    p.full_slice_bytes = j.at("full_slice_bytes").get<uint64_t>();
    if (j.contains("shuffle_seed")) p.shuffle_seed = j["shuffle_seed"].get<uint64_t>();
    if (j.contains("device")) p.device = j["device"].get<std::string>();
    if (j.contains("device_index")) p.device_index = j["device_index"].get<int>();
    p.receiver_base_path = j.at("receiver_base_path").get<std::string>();
    p.verify_path = j.at("verify_path").get<std::string>();
    p.timeout_s = j.at("timeout_s").get<double>();
    p.result_path = j.at("result_path").get<std::string>();
    if (j.contains("ready_path")) p.ready_path = j["ready_path"].get<std::string>();
    if (j.contains("progress_path")) p.progress_path = j["progress_path"].get<std::string>();
    if (j.contains("go_path")) p.go_path = j["go_path"].get<std::string>();
    if (j.contains("state_dir")) p.state_dir = j["state_dir"].get<std::string>();
    if (j.contains("base_sums")) p.base_sums = j["base_sums"].get<std::string>();
    if (j.contains("target_sums")) p.target_sums = j["target_sums"].get<std::string>();
    if (j.contains("mirror_to_store")) p.mirror_to_store = j["mirror_to_store"].get<bool>();
    if (j.contains("retain_versions")) p.retain_versions = j["retain_versions"].get<int>();
    if (j.contains("retain_budget_bytes")) {
      p.retain_budget_bytes = j["retain_budget_bytes"].get<uint64_t>();
    }
    if (j.contains("region_receivers")) {
      p.region_receivers = j["region_receivers"].get<std::vector<int>>();
    }
    if (j.contains("receiver_deadline_s")) {
      p.receiver_deadline_s = j["receiver_deadline_s"].get<double>();
    }
    if (j.contains("region_receiver")) {
      const auto& c = j["region_receiver"];
      p.region_receiver = true;
      p.late_join = c.value("late_join", false);
      p.catch_up_max_replay = c.value("max_replay", 8);
      p.catch_up_full_frame_fraction = c.value("full_frame_fraction", 0.5);
    }
    if (j.contains("serve_full_frames")) p.serve_full_frames = j["serve_full_frames"].get<bool>();
    if (j.contains("fault")) {
      const auto& f = j["fault"];
      p.fault_kill_chunk = f.at("kill_chunk").get<int64_t>();
      p.fault_kill_inside = f.at("kill_inside").get<bool>();
      p.fault_kill_blob = f.at("kill_blob").get<int64_t>();
      p.fault_version = f.value("version", uint64_t{0});
    }
  } catch (const std::exception& e) {
    return InvalidArgumentError(std::string("node plan JSON: ") + e.what());
  }
  if (Status s = CheckContextClasses(p.context_classes); !s.ok()) {
    return InvalidArgumentError("node plan JSON: " + s.message());
  }
  return p;
}

std::string NodeResultToJson(const NodeResult& r) {
  nlohmann::json j;
  j["rank"] = r.rank;
  j["pid"] = r.pid;
  j["role"] = r.role;
  j["ok"] = r.ok;
  j["error"] = r.error;
  j["t_start"] = r.t_start;
  j["t_first_blob"] = r.t_first_blob;
  j["t_last_blob"] = r.t_last_blob;
  j["t_commit"] = r.t_commit;
  j["apply_seconds"] = r.apply_seconds;
  j["bytes_sent"] = r.bytes_sent;
  j["bytes_sent_long"] = r.bytes_sent_long;
  j["bytes_received"] = r.bytes_received;
  j["payload_bytes"] = r.payload_bytes;
  j["dense_bytes"] = r.dense_bytes;
  j["blobs"] = r.blobs;
  j["receivers_committed"] = r.receivers_committed;
  nlohmann::json reports = nlohmann::json::array();
  for (const CommitReport& c : r.reports) reports.push_back(CommitReportJson(c));
  j["reports"] = reports;
  j["target_hash"] = r.target_hash.ToHex();
  if (r.trainer_delta) j["trainer_delta"] = true;
  if (r.delta_base_version >= 0) j["delta_base_version"] = r.delta_base_version;
  if (!r.trainer_delta_skipped.empty()) j["trainer_delta_skipped"] = r.trainer_delta_skipped;
  j["verified"] = r.verified;
  j["verify_message"] = r.verify_message;
  if (!r.freeze.empty()) j["freeze"] = r.freeze;
  if (r.edge_chunks > 0 || r.edge_cpu_seconds > 0) {
    j["edge"] = {{"chunks", r.edge_chunks},
                 {"context_bytes", r.edge_context_bytes},
                 {"plain_bytes", r.edge_plain_bytes},
                 {"cpu_seconds", r.edge_cpu_seconds}};
  }
  if (!r.edge_switches.empty()) {
    nlohmann::json sw = nlohmann::json::array();
    for (const NodeResult::EdgeSwitch& e : r.edge_switches) {
      nlohmann::json one = {{"child", e.child}, {"lag_bytes", e.lag_bytes},
                            {"plain_chunks", e.plain_chunks}};
      if (e.resumed) {
        one["resume_bytes"] = e.resume_bytes;
        one["context_chunks"] = e.context_chunks;
      }
      sw.push_back(one);
    }
    j["edge_switches"] = sw;
  }
  j["recovery"] = {{"starts", r.starts},
                   {"recoveries", r.recoveries},
                   {"fallbacks", r.fallbacks},
                   {"reloads", r.reloads},
                   {"overwrite_repairs", r.overwrite_repairs},
                   {"chunks_skipped", r.chunks_skipped},
                   {"mirror_puts", r.mirror_puts},
                   {"mirror_put_failures", r.mirror_put_failures},
                   {"store_failures", r.store_failures},
                   {"store_refused", r.store_refused},
                   {"resumed_blobs", r.resumed_blobs},
                   {"resumed_bytes", r.resumed_bytes},
                   {"restored_blobs", r.restored_blobs},
                   {"restored_bytes", r.restored_bytes},
                   {"fetched_bytes", r.fetched_bytes},
                   {"fill_bytes", r.fill_bytes},
                   {"storage_reattached", r.storage_reattached},
                   {"log", r.recovery_log}};
  if (r.retention_runs > 0) {
    j["retention"] = {{"runs", r.retention_runs},
                      {"removed_objects", r.retention_removed_objects},
                      {"removed_bytes", r.retention_removed_bytes},
                      {"store_bytes", r.retention_store_bytes},
                      {"kept", r.retention_kept},
                      {"error", r.retention_error}};
  }
  if (!r.catch_up.empty()) j["catch_up"] = r.catch_up;
  if (!r.declared_dead.empty()) j["declared_dead"] = r.declared_dead;
  if (!r.readmitted.empty()) j["readmitted"] = r.readmitted;
  if (r.full_frames_served > 0) j["full_frames_served"] = r.full_frames_served;
  return j.dump(1);
}

StatusOr<NodeResult> NodeResultFromJson(const std::string& text) {
  NodeResult r;
  try {
    auto j = nlohmann::json::parse(text);
    r.rank = j.at("rank").get<int>();
    r.role = j.at("role").get<std::string>();
    r.pid = j.value("pid", int64_t{0});
    r.ok = j.at("ok").get<bool>();
    r.error = j.at("error").get<std::string>();
    r.t_start = j.at("t_start").get<double>();
    r.t_first_blob = j.at("t_first_blob").get<double>();
    r.t_last_blob = j.at("t_last_blob").get<double>();
    r.t_commit = j.at("t_commit").get<double>();
    r.apply_seconds = j.at("apply_seconds").get<double>();
    r.bytes_sent = j.at("bytes_sent").get<uint64_t>();
    r.bytes_sent_long = j.at("bytes_sent_long").get<uint64_t>();
    r.bytes_received = j.at("bytes_received").get<uint64_t>();
    r.payload_bytes = j.at("payload_bytes").get<uint64_t>();
    r.dense_bytes = j.at("dense_bytes").get<uint64_t>();
    r.blobs = j.at("blobs").get<uint64_t>();
    r.receivers_committed = j.at("receivers_committed").get<int>();
    if (j.contains("reports")) {
      for (const auto& c : j["reports"]) {
        DCR_ASSIGN_OR_RETURN(CommitReport rep, CommitReportFromJson(c));
        r.reports.push_back(std::move(rep));
      }
    }
    if (j.contains("target_hash")) {
      DCR_ASSIGN_OR_RETURN(r.target_hash, HashFromHex(j["target_hash"].get<std::string>()));
    }
    r.trainer_delta = j.value("trainer_delta", false);
    r.delta_base_version = j.value("delta_base_version", int64_t{-1});
    r.trainer_delta_skipped = j.value("trainer_delta_skipped", std::string());
    r.verified = j.at("verified").get<bool>();
    r.verify_message = j.at("verify_message").get<std::string>();
    if (j.contains("freeze")) r.freeze = j["freeze"].get<std::string>();
    if (j.contains("edge")) {
      const auto& e = j["edge"];
      r.edge_chunks = e.value("chunks", uint64_t{0});
      r.edge_context_bytes = e.value("context_bytes", uint64_t{0});
      r.edge_plain_bytes = e.value("plain_bytes", uint64_t{0});
      r.edge_cpu_seconds = e.value("cpu_seconds", 0.0);
    }
    if (j.contains("edge_switches")) {
      for (const auto& e : j["edge_switches"]) {
        NodeResult::EdgeSwitch sw;
        sw.child = e.value("child", 0);
        sw.lag_bytes = e.value("lag_bytes", uint64_t{0});
        sw.plain_chunks = e.value("plain_chunks", uint64_t{0});
        sw.resumed = e.contains("resume_bytes");
        sw.resume_bytes = e.value("resume_bytes", uint64_t{0});
        sw.context_chunks = e.value("context_chunks", uint64_t{0});
        r.edge_switches.push_back(sw);
      }
    }
    if (j.contains("recovery")) {
      const auto& v = j["recovery"];
      r.starts = v.value("starts", 1);
      r.recoveries = v.value("recoveries", 0);
      r.fallbacks = v.value("fallbacks", uint64_t{0});
      r.reloads = v.value("reloads", uint64_t{0});
      r.overwrite_repairs = v.value("overwrite_repairs", uint64_t{0});
      r.chunks_skipped = v.value("chunks_skipped", uint64_t{0});
      r.mirror_puts = v.value("mirror_puts", uint64_t{0});
      r.mirror_put_failures = v.value("mirror_put_failures", uint64_t{0});
      r.store_failures = v.value("store_failures", uint64_t{0});
      r.store_refused = v.value("store_refused", uint64_t{0});
      r.resumed_blobs = v.value("resumed_blobs", uint64_t{0});
      r.resumed_bytes = v.value("resumed_bytes", uint64_t{0});
      r.restored_blobs = v.value("restored_blobs", uint64_t{0});
      r.restored_bytes = v.value("restored_bytes", uint64_t{0});
      r.fetched_bytes = v.value("fetched_bytes", uint64_t{0});
      r.fill_bytes = v.value("fill_bytes", uint64_t{0});
      r.storage_reattached = v.value("storage_reattached", false);
      r.recovery_log = v.value("log", std::string());
    }
    if (j.contains("retention")) {
      const auto& v = j["retention"];
      r.retention_runs = v.value("runs", 0);
      r.retention_removed_objects = v.value("removed_objects", uint64_t{0});
      r.retention_removed_bytes = v.value("removed_bytes", uint64_t{0});
      r.retention_store_bytes = v.value("store_bytes", uint64_t{0});
      r.retention_kept = v.value("kept", std::string());
      r.retention_error = v.value("error", std::string());
    }
    r.catch_up = j.value("catch_up", std::string());
    if (j.contains("declared_dead")) {
      r.declared_dead = j["declared_dead"].get<std::vector<std::string>>();
    }
    if (j.contains("readmitted")) r.readmitted = j["readmitted"].get<std::vector<int>>();
    r.full_frames_served = j.value("full_frames_served", 0);
  } catch (const std::exception& e) {
    return InvalidArgumentError(std::string("node result JSON: ") + e.what());
  }
  return r;
}

}  // namespace dcr
