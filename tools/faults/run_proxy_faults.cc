// The faults block's proxy runs (see run_proxy_faults.h).
#include "run_proxy_faults.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/status_macros.h"
#include "fault_proxy.h"
#include "fault_runs.h"
#include "run_faults.h"
#include "run_real.h"
#include "transport/net.h"
#include "transport/tls.h"

namespace dcr::cli {

const std::vector<std::string>& ProxyRunFaultKinds() {
  static const std::vector<std::string> kinds = [] {
    std::vector<std::string> k;
    for (const std::string& f : FrameFaultKinds()) k.push_back("proxy:" + f);
    k.push_back("store:write_fail");
    return k;
  }();
  return kinds;
}

namespace {

// A window in which the in-region store refuses writes: once its directory holds a first object,
// every directory under it is made read-only -- and immutable (FS_IMMUTABLE_FL) when this process
// is root, whose writes ignore the mode -- for `seconds`, then restored. A real file system
// refusing the store's puts with EACCES / EPERM, as a full or read-only volume would.
class StoreWriteWindow {
 public:
  StoreWriteWindow(std::string root, double seconds)
      : root_(std::move(root)), seconds_(seconds), thread_([this] { Loop(); }) {}
  ~StoreWriteWindow() { Stop(); }

  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // Whether the window opened while the stream was not yet published in the store (no trailer).
  bool opened_unpublished() const { return opened_unpublished_; }
  // Directories the window could make immutable (root) or read-only.
  int locked() const { return locked_; }

 private:
  struct Dir {
    std::string path;
    mode_t mode = 0;
    bool immutable = false;
  };

  void Scan(bool* any_object, bool* trailer, std::vector<std::string>* dirs) {
    std::error_code ec;
    dirs->push_back(root_);
    for (auto it = std::filesystem::recursive_directory_iterator(root_, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      if (it->is_directory(ec)) {
        dirs->push_back(it->path().string());
      } else {
        const std::string name = it->path().filename().string();
        if (name.find(".tmp") != std::string::npos || name[0] == '.') continue;
        *any_object = true;
        if (name.size() > 8 && name.rfind(".trailer") == name.size() - 8) *trailer = true;
      }
    }
  }

  static bool SetImmutable(const std::string& dir, bool on) {
    int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return false;
    int flags = 0;
    bool ok = ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0;
    if (ok) {
      flags = on ? (flags | FS_IMMUTABLE_FL) : (flags & ~FS_IMMUTABLE_FL);
      ok = ioctl(fd, FS_IOC_SETFLAGS, &flags) == 0;
    }
    close(fd);
    return ok;
  }

  void Loop() {
    std::vector<std::string> paths;
    bool any = false, trailer = false;
    while (!stop_) {
      paths.clear();
      any = trailer = false;
      Scan(&any, &trailer, &paths);
      if (any) break;
      usleep(2000);
    }
    if (stop_) return;
    opened_unpublished_ = !trailer;
    std::vector<Dir> dirs;
    for (const std::string& p : paths) {
      struct stat st;
      if (stat(p.c_str(), &st) != 0) continue;
      Dir d{p, st.st_mode & 07777, false};
      chmod(p.c_str(), d.mode & ~0222);
      if (geteuid() == 0) d.immutable = SetImmutable(p, true);
      if (d.immutable || geteuid() != 0) ++locked_;
      dirs.push_back(d);
    }
    const double until = internal::SteadyNow() + seconds_;
    while (!stop_ && internal::SteadyNow() < until) usleep(5000);
    for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
      if (it->immutable) SetImmutable(it->path, false);
      chmod(it->path.c_str(), it->mode);
    }
  }

