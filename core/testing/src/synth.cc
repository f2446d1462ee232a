// SynthesizeCheckpoints: a SynthTrainer over a preset's inventory, one safetensors file or
// shard directory per step.
#include "dcr/testing/synth.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <system_error>

#include "dcr/checkpoint.h"
#include "dcr/status_macros.h"

namespace dcr {

StatusOr<std::vector<std::string>> SynthesizeCheckpoints(const SynthOptions& options,
                                                         const std::string& out_dir,
                                                         const ProgressFn& progress) {
  DCR_ASSIGN_OR_RETURN(ModelConfig base, GetPreset(options.preset));
  if (options.depth_div < 1 || options.width_div < 1 || options.expert_div < 1)
    return InvalidArgumentError("synth: scale divisors must be >= 1");
  const ModelConfig cfg =
      ScaleModel(base, options.depth_div, options.width_div, options.expert_div);
  if (out_dir.empty()) return InvalidArgumentError("synth: empty output directory");
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return InvalidArgumentError("synth: cannot create '" + out_dir + "': " + ec.message());
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<SynthTrainer> trainer,
                       SynthTrainer::Create(ModelInventory(cfg), options, progress));
  char lr_text[32];
  std::snprintf(lr_text, sizeof(lr_text), "%.9g", trainer->lr());
  std::vector<std::string> paths;
  for (int k = 0; k < options.steps; ++k) {
    std::string note;
    if (k > 0) {
      trainer->Step(progress);
      char buf[64];
      std::snprintf(buf, sizeof(buf), " (%.3f%% of BF16 elements changed)",
                    100.0 * static_cast<double>(trainer->last_changed()) /
                        static_cast<double>(trainer->bf16_elements()));
      note = buf;
    }
    const std::string stem = "step" + std::to_string(k);
    const std::string path =
        (std::filesystem::path(out_dir) / (options.shard_bytes > 0 ? stem : stem + ".safetensors"))
            .string();
    std::map<std::string, std::string> meta = {
        {"dcr.preset", cfg.name},
        {"dcr.seed", std::to_string(options.seed)},
        {"dcr.step", std::to_string(k)},
        {"dcr.optimizer_step", std::to_string(trainer->optimizer_steps())},
        {"dcr.lr", lr_text},
    };
    if (options.shard_bytes > 0) {
      DCR_RETURN_IF_ERROR(
          WriteShardedCheckpoint(path, trainer->Views(), options.shard_bytes, meta));
    } else {
      DCR_RETURN_IF_ERROR(WriteSafetensors(path, trainer->Views(), meta));
    }
    paths.push_back(path);
    if (progress)
      progress(static_cast<uint64_t>(k + 1), static_cast<uint64_t>(options.steps),
               "wrote " + path + note);
  }
  return paths;
}

}  // namespace dcr
