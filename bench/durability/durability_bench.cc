// Bytes a durable receiver writes to disk per version, against the payload it received: a
// chain of real deltas (a synthetic model, 1/3/5% of the elements changed per version) applied
// through a VersionLoggingReceiver (receivers/version_log.h, default options: an image once the
// log holds 1.25 images' size, at most every 1024 versions) until the log has written its first
// image after the one it started from (one whole cycle), for a "cpu" receiver (storage in host
// memory, the image written from it) and a "host" receiver (DeviceReceiver on the host backend,
// every tensor downloaded into a host buffer for the image). Written bytes are the log's own
// count and, as a check, the process's write_bytes (/proc/self/io). Against them, the whole-model
// commit of a receiver without the log, measured the same way on the chain's first delta:
// "cpu": the delta applied into a file-backed MAP_SHARED storage and msynced (the dirty pages);
// "host": every tensor downloaded into such a mapping and msynced. Restart time: VersionLog::Open
// (image read and checked, the cycle's whole log replayed) just before the cycle's image is
// written, the longest replay of the cycle.
//   build/bench/dcr_bench_durability [--dir DIR] [--scale S] [--rates 0.01,0.03,0.05]
//                                    [--json FILE] [--check MAX]
// DIR (default ".") must be a real disk, not tmpfs. Prints a table; --json writes the numbers.
// --check MAX: exit 1 when a row writes more than MAX times its payload per version (the byte
// counts are deterministic for a given scale and rates: a floor, not a timing). A restart that is
// not bit-exact always exits 1.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "dcr/device.h"
#include "dcr/status_macros.h"
#include "dcr/testing/fault_test_util.h"
#include "internal/process_io.h"
#include "receivers/version_log.h"

