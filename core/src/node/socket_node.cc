// SocketNode (socket_node.h).
#include "node/socket_node.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/commitment.h"
#include "dcr/delta.h"
#include "dcr/journal.h"
#include "dcr/node.h"
#include "dcr/object_store.h"
#include "dcr/policy_host.h"
#include "dcr/receiver.h"
#include "dcr/recovery_policy.h"
#include "dcr/relay_policy.h"
#include "dcr/signing.h"
#include "dcr/status.h"
#include "dcr/status_macros.h"
#include "dcr/statusor.h"
#include "node/blob_spool.h"
#include "node/commit_reports.h"
#include "node/edge_relay.h"
#include "node/event_queue.h"
#include "node/fault_points.h"
#include "node/freeze_watch.h"
#include "node/held_hellos.h"
#include "node/metrics.h"
#include "node/node_recovery.h"
#include "node/node_state.h"
#include "node/node_trust.h"
#include "transport/heartbeat.h"
#include "transport/net.h"

namespace dcr::internal {

namespace {
// The wait of a long-lived receiver for a version with no limit (version_wait_s < 0).
constexpr double kForeverS = 1e9;

// The ranks with a committed report among `reports` (every one of this node's version: the
// tree's collector and the store's reader keep no other).
std::set<int> CommittedRanks(const std::vector<CommitReport>& reports) {
  std::set<int> ranks;
  for (const CommitReport& c : reports) {
    if (c.ok) ranks.insert(c.rank);
  }
  return ranks;
}
}  // namespace

Status SocketNode::Run() {
  NodeResult* r = state_.result();
  r->rank = plan_.rank;
  r->pid = static_cast<int64_t>(getpid());
  t0_ = SteadyNow();
  deadline_ = t0_ + plan_.timeout_s;
  // The sender keeps a committed report only when it carries the commitment root it signed; a
  // signing sender refuses one that comes before its root exists (no trailer was sent yet:
  // all-zero stands for that root, which no report carries).
  if (plan_.rank == 0) {
    links_.ExpectCommitment([this]() -> std::optional<Sha256Digest> {
      if (plan_.signing_key.empty()) return builder_.signed_commitment();
      return builder_.signed_commitment().value_or(Sha256Digest{});
    });
  }
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
  if (s.ok() && applier_.open() && committed_) {
    // What this receiver holds now: its content hash, and the trainer's signed commitment
    // when its storage was checked against one at the commit.
    r->target_hash = applier_.held().hash;
    if (auto root = applier_.committed_commitment()) r->commitment = CommitmentHex(*root);
  }
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
    // Retried on the stream's store schedule (StoreRetryDelay): a store that refuses writes for
    // a while must not lose the report.
    const std::vector<uint8_t> report = OwnReport(s).bytes;
    Status put = store_.PutNow(ReportKey(plan_.rank), report);
    for (int attempt = 1; !put.ok(); ++attempt) {
      const std::optional<double> delay = StoreRetryDelay(plan_.relay, attempt);
      if (!delay) break;
      ::usleep(static_cast<useconds_t>(*delay * 1e6));
      put = store_.PutNow(ReportKey(plan_.rank), report);
    }
  }
  if (s.ok() && recovery_ != nullptr && plan_.rank == 0 && plan_.transport == "relay_tree" &&
      (filled_store_ || !AllReportsOk(r->reports))) {
    s = CollectStoreReports(&r->reports);
    // Receivers whose commit came through the store count as the tree's do: the field is the
    // number of receivers that reported committing this version, whichever way.
    r->receivers_committed =
        std::max(r->receivers_committed, static_cast<int>(CommittedRanks(r->reports).size()));
  }
  Teardown();
  if (plan_.rank != 0 && !committed_) {
    r->freeze = internal::PlanFreezeReport(plan_, applier_.floor(), r->t_start);
  }
  r->ok = s.ok();
  if (!s.ok()) r->error = s.ToString();
  return s;
}

void SocketNode::Send(const action::Send& s) {
  BlobPtr b;
  if (s.plain) {  // a lagging edge relay's form (Transcode)
    auto f = plain_forms_.find(s.blob.id);
    if (f == plain_forms_.end()) {
      return Fault(InternalError("send of blob " + std::to_string(s.blob.id) +
                                 ": its plain form is not held"));
    }
    b = f->second;
  }
  if (!b) b = state_.Find(s.blob.id);
  if (!b) return Fault(InternalError("send of unknown blob " + std::to_string(s.blob.id)));
  if (b->bytes.size() != s.blob.size) {
    return Fault(InternalError("send of blob " + std::to_string(s.blob.id) + " at " +
                               std::to_string(s.blob.size) +
                               " bytes: " + std::to_string(b->bytes.size()) + " are held"));
  }
  FaultPointAtBlob(s.blob.id);
  Fault(links_.Send(s, b));
}

