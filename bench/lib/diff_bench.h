// The whole-command benchmark behind `dcr bench diff`: `dcr diff BASE TARGET -o OUT` on one core
// against a `dd if=TARGET of=/dev/null bs=1M` read of the same target, measured in one process.
//
// Data: one BF16 tensor of the synthetic AdamW trainer (as `dcr bench codec`), base and target
// written as .safetensors files into a directory and read once, so both lie in the page cache.
// Every figure below is the best of `reps` repetitions of process CPU time (one thread; pin the
// process to one core with taskset for the wall figures to mean the same); repetitions interleave
// all regions, so the best of each is drawn from the same machine state:
//   dd read       read(2) of the target file in 1 MiB blocks into one reused buffer.
//   diff          what `dcr diff --threads 1` runs: both checkpoints opened, BuildDelta into a
//                 DeltaFileSink, with the entropy statistics of its summary (`-q` without them:
//                 row "diff -q"; `--wan-context`, context-coded chunks: row "diff --wan-context").
//   breakdown     the same work split into parts, each timed alone: the base's content hash
//                 (hash.h, every element's term), the target's content hash (the same cost; a
//                 delta needs only the base's), the target's chunk range hashes (XXH3-128 of its
//                 bytes), the bare difference scan of base against target, the encoder with the
//                 base hash given (scan, range hashes, emission, zstd, into memory), and writing
//                 the delta file.
// Ratios are dd read time / region time: 1 is as fast as reading the target once.
//
// Thread safety: thread-compatible; run one benchmark at a time.
#ifndef DCR_BENCH_LIB_DIFF_BENCH_H_
#define DCR_BENCH_LIB_DIFF_BENCH_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dcr/statusor.h"

namespace dcr::internal {

struct DiffBenchConfig {
  uint64_t elements = uint64_t{1} << 27;  // BF16 elements (256 MiB per checkpoint)
  double rate = 0.03;                     // change rate of the pair
  uint64_t seed = 1;
  int reps = 5;
  std::string dir;  // where the two checkpoints and the delta are written; required
};

struct DiffBenchRow {
  std::string name;
  double cpu_s = 0;   // best process CPU seconds
  double wall_s = 0;  // best wall seconds
  double vs_dd = 0;   // dd read CPU seconds / cpu_s
};

struct DiffBenchReport {
  uint64_t elements = 0;
  uint64_t target_bytes = 0;  // size of the target file
  uint64_t changed = 0;
  uint64_t delta_bytes = 0;
  uint64_t context_delta_bytes = 0;  // the delta of `dcr diff --wan-context`
  int reps = 0;
  double load_average = 0;
  // "dd read" first, then "diff", "diff -q", "diff --wan-context" and the breakdown
  std::vector<DiffBenchRow> rows;
};

// Writes the pair into config.dir, then times every region. `log` receives progress lines.
StatusOr<DiffBenchReport> RunDiffBench(const DiffBenchConfig& config,
                                       const std::function<void(const std::string&)>& log);

// The report as a Markdown table (one row per region, GB/s of target bytes and ratio to dd).
std::string DiffBenchTable(const DiffBenchReport& report);

}  // namespace dcr::internal

#endif  // DCR_BENCH_LIB_DIFF_BENCH_H_
