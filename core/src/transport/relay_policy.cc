// The transport state machines (see dcr/relay_policy.h for the contract).
#include "dcr/relay_policy.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <set>

#include "internal/str_format.h"

namespace dcr {

const char* BlobKindName(BlobKind kind) {
  switch (kind) {
    case BlobKind::kHeader:
      return "hdr";
    case BlobKind::kChunk:
      return "chk";
    case BlobKind::kTrailer:
      return "trl";
  }
  return "?";
}

const char* NodeRoleName(NodeRole role) {
  switch (role) {
    case NodeRole::kSender:
      return "sender";
    case NodeRole::kRelay:
      return "relay";
    case NodeRole::kReceiver:
      return "receiver";
    case NodeRole::kUploader:
      return "uploader";
    case NodeRole::kDownloader:
      return "downloader";
  }
  return "?";
}

// ---- topology ----

int Topology::Depth(NodeId node) const {
  int d = 0;
  while (node > 0 && parent[node] != kNoNode) {
    node = parent[node];
    ++d;
  }
  return d;
}

int Topology::SubtreeSize(NodeId node) const {
  int n = 0;
  for (NodeId c : children[node]) n += 1 + SubtreeSize(c);
  return n;
}

StatusOr<Topology> Topology::FanOut(int num_nodes, int fan_out, int root_fan_out) {
  if (num_nodes < 1) return InvalidArgumentError("topology: need at least one node");
  if (fan_out < 1) return InvalidArgumentError("topology: fan_out must be >= 1");
  if (root_fan_out < 1) return InvalidArgumentError("topology: root_fan_out must be >= 1");
  Topology t;
  t.parent.assign(num_nodes, kNoNode);
  t.children.assign(num_nodes, {});
  // Breadth first: the next unfilled node takes children in id order.
  NodeId next_parent = 0;
  for (NodeId i = 1; i < num_nodes; ++i) {
    while (static_cast<int>(t.children[next_parent].size()) >=
           (next_parent == 0 ? root_fan_out : fan_out)) {
      ++next_parent;
    }
    t.parent[i] = next_parent;
    t.children[next_parent].push_back(i);
  }
  return t;
}

StatusOr<Topology> Topology::FromParents(const std::vector<NodeId>& parents) {
  const int n = static_cast<int>(parents.size());
  if (n < 1) return InvalidArgumentError("topology: empty parent list");
  if (parents[0] != kNoNode) {
    return InvalidArgumentError("topology parents[0]: node 0 is the sender and must be -1");
  }
  Topology t;
  t.parent = parents;
  t.children.assign(n, {});
  for (int i = 1; i < n; ++i) {
    if (parents[i] < 0 || parents[i] >= n || parents[i] == i) {
      return InvalidArgumentError("topology parents[" + std::to_string(i) +
                                  "]: " + std::to_string(parents[i]) + " is not a node in [0, " +
                                  std::to_string(n) + ") other than itself");
    }
    t.children[parents[i]].push_back(i);
  }
  // Every node must reach the root without a cycle.
  for (int i = 1; i < n; ++i) {
    int hops = 0;
    NodeId x = i;
    while (x != 0) {
      x = parents[x];
      if (++hops > n) {
        return InvalidArgumentError("topology parents[" + std::to_string(i) +
                                    "]: cycle, node does not reach the sender");
      }
    }
  }
  return t;
}

int EdgeStreams(NodeId parent, const RelayOptions& options) {
  return parent == 0 ? std::max(1, options.root_streams) : 1;
}

// ---- keys ----

std::optional<double> StoreRetryDelay(const RelayOptions& o, int attempt) {
  if (attempt < 1 || attempt > o.max_retries) return std::nullopt;
  double d = o.retry_backoff_s;
  for (int i = 1; i < attempt; ++i) d *= 2;
  return d;
}

std::string ObjectKey(const std::string& prefix, const BlobInfo& blob) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%010" PRIu64 ".%s", blob.id, BlobKindName(blob.kind));
  return prefix.empty() ? std::string(buf) : prefix + "/" + buf;
}

