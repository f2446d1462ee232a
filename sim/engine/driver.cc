#include "driver.h"

#include <sys/wait.h>
#include <unistd.h>
#include <xbt/log.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <simgrid/s4u.hpp>
#include <string>
#include <variant>

#include "dcr/delta.h"
#include "dcr/policy_host.h"
#include "dcr/status_macros.h"

namespace sg4 = simgrid::s4u;

namespace dcr::sim::internal {

double StreamRateCap(double tcp_gamma, double real_window, double rtt, int pieces_in_flight) {
  double w =
      real_window > 0 ? std::min(real_window, tcp_gamma > 0 ? tcp_gamma : real_window) : tcp_gamma;
  if (!(w > 0) || !(rtt > 0)) return 0;  // no cap
  return w / rtt / std::max(1, pieces_in_flight);
}

namespace {

constexpr uint64_t kControlBytes = 64;
constexpr uint64_t kListReplyBytes = 256;

struct Msg {
  // kProduced: an edge relay tells the root of its subtree that a blob's plain form is ready.
  enum Type { kData, kAck, kCommit, kProduced } type = kData;
  NodeId from = kNoNode;
  BlobInfo blob;
  uint64_t offset = 0, length = 0;
  int receivers = 0;
  // TLS: the receiving end's decryption of this piece, started with the transfer (kData).
  sg4::ExecPtr decrypt;
  bool plain = false;  // kData: a piece of the blob's plain form (action::Send::plain)
};

struct World {
  const RunSpec* spec = nullptr;
  Platform platform;
  std::vector<sg4::Host*> node_host;   // per node
  std::vector<int> node_region;        // per node
  std::vector<sg4::Mailbox*> mailbox;  // per node
  std::vector<BlobInfo> store_index;   // blobs whose Put completed, in completion order
  RunOutcome out;
};

World* g_world = nullptr;

double OneWayNetLatency(const PlatformSpec& p, int region_a, int region_b) {
  double lat = p.regions[region_a].nic_latency + p.regions[region_b].nic_latency;
  if (region_a != region_b) lat += p.wan_latency;
  return lat;
}

enum class TagKind {
  kRecv,
  kSend,
  kControl,
  kBuild,
  kApply,
  kPut,
  kFetch,
  kList,
  kTimer,
  kFetchReq,
  kStreamFree,
  kEncrypt,
  kDecrypt,
  kCommitment,
  kLeafHash,
  kSenderCommitment,
  kVerify,
  kTranscode
};

struct Tag {
  TagKind kind = TagKind::kRecv;
  action::Send send;  // kSend, kEncrypt
  BlobInfo blob;      // kBuild (id), kApply, kPut, kFetch, kCommitment (the trailer), kTranscode
  Msg data;           // kDecrypt: the piece being decrypted
};

// What one actor is: its place in the world (actor index; the mailbox, host and region tables)
// and in the tree its policy runs over (policy id; actor index = offset + policy id).
struct ActorRole {
  int actor = 0;
  NodeId policy_id = 0;
  int offset = 0;
  bool receiver = false;  // one of the measured receivers (outcome index actor - 1)
  bool producer = false;  // builds the blobs (the sender or uploader)
  bool fed = false;       // its blobs are produced by an edge relay's transcoding (kProduced)
  int notify = -1;        // edge relay: the actor to tell when a blob's plain form is ready
  const std::vector<SimBlob>* blobs = nullptr;
  std::function<std::unique_ptr<NodePolicy>()> policy;
};

class NodeActor : public NodeEnvironment {
 public:
  NodeActor(World* w, ActorRole role)
      : w_(w), id_(role.actor), pid_(role.policy_id), role_(std::move(role)) {}

  void operator()() {
    try {
      Run();
    } catch (const std::exception& e) {
      Record("node " + std::to_string(id_) + ": " + e.what());
    }
  }

 private:
  const RunSpec& spec() const { return *w_->spec; }
  const std::vector<SimBlob>& blobs() const { return *role_.blobs; }
  int ActorOf(NodeId policy_node) const { return role_.offset + policy_node; }
  static double Now() { return sg4::Engine::get_clock(); }

  void Record(const std::string& error) {
    if (w_->out.error.empty()) w_->out.error = error;
    if (role_.receiver) w_->out.receivers[id_ - 1].error = error;
  }

  void Add(const sg4::ActivityPtr& a, Tag tag) {
    acts_.push_back(a);
    tags_.push_back(std::move(tag));
  }

  void Feed(const Event& e) { policy_->Handle(Now(), e); }

  // The rate of one TCP stream between two regions: its window per round trip (0 = no cap).
  double StreamCap(int region_a, int region_b) const {
    double rtt = 2 * OneWayNetLatency(spec().platform, region_a, region_b);
    return StreamRateCap(spec().tcp_gamma, spec().real_window, rtt, 1);
  }

