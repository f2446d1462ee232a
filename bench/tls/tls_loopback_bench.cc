// dcr_bench_tls [--mib N] [--reps R] [--json FILE]: one relay-tree edge on 127.0.0.1, the node
// driver's data path (FrameWriter sending 1 MiB pieces in 64 KiB segments, a reader taking each
// frame header and reading the piece straight into a blob buffer), unthrottled, over plain TCP
// and over mutual TLS 1.3 with per-run certificates, in the same process. Reports, best of R
// repetitions of N MiB each: wall throughput, process CPU seconds (sender + receiver threads), and
// bytes per CPU second ("per core"), and the TLS / plain ratios of both. Each end's own CPU
// seconds (the writer's thread, the reader's thread) are recorded too: the JSON's
// tls_cpu_s_per_byte.{send,recv} (TLS minus plain, per byte, per end) is what the simulator
// charges each relay-tree endpoint (sim/README.md, "TLS").
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "transport/net.h"
#include "transport/tls.h"

namespace dcr::internal {
namespace {

double CpuClock(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}
double CpuNow() { return CpuClock(CLOCK_PROCESS_CPUTIME_ID); }
double ThreadCpuNow() { return CpuClock(CLOCK_THREAD_CPUTIME_ID); }

struct Sample {
  double wall_s = 0, cpu_s = 0;
  double send_cpu_s = 0, recv_cpu_s = 0;  // the writer's and the reader's threads
};

// One transfer of `bytes` over a fresh edge; `tls_dir` empty = plain.
StatusOr<Sample> Transfer(const std::string& tls_dir, uint64_t bytes) {
  std::shared_ptr<const TlsContext> parent_ctx, child_ctx;
  if (!tls_dir.empty()) {
    auto p =
        TlsContext::Load(tls_dir + "/ca.crt", tls_dir + "/node-0.crt", tls_dir + "/node-0.key");
    auto c =
        TlsContext::Load(tls_dir + "/ca.crt", tls_dir + "/node-1.crt", tls_dir + "/node-1.key");
    if (!p.ok()) return p.status();
    if (!c.ok()) return c.status();
    parent_ctx = *p;
    child_ctx = *c;
  }
  auto port = FreePort();
  if (!port.ok()) return port.status();
  const std::string address = "127.0.0.1:" + std::to_string(*port);
  auto listen_fd = Listen(address);
  if (!listen_fd.ok()) return listen_fd.status();
  StatusOr<std::vector<Hello>> hellos = UnavailableError("not accepted");
  std::thread acceptor([&] {
    hellos = AcceptHellos(*listen_fd, 1, SteadyNow() + 20, 5, child_ctx.get(),
                          [](const FrameHeader&, const TlsIdentity*) { return true; });
  });
  auto conn = ConnectTo(address, SteadyNow() + 20, parent_ctx.get(), 1, 5);
  FrameHeader hello;
  hello.type = static_cast<uint8_t>(FrameType::kHello);
  hello.blob = 1;
  if (conn.ok()) (void)(*conn)->Write(&hello, sizeof(hello));
  acceptor.join();
  close(*listen_fd);
  if (!conn.ok()) return conn.status();
  if (!hellos.ok()) return hellos.status();
  Conn* down = (*hellos)[0].conn.get();

  constexpr uint64_t kPiece = 1 << 20;
  auto source = std::make_shared<std::vector<uint8_t>>(kPiece);
  for (size_t i = 0; i < source->size(); ++i) (*source)[i] = static_cast<uint8_t>(i * 2654435761u);
  std::vector<uint8_t> blob(bytes);
  Status read_status;
  double recv_cpu = 0;
  const double wall0 = SteadyNow(), cpu0 = CpuNow();
  std::thread reader([&] {
    const double t0 = ThreadCpuNow();
    for (uint64_t got = 0; got < bytes && read_status.ok();) {
      FrameHeader h;
      read_status = down->Read(&h, sizeof(h));
      if (read_status.ok() && (h.offset != got || h.length > bytes - got)) {
        read_status = DataLossError("unexpected frame");
      }
      if (read_status.ok()) read_status = down->Read(blob.data() + h.offset, h.length);
      got += h.length;
    }
    recv_cpu = ThreadCpuNow() - t0;
  });
  {
    FrameWriter writer(conn->get(), nullptr, 0.0);
    for (uint64_t off = 0; off < bytes; off += kPiece) {
      FrameHeader h;
      h.type = static_cast<uint8_t>(FrameType::kPiece);
      h.blob = 1;
      h.blob_size = bytes;
      h.offset = off;
      h.length = std::min(kPiece, bytes - off);
      writer.Send(h, source->data(), source, nullptr);
    }
    writer.Close();
  }
  reader.join();
  Sample s{SteadyNow() - wall0, CpuNow() - cpu0, 0, recv_cpu};
  // FrameWriter encrypts and writes on its own threads: the sending end is the process's CPU
  // minus the reader's thread (this thread only queues pieces; its time counts as sending).
  s.send_cpu_s = std::max(0.0, s.cpu_s - recv_cpu);
  if (!read_status.ok()) return read_status;
  if (std::memcmp(blob.data(), source->data(), std::min<uint64_t>(bytes, kPiece)) != 0) {
    return DataLossError("received bytes differ from the sent ones");
  }
  return s;
}

int Main(int argc, char** argv) {
  uint64_t mib = 512;
  int reps = 3;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--mib" && i + 1 < argc) {
      mib = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else {
      std::fprintf(stderr, "usage: dcr_bench_tls [--mib N] [--reps R] [--json FILE]\n");
      return 2;
    }
  }
  char tmpl[] = "/tmp/dcr_bench_tls_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  const std::string dir = std::string(tmpl) + "/keys";
  auto run_id = NewRunId();
  Status w = run_id.ok() ? WriteRunCredentials(dir, *run_id, {"sender", "receiver"}, 1, false)
                         : run_id.status();
  if (!w.ok()) {
    std::fprintf(stderr, "dcr_bench_tls: %s\n", w.ToString().c_str());
    return 1;
  }
  const uint64_t bytes = mib << 20;
  Sample best[2];
  for (int r = 0; r < reps; ++r) {
    for (int mode = 0; mode < 2; ++mode) {  // interleaved: both see the same machine state
      auto s = Transfer(mode == 1 ? dir : "", bytes);
      if (!s.ok()) {
        std::fprintf(stderr, "dcr_bench_tls: %s\n", s.status().ToString().c_str());
        return 1;
      }
      if (r == 0 || s->wall_s < best[mode].wall_s) best[mode].wall_s = s->wall_s;
      if (r == 0 || s->cpu_s < best[mode].cpu_s) {
        best[mode].cpu_s = s->cpu_s;
        best[mode].send_cpu_s = s->send_cpu_s;
        best[mode].recv_cpu_s = s->recv_cpu_s;
      }
    }
  }
  std::system(("rm -rf " + std::string(tmpl)).c_str());
  nlohmann::json j;
  j["bytes"] = bytes;
  j["reps"] = reps;
  j["cpus"] = sysconf(_SC_NPROCESSORS_ONLN);
  std::printf("one loopback edge, %llu MiB per repetition, best of %d, %ld CPUs\n",
              static_cast<unsigned long long>(mib), reps, sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("| link | GB/s (wall) | CPU s | GB per CPU-s (per core) |\n|---|---|---|---|\n");
  const char* names[2] = {"plain", "tls"};
  for (int m = 0; m < 2; ++m) {
    const double gbps = bytes / best[m].wall_s / 1e9, per_core = bytes / best[m].cpu_s / 1e9;
    std::printf("| %s | %.3f | %.3f | %.3f |\n", names[m], gbps, best[m].cpu_s, per_core);
    j[names[m]] = {{"wall_s", best[m].wall_s},
                   {"cpu_s", best[m].cpu_s},
                   {"GBps", gbps},
                   {"GB_per_cpu_s", per_core},
                   {"send_cpu_s", best[m].send_cpu_s},
                   {"recv_cpu_s", best[m].recv_cpu_s}};
  }
  const double wall_ratio = best[0].wall_s / best[1].wall_s;
  const double core_ratio = best[0].cpu_s / best[1].cpu_s;
  std::printf("tls / plain: throughput %.3f, per core %.3f\n", wall_ratio, core_ratio);
  j["ratio_tls_plain"] = {{"throughput", wall_ratio}, {"per_core", core_ratio}};
  // What TLS adds to each end, per byte (the simulator's calibration).
  const double b = static_cast<double>(bytes);
  const double send_extra = std::max(0.0, best[1].send_cpu_s - best[0].send_cpu_s) / b;
  const double recv_extra = std::max(0.0, best[1].recv_cpu_s - best[0].recv_cpu_s) / b;
  j["tls_cpu_s_per_byte"] = {{"send", send_extra}, {"recv", recv_extra}};
  std::printf("TLS adds per GB: %.3f CPU-s sending, %.3f CPU-s receiving\n", send_extra * 1e9,
              recv_extra * 1e9);
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f == nullptr) return 1;
    std::fputs(j.dump(1).c_str(), f);
    std::fclose(f);
  }
  return 0;
}

}  // namespace
}  // namespace dcr::internal

int main(int argc, char** argv) { return dcr::internal::Main(argc, argv); }
