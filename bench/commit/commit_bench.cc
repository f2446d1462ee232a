// dcr_bench_commit [--mib N] [--reps K] [--threads T] [--json FILE]: what the commitment of a
// version (dcr/commitment.h) costs, per version at 1%, 3% and 5% of the elements changed, in one
// process on one seeded BF16 model of N MiB (default 1024), best of K repetitions (default 2):
//   memcpy     copying the target's tensor bytes (the bandwidth floor of any full pass);
//   additive   the additive content hash of the target (ContentHashOf), the checksum it replaces
//              as proof;
//   trainer    the commitment root and leaves of the target (CommitmentOf), what the sender
//              signs;
//   apply      the delta's records delivered to a BufferReceiver over a copy of the base;
//   receiver   the commitment root of what the receiver holds after apply (the same pass as the
//              trainer's over the receiver's storage), checked equal to the trainer's.
// Also the share of leaves whose digest differs between base and target (the leaves a receiver
// that kept its verified base leaves would have to rehash). Single-threaded CPU time (or T
// threads, wall time); rates are dense tensor bytes per second.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "dcr/commitment.h"
#include "dcr/delta.h"
#include "dcr/hash.h"
#include "dcr/receiver.h"

namespace dcr {
namespace {

double CpuNow() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}
double WallNow() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<TensorView> Views(const std::vector<std::vector<uint8_t>>& bytes) {
  std::vector<TensorView> v;
  for (size_t i = 0; i < bytes.size(); ++i) {
    v.push_back({"t" + std::to_string(1000 + i),
                 "BF16",
                 {static_cast<int64_t>(bytes[i].size() / 2)},
                 bytes[i].data(),
                 bytes[i].size()});
  }
  return v;
}

std::vector<TensorView> CheckpointViews(const Checkpoint& c) {
  std::vector<TensorView> v;
  for (const TensorInfo& t : c.tensors()) {
    v.push_back({t.name, t.dtype_name, t.shape, c.data(t), t.nbytes});
  }
  return v;
}

int Main(int argc, char** argv) {
  uint64_t mib = 1024;
  int reps = 2, threads = 1;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--mib" && i + 1 < argc)
      mib = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--reps" && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (a == "--threads" && i + 1 < argc)
      threads = std::atoi(argv[++i]);
    else if (a == "--json" && i + 1 < argc)
      json_path = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: dcr_bench_commit [--mib N] [--reps K] [--threads T] [--json FILE]\n");
      return 2;
    }
  }
  if (mib == 0 || reps < 1 || threads < 1) return 2;
  const bool cpu = threads == 1;  // one thread: CPU time; more: wall time
  auto now = [&] { return cpu ? CpuNow() : WallNow(); };

  // Seeded BF16 weights in tensors of 2^22 elements.
  std::vector<std::vector<uint8_t>> base_bytes;
  {
    std::mt19937_64 rng(42);
    std::normal_distribution<float> w(0.0f, 0.02f);
    const uint64_t elems = mib << 19;
    for (uint64_t done = 0; done < elems;) {
      const uint64_t n = std::min<uint64_t>(uint64_t{1} << 22, elems - done);
      std::vector<uint8_t> b(n * 2);
      for (uint64_t i = 0; i < n; ++i) {
        float f = w(rng);
        uint32_t u;
        std::memcpy(&u, &f, 4);
        const uint16_t h = static_cast<uint16_t>(u >> 16);
        std::memcpy(&b[2 * i], &h, 2);
      }
      base_bytes.push_back(std::move(b));
      done += n;
    }
  }
  auto base = Checkpoint::FromBytes(SafetensorsImage(Views(base_bytes)));
  if (!base.ok()) return std::fprintf(stderr, "model: %s\n", base.status().ToString().c_str()), 1;
  auto base_commit = CheckpointCommitment(**base, 0);
  if (!base_commit.ok()) return 1;
  const double dense = static_cast<double>((*base)->total_tensor_bytes());
  std::printf("model: %.0f MiB BF16 in %zu tensors, %llu leaves of %llu bytes; %s\n",
              dense / (1 << 20), base_bytes.size(),
              static_cast<unsigned long long>(base_commit->leaves.size()),
              static_cast<unsigned long long>(kCommitmentLeafBytes),
              cpu ? "one thread, CPU time" : "wall time");
  std::printf(
      "| change | memcpy GB/s | additive GB/s | trainer root GB/s | root / memcpy | "
      "root / additive | apply GB/s | receiver root GB/s | receiver root / apply | "
      "leaves changed |\n|---|---|---|---|---|---|---|---|---|---|\n");
  nlohmann::json out = nlohmann::json::array();
  for (double rate : {0.01, 0.03, 0.05}) {
    std::vector<std::vector<uint8_t>> target_bytes = base_bytes;
    std::mt19937_64 rng(7 + static_cast<uint64_t>(rate * 1000));
    const uint64_t threshold = static_cast<uint64_t>(rate * 18446744073709551615.0);
    for (auto& t : target_bytes) {
      for (size_t i = 0; i < t.size() / 2; ++i) {
        if (rng() >= threshold) continue;
        uint16_t h;
        std::memcpy(&h, &t[2 * i], 2);
        h = static_cast<uint16_t>(h + 1 + (rng() % 3));
        std::memcpy(&t[2 * i], &h, 2);
      }
    }
    auto target = Checkpoint::FromBytes(SafetensorsImage(Views(target_bytes)));
    target_bytes.clear();
    target_bytes.shrink_to_fit();
    if (!target.ok()) return 1;
    const std::vector<TensorView> tv = CheckpointViews(**target);
    DeltaOptions o;
    o.threads = threads;
    o.known_base_hash = (*base)->ContentHash(threads);
    DeltaMemorySink mem;
    auto built = BuildDelta(base->get(), **target, o, &mem);
    if (!built.ok())
      return std::fprintf(stderr, "build: %s\n", built.status().ToString().c_str()), 1;
    const std::vector<uint8_t> delta = mem.Release();

    double t_memcpy = 1e30, t_add = 1e30, t_root = 1e30, t_apply = 1e30, t_rx = 1e30;
    Sha256Digest trainer_root{};
    std::vector<Sha256Digest> trainer_leaves;
    std::vector<uint8_t> copy(static_cast<size_t>(dense));
    for (int rep = 0; rep < reps; ++rep) {
      double t0 = now();
      size_t off = 0;
      for (const TensorView& v : tv) {
        std::memcpy(copy.data() + off, v.data, v.nbytes);
        off += v.nbytes;
      }
      t_memcpy = std::min(t_memcpy, now() - t0);
      t0 = now();
      volatile Hash128 h = ContentHashOf(tv, threads);
      (void)h;
      t_add = std::min(t_add, now() - t0);
      t0 = now();
      auto c = CommitmentOf(tv, threads);
      t_root = std::min(t_root, now() - t0);
      if (!c.ok()) return 1;
      trainer_root = c->root;
      trainer_leaves = std::move(c->leaves);
      // Receiver: apply the delta to a copy of the base, then the root of what it holds.
      std::unique_ptr<BufferReceiver> rx = BufferReceiver::Copy(**base);
      auto reader = DeltaReader::FromBytes(delta);
      if (!reader.ok()) return 1;
      t0 = now();
      Status s = ApplyDelta(**reader, rx.get());
      t_apply = std::min(t_apply, now() - t0);
      if (!s.ok()) return std::fprintf(stderr, "apply: %s\n", s.ToString().c_str()), 1;
      std::vector<TensorView> held;
      for (const ReceiverTensor& t : rx->tensors()) {
        held.push_back({t.info.name, t.info.dtype_name, t.info.shape, t.data, t.info.nbytes});
      }
      t0 = now();
      Status checked = CheckCommitment(held, trainer_root, &trainer_leaves, threads);
      t_rx = std::min(t_rx, now() - t0);
      if (!checked.ok())
        return std::fprintf(stderr, "receiver: %s\n", checked.ToString().c_str()), 1;
    }
    uint64_t changed = 0;
    for (size_t i = 0; i < trainer_leaves.size(); ++i) {
      changed += trainer_leaves[i] != base_commit->leaves[i];
    }
    const double gb = dense / 1e9;
    std::printf(
        "| %.0f%% | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %llu of %zu |\n",
        rate * 100, gb / t_memcpy, gb / t_add, gb / t_root, t_root / t_memcpy, t_root / t_add,
        gb / t_apply, gb / t_rx, t_rx / t_apply, static_cast<unsigned long long>(changed),
        trainer_leaves.size());
    std::fflush(stdout);
    out.push_back({{"rate", rate},
                   {"dense_bytes", dense},
                   {"threads", threads},
                   {"memcpy_s", t_memcpy},
                   {"additive_hash_s", t_add},
                   {"trainer_root_s", t_root},
                   {"apply_s", t_apply},
                   {"receiver_root_s", t_rx},
                   {"leaves", trainer_leaves.size()},
                   {"leaves_changed", changed}});
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace dcr

int main(int argc, char** argv) { return dcr::Main(argc, argv); }
