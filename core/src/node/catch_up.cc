#include "node/catch_up.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "dcr/checkpoint.h"
#include "dcr/commitment.h"
#include "dcr/delta.h"
#include "dcr/device.h"
#include "dcr/manifest.h"
#include "dcr/relay_policy.h"
#include "dcr/signing.h"
#include "dcr/status_macros.h"
#include "node/commit_reports.h"
#include "node/node_trust.h"
#include "node/version_state.h"
#include "node/versions.h"
#include "transport/net.h"
#include "transport/tls.h"

namespace dcr::internal {

CatchUpStep PlanCatchUp(const std::optional<uint64_t>& held,
                        const std::vector<StoredVersion>& stored, uint64_t dense_bytes,
                        const CatchUpLimits& limits) {
  std::map<uint64_t, const StoredVersion*> by_number;
  for (const StoredVersion& v : stored) {
    if (!held || v.number > *held) by_number[v.number] = &v;
  }
  uint64_t latest = held.value_or(0);  // newest version whose delta or frame is in the store
  uint64_t newest_frame = 0;
  bool any_frame = false;
  for (const auto& [n, v] : by_number) {
    if (v->delta_whole || v->full_frame) latest = std::max(latest, n);
    if (v->full_frame) {
      newest_frame = n;
      any_frame = true;
    }
  }
  CatchUpStep step;
  auto frame_or = [&](const std::string& why, bool chain_whole) {
    if (any_frame) {
      step.kind = CatchUpStep::kFullFrame;
      step.version = newest_frame;
      step.why =
          why + "; the full frame of version " + std::to_string(newest_frame) + " is in the store";
    } else if (chain_whole) {
      step.kind = CatchUpStep::kReplay;
      step.version = *held + 1;
      step.why = why + "; no full frame in the store: replaying the retained deltas";
    } else {
      step.kind = CatchUpStep::kRequestFullFrame;
      step.why = why + "; no full frame in the store yet";
    }
    return step;
  };
  if (!held) return frame_or("holds no version", false);
  if (latest <= *held + 1) {
    step.kind = CatchUpStep::kFollow;
    step.version = *held + 1;
    step.why = "in step: holds version " + std::to_string(*held);
    return step;
  }
  const uint64_t behind = latest - *held;
  bool whole = true;
  uint64_t bytes = 0;
  for (uint64_t n = *held + 1; n <= latest; ++n) {
    auto it = by_number.find(n);
    if (it == by_number.end() || !it->second->delta_whole) {
      whole = false;
      break;
    }
    bytes += it->second->delta_bytes;
  }
  const std::string head = "holds version " + std::to_string(*held) + ", " +
                           std::to_string(behind) + " behind version " + std::to_string(latest);
  if (!whole) return frame_or(head + ": a missed delta is not retained", false);
  if (behind > static_cast<uint64_t>(std::max(0, limits.max_replay))) {
    return frame_or(head + ": more than max_replay (" + std::to_string(limits.max_replay) +
                        ") deltas to replay",
                    true);
  }
  if (static_cast<double>(bytes) > limits.full_frame_fraction * static_cast<double>(dense_bytes)) {
    return frame_or(head + ": the missed deltas (" + std::to_string(bytes) +
                        " bytes) outweigh full_frame_fraction of the checkpoint",
                    true);
  }
  step.kind = CatchUpStep::kReplay;
  step.version = *held + 1;
  step.why = head + ": replaying " + std::to_string(behind) + " retained deltas (" +
             std::to_string(bytes) + " bytes) from the in-region store";
  return step;
}

std::string CatchUpRoot(const NodePlan& plan) {
  const std::string& p = plan.versions.empty() ? plan.relay.prefix : plan.versions[0].prefix;
  const size_t slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(0, slash);
}

std::string FullFrameKey(const std::string& prefix) { return prefix + "/full/frame.safetensors"; }

std::string FullFrameRequestKey(const std::string& root, int rank) {
  return root + "/catch-up/requests/" + std::to_string(rank);
}

std::string RegionReportKey(const std::string& prefix, int rank) {
  return prefix + "/reports/" + std::to_string(rank);
}

std::string ReturningKey(const std::string& root, int rank) {
  return root + "/catch-up/returning/" + std::to_string(rank);
}

std::vector<int> TakeReturning(ObjectStore* store, const std::string& root) {
  std::vector<int> out;
  const std::string dir = root + "/catch-up/returning/";
  auto listed = store->List(dir);
  if (!listed.ok()) return out;
  for (const ObjectInfo& o : *listed) {
    const std::string tail = o.key.substr(std::min(o.key.size(), dir.size()));
    char* end = nullptr;
    const long rank = std::strtol(tail.c_str(), &end, 10);
    if (tail.empty() || *end != '\0' || rank < 0) continue;
    out.push_back(static_cast<int>(rank));
    (void)store->Delete(o.key);
  }
  return out;
}

StatusOr<StoredVersion> InspectStoredVersion(ObjectStore* store, const std::string& prefix,
                                             uint64_t number) {
  StoredVersion out;
  out.number = number;
  DCR_ASSIGN_OR_RETURN(std::vector<ObjectInfo> objects, store->List(prefix + "/"));
  std::set<uint64_t> ids;
  int64_t trailer = -1;
  uint64_t bytes = 0;
  const std::string frame = FullFrameKey(prefix);
  for (const ObjectInfo& o : objects) {
    if (o.key == frame) {
      out.full_frame = true;
      continue;
    }
    auto b = ParseObjectKey(prefix, o.key);
    if (!b.ok()) continue;  // reports, frames, requests
    ids.insert(b->id);
    bytes += o.size;
    if (b->kind == BlobKind::kTrailer) trailer = static_cast<int64_t>(b->id);
  }
  if (trailer >= 0 && ids.size() == static_cast<size_t>(trailer) + 1 &&
      *ids.rbegin() == static_cast<uint64_t>(trailer)) {
    out.delta_whole = true;
    out.delta_bytes = bytes;
  }
  return out;
}

StatusOr<std::vector<uint8_t>> FullFrameImage(const StorageLayer& storage) {
  const BufferReceiver* host = storage.host;
  const DeviceReceiver* device = storage.device;
  if (host == nullptr && device == nullptr) {
    return UnimplementedError("full frame: the storage is neither host memory nor a device's");
  }
  if (storage.receiver()->in_delta()) {
    return FailedPreconditionError("full frame: a delta is in progress");
  }
  std::vector<TensorView> views;
  std::vector<std::vector<uint8_t>> downloaded;  // a device's tensors, copied to host memory
  if (host != nullptr) {
    for (const ReceiverTensor& t : host->tensors()) {
      views.push_back(
          TensorView{t.info.name, t.info.dtype_name, t.info.shape, t.data, t.info.nbytes});
    }
  } else {
    downloaded.reserve(device->tensors().size());
    for (const DeviceReceiverTensor& t : device->tensors()) {
      downloaded.emplace_back(t.info.nbytes);
      if (t.info.nbytes > 0) {
        DCR_RETURN_IF_ERROR(device->device()
                                ->Download(downloaded.back().data(), t.data, t.info.nbytes)
                                .WithContext("full frame: tensor '" + t.info.name + "'"));
      }
      views.push_back(TensorView{t.info.name, t.info.dtype_name, t.info.shape,
                                 downloaded.back().data(), t.info.nbytes});
    }
  }
  return SafetensorsImage(views);
}

StatusOr<uint64_t> PutFullFrame(ObjectStore* store, const std::string& prefix,
                                const StorageLayer& storage) {
  DCR_ASSIGN_OR_RETURN(const std::vector<uint8_t> image, FullFrameImage(storage));
  DCR_RETURN_IF_ERROR(store->Put(FullFrameKey(prefix), image.data(), image.size()));
  return static_cast<uint64_t>(image.size());
}

StatusOr<uint64_t> PutFullFrameOfCheckpoint(ObjectStore* store, const std::string& prefix,
                                            const std::string& checkpoint_path) {
  DCR_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::Open(checkpoint_path));
  std::vector<uint8_t> image;
  if (!ckpt->sharded()) {
    DCR_ASSIGN_OR_RETURN(image, ReadFile(checkpoint_path));
  } else {
    std::vector<TensorView> views;
    for (const TensorInfo& t : ckpt->tensors()) {
      views.push_back(TensorView{t.name, t.dtype_name, t.shape, ckpt->data(t), t.nbytes});
    }
    image = SafetensorsImage(views);
  }
  DCR_RETURN_IF_ERROR(store->Put(FullFrameKey(prefix), image.data(), image.size()));
  return static_cast<uint64_t>(image.size());
}

