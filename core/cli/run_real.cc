// Real-mode scenario runner (see run_real.h). Not a subcommand: used by cmd_run.cc.
#include "run_real.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "dcr/checkpoint.h"
#include "dcr/commitment.h"
#include "dcr/delta.h"
#include "dcr/status_macros.h"
#include "dcr/testing/synth.h"
#include "internal/diff_scan.h"
#include "internal/own_directory.h"
#include "internal/simd.h"
#include "node/node_exe.h"
#include "node/version_state.h"
#include "node_plans.h"
#include "progress_line.h"
#include "run_catch_up.h"
#include "run_wan_choice.h"
#include "transport/net.h"
#include "transport/tls.h"

namespace dcr::cli {

namespace {

Status MkdirP(const std::string& dir) {
  std::string cur;
  for (size_t pos = 0; pos != std::string::npos;) {
    pos = dir.find('/', pos + 1);
    cur = dir.substr(0, pos);
    if (!cur.empty() && mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoError("mkdir " + cur, errno);
    }
  }
  return Status();
}

bool Exists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0;
}

std::string RateTag(double rate) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", rate * 100);
  return buf;
}

// Machine-wide CPU accounting, to record how many cores a run could use on a shared machine:
// (CPU of the run's node processes + idle time of all CPUs) / wall time over the refit window.
// Other tenants (and VM steal) take the rest. The simulator's one-machine model reads it
// (scripts/compare-sim-real.sh). Sampled by SpawnAndWait's poll loop (every 20 ms).
struct CpuPoint {
  double wall = 0;              // CLOCK_REALTIME seconds (the nodes' timestamps)
  double idle = 0;              // idle + iowait seconds of all CPUs
  double ours = 0;              // user + system seconds of the run's node processes
  std::vector<double> by_rank;  // the same per node rank
};

