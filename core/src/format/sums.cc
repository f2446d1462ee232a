// Sums files (dcr/sums.h, core/FORMAT.md section 4.1).
#include "dcr/sums.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <nlohmann/json.hpp>
#include <set>

#include "dcr/hash.h"
#include "internal/parallel.h"
#include "internal/range_hasher.h"
#include "internal/simd.h"

namespace dcr {
namespace {

// Every region of every file, in file order then region order: the unit of parallel work.
struct RegionRef {
  uint32_t file;
  uint64_t region;
};

std::vector<RegionRef> RegionsOf(const std::vector<uint64_t>& sizes, uint64_t region_bytes) {
  std::vector<RegionRef> out;
  for (size_t f = 0; f < sizes.size(); ++f) {
    const uint64_t n = (sizes[f] + region_bytes - 1) / region_bytes;
    for (uint64_t r = 0; r < n; ++r) out.push_back({static_cast<uint32_t>(f), r});
  }
  return out;
}

Hash128 RegionHash(const CheckpointFile& f, uint64_t region, uint64_t region_bytes) {
  const uint64_t begin = region * region_bytes;
  const uint64_t end = std::min(f.size, begin + region_bytes);
  // XXH3-128 streamed with the AVX2 accumulator where the CPU has it (the same digest).
  internal::RangeHasher h(internal::CpuHasAvx2());
  h.Update(f.data + begin, end - begin);
  return h.Digest();
}

std::string FileLabel(const std::string& name) {
  return name.empty() ? "the checkpoint file" : "file " + name;
}

// A decimal u64 without sign, leading zeros (except "0") or overflow.
bool ParseDecimal(std::string_view s, uint64_t* v) {
  if (s.empty() || s.size() > 20 || (s.size() > 1 && s[0] == '0')) return false;
  uint64_t r = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (r > (UINT64_MAX - d) / 10) return false;
    r = r * 10 + d;
  }
  *v = r;
  return true;
}

// The lines of a text, each without its '\n'; the last must end with one.
class Lines {
 public:
  explicit Lines(std::string_view text) : text_(text) {}
  // The next line, or false at the end (or when the text does not end with '\n').
  bool Next(std::string_view* line) {
    if (pos_ >= text_.size()) return false;
    const size_t nl = text_.find('\n', pos_);
    if (nl == std::string_view::npos) return false;
    *line = text_.substr(pos_, nl - pos_);
    line_start_ = pos_;
    pos_ = nl + 1;
    ++number_;
    return true;
  }
  size_t line_start() const { return line_start_; }
  int number() const { return number_; }
  bool at_end() const { return pos_ == text_.size(); }

 private:
  std::string_view text_;
  size_t pos_ = 0, line_start_ = 0;
  int number_ = 0;
};

// The value after `key ` on a line, or false.
bool After(std::string_view line, std::string_view key, std::string_view* value) {
  if (line.size() <= key.size() || line.substr(0, key.size()) != key || line[key.size()] != ' ') {
    return false;
  }
  *value = line.substr(key.size() + 1);
  return true;
}

}  // namespace

CheckpointSums ComputeSums(const Checkpoint& ckpt, const Hash128& content_hash, int threads,
                           uint64_t region_bytes) {
  CheckpointSums s;
  s.content_hash = content_hash;
  s.region_bytes = region_bytes;
  std::vector<uint64_t> sizes;
  for (const CheckpointFile& f : ckpt.files()) {
    s.files.push_back(
        {f.name, f.size, std::vector<Hash128>((f.size + region_bytes - 1) / region_bytes)});
    sizes.push_back(f.size);
  }
  const std::vector<RegionRef> regions = RegionsOf(sizes, region_bytes);
  internal::ParallelFor(regions.size(), threads, [&](uint64_t i) {
    const RegionRef& r = regions[i];
    s.files[r.file].regions[r.region] = RegionHash(ckpt.files()[r.file], r.region, region_bytes);
    return true;
  });
  return s;
}

