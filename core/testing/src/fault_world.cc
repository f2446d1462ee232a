// The fault-injection harness: the real transport policies, recovery policies, codec, object
// store and journaled receivers on a deterministic discrete-event clock, with faults injected by
// the driver. The harness decides nothing about recovery: it injects a fault, reports what a
// real node's transport and supervisor would see (a lost link, a failed stream, a restart with
// its journal) to the node's RecoveryPolicy, and carries out the actions it returns as the
// policy's RecoveryEnvironment (HarnessRecovery).
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <set>

#include "dcr/apply.h"
#include "dcr/delta.h"
#include "dcr/hash.h"
#include "dcr/journal.h"
#include "dcr/object_store.h"
#include "dcr/policy_host.h"
#include "dcr/receiver.h"
#include "dcr/recovery_policy.h"
#include "dcr/relay_policy.h"
#include "dcr/status_macros.h"
#include "dcr/testing/fault_injection.h"
#include "dcr/versioning.h"
#include "internal/str_format.h"

namespace dcr {

namespace {

using internal::Fmt;

// Captures the blobs of a delta stream in order.
class BlobSink : public DeltaSink {
 public:
  Status OnHeader(const std::vector<uint8_t>& b) override { return Add(BlobKind::kHeader, b); }
  Status OnChunk(const ChunkHeader& h, const std::vector<uint8_t>& b) override {
    chunk_ids.push_back(h.chunk_id);
    return Add(BlobKind::kChunk, b);
  }
  Status OnTrailer(const std::vector<uint8_t>& b) override { return Add(BlobKind::kTrailer, b); }
  std::vector<std::vector<uint8_t>> blobs;
  std::vector<BlobInfo> infos;
  std::vector<uint64_t> chunk_ids;  // per chunk blob, in order

 private:
  Status Add(BlobKind k, const std::vector<uint8_t>& b) {
    infos.push_back(BlobInfo{static_cast<BlobId>(blobs.size()), k, b.size()});
    blobs.push_back(b);
    return Status::OK();
  }
};

// Inner receiver of a node: a BufferReceiver that can be told to die inside a chunk, leaving
// the first half of the chunk's changes written and the journal frozen (a process kill).
class CrashableReceiver : public Receiver {
 public:
  CrashableReceiver(std::vector<TensorBuffer> bufs, std::vector<ReceiverTensor> tensors,
                    VersionId held, ReceiverJournal* journal)
      : bufs_(std::move(bufs)), inner_(std::move(tensors), held), journal_(journal) {}
  void ArmCrash(uint64_t chunk_id) {
    armed_ = true;
    crash_chunk_ = chunk_id;
  }
  bool crashed() const { return crashed_; }
  Status Begin(const uint8_t* h, size_t n) override { return inner_.Begin(h, n); }
  Status ApplyRecord(const uint8_t* record, size_t size) override {
    if (!armed_) return inner_.ApplyRecord(record, size);
    StatusOr<DecodedChunk> dc = DecodeChunk(record, size);
    if (!dc.ok() || dc->header.chunk_id != crash_chunk_) return inner_.ApplyRecord(record, size);
    // Write half of the changes without checks, then die.
    const DecodedChunk& c = *dc;
    const ChunkHeader& h = c.header;
    const int w = h.elem_width;
    const bool dense = h.position_mode == PositionMode::kDense;
    SegmentCursor cur(h.segments);
    for (uint64_t k = 0; k < c.values.size() / 2; ++k) {
      uint32_t seg;
      uint64_t e;
      cur.Locate(dense ? k : c.positions[k], &seg, &e);
      const TensorBuffer& tb = bufs_[h.segments[seg].tensor_index];
      uint64_t old = LoadBits(tb.data, w, e);
      uint64_t v = ApplyValue(h.value_mode, w, old, c.values[k]);
      std::memcpy(tb.data + e * static_cast<uint64_t>(w), &v, static_cast<size_t>(w));
    }
    journal_->Freeze();
    crashed_ = true;
    armed_ = false;
    return AbortedError("fault injection: process killed inside chunk " +
                        std::to_string(crash_chunk_));
  }
  Status Commit(const uint8_t* t, size_t n) override { return inner_.Commit(t, n); }
  void Abort() override { inner_.Abort(); }
  Status MarkApplied(uint64_t id, const Hash128& d) override { return inner_.MarkApplied(id, d); }
  Status Verify(const Checkpoint& target) const override { return inner_.Verify(target); }
  VersionId held() const override { return inner_.held(); }
  bool in_delta() const override { return inner_.in_delta(); }
  std::vector<uint64_t> MissingChunks(const Trailer& t) const override {
    return inner_.MissingChunks(t);
  }

 private:
  std::vector<TensorBuffer> bufs_;
  BufferReceiver inner_;
  ReceiverJournal* journal_;
  bool armed_ = false;
  bool crashed_ = false;
  uint64_t crash_chunk_ = 0;
};

struct Fault {
  FaultSpec spec;
  bool fired = false;  // injected (counted)
  bool done = false;   // no longer matches
  int remaining = 0;   // store write failures left
};

// Policy slots of a node: events and timers are addressed to one of them.
constexpr int kStreamSlot = 0;    // tree or downloader policy
constexpr int kUploadSlot = 1;    // sender: uploader policy
constexpr int kRecoverySlot = 2;  // RecoveryPolicy timers

struct Node {
  int id = 0;
  bool alive = true;
  uint64_t incarnation = 0;
  bool store_mode = false;               // out of the tree (downloading, or committed and gone)
  bool tree_dead = false;                // sender: tree policy failed or killed
  std::unique_ptr<NodePolicy> policy;    // tree or downloader
  std::unique_ptr<NodePolicy> uploader;  // sender only
  // Every recovery decision; lives as long as the node's supervisor (across restarts).
  std::unique_ptr<RecoveryPolicy> recovery;
  uint64_t timer_gen[3] = {0, 0, 0};
  std::map<BlobId, std::vector<uint8_t>> blobs;
  // Receiver state.
  std::vector<std::vector<uint8_t>> bufs;
  std::string journal_path;
  std::unique_ptr<ReceiverJournal> journal;
  std::unique_ptr<CrashableReceiver> inner;
  std::unique_ptr<JournaledReceiver> ja;
  bool storage_lost = false;  // killed with its memory lost; the restart reports it
  bool restarting = false;    // the supervisor is restarting it (RestartNode)
  int chunk_applies = 0;
  bool committed = false;
  bool crashed_now = false;
};

struct QEvent {
  int node = 0;
  uint64_t incarnation = 0;
  int slot = kStreamSlot;
  enum Type { kPolicy, kProduce, kRestart, kSenderRestart } type = kPolicy;
  Event ev;
  uint64_t timer_gen = 0;
  bool is_timer = false;
  std::vector<uint8_t> bytes;  // DataReceived piece
  uint64_t arg = 0;
};

struct ApplyResult {
  bool ok = true;
  bool crashed = false;
  StatusCode code = StatusCode::kOk;
  std::string message;
};

class World;

// The environment of one node's policy for one event: forwards each action to World::Do, and
// drops the rest of the batch once the node died or its policy was replaced meanwhile (a crash
// ends what the node was doing).
class HarnessEnv : public NodeEnvironment {
 public:
  HarnessEnv(World* world, int node, int slot, uint64_t incarnation, const NodePolicy* policy)
      : world_(world), node_(node), slot_(slot), incarnation_(incarnation), policy_(policy) {}
  void SetTimer(TimePoint at) override { Do(action::SetTimer{at}); }
  void Send(const action::Send& s) override { Do(s); }
  void Ack(const action::Ack& a) override { Do(a); }
  void ReportCommit(const action::ReportCommit& r) override { Do(r); }
  void Apply(const action::Apply& a) override { Do(a); }
  void Release(BlobId blob) override { Do(action::Release{blob}); }
  void Put(const action::Put& p) override { Do(p); }
  void List(const action::List& l) override { Do(l); }
  void Fetch(const action::Fetch& f) override { Do(f); }
  void Committed() override { Do(action::Commit{}); }
  void TreeCommitted(int receivers) override { Do(action::TreeCommitted{receivers}); }
  void Published() override { Do(action::Published{}); }
  void Transcode(const action::Transcode& t) override { Do(t); }
  void EdgeLag(const action::EdgeLag& l) override { Do(l); }
  void Failed(const Status& s) override { Do(action::Fail{s.code(), s.message()}); }