double ProcStatIdleSeconds() {
  double idle = 0;
  if (FILE* f = std::fopen("/proc/stat", "r")) {
    unsigned long long v[5] = {0};
    if (std::fscanf(f, "cpu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4]) == 5) {
      idle = static_cast<double>(v[3] + v[4]) / static_cast<double>(sysconf(_SC_CLK_TCK));
    }
    std::fclose(f);
  }
  return idle;
}

// user + system seconds of a live process (0 once it is gone).
double ProcessCpuSeconds(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  std::string text = ReadText(path);
  size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream in(text.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {  // fields 14, 15: utime, stime
    if (i == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
    if (i == 15) stime = std::strtoull(field.c_str(), nullptr, 10);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// CPU seconds the run's node processes used between wall times a and b (0 if not covered).
double RunCpuSeconds(const std::vector<CpuPoint>& pts, double a, double b) {
  const CpuPoint* lo = nullptr;
  const CpuPoint* hi = nullptr;
  for (const CpuPoint& p : pts) {
    if (p.wall <= a) lo = &p;
    if (p.wall >= b && hi == nullptr) hi = &p;
  }
  return lo != nullptr && hi != nullptr ? hi->ours - lo->ours : 0.0;
}

// The same per node rank, as "r0 r1 ..." seconds.
std::string RunCpuByRank(const std::vector<CpuPoint>& pts, double a, double b) {
  const CpuPoint* lo = nullptr;
  const CpuPoint* hi = nullptr;
  for (const CpuPoint& p : pts) {
    if (p.wall <= a) lo = &p;
    if (p.wall >= b && hi == nullptr) hi = &p;
  }
  std::string out;
  if (lo == nullptr || hi == nullptr) return out;
  for (size_t r = 0; r < hi->by_rank.size() && r < lo->by_rank.size(); ++r) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%s%.3f", r ? " " : "", hi->by_rank[r] - lo->by_rank[r]);
    out += buf;
  }
  return out;
}

// Cores available to the run between wall times a and b (0 if the samples do not cover it).
double AvailableCores(const std::vector<CpuPoint>& pts, double a, double b) {
  const CpuPoint* lo = nullptr;
  const CpuPoint* hi = nullptr;
  for (const CpuPoint& p : pts) {
    if (p.wall <= a) lo = &p;
    if (p.wall >= b && hi == nullptr) hi = &p;
  }
  if (lo == nullptr || hi == nullptr || hi->wall <= lo->wall) return 0;
  return std::max(0.0, (hi->ours - lo->ours + hi->idle - lo->idle) / (hi->wall - lo->wall));
}

}  // namespace

StatusOr<double> MeasureChangeRate(const std::string& base_path, const std::string& target_path) {
  DCR_ASSIGN_OR_RETURN(auto base, Checkpoint::Open(base_path));
  DCR_ASSIGN_OR_RETURN(auto target, Checkpoint::Open(target_path));
  DCR_RETURN_IF_ERROR(
      CheckDeltaCompatible(*base, *target).WithContext(base_path + " -> " + target_path));
  const bool avx2 = internal::CpuHasAvx2();
  uint64_t elements = 0, changed = 0;
  for (const TensorInfo& t : target->tensors()) {
    const TensorInfo& b = *base->Find(t.name);  // present: CheckDeltaCompatible
    const uint64_t n = t.num_elements();
    elements += n;
    auto count = [&](auto zero) {
      using T = decltype(zero);
      internal::ForEachDifference(reinterpret_cast<const T*>(base->data(b)),
                                  reinterpret_cast<const T*>(target->data(t)), n, avx2,
                                  [&](uint64_t) { ++changed; });
    };
    switch (t.width()) {
      case 2:
        count(uint16_t{0});
        break;
      case 4:
        count(uint32_t{0});
        break;
      case 8:
        count(uint64_t{0});
        break;
      default:
        count(uint8_t{0});
        break;
    }
  }
  return elements ? static_cast<double>(changed) / static_cast<double>(elements) : 0.0;
}

StatusOr<std::vector<std::string>> PrepareCheckpoints(const Scenario& s, double rate,
                                                      const std::string& work_dir) {
  if (!s.model.checkpoints.empty()) {
    if (static_cast<int>(s.model.checkpoints.size()) < s.steps + 1) {
      return InvalidArgumentError("model.checkpoints: " + std::to_string(s.steps) + " steps need " +
                                  std::to_string(s.steps + 1) + " checkpoints");
    }
    for (const auto& p : s.model.checkpoints) {
      if (!Exists(p)) return NotFoundError("model.checkpoints: no file or shard directory " + p);
    }
    return s.model.checkpoints;
  }
  DCR_ASSIGN_OR_RETURN(ModelConfig cfg, GetPreset(s.model.preset));
  cfg = ScaleModel(cfg, s.model.depth_div, s.model.width_div, s.model.expert_div);
  std::string dir = work_dir + "/ckpt-" + s.model.preset + "-d" +
                    std::to_string(s.model.depth_div) + "w" + std::to_string(s.model.width_div) +
                    "e" + std::to_string(s.model.expert_div) + "-s" + std::to_string(s.model.seed) +
                    "-r" + RateTag(rate);
  std::vector<std::string> paths;
  for (int k = 0; k <= s.steps; ++k)
    paths.push_back(dir + "/step" + std::to_string(k) + ".safetensors");
  std::string stamp = dir + "/complete-" + std::to_string(s.steps);
  if (Exists(stamp)) return paths;  // synthesized earlier with the same parameters
  DCR_RETURN_IF_ERROR(MkdirP(dir));
  SynthOptions o;
  o.preset = s.model.preset;
  o.depth_div = s.model.depth_div;
  o.width_div = s.model.width_div;
  o.expert_div = s.model.expert_div;
  o.seed = s.model.seed;
  o.steps = s.steps + 1;
  o.change_rate = rate;
  // init and step: bytes, rate and time left; calibrate and warmup: iterations.
  ProgressLine::Options lo;
  lo.prefix = "  synth " + cfg.name + " " + RateTag(rate) + "%: ";
  ProgressLine line = ProgressLine::ForStderr(s.progress, lo);
  ProgressFn progress = [&](uint64_t done, uint64_t total, const std::string& phase) {
    if (phase == "init" || phase == "step") {
      line.Update(ProgressUpdate{phase == "init" ? "init" : "step", done, total});
    } else if (done == total) {
      line.Show(phase + " done", true);
    } else {
      line.Show(phase + " " + std::to_string(done) + "/" + std::to_string(total), false);
    }
  };
  if (s.progress) {
    std::fprintf(stderr, "dcr run: synthesizing %s (%.1f MB BF16) at %s%% change\n",
                 cfg.name.c_str(), ModelBytes(cfg) / 1e6, RateTag(rate).c_str());
  }
  DCR_ASSIGN_OR_RETURN(auto trainer, SynthTrainer::Create(ModelInventory(cfg), o, progress));
  for (int k = 0; k <= s.steps; ++k) {
    if (k > 0) trainer->Step(progress);
    std::map<std::string, std::string> meta{{"dcr_preset", cfg.name}};
    DCR_RETURN_IF_ERROR(WriteSafetensors(paths[k], trainer->Views(), meta));
  }
  line.Finish();
  DCR_RETURN_IF_ERROR(WriteFileAtomic(stamp, "ok\n", 3));
  return paths;
}

namespace {

struct Child {
  pid_t pid = -1;
  int rank = 0;
  int status = 0;
  bool exited = false;
  std::string log;
  std::string plan_path;
  std::string exe;        // the node executable that runs the plan (NodeExe(plan))
  int restarts = 0;       // by the supervisor (SuperviseExit)
  std::string state_dir;  // long-lived recovering node: its NodePlan::state_dir
  bool down = false;      // killed by a StepAction and kept down until its restart
  double cpu = 0;         // last CPU seconds read from /proc
};

// Starts `exe --plan plan_path` with its output in `log` (appended to when `append`: a restart).
StatusOr<pid_t> SpawnNode(const std::string& exe, const std::string& plan_path,
                          const std::string& log, bool append) {
  pid_t pid = fork();
  if (pid < 0) return ErrnoError("fork", errno);
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execl(exe.c_str(), exe.c_str(), "--plan", plan_path.c_str(), (char*)nullptr);
    _exit(127);
  }
  return pid;
}

// Starts the node of plan `p` (written by StartNodes) as StartNodes does.
StatusOr<Child> StartDeferred(const NodePlan& p, const std::string& run_dir) {
  DCR_ASSIGN_OR_RETURN(const std::string exe, NodeExe(p));
  Child c;
  c.exe = exe;
  c.rank = p.rank;
  c.log = run_dir + "/node-" + std::to_string(p.rank) + ".log";
  c.plan_path = run_dir + "/plan-" + std::to_string(p.rank) + ".json";
  if (!p.versions.empty()) c.state_dir = p.state_dir;
  DCR_ASSIGN_OR_RETURN(c.pid, SpawnNode(exe, c.plan_path, c.log, false));
  return c;
}

// Starts `dcr-node --plan FILE` for every plan, receivers first so their listening sockets exist
// early (connect retries anyway); each node's output goes to node-<rank>.log in `run_dir`. Plans
// of the ranks in `deferred` are written but not started (StartDeferred starts one later).
StatusOr<std::vector<Child>> StartNodes(const std::vector<NodePlan>& plans,
                                        const std::string& run_dir,
                                        const std::vector<int>& deferred = {}) {
  std::vector<Child> children;
  // Stale files of an earlier invocation would fake readiness or results.
  for (const auto& p : plans) {
    for (const std::string& f : {p.ready_path, p.go_path, p.result_path, p.progress_path}) {
      if (!f.empty()) unlink(f.c_str());
    }
    for (const NodeVersion& v : p.versions) {
      const std::string tag = ".v" + std::to_string(v.version);
      for (const std::string& f : {v.result_path, p.ready_path.empty() ? "" : p.ready_path + tag,
                                   p.go_path.empty() ? "" : p.go_path + tag}) {
        if (!f.empty()) unlink(f.c_str());
      }
    }
  }
  for (int i = static_cast<int>(plans.size()) - 1; i >= 0; --i) {
    const NodePlan& p = plans[i];
    std::string plan_path = run_dir + "/plan-" + std::to_string(p.rank) + ".json";
    std::string js = NodePlanToJson(p);
    DCR_RETURN_IF_ERROR(WriteFileAtomic(plan_path, js.data(), js.size()));
    if (std::find(deferred.begin(), deferred.end(), p.rank) != deferred.end()) continue;
    Child c;
    c.rank = p.rank;
    c.log = run_dir + "/node-" + std::to_string(p.rank) + ".log";
    c.plan_path = plan_path;
    if (!p.versions.empty()) c.state_dir = p.state_dir;
    DCR_ASSIGN_OR_RETURN(c.exe, NodeExe(p));
    DCR_ASSIGN_OR_RETURN(c.pid, SpawnNode(c.exe, plan_path, c.log, false));
    children.push_back(c);
  }
  return children;
}

// A failed node's own message: the "dcr node: ..." lines of its log (the last 600 bytes of the log
// when it has none, e.g. a node killed by a signal).
std::string NodeMessage(const Child& c) {
  const std::string log = ReadText(c.log);
  std::string own;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("dcr node: ", 0) == 0) own += (own.empty() ? "" : "; ") + line.substr(10);
  }
  if (!own.empty()) return own;
  std::string tail = log.size() > 600 ? log.substr(log.size() - 600) : log;
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.pop_back();
  return tail.empty() ? "no message" : tail;
}

// Reaps the children that exited. The first failure is the root cause: the node that failed
// before the others (whose errors, such as a closed connection, follow from it); among nodes
// reaped in the same poll, the lowest rank (the sender first). It sets `failure`, naming the
// node, its exit, its own message and its log. Returns how many exited in this call.
// With `restarts` (the nodes recover: NodePlan::state_dir), a node that died or failed is first
// restarted with the same plan, as a cluster scheduler restarts a failed task, at most
// kMaxNodeRestarts times; each restart appends a line to `restarts`.
constexpr int kMaxNodeRestarts = 8;

std::string ExitName(int st) {
  return WIFEXITED(st) ? "exit " + std::to_string(WEXITSTATUS(st))
                       : "killed by signal " + std::to_string(WTERMSIG(st));
}

size_t ReapExited(std::vector<Child>* children, Status* failure,
                  std::vector<std::string>* restarts = nullptr) {
  size_t exited = 0;
  const Child* cause = nullptr;
  for (auto& c : *children) {
    if (c.exited || c.down) continue;
    int st = 0;
    pid_t r = waitpid(c.pid, &st, WNOHANG);
    if (r != c.pid) continue;
    const bool failed = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (failed && restarts != nullptr && c.restarts < kMaxNodeRestarts) {
      auto pid = SpawnNode(c.exe, c.plan_path, c.log, true);
      if (pid.ok()) {
        c.pid = *pid;
        ++c.restarts;
        std::string line = "node " + std::to_string(c.rank) + ": " + ExitName(st) + "; restart " +
                           std::to_string(c.restarts);
        // A long-lived node: the version it was in (internal/version_state.h).
        if (!c.state_dir.empty()) {
          line += "; in version " + std::to_string(internal::VersionStarted(c.state_dir, c.rank));
        }
        restarts->push_back(line);
        continue;
      }
    }
    c.exited = true;
    c.status = st;
    ++exited;
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && (cause == nullptr || c.rank < cause->rank)) {
      cause = &c;
    }
  }
  if (cause != nullptr && failure->ok()) {
    const int st = cause->status;
    *failure = UnavailableError("node " + std::to_string(cause->rank) +
                                (cause->rank == 0 ? " (sender)" : "") + " failed first (" +
                                (WIFEXITED(st) ? "exit " + std::to_string(WEXITSTATUS(st))
                                               : "signal " + std::to_string(WTERMSIG(st))) +
                                "): " + NodeMessage(*cause) + " [log: " + cause->log + "]");
  }
  return exited;
}

