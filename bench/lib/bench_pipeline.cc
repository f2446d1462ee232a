// `dcr bench pipeline --scenario FILE`: the whole sender and receiver paths of a real run, timed on
// the scenario's own checkpoints, written in the simulator's calibration format (sim/README.md).
// Not a subcommand of its own: cmd_bench.cc registers it under `dcr bench`.
#include "bench_pipeline.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/commitment.h"
#include "dcr/delta.h"
#include "dcr/node.h"
#include "dcr/status_macros.h"
#include "dcr/transport.h"
#include "internal/mapped_file.h"
#include "node/node_recovery.h"

namespace dcr::cli {
namespace {

double WallNow() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Process CPU seconds (all threads, user + system).
double CpuNow() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct Timing {
  double wall = 0, cpu = 0;
};

// Median by wall time of `reps` runs of fn (a loaded machine: the median is what a run gets).
template <typename Fn>
StatusOr<Timing> Measure(int reps, Fn fn) {
  std::vector<Timing> t;
  for (int r = 0; r < reps; ++r) {
    double w0 = WallNow(), c0 = CpuNow();
    DCR_RETURN_IF_ERROR(fn());
    t.push_back({WallNow() - w0, CpuNow() - c0});
  }
  std::sort(t.begin(), t.end(), [](const Timing& a, const Timing& b) { return a.wall < b.wall; });
  return t[t.size() / 2];
}

// Cores this machine gives a fully parallel job right now: `threads` threads spin for ~`seconds`
// of wall time; process CPU seconds / wall seconds.
double ProbeAvailableCores(int threads, double seconds) {
  double w0 = WallNow(), c0 = CpuNow();
  std::vector<std::thread> pool;
  std::vector<double> sink(threads, 0);
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      double x = 1.0;
      while (WallNow() - w0 < seconds) {
        for (int i = 0; i < 100000; ++i) x = x * 1.0000001 + 1e-9;
      }
      sink[t] = x;
    });
  }
  for (auto& th : pool) th.join();
  double wall = WallNow() - w0, cpu = CpuNow() - c0;
  return std::min<double>(threads, cpu / std::max(wall, 1e-9) + 0.0 * sink[0]);
}

double ThreadCpuNow() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

class BlobSink : public DeltaSink {
 public:
  Status OnHeader(const std::vector<uint8_t>& b) override {
    header = b;
    return Status();
  }
  Status OnChunk(const ChunkHeader&, const std::vector<uint8_t>& b) override {
    chunks.push_back(b);
    return Status();
  }
  Status OnTrailer(const std::vector<uint8_t>& b) override {
    trailer = b;
    return Status();
  }
  std::vector<uint8_t> header, trailer;
  std::vector<std::vector<uint8_t>> chunks;
};

// Opens a checkpoint the way the real sender holds it before the refit starts
// (SenderBuilder::LoadCheckpoints): mapped with every page resident, so the build takes no page
// faults.
StatusOr<std::unique_ptr<Checkpoint>> OpenResident(const std::string& path) {
  DCR_ASSIGN_OR_RETURN(auto c, Checkpoint::Open(path));
  DCR_RETURN_IF_ERROR(internal::MakeResident(c->file_data(), c->file_size(), path));
  return c;
}

// The median by wall time of some timed runs (REQUIRES: at least one).
Timing MedianByWall(std::vector<Timing> t) {
  std::sort(t.begin(), t.end(), [](const Timing& a, const Timing& b) { return a.wall < b.wall; });
  return t[t.size() / 2];
}

// What one bench run works on: the scenario, where its checkpoints live, the builder's threads.
struct BenchSetup {
  Scenario scenario;
  std::string work_dir;
  int threads = 1;
  int reps = 1;
  int cores = 1;
};