namespace dcr {
namespace {

using internal::ImageTensors;
using internal::RecoveredVersion;
using internal::VersionLog;
using internal::VersionLoggingReceiver;

// CPU seconds of the process (every thread).
double CpuNow() {
  timespec ts;
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Die(const std::string& what, const Status& s) {
  std::fprintf(stderr, "dcr_bench_durability: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

// A file-backed MAP_SHARED mapping of `size` bytes in `path`.
struct Mapping {
  int fd = -1;
  uint8_t* data = nullptr;
  size_t size = 0;
  Mapping(const std::string& path, size_t n) : size(n) {
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(n)) != 0) Die(path, ErrnoError("open", errno));
    void* m = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) Die(path, ErrnoError("mmap", errno));
    data = static_cast<uint8_t*>(m);
  }
  void Sync() {
    if (::msync(data, size, MS_SYNC) != 0) Die("msync", ErrnoError("msync", errno));
  }
  ~Mapping() {
    ::munmap(data, size);
    ::close(fd);
  }
};

struct ModeResult {
  std::string device;
  uint64_t versions = 0;
  uint64_t payload_bytes = 0;  // sum of the deltas' sizes
  uint64_t log_bytes = 0;      // VersionLogStats, after Create
  uint64_t image_bytes = 0;
  uint64_t write_bytes = 0;  // /proc/self/io over the chain
  double commit_s = 0;       // wall time of the commits (log fsyncs, the image)
  double restart_load_s = 0;
  double restart_replay_s = 0;
  uint64_t restart_versions = 0;
  uint64_t today_bytes = 0;       // the whole-model commit, per version
  double apply_cpu_s = 0;         // CPU of Begin + records + Commit through the log (all versions)
  double plain_apply_cpu_s = 0;   // "cpu": the first delta applied into host memory, no log
  double mapped_apply_cpu_s = 0;  // "cpu": the same into the file-backed storage (without the log)
  bool bit_exact = false;         // the restart equals the dense image
};

int Main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::string dir = ".";
  uint64_t scale = 64;
  std::vector<double> rates = {0.01, 0.03, 0.05};
  std::string json_path;
  double check = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--dir") dir = argv[i + 1];
    if (a == "--scale") scale = std::strtoull(argv[i + 1], nullptr, 10);
    if (a == "--json") json_path = argv[i + 1];
    if (a == "--check") check = std::atof(argv[i + 1]);
    if (a == "--rates") {
      rates.clear();
      std::stringstream ss(argv[i + 1]);
      std::string r;
      while (std::getline(ss, r, ',')) rates.push_back(std::atof(r.c_str()));
    }
  }
  const std::string work = dir + "/dcr_bench_durability." + std::to_string(::getpid());
  std::filesystem::create_directories(work);
  nlohmann::json out;
  out["bench"] = "durability";
  out["what"] =
      "bytes written to disk per version by a durable receiver through VersionLog (default "
      "options: image once the log holds 1.25x the image's size, image_every_versions 1024) over "
      "one whole cycle (Create's image excluded, the cycle's image included), against the payload "
      "received and the whole-model commit of a receiver without the log; restart = "
      "VersionLog::Open with the cycle's whole log";
  out["scale"] = scale;
  out["results"] = nlohmann::json::array();
  bool over = false;
  std::printf("%-5s %-5s %8s %9s %11s %11s %9s %9s %8s %8s %8s\n", "rate", "dev", "versions",
              "model_MB", "payload/v", "written/v", "ratio", "today/v", "load_s", "replay_s",
              "commit_s");
  for (const double rate : rates) {
    testing::Model m = testing::RandomModel(7, scale);
    auto c0 = testing::MakeCheckpoint(m);
    const std::vector<uint8_t> image0 = testing::SafetensorsBytes(m);
    const uint64_t image_size = image0.size();
    const VersionId v0{0, c0->ContentHash(1)};
    for (const char* device : {"cpu", "host"}) {
      ModeResult r;
      r.device = device;
      const std::string store = work + "/store-" + device;
      std::filesystem::remove_all(store);
      // The chain: versions until the log writes its cycle's image.
      testing::Model cur = m;
      auto prev = testing::MakeCheckpoint(cur);
      std::vector<uint8_t> storage = image0;
      std::unique_ptr<Receiver> rx;
      std::shared_ptr<Device> dev;
      DeviceReceiver* drx = nullptr;
      if (r.device == "cpu") {
        rx = std::make_unique<BufferReceiver>(ImageTensors(*c0, storage.data()), v0);
      } else {
        dev = MakeHostDevice();
        auto d = MakeDeviceReceiver(dev, *c0, 0);
        if (!d.ok()) Die("device receiver", d.status());
        drx = d->get();
        rx = std::move(*d);
      }
      auto log = VersionLog::Create(store, image0.data(), image0.size(), v0);
      if (!log.ok()) Die("create", log.status());
      const internal::VersionLogStats created = (*log)->stats();
      bool cycle_done = false;
      double restart_cpu = 0;  // of the restart measured inside the chain: not the log's cost
      std::vector<uint8_t> expected;  // the dense image of the version the restart must hold
      auto write_image = [&](VersionLog* l, const VersionId& v) -> Status {
        // The restart before the image: the cycle's whole log replayed.
        RecoveredVersion rv;
        const double rc0 = CpuNow();
        auto again = VersionLog::Open(store, *c0, &rv);
        restart_cpu += CpuNow() - rc0;
        if (!again.ok()) return again.status();
        again->reset();
        r.restart_load_s = rv.load_s;
        r.restart_replay_s = rv.replay_s;
        r.restart_versions = rv.versions_replayed;
        r.bit_exact = rv.version == v && rv.bytes == expected;
        cycle_done = true;
        if (drx != nullptr) {
          // The device's storage downloaded into the image's layout.
          std::vector<ReceiverTensor> at = ImageTensors(*c0, storage.data());
          const auto& tensors = drx->tensors();
          for (size_t k = 0; k < tensors.size(); ++k) {
            DCR_RETURN_IF_ERROR(
                drx->device()->Download(at[k].data, tensors[k].data, tensors[k].info.nbytes));
          }
        }
        return l->WriteImage(storage.data(), storage.size(), v);
      };
      VersionLoggingReceiver logging(rx.get(), log->get(), write_image);
      const uint64_t wb0 = internal::ProcessWriteBytes();
      uint64_t outside = 0;
      for (uint64_t k = 1; !cycle_done && k <= 4096; ++k) {
        cur = testing::NextVersion(cur, 1000 * k + static_cast<uint64_t>(rate * 1000), rate);
        auto next = testing::MakeCheckpoint(cur);
        DeltaOptions o;
        o.threads = 2;
        o.base_version = k - 1;
        o.target_version = k;
        auto d = DeltaReader::FromBytes(testing::DeltaBytes(prev.get(), *next, o));
        if (!d.ok()) Die("delta", d.status());
        if (k == 1) {
          // Without the log: the first delta's whole-model commit (its writes are not the
          // log's: left out of write_bytes).
          const uint64_t outside0 = internal::ProcessWriteBytes();
          Mapping map(work + "/today-" + device, image_size);
          std::memcpy(map.data, image0.data(), image_size);
          map.Sync();
          const uint64_t t0 = internal::ProcessWriteBytes();
          if (r.device == "cpu") {
            BufferReceiver mapped(ImageTensors(*c0, map.data), v0);
            const double m0 = CpuNow();
            Status s = ApplyDelta(**d, &mapped);
            r.mapped_apply_cpu_s = CpuNow() - m0;
            if (!s.ok()) Die("mapped apply", s);
            std::vector<uint8_t> mem = image0;
            BufferReceiver plain(ImageTensors(*c0, mem.data()), v0);
            const double p0 = CpuNow();
            s = ApplyDelta(**d, &plain);
            r.plain_apply_cpu_s = CpuNow() - p0;
            if (!s.ok()) Die("plain apply", s);
          } else {
            std::memcpy(map.data, testing::SafetensorsBytes(cur).data(), image_size);
          }
          map.Sync();
          r.today_bytes = internal::ProcessWriteBytes() - t0;
          if (r.today_bytes == 0) r.today_bytes = image_size;  // not reported: the model's size
          ::unlink((work + "/today-" + device).c_str());
          outside += internal::ProcessWriteBytes() - outside0;
        }
        expected = testing::SafetensorsBytes(cur);
        const double a0 = CpuNow();
        Status s = BeginDelta(**d, &logging);
        for (size_t i = 0; s.ok() && i < (*d)->num_chunks(); ++i) {
          s = logging.ApplyRecord((*d)->chunk_data(i), (*d)->chunk_size(i));
        }
        const double c0t = Now();
        if (s.ok()) s = CommitDelta(**d, &logging);
        r.commit_s += Now() - c0t;
        r.apply_cpu_s += CpuNow() - a0;
        if (!s.ok()) Die("apply v" + std::to_string(k), s);
        r.payload_bytes += (*d)->size();
        ++r.versions;
        prev = std::move(next);
      }
      r.write_bytes = internal::ProcessWriteBytes() - wb0 - outside;
      r.apply_cpu_s -= restart_cpu;
      const internal::VersionLogStats st = (*log)->stats();
      r.log_bytes = st.log_bytes - created.log_bytes;
      r.image_bytes = st.image_bytes - created.image_bytes;
      log->reset();
      std::filesystem::remove_all(store);
      const double per_payload = static_cast<double>(r.payload_bytes) / r.versions;
      const double per_written = static_cast<double>(r.log_bytes + r.image_bytes) / r.versions;
      std::printf("%-5.2f %-5s %8llu %9.1f %11.0f %11.0f %8.2fx %9llu %8.3f %8.3f %8.3f%s\n", rate,
                  device, static_cast<unsigned long long>(r.versions), image_size / 1e6,
                  per_payload, per_written, per_written / per_payload,
                  static_cast<unsigned long long>(r.today_bytes), r.restart_load_s,
                  r.restart_replay_s, r.commit_s / r.versions,
                  r.bit_exact ? "" : "  NOT BIT-EXACT");
      nlohmann::json j;
      j["change_rate"] = rate;
      j["device"] = device;
      j["model_bytes"] = image_size;
      j["versions"] = r.versions;
      j["payload_bytes_per_version"] = per_payload;
      j["log_bytes_per_version"] = static_cast<double>(r.log_bytes) / r.versions;
      j["image_bytes"] = r.image_bytes;
      j["written_bytes_per_version"] = per_written;
      j["written_over_payload"] = per_written / per_payload;
      j["process_write_bytes_per_version"] = static_cast<double>(r.write_bytes) / r.versions;
      j["today_bytes_per_version"] = r.today_bytes;
      j["commit_wall_s_per_version"] = r.commit_s / r.versions;
      // CPU of a version's Begin, records and Commit through the log (an image's write
      // included, amortized; the restart measured before it left out), and for "cpu" the first
      // delta's plain apply into host memory and into a file-backed MAP_SHARED storage without the
      // log.
      j["log_apply_cpu_s_per_version"] = r.apply_cpu_s / r.versions;
      if (r.device == "cpu") {
        j["plain_apply_cpu_s"] = r.plain_apply_cpu_s;
        j["mapped_apply_cpu_s"] = r.mapped_apply_cpu_s;
      }
      j["restart_load_s"] = r.restart_load_s;
      j["restart_replay_s"] = r.restart_replay_s;
      j["restart_versions_replayed"] = r.restart_versions;
      j["restart_bit_exact"] = r.bit_exact;
      out["results"].push_back(j);
      if (!r.bit_exact) return 1;
      if (check > 0 && per_written / per_payload > check) {
        std::printf("FAIL: %.2f %s writes %.3fx its payload per version, over the floor %.2fx\n",
                    rate, device, per_written / per_payload, check);
        over = true;
      }
    }
  }
  std::filesystem::remove_all(work);
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << out.dump(2) << "\n";
  }
  return over ? 1 : 0;
}

}  // namespace
}  // namespace dcr

int main(int argc, char** argv) { return dcr::Main(argc, argv); }