// Once every receiver has written its ready file, writes the sender's go file. Returns whether
// the go file is written.
StatusOr<bool> SignalGoWhenReady(const std::vector<NodePlan>& plans) {
  for (const auto& p : plans) {
    if (p.rank != 0 && !p.ready_path.empty() && !Exists(p.ready_path)) return false;
  }
  if (plans.empty() || plans[0].go_path.empty()) return false;
  DCR_RETURN_IF_ERROR(WriteFileAtomic(plans[0].go_path, "go\n", 3));
  return true;
}

// Long-lived nodes: once every receiver has written its ready file of a later version
// (ready_path + ".v<k>", NodePlan::versions), writes the sender's go file of that version.
Status SignalLaterVersionsWhenReady(const std::vector<NodePlan>& plans, size_t* next) {
  if (plans.empty() || plans[0].go_path.empty()) return Status();
  const auto& versions = plans[0].versions;
  if (*next == 0) *next = 1;  // the first version is the plain barrier
  while (*next < versions.size()) {
    const std::string tag = ".v" + std::to_string(versions[*next].version);
    for (const auto& p : plans) {
      if (p.rank != 0 && !p.ready_path.empty() && !Exists(p.ready_path + tag)) return Status();
    }
    DCR_RETURN_IF_ERROR(WriteFileAtomic(plans[0].go_path + tag, "go\n", 3));
    ++*next;
  }
  return Status();
}

// Stops every child still running (SIGTERM) and waits for it.
void StopAll(std::vector<Child>* children) {
  for (auto& c : *children) {
    if (!c.exited && !c.down) kill(c.pid, SIGTERM);
  }
  for (auto& c : *children) {
    if (!c.exited && !c.down) waitpid(c.pid, nullptr, 0);
    c.exited = true;
  }
}

// One CPU sample: the machine's idle time and each live child's CPU seconds. A node's CPU is read
// while it lives; once reaped its last reading stays counted.
CpuPoint SampleCpu(std::vector<Child>* children) {
  CpuPoint p;
  p.wall = internal::WallNow();
  p.idle = ProcStatIdleSeconds();
  p.by_rank.assign(children->size(), 0.0);
  for (auto& c : *children) {
    if (!c.exited && !c.down) c.cpu = std::max(c.cpu, ProcessCpuSeconds(c.pid));
    p.ours += c.cpu;
    if (c.rank >= 0 && c.rank < static_cast<int>(p.by_rank.size())) p.by_rank[c.rank] = c.cpu;
  }
  return p;
}

// What the nodes' progress files (NodePlan::progress_path) add up to.
struct NodesProgress {
  uint64_t received = 0;  // bytes received by all receivers
  uint64_t expected = 0;  // bytes every receiver receives in all, once the stream is whole
};

