// dcr run SCENARIO.yaml [--out RESULT.json]: runs a scenario for real (mode: real) or simulated
// (mode: sim, when built with SimGrid); prints a Markdown table and writes the result JSON.
#include <cstdio>
#include <memory>

#include "command.h"
#include "dcr/checkpoint.h"
#include "dcr/scenario.h"
#include "dcr/status_macros.h"
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
  bool quiet = false;
};

StatusOr<ScenarioResult> Execute(const Scenario& s) {
  if (s.mode == RunMode::kSim) {
#ifdef DCR_RUN_HAS_SIM
    return dcr::sim::Simulate(s, dcr::sim::SimOptions{});
#else
    return UnimplementedError(
        "mode: sim needs the simulator, which is not built (install SimGrid >= 3.32, "
        "libsimgrid-dev, and configure with -DDCR_BUILD_SIM=ON)");
#endif
  }
  return RunScenarioReal(s);
}

int RunMain(const RunArgs& a) {
  auto s = LoadScenario(a.scenario);
  if (!s.ok()) return ReportStatus("run", s.status());
  if (a.quiet) s->progress = false;
  auto r = Execute(*s);
  if (!r.ok()) return ReportStatus("run", r.status());
  std::fputs(ResultToMarkdown(*r).c_str(), stdout);
  if (!a.out.empty()) {
    std::string js = ResultToJson(*r);
    Status w = WriteFileAtomic(a.out, js.data(), js.size());
    if (!w.ok()) return ReportStatus("run", w);
  }
  bool failed = false;
  for (const auto& run : r->runs) {
    if (!run.error.empty()) {
      std::fprintf(stderr, "dcr run: %s / %s / step %d failed: %s\n", MethodName(run.method),
                   TransportKindName(run.transport), run.step, run.error.c_str());
    }
    failed |= !run.error.empty() || run.receivers_verified != run.receivers;
  }
  if (failed) {
    std::fprintf(stderr, "dcr run: a run failed or was not verified on every receiver\n");
    return 1;
  }
  if (r->faults.enabled && (!r->faults.errors.empty() ||
                            r->faults.faults_survived != r->faults.faults_injected)) {
    std::fprintf(stderr, "dcr run: a fault-injection run did not end bit-exact and committed\n");
    return 1;
  }
  return 0;
}

}  // namespace

DCR_REGISTER_COMMAND(
    "run",
    "Run a scenario (scenarios/README.md): real processes on this machine or a simulation; "
    "prints a Markdown table, --out writes the result JSON. Exit 1 if a run failed or a "
    "receiver was not verified",
    [](CLI::App* app) {
      auto a = std::make_shared<RunArgs>();
      app->add_option("scenario", a->scenario, "Scenario YAML file")->required();
      app->add_option("--out,-o", a->out, "Write the result JSON here");
      app->add_flag("--quiet,-q", a->quiet, "No progress display");
      return [a]() { return RunMain(*a); };
    });

}  // namespace dcr::cli