  // The modelled transport of one stream: the policy hands it one piece at a time, the piece's
  // Comm starts at once, and the stream accepts it (SendDone) when its bytes are out at the
  // stream's rate (its length over window / RTT) and fewer than pieces_in_flight pieces are on the
  // wire (the TCP window). The path latency is thus paid once per window, not per piece, as by a
  // socket.
  struct Stream {
    bool unaccepted = false;  // the last piece handed over is not accepted yet
    bool encrypting = false;  // TLS: the sending end's CPU is still encrypting that piece
    action::Send piece;
    double free_at = 0;  // when that piece's bytes are out at the stream's rate
    int on_wire = 0;     // Comms started and not completed
    bool timer_armed = false;
  };
  void TryAccept(NodeId to, int stream) {
    Stream& st = streams_[{to, stream}];
    if (!st.unaccepted || st.encrypting || st.on_wire >= spec().pieces_in_flight) return;
    if (Now() + 1e-9 < st.free_at) {
      if (!st.timer_armed) {
        st.timer_armed = true;
        sg4::ExecPtr e =
            sg4::this_actor::exec_init(std::max((st.free_at - Now()) * kClockFlops, 1e-12));
        e->set_host(w_->platform.clock);
        e->start();
        Tag t;
        t.kind = TagKind::kStreamFree;
        t.send.to = to;
        t.send.stream = stream;
        Add(e, std::move(t));
      }
      return;
    }
    st.unaccepted = false;
    const action::Send& s = st.piece;
    policy_->Post(Now(), event::SendDone{s.to, s.stream, s.blob.id, s.offset, s.length});
  }

  // A compute job on this node's host, or on the shared CPU of a one-machine run.
  sg4::ExecPtr Compute(double flops) {
    sg4::ExecPtr e = sg4::this_actor::exec_init(flops);
    if (w_->platform.shared_cpu != nullptr) e->set_host(w_->platform.shared_cpu);
    e->start();
    return e;
  }

  // A job of `flops` in all split over up to `threads` cores of this node's host (or of the
  // shared CPU of a one-machine run), at most the host's cores: one single-core exec per part,
  // each tagged `tag`. Returns the number of parts.
  int ComputeParallel(double flops, int threads, const Tag& tag) {
    sg4::Host* h = w_->platform.shared_cpu != nullptr ? w_->platform.shared_cpu : host_;
    const int parts = std::clamp(threads, 1, h->get_core_count());
    for (int i = 0; i < parts; ++i) Add(Compute(std::max(flops / parts, 1.0)), tag);
    return parts;
  }

  // Timers are activities (exec jobs on the clock host), so the event loop is one wait_any with
  // no timeout. (A wait_any_for timeout leaves its registrations behind in SimGrid 3.32: every
  // later completion then walks them, which made polling object-store runs quadratic.)
  void ArmTimer(double at) {
    DisarmTimer();
    timer_ = at;
    double d = std::max(at - Now(), 0.0) * kClockFlops;
    sg4::ExecPtr e = sg4::this_actor::exec_init(std::max(d, 1e-12));
    e->set_host(w_->platform.clock);
    e->start();
    Add(e, Tag{TagKind::kTimer, {}, {}});
  }
  void DisarmTimer() {
    timer_ = -1;
    for (size_t i = 0; i < acts_.size(); ++i) {
      if (tags_[i].kind == TagKind::kTimer) {
        acts_[i]->cancel();
        acts_.erase(acts_.begin() + static_cast<long>(i));
        tags_.erase(tags_.begin() + static_cast<long>(i));
        return;
      }
    }
  }

  // Small store messages (a GET request, a LIST reply) only pay the path: latency (the store's
  // first-byte latency included) plus their few bytes at the path's bandwidth. They are timed
  // on the clock host instead of being network flows (their bandwidth share is negligible and
  // tens of thousands of polls would dominate the solver's work).
  double StoreMessageSeconds(uint64_t bytes) const {
    const PlatformSpec& p = spec().platform;
    const int region = w_->node_region[id_];
    double lat = p.regions[region].nic_latency + p.store_latency;
    double bw = std::min(p.regions[region].nic_bandwidth, p.store_bandwidth);
    if (region != p.store_region) {
      lat += p.wan_latency;
      bw = std::min(bw, p.wan_bandwidth);
    }
    return lat + static_cast<double>(bytes) / bw;
  }
  sg4::ExecPtr Delay(double seconds) {
    sg4::ExecPtr e = sg4::this_actor::exec_init(std::max(seconds * kClockFlops, 1e-12));
    e->set_host(w_->platform.clock);
    e->start();
    ++w_->out.comms;
    return e;
  }

  // A started host-to-host Comm (no receiving actor) of `bytes`, capped at `rate` when > 0.
  sg4::CommPtr HostComm(sg4::Host* from, sg4::Host* to, uint64_t bytes, double rate) {
    sg4::CommPtr c = sg4::Comm::sendto_init();
    if (rate > 0) c->set_rate(rate);
    c->set_payload_size(bytes);
    c->set_source(from);
    c->set_destination(to);  // with both hosts set, the Comm starts (SimGrid 3.32)
    ++w_->out.comms;
    return c;
  }

  void StartFetchReply(const BlobInfo& blob) {
    const int region = w_->node_region[id_];
    sg4::CommPtr c = HostComm(w_->platform.store, host_, blob.size, StoreCap(region));
    if (region != spec().platform.store_region)
      w_->out.wire_bytes += static_cast<double>(blob.size);
    Tag t;
    t.kind = TagKind::kFetch;
    t.blob = blob;
    Add(c, std::move(t));
  }

  void CountWire(int region_a, int region_b, double bytes) {
    if (region_a != region_b) w_->out.wire_bytes += bytes;
  }

