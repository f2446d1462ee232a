#include "diff_bench.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>

#include "codec_bench.h"
#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/hash.h"
#include "dcr/status_macros.h"
#include "dcr/sums.h"
#include "internal/diff_scan.h"
#include "internal/range_hasher.h"
#include "internal/simd.h"

namespace dcr::internal {
namespace {

using Clock = std::chrono::steady_clock;

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Best {
  double cpu = 1e30, wall = 1e30;
};

// Runs `fn` once and keeps its CPU and wall time in `best` when they are the lowest yet.
Status TimeOnce(Best* best, const std::function<Status()>& fn) {
  const Clock::time_point w0 = Clock::now();
  const double c0 = CpuSeconds();
  DCR_RETURN_IF_ERROR(fn());
  best->cpu = std::min(best->cpu, CpuSeconds() - c0);
  best->wall = std::min(best->wall, std::chrono::duration<double>(Clock::now() - w0).count());
  return Status::OK();
}

// read(2) of a whole file in 1 MiB blocks (dd bs=1M of=/dev/null); returns the bytes read.
StatusOr<uint64_t> ReadWhole(const std::string& path, std::vector<uint8_t>* buf) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFoundError("bench diff: cannot open " + path);
  uint64_t total = 0;
  for (;;) {
    const ssize_t r = read(fd, buf->data(), buf->size());
    if (r < 0) {
      close(fd);
      return UnavailableError("bench diff: read failed on " + path);
    }
    if (r == 0) break;
    total += static_cast<uint64_t>(r);
  }
  close(fd);
  return total;
}

DeltaOptions DiffOptions(bool entropy, bool context = false) {
  DeltaOptions o;  // `dcr diff` defaults: 2^22-element chunks, zstd 1, auto values
  o.threads = 1;
  o.collect_entropy = entropy;
  o.context_coding = context;  // --wan-context
  return o;
}

}  // namespace

