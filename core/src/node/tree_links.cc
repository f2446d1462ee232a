// TreeLinks (tree_links.h).
#include "node/tree_links.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dcr/delta.h"
#include "dcr/node.h"
#include "dcr/receiver.h"
#include "dcr/recovery_policy.h"
#include "dcr/relay_policy.h"
#include "dcr/status.h"
#include "dcr/status_macros.h"
#include "dcr/statusor.h"
#include "node/commit_reports.h"
#include "node/held_hellos.h"
#include "node/metrics.h"
#include "node/node_state.h"
#include "transport/frame_reader.h"
#include "transport/heartbeat.h"
#include "transport/net.h"

namespace dcr::internal {

namespace {

// Children this process counted lost while connecting, by (run, rank): a later version tries
// such a child for kLostChildRetryS only, so an absent host costs its parent the join deadline
// once, not at every version. A child that connects again leaves the set.
constexpr double kLostChildRetryS = 1.0;

class LostChildren {
 public:
  static LostChildren& Process() {
    static LostChildren* lost = new LostChildren();
    return *lost;
  }
  bool Contains(uint64_t run, NodeId child) {
    std::lock_guard<std::mutex> lock(mu_);
    return lost_.count({run, child}) > 0;
  }
  void Set(uint64_t run, NodeId child, bool lost) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (lost) {
        lost_.insert({run, child});
      } else {
        lost_.erase({run, child});
      }
    }
    MetricsBoard::Process().SetLostChild(child, lost);  // /metrics and /healthz name it
  }

 private:
  std::mutex mu_;
  std::set<std::pair<uint64_t, NodeId>> lost_;
};

}  // namespace

Status TreeLinks::Open(const std::vector<Link>& links, double deadline) {
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
  // Each child's streams are set up on a thread of their own while this one waits for the
  // parent, so a child that is slow to come (or never comes) does not keep the parent waiting
  // for this node's hello; the children hear heartbeats from the moment their link is up,
  // however long the parent takes.
  heartbeats_ = std::make_unique<internal::Heartbeats>(plan_.heartbeat_interval_s);
  heartbeats_->Start();
  std::vector<ChildSetup> setups;
  for (const Link& l : links) {
    if (l.to_child) setups.push_back(ChildSetup{&l});
  }
  std::vector<std::thread> connecting;
  for (ChildSetup& c : setups) {
    connecting.emplace_back([this, &c, deadline] { ConnectChild(&c, deadline); });
  }
  Status parent_status;
  if (parent != nullptr) {
    parent_status = AcceptParent(*parent, listen_fd, deadline);
    if (parent_status.ok() && parent_writer_) {
      heartbeats_->Add(parent_writer_.get(), Frame(FrameType::kHeartbeat));
    }
  }
  for (std::thread& t : connecting) t.join();
  Status child_error;
  for (ChildSetup& c : setups) {
    if (!c.error.ok() && child_error.ok()) child_error = c.error;
  }
  // Every link is kept (its writers are watched by the heartbeats) until Close. A refusal the
  // parent forwarded while the children were connecting goes to each as its link joins.
  for (ChildSetup& c : setups) {
    if (c.lost) queue_->Post(std::move(*c.lost));
    const bool reading = !c.link.conns.empty() && child_error.ok();
    Conn* conn0 = reading ? c.link.conns[0].get() : nullptr;
    const NodeId id = c.link.id;
    {
      std::lock_guard<std::mutex> lock(abort_mu_);
      children_.push_back(std::move(c.link));
      if (abort_ != nullptr) SendAbort(&children_.back());
    }
    if (reading) readers_.emplace_back([this, id, conn0] { ChildReader(id, conn0); });
  }
  return child_error.ok() ? parent_status : child_error;
}