namespace {

// The verifier of version `number`'s stream under `prefix` once its header and its final
// manifest verified (StoredSignedCommitment's checks).
StatusOr<std::unique_ptr<StreamVerifier>> VerifyStoredFinal(ObjectStore* store,
                                                            const std::string& prefix,
                                                            uint64_t number,
                                                            const FrameTrust& trust) {
  const std::string what = "signed commitment of version " + std::to_string(number);
  DCR_ASSIGN_OR_RETURN(std::vector<ObjectInfo> objects, store->List(prefix + "/"));
  std::string header_key;
  std::vector<std::pair<BlobId, std::string>> chunks;
  for (const ObjectInfo& o : objects) {
    auto b = ParseObjectKey(prefix, o.key);
    if (!b.ok()) continue;
    if (b->kind == BlobKind::kHeader) header_key = o.key;
    if (b->kind == BlobKind::kChunk) chunks.emplace_back(b->id, o.key);
  }
  if (header_key.empty()) {
    return NotFoundError(what + ": no delta header under " + prefix);
  }
  DCR_ASSIGN_OR_RETURN(std::vector<uint8_t> header, store->Get(header_key));
  auto verifier = std::make_unique<StreamVerifier>(trust.key, trust.run_id);
  DCR_RETURN_IF_ERROR(verifier->Begin(header.data(), header.size()).WithContext(what));
  if (verifier->header().target_version != number) {
    return FailedPreconditionError(what + ": the stream under " + prefix + " is of version " +
                                   std::to_string(verifier->header().target_version));
  }
  // The final manifest leads the stream's last batch: look from the last blob back.
  std::sort(chunks.rbegin(), chunks.rend());
  for (const auto& [id, key] : chunks) {
    DCR_ASSIGN_OR_RETURN(std::vector<uint8_t> blob, store->Get(key));
    if (!IsManifestRecord(blob.data(), blob.size())) continue;
    size_t rsize = 0;
    DCR_ASSIGN_OR_RETURN(Manifest m, ParseManifest(blob.data(), blob.size(), &rsize));
    if (!m.final) continue;
    DCR_RETURN_IF_ERROR(verifier->AddManifest(blob.data(), rsize, nullptr).WithContext(what));
    if (!verifier->signed_commitment()) {
      return FailedPreconditionError(what + ": the signed final manifest carries no commitment");
    }
    return verifier;
  }
  return FailedPreconditionError(what + ": no signed final manifest under " + prefix);
}

}  // namespace

StatusOr<SignedCommitment> StoredSignedCommitment(ObjectStore* store, const std::string& prefix,
                                                  uint64_t number, const FrameTrust& trust) {
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<StreamVerifier> v,
                       VerifyStoredFinal(store, prefix, number, trust));
  SignedCommitment c;
  c.root = v->signed_commitment();
  c.leaves = v->signed_commitment_leaves();
  return c;
}

