// Per-receiver commit reports of the relay tree: one record per applying node, travelling up the
// tree to the sender, which then knows which ranks committed which version with which content
// hash (or failed, and why).
//
// Record wire form (little-endian), self-delimiting so that a relay forwards it verbatim:
//   u32 body_bytes | body | u32 tail_bytes | tail
//   body: u32 rank | u32 status code (0 = committed) | u64 run | u64 version
//         | u64 hash lo | u64 hash hi | u32 0xFFFFFFFF | u32 format (2)
//         | 32 bytes commitment root (all zero: none) | u32 message_bytes | message
//   The root (dcr/commitment.h) of what the reporting node holds is what a sender compares with
//   the root it signed; the additive content hash (hash lo/hi) is bookkeeping. The marker
//   0xFFFFFFFF sits where format 1 (no root) kept its message length, so a format-1 reader refuses
//   a format-2 record (a message length that does not fit its body) and this reader refuses a
//   format-1 record (no marker) and any other format, each by name.
//   tail: bytes after the body that this layer carries but does not interpret (empty when the
//         record is unsigned; a signature over the body goes here). Readers skip tail fields they
//         do not know, so a record can grow at its end without a new wire protocol.
// A kReport frame's payload is u32 record count | records; the frame header's `blob` field holds
// the same count. A node never re-encodes a record it received: it forwards the bytes it read.
//
// CommitmentMismatch names why a committed report does not prove the version `root` (nullopt:
// nothing to compare, empty result); ReportCollector and the sender's store and joint-commit
// checks share it.
//
// Thread safety: the free functions are pure. ReportCollector is thread-safe (the readers of
// several children add to it while the loop thread reads it).
#ifndef DCR_CORE_SRC_NODE_COMMIT_REPORTS_H_
#define DCR_CORE_SRC_NODE_COMMIT_REPORTS_H_

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dcr/node.h"
#include "dcr/statusor.h"

namespace dcr::internal {

// Bounds of one record: its message and its tail, and so the whole record.
inline constexpr uint32_t kMaxReportMessageBytes = 1024;
inline constexpr uint32_t kMaxReportTailBytes = 1024;
inline constexpr uint32_t kReportBodyFixedBytes = 84;
inline constexpr uint32_t kReportFormat = 2;
inline constexpr uint64_t kMaxReportRecordBytes =
    8 + kReportBodyFixedBytes + kMaxReportMessageBytes + kMaxReportTailBytes;

// One record as read from the wire: its fields and its exact bytes (forwarded verbatim).
struct ReportRecord {
  CommitReport report;
  std::vector<uint8_t> tail;   // uninterpreted tail fields
  std::vector<uint8_t> bytes;  // the whole record as received or encoded
};

// The record of `report` with an empty tail (the message is cut to kMaxReportMessageBytes).
ReportRecord EncodeReportRecord(const CommitReport& report);

// Parses one record at the start of [data, data + size); `consumed` gets its length.
// kDataLoss when it is truncated or its lengths exceed the bounds above; kFailedPrecondition,
// naming the format, for a record of format 1 (no commitment root) or an unknown format.
StatusOr<ReportRecord> ParseReportRecord(const uint8_t* data, size_t size, size_t* consumed);

// `record` with `tail` as its tail, its bytes rebuilt (REQUIRES: tail.size() <=
// kMaxReportTailBytes).
void SetReportTail(ReportRecord* record, std::vector<uint8_t> tail);
// The body bytes of `record` (what a signature in its tail covers): [first, first + size).
std::pair<const uint8_t*, size_t> ReportBody(const ReportRecord& record);

// A kReport payload of `records` (their bytes concatenated behind the count).
std::vector<uint8_t> EncodeReportPayload(const std::vector<ReportRecord>& records);

// Parses a kReport payload that its frame says holds `count` records. kDataLoss when the count
// differs, a record is malformed or bytes are left over.
StatusOr<std::vector<ReportRecord>> ParseReportPayload(const uint8_t* data, size_t size,
                                                       uint64_t count);

// Empty when `report` is a committed report of `root` (or `root` is nullopt); otherwise why not:
// "reported commitment <hex> (content hash <hex>), not the signed root <hex>", or "reported no
// commitment root ...".
std::string CommitmentMismatch(const CommitReport& report, const std::optional<Sha256Digest>& root);

// The root that CommitmentHex (dcr/commitment.h) printed as `hex` (NodeResult::commitment);
// nullopt for "" (none) or text that is not 64 lowercase hex digits.
std::optional<Sha256Digest> RootOfHex(const std::string& hex);

// The largest kReport payload a node of a tree of `nodes` ranks accepts: one record per rank.
uint64_t MaxReportPayloadBytes(size_t nodes);

// The records a node has gathered from its children, checked as they arrive: a child may report
// only ranks of its own subtree (itself and its descendants in `parents`), each once, of this
// node's run and version. Anything else is refused and kept out.
class ReportCollector {
 public:
  // `parents`: the topology (parents[0] == -1); `self`: this node's rank.
  ReportCollector(std::vector<int> parents, int self, uint64_t run, uint64_t version);

  // Adds `record`, received from child `child`. Errors (the record is not kept), all
  // kFailedPrecondition with a message naming the child and the rank: a rank outside the
  // child's subtree (or `child` not a child of this node), a rank reported before, a record of
  // another run or version.
  Status Add(int child, const ReportRecord& record);

  // Checks each record before Add keeps it (e.g. its signature, at the sender); an error refuses
  // it like the checks above. Empty (the default): none. Set before the first Add.
  void set_verifier(std::function<Status(const ReportRecord&)> verifier) {
    verifier_ = std::move(verifier);
  }

  // The commitment root a committed record must carry (the sender's signed one, read at each
  // Add); a committed record without it is refused like the checks above, naming both roots.
  // Empty, or a function that returns nullopt (nothing signed): no such check. Set before the
  // first Add.
  void set_expected_commitment(std::function<std::optional<Sha256Digest>()> root) {
    expected_commitment_ = std::move(root);
  }

  // Every record kept, in arrival order.
  std::vector<ReportRecord> records() const;
  std::vector<CommitReport> reports() const;

 private:
  bool InSubtree(int rank, int root) const;

  const std::vector<int> parents_;
  const int self_;
  const uint64_t run_;
  const uint64_t version_;
  std::function<Status(const ReportRecord&)> verifier_;
  std::function<std::optional<Sha256Digest>()> expected_commitment_;
  mutable std::mutex mu_;
  std::vector<ReportRecord> records_;
  std::set<int> ranks_;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_COMMIT_REPORTS_H_
