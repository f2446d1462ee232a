// `dcr synth`: consecutive synthetic BF16 checkpoints of a model preset at a requested change rate.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "command.h"
#include "dcr/testing/synth.h"
#include "progress_line.h"

namespace dcr::cli {
namespace {

struct SynthFlags {
  std::string preset = "tiny";
  std::string scale;
  int64_t depth_div = 1, width_div = 1, expert_div = 1;
  std::string rate = "3%";
  int steps = 2;
  uint64_t seed = 1;
  double lr = 0;
  int warmup = 10;
  int threads = 0;
  double snr = 0.1;
  uint64_t shard_bytes = 0;
  std::string out;
  bool list = false;
  bool quiet = false;
};

// "3%" -> 0.03, "0.03" -> 0.03.
bool ParseRate(const std::string& text, double* rate) {
  try {
    size_t used = 0;
    double v = std::stod(text, &used);
    std::string rest = text.substr(used);
    if (rest == "%") {
      v /= 100.0;
    } else if (!rest.empty()) {
      return false;
    }
    *rate = v;
    return true;
  } catch (...) {
    return false;
  }
}

bool ParseScale(const std::string& text, SynthFlags* f) {
  int64_t d = 0, w = 0, e = 0;
  char tail = 0;
  int n = std::sscanf(text.c_str(), "%ld,%ld,%ld%c", &d, &w, &e, &tail);
  if (n == 2) e = 1;
  if ((n != 2 && n != 3) || d < 1 || w < 1 || e < 1) return false;
  f->depth_div = d;
  f->width_div = w;
  f->expert_div = e;
  return true;
}

std::string HumanCount(double x) {
  char buf[32];
  if (x >= 1e12) {
    std::snprintf(buf, sizeof(buf), "%.3fT", x / 1e12);
  } else if (x >= 1e9) {
    std::snprintf(buf, sizeof(buf), "%.2fB", x / 1e9);
  } else if (x >= 1e6) {
    std::snprintf(buf, sizeof(buf), "%.2fM", x / 1e6);
  } else {
    std::snprintf(buf, sizeof(buf), "%.0f", x);
  }
  return buf;
}

std::string HumanBytes(double b) {
  char buf[32];
  if (b >= 1e12) {
    std::snprintf(buf, sizeof(buf), "%.2f TB", b / 1e12);
  } else if (b >= 1e9) {
    std::snprintf(buf, sizeof(buf), "%.2f GB", b / 1e9);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f MB", b / 1e6);
  }
  return buf;
}

int ListPresets(const SynthFlags& f) {
  std::printf("%-32s %10s %8s %6s %6s %8s %12s %s\n", "preset", "params", "size", "layers",
              "hidden", "experts", "tensors", "attention");
  for (const auto& name : PresetNames()) {
    ModelConfig c = ScaleModel(GetPreset(name).value(), f.depth_div, f.width_div, f.expert_div);
    auto inv = ModelInventory(c);
    uint64_t params = 0, bytes = 0;
    for (const auto& t : inv) {
      params += t.num_elements();
      bytes += t.nbytes();
    }
    std::printf("%-32s %10s %8s %6ld %6ld %8ld %12zu %s\n", c.name.c_str(),
                HumanCount(static_cast<double>(params)).c_str(),
                HumanBytes(static_cast<double>(bytes)).c_str(), static_cast<long>(c.layers),
                static_cast<long>(c.hidden), static_cast<long>(c.experts), inv.size(),
                c.is_mla() ? "MLA" : "GQA");
  }
  return 0;
}

int Run(const SynthFlags& f) {
  SynthFlags flags = f;
  if (!flags.scale.empty() && !ParseScale(flags.scale, &flags)) {
    std::fprintf(stderr, "dcr synth: --scale wants DEPTH,WIDTH[,EXPERTS] divisors >= 1, got '%s'\n",
                 flags.scale.c_str());
    return 2;
  }
  if (flags.list) return ListPresets(flags);
  if (flags.out.empty()) {
    std::fprintf(stderr, "dcr synth: --out DIR is required\n");
    return 2;
  }
  SynthOptions o;
  o.preset = flags.preset;
  o.depth_div = flags.depth_div;
  o.width_div = flags.width_div;
  o.expert_div = flags.expert_div;
  o.seed = flags.seed;
  o.steps = flags.steps;
  o.lr = flags.lr;
  o.warmup_steps = flags.warmup;
  o.threads = flags.threads;
  o.grad_snr = flags.snr;
  o.shard_bytes = flags.shard_bytes;
  if (!ParseRate(flags.rate, &o.change_rate)) {
    std::fprintf(stderr,
                 "dcr synth: --rate wants a fraction or a percentage (0.03 or 3%%), got '%s'\n",
                 flags.rate.c_str());
    return 2;
  }
  auto model = GetPreset(o.preset);
  if (!model.ok()) return ReportStatus("synth", model.status());
  ModelConfig cfg = ScaleModel(model.value(), o.depth_div, o.width_div, o.expert_div);
  if (!flags.quiet)
    std::fprintf(
        stderr, "dcr synth: %s, %s parameters (%s), %d checkpoints, target %.3g%% change\n",
        cfg.name.c_str(), HumanCount(static_cast<double>(ModelParameterCount(cfg))).c_str(),
        HumanBytes(static_cast<double>(ModelBytes(cfg))).c_str(), o.steps, 100.0 * o.change_rate);
  const auto start = std::chrono::steady_clock::now();
  // init and step: bytes, rate and time left (progress_line.h); the other phases count
  // iterations or checkpoints, shown with the seconds since the start.
  ProgressLine line = ProgressLine::ForStderr(!flags.quiet);
  ProgressFn progress = [&](uint64_t done, uint64_t total, const std::string& phase) {
    if (phase == "init" || phase == "step") {
      line.Update(ProgressUpdate{phase == "init" ? "init" : "step", done, total});
      return;
    }
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    char at[32];
    std::snprintf(at, sizeof(at), "[%7.1fs] ", s);
    if (phase.rfind("wrote ", 0) == 0) {
      line.Show(at + phase, true);
    } else if (done == total) {
      line.Show(at + phase + " done", true);
    } else {
      line.Show(at + phase + " " + std::to_string(done) + "/" + std::to_string(total), false);
    }
  };
  auto paths = SynthesizeCheckpoints(o, flags.out, progress);
  line.Finish();
  if (!paths.ok()) return ReportStatus("synth", paths.status());
  for (const auto& p : paths.value()) std::printf("%s\n", p.c_str());
  return 0;
}

DCR_REGISTER_COMMAND(
    "synth",
    "Write consecutive synthetic BF16 checkpoints (AdamW on FP32 masters) of a model preset at a "
    "requested per-step change rate",
    [](CLI::App* app) -> std::function<int()> {
      auto f = std::make_shared<SynthFlags>();
      app->add_option("--preset", f->preset, "Model preset (see --list)")->capture_default_str();
      app->add_option(
          "--scale", f->scale,
          "Materialize a scaled variant: DEPTH,WIDTH[,EXPERTS] divisors, e.g. 61,64,96");
      app->add_option("--depth-div", f->depth_div, "Divide the layer count")
          ->check(CLI::PositiveNumber);
      app->add_option("--width-div", f->width_div, "Divide hidden/intermediate/vocab/heads")
          ->check(CLI::PositiveNumber);
      app->add_option("--expert-div", f->expert_div, "Divide the routed expert count")
          ->check(CLI::PositiveNumber);
      app->add_option("--rate", f->rate,
                      "Target fraction of BF16 elements changed per step (0.03 or 3%)")
          ->capture_default_str();
      app->add_option("--steps", f->steps, "Checkpoints to write: step0 .. step{N-1}")
          ->capture_default_str()
          ->check(CLI::PositiveNumber);
      app->add_option("--seed", f->seed, "Random seed")->capture_default_str();
      app->add_option("--lr", f->lr, "Learning rate (0 = calibrate to --rate)")
          ->capture_default_str();
      app->add_option("--warmup", f->warmup, "Optimizer steps before step0")->capture_default_str();
      app->add_option("--snr", f->snr, "Gradient signal-to-noise (persistent part std / noise std)")
          ->capture_default_str();
      app->add_option("--threads", f->threads, "Worker threads (0 = all cores; output is the same)")
          ->capture_default_str();
      app->add_option("--shard-bytes", f->shard_bytes,
                      "Write each step as a Hugging Face shard directory stepK/ "
                      "(model-0000i-of-0000n.safetensors + model.safetensors.index.json) with at "
                      "most this many bytes per shard (0 = one stepK.safetensors file)")
          ->capture_default_str();
      app->add_option("--out,-o", f->out,
                      "Output directory (stepK.safetensors, or stepK/ with --shard-bytes)");
      app->add_flag("--list", f->list,
                    "List presets with parameter counts and sizes (with --scale: scaled)");
      app->add_flag("--quiet,-q", f->quiet, "No progress on stderr");
      return [f]() { return Run(*f); };
    });

}  // namespace
}  // namespace dcr::cli