  void SendMsg(NodeId to, Msg* m, uint64_t bytes, Tag tag) {
    sg4::CommPtr c = w_->mailbox[ActorOf(to)]->put_init(m, bytes);
    int ra = w_->node_region[id_], rb = w_->node_region[ActorOf(to)];
    if (m->type == Msg::kData) {
      double cap = StreamCap(ra, rb);
      if (cap > 0) c->set_rate(cap);
      CountWire(ra, rb, static_cast<double>(bytes));
    }
    c->start();
    ++w_->out.comms;
    Add(c, std::move(tag));
  }

  double StoreCap(int region) const {
    // The store's first-byte latency is server time, not path RTT: cap on the network path.
    double rtt = 2 * (spec().platform.regions[region].nic_latency +
                      (region != spec().platform.store_region ? spec().platform.wan_latency : 0.0));
    return StreamRateCap(spec().tcp_gamma, spec().real_window, rtt, 1);
  }

  // ---- NodeEnvironment ----

  void SetTimer(TimePoint at) override { ArmTimer(at); }

  void Send(const action::Send& s) override {
    Stream& st = streams_[{s.to, s.stream}];
    if (st.unaccepted) {
      Record("node " + std::to_string(id_) + ": a second piece on stream " +
             std::to_string(s.stream) + " to node " + std::to_string(s.to) +
             " before the first was accepted");
      return;
    }
    auto* m = new Msg{Msg::kData, pid_, s.blob, s.offset, s.length, 0, nullptr, s.plain};
    if (s.plain && s.offset == 0) ++w_->out.edge_plain_chunks;
    const int to = ActorOf(s.to);
    const bool to_receiver = to >= 1 && to <= spec().receivers;
    const double hash = to_receiver ? spec().recv_hash_s_per_byte : 0;
    if (spec().tls_recv_s_per_byte > 0 || hash > 0) {
      // TLS: the receiving end decrypts the piece's records (and hashes them, `hash`) as they
      // arrive (on one of its cores, from the start of the transfer); the piece is usable when
      // both are done.
      const double tls = static_cast<double>(s.length) * spec().tls_recv_s_per_byte;
      const double cpu = tls + static_cast<double>(s.length) * hash;
      w_->out.tls_cpu_seconds += tls;
      m->decrypt = sg4::this_actor::exec_init(cpu * kHostFlops);
      m->decrypt->set_host(w_->platform.shared_cpu != nullptr ? w_->platform.shared_cpu
                                                              : w_->node_host[ActorOf(s.to)]);
      m->decrypt->start();
    }
    Tag t;
    t.kind = TagKind::kSend;
    t.send = s;
    SendMsg(s.to, m, s.length, std::move(t));
    const double cap = StreamCap(w_->node_region[id_], w_->node_region[ActorOf(s.to)]);
    ++st.on_wire;
    st.unaccepted = true;
    st.piece = s;
    st.free_at = cap > 0 ? Now() + static_cast<double>(s.length) / cap : Now();
    // TLS: the stream's writer encrypts the piece on one core while its bytes go out; the stream
    // accepts the next piece when both are done.
    if (spec().tls_send_s_per_byte > 0) {
      const double cpu = static_cast<double>(s.length) * spec().tls_send_s_per_byte;
      w_->out.tls_cpu_seconds += cpu;
      st.encrypting = true;
      Tag et;
      et.kind = TagKind::kEncrypt;
      et.send = s;
      Add(Compute(cpu * kHostFlops), std::move(et));
    }
    TryAccept(s.to, s.stream);
  }

  void Ack(const action::Ack& ack) override {
    // An edge relay acknowledges a context-coded blob once it has transcoded it (its apply).
    if (role_.notify >= 0 && plain_in_.count(ack.blob) == 0 && applied_.at(ack.blob) == 0) {
      held_acks_[ack.blob] = ack.to;
      return;
    }
    SendAck(ack.to, ack.blob);
  }
  void SendAck(NodeId to, BlobId blob) {
    action::Ack ack{to, blob};
    BlobInfo b;
    b.id = ack.blob;
    auto* m = new Msg{Msg::kAck, pid_, b, 0, 0, 0, nullptr};
    SendMsg(ack.to, m, kControlBytes, Tag{TagKind::kControl, {}, {}});
  }

  void ReportCommit(const action::ReportCommit& rc) override {
    auto* m = new Msg{Msg::kCommit, pid_, {}, 0, 0, rc.receivers, nullptr};
    SendMsg(rc.to, m, kControlBytes, Tag{TagKind::kControl, {}, {}});
  }

  void Apply(const action::Apply& ap) override {
    if (role_.notify >= 0 && plain_in_.count(ap.blob.id) != 0) {
      // A plain blob from the sender: the edge relay forwards it as it is.
      Tag t;
      t.kind = TagKind::kApply;
      t.blob = ap.blob;
      Add(Compute(1.0), std::move(t));
      return;
    }
    if (role_.notify >= 0 && !spec().edge_range_of.empty()) {
      const SimBlob& sb = blobs().at(ap.blob.id);
      // An edge relay of a split: the transcoding runs on the host of the blob's chunk range.
      sg4::ExecPtr e = sg4::this_actor::exec_init(std::max(sb.apply_flops, 1.0));
      e->set_host(w_->platform.edges.at(static_cast<size_t>(spec().edge_range_of.at(ap.blob.id))));
      e->start();
      Tag t;
      t.kind = TagKind::kApply;
      t.blob = ap.blob;
      Add(e, std::move(t));
      return;
    }
    if (role_.receiver && ap.blob.kind == BlobKind::kTrailer && leaf_hashes_ > 0) {
      // The commit waits for the leaves its chunks completed (the hashing pool's queue).
      trailer_waiting_ = true;
      trailer_ = ap.blob;
      return;
    }
    CommitOrApply(ap.blob);
  }

