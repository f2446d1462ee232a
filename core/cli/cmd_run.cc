// dcr run SCENARIO.yaml [--out RESULT.json] [--check FILE]: runs a scenario for real (mode: real)
// or simulated (mode: sim, when built with SimGrid); prints a Markdown table and writes the result
// JSON; with --check, gates the results against FILE's thresholds (run_check.h) and writes the
// JUnit XML beside the JSON.
#include <cstdio>
#include <memory>

#include "command.h"
#include "dcr/checkpoint.h"
#include "dcr/scenario.h"
#include "dcr/status_macros.h"
#include "fault_runs.h"
#include "run_check.h"
#include "run_real.h"

#if defined(DCR_HAVE_SIM) && __has_include("dcr/sim/sim.h")
#include "dcr/sim/sim.h"
#define DCR_RUN_HAS_SIM 1
#endif

namespace dcr::cli {
namespace {

struct RunArgs {
  std::string scenario;
  std::string out;
  std::string check;  // thresholds file (run_check.h); "" = none
  bool quiet = false;
  bool keep_work_dir = false;  // keep the fresh work dir (no model.work_dir) after the run
};

StatusOr<ScenarioResult> Execute(const Scenario& s, bool keep_work_dir) {
  if (s.mode == RunMode::kSim) {
#ifdef DCR_RUN_HAS_SIM
    return dcr::sim::Simulate(s, dcr::sim::SimOptions{});
#else
    return UnimplementedError(
        "mode: sim needs the simulator, which is not built (install SimGrid >= 3.32, "
        "libsimgrid-dev, and configure with -DDCR_BUILD_SIM=ON)");
#endif
  }
  return RunScenarioReal(s, RunScenarioFaultBlock, keep_work_dir);
}

int RunMain(const RunArgs& a) {
  auto s = LoadScenario(a.scenario);
  if (!s.ok()) return ReportStatus("run", s.status());
  if (!s->model.base.empty()) {
    return ReportStatus(
        "run", InvalidArgumentError("model.base: a deployment whose versions a trainer hands "
                                    "(dcr-node SCENARIO, dcr/publisher_c.h); `dcr run` needs "
                                    "model.checkpoints or a preset"));
  }
  if (a.quiet) s->progress = false;
  // The thresholds are read and matched with the scenario before the run, which may be long.
  RunCheck check;
  if (!a.check.empty()) {
    if (a.out.empty()) {
      return ReportStatus("run", InvalidArgumentError("--check needs --out RESULT.json (the JUnit "
                                                      "XML is written beside it)"));
    }
    auto c = LoadRunCheck(a.check);
    if (!c.ok()) return ReportStatus("run", c.status());
    Status v = ValidateRunCheck(*c, *s);
    if (!v.ok()) return ReportStatus("run", v);
    check = *c;
  }
  auto r = Execute(*s, a.keep_work_dir);
  if (!r.ok()) {
    if (!a.check.empty()) {
      // The run itself failed: one failing case, so that CI reads why.
      CheckOutcome o;
      o.name = "run";
      o.message = r.status().ToString();
      ReportRunCheck(check, a.out, s->name, {o});
    }
    return ReportStatus("run", r.status());
  }
  std::fputs(ResultToMarkdown(*r).c_str(), stdout);
  if (!a.out.empty()) {
    std::string js = ResultToJson(*r);
    Status w = WriteFileAtomic(a.out, js.data(), js.size());
    if (!w.ok()) return ReportStatus("run", w);
  }
  bool failed = false;
  if (!a.check.empty() && !ReportRunCheck(check, a.out, s->name, EvaluateRunCheck(check, *r))) {
    failed = true;
  }
  for (const auto& run : r->runs) {
    if (!run.error.empty()) {
      std::fprintf(stderr, "dcr run: %s / %s / step %d failed: %s\n", MethodName(run.method),
                   TransportKindName(run.transport), run.step, run.error.c_str());
    }
    failed |= !run.error.empty() || run.receivers_verified != run.receivers;
  }
  if (failed) {
    std::fprintf(stderr,
                 "dcr run: a run failed, was not verified on every receiver, or missed a "
                 "--check threshold\n");
    return 1;
  }
  if (r->faults.enabled &&
      (!r->faults.errors.empty() || r->faults.faults_survived != r->faults.faults_injected)) {
    std::fprintf(stderr, "dcr run: a fault-injection run did not end bit-exact and committed\n");
    return 1;
  }
  return 0;
}

}  // namespace

DCR_REGISTER_COMMAND(
    "run",
    "Run a scenario (scenarios/README.md): real processes on this machine or a simulation; "
    "prints a Markdown table, --out writes the result JSON, --check FILE gates the results "
    "against thresholds and writes JUnit XML beside the JSON. Exit 1 if a run failed, a "
    "receiver was not verified or a threshold was missed",
    [](CLI::App* app) {
      auto a = std::make_shared<RunArgs>();
      app->add_option("scenario", a->scenario, "Scenario YAML file")->required();
      app->add_option("--out,-o", a->out, "Write the result JSON here");
      app->add_option("--check", a->check,
                      "Thresholds (YAML: min_speedup, max_wire_bytes_per_receiver, verified) the "
                      "results must meet; JUnit XML goes beside --out (RESULT.junit.xml)");
      app->add_flag("--quiet,-q", a->quiet, "No progress display");
      app->add_flag("--keep-work-dir", a->keep_work_dir,
                    "Keep the work dir of a scenario without model.work_dir (a fresh "
                    "$TMPDIR/dcr-run-* dir, removed after the run by default; after a failed run "
                    "but for its logs)");
      return [a]() { return RunMain(*a); };
    });

}  // namespace dcr::cli