// Sums the receivers' bytes received; the expected total once the sender's stream is complete
// (every receiver receives all of it, over the relay tree and from the store alike). A missing or
// unreadable file counts as nothing received yet.
NodesProgress ReadNodesProgress(const std::vector<NodePlan>& plans) {
  NodesProgress out;
  for (const NodePlan& p : plans) {
    if (p.progress_path.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(ReadText(p.progress_path), nullptr, false);
    if (!j.is_object()) continue;
    if (p.rank == 0) {
      if (j.value("stream_complete", false)) {
        out.expected = j.value("payload_bytes", uint64_t{0}) * (plans.size() - 1);
      }
    } else {
      out.received += j.value("bytes_received", uint64_t{0});
    }
  }
  return out;
}

// The waiting line of one refit: elapsed time, nodes done and, with progress files, the bytes the
// receivers received since the start signal, their rate and the time left.
std::string WaitLine(const std::string& label, double elapsed, size_t exited, size_t nodes,
                     const NodesProgress& np, double since_go) {
  char head[160];
  std::snprintf(head, sizeof(head), "%-40s %6.1f s  %zu/%zu nodes done", label.c_str(), elapsed,
                exited, nodes);
  std::string line = head;
  if (np.received == 0 && np.expected == 0) return line;
  line += ", received " + FormatBytes(static_cast<double>(np.received));
  if (np.expected > 0) line += " / " + FormatBytes(static_cast<double>(np.expected));
  if (since_go > 0 && np.received > 0) {
    const double rate = static_cast<double>(np.received) / since_go;
    line += ", " + FormatBytes(rate) + "/s";
    if (np.expected > np.received) {
      line +=
          ", " + FormatDuration(static_cast<double>(np.expected - np.received) / rate) + " left";
    }
  }
  return line;
}

// Starts `dcr-node --plan FILE` for every plan and waits for all of them, sampling their CPU every
// 20 ms into `cpu`. The first node failure or the scenario's timeout (+30 s) stops the rest; with
// `restarts` non-null a failed node is restarted first (ReapExited). `kills`: SIGKILL node
// `rank` once `at_s` seconds after the start signal (the faults block's kill from outside).
// `actions`: a node started, stopped (SIGSTOP) or continued (SIGCONT) once the start signal of
// its step is given (run_catch_up.h); a node with a start action is not started before.
Status SpawnAndWait(const Scenario& s, const std::vector<NodePlan>& plans,
                    const std::string& run_dir, const std::string& label,
                    std::vector<CpuPoint>* cpu, std::vector<std::string>* restarts,
                    std::vector<ExternalKill> kills, std::vector<StepAction> actions = {}) {
  std::vector<int> deferred;
  for (const StepAction& a : actions) {
    if (a.kind == StepAction::kStart) deferred.push_back(a.rank);
  }
  DCR_ASSIGN_OR_RETURN(std::vector<Child> children, StartNodes(plans, run_dir, deferred));
  const double start = internal::SteadyNow();
  const double deadline = start + s.timeout_s + 30;
  // A terminal gets one line redrawn every 0.5 s; a file (or pipe) a plain line every 5 s.
  ProgressLine::Options lo;
  lo.tty_interval_s = 0.5;
  lo.prefix = "  ";
  ProgressLine line = ProgressLine::ForStderr(s.progress, lo);
  size_t exited = 0;
  bool go = false;
  double go_at = 0;
  size_t next_version = 0;           // long-lived nodes: the next version whose barrier is open
  std::map<uint64_t, double> go_of;  // long-lived nodes: version -> when its start signal went
  Status failure;
  while (exited < children.size()) {
    exited += ReapExited(&children, &failure, restarts);
    if (!go) {
      DCR_ASSIGN_OR_RETURN(go, SignalGoWhenReady(plans));
      if (go) go_at = internal::SteadyNow();
    }
    if (go) {
      const size_t before = next_version;
      Status signalled = SignalLaterVersionsWhenReady(plans, &next_version);
      if (!signalled.ok() && failure.ok()) failure = signalled;
      for (size_t i = std::max<size_t>(before, 1); i < next_version; ++i) {
        go_of[plans[0].versions[i].version] = internal::SteadyNow();
      }
    }
    for (StepAction& a : actions) {
      // The start signal of step k: the first go file, then version k's (next_version counts
      // the versions whose go file is written).
      if (a.done || !go || (a.step > 1 && static_cast<size_t>(a.step) > next_version)) continue;
      if (!a.after_file.empty() && !Exists(a.after_file)) continue;
      a.done = true;
      if (a.kind == StepAction::kStart) {
        for (const NodePlan& p : plans) {
          if (p.rank != a.rank) continue;
          auto c = StartDeferred(p, run_dir);
          if (c.ok()) {
            children.push_back(*c);
          } else if (failure.ok()) {
            failure = c.status();
          }
        }
        continue;
      }
      for (Child& c : children) {
        if (c.rank != a.rank || c.exited) continue;
        if (a.kind == StepAction::kKill && !c.down) {
          kill(c.pid, SIGKILL);
          waitpid(c.pid, nullptr, 0);
          c.down = true;
        } else if (a.kind == StepAction::kRestart && c.down) {
          auto pid = SpawnNode(c.exe, c.plan_path, c.log, true);
          if (pid.ok()) {
            c.pid = *pid;
            c.down = false;
          } else if (failure.ok()) {
            failure = pid.status();
          }
        }
      }
    }
    double now = internal::SteadyNow();
    for (ExternalKill& k : kills) {
      if (!go || k.done) continue;
      const bool first =
          k.version == 0 || plans[0].versions.empty() || k.version == plans[0].versions[0].version;
      if (!first && go_of.count(k.version) == 0) continue;
      if (now < (first ? go_at : go_of[k.version]) + k.at_s) continue;
      k.done = true;
      for (const Child& c : children) {
        if (c.rank == k.rank && !c.exited && !c.down) kill(c.pid, SIGKILL);
      }
    }
    if (!failure.ok() || now > deadline) {
      if (failure.ok()) failure = DeadlineExceededError("run " + label + " timed out");
      StopAll(&children);
      break;
    }
    if (line.Due()) {
      line.Show(WaitLine(label, now - start, exited, children.size(), ReadNodesProgress(plans),
                         go ? now - go_at : 0),
                false);
    }
    cpu->push_back(SampleCpu(&children));
    usleep(20000);
  }
  const double now = internal::SteadyNow();
  line.Show(WaitLine(label, now - start, exited, children.size(), ReadNodesProgress(plans),
                     go ? now - go_at : 0),
            true);
  return failure;
}

// Where a scenario's checkpoints and run folders go. model.work_dir is created (0700) when
// missing; an existing one must be a real directory (not a symlink) owned by this user and
// writable by nobody else, since its checkpoints are trusted and its files overwritten. Without
// model.work_dir: a fresh private directory $TMPDIR/dcr-run-<name>.XXXXXX (mkdtemp, 0700), named
// on stderr, which *fresh is set for (FinishWorkDir removes it). Errors: kFailedPrecondition for
// an unsafe directory, errno codes.
StatusOr<std::string> PrepareWorkDir(const Scenario& s, bool* fresh) {
  *fresh = false;
  if (!s.model.work_dir.empty()) {
    const std::string& dir = s.model.work_dir;
    DCR_RETURN_IF_ERROR(internal::CheckOwnDirectory(dir, "model.work_dir",
                                                    internal::OthersMay::kRead,
                                                    /*make_parents=*/true));
    return dir;
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string name = s.name;
  for (char& c : name) {
    if (c == '/') c = '_';
  }
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/dcr-run-" + name + ".XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) return ErrnoError("mkdtemp " + tmpl, errno);
  std::fprintf(stderr, "dcr run: work dir %s\n", buf.data());
  *fresh = true;
  return std::string(buf.data());
}

// A node's or proxy's log (node-<rank>.log, <name>.log, <name>.log.json): what a failed run's
// error names ("[log: ...]").
bool IsLogFile(const std::filesystem::path& p) {
  const std::string name = p.filename().string();
  auto ends_with = [&name](const std::string& tail) {
    return name.size() >= tail.size() &&
           name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return ends_with(".log") || ends_with(".log.json");
}

// Ends the work dir `dir` of a run whose outcome is `failed`: a model.work_dir (`fresh` false,
// the user's) or one the user asked to keep (`keep`) stays whole; a fresh one is removed, all of
// it after a run that succeeded, all but its logs (the files a failure's message names) after
// one that failed. Says on stderr what it kept or removed. A file that cannot be removed is
// named there and left; the run's outcome does not change.
void FinishWorkDir(const std::string& dir, bool fresh, bool keep, bool failed) {
  if (!fresh) return;  // the user's model.work_dir
  if (keep) {
    std::fprintf(stderr, "dcr run: work dir %s kept (--keep-work-dir)\n", dir.c_str());
    return;
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  uint64_t logs = 0;
  if (failed) {
    // Every file but the logs, then the directories left empty (deepest first).
    std::vector<fs::path> files, dirs;
    for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const fs::file_status st = it->symlink_status(ec);
      if (ec) break;
      if (fs::is_directory(st)) {
        dirs.push_back(it->path());
      } else if (fs::is_regular_file(st) && IsLogFile(it->path())) {
        ++logs;
      } else {
        files.push_back(it->path());
      }
    }
    for (const fs::path& f : files) {
      if (!ec) fs::remove(f, ec);
    }
    for (auto d = dirs.rbegin(); d != dirs.rend() && !ec; ++d) {
      if (fs::is_empty(*d, ec) && !ec) fs::remove(*d, ec);
    }
    if (!ec && logs > 0) {
      std::fprintf(stderr,
                   "dcr run: work dir %s removed but for its %llu log files (a run failed; "
                   "--keep-work-dir keeps it whole)\n",
                   dir.c_str(), static_cast<unsigned long long>(logs));
      return;
    }
  }
  if (!ec) fs::remove_all(dir, ec);
  if (ec) {
    std::fprintf(stderr, "dcr run: work dir %s not removed: %s\n", dir.c_str(),
                 ec.message().c_str());
    return;
  }
  std::fprintf(stderr, "dcr run: work dir %s removed (--keep-work-dir keeps it)\n", dir.c_str());
}

// The result's scenario, model and setup fields (host, emulation, what the CPU keys mean).
ScenarioResult DescribeRealRun(const Scenario& s, const std::string& work_dir) {
  ScenarioResult out;
  out.scenario = s.name;
  out.mode = RunMode::kReal;
  out.model = s.model.preset.empty() ? s.model.checkpoints.front() : s.model.preset;
  if (!s.model.preset.empty()) {
    auto cfg = GetPreset(s.model.preset);
    if (cfg.ok()) {
      auto scaled = ScaleModel(*cfg, s.model.depth_div, s.model.width_div, s.model.expert_div);
      out.model = scaled.name;
      out.model_bytes = ModelBytes(scaled);
    }
  }
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  out.setup["host"] = host;
  out.setup["cpus"] = std::to_string(sysconf(_SC_NPROCESSORS_ONLN));
  out.setup["emulation"] = "transport layer: token bucket + delay on the long link";
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%.1f Mbit/s, %.1f ms one-way",
                s.network.long_link.bandwidth_Bps * 8 / 1e6, s.network.long_link.latency_s * 1e3);
  out.setup["long_link"] = buf;
  out.setup["work_dir"] = work_dir;
  out.setup["tls"] = !s.network.tls.enabled ? "off (network.tls: false): plain TCP tree edges"
                     : s.network.tls.ca.empty()
                         ? "mutual TLS 1.3 on every tree edge, a fresh CA per refit"
                         : "mutual TLS 1.3 on every tree edge, CA " + s.network.tls.ca;
  std::string devices = "receivers: " + s.receivers.device;
  if (s.receivers.device == "cuda" && !s.receivers.devices.empty()) {
    devices += " (devices by local index:";
    for (int d : s.receivers.devices) devices += " " + std::to_string(d);
    devices += ")";
  }
  for (const auto& [node, device] : s.receivers.node_devices) {
    devices += ", node " + std::to_string(node) + ": " + device;
  }
  devices += "; sender: " + s.sender.device;
  if (s.faults.enabled && s.faults.runs > 0) {
    devices += "; deterministic fault-injection runs: host-memory receivers";
  }
  out.setup["devices"] = devices;
  out.setup["available_cores"] =
      "per run: (CPU of the run's node processes + idle time of all CPUs) / wall time over the "
      "refit window (first blob to last commit), sampled every 20 ms from /proc: the cores "
      "this shared machine left to the run; cpu_seconds.*: CPU seconds of the node processes "
      "over the same window (20 ms resolution)";
  return out;
}

// Every node's result file, in plan order; a node without one gets a result carrying an error.
std::vector<NodeResult> ReadNodeResults(const std::vector<NodePlan>& plans) {
  std::vector<NodeResult> results;
  for (const auto& p : plans) {
    auto r = NodeResultFromJson(ReadText(p.result_path));
    if (!r.ok()) {
      NodeResult missing;
      missing.rank = p.rank;
      missing.error = "no result from node " + std::to_string(p.rank);
      results.push_back(missing);
    } else {
      results.push_back(*r);
    }
  }
  return results;
}

// What the receivers' results add up to.
struct ReceiverTotals {
  double last_commit = 0, last_byte = 0, apply = 0;
  bool all_committed = true;
};

// Adds a ReceiverResult per receiver (results[1..]) to `rr` and sums their times.
// `region_dead` (catch_up runs: the region ranks the sender counts out, carried step to step).
ReceiverTotals CollectReceivers(const std::vector<NodeResult>& results,
                                const std::vector<NodePlan>& plans, TransportKind transport,
                                RunResult* rr, std::set<int>* region_dead = nullptr) {
  std::set<int> none;
  if (region_dead == nullptr) region_dead = &none;
  const NodeResult& sender = results[0];
  ReceiverTotals t;
  for (size_t i = 1; i < results.size(); ++i) {
    const NodeResult& r = results[i];
    ReceiverResult rec;
    if (plans[i].region_receiver) {  // follows from the in-region store (run_catch_up.h)
      const bool have = r.error.rfind("no result from node", 0) != 0;
      const bool counts = CollectRegionReceiver(sender, r, have, region_dead, &rec);
      if (rec.catch_up == "absent") --rr->receivers;
      rr->receiver_results.push_back(rec);
      if (rec.verified) ++rr->receivers_verified;
      if (counts) t.all_committed &= rec.committed;
      if (rec.catch_up != "absent") {
        t.last_commit = std::max(t.last_commit, r.t_commit);
        t.apply += r.apply_seconds;
      }
      continue;
    }
    rec.node = r.rank;
    rec.host = transport == TransportKind::kRelayTree ? plans[i].addresses[i] : "";
    rec.committed = r.t_commit > 0 && r.ok;
    rec.verified = r.verified;
    rec.verify_message = r.ok ? r.verify_message : r.error;
    rec.commit_at_s = r.t_commit > 0 ? r.t_commit - sender.t_first_blob : 0;
    rec.bytes_received = r.bytes_received;
    if (transport == TransportKind::kRelayTree) {
      // Committed as the sender knows it: its own report reached the sender, for this version,
      // with the commitment root the sender signed (unsigned: the content hash it published).
      std::string report_root;
      for (const CommitReport& c : sender.reports) {
        if (c.rank != r.rank) continue;
        rec.reported = true;
        rec.report_ok = c.ok;
        rec.report_version = c.version;
        rec.report_hash = c.target_hash.ToHex();
        rec.report_error = c.error;
        report_root = c.commitment ? CommitmentHex(*c.commitment) : std::string();
      }
      const bool root_ok = sender.commitment.empty() || report_root == sender.commitment;
      const bool hash_ok = !sender.commitment.empty() || sender.target_hash == Hash128{} ||
                           rec.report_hash == sender.target_hash.ToHex();
      if (!(rec.reported && rec.report_ok && rec.report_version == plans[i].version && hash_ok &&
            root_ok)) {
        rec.committed = false;
        if (rec.verify_message.empty() || r.ok) {
          rec.verify_message +=
              std::string(rec.verify_message.empty() ? "" : "; ") +
              (!rec.reported    ? "no commit report reached the sender"
               : !rec.report_ok ? "reported a failure: " + rec.report_error
               : !root_ok ? "reported commitment " + (report_root.empty() ? "none" : report_root) +
                                ", the sender signed " + sender.commitment
               : !hash_ok ? "reported content hash " + rec.report_hash + ", the sender published " +
                                sender.target_hash.ToHex()
                          : "reported another version");
        }
      }
    }
    rr->receiver_results.push_back(rec);
    if (rec.verified) ++rr->receivers_verified;
    t.all_committed &= rec.committed;
    t.last_commit = std::max(t.last_commit, r.t_commit);
    t.last_byte = std::max(t.last_byte, r.t_last_blob);
    t.apply += r.apply_seconds;
  }
  return t;
}

// Records the cores left to one run and its CPU seconds (first blob to last commit) in the
// setup, under keys naming the run.
void RecordRunCpu(const std::vector<CpuPoint>& cpu, const RunResult& rr, double first_blob,
                  double last_commit, ScenarioResult* out) {
  const std::string key =
      std::string(MethodName(rr.method)) + "." + TransportKindName(rr.transport) + "." +
      RateTag(rr.configured_change_rate > 0 ? rr.configured_change_rate : rr.change_rate) + "." +
      std::to_string(rr.step);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.4f", AvailableCores(cpu, first_blob, last_commit));
  out->setup["available_cores." + key] = buf;
  std::snprintf(buf, sizeof(buf), "%.4f", RunCpuSeconds(cpu, first_blob, last_commit));
  out->setup["cpu_seconds." + key] =
      std::string(buf) + " (by node: " + RunCpuByRank(cpu, first_blob, last_commit) + ")";
}

// The deployment id of a fleet whose files are in `fleet_dir` (its file "deployment"): a fresh
// one written there when `fresh` (the series' first step), else the one written then.
StatusOr<std::string> FleetDeployment(const std::string& fleet_dir, bool fresh) {
  const std::string path = fleet_dir + "/deployment";
  if (!fresh) {
    std::ifstream in(path);
    std::string id;
    if (in >> id) return id;
  }
  DCR_ASSIGN_OR_RETURN(const std::string id, internal::NewRunId());
  const std::string text = id + "\n";
  DCR_RETURN_IF_ERROR(WriteFileAtomic(path, text.data(), text.size()));
  return id;
}

// Recovery for every node of one refit (node_recovery.h in the core): durable state under
// run_dir/state (emptied first: a journal of an earlier invocation would claim its versions);
// a relay tree without a store gets an in-region directory store, run_dir/region-store, which
// the sender's children (the long-link relays) fill with what they receive and every recovery
// reads.
Status PrepareRecovery(const std::string& run_dir, TransportKind transport,
                       std::vector<NodePlan>* plans) {
  const std::string state = run_dir + "/state";
  std::error_code ec;
  std::filesystem::remove_all(state, ec);
  if (ec) return InternalError("removing " + state + ": " + ec.message());
  const bool tree = transport == TransportKind::kRelayTree;
  const std::string region = run_dir + "/region-store";
  if (tree) {
    std::filesystem::remove_all(region, ec);
    if (ec) return InternalError("removing " + region + ": " + ec.message());
    DCR_RETURN_IF_ERROR(MkdirP(region));
  }
  AddRecovery(state, "dir:" + region, plans);
  return Status();
}

// Sums what every node's (last process's) result says it recovered from into rr.recovery.
void SumRecovery(const std::vector<NodeResult>& results, RunResult* rr) {
  std::map<std::string, uint64_t> m;
  for (const NodeResult& r : results) {
    m["fallbacks"] += r.fallbacks;
    m["reloads"] += r.reloads;
    m["overwrite_repairs"] += r.overwrite_repairs;
    m["chunks_skipped"] += r.chunks_skipped;
    m["mirror_puts"] += r.mirror_puts;
    m["mirror_put_failures"] += r.mirror_put_failures;
    m["store_failures"] += r.store_failures;
    m["store_refused"] += r.store_refused;
    m["resumed_blobs"] += r.resumed_blobs;
    m["resumed_bytes"] += r.resumed_bytes;
    m["restored_blobs"] += r.restored_blobs;
    m["restored_bytes"] += r.restored_bytes;
    m["store_fetched_bytes"] += r.fetched_bytes;
    m["long_link_fill_bytes"] += r.fill_bytes;
    m["storage_reattached"] += r.storage_reattached ? 1 : 0;
    // Durable receivers: what making the version durable wrote (the version log's entries and
    // markers, images), what the process wrote to disk in the version (/proc write_bytes), and
    // the recovery of the held version from the log on a restart.
    if (r.durable_log_bytes > 0 || r.durable_write_bytes > 0) ++m["durable_receivers"];
    m["durable_log_bytes"] += r.durable_log_bytes;
    m["durable_image_bytes"] += r.durable_image_bytes;
    m["durable_write_bytes"] += r.durable_write_bytes;
    m["durable_restore_us"] += static_cast<uint64_t>(r.durable_restore_s * 1e6);
  }
  m["node_restarts"] = rr->restarts.size();
  rr->recovery = m;
}

// Fills the run's bytes, phases and per-link bytes from the node results.
void FillRunTotals(const std::vector<NodeResult>& results, const ReceiverTotals& t, RunResult* rr) {
  const NodeResult& sender = results[0];
  rr->wire_bytes = sender.bytes_sent_long;
  rr->payload_bytes = sender.payload_bytes;
  rr->dense_bytes = sender.dense_bytes;
  rr->phases.build_s = sender.t_last_blob - sender.t_first_blob;
  rr->phases.transfer_s = t.last_byte > 0 ? t.last_byte - sender.t_first_blob : 0;
  rr->phases.apply_s = results.size() > 1 ? t.apply / (results.size() - 1) : 0;
  rr->phases.commit_s = rr->refit_seconds;
  // The second link: relay-to-relay bytes in a tree, store downloads otherwise.
  const bool tree = rr->transport == TransportKind::kRelayTree;
  uint64_t second = 0;
  for (size_t i = 1; i < results.size(); ++i) {
    second += tree ? results[i].bytes_sent : results[i].bytes_received;
  }
  rr->links.push_back(LinkBytes{"long", sender.bytes_sent_long});
  rr->links.push_back(LinkBytes{tree ? "local" : "store_get", second});
}

// The long link's encoding of a refit with edge relays (run_wan_choice.h), chosen for run
// `run_index` and recorded in the result's setup as wan_encoding.run-<run_index>.
Status NoteWanChoice(const Scenario& s, const std::string& base, const std::string& target,
                     int run_index, std::vector<NodePlan>* plans, ScenarioResult* out) {
  DCR_ASSIGN_OR_RETURN(const std::string text, ApplyWanChoice(s, base, target, plans));
  if (text.empty()) return Status();
  out->setup["wan_encoding.run-" + std::to_string(run_index)] = text;
  if (s.progress) std::fprintf(stderr, "  run %d: long link: %s\n", run_index, text.c_str());
  return Status();
}

}  // namespace