  // A receiver's trailer: the commitment's remaining leaves, then the commit; any other blob:
  // its apply.
  void CommitOrApply(const BlobInfo& blob) {
    if (role_.receiver && blob.kind == BlobKind::kTrailer && spec().commitment_cpu_s > 0) {
      // A signed delta's commit first hashes the leaves no chunk completed.
      Tag t;
      t.kind = TagKind::kCommitment;
      t.blob = blob;
      commitment_parts_ =
          ComputeParallel(spec().commitment_cpu_s * kHostFlops, spec().commitment_threads, t);
      return;
    }
    StartApply(blob);
  }

  // The apply job of blob `blob` (for a receiver's trailer: after its commitment).
  void StartApply(const BlobInfo& blob) {
    const SimBlob& sb = blobs().at(blob.id);
    // A durable receiver's trailer apply is its commit: its version log's fsyncs and the journal's
    // record, a wait on the disk (timed on the clock host, no core taken) after every chunk.
    sg4::ExecPtr e = role_.receiver && blob.kind == BlobKind::kTrailer && spec().commit_seconds > 0
                         ? Delay(spec().commit_seconds + sb.apply_flops / kHostFlops)
                         : Compute(std::max(sb.apply_flops, 1.0));
    Tag t;
    t.kind = TagKind::kApply;
    t.blob = blob;
    Add(e, std::move(t));
  }

  // The simulator holds no bytes.
  void Release(BlobId) override {}

  void Put(const action::Put& put) override {
    Tag t;
    t.kind = TagKind::kPut;
    t.blob = put.blob;
    w_->out.store_put_bytes += static_cast<double>(put.blob.size);
    // Host to host (no store actor): the upload completes when its bytes are in the store.
    int my_region = w_->node_region[id_];
    sg4::CommPtr c = HostComm(host_, w_->platform.store, put.blob.size, StoreCap(my_region));
    CountWire(my_region, spec().platform.store_region, static_cast<double>(put.blob.size));
    Add(c, std::move(t));
  }

  void List(const action::List&) override {
    CountWire(spec().platform.store_region, w_->node_region[id_],
              static_cast<double>(kListReplyBytes));
    Add(Delay(StoreMessageSeconds(kListReplyBytes)), Tag{TagKind::kList, {}, {}});
  }

  void Fetch(const action::Fetch& f) override {
    // A GET: the request pays the path and the store's first-byte latency; when it arrives the
    // store streams the object back (StartFetchReply), capped like one TCP stream.
    w_->out.store_get_bytes += static_cast<double>(f.blob.size);
    sg4::ExecPtr c = Delay(StoreMessageSeconds(kControlBytes));
    Tag t;
    t.kind = TagKind::kFetchReq;
    t.blob = f.blob;
    Add(c, std::move(t));
  }

  void Committed() override {
    if (!role_.receiver) return;
    NodeOutcome& n = w_->out.receivers[id_ - 1];
    n.committed = true;
    n.commit_at = Now();
    n.complete = std::all_of(applied_.begin(), applied_.end(), [](int c) { return c == 1; });
    // As the real runner: the refit ends when the last receiver commits (not when the sender
    // hears of it, a long-link latency later).
    w_->out.end = std::max(w_->out.end, Now());
    if (spec().verify_cpu_s > 0) {
      Add(Compute(spec().verify_cpu_s * kHostFlops), Tag{TagKind::kVerify, {}, {}});
    }
  }

  void TreeCommitted(int) override { w_->out.tree_committed = Now(); }
  void Published() override {}
  // The sender transcodes the chunk itself (ContextChunkToPlain against its base, on its event
  // loop's thread: one at a time): the edge relay's cost of the blob on one core of this host;
  // then it answers with the plain form's size.
  void Transcode(const action::Transcode& t) override {
    transcodes_.push_back(t);
    if (transcodes_.size() == 1) StartTranscode();
  }
  void StartTranscode() {
    const action::Transcode& t = transcodes_.front();
    Tag tag;
    tag.kind = TagKind::kTranscode;
    tag.blob = t.blob;
    tag.send.to = t.to;
    Add(Compute(std::max(blobs().at(t.blob.id).apply_flops, 1.0)), std::move(tag));
  }
  void EdgeLag(const action::EdgeLag& lag) override {
    if (lag.lagging) ++w_->out.edge_switches;
  }
  void Failed(const Status& status) override {
    Record("node " + std::to_string(id_) + " failed: " + status.message());
  }

  bool Producer() const { return role_.producer; }

  // The order in which the builder produces the blobs (header, windows of chunks, trailer), as
  // BuildDelta does (dcr/delta.h ProductionOrder).
  ProductionOrder Order() const {
    return ProductionOrder(blobs().size() - 2, static_cast<uint64_t>(spec().build_window));
  }
  // First and last blob index of the production group holding blob i.
  size_t WindowFirst(size_t i) const { return Order().GroupFirst(i); }
  size_t WindowLast(size_t i) const { return Order().GroupLast(i); }

