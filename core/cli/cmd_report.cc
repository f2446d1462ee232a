// `dcr report RESULT.json|STATE_DIR... -o DIR`: tables (Markdown, CSV, JSON) and gnuplot figures
// (PNG, SVG) from run results, real or simulated, and node results (dcr::reports).
#ifdef DCR_HAVE_REPORTS
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "dcr/reports/report.h"

namespace dcr::cli {
namespace {

struct ReportArgs {
  std::vector<std::string> inputs;
  std::string out_dir;
  bool no_figures = false;
  std::string gnuplot = "gnuplot";
};

int RunReport(const ReportArgs& a) {
  auto report = reports::LoadResults(a.inputs);
  if (!report.ok()) return ReportStatus("report", report.status());
  reports::ReportOptions o;
  o.out_dir = a.out_dir;
  o.figures = !a.no_figures;
  o.gnuplot = a.gnuplot;
  Status st = reports::WriteReport(*report, o);
  if (!st.ok()) return ReportStatus("report", st);
  std::printf("%s", reports::RenderMarkdown(*report).c_str());
  std::printf("\nwrote %s/summary.{md,csv,json}%s\n", a.out_dir.c_str(),
              o.figures ? ", refit_time.{png,svg}, speedup.{png,svg}" : "");
  return 0;
}

const bool kRegistered = RegisterCommand(CommandSpec{
    "report", "Render run results (JSON from `dcr run --out`) as tables and figures",
    [](CLI::App* app) -> std::function<int()> {
      auto a = std::make_shared<ReportArgs>();
      app->add_option("results", a->inputs,
                      "result JSON files (real or simulated runs, node results), or a node's "
                      "state directory (its node-<rank>-v<k>.json, per deployment)")
          ->required()
          ->check(CLI::ExistingPath);
      app->add_option("-o,--out", a->out_dir, "output directory (created if missing)")->required();
      app->add_flag("--no-figures", a->no_figures, "tables only; do not run gnuplot");
      app->add_option("--gnuplot", a->gnuplot, "gnuplot program (default: gnuplot)");
      return [a]() { return RunReport(*a); };
    }});

}  // namespace
}  // namespace dcr::cli
#endif  // DCR_HAVE_REPORTS
