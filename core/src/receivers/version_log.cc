// VersionLog: image + log of applied deltas (format and rules in version_log.h).
#include "receivers/version_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "dcr/status_macros.h"
#include "internal/atomic_file.h"

namespace dcr::internal {
namespace {

constexpr char kMagic[8] = {'D', 'C', 'R', 'V', 'L', 'O', 'G', '\0'};
constexpr uint32_t kFormat = 1;
constexpr size_t kHeaderSize = 64;
constexpr size_t kEntryOverhead = 4 + 1 + 8;

enum EntryType : uint8_t { kHeader = 1, kRecord = 2, kTrailer = 3, kCommit = 4 };

const char* EntryName(uint8_t type) {
  switch (type) {
    case kHeader:
      return "header";
    case kRecord:
      return "record";
    case kTrailer:
      return "trailer";
    case kCommit:
      return "commit";
  }
  return "unknown";
}

void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
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

// XXH3-64 of (payload_size, type, payload): the payload hashed with the two as its seed.
uint64_t EntryChecksum(uint8_t type, const uint8_t* payload, size_t size) {
  return XXH3_64bits_withSeed(payload, size, (static_cast<uint64_t>(size) << 8) | type);
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string LogPath(const std::string& dir) { return dir + "/log"; }
std::string ImagePath(const std::string& dir, uint64_t number) {
  return dir + "/image-" + std::to_string(number);
}

std::vector<uint8_t> LogHeader(const VersionId& image, uint64_t size, uint64_t digest) {
  std::vector<uint8_t> h(kHeaderSize, 0);
  std::memcpy(h.data(), kMagic, 8);
  PutU32(h.data() + 8, kFormat);
  PutU64(h.data() + 16, image.number);
  PutU64(h.data() + 24, image.hash.lo);
  PutU64(h.data() + 32, image.hash.hi);
  PutU64(h.data() + 40, size);
  PutU64(h.data() + 48, digest);
  PutU64(h.data() + 56, XXH3_64bits(h.data(), 56));
  return h;
}

Status SyncDir(const std::string& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return ErrnoError("version log: open directory " + dir, errno);
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  if (rc != 0) return ErrnoError("version log: fsync directory " + dir, err);
  return Status();
}

Status WriteAll(int fd, const uint8_t* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("version log: write " + path, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status();
}

StatusOr<int> OpenForAppend(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) return ErrnoError("version log: open " + path, errno);
  return fd;
}

// Writes image-<v> (temporary, fsync, rename) and then a fresh log naming it (temporary, fsync,
// rename), fsyncing the directory after each rename. `step` (may be empty) is told of the image
// steps. `*log_replaced` is set once the fresh log is in place (an error after it leaves the
// store on the new image).
Status WriteImageAndLog(const std::string& dir, const uint8_t* image, size_t size,
                        const VersionId& v, const std::function<void(VersionLogStep)>& step,
                        bool* log_replaced) {
  *log_replaced = false;
  const std::string image_path = ImagePath(dir, v.number);
  {
    DCR_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> f, AtomicFile::Create(image_path));
    const size_t half = size / 2;
    DCR_RETURN_IF_ERROR(f->Write(image, half));
    if (step) step(VersionLogStep::kImageHalfWritten);
    DCR_RETURN_IF_ERROR(f->Write(image + half, size - half));
    DCR_RETURN_IF_ERROR(f->Commit());
  }
  DCR_RETURN_IF_ERROR(SyncDir(dir));
  if (step) step(VersionLogStep::kImageRenamed);
  const std::vector<uint8_t> header = LogHeader(v, size, XXH3_64bits(image, size));
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> log, AtomicFile::Create(LogPath(dir)));
  DCR_RETURN_IF_ERROR(log->Write(header.data(), header.size()));
  DCR_RETURN_IF_ERROR(log->Commit());
  *log_replaced = true;
  return SyncDir(dir);
}

// Removes every file of the store in `dir` other than the log and image-<keep>: older images,
// images the log does not name yet, temporaries of interrupted writes.
void RemoveStale(const std::string& dir, uint64_t keep) {
  std::error_code ec;
  const std::string keep_name = "image-" + std::to_string(keep);
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool image = name.rfind("image-", 0) == 0 && name != keep_name;
    const bool tmp = name.rfind("log.tmp.", 0) == 0;
    if (image || tmp) std::filesystem::remove(e.path(), ec);
  }
}

// One parsed log entry.
struct Entry {
  uint8_t type = 0;
  const uint8_t* payload = nullptr;
  size_t size = 0;
  uint64_t offset = 0;
};

}  // namespace

