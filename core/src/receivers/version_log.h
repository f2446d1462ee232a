// VersionLog: a receiver's committed versions made durable in O(delta) bytes: a full image of
// one version plus an append-only log of the deltas applied since, replayed on restart.
//
// A directory holds:
//   * image-<n>: the bytes of version n laid out as the layout checkpoint's files back to back
//     (the layout a DurableReceiver's storage mapping uses: one file, or the shards concatenated
//     in name order);
//   * log: a file header naming the image (version number, content hash, size, XXH3-64 of its
//     bytes), then entries. Each committed version is a run of entries: its delta's file header,
//     the chunk records as the receiver applied them (relative or overwrite form, as received),
//     its trailer, and last a commit marker (the target's number and content hash).
//
// Log format (integers little-endian):
//   file header (64 bytes): "DCRVLOG\0" | u32 format (=1) | u32 reserved (0) | u64 image number
//                | u64 image hash lo | u64 image hash hi | u64 image size | u64 image XXH3-64
//                | u64 XXH3-64 of the 56 bytes before
//   entry:       u32 payload_size | u8 type | payload | u64 checksum: XXH3-64 of the payload with
//                seed (payload_size << 8 | type)
//   types:       1 header, 2 record, 3 trailer, 4 commit (u64 number | u64 hash lo | u64 hi)
//
// Commit order: the version's entries are written as they arrive (write(2), no fsync), then the
// trailer is appended and the log fsynced, then the commit marker appended and fsynced: the
// version is durable when the marker is. A full image is written only when ImageDue(): every
// VersionLogOptions::image_every_versions versions or once the log holds log_budget_bytes. It is
// written as image-<n> (temporary, fsync, rename), then a fresh log naming it replaces the old
// one (temporary, fsync, rename, directory fsync), then the old image is removed. A process killed
// at any point leaves the old version or the new one: entries without their marker are the
// torn tail (discarded and truncated on Open), a half-written image is a temporary (removed on
// Open), and an image the log does not name yet is removed on Open.
//
// Recovery (Open) loads the named image, checks its size and digest, and replays every committed
// version through a BufferReceiver over it (each chunk base-checked, each version's ledger proven
// against its target hash), so the recovered bytes equal a dense load of the last committed
// version. A complete entry whose checksum does not match, an image whose digest does not, or a
// replay the receiver refuses is kDataLoss naming what: the caller falls back to its repair path.
//
// Thread safety: AppendRecord may be called concurrently (one internal mutex; each entry is one
// write); the other methods from one thread at a time, not concurrently with AppendRecord.
#ifndef DCR_CORE_SRC_RECEIVERS_VERSION_LOG_H_
#define DCR_CORE_SRC_RECEIVERS_VERSION_LOG_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/receiver.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr::internal {

// The steps of a commit where a fault test may end the process (VersionLogOptions::on_step).
enum class VersionLogStep {
  kEntriesSynced,     // the version's entries and trailer fsynced, its commit marker not written
  kMarkerSynced,      // the commit marker fsynced, no image written for it
  kImageHalfWritten,  // half of a new image's bytes written into its temporary
  kImageRenamed,      // the new image in place, the log still naming the old one
};
const char* VersionLogStepName(VersionLogStep step);

struct VersionLogOptions {
  // ImageDue() once this many versions are logged since the image. 0: no count limit.
  // Default 1024 (a bound on the versions a restart replays).
  uint64_t image_every_versions = 1024;
  // ImageDue() once the log holds at least this many bytes. 0 (the default):
  // log_budget_images times the image's size.
  uint64_t log_budget_bytes = 0;
  // The budget in images when log_budget_bytes is 0. Default 1.25: over one cycle (the log's
  // versions, then their image) the disk takes the log's bytes (the received payload plus about
  // 0.5% of entry framing) and one image of at most 1/1.25 of them: about 1.8x the payload per
  // version, amortized. A restart replays at most one budget of log.
  double log_budget_images = 1.25;
  // Called at each VersionLogStep (a fault test ends its process there). Default: none.
  std::function<void(VersionLogStep)> on_step;
};

