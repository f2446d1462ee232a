// `dcr sim SCENARIO.yaml [--out RESULT.json]`: simulates a scenario on SimGrid (dcr::sim), whatever
// its `mode`; `dcr run` with `mode: sim` does the same. Prints the Markdown table; writes the
// result JSON (same schema as real runs) atomically.
#ifdef DCR_HAVE_SIM
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "command.h"
#include "dcr/checkpoint.h"
#include "dcr/scenario.h"
#include "dcr/sim/sim.h"

namespace dcr::cli {
namespace {

struct SimArgs {
  std::string scenario;
  std::string out;
  std::string calibration;
  bool quiet = false;
};

int RunSim(const SimArgs& a) {
  auto s = LoadScenario(a.scenario);
  if (!s.ok()) return ReportStatus("sim", s.status());
  sim::SimOptions o;
  o.calibration_path = a.calibration;
  o.progress = !a.quiet;
  auto t0 = std::chrono::steady_clock::now();
  auto r = sim::Simulate(*s, o);
  if (!r.ok()) return ReportStatus("sim", r.status());
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s", ResultToMarkdown(*r).c_str());
  std::printf("\nsimulated in %.2f s wall\n", wall);
  if (!a.out.empty()) {
    const std::string js = ResultToJson(*r);
    Status w = WriteFileAtomic(a.out, js.data(), js.size());
    if (!w.ok()) return ReportStatus("sim", w);
  }
  for (const RunResult& run : r->runs) {
    if (!run.error.empty() || run.receivers_verified != run.receivers) return 1;
  }
  return 0;
}

const bool kRegistered = RegisterCommand(CommandSpec{
    "sim", "Simulate a scenario on SimGrid (same result schema as `dcr run`)",
    [](CLI::App* app) -> std::function<int()> {
      auto a = std::make_shared<SimArgs>();
      app->add_option("scenario", a->scenario, "scenario YAML (scenarios/README.md)")
          ->required()
          ->check(CLI::ExistingFile);
      app->add_option("-o,--out", a->out, "write the result JSON here");
      app->add_option("--calibration", a->calibration,
                      "calibration JSON from `dcr bench codec --json` (default: the scenario's "
                      "sim.calibration, relative to the scenario file, else "
                      "share/dcr/calibration/default.json beside this binary)");
      app->add_flag("-q,--quiet", a->quiet, "no progress lines");
      return [a]() { return RunSim(*a); };
    }});

}  // namespace
}  // namespace dcr::cli
#endif  // DCR_HAVE_SIM