Status CheckSums(const Checkpoint& ckpt, const CheckpointSums& sums, int threads) {
  const std::vector<CheckpointFile>& files = ckpt.files();
  // Sums built in memory rather than parsed are held to the rules ParseSums enforces.
  if (sums.region_bytes < kSumsMinRegionBytes || sums.region_bytes > kSumsMaxRegionBytes) {
    return InvalidArgumentError("sums with a region size of " + std::to_string(sums.region_bytes) +
                                " bytes, outside the sizes a sums file may declare");
  }
  if (files.size() != sums.files.size()) {
    return FailedPreconditionError(
        "the checkpoint has " + std::to_string(files.size()) + " files and its sums file lists " +
        std::to_string(sums.files.size()) + ": the sums are another checkpoint's");
  }
  std::vector<uint64_t> sizes;
  for (size_t f = 0; f < files.size(); ++f) {
    const CheckpointSums::File& want = sums.files[f];
    if (files[f].name != want.name) {
      return FailedPreconditionError("the checkpoint's file " + std::to_string(f) + " is \"" +
                                     files[f].name + "\", its sums file names \"" + want.name +
                                     "\": the sums are another checkpoint's");
    }
    if (files[f].size != want.size) {
      return FailedPreconditionError(FileLabel(want.name) + " is " + std::to_string(files[f].size) +
                                     " bytes, its sums file says " + std::to_string(want.size) +
                                     ": the checkpoint changed after its sums were written, or "
                                     "the sums are another checkpoint's");
    }
    if (want.regions.size() != (want.size + sums.region_bytes - 1) / sums.region_bytes) {
      return InvalidArgumentError("sums of " + FileLabel(want.name) + " list " +
                                  std::to_string(want.regions.size()) +
                                  " regions, not one per region of its size");
    }
    sizes.push_back(want.size);
  }
  const std::vector<RegionRef> regions = RegionsOf(sizes, sums.region_bytes);
  // The first differing region in file and region order, whichever worker finds it.
  std::atomic<uint64_t> first_bad{UINT64_MAX};
  internal::ParallelFor(regions.size(), threads, [&](uint64_t i) {
    if (i > first_bad.load(std::memory_order_relaxed)) return true;
    const RegionRef& r = regions[i];
    if (RegionHash(files[r.file], r.region, sums.region_bytes) !=
        sums.files[r.file].regions[r.region]) {
      uint64_t cur = first_bad.load();
      while (i < cur && !first_bad.compare_exchange_weak(cur, i)) {
      }
    }
    return true;
  });
  if (first_bad.load() != UINT64_MAX) {
    const RegionRef& r = regions[first_bad.load()];
    const uint64_t begin = r.region * sums.region_bytes;
    const uint64_t end = std::min(sizes[r.file], begin + sums.region_bytes);
    return FailedPreconditionError("bytes " + std::to_string(begin) + ".." + std::to_string(end) +
                                   " of " + FileLabel(sums.files[r.file].name) +
                                   " differ from its sums file: the checkpoint changed after its "
                                   "sums were written, or the sums are another checkpoint's");
  }
  return Status::OK();
}

std::string FormatSums(const CheckpointSums& sums) {
  std::string s = "dcr-sums 1\ncontent " + sums.content_hash.ToHex() + "\nregion-bytes " +
                  std::to_string(sums.region_bytes) + "\nfiles " +
                  std::to_string(sums.files.size()) + "\n";
  for (const CheckpointSums::File& f : sums.files) {
    s += "file " + std::to_string(f.size) + " " + nlohmann::json(f.name).dump() + "\n";
    for (const Hash128& h : f.regions) s += h.ToHex() + "\n";
  }
  s += "end " + BytesHash128(s.data(), s.size()).ToHex() + "\n";
  return s;
}

