// DirectoryStore (atomic publish by rename), MemoryStore (test fake) and OpenObjectStore.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "dcr/object_store.h"
#include "dcr/status_macros.h"
#include "internal/atomic_file.h"

namespace dcr {

namespace {
constexpr char kTmpPrefix[] = ".dcr-tmp.";

Status MkdirAll(const std::string& dir) {
  if (dir.empty()) return Status();
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    cur = dir.substr(0, pos);
    if (cur.empty()) continue;
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoError("mkdir " + cur, errno);
    }
  }
  return Status();
}

// Objects stay inside the root: no component of `key` under `root` (existing ones; Put creates
// the rest) may be a symlink, or a key would read or write wherever the link points.
Status CheckBeneath(const std::string& root, const std::string& key) {
  std::string path = root;
  size_t start = 0;
  while (start <= key.size()) {
    size_t end = key.find('/', start);
    if (end == std::string::npos) end = key.size();
    path += '/';
    path.append(key, start, end - start);
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) return Status();  // the rest does not exist yet
    if (S_ISLNK(st.st_mode)) {
      return FailedPreconditionError("dir store: " + path + " is a symlink; objects stay inside " +
                                     root);
    }
    start = end + 1;
  }
  return Status();
}
}  // namespace

Status ValidateObjectKey(const std::string& key) {
  if (key.empty()) return InvalidArgumentError("object key is empty");
  if (key.size() > 1024) return InvalidArgumentError("object key longer than 1024 bytes");
  if (key.front() == '/') return InvalidArgumentError("object key '" + key + "' starts with '/'");
  if (key.find('\0') != std::string::npos) {
    return InvalidArgumentError("object key contains a NUL byte");
  }
  size_t start = 0;
  while (start <= key.size()) {
    size_t end = key.find('/', start);
    if (end == std::string::npos) end = key.size();
    std::string part = key.substr(start, end - start);
    if (part.empty() || part == "." || part == ".." ||
        part.compare(0, sizeof(kTmpPrefix) - 1, kTmpPrefix) == 0) {
      return InvalidArgumentError("object key '" + key + "' has an invalid component '" + part +
                                  "'");
    }
    start = end + 1;
  }
  return Status();
}

// ---- DirectoryStore ----

StatusOr<std::unique_ptr<DirectoryStore>> DirectoryStore::Open(const std::string& root) {
  if (root.empty()) return InvalidArgumentError("directory store: empty root path");
  std::string r = root;
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  Status s = MkdirAll(r);
  if (!s.ok()) return UnavailableError("directory store " + r + ": " + s.message());
  return std::unique_ptr<DirectoryStore>(new DirectoryStore(r));
}

Status DirectoryStore::Put(const std::string& key, const void* data, size_t size) {
  DCR_RETURN_IF_ERROR(ValidateObjectKey(key));
  std::string path = root_ + "/" + key;
  size_t slash = path.find_last_of('/');
  std::string dir = path.substr(0, slash);
  DCR_RETURN_IF_ERROR(CheckBeneath(root_, key));
  Status s = MkdirAll(dir);
  if (!s.ok()) return UnavailableError("dir store put " + key + ": " + s.message());
  DCR_RETURN_IF_ERROR(CheckBeneath(root_, key));
  auto file = internal::AtomicFile::Create(path, kTmpPrefix);
  s = file.status();
  if (s.ok()) s = (*file)->Write(data, size);
  if (s.ok()) s = (*file)->Commit();
  if (!s.ok()) return Status(s.code(), "dir store put " + key + ": " + s.message());
  return Status();
}

StatusOr<std::vector<uint8_t>> DirectoryStore::Get(const std::string& key) {
  return GetRange(key, 0, UINT64_MAX);
}

StatusOr<std::vector<uint8_t>> DirectoryStore::GetRange(const std::string& key, uint64_t offset,
                                                        uint64_t length) {
  DCR_RETURN_IF_ERROR(ValidateObjectKey(key));
  DCR_RETURN_IF_ERROR(CheckBeneath(root_, key));
  std::string path = root_ + "/" + key;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT) return NotFoundError("dir store: no object '" + key + "' in " + root_);
    if (errno == ELOOP) {
      return FailedPreconditionError("dir store: " + path + " is a symlink; objects stay inside " +
                                     root_);
    }
    return UnavailableError(ErrnoError("dir store get " + path, errno).message());
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return UnavailableError(ErrnoError("fstat " + path, e).message());
  }
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (offset > size) {
    ::close(fd);
    return InvalidArgumentError("dir store get " + key + ": offset " + std::to_string(offset) +
                                " beyond size " + std::to_string(size));
  }
  uint64_t n = std::min(length, size - offset);
  std::vector<uint8_t> out;
  try {
    out.resize(n);
  } catch (const std::bad_alloc&) {
    ::close(fd);
    return ResourceExhaustedError("dir store get " + key + ": no memory for " + std::to_string(n) +
                                  " bytes");
  }
  uint64_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd, out.data() + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int e = r < 0 ? errno : EIO;
      ::close(fd);
      return UnavailableError(ErrnoError("read " + path, e).message());
    }
    done += static_cast<uint64_t>(r);
  }
  ::close(fd);
  return out;
}