StatusOr<std::unique_ptr<BufferReceiver>> FetchFullFrame(ObjectStore* store,
                                                         const std::string& prefix, uint64_t number,
                                                         uint64_t* bytes, const FrameTrust* trust) {
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt,
                       FetchFullFrameCheckpoint(store, prefix, number, bytes, trust));
  return BufferReceiver::Copy(*ckpt, number);
}

StatusOr<std::unique_ptr<Checkpoint>> FetchFullFrameCheckpoint(ObjectStore* store,
                                                               const std::string& prefix,
                                                               uint64_t number, uint64_t* bytes,
                                                               const FrameTrust* trust) {
  *bytes = 0;
  DCR_ASSIGN_OR_RETURN(std::vector<ObjectInfo> objects, store->List(prefix + "/"));
  std::string trailer_key;
  for (const ObjectInfo& o : objects) {
    auto b = ParseObjectKey(prefix, o.key);
    if (b.ok() && b->kind == BlobKind::kTrailer) trailer_key = o.key;
  }
  if (trailer_key.empty()) {
    return NotFoundError("full frame of version " + std::to_string(number) + ": no trailer under " +
                         prefix + " to check it against");
  }
  DCR_ASSIGN_OR_RETURN(std::vector<uint8_t> trailer_bytes, store->Get(trailer_key));
  DCR_ASSIGN_OR_RETURN(Trailer trailer, ParseTrailer(trailer_bytes.data(), trailer_bytes.size()));
  DCR_ASSIGN_OR_RETURN(std::vector<uint8_t> image, store->Get(FullFrameKey(prefix)));
  *bytes = trailer_bytes.size() + image.size();
  auto ckpt = Checkpoint::FromBytes(std::move(image));
  if (!ckpt.ok()) {
    return DataLossError("full frame of version " + std::to_string(number) + ": " +
                         ckpt.status().message());
  }
  const Hash128 got = (*ckpt)->ContentHash();
  if (got != trailer.target_hash) {
    return DataLossError("full frame of version " + std::to_string(number) + ": content hash " +
                         got.ToHex() + ", the version's trailer says " +
                         trailer.target_hash.ToHex());
  }
  if (trust != nullptr && trust->key != nullptr) {
    // The trailer is only as trusted as the store; the trainer's signed commitment is the proof.
    DCR_ASSIGN_OR_RETURN(std::unique_ptr<StreamVerifier> verifier,
                         VerifyStoredFinal(store, prefix, number, *trust));
    std::vector<TensorView> views;
    for (const TensorInfo& t : (*ckpt)->tensors()) {
      views.push_back(TensorView{t.name, t.dtype_name, t.shape, (*ckpt)->data(t), t.nbytes});
    }
    const std::vector<Sha256Digest> leaves = verifier->signed_commitment_leaves();
    DCR_RETURN_IF_ERROR(
        CheckCommitment(views, *verifier->signed_commitment(), &leaves, 0)
            .WithContext("full frame of version " + std::to_string(number) + " refused"));
    if (!trust->signed_state_path.empty()) {
      DCR_RETURN_IF_ERROR(WriteSignedState(trust->signed_state_path, *verifier));
    }
  }
  return std::move(*ckpt);
}

Status PutRegionReport(ObjectStore* store, const std::string& prefix, int rank, uint64_t run,
                       uint64_t version, const Hash128& hash,
                       const std::optional<Sha256Digest>& root, const TlsContext* signer) {
  CommitReport r;
  r.rank = rank;
  r.run = run;
  r.version = version;
  r.target_hash = hash;
  r.commitment = root;
  r.ok = true;
  ReportRecord record = EncodeReportRecord(r);
  if (signer != nullptr) {
    const auto body = ReportBody(record);
    DCR_ASSIGN_OR_RETURN(std::vector<uint8_t> tail, signer->SignReport(body.first, body.second));
    SetReportTail(&record, std::move(tail));
  }
  return store->Put(RegionReportKey(prefix, rank), record.bytes.data(), record.bytes.size());
}

StatusOr<bool> RestoreRegionReport(ObjectStore* store, const std::string& prefix, int rank,
                                   uint64_t run, uint64_t version, const std::string& held_path,
                                   const TlsContext* signer) {
  if (GetRegionReport(store, prefix, rank, run, version)) return false;
  DCR_ASSIGN_OR_RETURN(const StoredVersion sv, InspectStoredVersion(store, prefix, version));
  if (!sv.delta_whole && !sv.full_frame) return false;
  DCR_ASSIGN_OR_RETURN(auto held, Checkpoint::Open(held_path));
  DCR_ASSIGN_OR_RETURN(const Commitment root, CheckpointCommitment(*held, 0));
  DCR_RETURN_IF_ERROR(
      PutRegionReport(store, prefix, rank, run, version, held->ContentHash(), root.root, signer));
  return true;
}

std::optional<CommitReport> GetRegionReport(ObjectStore* store, const std::string& prefix, int rank,
                                            uint64_t run, uint64_t version,
                                            const TlsContext* checker, std::string* refused) {
  auto got = store->Get(RegionReportKey(prefix, rank));
  if (!got.ok()) return std::nullopt;
  size_t consumed = 0;
  auto rec = ParseReportRecord(got->data(), got->size(), &consumed);
  if (!rec.ok() && rec.status().IsFailedPrecondition()) {  // another format
    if (refused != nullptr) *refused = rec.status().message();
    return std::nullopt;
  }
  if (!rec.ok() || rec->report.rank != rank || rec->report.run != run ||
      rec->report.version != version) {
    return std::nullopt;
  }
  if (checker != nullptr) {
    const auto body = ReportBody(*rec);
    Status sig = checker->CheckReportSignature(rec->tail.data(), rec->tail.size(), body.first,
                                               body.second, rank);
    if (!sig.ok()) {
      if (refused != nullptr) *refused = sig.message();
      return std::nullopt;
    }
  }
  return rec->report;
}