StatusOr<CheckpointSums> ParseSums(std::string_view text) {
  Lines lines(text);
  std::string_view line, v;
  auto bad = [&](const std::string& what) {
    return DataLossError("sums file, line " + std::to_string(lines.number()) + ": " + what);
  };
  if (!lines.Next(&line) || line != "dcr-sums 1") {
    return DataLossError("not a dcr sums file (its first line is not \"dcr-sums 1\")");
  }
  CheckpointSums s;
  if (!lines.Next(&line) || !After(line, "content", &v) || !Hash128::FromHex(v, &s.content_hash)) {
    return bad("expected \"content\" and 32 hex digits");
  }
  if (!lines.Next(&line) || !After(line, "region-bytes", &v) || !ParseDecimal(v, &s.region_bytes) ||
      s.region_bytes < kSumsMinRegionBytes || s.region_bytes > kSumsMaxRegionBytes) {
    return bad("expected \"region-bytes\" and a size from " + std::to_string(kSumsMinRegionBytes) +
               " to " + std::to_string(kSumsMaxRegionBytes));
  }
  uint64_t nfiles = 0;
  if (!lines.Next(&line) || !After(line, "files", &v) || !ParseDecimal(v, &nfiles) || nfiles == 0) {
    return bad("expected \"files\" and a positive count");
  }
  std::set<std::string> names;
  // Each file takes at least one line, so the count is checked against the lines there are.
  for (uint64_t f = 0; f < nfiles; ++f) {
    if (!lines.Next(&line) || !After(line, "file", &v)) return bad("expected a \"file\" line");
    const size_t sp = v.find(' ');
    CheckpointSums::File file;
    if (sp == std::string_view::npos || !ParseDecimal(v.substr(0, sp), &file.size)) {
      return bad("expected \"file\", a size and a name");
    }
    nlohmann::json name = nlohmann::json::parse(v.substr(sp + 1), nullptr, false);
    if (name.is_discarded() || !name.is_string()) return bad("the file name is not a JSON string");
    file.name = name.get<std::string>();
    if (!names.insert(file.name).second) return bad("file \"" + file.name + "\" is listed twice");
    if (file.name.empty() && nfiles != 1) return bad("a shard has an empty name");
    const uint64_t nregions = file.size / s.region_bytes + (file.size % s.region_bytes != 0);
    for (uint64_t r = 0; r < nregions; ++r) {
      Hash128 h;
      if (!lines.Next(&line) || !Hash128::FromHex(line, &h)) {
        return bad("expected the hash of region " + std::to_string(r) + " of " +
                   std::to_string(nregions) + " of " + FileLabel(file.name));
      }
      file.regions.push_back(h);
    }
    s.files.push_back(std::move(file));
  }
  if (!lines.Next(&line) || !After(line, "end", &v)) return bad("expected the \"end\" line");
  Hash128 check;
  if (!Hash128::FromHex(v, &check) || check != BytesHash128(text.data(), lines.line_start())) {
    return bad("the end line's hash does not match the file: it is corrupted");
  }
  if (!lines.at_end()) return DataLossError("sums file: bytes after the end line");
  return s;
}

StatusOr<CheckpointSums> ReadSums(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("sums file " + path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return DataLossError("sums file " + path + " is not a regular file");
  }
  if (static_cast<uint64_t>(st.st_size) > kSumsMaxFileBytes) {
    ::close(fd);
    return DataLossError("sums file " + path + " is " + std::to_string(st.st_size) +
                         " bytes, more than any sums file (" + std::to_string(kSumsMaxFileBytes) +
                         ")");
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t r = ::read(fd, text.data() + got, text.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int err = r < 0 ? errno : 0;
      ::close(fd);
      if (err != 0) return ErrnoError("reading sums file " + path, err);
      return DataLossError("sums file " + path + " shrank while it was read");
    }
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  auto s = ParseSums(text);
  if (!s.ok()) return s.status().WithContext(path);
  return s;
}

Status WriteSums(const std::string& path, const CheckpointSums& sums) {
  const std::string text = FormatSums(sums);
  return WriteFileAtomic(path, text.data(), text.size());
}

}  // namespace dcr