StatusOr<ObjectInfo> DirectoryStore::Head(const std::string& key) {
  DCR_RETURN_IF_ERROR(ValidateObjectKey(key));
  DCR_RETURN_IF_ERROR(CheckBeneath(root_, key));
  struct stat st;
  std::string path = root_ + "/" + key;
  if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return NotFoundError("dir store: no object '" + key + "' in " + root_);
  }
  return ObjectInfo{key, static_cast<uint64_t>(st.st_size)};
}

StatusOr<std::vector<ObjectInfo>> DirectoryStore::List(const std::string& prefix) {
  std::vector<ObjectInfo> out;
  // Start at the deepest directory the prefix names.
  size_t slash = prefix.find_last_of('/');
  std::string start = slash == std::string::npos ? "" : prefix.substr(0, slash);
  std::function<Status(const std::string&)> walk = [&](const std::string& rel) -> Status {
    std::string dir = rel.empty() ? root_ : root_ + "/" + rel;
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) {
      if (errno == ENOENT || errno == ENOTDIR) return Status();
      return UnavailableError(ErrnoError("dir store list " + dir, errno).message());
    }
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name == "." || name == ".." || name.compare(0, sizeof(kTmpPrefix) - 1, kTmpPrefix) == 0) {
        continue;
      }
      std::string key = rel.empty() ? name : rel + "/" + name;
      struct stat st;
      // lstat: a symlink is neither a directory to descend nor an object (objects stay inside
      // the root).
      if (::lstat((root_ + "/" + key).c_str(), &st) != 0) continue;  // raced with a delete
      if (S_ISDIR(st.st_mode)) {
        // Descend only where keys can still match the prefix.
        std::string k = key + "/";
        if (k.compare(0, std::min(k.size(), prefix.size()), prefix, 0,
                      std::min(k.size(), prefix.size())) == 0) {
          Status s = walk(key);
          if (!s.ok()) {
            ::closedir(d);
            return s;
          }
        }
      } else if (S_ISREG(st.st_mode) && key.compare(0, prefix.size(), prefix) == 0) {
        out.push_back(ObjectInfo{key, static_cast<uint64_t>(st.st_size)});
      }
    }
    ::closedir(d);
    return Status();
  };
  DCR_RETURN_IF_ERROR(walk(start));
  std::sort(out.begin(), out.end(),
            [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
  return out;
}

Status DirectoryStore::Delete(const std::string& key) {
  DCR_RETURN_IF_ERROR(ValidateObjectKey(key));
  DCR_RETURN_IF_ERROR(CheckBeneath(root_, key));
  std::string path = root_ + "/" + key;
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return UnavailableError(ErrnoError("dir store delete " + path, errno).message());
  }
  return Status();
}

// ---- MemoryStore ----

Status MemoryStore::Put(const std::string& key, const void* data, size_t size) {
  DCR_RETURN_IF_ERROR(ValidateObjectKey(key));
  const auto* p = static_cast<const uint8_t*>(data);
  std::vector<uint8_t> bytes(p, p + size);
  std::lock_guard<std::mutex> lock(mu_);
  objects_[key] = std::move(bytes);
  return Status();
}

StatusOr<std::vector<uint8_t>> MemoryStore::Get(const std::string& key) {
  return GetRange(key, 0, UINT64_MAX);
}

StatusOr<std::vector<uint8_t>> MemoryStore::GetRange(const std::string& key, uint64_t offset,
                                                     uint64_t length) {
  DCR_RETURN_IF_ERROR(ValidateObjectKey(key));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = objects_.find(key);
  if (it == objects_.end()) return NotFoundError("mem store: no object '" + key + "'");
  const auto& b = it->second;
  if (offset > b.size()) {
    return InvalidArgumentError("mem store get " + key + ": offset beyond size");
  }
  uint64_t n = std::min<uint64_t>(length, b.size() - offset);
  return std::vector<uint8_t>(b.begin() + static_cast<long>(offset),
                              b.begin() + static_cast<long>(offset + n));
}