void TreeLinks::ConnectChild(ChildSetup* c, double deadline) {
  const Link& l = *c->link_spec;
  const int me = plan_.rank;
  const bool long_edges = me == 0 && plan_.emulate_wan;
  LostChildren& lost_children = LostChildren::Process();
  const bool was_lost = lost_children.Contains(plan_.run_id, l.peer);
  // With recovery a child that does not come within the join deadline (receiver_deadline_s;
  // kLostChildRetryS for one already counted lost) is lost for this version: its subtree takes
  // the version from the store, and it catches up when it comes. Without recovery the node
  // waits for it until the version's deadline.
  double child_deadline = deadline;
  if (recover_) {
    const double join = was_lost ? kLostChildRetryS : plan_.receiver_deadline_s;
    child_deadline = std::min(deadline, internal::SteadyNow() + join);
  }
  c->link.id = l.peer;
  for (int s = 0; s < l.streams; ++s) {
    auto conn = internal::ConnectTo(plan_.addresses[l.peer], child_deadline, link_tls_.get(),
                                    l.peer, kHelloTimeoutS);
    if (conn.ok()) (*conn)->SetIdleTimeout(plan_.read_deadline_s);
    if (!conn.ok() && recover_ && !conn.status().IsFailedPrecondition()) {
      // A child that dies while its link is set up (e.g. mid-handshake), or never comes, is
      // lost as one that dies mid-stream: the recovery policy acts on it (its subtree takes the
      // version from the store), and the link carries nothing (Send answers SendFailed). A
      // certificate refusal still ends the node.
      c->lost = event::SendFailed{
          l.peer, "node " + std::to_string(l.peer) + " (" + plan_.addresses[l.peer] +
                      ") lost while connecting: " + conn.status().message()};
      if (!was_lost) {
        std::fprintf(stderr, "node %d: %s\n", me, c->lost->message.c_str());
        lost_children.Set(plan_.run_id, l.peer, true);
      }
      c->link.writers.clear();
      c->link.conns.clear();
      return;
    }
    if (!conn.ok()) {
      c->error = Status(
          conn.status().IsFailedPrecondition() ? conn.status().code() : StatusCode::kUnavailable,
          "node " + std::to_string(me) + ": child node " + std::to_string(l.peer) + " at " +
              plan_.addresses[l.peer] + ": " + conn.status().message());
      return;
    }
    FrameHeader hello = Frame(FrameType::kHello);
    hello.stream = static_cast<uint32_t>(s);
    hello.blob = static_cast<uint64_t>(l.streams);
    Status w = (*conn)->Write(&hello, sizeof(hello));
    if (!w.ok()) {
      c->error = w;
      return;
    }
    c->link.writers.push_back(std::make_unique<FrameWriter>(
        conn->get(), long_edges ? long_bucket_ : nullptr, long_edges ? plan_.long_latency_s : 0.0,
        plan_.relay.window_bytes));
    c->link.conns.push_back(std::move(*conn));
  }
  // Heartbeats once every stream is up: a link lost part way is cleared above, and the
  // heartbeats keep every writer they watch until Close.
  for (size_t s = 0; s < c->link.writers.size(); ++s) {
    AddChildHeartbeat(c->link.writers[s].get(), static_cast<int>(s));
  }
  if (was_lost) {
    std::fprintf(stderr, "node %d: node %d (%s) is back\n", me, l.peer,
                 plan_.addresses[l.peer].c_str());
    lost_children.Set(plan_.run_id, l.peer, false);
  }
}

Status TreeLinks::TurnAwayParent(const Link& parent, double deadline) {
  DCR_RETURN_IF_ERROR(LoadCredentials());
  auto listening = ListenOnOwnAddress();
  if (!listening.ok()) {  // the parent then finds out at its deadline, as without this
    std::fprintf(stderr, "node %d: not listening while restarted: %s\n", plan_.rank,
                 listening.status().ToString().c_str());
    return Status();
  }
  const int listen_fd = *listening;
  turn_away_ =
      std::thread([this, listen_fd, deadline, peer = parent.peer, streams = parent.streams] {
        const int me = plan_.rank;
        internal::HeldHellos& held = internal::HeldHellos::Process();
        auto later = [&](const FrameHeader& h, const internal::TlsIdentity* id) {
          return internal::HeldHellos::IsLater(h, id, plan_.run_id, plan_.version, peer, streams);
        };
        auto refuse = [&](const FrameHeader& h, const internal::TlsIdentity* id) {
          if (!later(h, id) && static_cast<int>(h.from_rank) == peer) {
            std::fprintf(stderr,
                         "node %d: turned parent node %d away: this node restarted and "
                         "takes version %llu from the store\n",
                         me, peer, static_cast<unsigned long long>(plan_.version));
          }
          return false;
        };
        auto hold = [&](internal::Hello* h) {
          if (!later(h->header, h->conn->tls() ? &h->conn->peer() : nullptr)) return false;
          std::fprintf(stderr,
                       "node %d: kept parent node %d's connection for version %llu (this "
                       "node is in version %llu)\n",
                       me, peer, static_cast<unsigned long long>(h->header.version),
                       static_cast<unsigned long long>(plan_.version));
          held.Keep(me, h);
          return true;
        };
        (void)internal::AcceptHellos(
            listen_fd, 1, deadline, kHelloTimeoutS, link_tls_.get(), refuse, nullptr,
            [this] { return stopping_.load(); }, hold);
        // Still listening: the next version's wait takes it, with what came in the meantime.
        held.KeepListener(me, plan_.addresses[me], listen_fd);
      });
  return Status();
}