StatusOr<BenchSetup> LoadBenchSetup(const PipelineBenchConfig& cfg) {
  BenchSetup b;
  DCR_ASSIGN_OR_RETURN(b.scenario, LoadScenario(cfg.scenario_path));
  const Scenario& s = b.scenario;
  b.work_dir = s.model.work_dir;
  if (b.work_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    b.work_dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/dcr-run-" + s.name;
  }
  b.cores = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  b.threads = s.delta.threads > 0 ? s.delta.threads : b.cores;
  b.reps = std::max(1, cfg.reps);
  return b;
}

// The JSON's description of the run: what is timed and how, threads, machine load.
nlohmann::json DescribeBench(const BenchSetup& b) {
  nlohmann::json out;
  out["bench"] = "pipeline";
  out["scenario"] = b.scenario.name;
  out["what"] =
      "whole sender and receiver paths of a real run on the scenario's checkpoints: build = "
      "BuildDelta (scan, hash, encode; base hash known and both checkpoints resident in memory, "
      "as the real sender holds them before the header) with the "
      "scenario's delta.threads; decode_apply = the real delta receiver's Begin, ApplyRecord over "
      "every chunk and Commit, one thread; solo_* alone, encode/decode_apply_bytes_per_s (CPU) "
      "from the one-machine mix: the builder and receivers.count receivers at once; memcpy = "
      "the full-checkpoint receiver over FullStreamBlobs slices; commit_* = a durable cpu "
      "receiver (node_recovery.h DurableReceiver, as dcr node with a state directory): the delta "
      "applied into its host-memory storage, each record appended to its version log (wall), "
      "then its Commit (the log's trailer and commit marker, each fsynced, then the journal's "
      "commit record; no image is due in one version; wall), against plain_write_* = write + "
      "fdatasync of as many bytes to a new file in the same directory, same rep; commitment_* = "
      "the commitment of "
      "the target (CheckpointCommitment, one thread), what the sender computes before its first "
      "blob and each receiver of a signed delta over its storage at the commit; verify = a "
      "receiver "
      "holding the target compares it with the target file (VerifyFile), as dcr run's receivers "
      "do after each commit";
  out["timing"] =
      "median of reps by wall time; *_wall_bytes_per_s per thread from wall time, "
      "*_bytes_per_s per core from process CPU time; bytes are dense tensor bytes; "
      "available_cores = CPU s / wall s of one spinning thread per core, "
      "mean of a probe before and after the timings (the cores this machine gives a "
      "parallel job now)";
  out["threads"] = b.threads;
  out["reps"] = b.reps;
  out["cores"] = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  double load = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = 0;
    std::fclose(f);
  }
  out["load_average"] = load;
  return out;
}

// Feeds a built delta through a receiver: Begin, ApplyRecord per chunk, Commit.
Status ReplayDelta(const BlobSink& blobs, Receiver* rx) {
  DCR_RETURN_IF_ERROR(rx->Begin(blobs.header.data(), blobs.header.size()));
  for (const auto& c : blobs.chunks) DCR_RETURN_IF_ERROR(rx->ApplyRecord(c.data(), c.size()));
  return rx->Commit(blobs.trailer.data(), blobs.trailer.size());
}

// The build alone, like the real sender: both checkpoints held resident and the base hashed
// before the header (untimed: the refit clock starts at the header). Leaves the delta in
// `blobs` and the target's dense bytes in `dense`.
StatusOr<Timing> TimeBuild(const BenchSetup& b, const std::vector<std::string>& ckpts,
                           const DeltaOptions& o, BlobSink* blobs, double* dense) {
  std::vector<Timing> builds;
  for (int rep = 0; rep < b.reps; ++rep) {
    DCR_ASSIGN_OR_RETURN(auto base, OpenResident(ckpts[0]));
    DCR_ASSIGN_OR_RETURN(auto target, OpenResident(ckpts[1]));
    *dense = static_cast<double>(target->total_tensor_bytes());
    base->ContentHash(b.threads);
    *blobs = BlobSink();
    double w0 = WallNow(), c0 = CpuNow();
    DCR_RETURN_IF_ERROR(BuildDelta(base.get(), *target, o, blobs).status());
    builds.push_back({WallNow() - w0, CpuNow() - c0});
  }
  return MedianByWall(std::move(builds));
}