  void LaunchBuilds() {
    if (!sender_ready_) return;
    const auto& blobs = this->blobs();
    for (bool progress = true; progress;) {
      progress = false;
      while (next_launch_ < blobs.size() && running_builds_ < spec().build_parallel &&
             next_deliver_ >= WindowFirst(next_launch_)) {
        const SimBlob& b = blobs[next_launch_];
        if (b.build_flops <= 0) {
          built_[next_launch_] = true;
        } else {
          sg4::ExecPtr e = Compute(b.build_flops);
          Tag t;
          t.kind = TagKind::kBuild;
          t.blob = b.info;
          Add(e, std::move(t));
          ++running_builds_;
        }
        ++next_launch_;
      }
      while (next_deliver_ < blobs.size()) {
        const size_t last = WindowLast(next_deliver_);
        bool ready = true;
        for (size_t j = next_deliver_; j <= last && ready; ++j) ready = built_[j];
        if (!ready) break;
        for (; next_deliver_ <= last; ++next_deliver_) {
          const SimBlob& b = blobs[next_deliver_];
          // As the real sender: the refit clock starts when the first blob (the header) is
          // out, so it includes building the first chunks.
          if (w_->out.first_built < 0) w_->out.first_built = Now();
          if (b.info.kind == BlobKind::kChunk) w_->out.last_built = Now();
          Feed(event::BlobProduced{b.info});
        }
        progress = true;
      }
    }
  }

  // The root of an edge relay's subtree: blob `id`'s plain form is ready; blobs are handed to the
  // policy in id order, as a builder produces them.
  void OnProduced(BlobId id) {
    const auto& bl = blobs();
    if (id >= bl.size()) return;
    built_[id] = true;
    while (next_deliver_ < bl.size() && built_[next_deliver_]) {
      Feed(event::BlobProduced{bl[next_deliver_].info});
      ++next_deliver_;
    }
  }

