// JournaledApplier: write-ahead journaling around any Applier, overwrite-only repair of doubtful
// chunks, and the additive version ledger that proves a commit.
#include <algorithm>
#include <string>

#include "dcr/hash.h"
#include "dcr/journal.h"
#include "dcr/status_macros.h"

namespace dcr {
namespace {

std::string IdList(const std::vector<uint64_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size() && i < 8; ++i) {
    if (i) s += ", ";
    s += std::to_string(ids[i]);
  }
  if (ids.size() > 8) s += ", ... (" + std::to_string(ids.size()) + " in all)";
  return s;
}

}  // namespace

JournaledApplier::JournaledApplier(Applier* inner, ReceiverJournal* journal, ServingGate* gate)
    : inner_(inner), journal_(journal), gate_(gate) {}

Status JournaledApplier::BeginDelta(const FileHeader& header) {
  DeltaRef d = DeltaRefFromHeader(header);
  std::optional<DeltaRef> in_flight = journal_->in_flight();
  if (!in_flight) {
    std::optional<VersionId> committed = journal_->committed();
    if (!d.full_frame && (!committed || *committed != d.base)) {
      return FailedPreconditionError(
          "delta for base " + d.base.ToString() + " refused: the receiver holds " +
          (committed ? committed->ToString() : std::string("no version")));
    }
  } else if (!(*in_flight == d)) {
    return FailedPreconditionError(
        "delta " + d.base.ToString() + " -> v" + std::to_string(d.target_number) +
        " refused: the receiver is in the middle of the delta to v" +
        std::to_string(in_flight->target_number) + " (finish it or abandon it)");
  }
  if (d.full_frame && !header.inventory.empty()) {
    // Validate the inventory now: Commit needs it for the identity terms.
    DCR_ASSIGN_OR_RETURN(Inventory inv, Inventory::Parse(header.inventory));
    (void)inv;
  }
  DCR_RETURN_IF_ERROR(journal_->BeginDelta(d));
  {
    std::lock_guard<std::mutex> l(mu_);
    header_ = header;
  }
  if (gate_) gate_->ApplyStarted(d);
  return Status::OK();
}

Status JournaledApplier::ApplyChunk(const DecodedChunk& chunk) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!header_) return FailedPreconditionError("chunk applied before BeginDelta");
  }
  const ChunkHeader& h = chunk.header;
  const uint64_t id = h.chunk_id;
  JournalChunk recorded;
  JournalChunkState state = journal_->Lookup(id, &recorded);
  JournalChunk begin;
  begin.mode = h.value_mode;
  begin.version_delta = h.version_delta;
  begin.target_change_hash = h.target_change_hash;
  begin.target_range_hash = h.target_range_hash;
  bool repair = false;
  if (state == JournalChunkState::kApplied) {
    std::lock_guard<std::mutex> l(mu_);
    ++stats_.duplicates_skipped;
    return Status::OK();
  }
  if (state == JournalChunkState::kDoubtful) {
    if (IsRelative(h.value_mode)) {
      std::lock_guard<std::mutex> l(mu_);
      ++stats_.refused;
      return FailedPreconditionError(
          "chunk " + std::to_string(id) +
          " was interrupted mid-apply; only its overwrite form (absolute values) repairs it, "
          "never a replay of its " + ValueModeName(h.value_mode) + " form");
    }
    if (h.target_range_hash != recorded.target_range_hash ||
        h.target_change_hash != recorded.target_change_hash) {
      std::lock_guard<std::mutex> l(mu_);
      ++stats_.refused;
      return FailedPreconditionError("overwrite form of chunk " + std::to_string(id) +
                                     " does not match the chunk journaled at its start "
                                     "(different target hashes: wrong delta)");
    }
    // Keep the relative chunk's version_delta for the ledger (an overwrite built from base and
    // target carries the same one; the ledger counts the chunk once either way).
    begin = recorded;
    begin.mode = ValueMode::kAbsolute;
    begin.absolute_repair = true;
    repair = true;
  }
  DCR_RETURN_IF_ERROR(journal_->BeginChunk(id, begin));
  Status s = inner_->ApplyChunk(chunk);
  if (!s.ok()) {
    // The Applier contract: on error nothing of this chunk is left written.
    Status f = journal_->FailChunk(id);
    if (!f.ok()) return s.WithContext("chunk " + std::to_string(id) + " (" + f.message() + ")");
    return s.WithContext("chunk " + std::to_string(id));
  }
  DCR_RETURN_IF_ERROR(journal_->EndChunk(id));
  std::lock_guard<std::mutex> l(mu_);
  if (repair) {
    ++stats_.repaired;
  } else {
    ++stats_.applied;
  }
  return Status::OK();
}