StatusOr<BlobInfo> ParseObjectKey(const std::string& prefix, const std::string& key) {
  std::string p = prefix.empty() ? "" : prefix + "/";
  if (key.compare(0, p.size(), p) != 0) {
    return InvalidArgumentError("object key '" + key + "' is not under '" + p + "'");
  }
  std::string rest = key.substr(p.size());
  if (rest.size() != 14 || rest[10] != '.') {
    return InvalidArgumentError("object key '" + key + "' is not <10 digits>.<hdr|chk|trl>");
  }
  BlobInfo b;
  for (int i = 0; i < 10; ++i) {
    if (rest[i] < '0' || rest[i] > '9') {
      return InvalidArgumentError("object key '" + key + "': bad blob id");
    }
    b.id = b.id * 10 + static_cast<uint64_t>(rest[i] - '0');
  }
  std::string kind = rest.substr(11);
  if (kind == "hdr") {
    b.kind = BlobKind::kHeader;
  } else if (kind == "chk") {
    b.kind = BlobKind::kChunk;
  } else if (kind == "trl") {
    b.kind = BlobKind::kTrailer;
  } else {
    return InvalidArgumentError("object key '" + key + "': bad kind '" + kind + "'");
  }
  return b;
}

// ---- ToString ----

namespace {
using internal::Fmt;
using internal::Overloaded;
using ULL = unsigned long long;
}  // namespace

std::string ToString(const Event& e) {
  return std::visit(
      Overloaded{
          [](const event::Start&) { return std::string("Start"); },
          [](const event::BlobProduced& x) {
            return Fmt("BlobProduced{%llu %s %llu}", (ULL)x.blob.id, BlobKindName(x.blob.kind),
                       (ULL)x.blob.size);
          },
          [](const event::DataReceived& x) {
            return Fmt("DataReceived{%llu @%llu +%llu}", (ULL)x.blob.id, (ULL)x.offset,
                       (ULL)x.length);
          },
          [](const event::SendDone& x) {
            return Fmt("SendDone{to %d s%d %llu @%llu +%llu}", x.to, x.stream, (ULL)x.blob,
                       (ULL)x.offset, (ULL)x.length);
          },
          [](const event::SendFailed& x) {
            return Fmt("SendFailed{to %d: %s}", x.to, x.message.c_str());
          },
          [](const event::AckReceived& x) {
            return Fmt("AckReceived{from %d %llu}", x.from, (ULL)x.blob);
          },
          [](const event::ApplyDone& x) {
            return Fmt("ApplyDone{%llu %s}", (ULL)x.blob, x.ok ? "ok" : x.message.c_str());
          },
          [](const event::SubtreeCommitted& x) {
            return Fmt("SubtreeCommitted{from %d n=%d}", x.from, x.receivers);
          },
          [](const event::PutDone& x) {
            return Fmt("PutDone{%llu %s}", (ULL)x.blob, x.ok ? "ok" : x.message.c_str());
          },
          [](const event::ListDone& x) {
            return Fmt("ListDone{%s %zu}", x.ok ? "ok" : x.message.c_str(), x.blobs.size());
          },
          [](const event::FetchDone& x) {
            return Fmt("FetchDone{%llu %s}", (ULL)x.blob, x.ok ? "ok" : x.message.c_str());
          },
          [](const event::TimerFired&) { return std::string("TimerFired"); },
          [](const event::BlobReencoded& x) {
            return Fmt("BlobReencoded{to %d %s %llu %llu%s}", x.to, BlobKindName(x.blob.kind),
                       (ULL)x.blob.id, (ULL)x.blob.size, x.plain ? "" : " as produced");
          },
      },
      e);
}

std::string ToString(const Action& a) {
  return std::visit(
      Overloaded{
          [](const action::Send& x) {
            return Fmt("Send{to %d s%d %llu @%llu +%llu%s}", x.to, x.stream, (ULL)x.blob.id,
                       (ULL)x.offset, (ULL)x.length, x.plain ? " plain" : "");
          },
          [](const action::Ack& x) { return Fmt("Ack{to %d %llu}", x.to, (ULL)x.blob); },
          [](const action::Apply& x) {
            return Fmt("Apply{%llu %s}", (ULL)x.blob.id, BlobKindName(x.blob.kind));
          },
          [](const action::Release& x) { return Fmt("Release{%llu}", (ULL)x.blob); },
          [](const action::Commit&) { return std::string("Commit"); },
          [](const action::ReportCommit& x) {
            return Fmt("ReportCommit{to %d n=%d}", x.to, x.receivers);
          },
          [](const action::TreeCommitted& x) { return Fmt("TreeCommitted{n=%d}", x.receivers); },
          [](const action::Put& x) {
            return Fmt("Put{%s%s}", x.key.c_str(), x.plain ? " plain" : "");
          },
          [](const action::Published&) { return std::string("Published"); },
          [](const action::List& x) { return Fmt("List{%s}", x.prefix.c_str()); },
          [](const action::Fetch& x) { return Fmt("Fetch{%s}", x.key.c_str()); },
          [](const action::SetTimer& x) { return Fmt("SetTimer{%.6f}", x.at); },
          [](const action::Fail& x) { return Fmt("Fail{%s}", x.message.c_str()); },
          [](const action::Transcode& x) {
            return Fmt("Transcode{to %d %llu}", x.to, (ULL)x.blob.id);
          },
          [](const action::EdgeLag& x) {
            return Fmt("EdgeLag{to %d %s %llu/%llu, %llu chunks}", x.to,
                       x.lagging ? "lags" : "caught up", (ULL)x.unacked, (ULL)x.bound,
                       (ULL)x.chunks);
          },
      },
      a);
}

