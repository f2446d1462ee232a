#include "node/commit_reports.h"

#include <cstdio>
#include <cstring>

#include "dcr/commitment.h"

namespace dcr::internal {

namespace {

void PutU32(std::vector<uint8_t>* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void PutU64(std::vector<uint8_t>* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}
uint32_t GetU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// Where format 1 kept its message length: a format-2 body holds this marker there.
constexpr uint32_t kFormatMarker = 0xFFFFFFFFu;
// Offsets in a format-2 body.
constexpr uint32_t kMarkerAt = 40;
constexpr uint32_t kRootAt = 48;
constexpr uint32_t kMessageBytesAt = 80;

}  // namespace

ReportRecord EncodeReportRecord(const CommitReport& report) {
  ReportRecord r;
  r.report = report;
  if (r.report.error.size() > kMaxReportMessageBytes) r.report.error.resize(kMaxReportMessageBytes);
  if (r.report.ok) r.report.error.clear();
  std::vector<uint8_t> body;
  PutU32(&body, static_cast<uint32_t>(r.report.rank));
  // A failed report without a code of its own reads as kInternal; a committed one is 0.
  uint32_t code = r.report.ok ? 0u : static_cast<uint32_t>(r.report.code);
  if (!r.report.ok && code == 0) code = static_cast<uint32_t>(StatusCode::kInternal);
  r.report.code = static_cast<StatusCode>(code);
  PutU32(&body, code);
  PutU64(&body, r.report.run);
  PutU64(&body, r.report.version);
  PutU64(&body, r.report.target_hash.lo);
  PutU64(&body, r.report.target_hash.hi);
  PutU32(&body, kFormatMarker);
  PutU32(&body, kReportFormat);
  const Sha256Digest root = r.report.commitment.value_or(Sha256Digest{});
  body.insert(body.end(), root.begin(), root.end());
  PutU32(&body, static_cast<uint32_t>(r.report.error.size()));
  body.insert(body.end(), r.report.error.begin(), r.report.error.end());
  PutU32(&r.bytes, static_cast<uint32_t>(body.size()));
  r.bytes.insert(r.bytes.end(), body.begin(), body.end());
  PutU32(&r.bytes, 0);  // no tail
  return r;
}

void SetReportTail(ReportRecord* record, std::vector<uint8_t> tail) {
  const uint32_t body_bytes = GetU32(record->bytes.data());
  record->bytes.resize(4 + body_bytes);
  PutU32(&record->bytes, static_cast<uint32_t>(tail.size()));
  record->bytes.insert(record->bytes.end(), tail.begin(), tail.end());
  record->tail = std::move(tail);
}

std::pair<const uint8_t*, size_t> ReportBody(const ReportRecord& record) {
  return {record.bytes.data() + 4, GetU32(record.bytes.data())};
}

StatusOr<ReportRecord> ParseReportRecord(const uint8_t* data, size_t size, size_t* consumed) {
  if (size < 4) return DataLossError("commit report: truncated record");
  const uint32_t body_bytes = GetU32(data);
  if (body_bytes < kMarkerAt + 4 || body_bytes > kReportBodyFixedBytes + kMaxReportMessageBytes) {
    return DataLossError("commit report: record body of " + std::to_string(body_bytes) + " bytes");
  }
  if (size - 4 < static_cast<size_t>(body_bytes) + 4) {
    return DataLossError("commit report: truncated record");
  }
  const uint8_t* b = data + 4;
  if (GetU32(b + kMarkerAt) != kFormatMarker) {
    return FailedPreconditionError(
        "commit report: record of format 1 (it proves nothing but the additive content hash, no "
        "commitment root); this node takes format " +
        std::to_string(kReportFormat) + " only");
  }
  if (body_bytes < kReportBodyFixedBytes) {
    return DataLossError("commit report: record body of " + std::to_string(body_bytes) + " bytes");
  }
  if (const uint32_t format = GetU32(b + kMarkerAt + 4); format != kReportFormat) {
    return FailedPreconditionError("commit report: record of format " + std::to_string(format) +
                                   ", unknown; this node takes format " +
                                   std::to_string(kReportFormat) + " only");
  }
  const uint32_t message_bytes = GetU32(b + kMessageBytesAt);
  if (message_bytes != body_bytes - kReportBodyFixedBytes) {
    return DataLossError("commit report: message length " + std::to_string(message_bytes) +
                         " does not fit a body of " + std::to_string(body_bytes) + " bytes");
  }
  const uint32_t tail_bytes = GetU32(b + body_bytes);
  if (tail_bytes > kMaxReportTailBytes) {
    return DataLossError("commit report: record tail of " + std::to_string(tail_bytes) + " bytes");
  }
  const size_t total = 4 + static_cast<size_t>(body_bytes) + 4 + tail_bytes;
  if (size < total) return DataLossError("commit report: truncated record");
  ReportRecord r;
  r.report.rank = static_cast<int>(GetU32(b));
  const uint32_t code = GetU32(b + 4);
  if (code > static_cast<uint32_t>(StatusCode::kAborted)) {
    return DataLossError("commit report: unknown status code " + std::to_string(code));
  }
  r.report.code = static_cast<StatusCode>(code);
  r.report.ok = code == 0;
  r.report.run = GetU64(b + 8);
  r.report.version = GetU64(b + 16);
  r.report.target_hash.lo = GetU64(b + 24);
  r.report.target_hash.hi = GetU64(b + 32);
  Sha256Digest root;
  std::memcpy(root.data(), b + kRootAt, root.size());
  if (root != Sha256Digest{}) r.report.commitment = root;
  r.report.error.assign(reinterpret_cast<const char*>(b + kReportBodyFixedBytes), message_bytes);
  const uint8_t* tail = b + body_bytes + 4;
  r.tail.assign(tail, tail + tail_bytes);
  r.bytes.assign(data, data + total);
  *consumed = total;
  return r;
}

std::vector<uint8_t> EncodeReportPayload(const std::vector<ReportRecord>& records) {
  std::vector<uint8_t> out;
  PutU32(&out, static_cast<uint32_t>(records.size()));
  for (const ReportRecord& r : records) out.insert(out.end(), r.bytes.begin(), r.bytes.end());
  return out;
}

StatusOr<std::vector<ReportRecord>> ParseReportPayload(const uint8_t* data, size_t size,
                                                       uint64_t count) {
  if (size < 4) return DataLossError("commit report: truncated payload");
  const uint32_t n = GetU32(data);
  if (n != count) {
    return DataLossError("commit report: payload holds " + std::to_string(n) +
                         " records, its frame says " + std::to_string(count));
  }
  std::vector<ReportRecord> out;
  size_t pos = 4;
  for (uint32_t i = 0; i < n; ++i) {
    size_t used = 0;
    auto r = ParseReportRecord(data + pos, size - pos, &used);
    if (!r.ok()) return r.status();
    out.push_back(std::move(*r));
    pos += used;
  }
  if (pos != size) {
    return DataLossError("commit report: " + std::to_string(size - pos) +
                         " bytes after the last record");
  }
  return out;
}

std::string CommitmentMismatch(const CommitReport& report,
                               const std::optional<Sha256Digest>& root) {
  if (!root || report.commitment == root) return std::string();
  const std::string signed_root = "not the signed root " + CommitmentHex(*root);
  if (!report.commitment) {
    return "it reported no commitment root (content hash " + report.target_hash.ToHex() +
           " proves nothing), " + signed_root;
  }
  return "it reported commitment " + CommitmentHex(*report.commitment) + " (content hash " +
         report.target_hash.ToHex() + "), " + signed_root;
}

std::optional<Sha256Digest> RootOfHex(const std::string& hex) {
  if (hex.size() != 64) return std::nullopt;
  Sha256Digest d{};
  for (size_t i = 0; i < d.size(); ++i) {
    unsigned v = 0;
    if (std::sscanf(hex.c_str() + 2 * i, "%2x", &v) != 1) return std::nullopt;
    d[i] = static_cast<uint8_t>(v);
  }
  if (CommitmentHex(d) != hex) return std::nullopt;
  return d;
}

uint64_t MaxReportPayloadBytes(size_t nodes) { return 4 + nodes * kMaxReportRecordBytes; }

ReportCollector::ReportCollector(std::vector<int> parents, int self, uint64_t run, uint64_t version)
    : parents_(std::move(parents)), self_(self), run_(run), version_(version) {}

bool ReportCollector::InSubtree(int rank, int root) const {
  const int n = static_cast<int>(parents_.size());
  // Walk up from `rank`; at most n steps (the topology is a tree, but stay bounded anyway).
  for (int r = rank, steps = 0; r >= 0 && r < n && steps <= n; r = parents_[r], ++steps) {
    if (r == root) return true;
  }
  return false;
}

Status ReportCollector::Add(int child, const ReportRecord& record) {
  const CommitReport& rep = record.report;
  const int n = static_cast<int>(parents_.size());
  if (child <= 0 || child >= n || parents_[child] != self_) {
    return FailedPreconditionError("node " + std::to_string(child) + " is not a child of node " +
                                   std::to_string(self_));
  }
  if (rep.rank <= 0 || rep.rank >= n || !InSubtree(rep.rank, child)) {
    return FailedPreconditionError("child node " + std::to_string(child) + " reported rank " +
                                   std::to_string(rep.rank) + ", which is not in its subtree");
  }
  if (rep.run != run_ || rep.version != version_) {
    char ids[160];
    std::snprintf(
        ids, sizeof(ids), "run 0x%016llx version %llu, this node's run 0x%016llx version %llu",
        static_cast<unsigned long long>(rep.run), static_cast<unsigned long long>(rep.version),
        static_cast<unsigned long long>(run_), static_cast<unsigned long long>(version_));
    return FailedPreconditionError("child node " + std::to_string(child) + " reported rank " +
                                   std::to_string(rep.rank) + " for " + ids);
  }
  if (verifier_) {  // who made the record, before what it says
    Status v = verifier_(record);
    if (!v.ok()) return v.WithContext("child node " + std::to_string(child));
  }
  if (rep.ok && expected_commitment_) {
    const std::string why = CommitmentMismatch(rep, expected_commitment_());
    if (!why.empty()) {
      return FailedPreconditionError("child node " + std::to_string(child) + " reported rank " +
                                     std::to_string(rep.rank) + " committed, but " + why);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!ranks_.insert(rep.rank).second) {
    return FailedPreconditionError("child node " + std::to_string(child) + " reported rank " +
                                   std::to_string(rep.rank) + " a second time");
  }
  records_.push_back(record);
  return Status();
}

std::vector<ReportRecord> ReportCollector::records() const {
  std::lock_guard<std::mutex> lock(mu_);
  return records_;
}

std::vector<CommitReport> ReportCollector::reports() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<CommitReport> out;
  for (const ReportRecord& r : records_) out.push_back(r.report);
  return out;
}

}  // namespace dcr::internal