Status TreeLinks::LeaveChildren(const std::vector<Link>& links) {
  DCR_RETURN_IF_ERROR(LoadCredentials());
  for (const Link& l : links) {
    if (!l.to_child) continue;
    leaving_.emplace_back([this, l] {
      for (int s = 0; s < l.streams && !stopping_; ++s) {
        auto conn = internal::ConnectTo(plan_.addresses[l.peer], SteadyNow() + 1.0, link_tls_.get(),
                                        l.peer, 2.0);
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

Status TreeLinks::LoadCredentials() {
  const int me = plan_.rank;
  if (tls_ != nullptr) return Status();
  if (!plan_.tls_ca.empty() || !plan_.tls_cert.empty() || !plan_.tls_key.empty()) {
    DCR_ASSIGN_OR_RETURN(tls_,
                         internal::TlsContext::Load(plan_.tls_ca, plan_.tls_cert, plan_.tls_key));
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

Status TreeLinks::Send(const action::Send& s, const BlobPtr& b) {
  ChildLink* link = FindChild(s.to);
  if (link != nullptr && link->writers.empty()) {  // lost while its link was set up
    queue_->Post(event::SendFailed{
        s.to, "node " + std::to_string(s.to) + " (" + plan_.addresses[s.to] + ") lost"});
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
  link->writers[s.stream]->Send(
      h, b->bytes.data() + s.offset, b, [this, send, long_link](Status st) {
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

void TreeLinks::SendReport(const internal::ReportRecord* own) {
  if (!parent_writer_) return;
  std::vector<internal::ReportRecord> records;
  if (own != nullptr) records.push_back(*own);
  for (auto& r : reports_.records()) records.push_back(std::move(r));
  auto payload = std::make_shared<std::vector<uint8_t>>(internal::EncodeReportPayload(records));
  FrameHeader h = Frame(FrameType::kReport);
  h.blob = records.size();
  h.length = payload->size();
  parent_writer_->Send(h, payload->data(), payload, [](Status) {});
}

void TreeLinks::AbortChildren(const std::string& reason) {
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (abort_ != nullptr || children_closed_) return;
  abort_ = std::make_shared<const std::string>(reason.substr(0, internal::kMaxAbortMessageBytes));
  for (auto& c : children_) SendAbort(&c);
}

void TreeLinks::SendAbort(ChildLink* c) {
  if (c->writers.empty()) return;
  FrameHeader h = Frame(FrameType::kAbort);
  h.length = abort_->size();
  c->writers[0]->Send(h, reinterpret_cast<const uint8_t*>(abort_->data()), abort_, [](Status) {});
}

void TreeLinks::Close() {
  if (closed_) return;
  closed_ = true;
  stopping_ = true;
  if (heartbeats_) heartbeats_->Stop();
  if (parent_writer_) parent_writer_->Close();
  {
    std::lock_guard<std::mutex> lock(abort_mu_);  // a refusal arriving now is not sent
    children_closed_ = true;
    for (auto& c : children_) {
      for (auto& w : c.writers) w->Close();
    }
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

FrameHeader TreeLinks::Frame(FrameType type) const {
  FrameHeader h;
  h.type = static_cast<uint8_t>(type);
  h.from_rank = static_cast<uint32_t>(plan_.rank);
  h.run = plan_.run_id;
  h.version = plan_.version;
  return h;
}

void TreeLinks::AddChildHeartbeat(FrameWriter* writer, int stream) {
  FrameHeader h = Frame(FrameType::kHeartbeat);
  h.stream = static_cast<uint32_t>(stream);
  std::function<void(Status)> counted;
  if (plan_.rank == 0 && plan_.emulate_wan) {
    counted = [this](Status st) {
      if (st.ok()) state_->Update([](NodeResult* r) { r->bytes_sent_long += sizeof(FrameHeader); });
    };
  }
  heartbeats_->Add(writer, h, std::move(counted));
}

TreeLinks::ChildLink* TreeLinks::FindChild(NodeId id) {
  for (auto& c : children_) {
    if (c.id == id) return &c;
  }
  return nullptr;
}

StatusOr<int> TreeLinks::ListenOnOwnAddress() {
  const int kept =
      internal::HeldHellos::Process().TakeListener(plan_.rank, plan_.addresses[plan_.rank]);
  if (kept >= 0) return kept;
  return internal::Listen(plan_.addresses[plan_.rank]);
}

Status TreeLinks::AcceptParent(const Link& parent, int listen_fd, double deadline) {
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
        static_cast<int>(h.from_rank) != parent.peer || h.blob != static_cast<uint64_t>(expected) ||
        h.stream >= static_cast<uint32_t>(expected) || seen[h.stream]) {
      std::fprintf(stderr,
                   "node %d: dropped a connection without a valid hello from parent "
                   "node %d\n",
                   me, parent.peer);
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
    std::fprintf(stderr,
                 "node %d: kept parent node %d's connection for version %llu (this "
                 "node is in version %llu)\n",
                 me, parent.peer, static_cast<unsigned long long>(h->header.version),
                 static_cast<unsigned long long>(plan_.version));
    held.Keep(me, h);
    return true;
  };
  StatusOr<std::vector<internal::Hello>> hellos = std::vector<internal::Hello>();
  if (static_cast<int>(taken.size()) < expected) {
    hellos = internal::AcceptHellos(listen_fd, expected - static_cast<int>(taken.size()), deadline,
                                    kHelloTimeoutS, link_tls_.get(), is_parent_hello, refused,
                                    recover_ ? parent_gone_ : nullptr, hold);
  }
  if (hellos.ok()) {
    for (auto& h : taken) hellos->push_back(std::move(h));
  }
  if (!hellos.ok() && hellos.status().code() == StatusCode::kAborted) {
    // The tree went on without this node: its parent is lost, as one that died mid-stream.
    close(listen_fd);
    std::fprintf(stderr,
                 "node %d: parent node %d never connected and the stream is whole in "
                 "the store: parent lost (%s)\n",
                 me, parent.peer, hellos.status().message().c_str());
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

void TreeLinks::ParentReader(NodeId parent, Conn* conn) {
  ParentFrameReader reader(conn, parent, plan_.run_id, plan_.version,
                           [this](BlobKind kind) { return MaxBlobBytes(plan_, kind); });
  const std::string me = "node " + std::to_string(plan_.rank);
  const std::string from = "parent node " + std::to_string(parent);
  while (true) {
    ParentFrame f;
    Status s;
    const ParentFrameReader::Outcome outcome = reader.Next(&f, &s);
    if (outcome == ParentFrameReader::Outcome::kLost && recover_) {
      if (!stopping_) queue_->PostRecovery(recovery::ParentLost{parent, kNoNode});
      return;
    }
    if (outcome == ParentFrameReader::Outcome::kOversized) {
      queue_->Fatal(DataLossError(me + ": " + from + " " + s.message()));
      return;
    }
    if (outcome != ParentFrameReader::Outcome::kFrame) {
      if (!stopping_) {
        queue_->Fatal(UnavailableError(me + ": " + from + " (" + plan_.addresses[parent] +
                                       "): " + s.message()));
      }
      return;
    }
    if (f.type == ParentFrame::Type::kAbort) {
      // Forwarded down before this node stops, so the whole subtree reports the cause. The
      // children then close their connections: stopping_ keeps that from being reported as
      // a lost child, whichever event the loop sees first.
      stopping_ = true;
      AbortChildren(f.reason);
      queue_->Fatal(AbortedError(me + ": the refit was refused upstream (received from node " +
                                 std::to_string(f.from_rank) + "): " + f.reason));
      return;
    }
    const BlobInfo& info = f.info;
    if (ingress_ != nullptr && ingress_->Whole(info.id)) {
      // A duplicate of a blob the edge relay holds whole (perhaps transcoded): dropped.
      std::vector<uint8_t> skip(f.length);
      s = conn->Read(skip.data(), skip.size());
      if (s.ok()) continue;
    }
    BlobPtr b = s.ok() ? state_->GetOrCreate(info) : nullptr;
    if (!s.ok()) {
      if (recover_ && !stopping_) queue_->PostRecovery(recovery::ParentLost{parent, kNoNode});
      if (!recover_ && !stopping_) {
        queue_->Fatal(UnavailableError(me + ": " + from + " lost mid-piece: " + s.message()));
      }
      return;
    }
    if (b == nullptr) {
      queue_->Fatal(ResourceExhaustedError("node " + std::to_string(plan_.rank) +
                                           ": out of memory for blob " + std::to_string(info.id) +
                                           " of " + std::to_string(info.size) + " bytes"));
      return;
    }
    if (b->info.size != info.size) {
      queue_->Fatal(
          DataLossError("parent sent blob " + std::to_string(info.id) + " with two sizes"));
      return;
    }
    s = conn->Read(b->bytes.data() + f.offset, f.length);
    if (!s.ok() && recover_) {
      if (!stopping_) queue_->PostRecovery(recovery::ParentLost{parent, kNoNode});
      return;
    }
    if (!s.ok()) {
      if (!stopping_) {
        queue_->Fatal(UnavailableError(me + ": " + from + " lost mid-piece: " + s.message()));
      }
      return;
    }
    const double now = WallNow();
    state_->MarkHeld(info.id, f.offset, f.length);
    // An edge relay's pieces are of another form than the store's: not kept for a restart.
    if (ingress_ == nullptr) state_->Persist(info, f.offset, b->bytes.data() + f.offset, f.length);
    state_->Update([&](NodeResult* r) {
      NodeState::MarkBlob(r, now);
      r->bytes_received += f.length;
    });
    if (ingress_ != nullptr) {
      ingress_->Piece(info, f.offset, std::shared_ptr<const std::vector<uint8_t>>(b, &b->bytes));
    } else {
      queue_->Post(event::DataReceived{info, f.offset, f.length});
    }
  }
}

void TreeLinks::ChildReader(NodeId child, Conn* conn) {
  bool reported = false;
  while (true) {
    FrameHeader h;
    Status s = conn->Read(&h, sizeof(h));
    std::string why;
    if (s.ok() && h.magic == internal::kFrameMagic) why = Mismatch(h);
    if (!s.ok() || h.magic != internal::kFrameMagic || !why.empty()) {
      if (!reported && !stopping_) {
        queue_->Post(event::SendFailed{child, "node " + std::to_string(child) + " (" +
                                                  plan_.addresses[child] + ") lost: " +
                                                  (!s.ok()       ? s.message()
                                                   : why.empty() ? "bad frame"
                                                                 : "refused: " + why)});
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
                                                    plan_.addresses[child] + "): " + rs.message()});
        }
        return;
      }
      // After a committed report the child may close; after a failure its close is the
      // failure the parent acts on.
      if (committed) reported = true;
    }
  }
}

Status TreeLinks::ReadReport(NodeId child, Conn* conn, const FrameHeader& h,
                             bool* committed_report) {
  const uint64_t cap = internal::MaxReportPayloadBytes(plan_.parents.size());
  if (h.length > cap) {
    return DataLossError("commit report of " + std::to_string(h.length) + " bytes, more than the " +
                         std::to_string(cap) + " bytes a tree of this size needs");
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

}  // namespace dcr::internal