namespace {

// Apply ordering shared by tree nodes and downloaders: header first, chunks in completion order
// (bounded parallelism), trailer last; Commit once the trailer is applied.
class ApplyScheduler {
 public:
  explicit ApplyScheduler(int max_parallel) : max_parallel_(std::max(1, max_parallel)) {}

  void Ready(const BlobInfo& b) {
    if (b.kind == BlobKind::kHeader) {
      header_ = b;
      have_header_ = true;
    } else if (b.kind == BlobKind::kTrailer) {
      trailer_ = b;
      have_trailer_ = true;
    } else {
      ready_.push_back(b);
    }
  }
  // Returns true and emits Commit when the trailer's apply finished.
  bool Done(BlobId blob, std::vector<Action>* out) {
    --inflight_;
    if (have_header_ && blob == header_.id && !header_applied_) {
      header_applied_ = true;
    } else if (have_trailer_ && blob == trailer_.id) {
      committed_ = true;
      out->push_back(action::Commit{});
      return true;
    } else {
      ++chunks_applied_;
    }
    return false;
  }
  void Pump(std::vector<Action>* out) {
    if (committed_) return;
    if (!header_applied_) {
      if (have_header_ && !header_started_ && inflight_ < max_parallel_) {
        header_started_ = true;
        ++inflight_;
        out->push_back(action::Apply{header_});
      }
      return;
    }
    while (!ready_.empty() && inflight_ < max_parallel_) {
      ++inflight_;
      out->push_back(action::Apply{ready_.front()});
      ready_.pop_front();
    }
    // Chunks are ids 1 .. trailer-1.
    if (have_trailer_ && !trailer_started_ && inflight_ == 0 && ready_.empty() &&
        chunks_applied_ + 1 == trailer_.id) {
      trailer_started_ = true;
      ++inflight_;
      out->push_back(action::Apply{trailer_});
    }
  }
  bool committed() const { return committed_; }

 private:
  int max_parallel_;
  int inflight_ = 0;
  BlobInfo header_, trailer_;
  bool have_header_ = false, have_trailer_ = false;
  bool header_started_ = false, header_applied_ = false, trailer_started_ = false;
  bool committed_ = false;
  uint64_t chunks_applied_ = 0;
  std::deque<BlobInfo> ready_;
};

// ---- relay tree node ----

class TreePolicy : public NodePolicy {
 public:
  TreePolicy(const Topology& topo, NodeId self, const RelayOptions& options)
      : self_(self),
        parent_(topo.parent[self]),
        options_(options),
        applies_(self != 0 && options.apply),
        applier_(options.max_parallel_applies) {
    options_.piece_bytes = std::max<uint64_t>(1, options_.piece_bytes);
    if (parent_ != kNoNode) links_.push_back(Link{parent_, false, EdgeStreams(parent_, options_)});
    for (NodeId c : topo.children[self]) {
      Child ch;
      ch.id = c;
      ch.edge = self == 0 && options_.edge_lag_bytes > 0 &&
                std::find(options_.edge_relays.begin(), options_.edge_relays.end(), c) !=
                    options_.edge_relays.end();
      ch.busy.assign(EdgeStreams(self, options_), false);
      children_.push_back(std::move(ch));
      links_.push_back(Link{c, true, EdgeStreams(self, options_)});
    }
  }

  std::vector<Link> links() const override { return links_; }

  NodeRole role() const override {
    if (self_ == 0) return NodeRole::kSender;
    return children_.empty() ? NodeRole::kReceiver : NodeRole::kRelay;
  }
  bool done() const override { return failed_ || (reported_ && released_ == blobs_.size()); }
  bool failed() const override { return failed_; }