 private:
  void Do(const Action& a);

  World* world_;
  int node_, slot_;
  uint64_t incarnation_;
  const NodePolicy* policy_;
};

// The recovery environment of one node: each call is World's execution of that action. An
// overwrite form is requested only while a chunk is being applied; `overwrite` carries it out
// there.
class HarnessRecovery : public RecoveryEnvironment {
 public:
  using OverwriteFn = std::function<void(uint64_t chunk_id, const std::string& key)>;
  HarnessRecovery(World* world, int node, OverwriteFn overwrite)
      : world_(world), node_(node), overwrite_(std::move(overwrite)) {}
  void SetTimer(TimePoint at) override;
  void FallBackToStore(const std::string& reason) override;
  void LeaveTree() override;
  void StartDownload() override;
  void Reparent(NodeId to) override;
  void ReloadCommitted() override;
  void RequestOverwrite(uint64_t chunk_id, const std::string& key) override;
  void StopUpload() override;
  void Republish() override;
  void GiveUp(const std::string& message) override;

 private:
  World* world_;
  int node_;
  OverwriteFn overwrite_;
};

class World {
 public:
  World(const Checkpoint& base, const Checkpoint& target, const DeltaOptions& dopts,
        const std::vector<FaultSpec>& faults, const FaultRunOptions& opts)
      : base_(base), target_(target), dopts_(dopts), opts_(opts), rng_(opts.seed) {
    for (const FaultSpec& f : faults) {
      Fault x;
      x.spec = f;
      x.remaining = f.count;
      faults_.push_back(x);
    }
  }

  StatusOr<FaultRunReport> Run();

 private:
  // ---- setup ----
  Status Setup();
  Status BuildStream(BlobSink* sink);
  std::vector<TensorBuffer> Buffers(Node& n) {
    std::vector<TensorBuffer> out;
    for (size_t i = 0; i < n.bufs.size(); ++i) {
      out.push_back({n.bufs[i].data(), inv_.tensors[i].num_elements(), inv_.tensors[i].width(),
                     inv_.salts[i]});
    }
    return out;
  }
  Status OpenReceiver(Node& n);
  void ResolveFaults();

  // ---- event loop ----
  void Schedule(double t, QEvent e) {
    e.incarnation = e.incarnation ? e.incarnation : nodes_[e.node].incarnation;
    queue_.emplace(std::make_pair(t, seq_++), std::move(e));
  }
  void PolicyEvent(double t, int node, int slot, Event ev) {
    QEvent q;
    q.node = node;
    q.slot = slot;
    q.ev = std::move(ev);
    q.incarnation = nodes_[node].incarnation;
    Schedule(t, std::move(q));
  }
  friend class HarnessEnv;
  void Deliver(int node, int slot, const Event& ev);
  void Do(int node, int slot, const Action& a);
  void DoSend(int from, const action::Send& s);
  ApplyResult Apply(Node& n, const BlobInfo& blob);

  // ---- faults and recovery ----
  // The first pending fault of kind `k` for `node` at `at_value` (or, with at_least, at any
  // ordinal <= at_value: the first opportunity at or after the seeded point).
  Fault* FindFault(FaultKind k, int node, int at_value, bool at_least = false);
  void Fire(Fault* f, const std::string& what) {
    if (!f->fired) {
      report_.log.push_back(
          Fmt("t=%.3f fault %s: %s", now_, FaultKindName(f->spec.kind), what.c_str()));
    }
    f->fired = true;
    f->done = true;
  }
  void Kill(int node, FaultKind why);
  // The supervisor restarts a killed receiver: its journal is replayed and the restart reported
  // to its recovery policy.
  void RestartNode(int node);
  // The transport of `node`'s children: their links to `node` are gone (ParentLost).
  void ChildrenLost(int node);
  void KillSender();
  // Feeds `ev` to `node`'s recovery policy (recorded in the trace) and carries out its actions
  // through HarnessRecovery; `overwrite` serves RequestOverwrite (only during an apply).
  void Recover(int node, const recovery::Event& ev,
               HarnessRecovery::OverwriteFn overwrite = nullptr);
  friend class HarnessRecovery;
  void FallBackToStore(int node, const std::string& reason);
  void LeaveTree(int node);
  void StartDownload(int node);
  void GiveUp(int node, const std::string& message);
  void ReloadCommitted(Node& n);
  void Republish();
  StatusOr<std::vector<uint8_t>> Overwrite(const std::string& key, uint64_t chunk_id);
  void OfferStaleDelta(Node& n);
  bool Partitioned() const { return now_ >= part_start_ && now_ < part_end_; }
  Status Verify(FaultRunReport* r);
  std::string Name(int node) const { return "rx" + std::to_string(node); }

  const Checkpoint& base_;
  const Checkpoint& target_;
  DeltaOptions dopts_;
  FaultRunOptions opts_;
  std::mt19937_64 rng_;
  std::vector<Fault> faults_;
  FaultRunReport report_;