std::vector<CommitReport> CollectRegionReports(ObjectStore* store, const std::string& prefix,
                                               uint64_t run, uint64_t version, int first_rank,
                                               const std::set<int>& wait_for, double deadline_s,
                                               const TlsContext* checker,
                                               std::vector<std::string>* refused) {
  const double until = SteadyNow() + deadline_s;
  std::map<int, CommitReport> got;
  std::set<int> refused_ranks;
  while (true) {
    auto listed = store->List(prefix + "/reports/");
    if (listed.ok()) {
      for (const ObjectInfo& o : *listed) {
        const std::string tail = o.key.substr(std::min(o.key.size(), prefix.size() + 9));
        char* end = nullptr;
        const long rank = std::strtol(tail.c_str(), &end, 10);
        if (tail.empty() || end == nullptr || *end != '\0' || rank < first_rank ||
            got.count(static_cast<int>(rank))) {
          continue;
        }
        std::string why;
        if (auto r = GetRegionReport(store, prefix, static_cast<int>(rank), run, version, checker,
                                     &why)) {
          got[static_cast<int>(rank)] = *r;
        } else if (!why.empty() && refused_ranks.insert(static_cast<int>(rank)).second &&
                   refused != nullptr) {
          refused->push_back(std::to_string(rank) + ": " + why);
        }
      }
    }
    bool all = true;
    for (int r : wait_for) all = all && got.count(r) > 0;
    if (all || SteadyNow() >= until) break;
    usleep(20000);
  }
  std::vector<CommitReport> out;
  for (auto& [rank, r] : got) out.push_back(r);
  return out;
}

StatusOr<int> ServeFullFrameRequests(ObjectStore* store, const NodePlan& plan,
                                     const std::string& prefix, const StorageLayer& storage) {
  const std::string dir = CatchUpRoot(plan) + "/catch-up/requests/";
  DCR_ASSIGN_OR_RETURN(std::vector<ObjectInfo> pending, store->List(dir));
  if (pending.empty()) return 0;
  DCR_RETURN_IF_ERROR(PutFullFrame(store, prefix, storage).status());
  for (const ObjectInfo& o : pending) (void)store->Delete(o.key);
  return static_cast<int>(pending.size());
}

StatusOr<int> ServeFullFrameRequestsFromCheckpoint(ObjectStore* store, const NodePlan& plan,
                                                   const std::string& prefix,
                                                   const std::string& checkpoint_path,
                                                   int below_rank) {
  const std::string dir = CatchUpRoot(plan) + "/catch-up/requests/";
  DCR_ASSIGN_OR_RETURN(std::vector<ObjectInfo> pending, store->List(dir));
  if (below_rank >= 0) {
    std::erase_if(pending, [&](const ObjectInfo& o) {
      const std::string name = o.key.substr(dir.size());
      char* end = nullptr;
      const long rank = std::strtol(name.c_str(), &end, 10);
      return name.empty() || *end != '\0' || rank < 0 || rank >= below_rank;
    });
  }
  if (pending.empty()) return 0;
  DCR_RETURN_IF_ERROR(PutFullFrameOfCheckpoint(store, prefix, checkpoint_path).status());
  for (const ObjectInfo& o : pending) (void)store->Delete(o.key);
  return static_cast<int>(pending.size());
}

namespace {

// The plan of one version `v` of long-lived plan `plan` (as RunNodeVersions makes it).
NodePlan VersionPlan(const NodePlan& plan, const NodeVersion& v) {
  NodePlan p = plan;
  p.versions.clear();
  p.version = v.version;
  p.target_path = v.target_path;
  p.verify_path = v.verify_path;
  if (!v.prefix.empty()) p.relay.prefix = v.prefix;
  p.result_path = v.result_path;
  p.ready_path.clear();
  p.go_path.clear();
  return p;
}

}  // namespace