  void Run() {
    host_ = sg4::this_actor::get_host();
    const size_t n = blobs().size();
    applied_.assign(n, 0);
    policy_ = std::make_unique<PolicyHost>(role_.policy(), this);
    Msg* incoming = nullptr;
    bool receives = !spec().object_store || pid_ > 0;
    if (receives) Add(w_->mailbox[id_]->get_async<Msg>(&incoming), Tag{TagKind::kRecv, {}, {}});
    Feed(event::Start{});
    if (Producer()) {
      built_.assign(n, false);
      if (spec().sender_commitment_cpu_s > 0) {
        // A signed delta: the sender computes the target's commitment before the first blob.
        sender_ready_ = false;
        commitment_parts_ = ComputeParallel(spec().sender_commitment_cpu_s * kHostFlops,
                                            spec().sender_commitment_threads,
                                            Tag{TagKind::kSenderCommitment, {}, {}});
      }
      LaunchBuilds();
    }
    if (role_.fed) built_.assign(n, false);
    while (!policy_->done()) {
      if (acts_.empty()) {
        Record("node " + std::to_string(id_) + " is stuck: nothing to wait for");
        break;
      }
      ssize_t k = sg4::Activity::wait_any(acts_);
      if (k < 0) {
        Record("node " + std::to_string(id_) + ": wait_any failed");
        break;
      }
      Tag tag = std::move(tags_[k]);
      acts_.erase(acts_.begin() + k);
      tags_.erase(tags_.begin() + k);
      switch (tag.kind) {
        case TagKind::kRecv: {
          Msg* m = incoming;
          incoming = nullptr;
          Add(w_->mailbox[id_]->get_async<Msg>(&incoming), Tag{TagKind::kRecv, {}, {}});
          if (m->type == Msg::kData && m->decrypt != nullptr && !m->decrypt->test()) {
            // TLS: the piece is usable once this end has decrypted it.
            Tag dt;
            dt.kind = TagKind::kDecrypt;
            dt.data = *m;
            Add(m->decrypt, std::move(dt));
          } else if (m->type == Msg::kData) {
            if (role_.receiver) w_->out.receivers[id_ - 1].bytes_received += m->length;
            if (m->plain) plain_in_.insert(m->blob.id);
            Feed(event::DataReceived{m->blob, m->offset, m->length});
          } else if (m->type == Msg::kProduced) {
            OnProduced(m->blob.id);
          } else if (m->type == Msg::kAck) {
            Feed(event::AckReceived{m->from, m->blob.id});
          } else {
            Feed(event::SubtreeCommitted{m->from, m->receivers});
          }
          delete m;
          break;
        }
        case TagKind::kSend:  // delivered: a place in the stream's window is free
          --streams_[{tag.send.to, tag.send.stream}].on_wire;
          TryAccept(tag.send.to, tag.send.stream);
          break;
        case TagKind::kEncrypt:
          streams_[{tag.send.to, tag.send.stream}].encrypting = false;
          TryAccept(tag.send.to, tag.send.stream);
          break;
        case TagKind::kDecrypt: {
          const Msg& m = tag.data;
          if (role_.receiver) w_->out.receivers[id_ - 1].bytes_received += m.length;
          if (m.plain) plain_in_.insert(m.blob.id);
          Feed(event::DataReceived{m.blob, m.offset, m.length});
          break;
        }
        case TagKind::kStreamFree:
          streams_[{tag.send.to, tag.send.stream}].timer_armed = false;
          TryAccept(tag.send.to, tag.send.stream);
          break;
        case TagKind::kControl:
          break;
        case TagKind::kBuild:
          --running_builds_;
          built_[tag.blob.id] = true;
          LaunchBuilds();
          break;
        case TagKind::kCommitment:
          if (--commitment_parts_ == 0) StartApply(tag.blob);
          break;
        case TagKind::kVerify:
          break;
        case TagKind::kTranscode: {
          transcodes_.pop_front();
          if (!transcodes_.empty()) StartTranscode();
          const bool chunk = tag.blob.kind == BlobKind::kChunk;
          Feed(event::BlobReencoded{tag.send.to,
                                    chunk ? spec().blobs.at(tag.blob.id).info : tag.blob, chunk});
          break;
        }
        case TagKind::kSenderCommitment:
          if (--commitment_parts_ > 0) break;
          w_->out.sender_ready = Now();
          sender_ready_ = true;
          LaunchBuilds();
          break;
        case TagKind::kLeafHash:
          if (--leaf_hashes_ == 0 && trailer_waiting_) {
            trailer_waiting_ = false;
            CommitOrApply(trailer_);
          }
          break;
        case TagKind::kApply: {
          applied_[tag.blob.id] += 1;
          if (auto h = held_acks_.find(tag.blob.id); h != held_acks_.end()) {
            SendAck(h->second, h->first);
            held_acks_.erase(h);
          }
          if (role_.receiver && tag.blob.kind == BlobKind::kChunk) {
            const double hash = blobs().at(tag.blob.id).hash_flops;
            if (hash > 0) {
              leaf_hashes_ +=
                  ComputeParallel(hash, spec().commitment_threads, Tag{TagKind::kLeafHash, {}, {}});
            }
          }
          event::ApplyDone done;
          done.blob = tag.blob.id;
          Feed(done);
          if (role_.notify >= 0) {
            // Edge relay: the blob's plain form is ready for the subtree's root (same host).
            BlobInfo b;
            b.id = tag.blob.id;
            auto* m = new Msg{Msg::kProduced, pid_, b, 0, 0, 0, nullptr};
            // Several edge relays: the plain form crosses the region to the root's host.
            const uint64_t bytes =
                spec().edge_range_of.empty()
                    ? kControlBytes
                    : std::max<uint64_t>(kControlBytes, spec().blobs.at(b.id).info.size);
            sg4::CommPtr c = w_->mailbox[role_.notify]->put_init(m, bytes);
            c->start();
            ++w_->out.comms;
            Add(c, Tag{TagKind::kControl, {}, {}});
          }
          break;
        }
        case TagKind::kPut:
          w_->store_index.push_back(tag.blob);
          Feed(event::PutDone{tag.blob.id, true, ""});
          if (Producer()) LaunchBuilds();
          break;
        case TagKind::kFetchReq:
          StartFetchReply(tag.blob);
          break;
        case TagKind::kFetch:
          if (role_.receiver) w_->out.receivers[id_ - 1].bytes_received += tag.blob.size;
          Feed(event::FetchDone{tag.blob.id, true, ""});
          break;
        case TagKind::kTimer:
          timer_ = -1;
          Feed(event::TimerFired{});
          break;
        case TagKind::kList: {
          event::ListDone ld;
          ld.blobs = w_->store_index;
          std::sort(ld.blobs.begin(), ld.blobs.end(),
                    [](const BlobInfo& a, const BlobInfo& b) { return a.id < b.id; });
          Feed(ld);
          break;
        }
      }
      if (policy_->failed()) break;
    }
    // Let outgoing messages finish (a dead sender would cancel them), then stop listening.
    for (size_t i = 0; i < acts_.size(); ++i) {
      if (tags_[i].kind == TagKind::kSend || tags_[i].kind == TagKind::kControl ||
          tags_[i].kind == TagKind::kPut || tags_[i].kind == TagKind::kVerify) {
        acts_[i]->wait();
      }
    }
    for (size_t i = 0; i < acts_.size(); ++i) {
      if (tags_[i].kind == TagKind::kRecv || tags_[i].kind == TagKind::kTimer) {
        acts_[i]->cancel();
      }
    }
  }