// Bytes and operations of this object's lifetime.
struct VersionLogStats {
  uint64_t log_bytes = 0;    // bytes appended to the log (entries and markers)
  uint64_t image_bytes = 0;  // bytes of images written (and fresh log headers)
  uint64_t images = 0;       // images written (Create's included)
  uint64_t versions = 0;     // versions committed to the log
  uint64_t fsyncs = 0;
};

// What Open recovered.
struct RecoveredVersion {
  std::vector<uint8_t> bytes;  // the image with every committed version replayed
  VersionId version;           // the last committed version (the image's when none logged)
  VersionId image_version;
  uint64_t versions_replayed = 0;
  uint64_t records_replayed = 0;
  uint64_t log_bytes = 0;   // of committed entries
  uint64_t torn_bytes = 0;  // entries without their commit marker, truncated
  double load_s = 0;        // reading and checking the image
  double replay_s = 0;      // replaying the log
};

class VersionLog {
 public:
  // Makes `dir` (created if absent) a fresh store of version `v` whose image is `image`
  // (`size` bytes laid out as the layout checkpoint's files). Anything a store left there is
  // replaced. Errors: errno errors naming the file.
  static StatusOr<std::unique_ptr<VersionLog>> Create(const std::string& dir, const uint8_t* image,
                                                      size_t size, const VersionId& v,
                                                      VersionLogOptions options = {});
  // Recovers the store in `dir` into `*out` (see the file comment) and opens it for appending
  // after its last committed version. `layout`: a checkpoint with the image's layout (tensor
  // names, dtypes, shapes and places; its bytes are not read). Errors: kNotFound (no store),
  // kDataLoss (a bad file header, a corrupt entry, an image that is missing, of another size or
  // digest, a logged version the replay refuses), kFailedPrecondition (an image whose size is not
  // the layout's), errno errors.
  static StatusOr<std::unique_ptr<VersionLog>> Open(const std::string& dir,
                                                    const Checkpoint& layout, RecoveredVersion* out,
                                                    VersionLogOptions options = {});
  // What Open recovers, read only: nothing in `dir` is truncated, removed or opened for writing,
  // so it may run while a VersionLog of `dir` is open (between its versions: entries of a version
  // begun and not committed are left out as a torn tail). Errors: Open's.
  static Status Recover(const std::string& dir, const Checkpoint& layout, RecoveredVersion* out);
  // The versions the store in `dir` names, read from its log alone (no image, no layout, no
  // replay; nothing written): the image's version, then each commit marker's in log order
  // (entries after the last marker are the torn tail). What a caller that cannot recover the
  // store still learns from it: which content each version number was committed with.
  // Errors: kNotFound (no log), kDataLoss (a bad file header, a corrupt entry), errno errors.
  static StatusOr<std::vector<VersionId>> NamedVersions(const std::string& dir);
  ~VersionLog();
  VersionLog(const VersionLog&) = delete;
  VersionLog& operator=(const VersionLog&) = delete;

  // Logs the delta whose file header is `header` (the start of a version's entries).
  // REQUIRES: no version begun. kFailedPrecondition otherwise.
  Status BeginVersion(const uint8_t* header, size_t size);
  // Logs one chunk record applied to the receiver, in the form applied (relative or overwrite).
  // A chunk logged twice replays as the receiver applied it: once, then skipped or refused as
  // its replay decides; callers log each record they applied once. REQUIRES: a version begun.
  Status AppendRecord(const uint8_t* record, size_t size);
  // Makes version `target` durable: appends the trailer, fsyncs, appends the commit marker,
  // fsyncs. REQUIRES: a version begun and every record it applied logged. kFailedPrecondition
  // when an append of the version failed (Abandon it); on any error the version is not
  // committed and Abandon discards its entries.
  Status Commit(const uint8_t* trailer, size_t size, const VersionId& target);
  // Discards the entries of the version begun (truncates the log to its last commit marker).
  Status Abandon();
  // Whether the next WriteImage is due (VersionLogOptions thresholds).
  bool ImageDue() const;
  // Writes `image` (version `v`, the last committed) as the new image and resets the log to it.
  // REQUIRES: no version begun; v is the last committed version; v.number differs from the
  // image's unless no version was logged since it (then nothing is written). An error before the
  // fresh log is in place leaves the old image and log as they were; one after it (the
  // directory's fsync, reopening the log) leaves the store on the new image, and this object
  // refuses further versions when it cannot append to the new log (Open the store again).
  Status WriteImage(const uint8_t* image, size_t size, const VersionId& v);