std::vector<ReceiverTensor> ImageTensors(const Checkpoint& layout, uint8_t* image) {
  std::vector<uint64_t> file_off;
  uint64_t off = 0;
  for (const CheckpointFile& f : layout.files()) {
    file_off.push_back(off);
    off += f.size;
  }
  std::vector<ReceiverTensor> out;
  for (const TensorInfo& t : layout.tensors()) {
    const CheckpointFile& f = layout.files()[t.file];
    out.push_back({t, image + file_off[t.file] + f.data_section_offset + t.offset});
  }
  return out;
}

uint64_t ImageSize(const Checkpoint& layout) {
  uint64_t n = 0;
  for (const CheckpointFile& f : layout.files()) n += f.size;
  return n;
}

const char* VersionLogStepName(VersionLogStep step) {
  switch (step) {
    case VersionLogStep::kEntriesSynced:
      return "entries-synced";
    case VersionLogStep::kMarkerSynced:
      return "marker-synced";
    case VersionLogStep::kImageHalfWritten:
      return "image-half-written";
    case VersionLogStep::kImageRenamed:
      return "image-renamed";
  }
  return "unknown";
}

VersionLog::~VersionLog() {
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<std::unique_ptr<VersionLog>> VersionLog::Create(const std::string& dir,
                                                         const uint8_t* image, size_t size,
                                                         const VersionId& v,
                                                         VersionLogOptions options) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoError("version log: mkdir " + dir, errno);
  }
  bool replaced = false;
  DCR_RETURN_IF_ERROR(WriteImageAndLog(dir, image, size, v, {}, &replaced));
  RemoveStale(dir, v.number);
  std::unique_ptr<VersionLog> log(new VersionLog());
  log->dir_ = dir;
  log->options_ = std::move(options);
  DCR_ASSIGN_OR_RETURN(log->fd_, OpenForAppend(LogPath(dir)));
  log->size_ = log->committed_size_ = kHeaderSize;
  log->image_size_ = size;
  log->image_number_ = v.number;
  log->committed_ = v;
  log->stats_.images = 1;
  log->stats_.image_bytes = size + kHeaderSize;
  log->stats_.fsyncs = 4;
  return log;
}

StatusOr<std::vector<VersionId>> VersionLog::NamedVersions(const std::string& dir) {
  const std::string log_path = LogPath(dir);
  DCR_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFile(log_path));
  if (bytes.size() < kHeaderSize || std::memcmp(bytes.data(), kMagic, 8) != 0 ||
      GetU64(bytes.data() + 56) != XXH3_64bits(bytes.data(), 56) ||
      GetU32(bytes.data() + 8) != kFormat) {
    return DataLossError("version log " + log_path + ": bad file header");
  }
  std::vector<VersionId> out;
  out.push_back(VersionId{GetU64(bytes.data() + 16),
                          Hash128{GetU64(bytes.data() + 24), GetU64(bytes.data() + 32)}});
  uint64_t pos = kHeaderSize;
  while (bytes.size() - pos >= kEntryOverhead) {
    const uint32_t n = GetU32(bytes.data() + pos);
    if (bytes.size() - pos - kEntryOverhead < n) break;  // incomplete: torn
    const uint8_t type = bytes[pos + 4];
    const uint8_t* payload = bytes.data() + pos + 5;
    if (GetU64(payload + n) != EntryChecksum(type, payload, n)) {
      return DataLossError("version log " + log_path + ": corrupt " + EntryName(type) +
                           " entry at offset " + std::to_string(pos) + " (checksum mismatch)");
    }
    if (type == kCommit) {
      if (n != 24) {
        return DataLossError("version log " + log_path + ": commit entry at offset " +
                             std::to_string(pos) + " of " + std::to_string(n) + " bytes");
      }
      out.push_back(VersionId{GetU64(payload), Hash128{GetU64(payload + 8), GetU64(payload + 16)}});
    }
    pos += kEntryOverhead + n;
  }
  return out;
}

Status VersionLog::Recover(const std::string& dir, const Checkpoint& layout,
                           RecoveredVersion* out) {
  RecoveredStore store;
  DCR_RETURN_IF_ERROR(RecoverStore(dir, layout, out, &store));
  return Status();
}