void SocketNode::Ack(const action::Ack& ack) {
  links_.SendToParent(FrameType::kAck, ack.blob);
  BlobPtr b = state_.Find(ack.blob);
  if (mirror_ != nullptr && b != nullptr) {
    mirror_->Put(b->info, std::shared_ptr<const std::vector<uint8_t>>(b, &b->bytes));
  }
  FaultPointAtBlob(blobs_whole_++);
}

void SocketNode::Release(BlobId blob) {
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

void SocketNode::Put(const action::Put& put) {
  BlobPtr b;
  if (put.plain) {
    auto f = plain_forms_.find(put.blob.id);
    if (f != plain_forms_.end()) b = f->second;
  } else {
    b = state_.Find(put.blob.id);
  }
  if (!b) return Fault(InternalError("put of unknown blob " + std::to_string(put.blob.id)));
  if (plan_.rank == 0) FaultPointAtBlob(put.blob.id);
  store_.Put(b, put.key);
}

void SocketNode::Committed() {
  committed_ = true;
  if (spool_ != nullptr) spool_->Discard();  // nothing of the version is fetched again
  state_.result()->t_commit = WallNow();
  if (freeze_watch_ != nullptr) freeze_watch_->Committed(plan_.version, state_.result()->t_commit);
  MarkCommittedInMetrics();
  if (recovery_ != nullptr) pending_recovery_.emplace_back(std::in_place_type<recovery::Committed>);
}

void SocketNode::Failed(const Status& status) {
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

void SocketNode::Recover(const recovery::Event& e) {
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

Status SocketNode::AfterHandle() {
  while (!pending_recovery_.empty() && error_.ok()) {
    recovery::Event e = pending_recovery_.front();
    pending_recovery_.erase(pending_recovery_.begin());
    Recover(e);
  }
  return error_;
}

void SocketNode::DoFallBack(const std::string& reason) {
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
  if (!store_.open())
    Fault(UnavailableError("node " + std::to_string(plan_.rank) +
                           ": no object store to fall back to"));
  // The drained applies may have finished the commit whose completion the stream bump
  // dropped: the journal says so, and the policy hears it (no second apply of the delta).
  if (!committed_ && applier_.durable() != nullptr && applier_.durable()->TargetCommittedNow()) {
    Committed();
  }
}

void SocketNode::FillStore() {
  filled_store_ = true;
  Status st = store_.open() ? store_.SkipHeld(plan_.relay.prefix)
                            : UnavailableError("sender: no object store to publish to");
  if (!st.ok()) return Fault(st.WithContext("sender: filling the store"));
  fed_.clear();
  StartPolicy(MakeFillStorePolicy(plan_));
  for (const BlobPtr& b : state_.All()) {
    fed_.insert(b->info.id);
    host_->Handle(Now(), event::BlobProduced{b->info});
  }
}

StatusOr<BlobPtr> SocketNode::PlainForm(BlobId id) {
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

NodeResult::EdgeSwitch* SocketNode::OpenSwitch(NodeResult* r, NodeId child) {
  for (auto it = r->edge_switches.rbegin(); it != r->edge_switches.rend(); ++it) {
    if (it->child == child) return it->resumed ? nullptr : &*it;
  }
  return nullptr;
}

void SocketNode::Transcode(const action::Transcode& t) {
  BlobPtr plain;
  auto f = plain_forms_.find(t.blob.id);
  if (f != plain_forms_.end()) {
    plain = f->second;
  } else {
    StatusOr<BlobPtr> made = PlainForm(t.blob.id);
    if (!made.ok()) {
      return Fault(made.status().WithContext(
          t.to == kNoNode ? std::string("sender: filling the store")
                          : "sender: the plain form for edge relay " + std::to_string(t.to)));
    }
    plain = *made;
    if (plain != nullptr) plain_forms_[t.blob.id] = plain;
  }
  if (plain == nullptr) {
    host_->Post(Now(), event::BlobReencoded{t.to, t.blob, false});
    return;
  }
  if (t.to != kNoNode) {
    state_.Update([&](NodeResult* r) {
      if (NodeResult::EdgeSwitch* sw = OpenSwitch(r, t.to)) ++sw->plain_chunks;
    });
  }
  host_->Post(Now(), event::BlobReencoded{t.to, plain->info, true});
}

void SocketNode::EdgeLag(const action::EdgeLag& lag) {
  if (lag.lagging) {
    NodeResult::EdgeSwitch sw;
    sw.child = lag.to;
    sw.lag_bytes = lag.unacked;
    state_.Update([&](NodeResult* r) { r->edge_switches.push_back(sw); });
    std::fprintf(stderr,
                 "sender: edge relay node %d lags (%llu bytes not acknowledged, bound "
                 "%llu): the chunks it has not started go to it in the plain form\n",
                 lag.to, static_cast<unsigned long long>(lag.unacked),
                 static_cast<unsigned long long>(lag.bound));
    return;
  }
  state_.Update([&](NodeResult* res) {
    if (NodeResult::EdgeSwitch* sw = OpenSwitch(res, lag.to)) {
      sw->resumed = true;
      sw->resume_bytes = lag.unacked;
      sw->context_chunks = lag.chunks;
    }
  });
  std::fprintf(stderr,
               "sender: edge relay node %d caught up (%llu bytes not acknowledged, at "
               "most %llu): the chunks it has not started go to it context-coded again\n",
               lag.to, static_cast<unsigned long long>(lag.unacked),
               static_cast<unsigned long long>(lag.bound / 2));
}

Status SocketNode::StartEdgeIngress() {
  std::optional<EdgeRange> range;
  if (plan_.edge_range_end > 0) {
    range = EdgeRange{plan_.edge_range_first, plan_.edge_range_end, 0};
  }
  DCR_ASSIGN_OR_RETURN(
      std::unique_ptr<internal::EdgeTranscoder> t,
      internal::EdgeTranscoder::Open(plan_.receiver_base_path, plan_.zstd_level, range));
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
  ingress_ = std::make_unique<internal::EdgeIngress>(std::move(t), plan_.relay.piece_bytes,
                                                     std::max(1, plan_.relay.max_parallel_applies),
                                                     std::move(cb));
  links_.set_ingress(ingress_.get());
  return Status();
}

void SocketNode::DoRepair(uint64_t chunk_id) {
  auto it = doubtful_blobs_.find(chunk_id);
  BlobPtr b = it == doubtful_blobs_.end() ? nullptr : state_.Find(it->second);
  if (b == nullptr) {
    return Fault(InternalError("overwrite of chunk " + std::to_string(chunk_id) +
                               " requested without its refused record"));
  }
  doubtful_blobs_.erase(it);
  applier_.Repair(b);
}

void SocketNode::FaultPointAtBlob(uint64_t blob) {
  if (FaultPoints* f = InstalledFaultPoints()) f->BlobReached(blob);
}

void SocketNode::RecordRecovery() {
  NodeResult* r = state_.result();
  state_.Update([&](NodeResult*) {
    if (recovery_ != nullptr) r->recoveries = recovery_->recoveries();
    if (applier_.durable() != nullptr) {
      const JournaledApplyStats st = applier_.durable()->stats();
      r->overwrite_repairs = st.repaired;
      r->chunks_skipped = st.duplicates_skipped;
      r->storage_reattached = starts_ > 1 && applier_.durable()->storage_reattached();
      r->durable_log_bytes = applier_.durable()->log_bytes();
      r->durable_image_bytes = applier_.durable()->image_bytes();
      r->durable_write_bytes = applier_.durable()->write_bytes();
      r->durable_restore_s = applier_.durable()->restore_s();
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

bool SocketNode::Finished() const {
  if (recovery_ == nullptr) return host_->done();
  if (recovery_->mode() == RecoveryPolicy::Mode::kGaveUp) return true;
  if (host_ == nullptr) {
    return plan_.rank != 0 && recovery_->mode() == RecoveryPolicy::Mode::kCommitted;
  }
  if (!host_->done()) return false;
  if (!host_->failed()) return true;
  return plan_.rank != 0 && recovery_->mode() == RecoveryPolicy::Mode::kCommitted;
}

std::function<bool()> SocketNode::ParentGoneCheck() {
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

bool SocketNode::AllReportsOk(const std::vector<CommitReport>& reports) const {
  return static_cast<int>(CommittedRanks(reports).size()) >=
         static_cast<int>(plan_.parents.size()) - 1;
}

Status SocketNode::CollectStoreReports(std::vector<CommitReport>* reports) {
  std::set<int> have = CommittedRanks(*reports);
  const int n = static_cast<int>(plan_.parents.size());
  // A version of a long-lived run waits at most the per-receiver deadline: its joint commit
  // (versions.h SenderJointCommit) declares each receiver without a report dead, so an absent
  // or silent host does not hold the version back. A single refit waits until its deadline.
  const bool joint = plan_.version > 0;
  const double until =
      joint ? std::min(deadline_, SteadyNow() + plan_.receiver_deadline_s) : deadline_;
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
      if (const std::string why = rec->report.ok ? internal::CommitmentMismatch(
                                                       rec->report, builder_.signed_commitment())
                                                 : std::string();
          !why.empty()) {
        if (refused_store_reports_.insert(rank).second) {
          std::fprintf(stderr, "node %d: refused the store's commit report of rank %d: %s\n",
                       plan_.rank, rank, why.c_str());
        }
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
    // The missing ranks waited for: with a joint commit, not those it holds dead.
    std::string missing;
    for (int rank = 1; rank < n; ++rank) {
      const bool dead = std::find(plan_.dead_ranks.begin(), plan_.dead_ranks.end(), rank) !=
                        plan_.dead_ranks.end();
      if (!have.count(rank) && !dead) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(rank);
      }
    }
    if (joint && missing.empty()) return Status();
    if (joint && SteadyNow() > until && until < deadline_) {
      std::fprintf(stderr,
                   "sender: no commit report of version %llu from receivers %s within the "
                   "per-receiver deadline (%g s)\n",
                   static_cast<unsigned long long>(plan_.version), missing.c_str(),
                   plan_.receiver_deadline_s);
      return Status();
    }
    if (SteadyNow() > deadline_) {
      return DeadlineExceededError("sender: commit reports of " +
                                   std::to_string(n - 1 - static_cast<int>(have.size())) +
                                   " receivers never reached the tree or the store");
    }
    usleep(20000);
  }
}

const internal::TlsContext* SocketNode::ReportCredentials() const {
  if (const internal::TlsContext* tls = links_.tls(); tls != nullptr) return tls;
  if (report_tls_ == nullptr && !report_tls_tried_ && !plan_.tls_cert.empty()) {
    report_tls_tried_ = true;
    auto loaded = internal::TlsContext::Load(plan_.tls_ca, plan_.tls_cert, plan_.tls_key);
    if (loaded.ok()) report_tls_ = *loaded;
  }
  return report_tls_.get();
}

internal::ReportRecord SocketNode::OwnReport(const Status& s) const {
  CommitReport r;
  r.rank = plan_.rank;
  r.run = plan_.run_id;
  r.version = plan_.version;
  r.ok = s.ok();
  if (s.ok()) {
    r.target_hash = applier_.held().hash;
    r.commitment =
        applier_.ReportedCommitment(ReportCredentials() != nullptr || !plan_.trust_key.empty());
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

void SocketNode::MarkCommittedInMetrics() {
  const double at = state_.result()->t_commit;
  state_.UpdateMetrics([at](internal::NodeMetrics* m) {
    m->committed = true;
    m->committed_at = at;
  });
}

void SocketNode::StartFreezeWatch() {
  const VersionFloor* f = applier_.floor();
  const int rank = plan_.rank;
  freeze_watch_ = std::make_unique<internal::FreezeWatch>(
      plan_.freeze_after_s, f != nullptr ? f->committed_unix() : 0, f != nullptr ? f->version() : 0,
      WallNow(), [this, rank](double frozen_s, const std::string& message) {
        state_.UpdateMetrics(
            [frozen_s](internal::NodeMetrics* m) { m->freeze_seconds = frozen_s; });
        if (!message.empty()) std::fprintf(stderr, "node %d: %s\n", rank, message.c_str());
      });
}

Status SocketNode::Setup() {
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
  if (FaultPoints* f = InstalledFaultPoints()) f->Arm(plan_, starts_);
  const bool recover = !plan_.state_dir.empty() && !plan_.store.empty();
  const bool restarted = recover && starts_ > 1;
  const bool tree = plan_.transport == "relay_tree";
  if (!sender) {
    DCR_RETURN_IF_ERROR(
        applier_.Open(plan_, starts_, carry_ != nullptr ? std::move(*carry_) : ReceiverStack()));
  }
  if (!sender && plan_.freeze_after_s > 0) StartFreezeWatch();
  if (recover) {
    RecoveryOptions ro;
    ro.prefix = plan_.relay.prefix;
    // The supervisor's restarts before this one were each a recovery of this node.
    recovery_ =
        std::make_unique<RecoveryPolicy>(sender ? RecoveryRole::kSender : RecoveryRole::kReceiver,
                                         ro, tree, std::max(0, starts_ - 2));
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
  const bool edge = std::find(plan_.edge_relays.begin(), plan_.edge_relays.end(), plan_.rank) !=
                    plan_.edge_relays.end();
  if (tree && !sender && edge && !restarted) DCR_RETURN_IF_ERROR(StartEdgeIngress());
  if (tree && recover && !sender) links_.set_parent_gone(ParentGoneCheck());
  if (recover && !sender) DCR_RETURN_IF_ERROR(OpenSpool(restarted));
  // A restarted node does not rejoin the tree: its peers were told it left when it died.
  if (tree && !restarted) {
    // A long-lived receiver waits for its version to begin as long as its plan says (the
    // trainer computes meanwhile); the version's timeout counts from the first event after Open
    // returned (its parent's first frame, the parent lost, a child lost while connecting).
    if (plan_.version > 0 && !sender && plan_.version_wait_s != 0) {
      awaiting_begin_ = true;
      deadline_ = std::max(deadline_,
                           plan_.version_wait_s < 0 ? t0_ + kForeverS : t0_ + plan_.version_wait_s);
    }
    DCR_RETURN_IF_ERROR(links_.Open(host_->links(), deadline_));
  }
  if (tree && restarted) {  // ... but its parent and its children learn so at once
    DCR_ASSIGN_OR_RETURN(std::unique_ptr<NodePolicy> tree_role, MakeNodePolicy(plan_));
    for (const Link& l : tree_role->links()) {
      if (!l.to_child) DCR_RETURN_IF_ERROR(links_.TurnAwayParent(l, deadline_));
    }
    DCR_RETURN_IF_ERROR(links_.LeaveChildren(tree_role->links()));
  }
  store_.set_resume(recover);
  if (!tree || recover) {
    DCR_RETURN_IF_ERROR(
        store_.Open(sender ? plan_.relay.max_parallel_puts : plan_.relay.max_parallel_fetches));
  }
  if (tree && plan_.mirror_to_store && !plan_.store.empty() && !restarted) {
    DCR_ASSIGN_OR_RETURN(std::unique_ptr<ObjectStore> mirror_store, OpenObjectStore(plan_.store));
    mirror_ = std::make_unique<internal::StoreMirror>(std::move(mirror_store), plan_.relay.prefix);
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
                          : sender         ? "sender"
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

Status SocketNode::OpenSpool(bool restarted) {
  const std::string path = plan_.state_dir + "/rank-" + std::to_string(plan_.rank) + ".spool";
  const std::string key = "run " + std::to_string(plan_.run_id) + " version " +
                          std::to_string(plan_.version) + " rank " + std::to_string(plan_.rank) +
                          " method " + plan_.method + " prefix " + plan_.relay.prefix;
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
      r->recovery_log += "restored " + std::to_string(blobs) + " blobs (" + std::to_string(bytes) +
                         " bytes) from the state dir\n";
    }
  });
  return Status();
}

Status SocketNode::Barrier() {
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

Status SocketNode::Loop() {
  if (host_ != nullptr) host_->Handle(Now(), event::Start{});
  DCR_RETURN_IF_ERROR(AfterHandle());
  while (!Finished()) {
    double until = deadline_;
    if (timer_at_ >= 0) until = std::min(until, t0_ + timer_at_);
    if (recovery_timer_at_ >= 0) until = std::min(until, t0_ + recovery_timer_at_);
    if (!plan_.progress_path.empty()) until = std::min(until, next_progress_);
    QItem item;
    const bool got = queue_.Wait(until, &item);
    if (got && awaiting_begin_) {  // the version began: its timeout counts from here
      awaiting_begin_ = false;
      deadline_ = SteadyNow() + plan_.timeout_s;
    }
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
      host_->Handle(Now(), item.event);
    }
    DCR_RETURN_IF_ERROR(AfterHandle());
  }
  return Status();
}

void SocketNode::NoteTargetHash(BlobId trailer) {
  if (plan_.method != "delta") return;
  BlobPtr b = state_.Find(trailer);
  if (!b) return;
  auto t = ParseTrailer(b->bytes.data(), b->bytes.size());
  if (t.ok()) state_.result()->target_hash = t->target_hash;
  // The root was computed before the first chunk, so it is known by the trailer.
  if (auto root = builder_.signed_commitment()) state_.result()->commitment = CommitmentHex(*root);
}

void SocketNode::WriteProgressIfDue() {
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

void SocketNode::Teardown() {
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

}  // namespace dcr::internal
