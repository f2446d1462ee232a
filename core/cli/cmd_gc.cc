// `dcr gc`: retention and garbage collection within a disk budget, for an operator.
//   dcr gc --store SPEC [--root PREFIX] ...   an object store's version objects (dcr/retention.h)
//   dcr gc --work-dir DIR ...                 a `dcr run` work dir's run folders (below)
// Both: --keep N versions (or run folders), --budget SIZE, --dry-run, --json FILE (the report).
// A store of signed versions needs --trust KEY (the trainer's public key; the deployment id in
// the file "deployment" beside it, when there is one, must be named by every final manifest):
// only versions the trainer signed count; unsigned tombstones, headers and fake versions are
// listed as "unsigned" and left alone.
// Exit 0 when the budget is met (or none is set), 19 when it cannot be without removing what is
// needed (nothing needed is removed), 10 + code for other errors.
//
// A work dir's run folders (run-<N>: the node plans, results, receivers' state directories with
// their journals and storage mappings, the in-region store copy) are removed whole, oldest
// first. Needed (never removed): the newest run folder (the `dcr run` that made it may still be
// reading it) and any folder a live process names on its command line (a node of a long-lived
// run). A folder is first renamed to .gc-run-<N> (atomic), then deleted: a collection killed
// midway leaves a .gc-* folder, which the next one finishes, and never a half-deleted run-<N>.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "command.h"
#include "dcr/checkpoint.h"
#include "dcr/object_store.h"
#include "dcr/retention.h"
#include "dcr/scenario.h"
#include "dcr/signing.h"
#include "dcr/status_macros.h"
#include "transport/tls.h"