Status VersionLog::RecoverStore(const std::string& dir, const Checkpoint& layout,
                                RecoveredVersion* out, RecoveredStore* store) {
  const std::string log_path = LogPath(dir);
  const double t0 = Now();
  DCR_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFile(log_path));
  if (bytes.size() < kHeaderSize || std::memcmp(bytes.data(), kMagic, 8) != 0 ||
      GetU64(bytes.data() + 56) != XXH3_64bits(bytes.data(), 56)) {
    return DataLossError("version log " + log_path + ": bad file header");
  }
  if (GetU32(bytes.data() + 8) != kFormat) {
    return DataLossError("version log " + log_path + ": format " +
                         std::to_string(GetU32(bytes.data() + 8)) + " (this build reads " +
                         std::to_string(kFormat) + ")");
  }
  RecoveredVersion r;
  r.image_version = VersionId{GetU64(bytes.data() + 16),
                              Hash128{GetU64(bytes.data() + 24), GetU64(bytes.data() + 32)}};
  const uint64_t image_size = GetU64(bytes.data() + 40);
  const uint64_t image_digest = GetU64(bytes.data() + 48);

  // The entries up to the last commit marker; what follows it is the torn tail.
  std::vector<Entry> entries;
  size_t committed_entries = 0;
  uint64_t committed_end = kHeaderSize;
  uint64_t pos = kHeaderSize;
  while (bytes.size() - pos >= kEntryOverhead) {
    const uint32_t n = GetU32(bytes.data() + pos);
    if (bytes.size() - pos - kEntryOverhead < n) break;  // incomplete: torn
    Entry e{bytes[pos + 4], bytes.data() + pos + 5, n, pos};
    if (GetU64(bytes.data() + pos + 5 + n) != EntryChecksum(e.type, e.payload, e.size)) {
      return DataLossError("version log " + log_path + ": corrupt " + EntryName(e.type) +
                           " entry at offset " + std::to_string(pos) + " (checksum mismatch)");
    }
    if (e.type < kHeader || e.type > kCommit) {
      return DataLossError("version log " + log_path + ": unknown entry type " +
                           std::to_string(e.type) + " at offset " + std::to_string(pos));
    }
    entries.push_back(e);
    pos += kEntryOverhead + n;
    if (e.type == kCommit) {
      committed_entries = entries.size();
      committed_end = pos;
    }
  }
  r.torn_bytes = bytes.size() - committed_end;
  r.log_bytes = committed_end - kHeaderSize;

  // The image, checked against the log's header.
  const std::string image_path = ImagePath(dir, r.image_version.number);
  StatusOr<std::vector<uint8_t>> image = ReadFile(image_path);
  if (!image.ok()) {
    return DataLossError("version log " + log_path + ": its image " + image_path +
                         " cannot be read: " + image.status().message());
  }
  if (image->size() != image_size || XXH3_64bits(image->data(), image->size()) != image_digest) {
    return DataLossError("version log image " + image_path + ": " +
                         (image->size() != image_size ? "size" : "digest") +
                         " differs from the one the log records");
  }
  const uint64_t layout_size = ImageSize(layout);
  if (layout_size != image->size()) {
    return FailedPreconditionError("version log image " + image_path + ": " +
                                   std::to_string(image->size()) + " bytes, the layout has " +
                                   std::to_string(layout_size));
  }
  const double t1 = Now();
  r.load_s = t1 - t0;

  // Replay of the committed versions through a receiver over the image.
  {
    BufferReceiver rx(ImageTensors(layout, image->data()), r.image_version);
    auto fail = [&](const Entry& e, const Status& s) {
      return DataLossError("version log " + log_path + ": replay of the " + EntryName(e.type) +
                           " entry at offset " + std::to_string(e.offset) +
                           " refused: " + s.ToString());
    };
    bool in_version = false;
    for (size_t i = 0; i < committed_entries; ++i) {
      const Entry& e = entries[i];
      Status s;
      switch (e.type) {
        case kHeader:
          if (in_version) return fail(e, DataLossError("a header inside a version"));
          s = rx.Begin(e.payload, e.size);
          in_version = true;
          break;
        case kRecord:
          if (!in_version) return fail(e, DataLossError("a record outside a version"));
          s = rx.ApplyRecord(e.payload, e.size);
          ++r.records_replayed;
          break;
        case kTrailer:
          if (!in_version) return fail(e, DataLossError("a trailer outside a version"));
          s = rx.Commit(e.payload, e.size);
          in_version = false;
          break;
        case kCommit: {
          if (in_version || e.size != 24) {
            return fail(e, DataLossError("a commit marker without its trailer"));
          }
          const VersionId v{GetU64(e.payload),
                            Hash128{GetU64(e.payload + 8), GetU64(e.payload + 16)}};
          if (v != rx.held()) {
            return fail(e, DataLossError("the marker names " + v.ToString() +
                                         ", the replay reached " + rx.held().ToString()));
          }
          ++r.versions_replayed;
          break;
        }
      }
      if (!s.ok()) return fail(e, s);
    }
    r.version = rx.held();
  }
  r.replay_s = Now() - t1;
  r.bytes = std::move(*image);
  store->committed_end = committed_end;
  store->image_size = image_size;
  *out = std::move(r);
  return Status();
}