// One refit: base ckpts[step - 1] to target ckpts[step] by `method` over `transport`, its node
// processes in run folder `run_index`. A failed run is recorded in the result's error.
StatusOr<RunResult> RunOneRefit(const Scenario& s, const std::vector<std::string>& ckpts,
                                Method method, TransportKind transport, double rate,
                                double measured_rate, int step, int run_index,
                                const std::string& work_dir, ScenarioResult* out,
                                const RefitFaults* faults) {
  const bool synthetic = s.model.checkpoints.empty();
  char change[48];
  std::snprintf(change, sizeof(change), "%.2f%% changed", measured_rate * 100);
  const std::string label = std::string(MethodName(method)) + " / " + TransportKindName(transport) +
                            " / " + change + " / step " + std::to_string(step);
  const std::string run_dir = work_dir + "/run-" + std::to_string(run_index);
  DCR_RETURN_IF_ERROR(MkdirP(run_dir));
  char prefix[64];
  std::snprintf(prefix, sizeof(prefix), "refit-%d-%ld/step-%d", run_index,
                static_cast<long>(getpid()), step);
  RunResult rr;
  rr.method = method;
  rr.transport = transport;
  rr.change_rate = measured_rate;
  rr.configured_change_rate = synthetic ? rate : 0;
  rr.step = step;
  rr.receivers = s.receivers.count;
  DCR_ASSIGN_OR_RETURN(
      std::vector<NodePlan> plans,
      MakePlans(s, method, transport, ckpts[step - 1], ckpts[step], run_dir, work_dir, prefix));
  DCR_RETURN_IF_ERROR(NoteWanChoice(s, ckpts[step - 1], ckpts[step], run_index, &plans, out));
  // One fleet of receivers per (rate, transport, method) series, from step 0 up: its version
  // floors live as long as the series, and so does its deployment (a fresh id at its first step:
  // a delta left in the store by another invocation names another deployment and is refused).
  const std::string fleet_dir = work_dir + "/fleet-" + std::to_string((run_index - 1) / s.steps);
  DCR_RETURN_IF_ERROR(MkdirP(fleet_dir));
  DCR_ASSIGN_OR_RETURN(const std::string deployment, FleetDeployment(fleet_dir, step == 1));
  DCR_RETURN_IF_ERROR(SetDeployment(deployment, &plans));
  DCR_RETURN_IF_ERROR(AddTls(s, run_dir + "/tls", &plans));
  DCR_RETURN_IF_ERROR(AddSigning(s, run_dir + "/tls", fleet_dir, &plans));
  for (NodePlan& p : plans) p.version = static_cast<uint64_t>(step);
  DCR_RETURN_IF_ERROR(PrepareRecovery(run_dir, transport, &plans));
  if (faults != nullptr && faults->set_points) faults->set_points(&plans);
  if (s.progress) {
    for (NodePlan& p : plans)
      p.progress_path = run_dir + "/progress-" + std::to_string(p.rank) + ".json";
  }
  std::vector<CpuPoint> cpu;
  Status st = SpawnAndWait(s, plans, run_dir, label, &cpu, &rr.restarts,
                           faults != nullptr ? faults->kills : std::vector<ExternalKill>());
  if (!st.ok()) rr.error = st.ToString();
  const std::vector<NodeResult> results = ReadNodeResults(plans);
  SumRecovery(results, &rr);
  const NodeResult& sender = results[0];
  const ReceiverTotals t = CollectReceivers(results, plans, transport, &rr);
  if (t.all_committed && sender.t_first_blob > 0) {
    rr.refit_seconds = t.last_commit - sender.t_first_blob;
    RecordRunCpu(cpu, rr, sender.t_first_blob, t.last_commit, out);
  } else if (rr.error.empty()) {
    rr.error = "not every receiver committed";
  }
  FillRunTotals(results, t, &rr);
  if (s.progress) {
    std::fprintf(stderr, "    refit %.3f s, %.2f MB over the long link, %d/%d verified%s%s\n",
                 rr.refit_seconds, rr.wire_bytes / 1e6, rr.receivers_verified, rr.receivers,
                 rr.error.empty() ? "" : ", error: ", rr.error.c_str());
    for (const std::string& r : rr.restarts) std::fprintf(stderr, "    %s\n", r.c_str());
  }
  return rr;
}