namespace dcr::cli {
namespace {

struct GcArgs {
  std::string store;
  std::string work_dir;
  std::string root;
  std::string trust;
  int keep = 2;
  std::string budget;
  int64_t committed = -1;
  int64_t oldest_held = -1;
  bool dry_run = false;
  std::string json;
  int64_t fault_kill_after = -1;
};

// Disk bytes (allocated blocks) under `path`, symlinks not followed.
uint64_t DiskBytes(const std::string& path) {
  uint64_t total = 0;
  std::error_code ec;
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) total += static_cast<uint64_t>(st.st_blocks) * 512;
  for (auto it = std::filesystem::recursive_directory_iterator(
           path, std::filesystem::directory_options::skip_permission_denied, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (lstat(it->path().c_str(), &st) == 0) total += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return total;
}

// Whether any process's command line names a path under `dir`.
bool InUse(const std::string& dir) {
  const std::string needle = dir + "/";
  DIR* d = opendir("/proc");
  if (d == nullptr) return true;  // cannot tell: treat as in use
  bool used = false;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream f(std::string("/proc/") + e->d_name + "/cmdline", std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    if (ss.str().find(needle) != std::string::npos) {
      used = true;
      break;
    }
  }
  closedir(d);
  return used;
}

struct RunDir {
  std::string name;
  long index = -1;
  bool pending = false;  // .gc-run-<N>: a removal to finish
  uint64_t bytes = 0;
  std::string decision, why;
};

Status CollectWorkDir(const GcArgs& a, uint64_t budget, nlohmann::ordered_json* out) {
  std::error_code ec;
  const std::string root = std::filesystem::absolute(a.work_dir, ec).lexically_normal().string();
  if (ec) return InvalidArgumentError("--work-dir " + a.work_dir + ": " + ec.message());
  DIR* d = opendir(root.c_str());
  if (d == nullptr) return ErrnoError("--work-dir " + root, errno);
  std::vector<RunDir> runs;
  uint64_t total = DiskBytes(root);
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    RunDir r;
    r.pending = n.rfind(".gc-run-", 0) == 0;
    const std::string num = r.pending ? n.substr(8) : n.rfind("run-", 0) == 0 ? n.substr(4) : "";
    if (num.empty() || num.find_first_not_of("0123456789") != std::string::npos) continue;
    r.name = n;
    r.index = std::stol(num);
    r.bytes = DiskBytes(root + "/" + n);
    runs.push_back(r);
  }
  closedir(d);
  std::sort(runs.begin(), runs.end(),
            [](const RunDir& x, const RunDir& y) { return x.index < y.index; });
  long newest = -1;
  for (const RunDir& r : runs) {
    if (!r.pending) newest = std::max(newest, r.index);
  }
  int kept = 0;
  uint64_t needed = 0, after = total;
  for (auto it = runs.rbegin(); it != runs.rend(); ++it) {  // newest first
    RunDir& r = *it;
    if (r.pending) {
      r.decision = "removed", r.why = "an interrupted removal, finished";
    } else if (r.index == newest) {
      r.decision = "needed", r.why = "the newest run folder (its dcr run may still read it)";
    } else if (InUse(root + "/" + r.name)) {
      r.decision = "needed", r.why = "a live process uses it";
    } else if (kept + 1 < a.keep) {  // the newest counts as one of the kept
      r.decision = "kept", r.why = "among the newest " + std::to_string(a.keep);
      ++kept;
    } else {
      r.decision = "removed", r.why = "older than the newest " + std::to_string(a.keep);
    }
    if (r.decision == "needed") needed += r.bytes;
    if (r.decision == "removed") after -= r.bytes;
  }
  for (RunDir& r : runs) {  // oldest first
    if (budget == 0 || after <= budget) break;
    if (r.decision != "kept") continue;
    r.decision = "removed", r.why = "over the budget of " + std::to_string(budget) + " bytes";
    after -= r.bytes;
  }
  std::string budget_error;
  if (budget > 0 && after > budget) {
    budget_error = "budget of " + std::to_string(budget) +
                   " bytes cannot be met: " + std::to_string(after) + " bytes remain, of which " +
                   std::to_string(needed) + " are run folders that are needed and " +
                   std::to_string(after - needed) + " are outside run folders (checkpoints)";
  }
  uint64_t removed_bytes = 0;
  int64_t removals = 0;
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (RunDir& r : runs) {
    if (r.decision == "removed" && !a.dry_run) {
      std::string path = root + "/" + r.name;
      if (!r.pending) {
        const std::string doomed = root + "/.gc-run-" + std::to_string(r.index);
        if (rename(path.c_str(), doomed.c_str()) != 0) return ErrnoError("rename " + path, errno);
        path = doomed;
      }
      std::filesystem::remove_all(path, ec);
      if (ec) return InternalError("removing " + path + ": " + ec.message());
      removed_bytes += r.bytes;
      if (a.fault_kill_after >= 0 && ++removals >= a.fault_kill_after) ::raise(SIGKILL);
    }
    list.push_back({{"dir", r.name}, {"bytes", r.bytes}, {"decision", r.decision}, {"why", r.why}});
  }
  (*out)["work_dir"] = root;
  (*out)["bytes_before"] = total;
  (*out)["bytes_after"] = after;
  (*out)["needed_bytes"] = needed;
  (*out)["removed_bytes"] = a.dry_run ? 0 : removed_bytes;
  (*out)["budget_error"] = budget_error;
  (*out)["runs"] = list;
  for (const RunDir& r : runs) {
    std::printf("  %-12s %12llu bytes  %-7s  %s\n", r.name.c_str(),
                static_cast<unsigned long long>(r.bytes), r.decision.c_str(), r.why.c_str());
  }
  return budget_error.empty() ? Status() : ResourceExhaustedError(budget_error);
}

Status CollectStoreCmd(const GcArgs& a, uint64_t budget, nlohmann::ordered_json* out) {
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<ObjectStore> store, OpenObjectStore(a.store));
  RetentionOptions o;
  o.root = a.root;
  o.keep_versions = a.keep;
  o.budget_bytes = budget;
  if (a.committed >= 0) o.committed = static_cast<uint64_t>(a.committed);
  if (a.oldest_held >= 0) o.oldest_held = static_cast<uint64_t>(a.oldest_held);
  o.dry_run = a.dry_run;
  if (!a.trust.empty()) {
    DCR_ASSIGN_OR_RETURN(o.trust, TrustKey::Load(a.trust));
    const size_t slash = a.trust.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : a.trust.substr(0, slash);
    std::ifstream in(dir + "/deployment");
    std::string id;
    if (in >> id) {
      auto run_id = internal::RunIdValue(id);
      if (!run_id.ok()) return run_id.status().WithContext(dir + "/deployment");
      o.run_id = *run_id;
    }
  }
  if (a.fault_kill_after >= 0) {
    o.after_delete = [n = a.fault_kill_after](int64_t deletes) {
      if (deletes >= n) ::raise(SIGKILL);
    };
  }
  RetentionReport rep;
  Status s = CollectStore(store.get(), o, &rep);
  *out = nlohmann::ordered_json::parse(RetentionReportToJson(rep));
  (*out)["store"] = store->Describe();
  for (const RetainedVersion& v : rep.versions) {
    std::printf("  %-40s v%llu%s %8llu objects %12llu bytes  %-8s  %s\n", v.prefix.c_str(),
                static_cast<unsigned long long>(v.target), v.full_frame ? " (full)" : "",
                static_cast<unsigned long long>(v.objects),
                static_cast<unsigned long long>(v.bytes), v.decision.c_str(), v.why.c_str());
  }
  return s;
}

int RunGc(const GcArgs& a) {
  if (a.store.empty() == a.work_dir.empty()) {
    return ReportStatus("gc", InvalidArgumentError("give exactly one of --store and --work-dir"));
  }
  if (a.keep < 1 && !a.work_dir.empty()) {
    return ReportStatus("gc", InvalidArgumentError("--keep: at least 1 run folder"));
  }
  uint64_t budget = 0;
  if (!a.budget.empty()) {
    auto b = ParseSize(a.budget, "--budget");
    if (!b.ok()) return ReportStatus("gc", b.status());
    budget = *b;
  }
  nlohmann::ordered_json out;
  Status s = a.store.empty() ? CollectWorkDir(a, budget, &out) : CollectStoreCmd(a, budget, &out);
  if (!out.is_null()) {
    std::printf("gc: %llu bytes before, %llu after (%llu needed), %llu removed%s\n",
                static_cast<unsigned long long>(out.value("bytes_before", uint64_t{0})),
                static_cast<unsigned long long>(out.value("bytes_after", uint64_t{0})),
                static_cast<unsigned long long>(out.value("needed_bytes", uint64_t{0})),
                static_cast<unsigned long long>(out.value("removed_bytes", uint64_t{0})),
                a.dry_run ? " (dry run: nothing deleted)" : "");
  }
  if (!a.json.empty() && !out.is_null()) {
    out["ok"] = s.ok();
    out["error"] = s.ok() ? "" : s.ToString();
    const std::string text = out.dump(2) + "\n";
    Status w = WriteFileAtomic(a.json, text.data(), text.size());
    if (!w.ok()) return ReportStatus("gc", w);
  }
  return ReportStatus("gc", s);
}

}  // namespace