namespace {

// The commitment root `stack` holds: the signed one its last commit checked, else (with
// `compute`) computed now; nullopt when neither (a storage whose commitment cannot be computed).
std::optional<Sha256Digest> HeldRoot(const ReceiverStack& stack, bool compute) {
  if (stack.trust != nullptr) {
    if (auto checked = stack.trust->committed_commitment()) return checked;
  }
  if (!compute) return std::nullopt;
  auto held = HeldCommitment(*stack.outer, 0);
  if (!held.ok()) return std::nullopt;
  return held->root;
}

// Loads the full frame of `fv` into *storage (host memory on device "cpu", else the plan's
// device; behind the plan's trust checks), verifies it and leaves its commit report; `fr` is the
// version's result, `dense_bytes` gets the frame's tensor bytes.
Status TakeFullFrame(const NodePlan& plan, ObjectStore* store, const NodeVersion& fv,
                     const std::string& why, const TlsContext* signer, ReceiverStack* storage,
                     NodeResult* fr, uint64_t* dense_bytes) {
  fr->t_start = WallNow();
  const std::string who = "receiver " + std::to_string(plan.rank);
  FrameTrust trust;
  if (!plan.trust_key.empty()) {
    auto key = TrustKey::Load(plan.trust_key);
    if (!key.ok()) return key.status().WithContext(who + ": plan.trust_key");
    trust.key = *key;
    trust.run_id = plan.run_id;
    if (!plan.state_dir.empty()) {
      // Kept beside the frame's checkpoint (KeepFullFrame): a restart proves it again.
      NodePlan at = plan;
      at.state_dir = VersionStateDir(plan.state_dir, fv.version);
      trust.signed_state_path = SignedStatePath(at);
    }
  }
  auto frame = FetchFullFrameCheckpoint(store, fv.prefix, fv.version, &fr->bytes_received, &trust);
  if (!frame.ok()) return frame.status().WithContext(who);
  *dense_bytes = (*frame)->total_tensor_bytes();
  // The frame is loaded where the receiver holds its weights (host memory, or its device), behind
  // the plan's trust.
  DCR_ASSIGN_OR_RETURN(*storage, LoadedReceiverStack(plan, **frame, fv.version));
  frame->reset();
  fr->t_first_blob = fr->t_start;
  fr->t_last_blob = fr->t_commit = WallNow();
  fr->ok = true;
  fr->catch_up = "full_frame";
  fr->recovery_log = why;
  if (!fv.verify_path.empty()) {
    Status vs = VerifyFile(*storage->outer, fv.verify_path);
    fr->verified = vs.ok();
    fr->verify_message = vs.ok() ? "byte-for-byte equal to the target" : vs.message();
  }
  const std::string onto = storage->storage.device == nullptr ? "" : " onto device " + plan.device;
  std::fprintf(
      stderr,
      "receiver %d: full frame of version %llu from the in-region store (%llu bytes)%s: %s\n",
      plan.rank, static_cast<unsigned long long>(fv.version),
      static_cast<unsigned long long>(fr->bytes_received), onto.c_str(), why.c_str());
  // The root of what it loaded (the frame was checked against the signed one with a trust key).
  DCR_ASSIGN_OR_RETURN(const Commitment root, HeldCommitment(*storage->outer, 0));
  return PutRegionReport(store, fv.prefix, plan.rank, plan.run_id, fv.version,
                         storage->outer->held().hash, root.root, signer);
}

Status KeepFullFrameInLayout(const NodePlan& plan, VersionRecovery* recovery, uint64_t version,
                             const Checkpoint& frame, const std::string& layout_path);

// A recovering region receiver's full frame of `version` made durable: the image of `storage`
// written under the version's state directory in the layout of its version log (as
// KeepFullFrameInLayout; as it is for a receiver that holds no layout yet), adopted as the
// committed checkpoint it holds.
Status KeepFullFrame(const NodePlan& plan, VersionRecovery* recovery, uint64_t version,
                     const StorageLayer& storage) {
  DCR_ASSIGN_OR_RETURN(std::vector<uint8_t> image, FullFrameImage(storage));
  if (!recovery->layout_path().empty()) {
    DCR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> frame,
                         Checkpoint::FromBytes(std::move(image)));
    return KeepFullFrameInLayout(plan, recovery, version, *frame, recovery->layout_path());
  }
  const std::string path = VersionStateDir(plan.state_dir, version) + "/rank-" +
                           std::to_string(plan.rank) + ".committed.safetensors";
  DCR_RETURN_IF_ERROR(WriteFileAtomic(path, image.data(), image.size()));
  return recovery->Adopt(version, path);
}

}  // namespace

namespace {

// The version numbers whose prefix under `root` ("<root>/...step-<k>/...") holds an object.
std::set<uint64_t> StoredVersionNumbers(ObjectStore* store, const std::string& root) {
  std::set<uint64_t> out;
  const std::string dir = root + "/";
  auto listed = store->List(dir);
  if (!listed.ok()) return out;
  for (const ObjectInfo& o : *listed) {
    if (o.key.compare(0, dir.size(), dir) != 0) continue;
    const size_t end = o.key.find('/', dir.size());
    if (end == std::string::npos) continue;
    const std::string segment = o.key.substr(dir.size(), end - dir.size());
    const size_t at = segment.rfind("step-");
    if (at == std::string::npos || at + 5 >= segment.size()) continue;
    const std::string digits = segment.substr(at + 5);
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    out.insert(std::strtoull(digits.c_str(), nullptr, 10));
  }
  return out;
}

// A tree receiver's full frame `frame` of `version` (checked: FetchFullFrameCheckpoint) made
// durable in the form of the checkpoint it held, `layout_path` (a single file; its version log's
// layout): that file's header and tensor order with each tensor's bytes the frame's, adopted as
// the committed checkpoint it holds, so its version log starts the next version from it as from
// any version it held. Against a sharded layout the frame's image is kept as it is. Errors:
// kFailedPrecondition when the frame's tensors are not the layout's (names, dtypes, shapes);
// kDataLoss when the file written does not hash to the frame's content; Checkpoint's, the
// file's, Adopt's.
Status KeepFullFrameInLayout(const NodePlan& plan, VersionRecovery* recovery, uint64_t version,
                             const Checkpoint& frame, const std::string& layout_path) {
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> layout, Checkpoint::Open(layout_path));
  const std::string what = "full frame of version " + std::to_string(version);
  std::vector<uint8_t> image;
  if (layout->sharded()) {
    image.assign(frame.file_data(), frame.file_data() + frame.file_size());
  } else {
    if (frame.tensors().size() != layout->tensors().size()) {
      return FailedPreconditionError(what + ": " + std::to_string(frame.tensors().size()) +
                                     " tensors, the checkpoint it replaces has " +
                                     std::to_string(layout->tensors().size()));
    }
    image.assign(layout->file_data(), layout->file_data() + layout->file_size());
    for (const TensorInfo& t : layout->tensors()) {
      const TensorInfo* f = frame.Find(t.name);
      if (f == nullptr || f->dtype_name != t.dtype_name || f->shape != t.shape ||
          f->nbytes != t.nbytes) {
        return FailedPreconditionError(what + ": tensor " + t.name +
                                       " is not the one of the checkpoint it replaces (" +
                                       layout_path + ")");
      }
      std::memcpy(image.data() + layout->data_section_offset() + t.offset, frame.data(*f),
                  t.nbytes);
    }
  }
  const std::string path = VersionStateDir(plan.state_dir, version) + "/rank-" +
                           std::to_string(plan.rank) + ".committed.safetensors";
  DCR_RETURN_IF_ERROR(WriteFileAtomic(path, image.data(), image.size()));
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> written, Checkpoint::Open(path));
  if (written->ContentHash() != frame.ContentHash()) {
    return DataLossError(what + ": " + path + " does not hold the frame's content");
  }
  return recovery->Adopt(version, path);
}

}  // namespace