  // The last committed version.
  VersionId committed() const { return committed_; }
  uint64_t log_size() const { return size_; }
  uint64_t versions_since_image() const { return since_image_; }
  VersionLogStats stats() const;
  const std::string& dir() const { return dir_; }

 private:
  VersionLog() = default;
  struct RecoveredStore {
    uint64_t committed_end = 0;  // log bytes up to the last commit marker
    uint64_t image_size = 0;
  };
  static Status RecoverStore(const std::string& dir, const Checkpoint& layout,
                             RecoveredVersion* out, RecoveredStore* store);
  Status AppendLocked(uint8_t type, const uint8_t* payload, size_t size);
  Status SyncLocked();
  void Step(VersionLogStep s) const;

  std::string dir_;
  VersionLogOptions options_;
  int fd_ = -1;
  uint64_t size_ = 0;            // bytes in the log
  uint64_t committed_size_ = 0;  // log bytes up to the last commit marker
  uint64_t image_size_ = 0;
  uint64_t image_number_ = 0;
  uint64_t since_image_ = 0;  // versions committed to the log since its image
  bool in_version_ = false;
  bool broken_ = false;  // an append of the version begun failed: it cannot commit
  VersionId committed_;
  mutable std::mutex mu_;
  VersionLogStats stats_;
};

// The tensors of `layout` placed in `image` (its files' bytes back to back, the layout of an
// image). REQUIRES: `image` holds at least ImageSize(layout) bytes.
std::vector<ReceiverTensor> ImageTensors(const Checkpoint& layout, uint8_t* image);
// The bytes of `layout`'s files together.
uint64_t ImageSize(const Checkpoint& layout);

// A Receiver decorator that logs into a VersionLog what its inner receiver applied: Begin logs
// the delta's header after the inner Begin; each record the inner receiver applied is logged
// after it; Commit commits the inner receiver (its target checks), then the log (the version
// is durable when Commit returns OK), then, when the log's ImageDue(), calls `write_image` to
// write the storage as the new image (null: never). Abort aborts the inner receiver and
// abandons the version's entries. MarkApplied is refused (kFailedPrecondition): a chunk the
// log has no record of cannot be replayed. A record applied whose append fails makes Commit
// fail. A Commit that fails after the inner receiver committed leaves the storage at the target
// and the log at the version before: the durable version is the log's (a restart recovers it).
// Thread safety: as receiver.h says (ApplyRecord concurrently for distinct chunks).
class VersionLoggingReceiver : public Receiver {
 public:
  // Neither pointer is owned; both must outlive this object. `write_image` receives the log and
  // the version just committed and calls VersionLog::WriteImage with the storage's bytes.
  // REQUIRES: inner->held() == log->committed().
  VersionLoggingReceiver(Receiver* inner, VersionLog* log,
                         std::function<Status(VersionLog*, const VersionId&)> write_image = {})
      : inner_(inner), log_(log), write_image_(std::move(write_image)) {}

  Status Begin(const uint8_t* header, size_t size) override;
  Status ApplyRecord(const uint8_t* record, size_t size) override;
  Status Commit(const uint8_t* trailer, size_t size) override;
  void Abort() override;
  Status MarkApplied(uint64_t chunk_id, const Hash128& version_delta) override;
  Status Verify(const Checkpoint& target) const override { return inner_->Verify(target); }
  const Receiver* storage() const override { return inner_->storage(); }
  VersionId held() const override { return inner_->held(); }
  bool in_delta() const override { return inner_->in_delta(); }
  std::vector<uint64_t> MissingChunks(const Trailer& trailer) const override {
    return inner_->MissingChunks(trailer);
  }

 private:
  Receiver* inner_;
  VersionLog* log_;
  std::function<Status(VersionLog*, const VersionId&)> write_image_;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_RECEIVERS_VERSION_LOG_H_
