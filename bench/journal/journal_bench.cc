// The receiver journal's cost: one delta (a synthetic model, a small grid: many chunks) applied
// into host buffers plainly, through a JournaledReceiver that fsyncs every ChunkBegin, and
// through one with group commit (JournalOptions::group_commit, what dcr-node uses), each the best
// of --reps repetitions in this run; prints the journaled times as ratios to the plain apply.
// The journal lives in --dir (default: the current directory; a real disk, not tmpfs, is what
// the fsyncs cost on).
//   build/bench/dcr_bench_journal [--dir DIR] [--reps N] [--scale S]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "dcr/journal.h"
#include "dcr/testing/fault_test_util.h"

namespace dcr {
namespace {

double Seconds(const std::chrono::steady_clock::time_point& t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int Main(int argc, char** argv) {
  std::string dir = ".";
  int reps = 5;
  uint64_t scale = 16;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--dir") dir = argv[i + 1];
    if (a == "--reps") reps = std::atoi(argv[i + 1]);
    if (a == "--scale") scale = std::strtoull(argv[i + 1], nullptr, 10);
  }
  testing::Model m0 = testing::RandomModel(7, scale);
  auto c0 = testing::MakeCheckpoint(m0);
  auto c1 = testing::MakeCheckpoint(testing::NextVersion(m0, 8, 0.03));
  DeltaOptions opts = testing::SmallGrid(0, 1);
  auto delta = DeltaReader::FromBytes(testing::DeltaBytes(c0.get(), *c1, opts));
  if (!delta.ok()) {
    std::fprintf(stderr, "delta: %s\n", delta.status().ToString().c_str());
    return 1;
  }
  const DeltaReader& d = **delta;
  const VersionId v0{0, c0->ContentHash(1)};
  const std::string jp = dir + "/dcr_bench_journal." + std::to_string(getpid());
  // mode 0: plain; 1: every ChunkBegin fsynced; 2: group commit.
  auto run = [&](int mode) -> double {
    testing::Storage s = testing::Storage::Load(*c0);
    BufferReceiver inner(s.Tensors(), v0);
    std::unique_ptr<ReceiverJournal> journal;
    std::unique_ptr<JournaledReceiver> journaled;
    Receiver* rx = &inner;
    if (mode > 0) {
      ::unlink(jp.c_str());
      JournalOptions o;
      o.group_commit = mode == 2;
      auto j = ReceiverJournal::Open(jp, o);
      if (!j.ok() || !(*j)->RecordCommitted(v0).ok()) return -1;
      journal = std::move(*j);
      journaled = std::make_unique<JournaledReceiver>(&inner, journal.get());
      rx = journaled.get();
    }
    const auto t0 = std::chrono::steady_clock::now();
    Status st = ApplyDelta(d, rx);
    const double t = Seconds(t0);
    if (!st.ok()) {
      std::fprintf(stderr, "apply (mode %d): %s\n", mode, st.ToString().c_str());
      return -1;
    }
    return t;
  };
  double best[3] = {1e30, 1e30, 1e30};
  for (int r = 0; r < reps; ++r) {
    for (int mode = 0; mode < 3; ++mode) {
      const double t = run(mode);
      if (t < 0) return 1;
      best[mode] = std::min(best[mode], t);
    }
  }
  ::unlink(jp.c_str());
  std::printf("journal cost: %zu chunks, %.1f MB model, journal in %s, best of %d\n",
              d.num_chunks(), c0->total_tensor_bytes() / 1e6, dir.c_str(), reps);
  std::printf("  plain apply                  %8.4f s   1.00x\n", best[0]);
  std::printf("  journal, fsync every Begin   %8.4f s  %5.2fx\n", best[1], best[1] / best[0]);
  std::printf("  journal, group commit        %8.4f s  %5.2fx\n", best[2], best[2] / best[0]);
  return 0;
}

}  // namespace
}  // namespace dcr

int main(int argc, char** argv) { return dcr::Main(argc, argv); }