StatusOr<std::vector<RunResult>> RunLongLivedRefits(
    const Scenario& s, const std::vector<std::string>& ckpts, Method method,
    TransportKind transport, double rate, const std::vector<double>& measured, int run_index,
    const std::string& work_dir, ScenarioResult* out, const RefitFaults* faults) {
  const bool synthetic = s.model.checkpoints.empty();
  const std::string label = std::string(MethodName(method)) + " / " + TransportKindName(transport) +
                            " / steps 1-" + std::to_string(s.steps) + ", one set of nodes";
  const std::string run_dir = work_dir + "/run-" + std::to_string(run_index);
  DCR_RETURN_IF_ERROR(MkdirP(run_dir));
  auto prefix_of = [&](int step) {
    char prefix[64];
    std::snprintf(prefix, sizeof(prefix), "refit-%d-%ld/step-%d", run_index,
                  static_cast<long>(getpid()), step);
    return std::string(prefix);
  };
  DCR_ASSIGN_OR_RETURN(
      std::vector<NodePlan> plans,
      MakePlans(s, method, transport, ckpts[0], ckpts[1], run_dir, work_dir, prefix_of(1)));
  // One encoding for the session's long link, chosen on the first version's delta.
  DCR_RETURN_IF_ERROR(NoteWanChoice(s, ckpts[0], ckpts[1], run_index, &plans, out));
  // One deployment per session, made here: its certificates, its signed versions 1..steps, and
  // its receivers' version floors (in their state) are this session's only.
  DCR_ASSIGN_OR_RETURN(const std::string deployment, internal::NewRunId());
  DCR_RETURN_IF_ERROR(SetDeployment(deployment, &plans));
  DCR_RETURN_IF_ERROR(AddTls(s, run_dir + "/tls", &plans));
  // Signed as the one-refit form is: the trainer's key on the sender, its public key, a version
  // floor (in each receiver's state directory: version_state.h) and the freeze limit on every
  // receiver, region receivers included (they copy a receiver's plan).
  DCR_RETURN_IF_ERROR(AddSigning(s, run_dir + "/tls", "", &plans));
  AddVersions(std::vector<std::string>(ckpts.begin() + 1, ckpts.begin() + 1 + s.steps), prefix_of,
              run_dir, &plans);
  for (NodePlan& p : plans) {
    if (s.progress) p.progress_path = run_dir + "/progress-" + std::to_string(p.rank) + ".json";
  }
  // Recovering and supervised, on every device (a device receiver's committed version is
  // written to its state at each commit: node_recovery.h); with a `catch_up:` block its region
  // receivers too (AddCatchUpNodes gives them the state root), and the long-link relay serves
  // full frames from the committed checkpoint it holds.
  DCR_RETURN_IF_ERROR(PrepareRecovery(run_dir, transport, &plans));
  // Region receivers (a receiver down for some versions, a late joiner) and their actions; the
  // faults block's kill points may then fall on them too.
  std::vector<StepAction> actions;
  DCR_RETURN_IF_ERROR(
      AddCatchUpNodes(s, transport, method, run_dir, run_dir + "/region-store", &plans, &actions));
  if (faults != nullptr && faults->set_points) faults->set_points(&plans);
  Scenario whole = s;  // the session's deadline covers every step
  whole.timeout_s = s.timeout_s * s.steps;
  std::vector<CpuPoint> cpu;
  std::vector<std::string> restarts;
  const Status st =
      SpawnAndWait(whole, plans, run_dir, label, &cpu, &restarts,
                   faults != nullptr ? faults->kills : std::vector<ExternalKill>(), actions);
  std::vector<RunResult> runs;
  std::set<int> region_dead;  // region receivers the sender counts out, step to step
  for (const NodePlan& p : plans) {
    if (p.late_join) region_dead.insert(p.rank);  // a member once a report re-admits it
  }
  for (int step = 1; step <= s.steps; ++step) {
    RunResult rr;
    rr.method = method;
    rr.transport = transport;
    rr.change_rate = measured[step];
    rr.configured_change_rate = synthetic ? rate : 0;
    rr.step = step;
    rr.receivers = static_cast<int>(plans.size()) - 1;
    std::vector<NodePlan> at = plans;  // the step's version and result files
    for (NodePlan& p : at) {
      p.version = static_cast<uint64_t>(step);
      p.result_path = p.versions[step - 1].result_path;
    }
    const std::vector<NodeResult> results = ReadNodeResults(at);
    const std::string in_step = "; in version " + std::to_string(step);
    for (const std::string& line : restarts) {
      if (line.size() >= in_step.size() &&
          line.compare(line.size() - in_step.size(), in_step.size(), in_step) == 0) {
        rr.restarts.push_back(line);
      }
    }
    SumRecovery(results, &rr);
    const NodeResult& sender = results[0];
    const ReceiverTotals t = CollectReceivers(results, at, transport, &rr, &region_dead);
    rr.catch_up = StepCatchUpEvents(at, results);
    if (t.all_committed && sender.t_first_blob > 0) {
      rr.refit_seconds = t.last_commit - sender.t_first_blob;
      RecordRunCpu(cpu, rr, sender.t_first_blob, t.last_commit, out);
    } else {
      rr.error = !st.ok() ? st.ToString() : "not every receiver committed";
    }
    FillRunTotals(results, t, &rr);
    if (sender.retention_runs > 0) {
      rr.retention = {{"removed_objects", sender.retention_removed_objects},
                      {"removed_bytes", sender.retention_removed_bytes},
                      {"store_bytes", sender.retention_store_bytes}};
      rr.retention_kept = sender.retention_kept;
      if (!sender.retention_error.empty()) rr.retention_kept += "; " + sender.retention_error;
    }
    if (s.progress) {
      std::fprintf(stderr,
                   "    step %d: refit %.3f s, %.2f MB over the long link, %d/%d verified%s%s\n",
                   step, rr.refit_seconds, rr.wire_bytes / 1e6, rr.receivers_verified, rr.receivers,
                   rr.error.empty() ? "" : ", error: ", rr.error.c_str());
      for (const std::string& r : rr.restarts) std::fprintf(stderr, "    %s\n", r.c_str());
    }
    runs.push_back(std::move(rr));
  }
  return runs;
}

