// dcr::reports: run results (the JSON of `dcr run --out`, real or simulated) -> tables and figures.
//
// Input schema: top level `scenario`, `mode` ("real" | "sim"), `model`, `runs`:
// [{method ("delta" | "full"), transport ("object_store" | "relay_tree"), change_rate,
//   refit_seconds, wire_bytes, receivers, receivers_verified}, ...]. Optional top-level objects
// `setup` (hardware, compiler, commit, ...) and `calibration` are copied into the report's setup
// section. Unknown keys are ignored.
//
// Node results are read too: the JSON a node writes (`dcr-node --result`, and each version's
// result in a long-lived node's state directory, <state>/node-<rank>-v<k>.json): top level `rank`,
// `role` and `ok` (no `scenario`); each becomes a row of the nodes table (NodeRow).
//
// Metrics (defined once, here): refit time = first chunk built to last receiver committed;
// speedup = refit time of the full checkpoint / refit time of the delta, same result file, same
// transport; effective bandwidth = dense checkpoint bytes / refit time when `dense_bytes` is given;
// delta ratio = full wire bytes / delta wire bytes.
//
// Thread safety: pure functions, except WriteReport which writes files (temp + rename).
#ifndef DCR_REPORTS_INCLUDE_DCR_REPORTS_REPORT_H_
#define DCR_REPORTS_INCLUDE_DCR_REPORTS_REPORT_H_

#include <string>
#include <vector>

#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr::reports {

struct ReportRow {
  std::string source;  // result file
  std::string scenario;
  std::string mode;
  std::string model;
  std::string method;
  std::string transport;
  double change_rate = 0;             // measured (the result's change_rate)
  double configured_change_rate = 0;  // the synthetic trainer's input; 0 if absent
  double refit_seconds = 0;
  double wire_bytes = 0;
  int64_t receivers = 0;
  int64_t receivers_verified = 0;
  double speedup = 0;  // delta rows: full / delta of the same file+transport+rates; 0 if unknown
  double delta_ratio = 0;  // delta rows: full wire bytes / delta wire bytes; 0 if unknown
};

struct ResultSetup {
  std::string source;
  std::string scenario;
  std::string text;  // "key: value" lines of `setup` and `calibration` summaries
};

// One node result: what the node says of itself.
struct NodeRow {
  std::string source;  // result file
  int64_t rank = 0;
  std::string role;  // sender, relay, receiver, uploader, downloader
  bool ok = false;
  bool verified = false;  // its committed checkpoint compared byte for byte with the target
  double seconds = 0;     // t_commit - t_start; 0 when the node committed nothing
  double bytes_received = 0;
  double bytes_sent = 0;
  int64_t receivers_committed = 0;  // sender: receivers that reported committing
  std::string declared_dead;        // sender: "rank: why" entries, "; "-separated
  std::string error;                // "" when ok
};

struct Report {
  std::vector<ReportRow> rows;
  std::vector<ResultSetup> setups;
  std::vector<NodeRow> nodes;
};

// Parses result files. A path that is a directory stands for the node results in it: a node's
// state directory (`dcr-node --state`, a publisher's state_dir), whose per-version results
// node-<rank>-v<k>.json live in its deployment-<id>/ directories (NodeResultsIn). kNotFound for
// an unreadable file or a directory without node results, kInvalidArgument naming the file and
// key of a malformed one.
StatusOr<Report> LoadResults(const std::vector<std::string>& paths);
// The node results (node-<rank>-v<k>.json) in directory `dir` and in its deployment-*
// directories: each directory's in order of rank, then version; `dir`'s own first, then the
// deployments' by name. Errors: kNotFound naming `dir` when it cannot be read.
StatusOr<std::vector<std::string>> NodeResultsIn(const std::string& dir);
// Parses one result JSON text, a run's or a node's (`source` names it in errors and rows).
Status AddResult(const std::string& json_text, const std::string& source, Report* report);
// Fills speedup and delta_ratio of delta rows.
void ComputeDerived(Report* report);

std::string RenderMarkdown(const Report& report);
std::string RenderCsv(const Report& report);
std::string RenderJson(const Report& report);
// The nodes table as CSV (header line, then one line per NodeRow).
std::string RenderNodesCsv(const Report& report);

struct ReportOptions {
  std::string out_dir;              // created if missing
  bool figures = true;              // run gnuplot for PNG + SVG figures
  std::string gnuplot = "gnuplot";  // program name or path
};

// Writes out_dir/summary.{md,csv,json} (summary.md and .json with the nodes table), nodes.csv
// when node results were read, and, with figures, refit_time.{png,svg} and
// speedup.{png,svg} (plus their .dat/.gp sources). Each file is written to a temporary name and
// renamed. kUnavailable if gnuplot fails (tables are still written).
Status WriteReport(const Report& report, const ReportOptions& options);

}  // namespace dcr::reports

#endif  // DCR_REPORTS_INCLUDE_DCR_REPORTS_REPORT_H_
