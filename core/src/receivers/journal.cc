// Receiver journal: append-only, checksummed, fsynced records (format in dcr/journal.h).
#include "dcr/journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "dcr/hash.h"
#include "dcr/status_macros.h"

namespace dcr {
namespace {

constexpr char kJournalMagic[8] = {'D', 'C', 'R', 'J', 'R', 'N', 'L', '\0'};
constexpr uint32_t kJournalVersion = 1;
constexpr size_t kFileHeaderSize = 16;
constexpr size_t kRecordOverhead = 4 + 1 + 8;
constexpr uint32_t kMaxPayload = 1u << 20;

enum RecordType : uint8_t {
  kCommitted = 1,
  kBeginDelta = 2,
  kBeginChunk = 3,
  kEndChunk = 4,
  kFailChunk = 5,
  kAbandon = 6,
};

void PutU8(std::vector<uint8_t>* b, uint8_t v) { b->push_back(v); }
void PutU32(std::vector<uint8_t>* b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b->push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void PutU64(std::vector<uint8_t>* b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b->push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void PutHash(std::vector<uint8_t>* b, const Hash128& h) {
  PutU64(b, h.lo);
  PutU64(b, h.hi);
}

// Bounds-checked little-endian reader over one record payload.
class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool U8(uint8_t* v) {
    if (n_ - pos_ < 1) return false;
    *v = p_[pos_++];
    return true;
  }
  bool U64(uint64_t* v) {
    if (n_ - pos_ < 8) return false;
    uint64_t x = 0;
    for (int i = 0; i < 8; ++i) x |= static_cast<uint64_t>(p_[pos_ + i]) << (8 * i);
    pos_ += 8;
    *v = x;
    return true;
  }
  bool Hash(Hash128* h) { return U64(&h->lo) && U64(&h->hi); }
  bool done() const { return pos_ == n_; }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
};

uint32_t LoadU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}
uint64_t LoadU64(const uint8_t* p) {
  uint64_t x = 0;
  for (int i = 0; i < 8; ++i) x |= static_cast<uint64_t>(p[i]) << (8 * i);
  return x;
}

std::vector<uint8_t> VersionPayload(const VersionId& v) {
  std::vector<uint8_t> b;
  PutU64(&b, v.number);
  PutHash(&b, v.hash);
  return b;
}

std::vector<uint8_t> DeltaPayload(const DeltaRef& d) {
  std::vector<uint8_t> b;
  PutU64(&b, d.base.number);
  PutHash(&b, d.base.hash);
  PutU64(&b, d.target_number);
  PutU64(&b, d.header_digest);
  PutU8(&b, d.full_frame ? 1 : 0);
  return b;
}

std::vector<uint8_t> ChunkPayload(uint64_t id, const JournalChunk& c) {
  std::vector<uint8_t> b;
  PutU64(&b, id);
  PutU8(&b, static_cast<uint8_t>(c.mode));
  PutU8(&b, c.absolute_repair ? 1 : 0);
  PutHash(&b, c.version_delta);
  PutHash(&b, c.target_change_hash);
  PutHash(&b, c.target_range_hash);
  return b;
}

std::vector<uint8_t> IdPayload(uint64_t id) {
  std::vector<uint8_t> b;
  PutU64(&b, id);
  return b;
}

std::string DeltaName(const DeltaRef& d) {
  return (d.full_frame ? std::string("(full frame)") : d.base.ToString()) + " -> v" +
         std::to_string(d.target_number);
}

// Applies one record to the state: the journal's state machine, shared by replay and appends.
// Errors are kDataLoss during replay (a record that cannot follow the previous ones).
Status ApplyRecord(JournalState* st, uint8_t type, const uint8_t* p, size_t n) {
  Reader r(p, n);
  switch (type) {
    case kCommitted: {
      VersionId v;
      if (!r.U64(&v.number) || !r.Hash(&v.hash) || !r.done()) {
        return DataLossError("journal: malformed Committed record");
      }
      st->committed = v;
      st->in_flight.reset();
      st->applied.clear();
      st->doubtful.clear();
      st->failed.clear();
      ++st->commits;
      return Status::OK();
    }
    case kBeginDelta: {
      DeltaRef d;
      uint8_t full = 0;
      if (!r.U64(&d.base.number) || !r.Hash(&d.base.hash) || !r.U64(&d.target_number) ||
          !r.U64(&d.header_digest) || !r.U8(&full) || !r.done() || full > 1) {
        return DataLossError("journal: malformed BeginDelta record");
      }
      d.full_frame = full == 1;
      if (st->in_flight) {
        if (*st->in_flight == d) return Status::OK();
        return DataLossError("journal: BeginDelta " + DeltaName(d) + " while " +
                             DeltaName(*st->in_flight) + " is in flight");
      }
      if (!d.full_frame && (!st->committed || *st->committed != d.base)) {
        return DataLossError("journal: BeginDelta " + DeltaName(d) + " does not start from the " +
                             "committed version " +
                             (st->committed ? st->committed->ToString() : std::string("(none)")));
      }
      st->in_flight = d;
      st->applied.clear();
      st->doubtful.clear();
      st->failed.clear();
      return Status::OK();
    }
    case kBeginChunk: {
      uint64_t id = 0;
      uint8_t mode = 0, repair = 0;
      JournalChunk c;
      if (!r.U64(&id) || !r.U8(&mode) || !r.U8(&repair) || !r.Hash(&c.version_delta) ||
          !r.Hash(&c.target_change_hash) || !r.Hash(&c.target_range_hash) || !r.done() ||
          mode > static_cast<uint8_t>(ValueMode::kAbsolute) || repair > 1) {
        return DataLossError("journal: malformed BeginChunk record");
      }
      if (!st->in_flight) return DataLossError("journal: BeginChunk with no delta in flight");
      c.mode = static_cast<ValueMode>(mode);
      c.absolute_repair = repair == 1;
      c.was_doubtful = st->doubtful.count(id) > 0;
      st->applied.erase(id);
      st->failed.erase(id);
      st->doubtful[id] = c;
      return Status::OK();
    }
    case kEndChunk:
    case kFailChunk: {
      uint64_t id = 0;
      if (!r.U64(&id) || !r.done()) return DataLossError("journal: malformed chunk end record");
      auto it = st->doubtful.find(id);
      if (it == st->doubtful.end()) {
        return DataLossError("journal: end record for chunk " + std::to_string(id) +
                             " that was not begun");
      }
      if (type == kEndChunk) {
        JournalChunk c = it->second;
        c.was_doubtful = false;
        st->doubtful.erase(it);
        st->applied[id] = c;
      } else if (!it->second.was_doubtful) {
        // The attempt wrote nothing and the chunk was clean before it: not applied.
        st->doubtful.erase(it);
        st->failed.insert(id);
      }
      // else: a failed repair of a doubtful chunk leaves it doubtful.
      return Status::OK();
    }
    case kAbandon: {
      if (!r.done()) return DataLossError("journal: malformed Abandon record");
      st->in_flight.reset();
      st->applied.clear();
      st->doubtful.clear();
      st->failed.clear();
      return Status::OK();
    }
    default:
      return DataLossError("journal: unknown record type " + std::to_string(type));
  }
}

// Replays records after the file header. `good` receives the byte size of the valid prefix.
Status ReplayRecords(const uint8_t* data, size_t size, JournalState* st, size_t* good) {
  if (size < kFileHeaderSize) {
    // A header cut short by a crash during creation: an empty journal.
    if (size > 0 && std::memcmp(data, kJournalMagic, std::min(size, sizeof(kJournalMagic))) != 0) {
      return DataLossError("journal: not a dcr journal (bad magic)");
    }
    *good = 0;
    st->torn_bytes = size;
    return Status::OK();
  }
  if (std::memcmp(data, kJournalMagic, sizeof(kJournalMagic)) != 0) {
    return DataLossError("journal: not a dcr journal (bad magic)");
  }
  uint32_t version = LoadU32(data + 8);
  if (version != kJournalVersion) {
    return FailedPreconditionError("journal: unsupported journal version " +
                                   std::to_string(version));
  }
  size_t pos = kFileHeaderSize;
  while (pos < size) {
    if (size - pos < kRecordOverhead) break;
    uint32_t len = LoadU32(data + pos);
    if (len > kMaxPayload || size - pos - kRecordOverhead < len) break;
    uint8_t type = data[pos + 4];
    uint64_t want = LoadU64(data + pos + 5 + len);
    if (XXH3_64bits(data + pos, 5 + len) != want) break;
    DCR_RETURN_IF_ERROR(ApplyRecord(st, type, data + pos + 5, len));
    ++st->records;
    pos += kRecordOverhead + len;
  }
  *good = pos;
  st->torn_bytes = size - pos;
  return Status::OK();
}

std::vector<uint8_t> FileHeaderBytes() {
  std::vector<uint8_t> b(kJournalMagic, kJournalMagic + sizeof(kJournalMagic));
  PutU32(&b, kJournalVersion);
  PutU32(&b, 0);
  return b;
}

void AppendRecord(std::vector<uint8_t>* out, uint8_t type, const std::vector<uint8_t>& payload) {
  size_t start = out->size();
  PutU32(out, static_cast<uint32_t>(payload.size()));
  out->push_back(type);
  out->insert(out->end(), payload.begin(), payload.end());
  PutU64(out, XXH3_64bits(out->data() + start, out->size() - start));
}

Status WriteAll(int fd, const uint8_t* p, size_t n, uint64_t offset) {
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("journal: write", errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return Status::OK();
}

Status SyncDir(const std::string& path) {
  std::string dir = ".";
  size_t slash = path.rfind('/');
  if (slash != std::string::npos) dir = slash == 0 ? "/" : path.substr(0, slash);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return ErrnoError("journal: open directory " + dir, errno);
  int rc = ::fsync(dfd);
  int err = errno;
  ::close(dfd);
  if (rc != 0) return ErrnoError("journal: fsync directory " + dir, err);
  return Status::OK();
}

Status SyncFd(int fd, const std::string& path) {
  while (::fdatasync(fd) != 0) {
    if (errno == EINTR) continue;
    return ErrnoError("journal: fdatasync " + path, errno);
  }
  return Status::OK();
}

}  // namespace

DeltaRef DeltaRefFromHeader(const FileHeader& header) {
  DeltaRef d;
  d.full_frame = (header.flags & kFlagNoBase) != 0;
  if (!d.full_frame) {
    d.base.number = header.base_version;
    d.base.hash = header.base_hash;
  }
  d.target_number = header.target_version;
  std::vector<uint8_t> bytes = SerializeFileHeader(header);
  d.header_digest = XXH3_64bits(bytes.data(), bytes.size());
  return d;
}

StatusOr<JournalState> ReceiverJournal::Replay(const uint8_t* data, size_t size) {
  JournalState st;
  size_t good = 0;
  DCR_RETURN_IF_ERROR(ReplayRecords(data, size, &st, &good));
  return st;
}

StatusOr<std::unique_ptr<ReceiverJournal>> ReceiverJournal::Open(const std::string& path,
                                                                 const JournalOptions& options) {
  std::unique_ptr<ReceiverJournal> j(new ReceiverJournal());
  j->path_ = path;
  j->options_ = options;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("journal: open " + path, errno);
  j->fd_ = fd;
  struct stat sb;
  if (::fstat(fd, &sb) != 0) return ErrnoError("journal: stat " + path, errno);
  std::vector<uint8_t> bytes(static_cast<size_t>(sb.st_size));
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t r = ::pread(fd, bytes.data() + got, bytes.size() - got, static_cast<off_t>(got));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("journal: read " + path, errno);
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  bytes.resize(got);
  size_t good = 0;
  Status s = ReplayRecords(bytes.data(), bytes.size(), &j->state_, &good);
  if (!s.ok()) return s.WithContext(path);
  if (good < kFileHeaderSize) {
    // New (or torn during creation): write the header.
    if (::ftruncate(fd, 0) != 0) return ErrnoError("journal: truncate " + path, errno);
    std::vector<uint8_t> h = FileHeaderBytes();
    DCR_RETURN_IF_ERROR(WriteAll(fd, h.data(), h.size(), 0));
    DCR_RETURN_IF_ERROR(SyncFd(fd, path));
    DCR_RETURN_IF_ERROR(SyncDir(path));
    j->size_ = h.size();
  } else {
    if (good < bytes.size()) {
      if (::ftruncate(fd, static_cast<off_t>(good)) != 0) {
        return ErrnoError("journal: truncate torn tail of " + path, errno);
      }
      DCR_RETURN_IF_ERROR(SyncFd(fd, path));
    }
    j->size_ = good;
  }
  return j;
}

ReceiverJournal::~ReceiverJournal() {
  if (fd_ >= 0) ::close(fd_);
}

JournalState ReceiverJournal::state() const {
  std::lock_guard<std::mutex> l(mu_);
  return state_;
}

JournalChunkState ReceiverJournal::Lookup(uint64_t chunk_id, JournalChunk* out) const {
  std::lock_guard<std::mutex> l(mu_);
  auto a = state_.applied.find(chunk_id);
  if (a != state_.applied.end()) {
    if (out) *out = a->second;
    return JournalChunkState::kApplied;
  }
  auto d = state_.doubtful.find(chunk_id);
  if (d != state_.doubtful.end()) {
    if (out) *out = d->second;
    return JournalChunkState::kDoubtful;
  }
  return JournalChunkState::kNone;
}

std::optional<VersionId> ReceiverJournal::committed() const {
  std::lock_guard<std::mutex> l(mu_);
  return state_.committed;
}

std::optional<DeltaRef> ReceiverJournal::in_flight() const {
  std::lock_guard<std::mutex> l(mu_);
  return state_.in_flight;
}

Status ReceiverJournal::AppendLocked(uint8_t type, const std::vector<uint8_t>& payload, bool sync) {
  // Callers checked the preconditions; the record reaches the live state only after its bytes
  // are written (and synced when asked).
  if (frozen_)
    return AbortedError("journal " + path_ + ": frozen (process killed by fault injection)");
  std::vector<uint8_t> rec;
  AppendRecord(&rec, type, payload);
  Status w = WriteAll(fd_, rec.data(), rec.size(), size_);
  if (w.ok() && sync) {
    w = SyncFd(fd_, path_);
    if (w.ok()) unsynced_ = 0;
  } else if (w.ok()) {
    ++unsynced_;
  }
  if (!w.ok()) {
    // Do not leave a partial record in the middle of the file.
    if (::ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
      return w.WithContext("(and the partial record could not be truncated)");
    }
    return w;
  }
  size_ += rec.size();
  Status s = ApplyRecord(&state_, type, payload.data(), payload.size());
  if (!s.ok()) return InternalError("journal: appended record rejected: " + s.message());
  ++state_.records;
  return Status::OK();
}

Status ReceiverJournal::RecordCommitted(const VersionId& v) {
  std::lock_guard<std::mutex> l(mu_);
  DCR_RETURN_IF_ERROR(AppendLocked(kCommitted, VersionPayload(v), /*sync=*/true));
  if (size_ > options_.compact_bytes) return CompactLocked();
  return Status::OK();
}

Status ReceiverJournal::BeginDelta(const DeltaRef& d) {
  std::lock_guard<std::mutex> l(mu_);
  if (state_.in_flight) {
    if (*state_.in_flight == d) return Status::OK();
    return FailedPreconditionError("journal: delta " + DeltaName(*state_.in_flight) +
                                   " is in flight; cannot begin " + DeltaName(d));
  }
  if (!d.full_frame && (!state_.committed || *state_.committed != d.base)) {
    return FailedPreconditionError(
        "journal: delta base " + d.base.ToString() + " but the receiver holds " +
        (state_.committed ? state_.committed->ToString() : std::string("no version")));
  }
  return AppendLocked(kBeginDelta, DeltaPayload(d), /*sync=*/true);
}

Status ReceiverJournal::BeginChunk(uint64_t chunk_id, const JournalChunk& chunk) {
  std::lock_guard<std::mutex> l(mu_);
  if (!state_.in_flight) return FailedPreconditionError("journal: BeginChunk with no delta");
  const bool sync = !options_.group_commit || unsynced_ + 1 >= options_.group_records;
  return AppendLocked(kBeginChunk, ChunkPayload(chunk_id, chunk), sync);
}

Status ReceiverJournal::EndChunk(uint64_t chunk_id) {
  std::lock_guard<std::mutex> l(mu_);
  if (!state_.doubtful.count(chunk_id)) {
    return FailedPreconditionError("journal: EndChunk for chunk " + std::to_string(chunk_id) +
                                   " not begun");
  }
  return AppendLocked(kEndChunk, IdPayload(chunk_id), options_.sync_end);
}

Status ReceiverJournal::FailChunk(uint64_t chunk_id) {
  std::lock_guard<std::mutex> l(mu_);
  if (!state_.doubtful.count(chunk_id)) {
    return FailedPreconditionError("journal: FailChunk for chunk " + std::to_string(chunk_id) +
                                   " not begun");
  }
  return AppendLocked(kFailChunk, IdPayload(chunk_id), options_.sync_end);
}

Status ReceiverJournal::AbandonDelta() {
  std::lock_guard<std::mutex> l(mu_);
  if (!state_.in_flight) return Status::OK();
  return AppendLocked(kAbandon, {}, /*sync=*/true);
}

Status ReceiverJournal::Compact() {
  std::lock_guard<std::mutex> l(mu_);
  if (frozen_) return AbortedError("journal " + path_ + ": frozen");
  return CompactLocked();
}

void ReceiverJournal::Freeze() {
  std::lock_guard<std::mutex> l(mu_);
  frozen_ = true;
}

Status ReceiverJournal::CompactLocked() {
  std::vector<uint8_t> out = FileHeaderBytes();
  if (state_.committed) AppendRecord(&out, kCommitted, VersionPayload(*state_.committed));
  if (state_.in_flight) {
    AppendRecord(&out, kBeginDelta, DeltaPayload(*state_.in_flight));
    for (const auto& [id, c] : state_.applied) {
      AppendRecord(&out, kBeginChunk, ChunkPayload(id, c));
      AppendRecord(&out, kEndChunk, IdPayload(id));
    }
    for (const auto& [id, c] : state_.doubtful) {
      AppendRecord(&out, kBeginChunk, ChunkPayload(id, c));
    }
  }
  std::string tmp = path_ + ".compact.tmp";
  int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("journal: create " + tmp, errno);
  Status s = WriteAll(fd, out.data(), out.size(), 0);
  if (s.ok()) s = SyncFd(fd, tmp);
  if (s.ok() && ::rename(tmp.c_str(), path_.c_str()) != 0) s = ErrnoError("journal: rename", errno);
  if (!s.ok()) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  }
  DCR_RETURN_IF_ERROR(SyncDir(path_));
  ::close(fd_);
  fd_ = fd;
  size_ = out.size();
  return Status::OK();
}

}  // namespace dcr