  Inventory inv_;
  VersionId v0_, v1_;
  std::vector<std::vector<uint8_t>> sender_blobs_;
  std::vector<BlobInfo> infos_;
  std::vector<uint64_t> chunk_ids_;
  std::map<uint64_t, size_t> blob_of_chunk_;
  size_t num_chunks_ = 0;
  Topology topo_;
  RelayOptions relay_;
  std::unique_ptr<DirectoryStore> store_;
  std::vector<Node> nodes_;
  std::unique_ptr<CommitCoordinator> coordinator_;
  std::map<std::pair<double, uint64_t>, QEvent> queue_;
  uint64_t seq_ = 0;
  double now_ = 0;
  bool sender_alive_ = true;
  bool published_ = false;
  double part_start_ = -1, part_end_ = -1;
  std::map<std::pair<int, int>, int> reorder_until_;  // (node, 0) -> first chunk ordinal past
  std::set<std::pair<int, BlobId>> dup_apply_;        // (node, blob) to apply twice
  FaultKind pending_kill_ = FaultKind::kKillReceiverAtBoundary;
  std::unique_ptr<DeltaReader> stale_;
};

Fault* World::FindFault(FaultKind k, int node, int at_value, bool at_least) {
  for (Fault& f : faults_) {
    if (f.done || f.spec.kind != k) continue;
    if (node >= 0 && f.spec.node >= 0 && f.spec.node != node) continue;
    if (at_least ? f.spec.at > at_value : f.spec.at != at_value) continue;
    return &f;
  }
  return nullptr;
}

Status World::BuildStream(BlobSink* sink) {
  DeltaOptions o = dopts_;
  o.threads = 1;
  DCR_ASSIGN_OR_RETURN(DeltaStats st, BuildDelta(&base_, target_, o, sink));
  (void)st;
  return Status::OK();
}

Status World::OpenReceiver(Node& n) {
  DCR_ASSIGN_OR_RETURN(n.journal, ReceiverJournal::Open(n.journal_path));
  std::vector<ReceiverTensor> tensors;
  for (size_t i = 0; i < n.bufs.size(); ++i) tensors.push_back({inv_.tensors[i], n.bufs[i].data()});
  const std::optional<VersionId> held = n.journal->committed();
  n.inner = std::make_unique<CrashableReceiver>(Buffers(n), std::move(tensors), held ? *held : v0_,
                                                n.journal.get());
  n.ja = std::make_unique<JournaledReceiver>(n.inner.get(), n.journal.get());
  return Status::OK();
}

void World::ResolveFaults() {
  std::vector<int> relays, leaves;
  for (int i = 1; i < topo_.size(); ++i) {
    (topo_.children[i].empty() ? leaves : relays).push_back(i);
  }
  const int blobs = static_cast<int>(infos_.size());
  const int chunks = static_cast<int>(num_chunks_);
  for (Fault& f : faults_) {
    FaultSpec& s = f.spec;
    if (s.duration_s <= 0) s.duration_s = 0.3;
    const bool global = s.kind == FaultKind::kStoreWriteFail ||
                        s.kind == FaultKind::kPartitionLongLink ||
                        s.kind == FaultKind::kRestartSender;
    if (global) {
      s.node = -1;
    } else if (s.node < 1 || s.node >= topo_.size()) {
      if (s.kind == FaultKind::kKillRelay && !relays.empty()) {
        s.node = relays[rng_() % relays.size()];
      } else {
        s.node = 1 + static_cast<int>(rng_() % static_cast<uint64_t>(topo_.size() - 1));
      }
    }
    const bool tree = s.kind == FaultKind::kCorruptChunk || s.kind == FaultKind::kDuplicateChunk ||
                      s.kind == FaultKind::kReorderChunks || s.kind == FaultKind::kDelayChunk;
    if (s.kind == FaultKind::kRestartSender || s.kind == FaultKind::kPartitionLongLink) {
      // Seeded: in the second half of the stream, so that tree faults see traffic first.
      if (s.at < 0 || s.at >= blobs)
        s.at = blobs / 2 + static_cast<int>(rng_() % (blobs - blobs / 2));
    } else if (s.at < 0 || s.at >= chunks) {
      // Seeded tree faults in the first half of the chunks (delivered while the tree is up).
      s.at = static_cast<int>(rng_() % (tree ? std::max(1, chunks / 2) : chunks));
    }
    f.remaining = s.count;
  }
}

Status World::Setup() {
  if (opts_.work_dir.empty()) return InvalidArgumentError("fault run: work_dir is empty");
  if (opts_.receivers < 1) return InvalidArgumentError("fault run: receivers must be >= 1");
  std::error_code ec;
  std::filesystem::create_directories(opts_.work_dir, ec);
  if (ec)
    return UnavailableError("fault run: cannot create " + opts_.work_dir + ": " + ec.message());
  inv_ = Inventory::FromCheckpoint(target_);
  v0_ = VersionId{dopts_.base_version, base_.ContentHash(1)};
  v1_ = VersionId{dopts_.target_version, target_.ContentHash(1)};
  BlobSink sink;
  DCR_RETURN_IF_ERROR(BuildStream(&sink));
  sender_blobs_ = std::move(sink.blobs);
  infos_ = sink.infos;
  chunk_ids_ = sink.chunk_ids;
  num_chunks_ = chunk_ids_.size();
  if (num_chunks_ < 2) return InvalidArgumentError("fault run: the delta needs >= 2 chunks");
  for (size_t i = 0; i < num_chunks_; ++i) blob_of_chunk_[chunk_ids_[i]] = i + 1;
  DCR_ASSIGN_OR_RETURN(FaultRunPolicies config, FaultRunPolicyConfig(opts_));
  topo_ = std::move(config.topology);
  relay_ = config.relay;
  const RecoveryOptions& recovery = config.recovery;
  DCR_ASSIGN_OR_RETURN(store_, DirectoryStore::Open(opts_.work_dir + "/store"));
  nodes_.resize(static_cast<size_t>(topo_.size()));
  for (int i = 0; i < topo_.size(); ++i) {
    Node& n = nodes_[i];
    n.id = i;
    n.incarnation = 1;
    DCR_ASSIGN_OR_RETURN(n.policy, MakeFaultRunTreePolicy(opts_, i));
    n.recovery = std::make_unique<RecoveryPolicy>(
        i == 0 ? RecoveryRole::kSender : RecoveryRole::kReceiver, recovery);
    if (i == 0) {
      n.uploader = MakeUploaderPolicy(relay_);
      continue;
    }
    for (const TensorInfo& t : inv_.tensors) {
      const TensorInfo* b = base_.Find(t.name);
      if (b == nullptr || b->nbytes != t.nbytes) {
        return FailedPreconditionError("fault run: base lacks tensor '" + t.name + "'");
      }
      n.bufs.emplace_back(base_.data(*b), base_.data(*b) + b->nbytes);
    }
    n.journal_path = opts_.work_dir + "/" + Name(i) + ".journal";
    std::filesystem::remove(n.journal_path, ec);
    DCR_RETURN_IF_ERROR(OpenReceiver(n));
    DCR_RETURN_IF_ERROR(n.journal->RecordCommitted(v0_));  // dense load of the base
  }
  coordinator_ = std::make_unique<CommitCoordinator>(v0_);
  for (int i = 1; i < topo_.size(); ++i)
    DCR_RETURN_IF_ERROR(coordinator_->AddReceiver(Name(i), v0_));
  DCR_RETURN_IF_ERROR(coordinator_->Publish(v0_, v1_));
  ResolveFaults();
  for (const Fault& f : faults_) {
    if (f.spec.kind != FaultKind::kStaleDelta || stale_) continue;
    // A delta for another base: the target with every 97th data byte changed, -> target.
    std::vector<uint8_t> img(target_.file_data(), target_.file_data() + target_.file_size());
    for (uint64_t i = target_.data_section_offset(); i < img.size(); i += 97) img[i] += 1;
    DCR_ASSIGN_OR_RETURN(auto foreign, Checkpoint::FromBytes(std::move(img)));
    DeltaOptions o = dopts_;
    o.threads = 1;
    o.base_version = dopts_.base_version;  // same numbers, different content: must be refused
    DeltaMemorySink ms;
    DCR_RETURN_IF_ERROR(BuildDelta(foreign.get(), target_, o, &ms).status());
    DCR_ASSIGN_OR_RETURN(stale_, DeltaReader::FromBytes(ms.Release()));
  }
  for (int i = 0; i < topo_.size(); ++i) PolicyEvent(0, i, kStreamSlot, event::Start{});
  PolicyEvent(0, 0, kUploadSlot, event::Start{});
  for (size_t b = 0; b < infos_.size(); ++b) {
    QEvent q;
    q.node = 0;
    q.type = QEvent::kProduce;
    q.arg = b;
    Schedule(opts_.produce_interval_s * static_cast<double>(b + 1), std::move(q));
  }
  return Status::OK();
}

void World::Deliver(int node, int slot, const Event& ev) {
  Node& n = nodes_[node];
  NodePolicy* p = slot == kUploadSlot ? n.uploader.get() : n.policy.get();
  if (p == nullptr) return;
  HarnessEnv env(this, node, slot, n.incarnation, p);
  PolicyHost host(p, &env);
  if (opts_.record_trace) {
    const std::string role = NodeRoleName(p->role());
    host.set_observer([this, node, role](const TraceStep& step) {
      FaultTraceEntry t{step.now, node, role, ToString(step.event), {}};
      for (const Action& a : step.actions) t.actions.push_back(ToString(a));
      report_.trace.push_back(std::move(t));
    });
  }
  host.Handle(now_, ev);
}

void HarnessEnv::Do(const Action& a) {
  const Node& n = world_->nodes_[node_];
  const NodePolicy* cur = slot_ == kUploadSlot ? n.uploader.get() : n.policy.get();
  if (n.incarnation != incarnation_ || cur != policy_ || !n.alive) return;
  world_->Do(node_, slot_, a);
}

void World::Recover(int node, const recovery::Event& ev, HarnessRecovery::OverwriteFn overwrite) {
  std::vector<recovery::Action> acts;
  nodes_[node].recovery->Handle(now_, ev, &acts);
  if (opts_.record_trace) {
    FaultTraceEntry t{now_, node, "recovery", recovery::ToString(ev), {}};
    for (const recovery::Action& a : acts) t.actions.push_back(recovery::ToString(a));
    report_.trace.push_back(std::move(t));
  }
  HarnessRecovery env(this, node, std::move(overwrite));
  PerformRecovery(acts, &env);
}

void HarnessRecovery::SetTimer(TimePoint at) {
  QEvent q;
  q.node = node_;
  q.slot = kRecoverySlot;
  q.is_timer = true;
  q.timer_gen = ++world_->nodes_[node_].timer_gen[kRecoverySlot];
  world_->Schedule(std::max(at, world_->now_), std::move(q));
}
void HarnessRecovery::FallBackToStore(const std::string& reason) {
  world_->FallBackToStore(node_, reason);
}
void HarnessRecovery::LeaveTree() { world_->LeaveTree(node_); }
void HarnessRecovery::StartDownload() { world_->StartDownload(node_); }
void HarnessRecovery::Reparent(NodeId to) {
  // ChildrenLost offers no adopter: the tree policies here have a fixed child set.
  world_->report_.error = world_->Name(node_) + ": re-parent to node " + std::to_string(to) +
                          " without an adopter offered";
}
void HarnessRecovery::ReloadCommitted() { world_->ReloadCommitted(world_->nodes_[node_]); }
void HarnessRecovery::RequestOverwrite(uint64_t chunk_id, const std::string& key) {
  if (overwrite_) {
    overwrite_(chunk_id, key);
  } else {
    world_->report_.error = world_->Name(node_) + ": overwrite requested outside an apply";
  }
}
void HarnessRecovery::StopUpload() { world_->nodes_[node_].uploader.reset(); }
void HarnessRecovery::Republish() { world_->Republish(); }
void HarnessRecovery::GiveUp(const std::string& message) { world_->GiveUp(node_, message); }

void World::FallBackToStore(int node, const std::string& reason) {
  Node& n = nodes_[node];
  ++report_.fallbacks_to_store;
  report_.log.push_back(Fmt("t=%.3f %s falls back to the object store: %s", now_,
                            Name(node).c_str(), reason.c_str()));
  ++n.incarnation;  // drops everything in flight for the stream policy it leaves
  n.store_mode = true;
  n.policy.reset();
}

void World::LeaveTree(int node) {
  Node& n = nodes_[node];
  if (node == 0) {
    n.tree_dead = true;
    n.policy.reset();
  }
  n.store_mode = node != 0;
  ChildrenLost(node);
}

void World::StartDownload(int node) {
  Node& n = nodes_[node];
  n.store_mode = true;
  n.policy = MakeDownloaderPolicy(relay_);
  Deliver(node, kStreamSlot, event::Start{});
}

void World::GiveUp(int node, const std::string& message) {
  Node& n = nodes_[node];
  report_.log.push_back(Fmt("t=%.3f %s: %s%s", now_, Name(node).c_str(), message.c_str(),
                            n.restarting ? ", left dead" : ""));
  n.policy.reset();
  if (n.restarting) n.alive = false;
}

void World::DoSend(int from, const action::Send& s) {
  const bool long_edge = from == 0;
  const std::vector<uint8_t>* src = nullptr;
  if (from == 0) {
    src = &sender_blobs_[s.blob.id];
  } else {
    auto it = nodes_[from].blobs.find(s.blob.id);
    if (it == nodes_[from].blobs.end()) return;
    src = &it->second;
  }
  if (long_edge && Partitioned()) {
    PolicyEvent(now_ + opts_.detect_timeout_s, from, 0,
                event::SendFailed{s.to, "long link partitioned"});
    return;
  }
  const double bw = long_edge ? opts_.long_bandwidth_Bps : opts_.short_bandwidth_Bps;
  const double lat = long_edge ? opts_.long_latency_s : opts_.short_latency_s;
  // The policy hands a stream its next piece only after SendDone of the last, so the stream is
  // idle: the piece's bytes go out from now at the link's rate.
  const double end = now_ + static_cast<double>(s.length) / bw;
  PolicyEvent(end, from, 0, event::SendDone{s.to, s.stream, s.blob.id, s.offset, s.length});
  Node& to = nodes_[s.to];
  if (!to.alive || to.store_mode) return;  // the peer is gone: bytes go nowhere
  double arrive = end + lat;
  std::vector<uint8_t> piece(src->begin() + static_cast<long>(s.offset),
                             src->begin() + static_cast<long>(s.offset + s.length));
  const bool chunk = s.blob.kind == BlobKind::kChunk;
  const int ord = chunk ? static_cast<int>(s.blob.id) - 1 : -1;
  bool duplicate = false;
  if (chunk) {
    if (Fault* f = FindFault(FaultKind::kDelayChunk, s.to, ord)) {
      Fire(f, Fmt("piece %" PRIu64 "@%" PRIu64 " of chunk blob %d to %s delayed %.2f s", s.blob.id,
                  s.offset, ord, Name(s.to).c_str(), f->spec.duration_s));
      arrive += f->spec.duration_s;
    }
    if (Fault* f = FindFault(FaultKind::kReorderChunks, s.to, ord)) {
      Fire(f, Fmt("pieces of chunk blobs %d..%d to %s shuffled", ord, ord + 3, Name(s.to).c_str()));
      reorder_until_[{s.to, 0}] = ord + 4;
    }
    auto rw = reorder_until_.find({s.to, 0});
    if (rw != reorder_until_.end() && ord < rw->second) {
      arrive += std::uniform_real_distribution<double>(0, 0.05)(rng_);
    }
    if (!piece.empty()) {
      if (Fault* f = FindFault(FaultKind::kCorruptChunk, s.to, ord)) {
        size_t at = rng_() % piece.size();
        piece[at] ^= static_cast<uint8_t>(1 + rng_() % 255);
        Fire(f, Fmt("byte %zu of piece %" PRIu64 "@%" PRIu64 " to %s flipped", at, s.blob.id,
                    s.offset, Name(s.to).c_str()));
      }
    }
    if (Fault* f = FindFault(FaultKind::kDuplicateChunk, s.to, ord)) {
      Fire(f, Fmt("piece %" PRIu64 "@%" PRIu64 " to %s delivered twice; chunk applied twice",
                  s.blob.id, s.offset, Name(s.to).c_str()));
      duplicate = true;
      dup_apply_.insert({s.to, s.blob.id});
    }
  }
  for (int k = 0; k < (duplicate ? 2 : 1); ++k) {
    QEvent q;
    q.node = s.to;
    q.ev = event::DataReceived{s.blob, s.offset, s.length};
    q.bytes = piece;
    Schedule(arrive + k * 0.001, std::move(q));
  }
}

ApplyResult World::Apply(Node& n, const BlobInfo& blob) {
  ApplyResult r;
  auto fail = [&](const Status& s) {
    r.ok = false;
    r.code = s.code();
    r.message = s.message();
    return r;
  };
  auto it = n.blobs.find(blob.id);
  if (it == n.blobs.end()) return fail(InternalError("apply of a blob not held"));
  const std::vector<uint8_t>& bytes = it->second;
  if (blob.kind == BlobKind::kHeader) {
    size_t consumed = 0;
    StatusOr<FileHeader> h = ParseFileHeader(bytes.data(), bytes.size(), &consumed);
    if (!h.ok()) {
      ++report_.corrupt_detected;
      return fail(h.status());
    }
    Status s = n.ja->Begin(bytes.data(), bytes.size());
    if (!s.ok()) return fail(s);
    return r;
  }
  if (blob.kind == BlobKind::kTrailer) {
    StatusOr<Trailer> t = ParseTrailer(bytes.data(), bytes.size());
    if (!t.ok()) {
      ++report_.corrupt_detected;
      return fail(t.status());
    }
    Status c = n.ja->Commit(bytes.data(), bytes.size());
    if (!c.ok()) return fail(c);
    const VersionId v = n.ja->held();
    n.committed = true;
    c = coordinator_->OnCommitted(Name(n.id), v);
    report_.log.push_back(Fmt("t=%.3f %s committed %s%s", now_, Name(n.id).c_str(),
                              v.ToString().c_str(),
                              c.ok() ? "" : (" (" + c.ToString() + ")").c_str()));
    Recover(n.id, recovery::Committed{});
    return r;
  }
  StatusOr<DecodedChunk> dc = DecodeChunk(bytes.data(), bytes.size());
  if (!dc.ok()) {
    ++report_.corrupt_detected;
    report_.log.push_back(Fmt("t=%.3f %s: chunk blob %" PRIu64 " refused: %s", now_,
                              Name(n.id).c_str(), blob.id, dc.status().ToString().c_str()));
    return fail(dc.status());
  }
  const int ord = n.chunk_applies++;
  const uint64_t id = dc->header.chunk_id;
  if (Fault* f = FindFault(FaultKind::kStaleDelta, n.id, ord)) {
    Fire(f, Fmt("%s offered a delta for another base (v%" PRIu64 " with other content)",
                Name(n.id).c_str(), stale_->header().base_version));
    OfferStaleDelta(n);
  }
  // Killed inside the first chunk at or after the seeded point that is really written (not a
  // duplicate the journal skips) and has at least two changes.
  Fault* inside = nullptr;
  if (dc->values.size() >= 2 && n.journal->Lookup(id, nullptr) == JournalChunkState::kNone) {
    inside = FindFault(FaultKind::kKillReceiverInsideChunk, n.id, ord, /*at_least=*/true);
    if (inside == nullptr) inside = FindFault(FaultKind::kKillRelay, n.id, ord, true);
  }
  if (inside != nullptr) {
    Fire(inside, Fmt("%s killed inside chunk %" PRIu64 " (%zu of %zu changes written)",
                     Name(n.id).c_str(), id, dc->values.size() / 2, dc->values.size()));
    n.inner->ArmCrash(id);
    pending_kill_ = inside->spec.kind;
  }
  std::error_code size_ec;
  const uintmax_t journal_before = std::filesystem::file_size(n.journal_path, size_ec);
  Status s = n.ja->ApplyRecord(bytes.data(), bytes.size());
  if (n.inner->crashed()) {
    r.crashed = true;
    return r;
  }
  if (!s.ok() && s.IsFailedPrecondition() &&
      n.journal->Lookup(id, nullptr) == JournalChunkState::kDoubtful) {
    ++report_.payloads_refused;
    Recover(n.id, recovery::ChunkDoubtful{id}, [&](uint64_t chunk_id, const std::string& key) {
      StatusOr<std::vector<uint8_t>> ow = Overwrite(key, chunk_id);
      if (!ow.ok()) {
        s = ow.status();
        return;
      }
      s = n.ja->ApplyRecord(ow->data(), ow->size());
      if (s.ok()) {
        ++report_.overwrite_repairs;
        report_.log.push_back(Fmt("t=%.3f %s: chunk %" PRIu64 " repaired with its overwrite form",
                                  now_, Name(n.id).c_str(), id));
      }
    });
  }
  if (!s.ok()) return fail(s);
  if (dup_apply_.erase({n.id, blob.id})) {
    Status d = n.ja->ApplyRecord(bytes.data(), bytes.size());
    if (!d.ok()) return fail(d.WithContext("duplicate apply"));
  }
  const uintmax_t journal_after = std::filesystem::file_size(n.journal_path, size_ec);
  for (FaultKind k : {FaultKind::kKillReceiverAtBoundary, FaultKind::kTornJournal,
                      FaultKind::kKillReceiverLosingMemory}) {
    // A crash can only tear a record being appended: a torn journal needs this apply to have
    // appended something (a duplicate that was skipped appended nothing; try a later chunk).
    if (k == FaultKind::kTornJournal && !(journal_after > journal_before + 3)) continue;
    if (Fault* f = FindFault(k, n.id, ord, /*at_least=*/k == FaultKind::kTornJournal)) {
      Fire(f, Fmt("%s killed after its apply of chunk %" PRIu64 "%s", Name(n.id).c_str(), id,
                  k == FaultKind::kTornJournal ? " while its last journal record was written"
                  : k == FaultKind::kKillReceiverLosingMemory ? " (its memory is lost)"
                                                              : ""));
      n.journal->Freeze();
      pending_kill_ = k;
      r.crashed = true;
      return r;
    }
  }
  return r;
}

void World::OfferStaleDelta(Node& n) {
  std::vector<std::vector<uint8_t>> before = n.bufs;
  const std::vector<uint8_t> stale_header = SerializeFileHeader(stale_->header());
  Status s = n.ja->Begin(stale_header.data(), stale_header.size());
  if (s.ok()) {
    report_.error = Name(n.id) + " accepted a delta for another base";
    return;
  }
  ++report_.payloads_refused;
  // Straight to an applier over the storage (no receiver, no journal): the base check refuses and
  // writes nothing.
  for (size_t i = 0; i < stale_->num_chunks() && i < 3; ++i) {
    StatusOr<DecodedChunk> dc = stale_->Decode(i);
    if (!dc.ok()) continue;
    BufferApplier probe(Buffers(n));
    if (probe.ApplyChunk(*dc).ok()) {
      report_.error = Name(n.id) + " applied a chunk of a delta for another base";
      return;
    }
    ++report_.payloads_refused;
  }
  if (n.bufs != before) report_.error = Name(n.id) + ": a refused stale payload wrote bytes";
}

// The object store, with the sender building a missing overwrite form on demand.
StatusOr<std::vector<uint8_t>> World::Overwrite(const std::string& key, uint64_t chunk_id) {
  StatusOr<std::vector<uint8_t>> g = store_->Get(key);
  if (g.ok()) return g;
  if (!sender_alive_) {
    return UnavailableError("overwrite form of chunk " + std::to_string(chunk_id) +
                            ": the sender is down");
  }
  auto b = blob_of_chunk_.find(chunk_id);
  if (b == blob_of_chunk_.end()) return NotFoundError("no chunk " + std::to_string(chunk_id));
  const std::vector<uint8_t>& rel = sender_blobs_[b->second];
  DCR_ASSIGN_OR_RETURN(
      std::vector<uint8_t> ow,
      OverwriteChunkFromRelative(rel.data(), rel.size(), inv_, base_, dopts_.zstd_level));
  DCR_RETURN_IF_ERROR(store_->Put(key, ow.data(), ow.size()));
  ++report_.overwrites_served;
  return ow;
}

void World::ChildrenLost(int node) {
  // A dead child hears nothing; it restarts out of the tree.
  for (NodeId c : topo_.children[node]) {
    if (nodes_[c].alive) Recover(c, recovery::ParentLost{node, kNoNode});
  }
}

void World::Kill(int node, FaultKind why) {
  Node& n = nodes_[node];
  if (n.ja) {
    JournaledApplyStats st = n.ja->stats();
    report_.duplicates_skipped += st.duplicates_skipped;
  }
  n.alive = false;
  ++n.incarnation;
  n.policy.reset();
  n.ja.reset();
  n.inner.reset();
  n.journal.reset();
  n.blobs.clear();
  if (why == FaultKind::kTornJournal) {
    std::error_code ec;
    uintmax_t size = std::filesystem::file_size(n.journal_path, ec);
    if (!ec && size > 3) std::filesystem::resize_file(n.journal_path, size - 3, ec);
  }
  if (why == FaultKind::kKillReceiverLosingMemory) {
    // Host memory is gone: the restart finds garbage (and must reload the committed version).
    for (std::vector<uint8_t>& b : n.bufs) std::fill(b.begin(), b.end(), uint8_t{0xA5});
    n.storage_lost = true;
  }
  ChildrenLost(node);
  QEvent q;
  q.node = node;
  q.type = QEvent::kRestart;
  q.incarnation = n.incarnation;
  Schedule(now_ + opts_.restart_delay_s, std::move(q));
}

void World::RestartNode(int node) {
  Node& n = nodes_[node];
  n.alive = true;
  Status s = OpenReceiver(n);
  if (!s.ok()) {
    report_.error = Name(node) + ": restart failed: " + s.ToString();
    n.alive = false;
    return;
  }
  JournalState st = n.journal->state();
  const bool storage_lost = n.storage_lost;
  n.storage_lost = false;
  n.committed = st.committed && *st.committed == v1_;
  n.restarting = true;
  Recover(node,
          recovery::Restarted{storage_lost, n.committed, st.applied.size(), st.doubtful.size()});
  n.restarting = false;
  if (!n.alive) return;
  ++report_.restarts;
  report_.log.push_back(
      Fmt("t=%.3f %s restarted from its journal (%zu applied, %zu doubtful, "
          "%" PRIu64 " torn bytes); falls back to the object store",
          now_, Name(node).c_str(), st.applied.size(), st.doubtful.size(), st.torn_bytes));
  n.store_mode = true;
}

void World::ReloadCommitted(Node& n) {
  // The committed version of every receiver here is the base (Setup records it).
  std::optional<VersionId> c = n.journal->committed();
  if (!c || *c != v0_) {
    report_.error = Name(n.id) + ": storage lost with no base version committed";
    return;
  }
  for (size_t i = 0; i < inv_.tensors.size(); ++i) {
    const TensorInfo* b = base_.Find(inv_.tensors[i].name);
    std::copy(base_.data(*b), base_.data(*b) + b->nbytes, n.bufs[i].begin());
  }
  Status a = n.journal->AbandonDelta();
  if (!a.ok()) report_.error = Name(n.id) + ": abandon failed: " + a.ToString();
}

void World::KillSender() {
  Node& s = nodes_[0];
  sender_alive_ = false;
  ++s.incarnation;
  s.policy.reset();
  s.uploader.reset();
  ChildrenLost(0);
}

void World::Republish() {
  Node& s = nodes_[0];
  BlobSink sink;
  Status b = BuildStream(&sink);
  if (!b.ok()) {
    report_.error = "sender restart: " + b.ToString();
    return;
  }
  if (sink.blobs != sender_blobs_) report_.sender_rebuild_identical = false;
  sender_blobs_ = std::move(sink.blobs);
  sender_alive_ = true;
  ++report_.restarts;
  StatusOr<std::unique_ptr<NodePolicy>> tree = MakeFaultRunTreePolicy(opts_, 0);
  if (!tree.ok()) {
    report_.error = "sender restart: " + tree.status().ToString();
    return;
  }
  s.policy = std::move(*tree);
  s.uploader = MakeUploaderPolicy(relay_);
  // The trainer's commit state is soft: rebuilt from the receivers' journals.
  coordinator_ = std::make_unique<CommitCoordinator>(v0_);
  std::vector<std::pair<std::string, VersionId>> done;
  for (int i = 1; i < topo_.size(); ++i) {
    std::optional<VersionId> v;
    StatusOr<std::vector<uint8_t>> bytes = ReadFile(nodes_[i].journal_path);
    if (bytes.ok()) {
      StatusOr<JournalState> st = ReceiverJournal::Replay(bytes->data(), bytes->size());
      if (st.ok()) v = st->committed;
    }
    Status a = coordinator_->AddReceiver(Name(i), v);
    if (!a.ok()) report_.error = "sender restart: " + a.ToString();
    if (v && *v == v1_) done.emplace_back(Name(i), *v);
  }
  Status p = coordinator_->Publish(v0_, v1_);
  if (!p.ok()) report_.error = "sender restart: " + p.ToString();
  for (auto& [name, v] : done) (void)coordinator_->OnCommitted(name, v);
  report_.log.push_back(
      Fmt("t=%.3f sender restarted: rebuilt the delta (%s), republishes it; "
          "%zu receivers already committed",
          now_, report_.sender_rebuild_identical ? "identical bytes" : "DIFFERENT", done.size()));
  PolicyEvent(now_, 0, kStreamSlot, event::Start{});
  PolicyEvent(now_, 0, kUploadSlot, event::Start{});
  for (size_t i = 0; i < infos_.size(); ++i) {
    QEvent q;
    q.node = 0;
    q.type = QEvent::kProduce;
    q.arg = i;
    Schedule(now_ + opts_.produce_interval_s * static_cast<double>(i + 1), std::move(q));
  }
}

void World::Do(int node, int slot, const Action& a) {
  Node& n = nodes_[node];
  auto lat = [&](int a_, int b_) {
    return (a_ == 0 || b_ == 0) ? opts_.long_latency_s : opts_.short_latency_s;
  };
  if (const auto* s = std::get_if<action::Send>(&a)) {
    DoSend(node, *s);
  } else if (const auto* k = std::get_if<action::Ack>(&a)) {
    if (nodes_[k->to].alive)
      PolicyEvent(now_ + lat(node, k->to), k->to, 0, event::AckReceived{node, k->blob});
  } else if (const auto* ap = std::get_if<action::Apply>(&a)) {
    ApplyResult r = Apply(n, ap->blob);
    if (r.crashed) {
      Kill(node, pending_kill_);
      return;
    }
    PolicyEvent(now_ + 1e-4, node, slot, event::ApplyDone{ap->blob.id, r.ok, r.code, r.message});
  } else if (const auto* rc = std::get_if<action::ReportCommit>(&a)) {
    if (nodes_[rc->to].alive && !nodes_[rc->to].store_mode) {
      PolicyEvent(now_ + lat(node, rc->to), rc->to, 0,
                  event::SubtreeCommitted{node, rc->receivers});
    }
  } else if (std::holds_alternative<action::Published>(a)) {
    published_ = true;
    report_.log.push_back(Fmt("t=%.3f uploader: stream published in the object store", now_));
  } else if (const auto* tc = std::get_if<action::TreeCommitted>(&a)) {
    report_.log.push_back(Fmt("t=%.3f sender: tree committed (%d receivers)", now_, tc->receivers));
  } else if (const auto* p = std::get_if<action::Put>(&a)) {
    const int ord = p->blob.kind == BlobKind::kChunk ? static_cast<int>(p->blob.id) - 1 : -1;
    event::PutDone done{p->blob.id, true, ""};
    double t = now_ + opts_.long_latency_s;
    Fault* f = ord >= 0 ? FindFault(FaultKind::kStoreWriteFail, -1, ord) : nullptr;
    if (f != nullptr && f->remaining > 0) {
      --f->remaining;
      Fire(f, Fmt("put of %s fails %d times in a row", p->key.c_str(), f->spec.count));
      if (f->remaining > 0) f->done = false;  // keeps matching until every failure is served
      done.ok = false;
      done.message = "injected object-store write failure";
    } else if (Partitioned()) {
      done.ok = false;
      done.message = "long link partitioned";
    } else {
      const std::vector<uint8_t>& b = sender_blobs_[p->blob.id];
      Status s = store_->Put(p->key, b.data(), b.size());
      done.ok = s.ok();
      done.message = s.message();
      t += static_cast<double>(b.size()) / opts_.long_bandwidth_Bps;
    }
    PolicyEvent(t, node, slot, done);
  } else if (const auto* l = std::get_if<action::List>(&a)) {
    event::ListDone done;
    StatusOr<std::vector<ObjectInfo>> objs = store_->List(l->prefix + "/");
    if (!objs.ok()) {
      done.ok = false;
      done.message = objs.status().message();
    } else {
      for (const ObjectInfo& o : *objs) {
        StatusOr<BlobInfo> bi = ParseObjectKey(l->prefix, o.key);
        if (!bi.ok()) continue;
        bi->size = o.size;
        done.blobs.push_back(*bi);
      }
    }
    PolicyEvent(now_ + opts_.short_latency_s, node, slot, std::move(done));
  } else if (const auto* fe = std::get_if<action::Fetch>(&a)) {
    StatusOr<std::vector<uint8_t>> g = store_->Get(fe->key);
    event::FetchDone done{fe->blob.id, g.ok(), g.ok() ? "" : g.status().message()};
    double t = now_ + opts_.short_latency_s;
    if (g.ok()) {
      t += static_cast<double>(g->size()) / opts_.short_bandwidth_Bps;
      n.blobs[fe->blob.id] = std::move(g).value();
    }
    PolicyEvent(t, node, slot, done);
  } else if (const auto* st = std::get_if<action::SetTimer>(&a)) {
    QEvent q;
    q.node = node;
    q.slot = slot;
    q.is_timer = true;
    q.timer_gen = ++n.timer_gen[slot];
    q.ev = event::TimerFired{};
    Schedule(std::max(st->at, now_), std::move(q));
  } else if (const auto* tr = std::get_if<action::Transcode>(&a)) {
    // The harness's streams have one form: every blob goes as produced.
    PolicyEvent(now_, node, slot, event::BlobReencoded{tr->to, tr->blob, false});
  } else if (const auto* lag = std::get_if<action::EdgeLag>(&a)) {
    report_.log.push_back(Fmt("t=%.3f node %d: edge relay node %d %s (%llu bytes unacknowledged)",
                              now_, node, lag->to, lag->lagging ? "lags" : "caught up",
                              static_cast<unsigned long long>(lag->unacked)));
  } else if (const auto* fl = std::get_if<action::Fail>(&a)) {
    const recovery::Stream stream = slot == kUploadSlot ? recovery::Stream::kUpload
                                    : n.store_mode      ? recovery::Stream::kDownload
                                                        : recovery::Stream::kTree;
    if (node == 0) {
      report_.log.push_back(Fmt("t=%.3f sender %s failed: %s", now_,
                                slot == kUploadSlot ? "uploader" : "tree", fl->message.c_str()));
    }
    Recover(node, recovery::StreamFailed{stream, fl->code, fl->message});
  }
}

StatusOr<FaultRunReport> World::Run() {
  DCR_RETURN_IF_ERROR(Setup());
  report_.receivers = opts_.receivers;
  while (!queue_.empty()) {
    auto it = queue_.begin();
    now_ = it->first.first;
    QEvent e = std::move(it->second);
    queue_.erase(it);
    if (now_ > opts_.time_limit_s) break;
    Node& n = nodes_[e.node];
    if (e.incarnation != n.incarnation) continue;
    switch (e.type) {
      case QEvent::kPolicy: {
        if (!n.alive) break;
        if (e.is_timer && e.timer_gen != n.timer_gen[e.slot]) break;
        if (e.slot == kRecoverySlot) {
          Recover(e.node, recovery::TimerFired{});
          break;
        }
        if (const auto* d = std::get_if<event::DataReceived>(&e.ev)) {
          std::vector<uint8_t>& buf = n.blobs[d->blob.id];
          if (buf.size() != d->blob.size) buf.resize(d->blob.size);
          if (d->offset + e.bytes.size() <= buf.size()) {
            std::memcpy(buf.data() + d->offset, e.bytes.data(), e.bytes.size());
          }
        }
        Deliver(e.node, e.slot, e.ev);
        break;
      }
      case QEvent::kProduce: {
        if (!sender_alive_) break;
        const size_t b = e.arg;
        if (Fault* f = FindFault(FaultKind::kRestartSender, -1, static_cast<int>(b))) {
          Fire(f, Fmt("sender killed after producing %zu of %zu blobs; restarts in %.2f s", b,
                      infos_.size(), f->spec.duration_s));
          KillSender();
          QEvent q;
          q.node = 0;
          q.type = QEvent::kSenderRestart;
          q.incarnation = nodes_[0].incarnation;
          Schedule(now_ + f->spec.duration_s, std::move(q));
          break;
        }
        if (Fault* f = FindFault(FaultKind::kPartitionLongLink, -1, static_cast<int>(b))) {
          part_start_ = now_;
          part_end_ = now_ + f->spec.duration_s;
          Fire(f, Fmt("long link partitioned for %.2f s", f->spec.duration_s));
        }
        if (n.policy) PolicyEvent(now_, 0, kStreamSlot, event::BlobProduced{infos_[b]});
        if (n.uploader) PolicyEvent(now_, 0, kUploadSlot, event::BlobProduced{infos_[b]});
        break;
      }
      case QEvent::kRestart:
        RestartNode(e.node);
        break;
      case QEvent::kSenderRestart:
        Recover(0, recovery::Restarted{});
        break;
      default:
        break;
    }
    bool all = published_;
    for (int i = 1; i < topo_.size() && all; ++i) all = nodes_[i].alive && nodes_[i].committed;
    if (all) break;
  }
  report_.virtual_seconds = now_;
  FaultRunReport r = std::move(report_);
  DCR_RETURN_IF_ERROR(Verify(&r));
  return r;
}

Status World::Verify(FaultRunReport* r) {
  std::string problems;
  for (int i = 1; i < topo_.size(); ++i) {
    Node& n = nodes_[i];
    if (n.ja) r->duplicates_skipped += n.ja->stats().duplicates_skipped;
    std::optional<VersionId> c;
    if (n.journal) c = n.journal->committed();
    bool committed = n.alive && c && *c == v1_;
    bool equal = true;
    for (size_t t = 0; t < inv_.tensors.size(); ++t) {
      const TensorInfo* tt = target_.Find(inv_.tensors[t].name);
      if (n.bufs[t].size() != tt->nbytes ||
          std::memcmp(n.bufs[t].data(), target_.data(*tt), tt->nbytes) != 0) {
        equal = false;
        break;
      }
    }
    if (committed) ++r->receivers_committed;
    if (equal) ++r->receivers_verified;
    if (!committed || !equal) {
      problems += Fmt(" %s:%s%s", Name(i).c_str(), committed ? "" : " not committed",
                      equal ? "" : " bytes differ");
    }
  }
  r->joint_commit_whole = coordinator_->LatestWhole() && coordinator_->baseline() == v1_;
  if (!r->joint_commit_whole) problems += " joint commit not whole";
  if (!r->sender_rebuild_identical) problems += " restarted sender built different bytes";
  if (!published_) problems += " the object-store stream was never published";
  for (const Fault& f : faults_) {
    if (!f.fired) continue;
    ++r->faults_injected;
    ++r->injected_by_kind[FaultKindName(f.spec.kind)];
  }
  if (!problems.empty() && r->error.empty()) r->error = "run failed:" + problems;
  r->faults_survived = r->error.empty() ? r->faults_injected : 0;
  if (!opts_.keep_files) {
    store_.reset();
    for (Node& n : nodes_) n.journal.reset();
    std::error_code ec;
    std::filesystem::remove_all(opts_.work_dir, ec);
  }
  return Status::OK();
}

}  // namespace

StatusOr<FaultRunPolicies> FaultRunPolicyConfig(const FaultRunOptions& options) {
  if (options.receivers < 1) return InvalidArgumentError("fault run: receivers must be >= 1");
  FaultRunPolicies c;
  DCR_ASSIGN_OR_RETURN(
      c.topology, Topology::FanOut(options.receivers + 1, options.fan_out, options.root_fan_out));
  c.relay = options.relay;
  c.recovery.detect_timeout_s = options.detect_timeout_s;
  c.recovery.max_recoveries = options.max_recoveries;
  c.recovery.prefix = options.relay.prefix;
  return c;
}

StatusOr<std::unique_ptr<NodePolicy>> MakeFaultRunTreePolicy(const FaultRunOptions& options,
                                                             NodeId node) {
  DCR_ASSIGN_OR_RETURN(FaultRunPolicies c, FaultRunPolicyConfig(options));
  if (node < 0 || node >= c.topology.size()) {
    return InvalidArgumentError("fault run: node " + std::to_string(node) + " outside the tree");
  }
  return MakeTreePolicy(c.topology, node, c.relay);
}

RelayOptions FaultRunRelayDefaults() {
  RelayOptions r;
  r.piece_bytes = 1024;
  r.window_bytes = 8 * 1024;
  r.prefix = "refit-v1";
  r.poll_interval_s = 0.02;
  r.poll_timeout_s = 60;
  r.retry_backoff_s = 0.05;
  r.max_retries = 6;
  return r;
}

std::vector<FaultSpec> SeededFaults(uint64_t seed, int count) {
  std::vector<FaultSpec> out;
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ULL + 7);
  for (int i = 0; i < count; ++i) {
    FaultSpec f;
    f.kind = static_cast<FaultKind>((i + static_cast<int>(seed)) % kNumFaultKinds);
    f.duration_s = f.kind == FaultKind::kPartitionLongLink ? 0.5 : 0.3;
    f.count = 1 + static_cast<int>(rng() % 3);
    out.push_back(f);
  }
  return out;
}

StatusOr<FaultRunReport> RunFaultScenario(const Checkpoint& base, const Checkpoint& target,
                                          const DeltaOptions& delta_options,
                                          const std::vector<FaultSpec>& faults,
                                          const FaultRunOptions& options) {
  World w(base, target, delta_options, faults, options);
  return w.Run();
}

}  // namespace dcr
