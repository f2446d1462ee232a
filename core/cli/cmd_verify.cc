// dcr verify A B: byte comparison of two checkpoint files, or of two directories of safetensors
// shards (same shard names, each byte-identical), naming the first difference.
// dcr verify --trust PUB DELTA: the signatures and chunk hashes of a signed delta.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "command.h"
#include "dcr/checkpoint.h"
#include "dcr/commitment.h"
#include "dcr/delta.h"
#include "dcr/signing.h"
#include "internal/phase_progress.h"
#include "progress_line.h"

namespace dcr::cli {
namespace {

// Names the tensor holding byte `off` of a safetensors file, if it parses.
std::string Locate(const Checkpoint* ck, uint64_t off) {
  if (ck == nullptr) return "";
  uint64_t ds = ck->data_section_offset();
  if (off < ds) return " (in the safetensors header)";
  for (const auto& t : ck->tensors()) {
    if (off >= ds + t.offset && off < ds + t.offset + t.nbytes) {
      uint64_t e = (off - ds - t.offset) / static_cast<uint64_t>(t.width());
      return " (tensor '" + t.name + "', element " + std::to_string(e) + ")";
    }
  }
  return "";
}

// The progress of one `dcr verify` on stderr: bytes compared of all the files to compare.
class VerifyProgress {
 public:
  VerifyProgress(bool enabled, uint64_t total)
      : line_(ProgressLine::ForStderr(enabled)),
        callback_(line_.Callback()),
        phase_(callback_, "verify", total) {}
  void Add(uint64_t bytes) { phase_.Add(bytes); }
  void Done() { phase_.Finish(); }
  // Clears an unfinished terminal line before a result is printed.
  void Clear() { line_.Finish(); }

 private:
  ProgressLine line_;
  const ProgressCallback callback_;
  internal::PhaseProgress phase_;
};

uint64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// Result of comparing two regular files: 0 identical, 1 different, or an error status.
struct Compared {
  int rc = 0;
  uint64_t bytes = 0;
};

// Compares the regular files `a` and `b` block by block; prints "DIFFER ..." (prefixed by
// `label`) at the first difference. Reports the bytes compared to `progress`.
StatusOr<Compared> CompareFiles(const std::string& a, const std::string& b,
                                const std::string& label, VerifyProgress* progress) {
  auto ca = Checkpoint::Open(a);  // parsed only to name tensors
  FILE* fa = std::fopen(a.c_str(), "rb");
  if (!fa) return ErrnoError("open " + a, errno);
  FILE* fb = std::fopen(b.c_str(), "rb");
  if (!fb) {
    std::fclose(fa);
    return ErrnoError("open " + b, errno);
  }
  std::vector<uint8_t> x(1 << 20), y(1 << 20);
  Compared out;
  out.rc = -1;
  Status err;
  while (out.rc < 0) {
    size_t nx = std::fread(x.data(), 1, x.size(), fa);
    size_t ny = std::fread(y.data(), 1, y.size(), fb);
    if (std::ferror(fa) || std::ferror(fb)) {
      err = ErrnoError("read " + std::string(std::ferror(fa) ? a : b), errno);
      break;
    }
    size_t n = std::min(nx, ny);
    for (size_t i = 0; i < n; ++i) {
      if (x[i] != y[i]) {
        progress->Clear();
        std::printf("DIFFER%s at byte %llu%s: %02x vs %02x\n", label.c_str(),
                    static_cast<unsigned long long>(out.bytes + i),
                    Locate(ca.ok() ? ca->get() : nullptr, out.bytes + i).c_str(), x[i], y[i]);
        out.rc = 1;
        break;
      }
    }
    if (out.rc >= 0) break;
    out.bytes += n;
    progress->Add(n);
    if (nx != ny) {
      progress->Clear();
      std::printf("DIFFER%s in size: one file ends at byte %llu\n", label.c_str(),
                  static_cast<unsigned long long>(out.bytes));
      out.rc = 1;
    } else if (nx == 0) {
      out.rc = 0;
    }
  }
  std::fclose(fa);
  std::fclose(fb);
  if (!err.ok()) return err;
  return out;
}

enum class Kind { kFile, kDirectory };

StatusOr<Kind> KindOf(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoError("stat " + path, errno);
  if (S_ISDIR(st.st_mode)) return Kind::kDirectory;
  if (!S_ISREG(st.st_mode)) return InvalidArgumentError(path + ": not a regular file");
  return Kind::kFile;
}

bool IsShardName(const std::string& n) {
  auto ends = [&](const std::string& s) {
    return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0;
  };
  return ends(".safetensors") || ends(".safetensors.index.json");
}

// The shard files (*.safetensors and *.safetensors.index.json) directly inside `dir`.
StatusOr<std::set<std::string>> ShardNames(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoError("open directory " + dir, errno);
  std::set<std::string> names;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (!IsShardName(n)) continue;
    auto k = KindOf(dir + "/" + n);
    if (k.ok() && *k == Kind::kFile) names.insert(n);
  }
  ::closedir(d);
  return names;
}

int VerifyDirectories(const std::string& a, const std::string& b, bool quiet) {
  auto na = ShardNames(a);
  if (!na.ok()) return ReportStatus("verify", na.status());
  auto nb = ShardNames(b);
  if (!nb.ok()) return ReportStatus("verify", nb.status());
  for (const auto& [dir, names] : {std::pair{a, &*na}, std::pair{b, &*nb}}) {
    if (names->empty()) {
      return ReportStatus(
          "verify", InvalidArgumentError(
                        dir + " is a directory without safetensors shards; nothing to compare"));
    }
  }
  for (const auto& n : *na) {
    if (!nb->count(n)) {
      std::printf("DIFFER: shard %s is in %s but not in %s\n", n.c_str(), a.c_str(), b.c_str());
      return 1;
    }
  }
  for (const auto& n : *nb) {
    if (!na->count(n)) {
      std::printf("DIFFER: shard %s is in %s but not in %s\n", n.c_str(), b.c_str(), a.c_str());
      return 1;
    }
  }
  uint64_t total = 0, to_compare = 0;
  for (const auto& n : *na) to_compare += FileSize(a + "/" + n);
  VerifyProgress progress(!quiet, to_compare);
  for (const auto& n : *na) {
    auto c = CompareFiles(a + "/" + n, b + "/" + n, " in shard " + n, &progress);
    progress.Clear();
    if (!c.ok()) return ReportStatus("verify", c.status());
    if (c->rc != 0) return c->rc;
    total += c->bytes;
  }
  progress.Done();
  std::printf("IDENTICAL: %zu shards, %llu bytes\n", na->size(),
              static_cast<unsigned long long>(total));
  return 0;
}

}  // namespace

