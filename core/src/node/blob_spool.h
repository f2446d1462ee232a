// Internal: the bytes of the version in flight that a node received, kept in its state directory
// so that a restarted process resumes every blob by (blob, offset) from them (blob_resume.h)
// instead of fetching the version again.
//
// The spool is one append-only file, <state>/rank-<r>.spool:
//   file header: "DCRSPOOL" | u32 key length | key bytes (the stream: run id, version, rank,
//                prefix) | u64 XXH3-64 of the header bytes before it
//   record:      u32 0x44435352 | u8 blob kind | 3 zero bytes | u64 blob id | u64 blob size |
//                u64 offset | u64 length | u64 XXH3-64 of the data | u64 XXH3-64 of the record
//                bytes before it | data (length bytes)
// A record is written (one writev) after its bytes arrived whole; nothing is fsynced. Crash
// safety comes from the checksums: a restart reuses a record only when its header and its data
// verify, and the file ends at the first record that does not (a write torn by a kill, bytes a
// machine crash lost): that tail is cut off and appending continues there. A file of another
// stream (its key differs) is started over. What the spool restores is still checked by the
// receiver as every received byte is (chunk hashes, the trailer, the signed manifest); a blob
// that fails there is fetched whole.
//
// Bounded: appends stop once the file would pass `budget_bytes`, and a restore allocates at most
// 2 x `budget_bytes` of blob buffers, each at most what `max_blob_bytes` allows for its kind.
// Persisting is best effort: a failed write stops the spool (the transfer does not depend on
// it), reported through failed().
//
// Thread safety: Append, bytes(), failed() and Discard may be called from any thread.
#ifndef DCR_CORE_SRC_NODE_BLOB_SPOOL_H_
#define DCR_CORE_SRC_NODE_BLOB_SPOOL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dcr/relay_policy.h"
#include "dcr/status.h"
#include "dcr/statusor.h"
#include "node/blob_resume.h"

namespace dcr::internal {

class BlobSpool {
 public:
  // A blob read back from the spool: its buffer (its full size) and the ranges that verified.
  struct Restored {
    BlobInfo info;
    std::vector<uint8_t> bytes;
    HeldRanges held;
  };

  // Opens the spool at `path` for stream `key`. `fresh`: the file is started over (a first
  // start). Otherwise every record of the same key that verifies is returned in *restored
  // (blobs with a held prefix only: a resume starts at the prefix), in blob id order, and
  // appends continue after the last such record.
  // Errors: kInvalidArgument for a zero budget; I/O (ErrnoError) when the file cannot be opened
  // or cut (a damaged file is not an error: it is read up to its first bad record).
  static StatusOr<std::unique_ptr<BlobSpool>> Open(
      const std::string& path, const std::string& key, uint64_t budget_bytes, bool fresh,
      const std::function<uint64_t(BlobKind)>& max_blob_bytes, std::vector<Restored>* restored);
  ~BlobSpool();
  BlobSpool(const BlobSpool&) = delete;
  BlobSpool& operator=(const BlobSpool&) = delete;

  // Records bytes [offset, offset + length) of blob `info` (`data` points at them). Skipped once
  // the file would pass the budget, after a failed write, or after Discard.
  void Append(const BlobInfo& info, uint64_t offset, const uint8_t* data, uint64_t length);
  // The file's size in bytes (header and records).
  uint64_t bytes() const;
  // A write failed (the spool stopped); the error.
  Status failed() const;
  // Removes the file (the version committed: nothing of it is needed again).
  void Discard();

 private:
  BlobSpool(std::string path, int fd, uint64_t end, uint64_t budget);

  mutable std::mutex mu_;
  const std::string path_;
  int fd_;
  uint64_t end_;  // where the next record goes
  const uint64_t budget_;
  Status failed_;
  bool discarded_ = false;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_BLOB_SPOOL_H_