// RunScenarioReal's runs in the prepared work dir `work_dir`.
StatusOr<ScenarioResult> RunScenarioRealIn(const Scenario& s, const FaultBlockRunner& faults,
                                           const std::string& work_dir) {
  ScenarioResult out = DescribeRealRun(s, work_dir);
  int run_index = 0;
  for (double rate : s.change_rates) {
    DCR_ASSIGN_OR_RETURN(auto ckpts, PrepareCheckpoints(s, rate, work_dir));
    if (out.model_bytes == 0) {
      auto c = Checkpoint::Open(ckpts[0]);
      if (c.ok()) out.model_bytes = (*c)->total_tensor_bytes();
    }
    const bool fault_runs = (s.faults.runs > 0 && s.faults.per_run > 0) ||
                            s.faults.process_runs > 0 || s.faults.proxy_runs > 0 ||
                            s.faults.s3_runs > 0;
    if (s.faults.enabled && fault_runs) {  // the faults block's runs, by the caller's fault tools
      if (!faults) {
        return FailedPreconditionError(
            "faults: this runner has no fault tools (the dcr CLI runs the faults block)");
      }
      DCR_RETURN_IF_ERROR(faults(s, rate, ckpts, work_dir, &run_index, &out));
    }
    if (s.faults.only) continue;
    // The change of every step, measured before any node starts; a delta run needs base and
    // target to have the same tensors (a full run does not).
    const bool any_delta =
        std::find(s.methods.begin(), s.methods.end(), Method::kDelta) != s.methods.end();
    std::vector<double> measured(s.steps + 1, 0.0);
    for (int step = 1; step <= s.steps; ++step) {
      auto m = MeasureChangeRate(ckpts[step - 1], ckpts[step]);
      if (m.ok()) {
        measured[step] = *m;
      } else if (any_delta || !m.status().IsFailedPrecondition()) {
        return m.status().WithContext("step " + std::to_string(step));
      } else {
        out.setup["change_rate.step" + std::to_string(step)] =
            "not measured (no delta can be built): " + m.status().ToString();
      }
    }
    // The full-checkpoint stream sends one safetensors file image: refused for a shard
    // directory before any node starts.
    if (std::find(s.methods.begin(), s.methods.end(), Method::kFull) != s.methods.end()) {
      for (int step = 1; step <= s.steps; ++step) {
        auto c = Checkpoint::Open(ckpts[step]);
        if (c.ok() && (*c)->sharded()) {
          return InvalidArgumentError("method full: " + ckpts[step] +
                                      " is a sharded checkpoint; the full stream sends one "
                                      "safetensors file: use methods: [delta]");
        }
      }
    }
    for (TransportKind transport : s.transport.kinds) {
      for (Method method : s.methods) {
        if (s.steps > 1) {  // one set of long-lived nodes for every step
          DCR_ASSIGN_OR_RETURN(std::vector<RunResult> runs,
                               RunLongLivedRefits(s, ckpts, method, transport, rate, measured,
                                                  ++run_index, work_dir, &out));
          for (RunResult& rr : runs) out.runs.push_back(std::move(rr));
          continue;
        }
        for (int step = 1; step <= s.steps; ++step) {
          DCR_ASSIGN_OR_RETURN(RunResult rr,
                               RunOneRefit(s, ckpts, method, transport, rate, measured[step], step,
                                           ++run_index, work_dir, &out, nullptr));
          out.runs.push_back(std::move(rr));
        }
      }
    }
  }
  return out;
}