DCR_REGISTER_COMMAND(
    "verify",
    "Compare two checkpoint files (or two directories of safetensors shards) byte for byte; exit 1 "
    "and name the first difference",
    [](CLI::App* app) {
      auto a = std::make_shared<std::pair<std::string, std::string>>();
      app->add_option("a", a->first,
                      "First checkpoint file or shard directory (with --trust: the delta)")
          ->required();
      app->add_option("b", a->second, "Second checkpoint file or shard directory");
      auto quiet = std::make_shared<bool>(false);
      app->add_flag("-q,--quiet", *quiet, "No progress on stderr");
      auto trust = std::make_shared<std::string>();
      app->add_option("--trust", *trust,
                      "Check the signatures of delta A instead: every manifest signed by this "
                      "Ed25519 public key (PEM) and every chunk's SHA-256 listed; exit 14 if not. "
                      "With B: also that checkpoint B is the version the delta's signed "
                      "commitment names (exit 14 naming the first wrong range if not)");
      return [a, quiet, trust]() {
        if (!trust->empty()) {
          auto key = TrustKey::Load(*trust);
          if (!key.ok()) return ReportStatus("verify", key.status());
          auto d = DeltaReader::Open(a->first);
          if (!d.ok()) return ReportStatus("verify", d.status());
          SignedCommitment commitment;
          Status s = VerifyDeltaFile(**d, *key, std::nullopt, &commitment);
          if (!s.ok()) return ReportStatus("verify", s.WithContext(a->first));
          std::printf("SIGNED: %s, v%llu -> v%llu, %zu chunks, signed by %s, commitment %s\n",
                      a->first.c_str(),
                      static_cast<unsigned long long>((*d)->header().base_version),
                      static_cast<unsigned long long>((*d)->header().target_version),
                      (*d)->num_chunks(), (*key)->Fingerprint().c_str(),
                      commitment.root ? CommitmentPrefix(*commitment.root).c_str() : "none");
          if (a->second.empty()) return 0;
          if (!commitment.root) {
            return ReportStatus("verify",
                                FailedPreconditionError(a->first +
                                                        " carries no signed commitment to "
                                                        "check " +
                                                        a->second + " against"));
          }
          auto ck = Checkpoint::Open(a->second);
          if (!ck.ok()) return ReportStatus("verify", ck.status());
          std::vector<TensorView> views;
          for (const TensorInfo& t : (*ck)->tensors()) {
            views.push_back(TensorView{t.name, t.dtype_name, t.shape, (*ck)->data(t), t.nbytes});
          }
          Status c = CheckCommitment(views, *commitment.root, &commitment.leaves, 0);
          if (!c.ok()) return ReportStatus("verify", c.WithContext(a->second));
          std::printf("%s: verified (commitment %s)\n", a->second.c_str(),
                      CommitmentPrefix(*commitment.root).c_str());
          return 0;
        }
        if (a->second.empty()) {
          std::fprintf(stderr, "dcr verify: expected A B (or --trust PUB DELTA)\n");
          return 2;
        }
        auto ka = KindOf(a->first);
        if (!ka.ok()) return ReportStatus("verify", ka.status());
        auto kb = KindOf(a->second);
        if (!kb.ok()) return ReportStatus("verify", kb.status());
        if (*ka != *kb) {
          const std::string& dir = *ka == Kind::kDirectory ? a->first : a->second;
          const std::string& file = *ka == Kind::kDirectory ? a->second : a->first;
          return ReportStatus(
              "verify", InvalidArgumentError(
                            dir + " is a directory but " + file +
                            " is a file; give two checkpoint files or two shard directories"));
        }
        if (*ka == Kind::kDirectory) return VerifyDirectories(a->first, a->second, *quiet);
        VerifyProgress progress(!*quiet, FileSize(a->first));
        auto c = CompareFiles(a->first, a->second, "", &progress);
        progress.Clear();
        if (!c.ok()) return ReportStatus("verify", c.status());
        if (c->rc != 0) return c->rc;
        progress.Done();
        std::printf("IDENTICAL: %llu bytes\n", static_cast<unsigned long long>(c->bytes));
        return 0;
      };
    });

}  // namespace dcr::cli