// One delta receiver alone. The real receiver loads its base before the stream starts: untimed
// here too.
StatusOr<Timing> TimeApply(const BenchSetup& b, const std::string& base_path,
                           const BlobSink& blobs) {
  std::vector<Timing> applies;
  for (int rep = 0; rep < b.reps; ++rep) {
    DCR_ASSIGN_OR_RETURN(auto rx, BufferReceiver::Load(base_path));
    double w0 = WallNow(), c0 = CpuNow();
    DCR_RETURN_IF_ERROR(ReplayDelta(blobs, rx.get()));
    applies.push_back({WallNow() - w0, CpuNow() - c0});
  }
  return MedianByWall(std::move(applies));
}

// What a durable `cpu` receiver pays to make a version durable, through the shipped code
// (internal::DurableReceiver, as `dcr node` with a state directory): the delta applied into the
// file-backed storage mapping (each chunk's pages handed to writeback at once), then Commit (the
// mapping's msync, then the journal's commit record). `storage_bytes` is the mapping's size (the
// base's files). The reference, in the same run: a plain write of as many bytes to a new file in
// the same directory, then fdatasync.
struct CommitTiming {
  double apply_wall = 0;  // Begin + every ApplyRecord through the durable receiver
  double apply_cpu = 0;   // their CPU seconds (the applying thread: page faults, writeback starts)
  double plain_apply_wall = 0, plain_apply_cpu = 0;  // the same delta into a BufferReceiver
  double plain_commit_wall = 0;                      // its Commit (the target's checks, no storage)
  double commit_wall = 0;  // Commit: the version log's marker fsynced, the journal's record
  double write_wall = 0;   // the reference: write + fdatasync of storage_bytes
  double storage_bytes = 0;
};

// The reference write: `bytes` bytes (copied from `src`, cycled) to `path`, then fdatasync.
StatusOr<double> TimePlainWrite(const std::string& path, const uint8_t* src, uint64_t src_size,
                                uint64_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("bench commit: " + path, errno);
  const double w0 = WallNow();
  uint64_t done = 0;
  while (done < bytes) {
    const uint64_t off = src_size == 0 ? 0 : done % src_size;
    const uint64_t n = std::min<uint64_t>({bytes - done, src_size - off, 8u << 20});
    const ssize_t w = ::write(fd, src + off, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(path.c_str());
      return ErrnoError("bench commit: write " + path, err);
    }
    done += static_cast<uint64_t>(w);
  }
  const int rc = ::fdatasync(fd);
  const int err = errno;
  const double t = WallNow() - w0;
  ::close(fd);
  ::unlink(path.c_str());
  if (rc != 0) return ErrnoError("bench commit: fdatasync " + path, err);
  return t;
}