  void Handle(TimePoint now, const Event& ev, std::vector<Action>* out) override {
    if (failed_) return;
    std::visit(
        Overloaded{
            [&](const event::Start&) {},
            [&](const event::BlobProduced& e) {
              if (self_ != 0) return;
              Blob& b = GetBlob(e.blob);
              if (b.complete) return;
              // A lagging edge relay gets a new chunk in its plain form.
              for (auto& c : children_) {
                if (c.lagging && e.blob.kind == BlobKind::kChunk) AskPlain(&c, e.blob, out);
              }
              for (uint64_t p = 0; p < b.pieces; ++p) MarkPiece(&b, p, out);
            },
            [&](const event::DataReceived& e) {
              if (self_ == 0) return;
              if (e.blob.kind == BlobKind::kTrailer) total_ = e.blob.id + 1;
              Blob& b = GetBlob(e.blob);
              uint64_t p = e.offset / options_.piece_bytes;
              if (e.offset % options_.piece_bytes != 0 || p >= b.pieces) {
                Fail(StatusCode::kDataLoss,
                     Fmt("node %d: piece @%llu of blob %llu does not fit piece size %llu", self_,
                         (ULL)e.offset, (ULL)e.blob.id, (ULL)options_.piece_bytes),
                     out);
                return;
              }
              MarkPiece(&b, p, out);
            },
            [&](const event::SendDone& e) {
              for (auto& c : children_) {
                if (c.id != e.to) continue;
                if (e.stream >= 0 && e.stream < static_cast<int>(c.busy.size())) {
                  c.busy[e.stream] = false;
                }
                if (c.edge) EdgeAccepted(&c, e.blob, e.length, out);
              }
            },
            [&](const event::SendFailed& e) {
              Fail(StatusCode::kUnavailable,
                   Fmt("node %d: send to node %d failed: %s", self_, e.to, e.message.c_str()), out);
            },
            [&](const event::AckReceived& e) {
              auto it = blobs_.find(e.blob);
              if (it == blobs_.end()) return;
              Child* c = FindChild(e.from);
              if (c == nullptr || !c->acked.insert(e.blob).second) return;
              ++it->second.acks;
              MaybeRelease(&it->second, out);
              if (c->edge) EdgeAcked(c, e.blob, out);
            },
            [&](const event::ApplyDone& e) {
              if (!e.ok) {
                Fail(e.code,
                     Fmt("node %d: apply of blob %llu failed: %s", self_, (ULL)e.blob,
                         e.message.c_str()),
                     out);
                return;
              }
              auto it = blobs_.find(e.blob);
              if (it != blobs_.end()) {
                it->second.applied = true;
                MaybeRelease(&it->second, out);
              }
              applier_.Done(e.blob, out);
            },
            [&](const event::SubtreeCommitted& e) {
              Child* c = FindChild(e.from);
              if (c == nullptr || c->reported) return;
              c->reported = true;
              c->receivers = e.receivers;
            },
            [](const event::PutDone&) {},
            [](const event::ListDone&) {},
            [](const event::FetchDone&) {},
            [](const event::TimerFired&) {},
            [&](const event::BlobReencoded& e) {
              if (self_ != 0) return;
              Child* c = FindChild(e.to);
              if (c == nullptr || c->started.count(e.blob.id) != 0) return;
              if (c->awaiting.erase(e.blob.id) == 0) return;  // not asked, or asked no more
              auto it = blobs_.find(e.blob.id);
              if (e.plain) c->sizes[e.blob.id] = e.blob.size;
              if (it == blobs_.end() || !it->second.complete) return;  // queued once produced
              std::erase_if(c->queue, [&](const std::pair<BlobId, uint64_t>& q) {
                return q.first == e.blob.id;
              });
              QueueForm(c, e.blob.id, e.plain ? e.blob.size : it->second.info.size);
            },
        },
        ev);
    if (failed_) return;
    Pump(out);
    if (applies_) applier_.Pump(out);
    MaybeReport(out);
    (void)now;
  }

