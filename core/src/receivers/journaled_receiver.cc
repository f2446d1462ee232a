// JournaledReceiver: write-ahead journaling around any Receiver, overwrite-only repair of
// doubtful chunks, and the additive version ledger that proves a commit.
#include <algorithm>
#include <string>

#include "dcr/hash.h"
#include "dcr/journal.h"
#include "dcr/status_macros.h"
#include "internal/str_format.h"

namespace dcr {

using internal::IdList;

JournaledReceiver::JournaledReceiver(Receiver* inner, ReceiverJournal* journal, ServingGate* gate)
    : inner_(inner), journal_(journal), gate_(gate) {}

Status JournaledReceiver::Begin(const uint8_t* bytes, size_t size) {
  size_t consumed = 0;
  DCR_ASSIGN_OR_RETURN(FileHeader header, ParseFileHeader(bytes, size, &consumed));
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
  if (d.full_frame) {
    // Validate the inventory now: the ledger needs it for the identity terms.
    DCR_ASSIGN_OR_RETURN(Inventory inv, Inventory::FromHeader(header));
    (void)inv;
  }
  const bool began_inner = !inner_->in_delta();
  if (began_inner) {
    DCR_RETURN_IF_ERROR(inner_->Begin(bytes, size));
    if (in_flight) {
      // Resume: the storage holds the chunks the journal records as applied.
      JournalState st = journal_->state();
      for (const auto& [id, c] : st.applied) {
        Status m = inner_->MarkApplied(id, c.version_delta);
        if (!m.ok()) {
          inner_->Abort();
          return m;
        }
      }
    }
  }
  Status j = journal_->BeginDelta(d);
  if (!j.ok()) {
    if (began_inner) inner_->Abort();
    return j;
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    header_ = header;
  }
  if (gate_) gate_->ApplyStarted(d);
  return Status::OK();
}

Status JournaledReceiver::ApplyRecord(const uint8_t* record, size_t size) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!header_) return FailedPreconditionError("chunk applied before Begin");
  }
  size_t header_size = 0, record_size = 0;
  DCR_ASSIGN_OR_RETURN(ChunkHeader h, ParseChunkHeader(record, size, &header_size, &record_size));
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
          "never a replay of its " +
          ValueModeName(h.value_mode) + " form");
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
  Status s = inner_->ApplyRecord(record, size);
  if (!s.ok()) {
    // receiver.h: a refused record leaves nothing of its chunk written.
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

Status JournaledReceiver::MarkApplied(uint64_t chunk_id, const Hash128& version_delta) {
  if (!in_delta()) return FailedPreconditionError("MarkApplied with no delta in progress");
  JournalChunk c;
  c.version_delta = version_delta;
  DCR_RETURN_IF_ERROR(journal_->BeginChunk(chunk_id, c));
  DCR_RETURN_IF_ERROR(journal_->EndChunk(chunk_id));
  return inner_->MarkApplied(chunk_id, version_delta);
}

std::vector<uint64_t> JournaledReceiver::DoubtfulChunks() const {
  JournalState st = journal_->state();
  std::vector<uint64_t> ids;
  for (const auto& [id, c] : st.doubtful) ids.push_back(id);
  return ids;
}

std::vector<uint64_t> JournaledReceiver::MissingChunks(const Trailer& trailer) const {
  JournalState st = journal_->state();
  std::vector<uint64_t> ids;
  for (const ChunkTableEntry& e : trailer.chunks) {
    if (!st.in_flight || !st.applied.count(e.chunk_id)) ids.push_back(e.chunk_id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

Hash128 JournaledReceiver::Ledger() const {
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
      StatusOr<Inventory> inv = Inventory::FromHeader(*header);
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

Status JournaledReceiver::Commit(const uint8_t* bytes, size_t size) {
  DCR_ASSIGN_OR_RETURN(Trailer trailer, ParseTrailer(bytes, size));
  std::optional<DeltaRef> d = journal_->in_flight();
  if (!d || !in_delta()) return FailedPreconditionError("commit with no delta in progress");
  std::vector<uint64_t> doubtful = DoubtfulChunks();
  if (!doubtful.empty()) {
    return FailedPreconditionError(
        "cannot commit v" + std::to_string(d->target_number) +
        ": chunks interrupted mid-apply need their overwrite form: " + IdList(doubtful));
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
  DCR_RETURN_IF_ERROR(inner_->Commit(bytes, size));
  VersionId v{d->target_number, trailer.target_hash};
  DCR_RETURN_IF_ERROR(journal_->RecordCommitted(v));
  {
    std::lock_guard<std::mutex> l(mu_);
    header_.reset();
  }
  if (gate_) gate_->VersionWhole(v);
  return Status::OK();
}

void JournaledReceiver::Abort() {
  inner_->Abort();
  std::lock_guard<std::mutex> l(mu_);
  header_.reset();
}

VersionId JournaledReceiver::held() const {
  std::optional<VersionId> c = journal_->committed();
  return c ? *c : inner_->held();
}

bool JournaledReceiver::in_delta() const {
  std::lock_guard<std::mutex> l(mu_);
  return header_.has_value();
}

JournaledApplyStats JournaledReceiver::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

}  // namespace dcr
