// make_big_pair BASE TARGET --mib N [--change RATE] [--tensor-mib M] [--seed S]
//
// Writes a base and a target safetensors checkpoint of about N MiB each, cheaply: BF16 tensors of
// M MiB (the last one smaller), the base's bits a counter-mode hash of (seed, tensor, element),
// the target equal to the base except for about RATE of the elements (a low-mantissa change, as
// an optimizer step makes). Both are written with pwrite in 8 MiB blocks from one reused buffer
// (no memory in proportion to N), fsynced, and dropped from the page cache
// (POSIX_FADV_DONTNEED) so that a reader starts from disk and its page cache is charged to its
// own memory cgroup. Prints the files, their sizes and the seconds taken.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"

namespace {

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

bool WriteAll(int fd, const uint8_t* p, size_t n, uint64_t off, const char* path) {
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (w < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "make_big_pair: write %s: %s\n", path, std::strerror(errno));
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
    off += static_cast<uint64_t>(w);
  }
  return true;
}

struct Plan {
  std::vector<dcr::TensorView> tensors;
  std::string header;
};

// Fills `out` with the BF16 elements [first, first + count) of tensor `t`: the base's bits, or
// with `target` the target's (each group of four elements draws one 64-bit hash; an element
// changes when its 16-bit slice of a second hash falls below `threshold`).
void Fill(uint64_t seed, uint64_t t, uint64_t first, uint64_t count, bool target,
          uint32_t threshold, uint16_t* out) {
  const uint64_t key = Mix(seed ^ (t << 40));
  for (uint64_t i = 0; i < count; i += 4) {
    const uint64_t g = (first + i) / 4;
    const uint64_t bits = Mix(key + g);
    const uint64_t draw = target ? Mix(~key + g) : 0;
    for (uint64_t j = 0; j < 4 && i + j < count; ++j) {
      uint16_t v = static_cast<uint16_t>(bits >> (16 * j));
      // Keep the exponent in the range of trained weights (|w| ~ 2^-8 .. 2^-1).
      v = static_cast<uint16_t>((v & 0x807F) | ((0x77 + (v >> 7) % 8) << 7));
      if (target && static_cast<uint16_t>(draw >> (16 * j)) < threshold) {
        v = static_cast<uint16_t>(v ^ (1 + ((draw >> (16 * j + 8)) & 3)));
      }
      out[i + j] = v;
    }
  }
}

bool WriteCheckpoint(const char* path, const Plan& plan, uint64_t seed, bool target,
                     uint32_t threshold, std::vector<uint16_t>* buf) {
  int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::fprintf(stderr, "make_big_pair: open %s: %s\n", path, std::strerror(errno));
    return false;
  }
  bool ok = WriteAll(fd, reinterpret_cast<const uint8_t*>(plan.header.data()), plan.header.size(),
                     0, path);
  uint64_t off = plan.header.size();
  for (size_t t = 0; ok && t < plan.tensors.size(); ++t) {
    const uint64_t n = plan.tensors[t].nbytes / 2;
    for (uint64_t e = 0; ok && e < n; e += buf->size()) {
      const uint64_t m = std::min<uint64_t>(buf->size(), n - e);
      Fill(seed, t, e, m, target, threshold, buf->data());
      ok = WriteAll(fd, reinterpret_cast<const uint8_t*>(buf->data()), m * 2, off, path);
      off += m * 2;
    }
  }
  if (ok && ::fsync(fd) != 0) {
    std::fprintf(stderr, "make_big_pair: fsync %s: %s\n", path, std::strerror(errno));
    ok = false;
  }
  if (ok) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  if (!ok) ::unlink(path);
  return ok;
}

int Usage() {
  std::fprintf(stderr,
               "usage: make_big_pair BASE TARGET --mib N [--change RATE] [--tensor-mib M] "
               "[--seed S]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<const char*> files;
  double mib = 0, change = 0.03, tensor_mib = 256;
  uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&](double* v) {
      if (i + 1 >= argc) return false;
      char* end = nullptr;
      *v = std::strtod(argv[++i], &end);
      return *end == '\0';
    };
    double s = 0;
    if (a == "--mib") {
      if (!next(&mib)) return Usage();
    } else if (a == "--change") {
      if (!next(&change)) return Usage();
    } else if (a == "--tensor-mib") {
      if (!next(&tensor_mib)) return Usage();
    } else if (a == "--seed") {
      if (!next(&s)) return Usage();
      seed = static_cast<uint64_t>(s);
    } else if (a.rfind("--", 0) == 0) {
      return Usage();
    } else {
      files.push_back(argv[i]);
    }
  }
  if (files.size() != 2 || mib <= 0 || tensor_mib <= 0 || change < 0 || change > 1) {
    return Usage();
  }
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t total = static_cast<uint64_t>(mib * (1 << 20)) / 2 * 2;
  const uint64_t per = static_cast<uint64_t>(tensor_mib * (1 << 20)) / 4096 * 4096;
  if (per == 0) return Usage();
  Plan plan;
  std::vector<std::string> names;
  for (uint64_t done = 0; done < total; done += per) names.push_back("");
  for (size_t t = 0; t < names.size(); ++t) {
    char name[64];
    std::snprintf(name, sizeof name, "model.layers.%04zu.weight", t);
    const uint64_t bytes = std::min(per, total - t * per);
    dcr::TensorView v;
    v.name = name;
    v.dtype_name = "BF16";
    if (bytes % 4096 == 0) {
      v.shape = {static_cast<int64_t>(bytes / 4096), 2048};
    } else {
      v.shape = {static_cast<int64_t>(bytes / 2)};
    }
    v.nbytes = bytes;
    plan.tensors.push_back(v);
  }
  plan.header = dcr::BuildSafetensorsHeader(plan.tensors, {}, nullptr);
  std::vector<uint16_t> buf(4 << 20);  // 8 MiB
  const uint32_t threshold = static_cast<uint32_t>(change * 65536.0 + 0.5);
  if (!WriteCheckpoint(files[0], plan, seed, false, 0, &buf) ||
      !WriteCheckpoint(files[1], plan, seed, true, threshold, &buf)) {
    return 1;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const uint64_t file_bytes = plan.header.size() + total;
  std::printf("make_big_pair: %s and %s, %llu bytes each (%zu tensors, change rate %.4f), %.2f s\n",
              files[0], files[1], static_cast<unsigned long long>(file_bytes), plan.tensors.size(),
              threshold / 65536.0, secs);
  return 0;
}