  const std::string root_;
  const double seconds_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> opened_unpublished_{false};
  std::atomic<int> locked_{0};
  std::thread thread_;
};

// One started fault proxy.
struct ProxyProcess {
  pid_t pid = -1;
  FaultProxySpec spec;
};

// The planned faults of one proxy run.
struct RunPlan {
  std::map<std::pair<int, int>, std::vector<ProxyFault>> edges;  // (parent, child) -> faults
  bool store_fail = false;
};

}  // namespace

Status RunScenarioProxyFaults(const Scenario& s, double rate, const std::vector<std::string>& ckpts,
                              const std::string& work_dir, int* run_index, ScenarioResult* out) {
  if (ckpts.size() < 2) return InvalidArgumentError("faults: needs a base and a target checkpoint");
  if (s.network.tls.enabled && !s.network.tls.ca.empty()) {
    return InvalidArgumentError(
        "faults.proxy_runs: the fault proxy's certificates are minted from the run's CA key, "
        "which `dcr run` has only for the CA it generates: leave network.tls.ca unset");
  }
  DCR_ASSIGN_OR_RETURN(uint64_t chunks, CountScenarioDeltaChunks(s, ckpts[0], ckpts[1]));
  if (chunks < 2) return FailedPreconditionError("faults.proxy_runs: the delta has too few chunks");
  DCR_ASSIGN_OR_RETURN(double measured, MeasureChangeRate(ckpts[0], ckpts[1]));
  std::vector<std::string> kinds = s.faults.proxy_kinds;
  if (kinds.empty()) {
    kinds = FrameFaultKinds();
    kinds.push_back("store_write_fail");
  }
  FaultSummary& sum = out->faults;
  sum.enabled = true;
  const auto t0 = std::chrono::steady_clock::now();
  size_t next_kind = 0;
  for (int run = 0; run < s.faults.proxy_runs; ++run) {
    std::mt19937_64 rng(s.faults.seed * 7919 + 104729 * static_cast<uint64_t>(run) + 17);
    auto pick = [&](uint64_t n) { return n == 0 ? uint64_t{0} : rng() % n; };
    std::vector<std::string> run_kinds;
    for (int k = 0; k < s.faults.proxy_faults; ++k)
      run_kinds.push_back(kinds[next_kind++ % kinds.size()]);
    ++*run_index;
    const std::string run_dir = work_dir + "/run-" + std::to_string(*run_index);
    RunPlan plan;
    std::vector<ProxyProcess> proxies;
    std::unique_ptr<StoreWriteWindow> window;
    Status setup;
    RefitFaults f;
    f.set_points = [&](std::vector<NodePlan>* plans) {
      const std::vector<int>& parents = (*plans)[0].parents;
      std::vector<std::pair<int, int>> all, long_edges;
      for (int c = 1; c < static_cast<int>(parents.size()); ++c) {
        all.emplace_back(parents[c], c);
        if (parents[c] == 0) long_edges.emplace_back(0, c);
      }
      for (const std::string& k : run_kinds) {
        if (k == "store_write_fail") {
          plan.store_fail = true;
          continue;
        }
        // One fault per edge where the tree has enough of them: a fault that moves the edge's
        // subtree to the store would keep a later one on the same edge from happening.
        std::vector<std::pair<int, int>> from;
        for (const auto& e : k == "partition" ? long_edges : all) {
          if (plan.edges.count(e) == 0) from.push_back(e);
        }
        if (from.empty()) from = k == "partition" ? long_edges : all;
        if (from.empty()) continue;
        const auto edge = from[pick(from.size())];
        ProxyFault pf;
        pf.kind = k;
        // Early enough that the stream is still flowing through the edge.
        pf.at_piece = 1 + pick(std::max<uint64_t>(1, chunks / 2));
        pf.seconds = k == "partition" ? s.faults.partition_s : k == "delay" ? s.faults.delay_s : 0;
        auto& list = plan.edges[edge];
        for (const ProxyFault& other : list) {
          if (other.at_piece == pf.at_piece) ++pf.at_piece;
        }
        list.push_back(pf);
      }
      const std::vector<std::string> roles = internal::TreeRoles(parents);
      for (auto& [edge, faults] : plan.edges) {
        const auto [p, c] = edge;
        const std::string name = "proxy-" + std::to_string(p) + "-" + std::to_string(c);
        FaultProxySpec spec;
        auto port = internal::FreePort();
        if (!port.ok()) {
          setup = port.status();
          return;
        }
        spec.listen = "127.0.0.1:" + std::to_string(*port);
        spec.target = (*plans)[c].addresses[c];
        spec.parent = p;
        spec.child = c;
        spec.faults = faults;
        spec.seed = s.faults.seed + static_cast<uint64_t>(run);
        spec.log_path = run_dir + "/" + name + ".log.json";
        // The run's CA signs commit reports even on plain TCP (tls_links false): the proxy
        // terminates TLS only where the edges run it.
        const std::string& ca = (*plans)[0].tls_ca;
        if (!ca.empty() && (*plans)[0].tls_links) {
          const std::string dir = ca.substr(0, ca.find_last_of('/'));
          Status st = internal::WriteExtraCredential(dir, roles[c], c, name + "-accept", 7);
          if (st.ok()) st = internal::WriteExtraCredential(dir, roles[p], p, name + "-connect", 7);
          if (!st.ok()) {
            setup = st;
            return;
          }
          spec.tls_ca = ca;
          spec.accept_cert = dir + "/" + name + "-accept.crt";
          spec.accept_key = dir + "/" + name + "-accept.key";
          spec.connect_cert = dir + "/" + name + "-connect.crt";
          spec.connect_key = dir + "/" + name + "-connect.key";
        }
        unlink(spec.log_path.c_str());
        const std::string spec_path = run_dir + "/" + name + ".json";
        const std::string js = FaultProxySpecToJson(spec);
        Status st = WriteFileAtomic(spec_path, js.data(), js.size());
        auto pid = st.ok()
                       ? SpawnSubcommand("fault-proxy", spec_path, run_dir + "/" + name + ".log")
                       : StatusOr<pid_t>(st);
        if (!pid.ok()) {
          setup = pid.status();
          return;
        }
        proxies.push_back(ProxyProcess{*pid, spec});
        // The parent dials the proxy in the child's place.
        (*plans)[p].addresses[c] = spec.listen;
      }
      // Listening before the parent dials (its connect retries anyway).
      for (const ProxyProcess& pp : proxies) {
        const double until = internal::SteadyNow() + 5;
        while (access(pp.spec.log_path.c_str(), F_OK) != 0 && internal::SteadyNow() < until) {
          usleep(5000);
        }
      }
      if (plan.store_fail) {
        window =
            std::make_unique<StoreWriteWindow>(run_dir + "/region-store", s.faults.store_fail_s);
      }
    };
    StatusOr<RunResult> rr_or = RunOneRefit(s, ckpts, Method::kDelta, TransportKind::kRelayTree,
                                            rate, measured, 1, *run_index, work_dir, out, &f);
    if (window != nullptr) window->Stop();
    for (ProxyProcess& pp : proxies) {
      kill(pp.pid, SIGTERM);
      waitpid(pp.pid, nullptr, 0);
    }
    DCR_RETURN_IF_ERROR(setup.WithContext("faults.proxy_runs: run " + std::to_string(run + 1)));
    DCR_RETURN_IF_ERROR(rr_or.status());
    RunResult rr = std::move(*rr_or);
    const bool whole = rr.error.empty() && rr.receivers_verified == rr.receivers;
    int injected = 0;
    auto count = [&](const std::string& kind) {
      ++injected;
      ++sum.injected_by_kind[kind];
      if (whole) ++sum.survived_by_kind[kind];
    };
    for (const ProxyProcess& pp : proxies) {
      const nlohmann::json j = nlohmann::json::parse(ReadText(pp.spec.log_path), nullptr, false);
      if (!j.is_object()) continue;
      for (const auto& e : j.value("injected", nlohmann::json::array())) {
        count("proxy:" + e.value("kind", std::string("?")));
      }
    }
    if (window != nullptr && window->opened_unpublished() && window->locked() > 0) {
      // Observed, not inferred: the store refused at least one of the long-link relays' puts
      // (their mirrors count each refusal) while the window was open.
      if (rr.recovery["mirror_put_failures"] > 0) count("store:write_fail");
    }
    AddFaultRun(rr, injected, whole, "proxy", run, &sum);
    sum.overwrite_repairs += rr.recovery["overwrite_repairs"];
    sum.fallbacks_to_store += rr.recovery["fallbacks"];
    if (s.progress) {
      std::string what;
      for (const std::string& k : run_kinds) what += (what.empty() ? "" : ", ") + k;
      std::fprintf(
          stderr,
          "  faults / %g%% / proxy run %d (%s): %d injected, %d/%d receivers bit-exact%s%s\n",
          rate * 100, run + 1, what.c_str(), injected, rr.receivers_verified, rr.receivers,
          rr.error.empty() ? "" : ": ", rr.error.c_str());
    }
    out->runs.push_back(std::move(rr));
  }
  sum.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::OK();
}

}  // namespace dcr::cli