 private:
  struct Blob {
    BlobInfo info;
    uint64_t pieces = 1;
    std::vector<bool> have;
    uint64_t received = 0;
    bool complete = false;
    bool applied = false;
    int acks = 0;
    bool released = false;
  };
  struct Child {
    NodeId id = kNoNode;
    std::deque<std::pair<BlobId, uint64_t>> queue;  // (blob, piece) to send, arrival order
    std::vector<bool> busy;  // per stream: a Send not yet accepted (SendDone)
    std::set<BlobId> acked;
    bool reported = false;
    int receivers = 0;
    // Sender: blobs this child gets in another form (BlobReencoded), with that form's size.
    std::map<BlobId, uint64_t> sizes;
    std::set<BlobId> started;  // blobs with a piece handed to a stream of this child
    // Sender, edge relay watched for lag (RelayOptions::edge_lag_bytes): per blob the bytes the
    // transport accepted and the child has not acknowledged, their sum, whether it lags, and
    // the blobs whose plain form was asked for (Transcode) and not yet answered.
    bool edge = false;
    std::map<BlobId, uint64_t> unacked;
    uint64_t unacked_total = 0;
    bool lagging = false;
    std::set<BlobId> awaiting;
  };

  Blob& GetBlob(const BlobInfo& info) {
    auto it = blobs_.find(info.id);
    if (it != blobs_.end()) return it->second;
    Blob b;
    b.info = info;
    b.pieces = NumPieces(info.size, options_.piece_bytes);
    b.have.assign(b.pieces, false);
    return blobs_.emplace(info.id, std::move(b)).first->second;
  }
  Child* FindChild(NodeId id) {
    for (auto& c : children_) {
      if (c.id == id) return &c;
    }
    return nullptr;
  }

  void MarkPiece(Blob* b, uint64_t p, std::vector<Action>* out) {
    if (b->have[p]) return;  // duplicate
    b->have[p] = true;
    ++b->received;
    for (auto& c : children_) {  // cut-through
      if (c.sizes.count(b->info.id) == 0 && c.awaiting.count(b->info.id) == 0) {
        c.queue.emplace_back(b->info.id, p);
      }
    }
    if (b->received == b->pieces) {
      b->complete = true;
      for (auto& c : children_) {  // another form for this child: sent once the blob is whole
        auto f = c.sizes.find(b->info.id);
        if (f != c.sizes.end()) QueueForm(&c, b->info.id, f->second);
      }
      ++complete_blobs_;
      if (b->info.kind == BlobKind::kTrailer) total_ = b->info.id + 1;
      if (self_ != 0) out->push_back(action::Ack{parent_, b->info.id});
      if (applies_) applier_.Ready(b->info);
      MaybeRelease(b, out);
    }
  }

  void MaybeRelease(Blob* b, std::vector<Action>* out) {
    if (b->released || !b->complete) return;
    if (b->acks < static_cast<int>(children_.size())) return;
    if (applies_ && !b->applied) return;
    b->released = true;
    ++released_;
    out->push_back(action::Release{b->info.id});
  }

  // ---- edge lag (RelayOptions::edge_lag_bytes) ----

  // Asks the driver for the plain form of `blob` for edge relay `c` (Transcode): its pieces are
  // held back from `c` until the answer (BlobReencoded).
  void AskPlain(Child* c, const BlobInfo& blob, std::vector<Action>* out) {
    if (c->started.count(blob.id) != 0 || c->sizes.count(blob.id) != 0) return;
    if (!c->awaiting.insert(blob.id).second) return;
    std::erase_if(c->queue,
                  [&](const std::pair<BlobId, uint64_t>& q) { return q.first == blob.id; });
    out->push_back(action::Transcode{c->id, blob});
  }
  // The transport accepted `length` bytes of `blob` for edge relay `c`.
  void EdgeAccepted(Child* c, BlobId blob, uint64_t length, std::vector<Action>* out) {
    if (c->acked.count(blob) != 0) return;  // acknowledged before the transport's answer came
    c->unacked[blob] += length;
    c->unacked_total += length;
    if (c->lagging || c->unacked_total <= options_.edge_lag_bytes) return;
    c->lagging = true;
    out->push_back(action::EdgeLag{c->id, true, c->unacked_total, options_.edge_lag_bytes, 0});
    for (const auto& [id, b] : blobs_) {
      if (b.info.kind == BlobKind::kChunk && b.complete) AskPlain(c, b.info, out);
    }
  }
  // Edge relay `c` acknowledged `blob`: its bytes no longer count.
  void EdgeAcked(Child* c, BlobId blob, std::vector<Action>* out) {
    auto u = c->unacked.find(blob);
    if (u != c->unacked.end()) {
      c->unacked_total -= u->second;
      c->unacked.erase(u);
    }
    if (!c->lagging || c->unacked_total > options_.edge_lag_bytes / 2) return;
    c->lagging = false;
    // Every chunk not started on its edge goes in the produced form again.
    std::vector<BlobId> back;
    for (const auto& [id, size] : c->sizes) {
      if (c->started.count(id) == 0) back.push_back(id);
    }
    for (BlobId id : c->awaiting) back.push_back(id);
    std::sort(back.begin(), back.end());
    c->awaiting.clear();
    for (BlobId id : back) {
      c->sizes.erase(id);
      std::erase_if(c->queue, [&](const std::pair<BlobId, uint64_t>& q) { return q.first == id; });
      auto it = blobs_.find(id);
      if (it != blobs_.end() && it->second.complete) QueueForm(c, id, it->second.info.size);
    }
    out->push_back(
        action::EdgeLag{c->id, false, c->unacked_total, options_.edge_lag_bytes, back.size()});
  }

