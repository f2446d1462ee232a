// dcr-node: one node of a refit (sender, relay, receiver, uploader, downloader). The deployable
// node binary: it links the product libraries only (never the testing library). `dcr node ARGS`
// runs it with the same arguments.
//   dcr-node --plan PLAN.json              what `dcr run` starts on this machine
//   dcr-node SCENARIO.yaml --rank R ...    multi-host: one process per host; the rank comes from
//                                          --rank, else the first set of RANK (torchrun),
//                                          SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK;
//                                          addresses from network.hosts; TLS credentials
//                                          from network.tls (`dcr keys` makes them); a cuda
//                                          node's GPU from LOCAL_RANK, SLURM_LOCALID or
//                                          OMPI_COMM_WORLD_LOCAL_RANK when set (through
//                                          receivers.devices), else its index on its host.
//                                          With --target: one refit (with --state: numbered
//                                          by the deployment's state). Without: long-lived, one
//                                          version per model.checkpoints entry after the base,
//                                          or open-ended with model.base (until stopped),
//                                          recovering with --state DIR (HostPlan, node_plans.h).
// Either form probes the plan's device first: one that cannot be used is refused (exit 15 for
// cuda without a usable GPU, naming CUDA and the reason) before the node connects or loads.
// Relative --result and --state paths are taken against the directory the node started in, and
// every result file the node writes is checked writable before the refit starts (exit 11 naming
// the path otherwise).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "command.h"
#include "dcr/checkpoint.h"
#include "dcr/device.h"
#include "dcr/node.h"
#include "dcr/scenario.h"
#include "dcr/status_macros.h"
#include "node_plans.h"

namespace dcr::cli {
namespace {

struct NodeArgs {
  std::string plan;
  std::string scenario;
  int rank = -1;
  std::string method = "delta";
  std::string transport = "relay_tree";
  std::string base, target, out;
  // Run folder of the plans; every file the plans put there is overridden below (result, ready
  // and go paths), and the store path comes from the scenario.
  std::string work_dir = ".";
  std::string prefix;  // "" = refit/step-1 (one refit), refit (long-lived: refit/step-<k>, or
                       // refit/deployment-<id>/step-<k> for a deployment of `dcr keys`)
  std::string state;   // recovery state of a long-lived node
  std::string store;   // its in-region store
};

// The rank of a multi-host node from its launcher's environment: the first set of RANK
// (torchrun), SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK, as RankFromEnvironment reads them,
// except that a malformed RANK is refused here rather than skipped. -1 if none is set. RANK is read
// first because a launcher started inside a Slurm or MPI allocation (torchrun under srun) sets it
// per process, where SLURM_PROCID names its own task. Errors: kInvalidArgument for a RANK that is
// set but not a non-negative integer.
StatusOr<int> LauncherRank() {
  const char* v = std::getenv("RANK");
  if (v == nullptr || *v == '\0') return RankFromEnvironment();
  char* end = nullptr;
  errno = 0;
  const long r = std::strtol(v, &end, 10);
  if (*end != '\0' || errno != 0 || r < 0 || r > INT_MAX) {
    return InvalidArgumentError(std::string("RANK=") + v + ": not a non-negative integer");
  }
  return static_cast<int>(r);
}

// `path` made absolute against the current directory, the one the node started in ("" stays "").
std::string Absolute(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  std::error_code ec;
  std::filesystem::path abs = std::filesystem::absolute(path, ec);
  return ec ? path : abs.lexically_normal().string();
}

// Whether the node can write the file `path` (`what` names it in the error): `path` is not a
// directory and a file can be created in its directory (a probe file is created and removed).
// Errors: kInvalidArgument naming the path and why.
Status CheckWritable(const std::string& what, const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return InvalidArgumentError(what + " " + path + ": is a directory");
  }
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  const std::string probe = dir + "/.dcr-node-probe-" + std::to_string(getpid());
  const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return InvalidArgumentError(what + " " + path + ": cannot write in " + dir + ": " +
                                std::strerror(errno));
  }
  close(fd);
  unlink(probe.c_str());
  return Status();
}

// The result files of `plan` are writable: the node's result and each version's, but those in
// the recovery state directory (the node creates it).
Status CheckResultPaths(const NodePlan& plan) {
  if (!plan.result_path.empty()) DCR_RETURN_IF_ERROR(CheckWritable("--result", plan.result_path));
  std::set<std::string> dirs;
  for (const NodeVersion& v : plan.versions) {
    if (v.result_path.empty()) continue;
    const size_t slash = v.result_path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : v.result_path.substr(0, slash);
    // The state directory (or a deployment's state root: state_dir.h) is made and checked when
    // the node opens it, before anything is written there.
    if (!plan.state_dir.empty() &&
        (dir == plan.state_dir || plan.state_dir.rfind(dir + "/deployment-", 0) == 0)) {
      continue;
    }
    if (dirs.insert(dir).second) {
      DCR_RETURN_IF_ERROR(
          CheckWritable("the result of version " + std::to_string(v.version), v.result_path));
    }
  }
  return Status();
}