StatusOr<size_t> CatchUpCollectedVersion(ObjectStore* store, const NodePlan& plan,
                                         std::vector<NodeVersion>* versions, size_t i,
                                         VersionRecovery* recovery, double deadline,
                                         NodeResult* result) {
  const std::string root = CatchUpRoot(plan);
  const uint64_t held = recovery->held_number();
  CatchUpLimits limits;
  limits.max_replay = plan.catch_up_max_replay;
  limits.full_frame_fraction = plan.catch_up_full_frame_fraction;
  std::shared_ptr<const TlsContext> signer;  // signs its commit report
  bool requested = false;
  while (true) {
    const std::set<uint64_t> numbers = StoredVersionNumbers(store, root);
    const uint64_t newest = numbers.empty() ? 0 : *numbers.rbegin();
    if (newest <= (*versions)[i].version) return i;  // in step: the tree or the store serves it
    while (plan.open_versions && versions->back().version < newest) {
      versions->push_back(NextOpenVersion(versions->back()));
      DCR_RETURN_IF_ERROR(recovery->AddVersion(versions->back().version));
    }
    std::vector<StoredVersion> stored;
    for (size_t k = i; k < versions->size() && (*versions)[k].version <= newest; ++k) {
      StoredVersion sv;
      sv.number = (*versions)[k].version;
      if (numbers.count(sv.number)) {
        DCR_ASSIGN_OR_RETURN(sv, InspectStoredVersion(store, (*versions)[k].prefix, sv.number));
      }
      stored.push_back(sv);
    }
    if (stored.empty() || stored[0].delta_whole) return i;
    const CatchUpStep step = PlanCatchUp(held, stored, 0, limits);
    if (step.kind != CatchUpStep::kFullFrame && step.kind != CatchUpStep::kRequestFullFrame) {
      return i;
    }
    if (step.kind == CatchUpStep::kRequestFullFrame) {
      if (!requested) {
        std::fprintf(stderr,
                     "node %d: version %llu is no longer in the store (retention removed it) and "
                     "its parent moved on: %s: requesting a full frame\n",
                     plan.rank, static_cast<unsigned long long>((*versions)[i].version),
                     step.why.c_str());
        DCR_RETURN_IF_ERROR(store->Put(FullFrameRequestKey(root, plan.rank), "request\n", 8));
        requested = true;
      }
      if (SteadyNow() > deadline) {
        return DeadlineExceededError("node " + std::to_string(plan.rank) + ": " + step.why +
                                     ", and none came within the node's deadline");
      }
      usleep(100000);
      continue;
    }
    size_t k = i;
    while (k < versions->size() && (*versions)[k].version != step.version) ++k;
    if (k == versions->size()) {
      return InternalError("full frame of version " + std::to_string(step.version) +
                           " outside the plan's versions");
    }
    const NodeVersion& fv = (*versions)[k];
    const std::string who = "node " + std::to_string(plan.rank);
    if (signer == nullptr && !plan.tls_cert.empty()) {
      DCR_ASSIGN_OR_RETURN(signer, TlsContext::Load(plan.tls_ca, plan.tls_cert, plan.tls_key));
    }
    FrameTrust trust;  // signed: the frame must be the trainer's commitment
    if (!plan.trust_key.empty()) {
      auto key = TrustKey::Load(plan.trust_key);
      if (!key.ok()) return key.status().WithContext(who + ": plan.trust_key");
      trust.key = *key;
      trust.run_id = plan.run_id;
      NodePlan at = plan;  // the frame's signed state, beside its checkpoint: a restart proves it
      at.state_dir = VersionStateDir(plan.state_dir, fv.version);
      trust.signed_state_path = SignedStatePath(at);
    }
    NodeResult fr;
    fr.rank = plan.rank;
    fr.pid = static_cast<int64_t>(getpid());
    fr.role = "receiver";
    fr.t_start = WallNow();
    auto frame = FetchFullFrameCheckpoint(store, fv.prefix, fv.version, &fr.bytes_received, &trust);
    if (frame.status().IsNotFound()) {  // collected before it was fetched: ask again
      requested = false;
      continue;
    }
    if (!frame.ok()) return frame.status().WithContext(who);
    DCR_ASSIGN_OR_RETURN(const std::string layout_path, recovery->HeldPath());
    DCR_RETURN_IF_ERROR(KeepFullFrameInLayout(plan, recovery, fv.version, **frame, layout_path));
    DCR_ASSIGN_OR_RETURN(const Commitment root, CheckpointCommitment(**frame, 0));
    fr.target_hash = (*frame)->ContentHash();
    DCR_RETURN_IF_ERROR(PutRegionReport(store, fv.prefix, plan.rank, plan.run_id, fv.version,
                                        fr.target_hash, root.root, signer.get()));
    fr.t_first_blob = fr.t_start;
    fr.t_last_blob = fr.t_commit = WallNow();
    fr.ok = true;
    fr.catch_up = "full_frame";
    fr.recovery_log = step.why;
    std::fprintf(stderr,
                 "node %d: took the full frame of version %llu from the in-region store (%llu "
                 "bytes, checked against the version's %s): %s\n",
                 plan.rank, static_cast<unsigned long long>(fv.version),
                 static_cast<unsigned long long>(fr.bytes_received),
                 trust.key != nullptr ? "signed commitment" : "trailer", step.why.c_str());
    for (size_t m = i; m < k; ++m) {
      NodeResult a;
      a.rank = plan.rank;
      a.pid = fr.pid;
      a.role = "receiver";
      a.ok = true;
      a.catch_up = "absent";
      a.verify_message = "did not hold version " + std::to_string((*versions)[m].version) +
                         " (took the full frame of version " + std::to_string(step.version) +
                         ": retention removed its delta)";
      DCR_RETURN_IF_ERROR(WriteResultFile((*versions)[m].result_path, a));
    }
    DCR_RETURN_IF_ERROR(WriteResultFile((*versions)[k].result_path, fr));
    *result = fr;
    return k;
  }
}