  // Queues every piece of blob `id` in its form of `size` bytes for child `c`.
  void QueueForm(Child* c, BlobId id, uint64_t size) {
    const uint64_t n = NumPieces(size, options_.piece_bytes);
    for (uint64_t p = 0; p < n; ++p) c->queue.emplace_back(id, p);
  }

  // Every idle stream of a child takes the child's next queued piece, lowest stream first.
  void Pump(std::vector<Action>* out) {
    for (auto& c : children_) {
      for (int s = 0; s < static_cast<int>(c.busy.size()) && !c.queue.empty(); ++s) {
        if (c.busy[s]) continue;
        auto [blob_id, p] = c.queue.front();
        c.queue.pop_front();
        BlobInfo info = blobs_.at(blob_id).info;
        const auto f = c.sizes.find(blob_id);
        const bool plain = f != c.sizes.end();
        if (plain) info.size = f->second;
        uint64_t offset = p * options_.piece_bytes;
        uint64_t length = std::min(options_.piece_bytes, info.size - std::min(info.size, offset));
        c.busy[s] = true;
        if (self_ == 0) c.started.insert(blob_id);
        out->push_back(action::Send{c.id, s, info, offset, length, plain});
      }
    }
  }

  void MaybeReport(std::vector<Action>* out) {
    if (reported_) return;
    if (applies_ && !applier_.committed()) return;
    if (!applies_ && (total_ == 0 || complete_blobs_ < total_)) return;
    int n = applies_ ? 1 : 0;
    for (const auto& c : children_) {
      if (!c.reported) return;
      n += c.receivers;
    }
    reported_ = true;
    if (self_ == 0) {
      out->push_back(action::TreeCommitted{n});
    } else {
      out->push_back(action::ReportCommit{parent_, n});
    }
  }

  void Fail(StatusCode code, std::string message, std::vector<Action>* out) {
    failed_ = true;
    out->push_back(action::Fail{code, std::move(message)});
  }

  NodeId self_;
  NodeId parent_;
  RelayOptions options_;
  bool applies_;
  ApplyScheduler applier_;
  std::vector<Child> children_;
  std::vector<Link> links_;
  std::map<BlobId, Blob> blobs_;
  uint64_t total_ = 0;  // blobs in the stream, once the trailer is known
  uint64_t complete_blobs_ = 0;
  size_t released_ = 0;
  bool reported_ = false;
  bool failed_ = false;
};

// Timed retries shared by the object-store roles.
class RetryTimers {
 public:
  void Add(TimePoint at, std::function<void()> fn) { due_.emplace(at, std::move(fn)); }
  // Runs every task due at `now`.
  void Fire(TimePoint now) {
    while (!due_.empty() && due_.begin()->first <= now + 1e-12) {
      auto fn = std::move(due_.begin()->second);
      due_.erase(due_.begin());
      fn();
    }
  }
  // Emits SetTimer if the earliest due time changed.
  void Arm(std::vector<Action>* out) {
    if (due_.empty()) return;
    TimePoint t = due_.begin()->first;
    if (!armed_ || t != armed_at_) {
      armed_ = true;
      armed_at_ = t;
      out->push_back(action::SetTimer{t});
    }
  }
  void Disarm() { armed_ = false; }

 private:
  std::multimap<TimePoint, std::function<void()>> due_;
  bool armed_ = false;
  TimePoint armed_at_ = 0;
};

// REQUIRES: attempt <= o.max_retries (the caller failed the operation past that).
double Backoff(const RelayOptions& o, int attempt) { return *StoreRetryDelay(o, attempt); }

// ---- object store uploader ----

class UploaderPolicy : public NodePolicy {
 public:
  explicit UploaderPolicy(const RelayOptions& o) : options_(o) {}
  NodeRole role() const override { return NodeRole::kUploader; }
  bool done() const override { return published_ || failed_; }
  bool failed() const override { return failed_; }

