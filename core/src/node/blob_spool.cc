#include "node/blob_spool.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstring>
#include <map>
#include <new>

namespace dcr::internal {

namespace {

constexpr char kFileMagic[8] = {'D', 'C', 'R', 'S', 'P', 'O', 'O', 'L'};
constexpr uint32_t kRecordMagic = 0x44435352;
constexpr size_t kRecordBytes = 56;
constexpr uint32_t kMaxKeyBytes = 4096;

void Put32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
void Put64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint32_t Get32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t Get64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

std::vector<uint8_t> FileHeader(const std::string& key) {
  std::vector<uint8_t> h(8 + 4 + key.size() + 8);
  std::memcpy(h.data(), kFileMagic, 8);
  Put32(h.data() + 8, static_cast<uint32_t>(key.size()));
  std::memcpy(h.data() + 12, key.data(), key.size());
  Put64(h.data() + 12 + key.size(), XXH3_64bits(h.data(), 12 + key.size()));
  return h;
}

// Reads exactly n bytes at `off`; false on a short read or an error.
bool ReadAt(int fd, uint64_t off, uint8_t* out, uint64_t n) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, out, n, static_cast<off_t>(off));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    out += got;
    off += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
  return true;
}

bool WriteAt(int fd, uint64_t off, const uint8_t* p, uint64_t n) {
  while (n > 0) {
    const ssize_t put = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    p += put;
    off += static_cast<uint64_t>(put);
    n -= static_cast<uint64_t>(put);
  }
  return true;
}

// Reads the records of an open spool of stream `key` back into *restored; returns the offset
// after the last record that verified (0 when the file is not a spool of `key`).
uint64_t ReadBack(int fd, uint64_t file_size, const std::string& key, uint64_t budget,
                  const std::function<uint64_t(BlobKind)>& max_blob_bytes,
                  std::vector<BlobSpool::Restored>* restored) {
  const std::vector<uint8_t> want = FileHeader(key);
  if (file_size < want.size()) return 0;
  std::vector<uint8_t> got(want.size());
  if (!ReadAt(fd, 0, got.data(), got.size()) || got != want) return 0;
  uint64_t off = want.size();
  uint64_t allocated = 0;
  std::map<BlobId, BlobSpool::Restored> blobs;
  std::vector<uint8_t> data;
  while (off + kRecordBytes <= file_size) {
    uint8_t r[kRecordBytes];
    if (!ReadAt(fd, off, r, kRecordBytes)) break;
    if (Get32(r) != kRecordMagic || Get64(r + 48) != XXH3_64bits(r, 48)) break;
    const uint8_t kind_byte = r[4];
    const uint64_t id = Get64(r + 8), size = Get64(r + 16), offset = Get64(r + 24),
                   length = Get64(r + 32), sum = Get64(r + 40);
    if (kind_byte > 2 || offset > size || length > size - offset ||
        length > file_size - off - kRecordBytes) {
      break;
    }
    const BlobKind kind = static_cast<BlobKind>(kind_byte);
    try {
      data.resize(length);
    } catch (const std::bad_alloc&) {
      break;
    }
    if (!ReadAt(fd, off + kRecordBytes, data.data(), length) ||
        XXH3_64bits(data.data(), length) != sum) {
      break;
    }
    off += kRecordBytes + length;
    // A verified record: kept when its blob is within the bounds and agrees with the blob's
    // earlier records (another size or kind is not the same blob: skipped).
    auto it = blobs.find(id);
    if (it == blobs.end()) {
      if (size > max_blob_bytes(kind) || allocated + size > 2 * budget) continue;
      BlobSpool::Restored b;
      b.info = BlobInfo{id, kind, size};
      try {
        b.bytes.resize(size);
      } catch (const std::bad_alloc&) {
        continue;
      }
      allocated += size;
      it = blobs.emplace(id, std::move(b)).first;
    }
    if (it->second.info.size != size || it->second.info.kind != kind) continue;
    if (length > 0) std::memcpy(it->second.bytes.data() + offset, data.data(), length);
    it->second.held.Add(offset, length);
  }
  for (auto& [id, b] : blobs) {
    if (b.held.Prefix() > 0 || b.info.size == 0) restored->push_back(std::move(b));
  }
  return off;
}

}  // namespace

BlobSpool::BlobSpool(std::string path, int fd, uint64_t end, uint64_t budget)
    : path_(std::move(path)), fd_(fd), end_(end), budget_(budget) {}

BlobSpool::~BlobSpool() {
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<std::unique_ptr<BlobSpool>> BlobSpool::Open(
    const std::string& path, const std::string& key, uint64_t budget_bytes, bool fresh,
    const std::function<uint64_t(BlobKind)>& max_blob_bytes, std::vector<Restored>* restored) {
  restored->clear();
  if (budget_bytes == 0) return InvalidArgumentError("blob spool " + path + ": zero budget");
  if (key.size() > kMaxKeyBytes)
    return InvalidArgumentError("blob spool " + path + ": key too long");
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("blob spool " + path + ": open", errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError("blob spool " + path + ": stat", err);
  }
  uint64_t end = 0;
  if (!fresh) {
    end = ReadBack(fd, static_cast<uint64_t>(st.st_size), key, budget_bytes, max_blob_bytes,
                   restored);
  }
  if (end == 0) {
    restored->clear();
    const std::vector<uint8_t> h = FileHeader(key);
    if (::ftruncate(fd, 0) != 0 || !WriteAt(fd, 0, h.data(), h.size())) {
      const int err = errno;
      ::close(fd);
      return ErrnoError("blob spool " + path + ": writing its header", err);
    }
    end = h.size();
  } else if (end < static_cast<uint64_t>(st.st_size) &&
             ::ftruncate(fd, static_cast<off_t>(end)) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError("blob spool " + path + ": cutting its damaged tail", err);
  }
  return std::unique_ptr<BlobSpool>(new BlobSpool(path, fd, end, budget_bytes));
}

void BlobSpool::Append(const BlobInfo& info, uint64_t offset, const uint8_t* data,
                       uint64_t length) {
  if (length == 0) return;
  uint8_t r[kRecordBytes] = {};
  Put32(r, kRecordMagic);
  r[4] = static_cast<uint8_t>(info.kind);
  Put64(r + 8, info.id);
  Put64(r + 16, info.size);
  Put64(r + 24, offset);
  Put64(r + 32, length);
  Put64(r + 40, XXH3_64bits(data, length));
  Put64(r + 48, XXH3_64bits(r, 48));
  std::lock_guard<std::mutex> lock(mu_);
  if (discarded_ || !failed_.ok() || end_ + kRecordBytes + length > budget_) return;
  iovec v[2] = {{r, kRecordBytes}, {const_cast<uint8_t*>(data), length}};
  uint64_t total = kRecordBytes + length;
  ssize_t put;
  do {
    put = ::pwritev(fd_, v, 2, static_cast<off_t>(end_));
  } while (put < 0 && errno == EINTR);
  if (put < 0 || static_cast<uint64_t>(put) != total) {
    // A short write leaves a record that does not verify: a restart's read stops there.
    failed_ = put < 0 ? ErrnoError("blob spool " + path_ + ": write", errno)
                      : ResourceExhaustedError("blob spool " + path_ + ": short write");
    return;
  }
  end_ += total;
}

uint64_t BlobSpool::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return end_;
}

Status BlobSpool::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

void BlobSpool::Discard() {
  std::lock_guard<std::mutex> lock(mu_);
  if (discarded_) return;
  discarded_ = true;
  ::unlink(path_.c_str());
}

}  // namespace dcr::internal
