// The faults block's S3 runs (see run_s3_faults.h).
#include "run_s3_faults.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "dcr/checkpoint.h"
#include "dcr/status_macros.h"
#include "fault_runs.h"
#include "run_faults.h"
#include "run_real.h"
#include "s3_fault_proxy.h"
#include "transport/net.h"

namespace dcr::cli {

const std::vector<std::string>& S3RunFaultKinds() {
  static const std::vector<std::string> kinds = [] {
    std::vector<std::string> k;
    for (const std::string& f : S3FaultKinds()) {
      k.push_back("s3:" + f + ":upload");
      k.push_back("s3:" + f + ":download");
    }
    return k;
  }();
  return kinds;
}

namespace {

// `store` (an s3:// spec) with its endpoint replaced by `endpoint`, plain http allowed.
std::string WithEndpoint(const std::string& store, const std::string& endpoint) {
  std::string out = store;
  const size_t at = out.find("endpoint=");
  if (at != std::string::npos) {
    const size_t v = at + 9;
    const size_t end = out.find('&', v);
    out.replace(v, (end == std::string::npos ? out.size() : end) - v, endpoint);
  }
  if (out.find("allow_http=1") == std::string::npos) out += "&allow_http=1";
  return out;
}

}  // namespace

Status RunScenarioS3Faults(const Scenario& s, double rate, const std::vector<std::string>& ckpts,
                           const std::string& work_dir, int* run_index, ScenarioResult* out) {
  if (ckpts.size() < 2) return InvalidArgumentError("faults: needs a base and a target checkpoint");
  const ObjectStoreSpec& os = s.transport.object_store;
  if (os.kind != StoreKind::kS3) {
    return InvalidArgumentError(
        "faults.s3_runs: the fault proxy stands in front of an S3 endpoint: set "
        "transport.object_store.kind: s3 (and its endpoint, bucket)");
  }
  DCR_ASSIGN_OR_RETURN(uint64_t chunks, CountScenarioDeltaChunks(s, ckpts[0], ckpts[1]));
  DCR_ASSIGN_OR_RETURN(double measured, MeasureChangeRate(ckpts[0], ckpts[1]));
  std::vector<std::string> kinds = s.faults.s3_kinds;
  if (kinds.empty()) kinds = S3FaultKinds();
  std::vector<std::pair<std::string, std::string>> pairs;  // (kind, direction)
  for (const std::string& k : kinds) {
    pairs.emplace_back(k, "upload");
    pairs.emplace_back(k, "download");
  }
  // Requests a stream makes per direction: a header, its chunks and a trailer.
  const uint64_t blobs = chunks + 2;
  FaultSummary& sum = out->faults;
  sum.enabled = true;
  const auto t0 = std::chrono::steady_clock::now();
  size_t next = 0;
  for (int run = 0; run < s.faults.s3_runs; ++run) {
    std::mt19937_64 rng(s.faults.seed * 6271 + 90001 * static_cast<uint64_t>(run) + 5);
    ++*run_index;
    const std::string run_dir = work_dir + "/run-" + std::to_string(*run_index);
    std::error_code ec;
    std::filesystem::create_directories(run_dir, ec);
    if (ec)
      return UnavailableError("faults.s3_runs: cannot create " + run_dir + ": " + ec.message());
    S3FaultProxySpec spec;
    spec.upstream = os.endpoint;
    while (!spec.upstream.empty() && spec.upstream.back() == '/') spec.upstream.pop_back();
    spec.ca_file = os.ca_file;
    spec.log_path = run_dir + "/s3-proxy.log.json";
    std::vector<std::string> planned;
    for (int k = 0; k < s.faults.s3_faults; ++k) {
      const auto& [kind, direction] = pairs[next++ % pairs.size()];
      S3ProxyFault f;
      f.kind = kind;
      f.direction = direction;
      // Early in the stream: the uploads of one sender, the downloads of every receiver.
      f.at_request = 1 + rng() % std::max<uint64_t>(1, blobs / 2);
      for (const S3ProxyFault& o : spec.faults) {
        if (o.direction == f.direction && o.at_request == f.at_request) ++f.at_request;
      }
      f.seconds = kind == "stall" ? os.read_deadline_s + 1 : 0;
      spec.faults.push_back(f);
      planned.push_back(kind + ":" + direction);
    }
    DCR_ASSIGN_OR_RETURN(int port, internal::FreePort());
    spec.listen = "127.0.0.1:" + std::to_string(port);
    const std::string spec_path = run_dir + "/s3-proxy.json";
    const std::string js = S3FaultProxySpecToJson(spec);
    DCR_RETURN_IF_ERROR(WriteFileAtomic(spec_path, js.data(), js.size()));
    unlink(spec.log_path.c_str());
    DCR_ASSIGN_OR_RETURN(pid_t pid,
                         SpawnSubcommand("s3-fault-proxy", spec_path, run_dir + "/s3-proxy.log"));
    // Listening once its log exists (it writes the log after binding).
    const double until = internal::SteadyNow() + 5;
    while (access(spec.log_path.c_str(), F_OK) != 0 && internal::SteadyNow() < until) usleep(5000);
    RefitFaults f;
    const std::string proxy_url = "http://" + spec.listen;
    f.set_points = [&](std::vector<NodePlan>* plans) {
      for (NodePlan& p : *plans) {
        if (p.store.rfind("s3://", 0) == 0) p.store = WithEndpoint(p.store, proxy_url);
      }
    };
    StatusOr<RunResult> rr_or = RunOneRefit(s, ckpts, Method::kDelta, TransportKind::kObjectStore,
                                            rate, measured, 1, *run_index, work_dir, out, &f);
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
    DCR_RETURN_IF_ERROR(
        rr_or.status().WithContext("faults.s3_runs: run " + std::to_string(run + 1)));
    RunResult rr = std::move(*rr_or);
    const bool whole = rr.error.empty() && rr.receivers_verified == rr.receivers;
    int injected = 0;
    const nlohmann::json j = nlohmann::json::parse(ReadText(spec.log_path), nullptr, false);
    if (j.is_object()) {
      for (const auto& e : j.value("injected", nlohmann::json::array())) {
        const std::string kind = "s3:" + e.value("kind", std::string("?")) + ":" +
                                 e.value("direction", std::string("?"));
        ++injected;
        ++sum.injected_by_kind[kind];
        if (whole) ++sum.survived_by_kind[kind];
      }
    }
    AddFaultRun(rr, injected, whole, "s3", run, &sum);
    if (s.progress) {
      std::string what;
      for (const std::string& k : planned) what += (what.empty() ? "" : ", ") + k;
      std::fprintf(stderr,
                   "  faults / %g%% / s3 run %d (%s): %d injected, %d/%d receivers bit-exact, "
                   "%zu restarts%s%s\n",
                   rate * 100, run + 1, what.c_str(), injected, rr.receivers_verified, rr.receivers,
                   rr.restarts.size(), rr.error.empty() ? "" : ": ", rr.error.c_str());
    }
    out->runs.push_back(std::move(rr));
  }
  sum.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::OK();
}

}  // namespace dcr::cli