// Removes the files a durable receiver of rank 1 keeps in `dir` (its journal, target header and
// version log), then `dir`.
void RemoveStateDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// One delta through a fresh durable `cpu` receiver of its base, per rep (its version log is
// created with the base as its first image untimed, as a node's first start does before its
// stream); the median rep by commit time, with the reference write of the same rep.
StatusOr<CommitTiming> TimeDurableCommit(const BenchSetup& b, const std::string& base_path,
                                         const BlobSink& blobs) {
  std::vector<CommitTiming> reps;
  for (int rep = 0; rep < b.reps; ++rep) {
    const std::string dir = b.work_dir + "/bench-commit-" + std::to_string(::getpid());
    RemoveStateDir(dir);
    if (::mkdir(dir.c_str(), 0700) != 0) return ErrnoError("bench commit: mkdir " + dir, errno);
    NodePlan plan;
    plan.rank = 1;
    plan.method = "delta";
    plan.receiver_base_path = base_path;
    plan.state_dir = dir;
    CommitTiming t;
    Status st = [&]() -> Status {
      DCR_ASSIGN_OR_RETURN(auto durable,
                           internal::DurableReceiver::Open(plan, nullptr, 1, nullptr));
      DCR_ASSIGN_OR_RETURN(auto base, Checkpoint::Open(base_path));
      for (const CheckpointFile& f : base->files()) t.storage_bytes += static_cast<double>(f.size);
      {
        // The reference apply of this rep: the same delta into host buffers.
        DCR_ASSIGN_OR_RETURN(auto plain, BufferReceiver::Load(base_path));
        const double p0 = WallNow(), pc0 = ThreadCpuNow();
        DCR_RETURN_IF_ERROR(plain->Begin(blobs.header.data(), blobs.header.size()));
        for (const auto& c : blobs.chunks) {
          DCR_RETURN_IF_ERROR(plain->ApplyRecord(c.data(), c.size()));
        }
        t.plain_apply_wall = WallNow() - p0;
        t.plain_apply_cpu = ThreadCpuNow() - pc0;
        const double p1 = WallNow();
        DCR_RETURN_IF_ERROR(plain->Commit(blobs.trailer.data(), blobs.trailer.size()));
        t.plain_commit_wall = WallNow() - p1;
      }
      Receiver* rx = durable->receiver();
      const double w0 = WallNow(), c0 = ThreadCpuNow();
      DCR_RETURN_IF_ERROR(rx->Begin(blobs.header.data(), blobs.header.size()));
      for (const auto& c : blobs.chunks) DCR_RETURN_IF_ERROR(rx->ApplyRecord(c.data(), c.size()));
      const double w1 = WallNow();
      t.apply_cpu = ThreadCpuNow() - c0;
      DCR_RETURN_IF_ERROR(rx->Commit(blobs.trailer.data(), blobs.trailer.size()));
      t.apply_wall = w1 - w0;
      t.commit_wall = WallNow() - w1;
      const CheckpointFile& f0 = base->files().front();
      DCR_ASSIGN_OR_RETURN(t.write_wall, TimePlainWrite(dir + "/plain-write", f0.data, f0.size,
                                                        static_cast<uint64_t>(t.storage_bytes)));
      return Status();
    }();
    RemoveStateDir(dir);
    DCR_RETURN_IF_ERROR(st);
    reps.push_back(t);
  }
  std::sort(reps.begin(), reps.end(), [](const CommitTiming& x, const CommitTiming& y) {
    return x.commit_wall < y.commit_wall;
  });
  return reps[reps.size() / 2];
}

// The commitment of a version (dcr/commitment.h) over the target, as the sender computes it
// before its first blob and a receiver over what it holds at the commit: CommitmentOf on one
// thread, so process CPU seconds are one core's (the simulator spreads the pass over the cores
// the node has).
StatusOr<Timing> TimeCommitment(const BenchSetup& b, const std::string& target_path) {
  DCR_ASSIGN_OR_RETURN(auto target, OpenResident(target_path));
  return Measure(b.reps, [&]() -> Status { return CheckpointCommitment(*target, 1).status(); });
}

// What `dcr run`'s receivers do after each commit (receivers.verify): compare what they hold
// with the target file (VerifyFile), one thread. The receiver holds the delta applied to its base.
StatusOr<Timing> TimeVerify(const BenchSetup& b, const std::string& base_path,
                            const std::string& target_path, const BlobSink& blobs) {
  DCR_ASSIGN_OR_RETURN(auto rx, BufferReceiver::Load(base_path));
  DCR_RETURN_IF_ERROR(ReplayDelta(blobs, rx.get()));
  return Measure(b.reps, [&]() -> Status { return VerifyFile(*rx, target_path); });
}

