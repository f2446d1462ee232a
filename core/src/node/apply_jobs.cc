// ApplyJobs (apply_jobs.h).
#include "node/apply_jobs.h"

#include <memory>
#include <string>
#include <utility>

#include "dcr/commitment.h"
#include "dcr/delta.h"
#include "dcr/device.h"
#include "dcr/node.h"
#include "dcr/receiver.h"
#include "dcr/recovery_policy.h"
#include "dcr/relay_policy.h"
#include "dcr/signing.h"
#include "dcr/status.h"
#include "dcr/status_macros.h"
#include "dcr/transport.h"
#include "node/fault_points.h"
#include "node/metrics.h"
#include "node/node_recovery.h"
#include "node/node_state.h"
#include "node/node_trust.h"
#include "transport/net.h"

namespace dcr::internal {

Status ApplyJobs::Open(const NodePlan& plan, int starts, std::unique_ptr<Receiver> carried) {
  const std::string who = "receiver " + std::to_string(plan.rank);
  DCR_ASSIGN_OR_RETURN(std::shared_ptr<Device> device, OpenPlanDevice(plan, true, who));
  if (plan.method == "delta" && !plan.state_dir.empty()) {
    DCR_ASSIGN_OR_RETURN(
        durable_, internal::DurableReceiver::Open(plan, device, starts, InstalledFaultPoints(),
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
      if (!receiver.ok())
        return receiver.status().WithContext(who + " on device " + PlanDeviceName(plan) +
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

std::optional<Sha256Digest> ApplyJobs::committed_commitment() const {
  const auto* trusted = dynamic_cast<const TrustedReceiver*>(backend_.get());
  return trusted != nullptr ? trusted->committed_commitment() : std::nullopt;
}

std::optional<Sha256Digest> ApplyJobs::ReportedCommitment(bool compute) const {
  if (auto checked = committed_commitment()) return checked;
  if (!compute || backend_ == nullptr || backend_->in_delta()) return std::nullopt;
  StatusOr<Commitment> held = HeldCommitment(*backend_, 0);
  if (!held.ok()) return std::nullopt;
  return held->root;
}

Status ApplyJobs::Adopt(std::unique_ptr<Receiver> backend, const NodePlan& plan) {
  backend_ = std::move(backend);
  rx_ = backend_.get();
  DCR_RETURN_IF_ERROR(internal::AdoptPlanFloor(plan, backend_.get(), &floor_));
  ReportHeld();
  pool_.Start(plan.relay.max_parallel_applies);
  return Status();
}

std::unique_ptr<Receiver> ApplyJobs::Release() {
  pool_.Stop();
  if (durable_ != nullptr) return durable_->TakeStorage();
  internal::ReleasePlanFloor(backend_.get());  // floor_ ends with this node
  return std::move(backend_);
}

void ApplyJobs::Repair(const BlobPtr& b) {
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

void ApplyJobs::ApplyJob(const BlobPtr& b) {
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
    if (const auto* trusted = dynamic_cast<const TrustedReceiver*>(rx_)) {
      const CommitmentPassStats pass = trusted->last_commitment_pass();
      state_->Update([&](NodeResult* r) {
        r->commitment_leaves = pass.leaves;
        r->commitment_tail_leaves = pass.tail_leaves;
        r->commitment_tail_seconds = pass.tail_seconds;
      });
    }
  }
  queue_->Post(event::ApplyDone{b->info.id, s.ok(), s.code(), s.message()});
}

void ApplyJobs::ReportHeld() {
  const VersionId held = backend_->held();
  state_->UpdateMetrics([&](internal::NodeMetrics* m) {
    m->holds_version = true;
    m->version_held = held.number;
    m->hash_held = held.hash;
  });
}

}  // namespace dcr::internal