StatusOr<std::unique_ptr<VersionLog>> VersionLog::Open(const std::string& dir,
                                                       const Checkpoint& layout,
                                                       RecoveredVersion* out,
                                                       VersionLogOptions options) {
  const std::string log_path = LogPath(dir);
  RecoveredVersion r;
  RecoveredStore store;
  DCR_RETURN_IF_ERROR(RecoverStore(dir, layout, &r, &store));
  const uint64_t committed_end = store.committed_end;
  const uint64_t image_size = store.image_size;
  if (r.torn_bytes > 0) {
    if (::truncate(log_path.c_str(), static_cast<off_t>(committed_end)) != 0) {
      return ErrnoError("version log: truncate " + log_path, errno);
    }
  }
  RemoveStale(dir, r.image_version.number);
  std::unique_ptr<VersionLog> log(new VersionLog());
  log->dir_ = dir;
  log->options_ = std::move(options);
  DCR_ASSIGN_OR_RETURN(log->fd_, OpenForAppend(log_path));
  if (r.torn_bytes > 0) {
    while (::fdatasync(log->fd_) != 0) {
      if (errno != EINTR) return ErrnoError("version log: fdatasync " + log_path, errno);
    }
  }
  log->size_ = log->committed_size_ = committed_end;
  log->image_size_ = image_size;
  log->image_number_ = r.image_version.number;
  log->since_image_ = r.versions_replayed;
  log->committed_ = r.version;
  *out = std::move(r);
  return log;
}

void VersionLog::Step(VersionLogStep s) const {
  if (options_.on_step) options_.on_step(s);
}

Status VersionLog::AppendLocked(uint8_t type, const uint8_t* payload, size_t size) {
  if (size > UINT32_MAX) {
    return InvalidArgumentError("version log: entry of " + std::to_string(size) + " bytes");
  }
  std::vector<uint8_t> buf(kEntryOverhead + size);
  PutU32(buf.data(), static_cast<uint32_t>(size));
  buf[4] = type;
  if (size > 0) std::memcpy(buf.data() + 5, payload, size);
  PutU64(buf.data() + 5 + size, EntryChecksum(type, payload, size));
  Status w = WriteAll(fd_, buf.data(), buf.size(), LogPath(dir_));
  if (!w.ok()) {
    broken_ = true;  // the entry may be partly written: the version cannot commit
    return w;
  }
  size_ += buf.size();
  stats_.log_bytes += buf.size();
  return Status();
}

Status VersionLog::SyncLocked() {
  while (::fdatasync(fd_) != 0) {
    if (errno != EINTR) return ErrnoError("version log: fdatasync " + LogPath(dir_), errno);
  }
  ++stats_.fsyncs;
  return Status();
}

Status VersionLog::BeginVersion(const uint8_t* header, size_t size) {
  std::lock_guard<std::mutex> l(mu_);
  if (in_version_) return FailedPreconditionError("version log: a version is already begun");
  if (fd_ < 0) return FailedPreconditionError("version log: the store must be reopened");
  DCR_RETURN_IF_ERROR(AppendLocked(kHeader, header, size));
  in_version_ = true;
  return Status();
}

Status VersionLog::AppendRecord(const uint8_t* record, size_t size) {
  std::lock_guard<std::mutex> l(mu_);
  if (!in_version_) return FailedPreconditionError("version log: a record with no version begun");
  return AppendLocked(kRecord, record, size);
}