// CPU seconds of the one-machine mix: the builder's, and each receiver's (their mean).
struct MixTiming {
  double build_cpu = 0, apply_cpu = 0;
};

// One run of the mix: the builder and `receivers` delta receivers at once.
StatusOr<MixTiming> RunMixOnce(const BenchSetup& b, const std::vector<std::string>& ckpts,
                               const DeltaOptions& o, const BlobSink& blobs, int receivers) {
  std::vector<std::unique_ptr<Receiver>> rxs;
  for (int i = 0; i < receivers; ++i) {
    DCR_ASSIGN_OR_RETURN(auto rx, BufferReceiver::Load(ckpts[0]));
    rxs.push_back(std::move(rx));
  }
  DCR_ASSIGN_OR_RETURN(auto base, OpenResident(ckpts[0]));
  DCR_ASSIGN_OR_RETURN(auto target, OpenResident(ckpts[1]));
  base->ContentHash(b.threads);
  std::vector<double> rx_cpu(receivers, 0);
  std::vector<Status> rx_status(receivers);
  const double c0 = CpuNow();
  std::vector<std::thread> pool;
  for (int i = 0; i < receivers; ++i) {
    pool.emplace_back([&, i] {
      double t0 = ThreadCpuNow();
      rx_status[i] = ReplayDelta(blobs, rxs[i].get());
      rx_cpu[i] = ThreadCpuNow() - t0;
    });
  }
  BlobSink mix_blobs;
  Status bs = BuildDelta(base.get(), *target, o, &mix_blobs).status();
  for (auto& t : pool) t.join();
  const double total = CpuNow() - c0;
  DCR_RETURN_IF_ERROR(bs);
  for (const Status& st : rx_status) DCR_RETURN_IF_ERROR(st);
  MixTiming m;
  for (double c : rx_cpu) m.apply_cpu += c / receivers;
  m.build_cpu = std::max(1e-9, total - m.apply_cpu * receivers);
  return m;
}

// The one-machine mix of a real run: the builder and every receiver at once, so the CPU seconds
// per byte include what they do to each other's caches and memory bandwidth (time sharing of the
// cores is the simulator's business: it shares a CPU among them). The median mix by total CPU.
StatusOr<MixTiming> TimeMix(const BenchSetup& b, const std::vector<std::string>& ckpts,
                            const DeltaOptions& o, const BlobSink& blobs, int receivers) {
  std::vector<MixTiming> mixes;
  for (int rep = 0; rep < b.reps; ++rep) {
    DCR_ASSIGN_OR_RETURN(MixTiming m, RunMixOnce(b, ckpts, o, blobs, receivers));
    mixes.push_back(m);
  }
  std::sort(mixes.begin(), mixes.end(), [&](const MixTiming& x, const MixTiming& y) {
    return x.build_cpu + receivers * x.apply_cpu < y.build_cpu + receivers * y.apply_cpu;
  });
  return mixes[mixes.size() / 2];
}

// The full-checkpoint receiver: the file image rebuilt from the reference stream's slices.
StatusOr<Timing> TimeFullReceiver(const BenchSetup& b, const std::string& target_path) {
  std::vector<std::pair<BlobKind, std::vector<uint8_t>>> full;
  DCR_RETURN_IF_ERROR(FullStreamBlobs(target_path, b.scenario.delta.chunk_elems * 2,
                                      [&](BlobKind k, std::vector<uint8_t> blob) -> Status {
                                        full.emplace_back(k, std::move(blob));
                                        return Status();
                                      }));
  return Measure(b.reps, [&]() -> Status {
    auto rx = MakeFullReceiver();
    for (const auto& [k, blob] : full) {
      if (k == BlobKind::kHeader) {
        DCR_RETURN_IF_ERROR(rx->Begin(blob.data(), blob.size()));
      } else if (k == BlobKind::kChunk) {
        DCR_RETURN_IF_ERROR(rx->ApplyRecord(blob.data(), blob.size()));
      } else {
        DCR_RETURN_IF_ERROR(rx->Commit(blob.data(), blob.size()));
      }
    }
    return Status();
  });
}