Status RunRegionReceiverVersions(const NodePlan& plan, NodeResult* result) {
  *result = NodeResult();
  result->rank = plan.rank;
  result->pid = static_cast<int64_t>(getpid());
  if (plan.store.empty()) return InvalidArgumentError("plan.store: a region receiver reads it");
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<ObjectStore> store, OpenObjectStore(plan.store));
  const double deadline = SteadyNow() + plan.timeout_s;
  CatchUpLimits limits;
  limits.max_replay = plan.catch_up_max_replay;
  limits.full_frame_fraction = plan.catch_up_full_frame_fraction;
  uint64_t dense_bytes = 0;
  std::optional<uint64_t> held;  // none: a late joiner before its first frame
  if (!plan.late_join) {
    DCR_ASSIGN_OR_RETURN(auto base, Checkpoint::Open(plan.receiver_base_path));
    dense_bytes = base->total_tensor_bytes();
    held = 0;
  }
  // Journaled and resumable (version_state.h): each version is held in the receiver's version
  // log, which the next version starts from.
  std::unique_ptr<VersionRecovery> recovery;
  if (!plan.state_dir.empty()) {
    DCR_ASSIGN_OR_RETURN(recovery, VersionRecovery::Open(plan));
  }
  std::shared_ptr<const TlsContext> signer;  // signs its commit reports
  if (!plan.tls_cert.empty()) {
    DCR_ASSIGN_OR_RETURN(signer, TlsContext::Load(plan.tls_ca, plan.tls_cert, plan.tls_key));
  }
  // Its reports carry the commitment root of what it holds, computed when its commit did not
  // check one, whenever a sender may take them as proof (signed, or of a signed run).
  const bool prove = signer != nullptr || !plan.trust_key.empty();
  ReceiverStack storage;  // empty until the first version (or frame) is held
  bool requested = false;
  bool catching_up = false;
  bool returning = false;  // caught up (replay or frame), not yet announced
  Status s;
  auto absent = [&](const NodeVersion& v, uint64_t frame) {
    NodeResult a;
    a.rank = plan.rank;
    a.pid = result->pid;
    a.role = "receiver";
    a.ok = true;
    a.catch_up = "absent";
    a.verify_message =
        "did not hold version " + std::to_string(v.version) +
        (frame > 0 ? " (took the full frame of version " + std::to_string(frame) + ")" : "");
    *result = a;
    return WriteResultFile(v.result_path, a);
  };
  for (size_t i = 0; i < plan.versions.size() && s.ok(); ++i) {
    const NodeVersion& v = plan.versions[i];
    if (recovery != nullptr && recovery->Finished(v)) {
      // Finished by an earlier process (held, or passed over): its result stands.
      auto r = ReadResultFile(v.result_path);
      if (r.ok()) *result = *r;
      if (recovery->held_number() == v.version) {
        held = v.version;
        if (dense_bytes == 0) {
          DCR_ASSIGN_OR_RETURN(const std::string held_path, recovery->HeldPath());
          DCR_ASSIGN_OR_RETURN(auto c, Checkpoint::Open(held_path));
          dense_bytes = c->total_tensor_bytes();
        }
        // Proven by the trainer's signature before it is reported or built on.
        s = recovery->CheckHeld();
        if (!s.ok()) break;
        // The process before may have died between recording v done and putting its report.
        StatusOr<std::string> held_path = recovery->HeldPath();
        StatusOr<bool> put = held_path.status();
        if (held_path.ok()) {
          put = RestoreRegionReport(store.get(), v.prefix, plan.rank, plan.run_id, v.version,
                                    *held_path, signer.get());
        }
        if (!put.ok()) {
          s = put.status().WithContext("receiver " + std::to_string(plan.rank) +
                                       ": commit report of version " + std::to_string(v.version));
          break;
        }
        if (*put) {
          std::fprintf(stderr,
                       "receiver %d: commit report of version %llu put again in the "
                       "region store (it was missing after a restart)\n",
                       plan.rank, static_cast<unsigned long long>(v.version));
        }
      }
      continue;
    }
    if (held && *held >= v.version) {
      s = absent(v, *held);
      if (s.ok() && recovery != nullptr) {
        s = WriteVersionDone(plan.state_dir, plan.rank, VersionDone{v.version, ""});
      }
      continue;
    }
    CatchUpStep step;
    bool published = false;  // this version's delta is whole in the store already
    while (true) {
      std::vector<StoredVersion> stored;
      for (size_t k = i; k < plan.versions.size(); ++k) {
        DCR_ASSIGN_OR_RETURN(
            StoredVersion sv,
            InspectStoredVersion(store.get(), plan.versions[k].prefix, plan.versions[k].version));
        stored.push_back(sv);
      }
      step = PlanCatchUp(held, stored, dense_bytes, limits);
      published = !stored.empty() && stored[0].delta_whole;
      if (step.kind != CatchUpStep::kRequestFullFrame) break;
      if (!requested) {
        std::fprintf(stderr, "receiver %d: %s: requesting a full frame in the region\n", plan.rank,
                     step.why.c_str());
        const std::string key = FullFrameRequestKey(CatchUpRoot(plan), plan.rank);
        DCR_RETURN_IF_ERROR(store->Put(key, "request\n", 8));
        requested = true;
      }
      if (SteadyNow() > deadline) {
        s = DeadlineExceededError("receiver " + std::to_string(plan.rank) + ": " + step.why +
                                  ", and none came within the node's deadline");
        break;
      }
      usleep(50000);
    }
    if (!s.ok()) break;
    if (step.kind == CatchUpStep::kFullFrame) {
      size_t k = i;
      while (k < plan.versions.size() && plan.versions[k].version != step.version) ++k;
      if (k == plan.versions.size()) {
        s = InternalError("full frame of version " + std::to_string(step.version) +
                          " outside the plan's versions");
        break;
      }
      for (size_t m = i; m < k && s.ok(); ++m) {
        s = absent(plan.versions[m], step.version);
        if (s.ok() && recovery != nullptr) {
          s = WriteVersionDone(plan.state_dir, plan.rank,
                               VersionDone{plan.versions[m].version, ""});
        }
      }
      if (!s.ok()) break;
      NodeResult fr;
      fr.rank = plan.rank;
      fr.pid = result->pid;
      fr.role = "receiver";
      uint64_t frame_dense = 0;
      s = TakeFullFrame(plan, store.get(), plan.versions[k], step.why, signer.get(), &storage, &fr,
                        &frame_dense);
      if (s.ok() && recovery != nullptr) {
        s = KeepFullFrame(plan, recovery.get(), plan.versions[k].version, storage.storage);
      }
      if (s.ok()) {
        held = plan.versions[k].version;
        returning = true;
        if (dense_bytes == 0) dense_bytes = frame_dense;
      } else {
        fr.ok = false;
        fr.error = s.ToString();
      }
      Status w = WriteResultFile(plan.versions[k].result_path, fr);
      if (s.ok()) s = w;
      *result = fr;
      requested = false;
      if (recovery != nullptr) storage = ReceiverStack();  // the next version starts from the file
      i = k;
      continue;
    }
    // Follow or replay: the version's delta from the store, as a downloader. A receiver that
    // started catching up goes on replaying while the version it takes is already published
    // (the last of the missed versions is one behind the latest).
    if (step.kind == CatchUpStep::kReplay) {
      catching_up = returning = true;
    } else if (catching_up && published) {
      step.kind = CatchUpStep::kReplay;
      step.why = "catching up: version " + std::to_string(v.version) +
                 " was published before this receiver took it";
    } else {
      catching_up = false;
    }
    if (returning) {
      // Catching up: the sender waits (at most its deadline) for this receiver's report of the
      // version it collects next, and re-admits it once that report is of the published version.
      // Announced before every version taken until one not yet published (it is caught up).
      (void)store->Put(ReturningKey(CatchUpRoot(plan), plan.rank), "returning\n", 10);
      if (!published) returning = false;
    }
    NodeResult r;
    NodePlan vp = VersionPlan(plan, v);
    if (recovery != nullptr) recovery->Prepare(v, i, &vp);
    s = RunNodeVersion(vp, &r, recovery == nullptr ? &storage : nullptr);
    r.catch_up = step.kind == CatchUpStep::kReplay ? "replay" : "follow";
    if (step.kind == CatchUpStep::kReplay) {
      r.recovery_log += (r.recovery_log.empty() ? "" : "\n") + step.why;
      std::fprintf(stderr, "receiver %d: version %llu: %s\n", plan.rank,
                   static_cast<unsigned long long>(v.version), step.why.c_str());
    }
    if (s.ok() && recovery != nullptr) {
      // The result names how v was taken before v is recorded done: a process restarted after
      // Done keeps the result file it finds, and RunNodeVersion's has no catch-up form.
      s = WriteResultFile(v.result_path, r);
    }
    if (s.ok() && recovery != nullptr) {
      // v is held (in the version log); the report names its content hash, the one the
      // receiver committed.
      s = recovery->Done(vp);
      if (s.ok() && r.target_hash == Hash128{}) {
        s = FailedPreconditionError("receiver " + std::to_string(plan.rank) + ": version " +
                                    std::to_string(v.version) + " ended without a target hash");
      }
      if (s.ok()) {
        held = v.version;
        std::optional<Sha256Digest> root = RootOfHex(r.commitment);
        if (!root && prove) {
          // No signed root checked at the commit: the root of what the log holds.
          StatusOr<std::string> held_path = recovery->HeldPath();
          StatusOr<std::unique_ptr<Checkpoint>> c =
              held_path.ok() ? Checkpoint::Open(*held_path)
                             : StatusOr<std::unique_ptr<Checkpoint>>(held_path.status());
          if (!c.ok()) {
            s = c.status();
          } else {
            auto computed = CheckpointCommitment(**c, 0);
            if (computed.ok()) root = computed->root;
          }
        }
        if (s.ok()) {
          s = PutRegionReport(store.get(), v.prefix, plan.rank, plan.run_id, v.version,
                              r.target_hash, root, signer.get());
        }
      }
    } else if (s.ok() && storage.outer != nullptr) {
      held = storage.outer->held().number;
      s = PutRegionReport(store.get(), v.prefix, plan.rank, plan.run_id, v.version,
                          storage.outer->held().hash, HeldRoot(storage, prove), signer.get());
    }
    Status w = WriteResultFile(v.result_path, r);
    if (s.ok()) s = w;
    *result = r;
  }
  if (!s.ok()) {
    result->ok = false;
    if (result->error.empty()) result->error = s.ToString();
  }
  Status w = WriteResultFile(plan.result_path, *result);
  if (s.ok()) s = w;
  return s;
}

}  // namespace dcr::internal
