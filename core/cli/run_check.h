// `dcr run --check FILE`: gates a run's results against a user's thresholds, so that a CI job
// fails on a throughput or bit-exactness regression of the user's own model and cluster shape.
//
// FILE is YAML (JSON is YAML too), every key optional:
//   min_speedup: 3              each delta run's refit speedup over the full run of the same
//                               transport, change rate and step in the same result
//                               (SpeedupVsFull, dcr/scenario.h); needs methods [delta, full]
//   max_wire_bytes_per_receiver: 4MiB
//                               each delta run's long-link bytes (wire_bytes) / its receivers
//   verified: true              (default true) every run ended without error and every
//                               receiver verified byte for byte and committed
// Other keys are refused (a misspelt threshold would otherwise never be checked).
//
// Thread safety: pure functions.
#ifndef DCR_CORE_CLI_RUN_CHECK_H_
#define DCR_CORE_CLI_RUN_CHECK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "dcr/scenario.h"
#include "dcr/statusor.h"

namespace dcr::cli {

struct RunCheck {
  std::string file;                          // the check file's path (named in reports)
  double min_speedup = 0;                    // 0 = not checked
  uint64_t max_wire_bytes_per_receiver = 0;  // 0 = not checked
  bool verified = true;
};

// Reads the check file at `path`. Errors: kNotFound for a missing file, kInvalidArgument for a
// file that does not parse, an unknown key, or a threshold that is not positive.
StatusOr<RunCheck> LoadRunCheck(const std::string& path);

// Whether `s` can produce what `check` gates, said before the run starts. Errors:
// kInvalidArgument for min_speedup without both methods (delta and full) in the scenario, or
// max_wire_bytes_per_receiver without the delta method.
Status ValidateRunCheck(const RunCheck& check, const Scenario& s);

// One gated quantity of one run (a JUnit test case).
struct CheckOutcome {
  std::string name;    // e.g. "delta/relay_tree/step 1: speedup >= 3x"
  double seconds = 0;  // the run's refit time
  bool passed = false;
  std::string message;  // what was measured, and on a miss why it misses
};

// Every check of `check` on every run of `r`, in run order. A run that failed is a miss of
// `verified` (when checked) and of each threshold it could not be measured for.
std::vector<CheckOutcome> EvaluateRunCheck(const RunCheck& check, const ScenarioResult& r);

// A JUnit XML report (one <testsuite> named `suite`, one <testcase> per outcome; a miss has a
// <failure> with its message), as CI systems read them.
std::string RunCheckJUnit(const std::string& suite, const std::vector<CheckOutcome>& outcomes);

// Reports `outcomes` of `check`: writes their JUnit XML (suite `suite`) beside the result JSON
// `json_path` (JUnitPathFor), prints each miss on stderr ("dcr run --check: MISS <case>: <why>")
// and a summary line naming the XML. Returns whether every outcome passed and the XML was
// written (a write failure is printed as an error).
bool ReportRunCheck(const RunCheck& check, const std::string& json_path, const std::string& suite,
                    const std::vector<CheckOutcome>& outcomes);

// Where the JUnit XML goes beside the result JSON `json_path`: its name with the extension
// ".json" replaced by (or, without it, followed by) ".junit.xml".
std::string JUnitPathFor(const std::string& json_path);

}  // namespace dcr::cli

#endif  // DCR_CORE_CLI_RUN_CHECK_H_