  World* w_;
  int id_;      // actor index
  NodeId pid_;  // id in the tree its policy runs over
  ActorRole role_;
  sg4::Host* host_ = nullptr;
  std::unique_ptr<PolicyHost> policy_;
  std::vector<sg4::ActivityPtr> acts_;
  std::vector<Tag> tags_;
  double timer_ = -1;
  std::map<std::pair<NodeId, int>, Stream> streams_;  // per (peer, stream)
  std::vector<int> applied_;
  std::set<BlobId> plain_in_;                 // edge relay: blobs that came in the plain form
  std::map<BlobId, NodeId> held_acks_;        // edge relay: acks waiting for the transcoding
  std::deque<action::Transcode> transcodes_;  // sender: its transcoding queue (front: running)
  std::vector<bool> built_;
  size_t next_launch_ = 0, next_deliver_ = 0;
  int running_builds_ = 0;
  bool sender_ready_ = true;      // the producer's commitment is done (or none is charged)
  int commitment_parts_ = 0;      // parts of this node's commitment job still running
  int leaf_hashes_ = 0;           // parts of the chunks' leaf hashing jobs still running
  bool trailer_waiting_ = false;  // the trailer's commit waits for leaf_hashes_
  BlobInfo trailer_;
};

nlohmann::json OutcomeToJson(const RunOutcome& o) {
  nlohmann::json rs = nlohmann::json::array();
  for (const NodeOutcome& n : o.receivers) {
    rs.push_back({{"committed", n.committed},
                  {"complete", n.complete},
                  {"commit_at", n.commit_at},
                  {"bytes_received", n.bytes_received},
                  {"error", n.error}});
  }
  return {{"first_built", o.first_built},
          {"last_built", o.last_built},
          {"end", o.end},
          {"tree_committed", o.tree_committed},
          {"refit_seconds", o.refit_seconds},
          {"wire_bytes", o.wire_bytes},
          {"store_put_bytes", o.store_put_bytes},
          {"store_get_bytes", o.store_get_bytes},
          {"comms", o.comms},
          {"sim_clock", o.sim_clock},
          {"receivers", rs},
          {"tls_cpu_seconds", o.tls_cpu_seconds},
          {"sender_ready", o.sender_ready},
          {"edge_switches", o.edge_switches},
          {"edge_plain_chunks", o.edge_plain_chunks},
          {"error", o.error}};
}

RunOutcome OutcomeFromJson(const nlohmann::json& j) {
  RunOutcome o;
  o.first_built = j.at("first_built");
  o.last_built = j.at("last_built");
  o.end = j.at("end");
  o.tree_committed = j.at("tree_committed");
  o.refit_seconds = j.at("refit_seconds");
  o.wire_bytes = j.at("wire_bytes");
  o.store_put_bytes = j.at("store_put_bytes");
  o.store_get_bytes = j.at("store_get_bytes");
  o.comms = j.at("comms");
  o.tls_cpu_seconds = j.at("tls_cpu_seconds");
  o.sender_ready = j.at("sender_ready");
  o.edge_switches = j.at("edge_switches");
  o.edge_plain_chunks = j.at("edge_plain_chunks");
  o.sim_clock = j.at("sim_clock");
  o.error = j.at("error");
  for (const auto& r : j.at("receivers")) {
    NodeOutcome n;
    n.committed = r.at("committed");
    n.complete = r.at("complete");
    n.commit_at = r.at("commit_at");
    n.bytes_received = r.at("bytes_received");
    n.error = r.at("error");
    o.receivers.push_back(n);
  }
  return o;
}

}  // namespace

std::unique_ptr<NodePolicy> MakeSimPolicy(const RunSpec& spec, NodeId node) {
  if (spec.object_store) {
    return node == 0 ? MakeUploaderPolicy(spec.relay) : MakeDownloaderPolicy(spec.relay);
  }
  return MakeTreePolicy(spec.topology, node, spec.relay);
}

std::unique_ptr<NodePolicy> MakeSimEdgeSenderPolicy(const RunSpec& spec) {
  RelayOptions o = spec.relay;
  o.edge_relays = {1};
  o.edge_lag_bytes = spec.edge_lag_bytes;
  return MakeTreePolicy(*Topology::FanOut(2, 1, 1), 0, o);
}

RunOutcome RunInThisProcess(const RunSpec& spec) {
  World w;
  w.spec = &spec;
  w.out.receivers.resize(spec.receivers);
  g_world = &w;
  int argc = 1;
  char arg0[] = "dcr-sim";
  char* argv[] = {arg0, nullptr};
  xbt_log_control_set("root.thresh:critical");
  sg4::Engine engine(&argc, argv);
  sg4::Engine::set_config("network/model:" + spec.network_model);
  // Not 0: CM02 bounds a Comm by min(rate, gamma / (2 latency)), and a bound of 0 means none, so
  // gamma = 0 would drop our explicit rates. A huge gamma leaves only the explicit rates.
  sg4::Engine::set_config("network/TCP-gamma", 1e30);
  sg4::Engine::set_config("network/crosstraffic", false);
  sg4::Engine::set_config("network/loopback-bw", spec.loopback_bandwidth);
  sg4::Engine::set_config("network/loopback-lat", 1e-6);
  PlatformSpec plat = spec.platform;
  // Clock jobs never share a core: per node one timer, one LIST and its GET requests.
  plat.clock_cores = (spec.receivers + 2) *
                     (3 + std::max(spec.relay.max_parallel_fetches, spec.relay.max_parallel_puts));
  w.platform = BuildPlatform(plat);

  // Actors 0 .. receivers: the tree (0 = its root). With an edge relay, the root is the edge
  // relay's forwarding side on the edge host, and two more actors carry the long-link stream: the
  // sender (receivers + 1, on the train host) and the edge relay's receiving side (receivers + 2).
  const bool edge = spec.edge_relay;
  const int wan_sender = spec.receivers + 1, edge_receiver = spec.receivers + 2;
  const int nodes = spec.receivers + (edge ? 3 : 1);
  const int rollout_hosts = static_cast<int>(w.platform.hosts[1].size());
  for (int i = 0; i < nodes; ++i) {
    if (i == 0 && edge) {
      w.node_host.push_back(w.platform.edges.back());  // the chain's last edge relay
      w.node_region.push_back(1);
    } else if (i == edge_receiver) {
      w.node_host.push_back(w.platform.edge);
      w.node_region.push_back(1);
    } else if (i == 0 || i == wan_sender) {
      w.node_host.push_back(w.platform.hosts[0][0]);
      w.node_region.push_back(0);
    } else {
      int h = std::min((i - 1) / std::max(1, spec.receivers_per_host), rollout_hosts - 1);
      w.node_host.push_back(w.platform.hosts[1][h]);
      w.node_region.push_back(1);
    }
    w.mailbox.push_back(sg4::Mailbox::by_name("node-" + std::to_string(i)));
  }
  const Topology wan_tree = *Topology::FanOut(2, 1, 1);  // sender -> edge relay
  RelayOptions edge_options = spec.relay;
  edge_options.apply = true;  // the edge relay's apply is its transcoding, chunk-parallel
  edge_options.max_parallel_applies =
      (spec.edge_parallel > 0 ? spec.edge_parallel : std::max(1, spec.platform.edge_cores)) *
      static_cast<int>(std::max<size_t>(1, w.platform.edges.size()));
  for (int i = 0; i < nodes; ++i) {
    ActorRole role;
    role.actor = i;
    role.policy_id = i;
    role.receiver = i >= 1 && i <= spec.receivers;
    role.blobs = &spec.blobs;
    role.producer = i == 0 && !edge;
    role.fed = i == 0 && edge;
    role.policy = [&spec, i]() { return MakeSimPolicy(spec, i); };
    if (i == wan_sender || i == edge_receiver) {
      role.policy_id = i - wan_sender;
      role.offset = wan_sender;
      role.blobs = &spec.wan_blobs;
      role.producer = i == wan_sender;
      role.notify = i == edge_receiver ? 0 : -1;
      role.policy = [&spec, &wan_tree, &edge_options, pid = role.policy_id]() {
        return pid == 0 ? MakeSimEdgeSenderPolicy(spec)
                        : MakeTreePolicy(wan_tree, pid, edge_options);
      };
    }
    sg4::ActorPtr a = sg4::Actor::create("node-" + std::to_string(i), w.node_host[i], [&w, role]() {
      NodeActor node(&w, role);
      node();
    });
    w.mailbox[i]->set_receiver(a);
  }
  engine.run();
  w.out.sim_clock = sg4::Engine::get_clock();
  if (w.out.first_built < 0) w.out.first_built = 0;
  w.out.refit_seconds = w.out.end - w.out.first_built;
  for (int i = 0; i < spec.receivers; ++i) {
    if (!w.out.receivers[i].committed && w.out.error.empty()) {
      w.out.error = "receiver node " + std::to_string(i + 1) +
                    " never committed (simulation ended: deadlock or failure)";
    }
  }
  g_world = nullptr;
  return w.out;
}

namespace {

struct Child {
  pid_t pid = -1;
  int fd = -1;
};

StatusOr<Child> StartChild(const RunSpec& spec) {
  int fds[2];
  if (::pipe(fds) != 0) return ErrnoError("pipe", errno);
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = ::fork();
  if (pid < 0) {
    int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    return ErrnoError("fork", err);
  }
  if (pid == 0) {
    ::close(fds[0]);
    RunOutcome o = RunInThisProcess(spec);
    std::string text = OutcomeToJson(o).dump();
    size_t off = 0;
    while (off < text.size()) {
      ssize_t n = ::write(fds[1], text.data() + off, text.size() - off);
      if (n <= 0) {
        if (n < 0 && errno == EINTR) continue;
        ::_exit(3);
      }
      off += static_cast<size_t>(n);
    }
    ::close(fds[1]);
    ::_exit(0);
  }
  ::close(fds[1]);
  return Child{pid, fds[0]};
}

StatusOr<RunOutcome> FinishChild(const Child& child) {
  std::string text;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(child.fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(child.fd);
  int status = 0;
  while (::waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) {
    return InternalError("simulation process died with signal " + std::to_string(WTERMSIG(status)) +
                         " (" + strsignal(WTERMSIG(status)) + ")");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return InternalError("simulation process exited with code " +
                         std::to_string(WEXITSTATUS(status)));
  }
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return InternalError("simulation process sent a malformed outcome");
  try {
    return OutcomeFromJson(j);
  } catch (const std::exception& e) {
    return InternalError(std::string("simulation outcome: ") + e.what());
  }
}

}  // namespace

StatusOr<RunOutcome> RunForked(const RunSpec& spec) {
  DCR_ASSIGN_OR_RETURN(Child c, StartChild(spec));
  return FinishChild(c);
}

StatusOr<std::vector<RunOutcome>> RunForkedAll(const std::vector<RunSpec>& specs, int parallel) {
  if (parallel <= 0) parallel = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  std::vector<RunOutcome> out(specs.size());
  Status first_error;
  for (size_t begin = 0; begin < specs.size(); begin += static_cast<size_t>(parallel)) {
    size_t end = std::min(specs.size(), begin + static_cast<size_t>(parallel));
    std::vector<StatusOr<Child>> children;
    for (size_t i = begin; i < end; ++i) children.push_back(StartChild(specs[i]));
    for (size_t i = begin; i < end; ++i) {
      StatusOr<Child>& c = children[i - begin];
      if (!c.ok()) {
        if (first_error.ok()) first_error = c.status();
        continue;
      }
      auto o = FinishChild(*c);  // always reap every child
      if (!o.ok()) {
        if (first_error.ok()) first_error = o.status();
        continue;
      }
      out[i] = std::move(*o);
    }
  }
  if (!first_error.ok()) return first_error;
  return out;
}

}  // namespace dcr::sim::internal
