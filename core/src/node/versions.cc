#include "node/versions.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "dcr/checkpoint.h"
#include "dcr/commitment.h"
#include "dcr/status_macros.h"
#include "node/catch_up.h"
#include "node/commit_reports.h"
#include "node/metrics.h"
#include "node/store_retention.h"
#include "node/trainer_delta.h"
#include "node/version_state.h"
#include "transport/net.h"
#include "transport/tls.h"

namespace dcr::internal {

namespace {

std::string RankName(int rank) { return std::to_string(rank); }

// The sums files of the versions the sender builds (NodePlan::base_sums and target_sums): each
// build writes its target's, the next build from that version checks its base against them
// instead of hashing every element. Under <state_dir>/sender-sums, where they outlive a restart,
// or in a temporary folder removed with this object.
class SenderSums {
 public:
  static StatusOr<std::unique_ptr<SenderSums>> Open(const NodePlan& plan) {
    std::unique_ptr<SenderSums> s(new SenderSums());
    if (!plan.state_dir.empty()) {
      s->dir_ = plan.state_dir + "/sender-sums";
      if (::mkdir(s->dir_.c_str(), 0755) != 0 && errno != EEXIST) {
        return ErrnoError("sender: create " + s->dir_, errno);
      }
      return s;
    }
    const char* tmp = std::getenv("TMPDIR");
    std::string name =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/dcr-sender-sums.XXXXXX";
    if (::mkdtemp(name.data()) == nullptr) return ErrnoError("sender: create " + name, errno);
    s->dir_ = name;
    s->temporary_ = true;
    return s;
  }
  ~SenderSums() {
    if (!temporary_) return;
    for (const auto& v : targets_) ::unlink(Of(v).c_str());
    ::rmdir(dir_.c_str());
  }
  // The target sums file of `version`, which a build may write.
  std::string Target(uint64_t version) {
    targets_.insert(version);
    return Of(version);
  }
  std::string Of(uint64_t version) const { return dir_ + "/v" + std::to_string(version) + ".sums"; }
  // The sums file of `version` when one was written (here or by an earlier process), else "".
  std::string Existing(uint64_t version) const {
    const std::string p = Of(version);
    return ::access(p.c_str(), R_OK) == 0 ? p : "";
  }
  // After a build from version `from`: bases only move forward, so the sums of versions
  // before `from` are of no further use (best effort).
  void Built(uint64_t from, const std::map<uint64_t, std::string>& versions) {
    for (const auto& [v, path] : versions) {
      if (v > 0 && v < from) ::unlink(Of(v).c_str());
    }
  }