StatusOr<ObjectInfo> MemoryStore::Head(const std::string& key) {
  DCR_RETURN_IF_ERROR(ValidateObjectKey(key));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = objects_.find(key);
  if (it == objects_.end()) return NotFoundError("mem store: no object '" + key + "'");
  return ObjectInfo{key, it->second.size()};
}

StatusOr<std::vector<ObjectInfo>> MemoryStore::List(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ObjectInfo> out;
  for (auto it = objects_.lower_bound(prefix);
       it != objects_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
    out.push_back(ObjectInfo{it->first, it->second.size()});
  }
  return out;
}

Status MemoryStore::Delete(const std::string& key) {
  DCR_RETURN_IF_ERROR(ValidateObjectKey(key));
  std::lock_guard<std::mutex> lock(mu_);
  objects_.erase(key);
  return Status();
}

// ---- spec strings ----

StatusOr<std::unique_ptr<ObjectStore>> OpenObjectStore(const std::string& spec) {
  if (spec == "mem:" || spec == "mem") return std::unique_ptr<ObjectStore>(new MemoryStore());
  if (spec.compare(0, 4, "dir:") == 0) {
    DCR_ASSIGN_OR_RETURN(auto s, DirectoryStore::Open(spec.substr(4)));
    return std::unique_ptr<ObjectStore>(std::move(s));
  }
  if (spec.compare(0, 5, "s3://") == 0) {
    S3Options o;
    std::string rest = spec.substr(5);
    size_t q = rest.find('?');
    o.bucket = rest.substr(0, q);
    if (q != std::string::npos) {
      std::string query = rest.substr(q + 1);
      size_t pos = 0;
      while (pos <= query.size()) {
        size_t amp = query.find('&', pos);
        if (amp == std::string::npos) amp = query.size();
        std::string kv = query.substr(pos, amp - pos);
        size_t eq = kv.find('=');
        std::string k = kv.substr(0, eq), v = eq == std::string::npos ? "" : kv.substr(eq + 1);
        if (k == "endpoint") {
          o.endpoint = v;
        } else if (k == "region") {
          o.region = v;
        } else if (k == "credentials_file") {
          o.credentials_file = v;
        } else if (k == "create_bucket") {
          o.create_bucket = v == "1" || v == "true";
        } else if (k == "allow_http") {
          o.allow_http = v == "1" || v == "true";
        } else if (k == "ca_file") {
          o.ca_file = v;
        } else if (k == "read_deadline_s") {
          char* end = nullptr;
          const double d = std::strtod(v.c_str(), &end);
          if (v.empty() || end == nullptr || *end != '\0' || !(d > 0) || d > 86400) {
            return InvalidArgumentError("store spec '" + spec + "': read_deadline_s '" + v +
                                        "' is not a number of seconds in (0, 86400]");
          }
          o.read_deadline_s = d;
        } else if (k == "list_deadline_s") {
          char* end = nullptr;
          const double d = std::strtod(v.c_str(), &end);
          if (v.empty() || end == nullptr || *end != '\0' || !(d > 0) || d > 86400) {
            return InvalidArgumentError("store spec '" + spec + "': list_deadline_s '" + v +
                                        "' is not a number of seconds in (0, 86400]");
          }
          o.list_deadline_s = d;
        } else if (k == "max_get_bytes" || k == "max_list_keys") {
          char* end = nullptr;
          const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
          if (v.empty() || end == nullptr || *end != '\0' || n == 0) {
            return InvalidArgumentError("store spec '" + spec + "': " + k + " '" + v +
                                        "' is not a positive integer");
          }
          (k == "max_get_bytes" ? o.max_get_bytes : o.max_list_keys) = n;
        } else if (!k.empty()) {
          return InvalidArgumentError("store spec '" + spec + "': unknown parameter '" + k + "'");
        }
        pos = amp + 1;
      }
    }
    DCR_ASSIGN_OR_RETURN(auto s, S3Store::Open(o));
    return std::unique_ptr<ObjectStore>(std::move(s));
  }
  if (spec.find("://") != std::string::npos || spec.find(':') == 0) {
    return InvalidArgumentError("store spec '" + spec +
                                "': expected dir:PATH, mem: or s3://BUCKET?endpoint=URL");
  }
  DCR_ASSIGN_OR_RETURN(auto s, DirectoryStore::Open(spec));
  return std::unique_ptr<ObjectStore>(std::move(s));
}

}  // namespace dcr