DCR_REGISTER_COMMAND(
    "gc",
    "Remove old versions from an object store (--store) or old run folders from a dcr run work "
    "dir (--work-dir) within a disk budget, never what a live receiver or a catch-up needs",
    [](CLI::App* app) {
      auto a = std::make_shared<GcArgs>();
      app->add_option("--store", a->store,
                      "object store: dir:/path, s3://bucket?endpoint=... (as the scenario's)");
      app->add_option("--work-dir", a->work_dir, "a dcr run work dir (model.work_dir)");
      app->add_option("--root", a->root, "store: only the versions under this key prefix");
      app->add_option("--trust", a->trust,
                      "store: the trainer's public key (trainer.pub; required for a store of "
                      "signed versions): only versions it signed count, anything else is left "
                      "alone; a deployment file beside it names the deployment");
      app->add_option("--keep", a->keep, "versions (run folders) to keep while the budget allows")
          ->capture_default_str();
      app->add_option("--budget", a->budget, "most bytes to leave (e.g. 10GiB; default: none)");
      app->add_option("--committed", a->committed,
                      "store: the newest committed version (default: the newest complete one)");
      app->add_option("--oldest-held", a->oldest_held,
                      "store: the oldest version a live receiver holds (its catch-up chain is "
                      "kept; default: every live receiver holds the committed version)");
      app->add_flag("--dry-run", a->dry_run, "decide and report; delete nothing");
      app->add_option("--json", a->json, "write the report (what was removed, kept, why) here");
      app->add_option("--fault-kill-after-deletes", a->fault_kill_after,
                      "fault point for tests: SIGKILL this process after N deletes")
          ->group("");
      return [a]() { return RunGc(*a); };
    });

}  // namespace dcr::cli