Status VersionLog::Commit(const uint8_t* trailer, size_t size, const VersionId& target) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!in_version_) return FailedPreconditionError("version log: commit with no version begun");
    if (broken_) {
      return FailedPreconditionError(
          "version log: an entry of this version was not written; "
          "the version cannot commit (abandon it)");
    }
    DCR_RETURN_IF_ERROR(AppendLocked(kTrailer, trailer, size));
    DCR_RETURN_IF_ERROR(SyncLocked());
  }
  Step(VersionLogStep::kEntriesSynced);
  {
    std::lock_guard<std::mutex> l(mu_);
    uint8_t marker[24];
    PutU64(marker, target.number);
    PutU64(marker + 8, target.hash.lo);
    PutU64(marker + 16, target.hash.hi);
    DCR_RETURN_IF_ERROR(AppendLocked(kCommit, marker, sizeof(marker)));
    DCR_RETURN_IF_ERROR(SyncLocked());
    committed_size_ = size_;
    committed_ = target;
    in_version_ = false;
    ++since_image_;
    ++stats_.versions;
  }
  Step(VersionLogStep::kMarkerSynced);
  return Status();
}

Status VersionLog::Abandon() {
  std::lock_guard<std::mutex> l(mu_);
  if (size_ != committed_size_ && ::ftruncate(fd_, static_cast<off_t>(committed_size_)) != 0) {
    return ErrnoError("version log: truncate " + LogPath(dir_), errno);
  }
  size_ = committed_size_;
  in_version_ = false;
  broken_ = false;
  return Status();
}

bool VersionLog::ImageDue() const {
  std::lock_guard<std::mutex> l(mu_);
  if (since_image_ == 0) return false;
  if (options_.image_every_versions > 0 && since_image_ >= options_.image_every_versions) {
    return true;
  }
  const uint64_t budget =
      options_.log_budget_bytes > 0
          ? options_.log_budget_bytes
          : static_cast<uint64_t>(options_.log_budget_images * static_cast<double>(image_size_));
  return committed_size_ - kHeaderSize >= budget;
}

Status VersionLog::WriteImage(const uint8_t* image, size_t size, const VersionId& v) {
  std::lock_guard<std::mutex> l(mu_);
  if (in_version_) return FailedPreconditionError("version log: image written inside a version");
  if (v != committed_) {
    return FailedPreconditionError("version log: image of " + v.ToString() +
                                   ", the last committed version is " + committed_.ToString());
  }
  if (since_image_ == 0) return Status();  // the image is that version already
  if (v.number == image_number_) {
    return FailedPreconditionError("version log: image of v" + std::to_string(v.number) +
                                   " would replace the image the log is replayed onto");
  }
  bool replaced = false;
  const Status written = WriteImageAndLog(dir_, image, size, v, options_.on_step, &replaced);
  if (!replaced) return written;  // the old image and log stand
  // The log in place is the fresh one: every later append goes to it.
  ::close(fd_);
  fd_ = -1;
  StatusOr<int> fd = OpenForAppend(LogPath(dir_));
  if (!fd.ok()) return fd.status().WithContext("the store must be reopened");
  fd_ = *fd;
  ::unlink(ImagePath(dir_, image_number_).c_str());
  size_ = committed_size_ = kHeaderSize;
  image_size_ = size;
  image_number_ = v.number;
  since_image_ = 0;
  ++stats_.images;
  stats_.image_bytes += size + kHeaderSize;
  stats_.fsyncs += 4;
  return written;
}

Status VersionLoggingReceiver::Begin(const uint8_t* header, size_t size) {
  DCR_RETURN_IF_ERROR(inner_->Begin(header, size));
  Status s = log_->BeginVersion(header, size);
  if (!s.ok()) inner_->Abort();
  return s;
}

Status VersionLoggingReceiver::ApplyRecord(const uint8_t* record, size_t size) {
  DCR_RETURN_IF_ERROR(inner_->ApplyRecord(record, size));
  return log_->AppendRecord(record, size);
}

Status VersionLoggingReceiver::Commit(const uint8_t* trailer, size_t size) {
  DCR_RETURN_IF_ERROR(inner_->Commit(trailer, size));
  const VersionId v = inner_->held();
  DCR_RETURN_IF_ERROR(log_->Commit(trailer, size, v));
  if (write_image_ && log_->ImageDue()) {
    DCR_RETURN_IF_ERROR(write_image_(log_, v).WithContext("writing the image of " + v.ToString()));
  }
  return Status();
}

void VersionLoggingReceiver::Abort() {
  inner_->Abort();
  (void)log_->Abandon();
}

Status VersionLoggingReceiver::MarkApplied(uint64_t chunk_id, const Hash128& version_delta) {
  (void)version_delta;
  return FailedPreconditionError("chunk " + std::to_string(chunk_id) +
                                 ": a logged version takes only chunks it applies (the log "
                                 "replays records, it has none of this one)");
}

VersionLogStats VersionLog::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

}  // namespace dcr::internal
