// `dcr bench pipeline`: calibration of the simulator from the real sender and receiver code paths
// (BuildDelta, the delta receiver's ApplyRecord, the full-checkpoint receiver) on the checkpoints a
// scenario's real run uses (synthesised once, shared with `dcr run`). The JSON has the keys of
// sim/engine/calibration.h (memcpy_bytes_per_s, rates[].encode_bytes_per_s,
// rates[].decode_apply_bytes_per_s and their *_wall_* variants) plus the raw timings.
#ifndef DCR_BENCH_LIB_BENCH_PIPELINE_H_
#define DCR_BENCH_LIB_BENCH_PIPELINE_H_

#include <functional>
#include <string>
#include <vector>

#include "dcr/scenario.h"
#include "dcr/statusor.h"

namespace dcr::cli {

// The checkpoints a scenario's run uses at one change rate: paths[0] the base, paths[k] the
// version after step k, synthesized under `work_dir` or the scenario's own (what `dcr run` uses).
using PrepareCheckpointsFn = std::function<StatusOr<std::vector<std::string>>(
    const Scenario& s, double rate, const std::string& work_dir)>;

struct PipelineBenchConfig {
  std::string scenario_path;
  int reps = 3;
  // Required: where the timed checkpoints come from.
  PrepareCheckpointsFn prepare_checkpoints;
};

// The calibration JSON text. Errors: kInvalidArgument without `prepare_checkpoints`; scenario
// parse errors, checkpoint synthesis / codec errors.
StatusOr<std::string> RunPipelineBench(const PipelineBenchConfig& cfg,
                                       const std::function<void(const std::string&)>& log);

}  // namespace dcr::cli

#endif  // DCR_BENCH_LIB_BENCH_PIPELINE_H_