// The JSON entry of one change rate.
nlohmann::json RateResult(double rate, double dense, const BlobSink& blobs, const Timing& build,
                          const Timing& apply, int receivers, const MixTiming& mix, int threads,
                          const CommitTiming& commit) {
  nlohmann::json r;
  r["change_rate"] = rate;
  r["dense_bytes"] = dense;
  double payload = static_cast<double>(blobs.header.size() + blobs.trailer.size());
  for (const auto& c : blobs.chunks) payload += static_cast<double>(c.size());
  r["payload_bytes"] = payload;
  r["chunks"] = blobs.chunks.size();
  r["build_wall_s"] = build.wall;
  r["build_cpu_s"] = build.cpu;
  r["apply_wall_s"] = apply.wall;
  r["apply_cpu_s"] = apply.cpu;
  r["mix_receivers"] = receivers;
  r["mix_build_cpu_s"] = mix.build_cpu;
  r["mix_apply_cpu_s"] = mix.apply_cpu;
  r["solo_encode_bytes_per_s"] = dense / std::max(build.cpu, 1e-9);
  r["solo_decode_apply_bytes_per_s"] = dense / std::max(apply.cpu, 1e-9);
  // Per core, from CPU seconds in the one-machine mix (the simulator's shared-CPU model).
  r["encode_bytes_per_s"] = dense / std::max(mix.build_cpu, 1e-9);
  r["encode_wall_bytes_per_s"] = dense / std::max(build.wall, 1e-9) / threads;
  r["decode_apply_bytes_per_s"] = dense / std::max(mix.apply_cpu, 1e-9);
  r["decode_apply_wall_bytes_per_s"] = dense / std::max(apply.wall, 1e-9);
  // The durable receiver's commit (wall seconds: it waits for the disk, not for a core).
  r["commit_storage_bytes"] = commit.storage_bytes;
  r["commit_apply_wall_s"] = commit.apply_wall;
  r["commit_apply_cpu_s"] = commit.apply_cpu;
  r["commit_plain_apply_wall_s"] = commit.plain_apply_wall;
  r["commit_plain_apply_cpu_s"] = commit.plain_apply_cpu;
  r["commit_plain_commit_wall_s"] = commit.plain_commit_wall;
  r["commit_wall_s"] = commit.commit_wall;
  // What durability adds to a plain receiver's apply and commit of the same delta, same rep: the
  // applying thread's CPU (write faults on the mapping, writeback started per chunk) and the
  // commit's wall time (msync + journal record); per byte of storage and of delta.
  const double storage = std::max(commit.storage_bytes, 1.0);
  const double commit_extra = std::max(commit.commit_wall - commit.plain_commit_wall, 1e-9);
  r["commit_s_per_storage_byte"] = commit_extra / storage;
  r["commit_s_per_delta_byte"] = commit_extra / std::max(payload, 1.0);
  r["durable_apply_cpu_s_per_storage_byte"] =
      std::max(0.0, commit.apply_cpu - commit.plain_apply_cpu) / storage;
  r["durable_apply_wall_s_per_storage_byte"] =
      std::max(0.0, commit.apply_wall - commit.plain_apply_wall) / storage;
  r["plain_write_wall_s"] = commit.write_wall;
  r["plain_write_bytes_per_s"] = commit.storage_bytes / std::max(commit.write_wall, 1e-9);
  return r;
}

}  // namespace