StatusOr<ScenarioResult> RunScenarioReal(const Scenario& s, const FaultBlockRunner& faults,
                                         bool keep_work_dir) {
  if (s.network.emulation == WanEmulation::kNetns) {
    return UnimplementedError(
        "network.emulation: netns is set up by the netns test harness (tests/netns/); "
        "`dcr run` emulates the long link in the transport layer (emulation: transport)");
  }
  // A device that cannot be used is refused here, before the work dir or any node exists.
  DCR_RETURN_IF_ERROR(ProbeScenarioDevices(s));
  bool fresh = false;
  DCR_ASSIGN_OR_RETURN(const std::string work_dir, PrepareWorkDir(s, &fresh));
  StatusOr<ScenarioResult> r = RunScenarioRealIn(s, faults, work_dir);
  bool failed = !r.ok();
  if (r.ok()) {
    for (const RunResult& run : r->runs) {
      failed |= !run.error.empty() || run.receivers_verified != run.receivers;
    }
    failed |= r->faults.enabled &&
              (!r->faults.errors.empty() || r->faults.faults_survived != r->faults.faults_injected);
  }
  FinishWorkDir(work_dir, fresh, keep_work_dir, failed);
  if (r.ok() && fresh && !keep_work_dir) {
    r->setup["work_dir"] = work_dir + (failed ? " (removed but for its logs)" : " (removed)");
  }
  return r;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace dcr::cli