 private:
  SenderSums() = default;
  std::string dir_;
  bool temporary_ = false;
  std::set<uint64_t> targets_;
};

// The receivers of `plan`'s joint commit: the tree's ranks when they apply, and the region
// receivers.
std::vector<int> JointReceivers(const NodePlan& plan) {
  std::vector<int> receivers;
  if (plan.relay.apply) {
    for (int r = 1; r < static_cast<int>(plan.parents.size()); ++r) receivers.push_back(r);
  }
  for (int r : plan.region_receivers) receivers.push_back(r);
  return receivers;
}

// The receivers of `plan`'s joint commit that `commit` holds dead: declared, and not re-admitted
// since.
std::vector<int> DeadRanks(const NodePlan& plan, const SenderJointCommit& commit) {
  const std::vector<int> live = commit.live();
  const std::set<int> live_set(live.begin(), live.end());
  std::vector<int> dead;
  for (int rank : JointReceivers(plan)) {
    if (!live_set.count(rank)) dead.push_back(rank);
  }
  return dead;
}

}  // namespace

std::vector<CommitReport> CollectReturningTreeReports(
    ObjectStore* store, const NodePlan& plan, const std::string& prefix, uint64_t version,
    const std::string& previous_prefix, uint64_t previous, const std::vector<int>& live,
    const std::vector<CommitReport>& reports, const TlsContext* checker) {
  std::set<int> have(live.begin(), live.end());
  for (const CommitReport& c : reports) {
    if (c.ok && c.version == version) have.insert(c.rank);
  }
  const int nodes = static_cast<int>(plan.parents.size());
  const double until = SteadyNow() + plan.receiver_deadline_s;
  std::vector<CommitReport> got;
  while (true) {
    bool waiting = false;
    for (int rank = 1; rank < nodes; ++rank) {
      if (have.count(rank)) continue;
      std::optional<CommitReport> c =
          GetRegionReport(store, prefix, rank, plan.run_id, version, checker);
      if (c && c->ok) {
        have.insert(rank);
        got.push_back(std::move(*c));
        continue;
      }
      if (previous_prefix.empty()) continue;
      std::optional<CommitReport> before =
          GetRegionReport(store, previous_prefix, rank, plan.run_id, previous, checker);
      waiting = waiting || (before && before->ok);
    }
    if (!waiting || SteadyNow() >= until) break;
    usleep(20000);
  }
  return got;
}

SenderJointCommit::SenderJointCommit(const std::vector<int>& receivers, const VersionId& initial)
    : coordinator_(initial, CommitOptions{}) {
  for (int r : receivers) {
    // Names are distinct ranks and `initial` is the only published version: cannot fail.
    (void)coordinator_.AddReceiver(RankName(r), initial);
  }
}

StatusOr<std::vector<std::pair<int, std::string>>> SenderJointCommit::Published(
    const VersionId& base, const VersionId& published, const std::vector<CommitReport>& reports,
    const std::optional<Sha256Digest>& root, std::vector<int>* readmitted) {
  DCR_RETURN_IF_ERROR(coordinator_.Publish(base, published));
  std::map<int, const CommitReport*> by_rank;
  for (const CommitReport& r : reports) by_rank[r.rank] = &r;
  // Why a committed report does not prove `published` (empty: it does).
  auto mismatch = [&](const CommitReport& r) -> std::string {
    if (r.version != published.number) {
      return "reported version " + std::to_string(r.version) + ", not " + published.ToString();
    }
    if (root) return internal::CommitmentMismatch(r, root);
    if (r.target_hash != published.hash) {
      return "reported content hash " + r.target_hash.ToHex() + ", not " + published.ToString() +
             " (" + published.hash.ToHex() + ")";
    }
    return std::string();
  };
  std::vector<std::pair<int, std::string>> dead;
  for (const auto& [name, held] : coordinator_.receivers()) {
    const int rank = std::stoi(name);
    auto it = by_rank.find(rank);
    std::string why;
    if (it == by_rank.end()) {
      why = "no commit report of version " + std::to_string(published.number);
    } else if (!it->second->ok) {
      why = "reported a failure: " + it->second->error;
    } else if (const std::string m = mismatch(*it->second); !m.empty()) {
      why = "version " + std::to_string(published.number) + ": " + m;
    } else {
      Status s = coordinator_.OnCommitted(name, published);
      if (s.ok()) continue;
      why = s.message();
    }
    dead.emplace_back(rank, why);
  }
  for (const auto& d : dead) (void)coordinator_.RemoveReceiver(RankName(d.first));
  const auto live_now = coordinator_.receivers();
  for (const auto& [rank, r] : by_rank) {
    if (live_now.count(RankName(rank)) || !r->ok || !mismatch(*r).empty()) continue;
    bool just_dead = false;
    for (const auto& d : dead) just_dead = just_dead || d.first == rank;
    if (just_dead) continue;
    if (coordinator_.AddReceiver(RankName(rank), published).ok() && readmitted != nullptr) {
      readmitted->push_back(rank);
    }
  }
  return dead;
}

std::vector<int> SenderJointCommit::live() const {
  std::vector<int> out;
  for (const auto& [name, held] : coordinator_.receivers()) out.push_back(std::stoi(name));
  return out;
}

Status WriteResultFile(const std::string& path, const NodeResult& r) {
  if (path.empty()) return Status();
  const std::string js = NodeResultToJson(r);
  return WriteFileAtomic(path, js.data(), js.size());
}

StatusOr<NodeResult> ReadResultFile(const std::string& path) {
  DCR_ASSIGN_OR_RETURN(auto text, ReadFile(path));
  return NodeResultFromJson(std::string(text.begin(), text.end()));
}

Status RunNodeVersions(const NodePlan& plan, NodeResult* result) {
  return RunNodeVersions(plan, result, VersionHooks());
}

namespace {

// `text` with the number of its last occurrence of `before` + <digits> + `after` replaced by
// `number` (unchanged when there is none).
std::string Renumber(const std::string& text, const std::string& before, const std::string& after,
                     uint64_t number) {
  for (size_t at = text.rfind(before); at != std::string::npos;
       at = at == 0 ? std::string::npos : text.rfind(before, at - 1)) {
    size_t end = at + before.size();
    while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
    if (end == at + before.size() || text.compare(end, after.size(), after) != 0) continue;
    return text.substr(0, at + before.size()) + std::to_string(number) + text.substr(end);
  }
  return text;
}

}  // namespace

NodeVersion NextOpenVersion(const NodeVersion& v) {
  NodeVersion n;
  n.version = v.version + 1;
  n.prefix = Renumber(v.prefix, "step-", "", n.version);
  n.result_path = Renumber(v.result_path, "-v", ".json", n.version);
  return n;
}

namespace {

// The checks of a plan's versions before any is taken: numbers increase from above 0; a region
// receiver takes a listed set; an edge relay of several versions has a state_dir (it transcodes
// each version against the checkpoint it committed of the version before, receiver_base_path,
// which VersionRecovery moves on).
Status CheckVersionsOfPlan(const NodePlan& plan) {
  uint64_t last = 0;
  for (const NodeVersion& v : plan.versions) {
    if (v.version <= last) {
      return InvalidArgumentError("plan.versions: version " + std::to_string(v.version) +
                                  " follows version " + std::to_string(last) +
                                  " (numbers must increase from above 0)");
    }
    last = v.version;
  }
  if (plan.region_receiver && plan.open_versions) {
    return FailedPreconditionError(
        "plan.open_versions: a region receiver takes a listed set of versions (give the "
        "versions, e.g. model.checkpoints, for a run with region receivers)");
  }
  if ((plan.versions.size() > 1 || plan.open_versions) && plan.state_dir.empty() &&
      std::find(plan.edge_relays.begin(), plan.edge_relays.end(), plan.rank) !=
          plan.edge_relays.end()) {
    return FailedPreconditionError(
        "plan.edge_relays: an edge relay of several versions needs plan.state_dir (it "
        "transcodes each version against the checkpoint it committed of the one before)");
  }
  return Status();
}

// The sender's sums of the versions it builds, a cache: null (each base hashed in full) when its
// folder cannot be made, which costs each version a full hash of its base, not the refit.
std::unique_ptr<SenderSums> OpenSenderSums(const NodePlan& plan) {
  auto opened = SenderSums::Open(plan);
  if (opened.ok()) return std::move(*opened);
  std::fprintf(stderr, "sender: no sums of the versions it builds (each base hashed in full): %s\n",
               opened.status().ToString().c_str());
  return nullptr;
}

// The sender's joint commit: resumed from the state an earlier process recorded (whose published
// versions the next deltas may be built from join `checkpoint_of`), else fresh from the base.
StatusOr<std::unique_ptr<SenderJointCommit>> OpenJointCommit(
    const NodePlan& plan, const VersionRecovery* recovery,
    std::map<uint64_t, std::string>* checkpoint_of) {
  if (recovery != nullptr && recovery->commit().has_value()) {
    for (const auto& [k, path] : recovery->commit()->checkpoints) {
      std::string& known = (*checkpoint_of)[k];
      if (known.empty()) known = path;
    }
    return std::make_unique<SenderJointCommit>(recovery->commit()->live,
                                               recovery->commit()->baseline);
  }
  DCR_ASSIGN_OR_RETURN(auto c, Checkpoint::Open(plan.base_path));
  VersionId base{0, c->ContentHash(plan.build_threads)};
  return std::make_unique<SenderJointCommit>(JointReceivers(plan), base);
}

// The reports a sender takes from the region store for version `versions[i]` (prefix `prefix`),
// into `r->reports`: the region receivers' (the live ones and those returning, each waited for at
// most receiver_deadline_s), and those of tree receivers held dead that are on their way back
// (catching up from the store, or restarted mid-version), which often arrive after the tree's
// version ended. A report counts only when its rank signed it (`checker`, null: unsigned runs).
void CollectStoreReports(ObjectStore* region, const NodePlan& plan, const SenderJointCommit& commit,
                         const std::vector<NodeVersion>& versions, size_t i,
                         const std::string& prefix, const TlsContext* checker, NodeResult* r) {
  const NodeVersion& v = versions[i];
  std::set<int> wait_for;
  const std::vector<int> live = commit.live();
  const std::set<int> live_set(live.begin(), live.end());
  const int first_rank = static_cast<int>(plan.parents.size());
  for (int rank : plan.region_receivers) {
    if (live_set.count(rank)) wait_for.insert(rank);
  }
  for (int rank : TakeReturning(region, CatchUpRoot(plan))) wait_for.insert(rank);
  if (i > 0) {
    for (const CommitReport& c : CollectRegionReports(region, versions[i - 1].prefix, plan.run_id,
                                                      versions[i - 1].version, first_rank, {}, 0)) {
      wait_for.insert(c.rank);
    }
  }
  std::vector<std::string> refused;
  std::vector<CommitReport> got =
      CollectRegionReports(region, prefix, plan.run_id, v.version, first_rank, wait_for,
                           plan.receiver_deadline_s, checker, &refused);
  for (CommitReport& c : got) r->reports.push_back(std::move(c));
  for (const std::string& why : refused) {
    std::fprintf(stderr, "sender: refused the region store's commit report of receiver %s\n",
                 why.c_str());
  }
  for (CommitReport& c : CollectReturningTreeReports(
           region, plan, prefix, v.version, i > 0 ? versions[i - 1].prefix : std::string(),
           i > 0 ? versions[i - 1].version : 0, commit.live(), r->reports, checker)) {
    r->reports.push_back(std::move(c));
  }
}

// A tree receiver whose next version retention removed asks for a full frame: the sender serves
// one of version `version`, just published, from the trainer's checkpoint of it (`target_path`;
// the receiver checks it against the version's trailer and, signed, the trainer's commitment).
// Region receivers' requests (ranks from plan.parents.size() on) are left to their in-region
// holders (serve_full_frames), so none of their frames crosses the long link. True when it served
// a request (`r` then says how many and is written to its result file).
bool ServeFramesFromTrainer(ObjectStore* region, const NodePlan& plan, const std::string& prefix,
                            const std::string& target_path, uint64_t version,
                            const std::string& result_path, NodeResult* r) {
  StatusOr<int> served = ServeFullFrameRequestsFromCheckpoint(
      region, plan, prefix, target_path, static_cast<int>(plan.parents.size()));
  if (served.ok() && *served > 0) {
    r->full_frames_served = *served;
    std::fprintf(stderr,
                 "sender: full frame of version %llu put in the region store for %d "
                 "request(s)\n",
                 static_cast<unsigned long long>(version), *served);
    (void)WriteResultFile(result_path, *r);
    return true;
  }
  if (!served.ok()) {
    std::fprintf(stderr, "sender: full-frame request not served: %s\n",
                 served.status().ToString().c_str());
  }
  return false;
}

}  // namespace

Status RunNodeVersions(const NodePlan& plan, NodeResult* result, const VersionHooks& hooks) {
  *result = NodeResult();
  result->rank = plan.rank;
  DCR_RETURN_IF_ERROR(CheckVersionsOfPlan(plan));
  if (plan.region_receiver) return RunRegionReceiverVersions(plan, result);
  const bool sender = plan.rank == 0;
  const bool delta = plan.method == "delta";
  const bool joint = sender && delta && plan.transport == "relay_tree";
  // The checkpoint of every version number the sender may build from: 0 is plan.base_path.
  std::map<uint64_t, std::string> checkpoint_of{{0, plan.base_path}};
  for (const NodeVersion& v : plan.versions) checkpoint_of[v.version] = v.target_path;
  // With a state_dir: each version recovers as a one-version node (version_state.h), and a
  // restarted process resumes at the version it was in.
  std::unique_ptr<VersionRecovery> recovery;
  if (!plan.state_dir.empty()) {
    DCR_ASSIGN_OR_RETURN(recovery, VersionRecovery::Open(plan));
  }
  std::unique_ptr<SenderSums> sums;  // null: every base hashed in full
  if (sender && delta) sums = OpenSenderSums(plan);
  std::unique_ptr<SenderJointCommit> commit;
  if (joint) {
    DCR_ASSIGN_OR_RETURN(commit, OpenJointCommit(plan, recovery.get(), &checkpoint_of));
  }
  // The in-region store: the region receivers' reports (sender), full frames (a holder).
  // A recovering tree receiver: the versions retention collected, taken as a full frame.
  const bool collected_catch_up = !sender && delta && plan.transport == "relay_tree" &&
                                  recovery != nullptr && !plan.store.empty();
  std::unique_ptr<ObjectStore> region;
  if (!plan.store.empty() && (joint || (plan.serve_full_frames && !sender) || collected_catch_up)) {
    DCR_ASSIGN_OR_RETURN(region, OpenObjectStore(plan.store));
  }
  // The sender checks the region receivers' reports against the run's credentials: a report in
  // the store counts only when its rank signed it.
  std::shared_ptr<const TlsContext> checker;
  if (joint && region != nullptr && !plan.tls_cert.empty()) {
    DCR_ASSIGN_OR_RETURN(checker, TlsContext::Load(plan.tls_ca, plan.tls_cert, plan.tls_key));
  }
  // A recovering in-region holder serves full frames from the committed checkpoint of the
  // version it holds, which exists on every device and survives a restart (on "cpu" the
  // process's storage does not live from version to version).
  const bool holder = region != nullptr && !sender && plan.serve_full_frames;
  auto serve = [&](const std::string& prefix, uint64_t version, const StorageLayer* from,
                   NodeResult* r) {
    StatusOr<int> served = 0;
    if (from != nullptr) {
      served = ServeFullFrameRequests(region.get(), plan, prefix, *from);
    } else {
      StatusOr<std::string> held_path = recovery->HeldPath();
      if (held_path.ok()) {
        served = ServeFullFrameRequestsFromCheckpoint(region.get(), plan, prefix, *held_path);
      } else {
        served = held_path.status();
      }
    }
    if (served.ok() && *served > 0) {
      r->full_frames_served = *served;
      std::fprintf(
          stderr, "node %d: full frame of version %llu put in the region store for %d request(s)\n",
          plan.rank, static_cast<unsigned long long>(version), *served);
      return true;
    }
    if (!served.ok()) {
      std::fprintf(stderr, "node %d: full-frame request not served: %s\n", plan.rank,
                   served.status().ToString().c_str());
    }
    return false;
  };
  std::optional<NodeVersion> finished_held;  // restarted holder: the last version it finished
  ReceiverStack storage;                     // a delta receiver's stack, version to version
  Hash128 built_from;                        // the sender's base hash for the version in flight
  Status s;
  // The versions taken so far: an open-ended plan gets the next one as each begins.
  std::vector<NodeVersion> versions = plan.versions;
  for (size_t i = 0; i < versions.size(); ++i) {
    if (plan.open_versions && i + 1 == versions.size()) {
      versions.push_back(NextOpenVersion(versions[i]));
      if (recovery != nullptr) {
        s = recovery->AddVersion(versions.back().version);
        if (!s.ok()) break;
      }
    }
    if (recovery != nullptr && recovery->Finished(versions[i])) {
      // Finished by an earlier process of this node: its result stands.
      auto r = ReadResultFile(versions[i].result_path);
      if (r.ok()) *result = *r;
      if (holder) finished_held = versions[i];
      continue;
    }
    if (recovery != nullptr) {
      // What an earlier process committed is proven by the trainer's signature before it is
      // served, reported or built on.
      s = recovery->CheckHeld();
      if (!s.ok()) break;
    }
    if (finished_held.has_value()) {
      // A holder restarted after it committed a version serves what is pending from it.
      NodeResult ignored;
      serve(finished_held->prefix, finished_held->version, nullptr, &ignored);
      finished_held.reset();
    }
    if (collected_catch_up) {
      // Retention may have removed this version's delta (and its parent moved on): the node
      // then takes a full frame of a later version and goes on from there.
      const double until = plan.version_wait_s < 0
                               ? SteadyNow() + 1e12
                               : SteadyNow() + std::max(plan.timeout_s, plan.version_wait_s);
      StatusOr<size_t> took =
          CatchUpCollectedVersion(region.get(), plan, &versions, i, recovery.get(), until, result);
      if (!took.ok()) {
        s = took.status();
        break;
      }
      if (*took != i) {
        storage = decltype(storage)();  // the next version starts from the frame's file
        if (plan.open_versions && *took + 1 == versions.size()) {
          versions.push_back(NextOpenVersion(versions.back()));
          s = recovery->AddVersion(versions.back().version);
          if (!s.ok()) break;
        }
        if (hooks.done) hooks.done(versions[*took], *result, Status());
        i = *took;
        continue;
      }
    }
    const NodeVersion& v = versions[i];
    NodePlan p = plan;
    p.versions.clear();
    p.version = v.version;
    p.target_path = v.target_path;
    std::string handed_delta;       // the trainer's own delta of this version
    if (sender && hooks.content) {  // the trainer hands the version's content now
      StatusOr<VersionContent> handed = hooks.content(v);
      if (!handed.ok()) {
        s = handed.status();
        break;
      }
      if (handed->end) break;  // the trainer ended the run before this version
      p.target_path = handed->checkpoint;
      checkpoint_of[v.version] = handed->checkpoint;
      handed_delta = handed->delta_path;
    }
    p.verify_path = v.verify_path;
    // The ranks the joint commit holds dead are not waited for.
    if (commit != nullptr) p.dead_ranks = DeadRanks(plan, *commit);
    if (!v.prefix.empty()) p.relay.prefix = v.prefix;
    p.result_path = v.result_path;
    if (recovery != nullptr) recovery->Prepare(v, i, &p);
    if (recovery != nullptr && delta && !sender &&
        std::find(plan.edge_relays.begin(), plan.edge_relays.end(), plan.rank) !=
            plan.edge_relays.end()) {
      // An edge relay transcodes against the bytes of the version it holds, as a file.
      StatusOr<std::string> held_path = recovery->HeldPath();
      if (!held_path.ok()) {
        s = held_path.status();
        break;
      }
      p.receiver_base_path = *held_path;
    }
    if (i > 0) {  // this version's own barrier files
      const std::string tag = ".v" + std::to_string(v.version);
      if (!p.ready_path.empty()) p.ready_path += tag;
      if (!p.go_path.empty()) p.go_path += tag;
    }
    if (sender && delta) {
      // Over the tree: the baseline of the joint commit. Over the store (no reports reach the
      // uploader): the version before.
      const uint64_t from = joint    ? commit->baseline().number
                            : i == 0 ? 0
                                     : versions[i - 1].version;
      p.base_version = static_cast<int64_t>(from);
      const auto known = checkpoint_of.find(from);
      if (known == checkpoint_of.end() || known->second.empty()) {
        s = FailedPreconditionError("sender: version " + std::to_string(v.version) +
                                    " is built from version " + std::to_string(from) +
                                    ", whose checkpoint this sender does not know (its state " +
                                    "records none)");
        break;
      }
      p.base_path = known->second;
      if (joint) built_from = commit->baseline().hash;
    }
    std::string trainer_delta_skipped;
    if (sender && delta && !handed_delta.empty()) {
      // The trainer's delta goes out when it is built from the version the delta must come
      // from, with that version's content hash; else the delta is built from the checkpoints.
      Hash128 from_hash = built_from;
      if (!joint) {
        auto c = Checkpoint::Open(p.base_path);
        if (!c.ok()) {
          s = c.status().WithContext("sender: base of version " + std::to_string(v.version));
          break;
        }
        from_hash = (*c)->ContentHash(plan.build_threads);
      }
      const VersionId want{static_cast<uint64_t>(p.base_version), from_hash};
      if (TrainerDeltaFits(handed_delta, want, v.version, p.context_coding,
                           &trainer_delta_skipped)) {
        p.delta_path = handed_delta;
      } else {
        std::fprintf(stderr, "sender: version %llu: %s; building it from the checkpoints\n",
                     static_cast<unsigned long long>(v.version), trainer_delta_skipped.c_str());
      }
    }
    if (sender && delta && p.delta_path.empty()) {
      // The base's sums: the user's for the plan's base, this sender's for a version it built.
      p.base_sums = p.base_version == 0 ? plan.base_sums
                    : sums != nullptr   ? sums->Existing(static_cast<uint64_t>(p.base_version))
                                        : std::string();
      p.target_sums = sums != nullptr ? sums->Target(v.version) : std::string();
    } else {
      p.base_sums.clear();
      p.target_sums.clear();
    }
    NodeResult r;
    // A receiver's storage stays up version to version (with recovery, with its version log).
    const bool carry = delta && !sender;
    s = RunNodeVersion(p, &r, carry ? &storage : nullptr);
    r.trainer_delta = !p.delta_path.empty();
    if (sender && delta) r.delta_base_version = p.base_version;
    if (s.ok() && !p.target_sums.empty()) {
      sums->Built(static_cast<uint64_t>(p.base_version), checkpoint_of);
    }
    r.trainer_delta_skipped = trainer_delta_skipped;
    if (!handed_delta.empty() && !joint) (void)WriteResultFile(p.result_path, r);
    *result = r;
    if (!s.ok()) {
      if (hooks.done) hooks.done(v, r, s);
      break;
    }
    if (holder && recovery == nullptr && storage.outer != nullptr) {
      // An in-region holder: a pending late joiner or laggard gets a full frame of this version.
      if (serve(p.relay.prefix, v.version, &storage.storage, &r)) {
        *result = r;
        (void)WriteResultFile(p.result_path, r);
      }
    }
    if (joint && region != nullptr) {
      CollectStoreReports(region.get(), plan, *commit, versions, i, p.relay.prefix, checker.get(),
                          &r);
    }
    if (joint) {
      const VersionId published{v.version, r.target_hash};
      std::vector<int> readmitted;
      auto dead = commit->Published(VersionId{static_cast<uint64_t>(p.base_version), built_from},
                                    published, r.reports, RootOfHex(r.commitment), &readmitted);
      if (!dead.ok()) {
        s = dead.status().WithContext("sender: joint commit of version " +
                                      std::to_string(v.version));
        break;
      }
      for (const auto& [rank, why] : *dead) {
        std::fprintf(stderr, "sender: receiver %d declared dead at version %llu: %s\n", rank,
                     static_cast<unsigned long long>(v.version), why.c_str());
        r.declared_dead.push_back(std::to_string(rank) + ": " + why);
      }
      for (int rank : readmitted) {
        std::fprintf(stderr, "sender: receiver %d joins the joint commit at version %llu\n", rank,
                     static_cast<unsigned long long>(v.version));
      }
      r.readmitted = readmitted;
      MetricsBoard::Process().SetDeadRanks(DeadRanks(plan, *commit));  // /metrics, /healthz
      // The reports the region store brought count as the tree's: the field is the number of
      // receivers that reported committing this version, whichever way.
      std::set<int> committed_ranks;
      for (const CommitReport& c : r.reports) {
        if (c.ok && c.version == v.version) committed_ranks.insert(c.rank);
      }
      r.receivers_committed =
          std::max(r.receivers_committed, static_cast<int>(committed_ranks.size()));
      if (r.receivers_committed == 0 && plan.parents.size() + plan.region_receivers.size() > 1) {
        // A version no receiver holds is not out: the sender fails (its exit and its result say
        // so) rather than report a refit that reached nobody. Its state does not record the
        // version as published, so a trainer started again hands it again.
        s = UnavailableError("sender: no receiver committed version " + std::to_string(v.version) +
                             " (" + std::to_string(r.declared_dead.size()) + " declared dead)");
        r.ok = false;
        r.error = s.ToString();
        *result = r;
        (void)WriteResultFile(p.result_path, r);
        if (hooks.done) hooks.done(v, r, s);
        break;
      }
      *result = r;
      Status w = WriteResultFile(p.result_path, r);
      if (!w.ok()) {
        s = w;
        break;
      }
      if (recovery != nullptr) {
        s = recovery->SaveCommit(v.version, commit->baseline(), commit->live(), checkpoint_of);
        if (!s.ok()) break;
      }
    }
    if (joint && region != nullptr &&
        ServeFramesFromTrainer(region.get(), plan, p.relay.prefix, p.target_path, v.version,
                               p.result_path, &r)) {
      *result = r;
    }
    if (recovery != nullptr) {
      s = recovery->Done(p);
      if (!s.ok()) break;
      if (holder && delta && serve(p.relay.prefix, v.version, nullptr, &r)) {
        *result = r;
        (void)WriteResultFile(p.result_path, r);
      }
    }
    if (sender && plan.retain_versions > 0 && !plan.store.empty()) {
      // Retention after the commit (store_retention.h): a failed or unmeetable collection is
      // reported in the version's result and on stderr; the refit itself stands.
      const uint64_t committed = joint ? commit->baseline().number : v.version;
      Status g = CollectAfterVersion(plan, committed, &r);
      if (!g.ok()) {
        std::fprintf(stderr, "sender: retention after version %llu: %s\n",
                     static_cast<unsigned long long>(v.version), g.ToString().c_str());
      }
      *result = r;
      Status w = WriteResultFile(v.result_path, r);
      if (!w.ok()) {
        s = w;
        break;
      }
    }
    if (sender && hooks.released) hooks.released(joint ? commit->baseline().number : v.version);
    if (hooks.done) hooks.done(v, r, s);
  }
  if (s.ok() && finished_held.has_value()) {
    NodeResult ignored;
    serve(finished_held->prefix, finished_held->version, nullptr, &ignored);
  }
  if (!s.ok()) {
    result->ok = false;
    if (result->error.empty()) result->error = s.ToString();
  }
  Status w = WriteResultFile(plan.result_path, *result);
  if (s.ok() && !w.ok()) s = w;
  return s;
}

}  // namespace dcr::internal
