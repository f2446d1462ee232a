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

Status ApplyJobs::Open(const NodePlan& plan, int starts, ReceiverStack carried) {
  DCR_ASSIGN_OR_RETURN(stack_, OpenReceiverStack(plan, starts, std::move(carried)));
  rx_ = stack_.outer.get();
  ReportHeld();
  pool_.Start(plan.relay.max_parallel_applies);
  return Status();
}

std::optional<Sha256Digest> ApplyJobs::committed_commitment() const {
  return stack_.trust != nullptr ? stack_.trust->committed_commitment() : std::nullopt;
}

std::optional<Sha256Digest> ApplyJobs::ReportedCommitment(bool compute) const {
  if (auto checked = committed_commitment()) return checked;
  if (!compute || rx_ == nullptr || rx_->in_delta()) return std::nullopt;
  StatusOr<Commitment> held = HeldCommitment(*rx_, 0);
  if (!held.ok()) return std::nullopt;
  return held->root;
}

ReceiverStack ApplyJobs::Release() {
  pool_.Stop();
  rx_ = nullptr;
  return ReleaseReceiverStack(std::move(stack_));
}

void ApplyJobs::Repair(const BlobPtr& b) {
  pool_.Submit([this, b] {
    double t = SteadyNow();
    auto ow = stack_.durable->OverwriteForm(b->bytes.data(), b->bytes.size());
    Status s;
    if (!ow.ok()) {
      s = ow.status().WithContext("overwrite form");
    } else if (stack_.trust != nullptr) {
      // The overwrite form is built here, so no manifest lists it: the signed record it
      // comes from is what is checked.
      s = stack_.trust->ApplyDerived(b->bytes.data(), b->bytes.size(), ow->data(), ow->size());
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
  if (!s.ok() && s.IsFailedPrecondition() && stack_.durable != nullptr &&
      b->info.kind == BlobKind::kChunk) {
    // The relative form of a chunk the journal shows doubtful: the policy decides (R6).
    size_t header_size = 0, record_size = 0;
    auto h = ParseChunkHeader(b->bytes.data(), b->bytes.size(), &header_size, &record_size);
    if (h.ok() && stack_.durable->Doubtful(h->chunk_id)) {
      queue_->PostRecovery(recovery::ChunkDoubtful{h->chunk_id}, b->info.id);
      return;
    }
  }
  if (s.ok() && b->info.kind == BlobKind::kChunk) {
    state_->UpdateMetrics([](internal::NodeMetrics* m) { ++m->chunks_applied; });
  } else if (s.ok() && b->info.kind == BlobKind::kTrailer) {
    ReportHeld();  // committed: no other call runs
    if (const TrustedReceiver* trusted = stack_.trust) {
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
  const VersionId held = rx_->held();
  state_->UpdateMetrics([&](internal::NodeMetrics* m) {
    m->holds_version = true;
    m->version_held = held.number;
    m->hash_held = held.hash;
  });
}

}  // namespace dcr::internal