  void Handle(TimePoint now, const Event& ev, std::vector<Action>* out) override {
    if (failed_ || published_) return;
    if (const auto* e = std::get_if<event::BlobProduced>(&ev)) {
      if (!known_.insert(e->blob.id).second) return;
      if (e->blob.kind == BlobKind::kTrailer) {
        trailer_ = e->blob;
        have_trailer_ = true;
      } else if (options_.store_plain && e->blob.kind == BlobKind::kChunk) {
        awaiting_.insert(e->blob.id);  // put once the driver named its plain form
        out->push_back(action::Transcode{kNoNode, e->blob});
      } else {
        queue_.push_back(e->blob);
      }
    } else if (const auto* e = std::get_if<event::BlobReencoded>(&ev)) {
      if (e->to != kNoNode || awaiting_.erase(e->blob.id) == 0) return;
      if (e->plain) plain_.insert(e->blob.id);
      queue_.push_back(e->blob);
    } else if (const auto* e = std::get_if<event::PutDone>(&ev)) {
      --inflight_;
      if (e->ok) {
        if (have_trailer_ && e->blob == trailer_.id) {
          published_ = true;
          out->push_back(action::Published{});
          return;
        }
        ++stored_;
      } else {
        int attempt = ++attempts_[e->blob];
        if (attempt > options_.max_retries) {
          failed_ = true;
          out->push_back(action::Fail{StatusCode::kUnavailable,
                                      Fmt("put of blob %llu failed %d times: %s", (ULL)e->blob,
                                          attempt, e->message.c_str())});
          return;
        }
        BlobInfo b = infos_.at(e->blob);
        timers_.Add(now + Backoff(options_, attempt), [this, b] { queue_.push_front(b); });
      }
    } else if (std::holds_alternative<event::TimerFired>(ev)) {
      timers_.Disarm();
      timers_.Fire(now);
    }
    Pump(out);
    timers_.Arm(out);
  }

 private:
  void Pump(std::vector<Action>* out) {
    while (!queue_.empty() && inflight_ < options_.max_parallel_puts) {
      BlobInfo b = queue_.front();
      queue_.pop_front();
      StartPut(b, out);
    }
    // The trailer goes last: its presence publishes the stream.
    if (have_trailer_ && !trailer_started_ && inflight_ == 0 && queue_.empty() &&
        stored_ == trailer_.id) {
      trailer_started_ = true;
      StartPut(trailer_, out);
    }
  }
  void StartPut(const BlobInfo& b, std::vector<Action>* out) {
    infos_[b.id] = b;
    ++inflight_;
    out->push_back(action::Put{b, ObjectKey(options_.prefix, b), plain_.count(b.id) != 0});
  }

  RelayOptions options_;
  std::set<BlobId> known_;
  std::set<BlobId> awaiting_;  // store_plain: chunks whose Transcode is not answered yet
  std::set<BlobId> plain_;     // store_plain: chunks put in their plain form
  std::map<BlobId, BlobInfo> infos_;
  std::map<BlobId, int> attempts_;
  std::deque<BlobInfo> queue_;
  BlobInfo trailer_;
  bool have_trailer_ = false, trailer_started_ = false;
  int inflight_ = 0;
  uint64_t stored_ = 0;
  bool published_ = false, failed_ = false;
  RetryTimers timers_;
};

// ---- object store downloader ----

class DownloaderPolicy : public NodePolicy {
 public:
  explicit DownloaderPolicy(const RelayOptions& o)
      : options_(o), applier_(o.max_parallel_applies) {}
  NodeRole role() const override { return NodeRole::kDownloader; }
  bool done() const override { return applier_.committed() || failed_; }
  bool failed() const override { return failed_; }