// Stopping on SIGTERM or SIGINT (a service manager's stop, a scheduler's preemption, Ctrl-C).
// BlockStopSignals, called first in main before any thread exists, blocks both in every thread
// (threads inherit the mask); StartStopWatch starts the one thread that takes them, with
// sigwait, so no code runs in a signal handler. On a signal the node stops where it is: its
// durable state (the recovery state, journals, stores, each written atomically or journaled) is
// consistent at every instant, which is what lets a node killed with -9 resume with --state, so
// no step needs finishing. The watch thread writes the node's result (ok false, error
// "ABORTED: stopped by SIGTERM ..." naming the last version this process finished), prints it on
// stdout in the scenario form as a finished node does, logs one line on stderr and ends the
// process by the same signal's default action, without running destructors under the node's
// threads: its parent sees it terminated by SIGTERM (status 143 in a shell; systemd counts that
// a clean stop) or SIGINT (130).
sigset_t StopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

void BlockStopSignals() {
  const sigset_t set = StopSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

// The role name of `plan`'s node, as RunNode reports it.
std::string RoleOf(const NodePlan& plan) {
  const bool store = plan.transport == "object_store";
  if (plan.rank == 0) return store ? "uploader" : "sender";
  if (store) return "downloader";
  for (int parent : plan.parents) {
    if (parent == plan.rank) return "relay";
  }
  return "receiver";
}

// What the stopped node had done: the newest version of `plan` whose result file this process
// wrote (modified since `started`, a wall-clock time), or that it finished none.
std::string Progress(const NodePlan& plan, time_t started) {
  if (plan.versions.empty()) return "before its refit finished";
  if (plan.open_versions) {
    // The versions follow one another: the newest whose result this process wrote.
    std::optional<uint64_t> newest;
    std::string newest_path;
    NodeVersion v = plan.versions.back();
    for (struct stat st; !v.result_path.empty() && stat(v.result_path.c_str(), &st) == 0;
         v = internal::NextOpenVersion(v)) {
      if (st.st_mtime >= started) {
        newest = v.version;
        newest_path = v.result_path;
      }
    }
    if (newest) return "after version " + std::to_string(*newest) + " (" + newest_path + ")";
    return "before this process finished a version";
  }
  for (auto v = plan.versions.rbegin(); v != plan.versions.rend(); ++v) {
    struct stat st;
    if (!v->result_path.empty() && stat(v->result_path.c_str(), &st) == 0 &&
        st.st_mtime >= started) {
      return "after version " + std::to_string(v->version) + " of " +
             std::to_string(plan.versions.back().version) + " (" + v->result_path + ")";
    }
  }
  return "before this process finished a version (versions " +
         std::to_string(plan.versions.front().version) + ".." +
         std::to_string(plan.versions.back().version) + ")";
}

[[noreturn]] void StopNode(const NodePlan& plan, bool print_result, int sig, time_t started) {
  const char* name = sig == SIGINT ? "SIGINT" : "SIGTERM";
  NodeResult r;
  r.rank = plan.rank;
  r.pid = static_cast<int64_t>(getpid());
  r.role = RoleOf(plan);
  r.ok = false;
  r.error =
      AbortedError(std::string("stopped by ") + name + " " + Progress(plan, started)).ToString();
  const std::string js = NodeResultToJson(r);
  Status w =
      plan.result_path.empty() ? Status() : WriteFileAtomic(plan.result_path, js.data(), js.size());
  if (print_result) std::printf("%s\n", js.c_str());
  std::fflush(stdout);
  const std::string where = plan.result_path.empty() ? "no result file"
                            : w.ok()                 ? "result " + plan.result_path
                                                     : "result not written: " + w.ToString();
  std::fprintf(stderr, "dcr node: rank %d: %s; %s\n", r.rank, r.error.c_str(), where.c_str());
  std::fflush(stderr);
  // Ended by the signal itself, its default action, so that the parent sees what it sent.
  signal(sig, SIG_DFL);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  raise(sig);
  _exit(128 + sig);
}

void StartStopWatch(const NodePlan& plan, bool print_result) {
  const time_t started = time(nullptr);
  std::thread([plan, print_result, started] {
    const sigset_t set = StopSignals();
    int sig = 0;
    while (sigwait(&set, &sig) != 0) {
    }
    StopNode(plan, print_result, sig, started);
  }).detach();
}

StatusOr<NodePlan> PlanFromArgs(const NodeArgs& a) {
  if (!a.plan.empty()) {
    std::ifstream in(a.plan);
    if (!in) return NotFoundError("plan file not found: " + a.plan);
    std::stringstream ss;
    ss << in.rdbuf();
    DCR_ASSIGN_OR_RETURN(NodePlan p, NodePlanFromJson(ss.str()));
    if (!a.out.empty()) p.result_path = a.out;
    return p;
  }
  if (a.scenario.empty()) return InvalidArgumentError("give --plan FILE or a SCENARIO.yaml");
  DCR_ASSIGN_OR_RETURN(Scenario s, LoadScenario(a.scenario));
  int rank = a.rank;
  if (rank < 0) {
    DCR_ASSIGN_OR_RETURN(rank, LauncherRank());
  }
  if (rank < 0) {
    return InvalidArgumentError(
        "--rank: not given and none of RANK, SLURM_PROCID, "
        "OMPI_COMM_WORLD_RANK, PMI_RANK is set");
  }
  HostPlanOptions o;
  o.method = a.method == "full" ? Method::kFull : Method::kDelta;
  o.transport =
      a.transport == "object_store" ? TransportKind::kObjectStore : TransportKind::kRelayTree;
  o.base = a.base;
  o.target = a.target;
  o.work_dir = a.work_dir;
  o.prefix = a.prefix;
  o.state_dir = a.state;
  o.store = a.store;
  o.result_path = a.out;
  DCR_ASSIGN_OR_RETURN(NodePlan p, HostPlan(s, rank, o));
  if (p.rank == 0) {
    for (const NodeVersion& v : p.versions) {
      if (v.target_path.empty()) {
        return InvalidArgumentError(
            "version " + std::to_string(v.version) +
            ": no checkpoint for the sender (give model.checkpoints, one per version after the "
            "base, or publish from the training process through dcr/publisher_c.h)");
      }
    }
  }
  return p;
}

int NodeMain(NodeArgs a) {
  UseDataPlaneAllocator();
  a.out = Absolute(a.out);
  a.state = Absolute(a.state);
  auto plan = PlanFromArgs(a);
  if (!plan.ok()) return ReportStatus("node", plan.status());
  Status writable = CheckResultPaths(*plan);
  if (!writable.ok()) return ReportStatus("node", writable);
  StartStopWatch(*plan, a.plan.empty());
  // A device that cannot be used is refused before the node connects or loads anything.
  Status probe = ProbePlanDevice(*plan);
  if (!probe.ok()) return ReportStatus("node", probe);
  NodeResult r;
  Status s = RunNode(*plan, &r);
  if (a.plan.empty()) std::printf("%s\n", NodeResultToJson(r).c_str());
  if (!r.freeze.empty()) std::fprintf(stderr, "dcr node: rank %d: %s\n", r.rank, r.freeze.c_str());
  if (!s.ok()) return ReportStatus("node", s);
  if (!plan->verify_path.empty() && plan->rank != 0 && !r.verified) {
    std::fprintf(stderr, "dcr node: %s\n", r.verify_message.c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace dcr::cli

int main(int argc, char** argv) {
  using dcr::cli::NodeArgs;
  CLI::App app{
      "dcr-node: run one node of a refit (started by `dcr run`, or one per host with --rank / "
      "RANK / SLURM_PROCID / OMPI_COMM_WORLD_RANK for multi-host runs)"};
  app.name("dcr node");
  dcr::cli::BlockStopSignals();
  NodeArgs a;
  app.add_option("scenario", a.scenario, "Scenario YAML (multi-host form)");
  app.add_option("--plan", a.plan, "Node plan JSON written by `dcr run`");
  app.add_option("--rank", a.rank,
                 "Rank (0 = sender); default: the first set of RANK, SLURM_PROCID, "
                 "OMPI_COMM_WORLD_RANK, PMI_RANK");
  app.add_option("--method", a.method, "delta | full")->check(CLI::IsMember({"delta", "full"}));
  app.add_option("--transport", a.transport, "relay_tree | object_store")
      ->check(CLI::IsMember({"relay_tree", "object_store"}));
  app.add_option("--base", a.base, "Base checkpoint (sender and delta receivers)");
  app.add_option("--target", a.target,
                 "Target checkpoint of a one-refit run (sender; receivers verify against it). "
                 "Without it the node is long-lived: one version per model.checkpoints entry "
                 "after the base");
  app.add_option("--prefix", a.prefix,
                 "Object-store prefix of this refit (default refit/step-1), or the root of the "
                 "versions' prefixes <prefix>/step-<k> (long-lived; default refit), "
                 "<prefix>/deployment-<id>/step-<k> in a deployment of `dcr keys`");
  app.add_option("--state", a.state,
                 "This node's state directory (0700, its own; kept across restarts and refits): "
                 "per deployment (DIR/deployment-<id>) its version floor, and in the long-lived "
                 "form the versions' results and what it resumes from (required there for a "
                 "signed receiver); in the one-refit form the sender's published versions, so "
                 "that versions never repeat within the deployment");
  app.add_option("--store", a.store,
                 "Long-lived form with --state: the in-region store (dir:PATH or s3://...) every "
                 "node of the region reaches");
  app.add_option("--result", a.out,
                 "Write the node result JSON here (relative: to the starting directory; checked "
                 "writable before the refit starts)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    return dcr::cli::NodeMain(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dcr node: internal error: %s\n", e.what());
    return 18;
  }
}