StatusOr<DiffBenchReport> RunDiffBench(const DiffBenchConfig& config,
                                       const std::function<void(const std::string&)>& log) {
  if (config.dir.empty()) return InvalidArgumentError("bench diff: no directory for the files");
  if (config.reps < 1) return InvalidArgumentError("bench diff: reps must be positive");
  log("training " + std::to_string(config.elements) + " BF16 elements to a " +
      std::to_string(config.rate * 100) + "% step");
  DCR_ASSIGN_OR_RETURN(CodecBenchInput in,
                       MakeCodecBenchInput(config.elements, config.rate, config.seed, 0));
  const std::string base_path = config.dir + "/base.safetensors";
  const std::string target_path = config.dir + "/target.safetensors";
  const std::string delta_path = config.dir + "/delta.dcr";
  const std::string sums_delta_path = config.dir + "/delta-sums.dcr";
  const std::string base_sums_path = config.dir + "/base.sums";
  const std::string target_sums_path = config.dir + "/target.sums";
  auto write = [](const Checkpoint& c, const std::string& path) {
    std::vector<TensorView> views;
    for (const TensorInfo& t : c.tensors())
      views.push_back({t.name, t.dtype_name, t.shape, c.data(t), t.nbytes});
    return WriteSafetensors(path, views);
  };
  DCR_RETURN_IF_ERROR(write(*in.base, base_path));
  DCR_RETURN_IF_ERROR(write(*in.target, target_path));
  DiffBenchReport rep;
  rep.elements = in.elements;
  rep.changed = in.changed;
  rep.reps = config.reps;
  in.base.reset();
  in.target.reset();

  std::vector<uint8_t> buf(uint64_t{1} << 20);
  DCR_ASSIGN_OR_RETURN(rep.target_bytes, ReadWhole(target_path, &buf));  // into the page cache
  DCR_RETURN_IF_ERROR(ReadWhole(base_path, &buf).status());
  const bool avx2 = CpuHasAvx2();
  {  // the base's sums file, as `dcr sums` (or the diff that built it) writes it
    DCR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> b, Checkpoint::Open(base_path));
    DCR_RETURN_IF_ERROR(WriteSums(base_sums_path, ComputeSums(*b, b->ContentHash(0), 0)));
  }

  enum {
    kDd,
    kDiff,
    kDiffQ,
    kDiffContext,
    kDiffSums,
    kBaseHash,
    kCheckSums,
    kTargetSums,
    kTargetHash,
    kRangeHash,
    kScan,
    kEncode,
    kWrite,
    kRows
  };
  const char* names[kRows] = {"dd read",
                              "diff",
                              "diff -q",
                              "diff --wan-context",
                              "diff --base-sums --target-sums",
                              "  content hash of base",
                              "  check base against its sums",
                              "  sums of target",
                              "  content hash of target",
                              "  range hashes of target",
                              "  difference scan",
                              "  encode (base hash given)",
                              "  write delta file"};
  Best best[kRows];
  std::vector<uint8_t> delta;
  uint64_t sink_guard = 0;
  for (int r = 0; r < config.reps; ++r) {
    log("repetition " + std::to_string(r + 1) + " of " + std::to_string(config.reps));
    DCR_RETURN_IF_ERROR(TimeOnce(&best[kDd], [&]() -> Status {
      DCR_ASSIGN_OR_RETURN(uint64_t n, ReadWhole(target_path, &buf));
      sink_guard += n + buf[0];
      return Status::OK();
    }));
    for (int q = 0; q < 3; ++q) {
      const int row = q == 0 ? kDiff : (q == 1 ? kDiffQ : kDiffContext);
      DCR_RETURN_IF_ERROR(TimeOnce(&best[row], [&]() -> Status {
        DCR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> b, Checkpoint::Open(base_path));
        DCR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> t, Checkpoint::Open(target_path));
        DeltaFileSink sink(q == 0 ? delta_path
                                  : config.dir + (q == 1 ? "/delta-q.dcr" : "/delta-context.dcr"));
        DCR_ASSIGN_OR_RETURN(DeltaStats st,
                             BuildDelta(b.get(), *t, DiffOptions(q != 1, q == 2), &sink));
        (q == 2 ? rep.context_delta_bytes : rep.delta_bytes) = st.payload_bytes;
        return Status::OK();
      }));
    }
    // The chained diff: the base's content hash from its checked sums file, the target's written.
    DCR_RETURN_IF_ERROR(TimeOnce(&best[kDiffSums], [&]() -> Status {
      DCR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> b, Checkpoint::Open(base_path));
      DCR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> t, Checkpoint::Open(target_path));
      DCR_ASSIGN_OR_RETURN(CheckpointSums sums, ReadSums(base_sums_path));
      DCR_RETURN_IF_ERROR(CheckSums(*b, sums, 1));
      DeltaOptions o = DiffOptions(true);
      o.known_base_hash = sums.content_hash;
      DeltaFileSink sink(sums_delta_path);
      DCR_ASSIGN_OR_RETURN(DeltaStats st, BuildDelta(b.get(), *t, o, &sink));
      return WriteSums(target_sums_path, ComputeSums(*t, st.target_hash, 1));
    }));
    DCR_ASSIGN_OR_RETURN(std::vector<uint8_t> plain_delta, ReadFile(delta_path));
    DCR_ASSIGN_OR_RETURN(std::vector<uint8_t> sums_delta, ReadFile(sums_delta_path));
    if (plain_delta != sums_delta) {
      return InternalError(
          "bench diff: the delta built from the base's sums differs from the diff's");
    }
    DCR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> b, Checkpoint::Open(base_path));
    DCR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> t, Checkpoint::Open(target_path));
    DCR_RETURN_IF_ERROR(TimeOnce(&best[kCheckSums], [&]() -> Status {
      DCR_ASSIGN_OR_RETURN(CheckpointSums sums, ReadSums(base_sums_path));
      return CheckSums(*b, sums, 1);
    }));
    DCR_RETURN_IF_ERROR(TimeOnce(&best[kTargetSums], [&]() -> Status {
      sink_guard += ComputeSums(*t, Hash128{}, 1).files[0].regions[0].lo;
      return Status::OK();
    }));
    const TensorInfo& bt = b->tensors()[0];
    const TensorInfo& tt = t->tensors()[0];
    Hash128 base_hash;
    DCR_RETURN_IF_ERROR(TimeOnce(&best[kBaseHash], [&]() -> Status {
      DCR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> c, Checkpoint::Open(base_path));
      base_hash = c->ContentHash(1);
      return Status::OK();
    }));
    DCR_RETURN_IF_ERROR(TimeOnce(&best[kTargetHash], [&]() -> Status {
      DCR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> c, Checkpoint::Open(target_path));
      sink_guard += c->ContentHash(1).lo;
      return Status::OK();
    }));
    DCR_RETURN_IF_ERROR(TimeOnce(&best[kRangeHash], [&]() -> Status {
      RangeHasher rh(avx2);
      rh.Update(t->data(tt), tt.nbytes);
      sink_guard += rh.Digest().lo;
      return Status::OK();
    }));
    DCR_RETURN_IF_ERROR(TimeOnce(&best[kScan], [&]() -> Status {
      uint64_t k = 0;
      ForEachDifference(reinterpret_cast<const uint16_t*>(b->data(bt)),
                        reinterpret_cast<const uint16_t*>(t->data(tt)), tt.nbytes / 2, avx2,
                        [&](uint64_t) { ++k; });
      if (k != rep.changed) return InternalError("bench diff: the scan found another change count");
      return Status::OK();
    }));
    DCR_RETURN_IF_ERROR(TimeOnce(&best[kEncode], [&]() -> Status {
      DeltaOptions o = DiffOptions(false);
      o.known_base_hash = base_hash;
      DeltaMemorySink sink;
      DCR_RETURN_IF_ERROR(BuildDelta(b.get(), *t, o, &sink).status());
      delta = sink.Release();
      return Status::OK();
    }));
    DCR_RETURN_IF_ERROR(TimeOnce(&best[kWrite], [&]() -> Status {
      return WriteFileAtomic(delta_path, delta.data(), delta.size());
    }));
  }
  if (sink_guard == 1) log("");  // keeps the timed reads from being optimized away
  double load[1] = {0};
  if (getloadavg(load, 1) == 1) rep.load_average = load[0];
  for (int i = 0; i < kRows; ++i) {
    rep.rows.push_back({names[i], best[i].cpu, best[i].wall, best[kDd].cpu / best[i].cpu});
  }
  return rep;
}

std::string DiffBenchTable(const DiffBenchReport& rep) {
  std::string s;
  char line[384];
  std::snprintf(line, sizeof line,
                "diff bench: %llu BF16 elements (target file %.1f MiB, in page cache), %.2f%% "
                "changed, delta %llu bytes (--wan-context %llu); best of %d, one thread, process "
                "CPU time; load %.2f\n\n",
                static_cast<unsigned long long>(rep.elements), rep.target_bytes / 1048576.0,
                100.0 * rep.changed / std::max<uint64_t>(rep.elements, 1),
                static_cast<unsigned long long>(rep.delta_bytes),
                static_cast<unsigned long long>(rep.context_delta_bytes), rep.reps,
                rep.load_average);
  s += line;
  s += "| region | CPU s | wall s | GB/s of target | dd read / region |\n|---|---|---|---|---|\n";
  for (const DiffBenchRow& r : rep.rows) {
    std::snprintf(line, sizeof line, "| %s | %.3f | %.3f | %.2f | %.3fx |\n", r.name.c_str(),
                  r.cpu_s, r.wall_s, rep.target_bytes / r.cpu_s / 1e9, r.vs_dd);
    s += line;
  }
  return s;
}

}  // namespace dcr::internal