  void Handle(TimePoint now, const Event& ev, std::vector<Action>* out) override {
    if (failed_ || applier_.committed()) return;
    std::visit(
        Overloaded{
            [&](const event::Start&) {
              last_progress_ = now;
              StartList(out);
            },
            [&](const event::ListDone& e) {
              listing_ = false;
              if (!e.ok) {
                int attempt = ++list_attempts_;
                if (attempt > options_.max_retries) {
                  Fail(StatusCode::kUnavailable,
                       Fmt("list of '%s' failed %d times: %s", options_.prefix.c_str(), attempt,
                           e.message.c_str()),
                       out);
                  return;
                }
                timers_.Add(now + Backoff(options_, attempt), [this] { list_due_ = true; });
                return;
              }
              list_attempts_ = 0;
              for (const auto& b : e.blobs) {
                if (!known_.emplace(b.id, b).second) continue;
                last_progress_ = now;
                if (b.kind == BlobKind::kTrailer) {
                  have_trailer_ = true;
                  // Ids are dense and the trailer is stored last: every chunk key is known now,
                  // even where a listing lags behind (eventually consistent stores).
                  for (BlobId id = 1; id < b.id; ++id) {
                    BlobInfo c{id, BlobKind::kChunk, 0};
                    if (known_.emplace(id, c).second) queue_.push_back(c);
                  }
                  BlobInfo h{0, BlobKind::kHeader, 0};
                  if (b.id > 0 && known_.emplace(0, h).second) queue_.push_back(h);
                }
                queue_.push_back(b);
              }
              if (!have_trailer_) {
                if (now - last_progress_ > options_.poll_timeout_s) {
                  Fail(StatusCode::kDeadlineExceeded,
                       Fmt("no new object under '%s' for %.1f s (trailer never appeared)",
                           options_.prefix.c_str(), now - last_progress_),
                       out);
                  return;
                }
                timers_.Add(now + options_.poll_interval_s, [this] { list_due_ = true; });
              }
            },
            [&](const event::FetchDone& e) {
              --inflight_;
              auto it = known_.find(e.blob);
              if (it == known_.end()) return;
              if (!e.ok) {
                int attempt = ++attempts_[e.blob];
                if (attempt > options_.max_retries) {
                  Fail(StatusCode::kUnavailable,
                       Fmt("fetch of %s failed %d times: %s",
                           ObjectKey(options_.prefix, it->second).c_str(), attempt,
                           e.message.c_str()),
                       out);
                  return;
                }
                BlobInfo b = it->second;
                timers_.Add(now + Backoff(options_, attempt), [this, b] { queue_.push_front(b); });
                return;
              }
              applier_.Ready(it->second);
            },
            [&](const event::ApplyDone& e) {
              if (!e.ok) {
                Fail(e.code, Fmt("apply of blob %llu failed: %s", (ULL)e.blob, e.message.c_str()),
                     out);
                return;
              }
              applier_.Done(e.blob, out);
            },
            [&](const event::TimerFired&) {
              timers_.Disarm();
              timers_.Fire(now);
            },
            [](const auto&) {},
        },
        ev);
    if (failed_ || applier_.committed()) return;
    if (list_due_ && !listing_) {
      list_due_ = false;
      StartList(out);
    }
    while (!queue_.empty() && inflight_ < options_.max_parallel_fetches) {
      BlobInfo b = queue_.front();
      queue_.pop_front();
      ++inflight_;
      out->push_back(action::Fetch{b, ObjectKey(options_.prefix, b)});
    }
    applier_.Pump(out);
    timers_.Arm(out);
  }

 private:
  void StartList(std::vector<Action>* out) {
    listing_ = true;
    out->push_back(action::List{options_.prefix});
  }
  void Fail(StatusCode code, std::string message, std::vector<Action>* out) {
    failed_ = true;
    out->push_back(action::Fail{code, std::move(message)});
  }

  RelayOptions options_;
  ApplyScheduler applier_;
  std::map<BlobId, BlobInfo> known_;
  std::map<BlobId, int> attempts_;
  std::deque<BlobInfo> queue_;
  int inflight_ = 0;
  int list_attempts_ = 0;
  bool listing_ = false, list_due_ = false, have_trailer_ = false, failed_ = false;
  TimePoint last_progress_ = 0;
  RetryTimers timers_;
};

}  // namespace

std::unique_ptr<NodePolicy> MakeTreePolicy(const Topology& topology, NodeId self,
                                           const RelayOptions& options) {
  return std::make_unique<TreePolicy>(topology, self, options);
}
std::unique_ptr<NodePolicy> MakeUploaderPolicy(const RelayOptions& options) {
  return std::make_unique<UploaderPolicy>(options);
}
std::unique_ptr<NodePolicy> MakeDownloaderPolicy(const RelayOptions& options) {
  return std::make_unique<DownloaderPolicy>(options);
}

}  // namespace dcr