std::vector<uint64_t> JournaledApplier::DoubtfulChunks() const {
  JournalState st = journal_->state();
  std::vector<uint64_t> ids;
  for (const auto& [id, c] : st.doubtful) ids.push_back(id);
  return ids;
}

std::vector<uint64_t> JournaledApplier::MissingChunks(const Trailer& trailer) const {
  JournalState st = journal_->state();
  std::vector<uint64_t> ids;
  for (const ChunkTableEntry& e : trailer.chunks) {
    if (!st.applied.count(e.chunk_id)) ids.push_back(e.chunk_id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

Hash128 JournaledApplier::Ledger() const {
  JournalState st = journal_->state();
  if (!st.in_flight) return st.committed ? st.committed->hash : Hash128{};
  Hash128 h;
  if (st.in_flight->full_frame) {
    std::optional<FileHeader> header;
    {
      std::lock_guard<std::mutex> l(mu_);
      header = header_;
    }
    if (header) {
      StatusOr<Inventory> inv = Inventory::Parse(header->inventory);
      if (inv.ok()) {
        for (const TensorInfo& t : inv->tensors) {
          HashAdd(&h, TensorIdentityTerm(t.name, t.dtype_name, t.shape));
        }
      }
    }
    // A full frame's version_delta carries every element's term.
    for (const auto& [id, c] : st.applied) HashAdd(&h, c.version_delta);
    return h;
  }
  h = st.in_flight->base.hash;
  for (const auto& [id, c] : st.applied) HashAdd(&h, c.version_delta);
  return h;
}

StatusOr<VersionId> JournaledApplier::Commit(const Trailer& trailer) {
  std::optional<DeltaRef> d = journal_->in_flight();
  if (!d) return FailedPreconditionError("commit with no delta in flight");
  std::vector<uint64_t> doubtful = DoubtfulChunks();
  if (!doubtful.empty()) {
    return FailedPreconditionError("cannot commit v" + std::to_string(d->target_number) +
                                   ": chunks interrupted mid-apply need their overwrite form: " +
                                   IdList(doubtful));
  }
  std::vector<uint64_t> missing = MissingChunks(trailer);
  if (!missing.empty()) {
    return FailedPreconditionError("cannot commit v" + std::to_string(d->target_number) +
                                   ": chunks not applied: " + IdList(missing));
  }
  Hash128 ledger = Ledger();
  if (ledger != trailer.target_hash) {
    return DataLossError("cannot commit v" + std::to_string(d->target_number) +
                         ": the version ledger " + ledger.ToHex() +
                         " differs from the target hash " + trailer.target_hash.ToHex() +
                         " (chunks from another delta were applied)");
  }
  VersionId v{d->target_number, trailer.target_hash};
  DCR_RETURN_IF_ERROR(journal_->RecordCommitted(v));
  {
    std::lock_guard<std::mutex> l(mu_);
    header_.reset();
  }
  if (gate_) gate_->VersionWhole(v);
  return v;
}

JournaledApplyStats JournaledApplier::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

}  // namespace dcr