StatusOr<std::string> RunPipelineBench(const PipelineBenchConfig& cfg,
                                       const std::function<void(const std::string&)>& log) {
  if (!cfg.prepare_checkpoints) {
    return InvalidArgumentError("bench pipeline: no source of checkpoints (prepare_checkpoints)");
  }
  DCR_ASSIGN_OR_RETURN(const BenchSetup b, LoadBenchSetup(cfg));
  const Scenario& s = b.scenario;
  UseDataPlaneAllocator();  // as the node processes it times
  nlohmann::json out = DescribeBench(b);
  nlohmann::json rates = nlohmann::json::array();
  bool full_timed = false;
  std::vector<double> available;  // probes: cores a fully parallel job gets (CPU s / wall s)
  available.push_back(ProbeAvailableCores(b.cores, 0.3));
  for (double rate : s.change_rates) {
    DCR_ASSIGN_OR_RETURN(auto ckpts, cfg.prepare_checkpoints(s, rate, b.work_dir));
    DeltaOptions o;
    o.chunk_elems = s.delta.chunk_elems;
    o.zstd_level = s.delta.zstd_level;
    o.threads = b.threads;
    BlobSink blobs;
    double dense = 0;
    DCR_ASSIGN_OR_RETURN(const Timing build, TimeBuild(b, ckpts, o, &blobs, &dense));
    DCR_ASSIGN_OR_RETURN(const Timing apply, TimeApply(b, ckpts[0], blobs));
    const int receivers = std::max(1, s.receivers.count);
    DCR_ASSIGN_OR_RETURN(const MixTiming mix, TimeMix(b, ckpts, o, blobs, receivers));
    DCR_ASSIGN_OR_RETURN(const CommitTiming commit, TimeDurableCommit(b, ckpts[0], blobs));
    rates.push_back(
        RateResult(rate, dense, blobs, build, apply, receivers, mix, b.threads, commit));
    if (log) {
      char buf[512];
      std::snprintf(buf, sizeof(buf),
                    "rate %.3g: build %.3f s wall (%d threads, %.3f s CPU), apply %.3f s wall "
                    "(%.3f s CPU) for %.1f MB dense; with %d receivers at once: build %.3f s "
                    "CPU, apply %.3f s CPU each; durable commit %.3f s wall for %.1f MB of "
                    "storage (plain write + fdatasync of as many bytes %.3f s)",
                    rate, build.wall, b.threads, build.cpu, apply.wall, apply.cpu, dense / 1e6,
                    receivers, mix.build_cpu, mix.apply_cpu, commit.commit_wall,
                    commit.storage_bytes / 1e6, commit.write_wall);
      log(buf);
    }
    if (!full_timed) {
      DCR_ASSIGN_OR_RETURN(const Timing t, TimeFullReceiver(b, ckpts[1]));
      out["memcpy_bytes_per_s"] = dense / std::max(t.cpu, 1e-9);
      out["memcpy_wall_bytes_per_s"] = dense / std::max(t.wall, 1e-9);
      DCR_ASSIGN_OR_RETURN(const Timing v, TimeVerify(b, ckpts[0], ckpts[1], blobs));
      out["verify_bytes_per_s"] = dense / std::max(v.cpu, 1e-9);
      DCR_ASSIGN_OR_RETURN(const Timing c, TimeCommitment(b, ckpts[1]));
      out["commitment_bytes_per_s"] = dense / std::max(c.cpu, 1e-9);
      out["commitment_wall_bytes_per_s"] = dense / std::max(c.wall, 1e-9);
      if (log) {
        char buf[160];
        std::snprintf(buf, sizeof(buf),
                      "commitment: %.3f s wall, %.3f s CPU for %.1f MB (one "
                      "thread)",
                      c.wall, c.cpu, dense / 1e6);
        log(buf);
      }
      full_timed = true;
    }
  }
  out["rates"] = rates;
  available.push_back(ProbeAvailableCores(b.cores, 0.3));
  double avail = 0;
  for (double a : available) avail += a / available.size();
  out["available_cores"] = avail;
  return out.dump(2) + "\n";
}

}  // namespace dcr::cli
