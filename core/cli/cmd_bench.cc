// `dcr bench codec`: size and speed of the codec on synthetic AdamW data, ratios to memcpy measured
// in the same run on one core; --json writes the calibration file the simulator reads; --check
// compares with bench/thresholds.json and exits 1 when a threshold is missed.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench_pipeline.h"
#include "codec_bench.h"
#include "command.h"
#include "dcr/checkpoint.h"
#include "diff_bench.h"
#include "run_real.h"

namespace dcr::cli {
namespace {

struct BenchFlags {
  std::string json;
  std::string check;
  uint64_t elems = internal::CodecBenchConfig{}.elements;
  int reps = internal::CodecBenchConfig{}.reps;  // one default, the library's
  uint64_t seed = 1;
  std::vector<double> rates_pct = {1, 3, 5};
  int context_classes = kContextClassesMax;
  CLI::Option* elems_opt = nullptr;
  CLI::Option* reps_opt = nullptr;
  std::string scenario;  // bench pipeline
  int pipeline_reps = 3;
  internal::DiffBenchConfig diff;  // bench diff
};

std::string GitCommit() {
  if (const char* env = std::getenv("DCR_COMMIT")) return env;
  FILE* p = popen("git rev-parse --short=12 HEAD 2>/dev/null", "r");
  if (p == nullptr) return "";
  char buf[64] = {0};
  std::string out;
  if (std::fgets(buf, sizeof(buf), p) != nullptr) out = buf;
  pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

int RunCodec(const BenchFlags& f) {
  internal::CodecBenchConfig cfg;
  cfg.elements = f.elems;
  cfg.reps = f.reps;
  cfg.seed = f.seed;
  cfg.context_classes = f.context_classes;
  cfg.rates.clear();
  for (double p : f.rates_pct) cfg.rates.push_back(p / 100.0);
  std::string thresholds;
  if (!f.check.empty()) {
    auto bytes = ReadFile(f.check);
    if (!bytes.ok()) return ReportStatus("bench codec", bytes.status());
    thresholds.assign(bytes.value().begin(), bytes.value().end());
    // The thresholds file fixes the problem size unless the flags override it.
    nlohmann::json j = nlohmann::json::parse(thresholds, nullptr, false);
    if (!j.is_discarded() && j.contains("codec") && j["codec"].is_object()) {
      const auto& c = j["codec"];
      if (f.elems_opt->count() == 0 && c.contains("elements") && c["elements"].is_number_unsigned())
        cfg.elements = c["elements"].get<uint64_t>();
      if (f.reps_opt->count() == 0 && c.contains("reps") && c["reps"].is_number_integer())
        cfg.reps = c["reps"].get<int>();
      if (c.contains("rates") && c["rates"].is_array()) {
        cfg.rates.clear();
        for (const auto& r : c["rates"])
          if (r.is_object() && r.contains("change_rate") && r["change_rate"].is_number())
            cfg.rates.push_back(r["change_rate"].get<double>());
      }
    }
  }
  auto report = internal::RunCodecBench(
      cfg, [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); });
  if (!report.ok()) return ReportStatus("bench codec", report.status());
  std::printf("%s", internal::CodecBenchTable(report.value()).c_str());
  if (!f.json.empty()) {
    const std::string js = internal::CodecBenchJson(report.value(), GitCommit());
    Status s = WriteFileAtomic(f.json, js.data(), js.size());
    if (!s.ok()) return ReportStatus("bench codec", s);
    std::fprintf(stderr, "bench codec: wrote %s\n", f.json.c_str());
  }
  if (!f.check.empty()) {
    std::vector<std::string> lines;
    Status s = internal::CheckCodecThresholds(report.value(), thresholds, &lines);
    std::printf("\nthresholds (%s):\n", f.check.c_str());
    for (const auto& l : lines) std::printf("  %s\n", l.c_str());
    if (s.IsFailedPrecondition()) {
      std::fprintf(stderr, "dcr bench codec: %s\n", s.message().c_str());
      return 1;
    }
    if (!s.ok()) return ReportStatus("bench codec", s);
    std::printf("all codec thresholds met\n");
  }
  return 0;
}

int RunPipeline(const BenchFlags& f) {
  PipelineBenchConfig cfg;
  cfg.scenario_path = f.scenario;
  cfg.reps = f.pipeline_reps;
  cfg.prepare_checkpoints = PrepareCheckpoints;  // as `dcr run` synthesizes them
  auto js = RunPipelineBench(cfg, [](const std::string& line) {
    std::fprintf(stderr, "bench pipeline: %s\n", line.c_str());
  });
  if (!js.ok()) return ReportStatus("bench pipeline", js.status());
  if (f.json.empty()) {
    std::printf("%s", js->c_str());
    return 0;
  }
  Status s = WriteFileAtomic(f.json, js->data(), js->size());
  if (!s.ok()) return ReportStatus("bench pipeline", s);
  std::fprintf(stderr, "bench pipeline: wrote %s\n", f.json.c_str());
  return 0;
}

int RunDiffBenchCommand(const BenchFlags& f) {
  auto report = internal::RunDiffBench(f.diff, [](const std::string& line) {
    std::fprintf(stderr, "bench diff: %s\n", line.c_str());
  });
  if (!report.ok()) return ReportStatus("bench diff", report.status());
  std::printf("%s", internal::DiffBenchTable(report.value()).c_str());
  return 0;
}

DCR_REGISTER_COMMAND(
    "bench",
    "Benchmarks: `dcr bench codec` (size vs dense and vs the order-0 bound, encode and "
    "decode+apply bandwidth as ratios to memcpy, one core, same run)",
    [](CLI::App* app) -> std::function<int()> {
      auto f = std::make_shared<BenchFlags>();
      app->require_subcommand(1);
      CLI::App* codec = app->add_subcommand(
          "codec",
          "Codec on synthetic BF16 AdamW data at 1%, 3%, 5% change: ratio vs dense, size vs "
          "order-0 bound, encode and decode+apply GB/s and their ratios to memcpy (best of reps)");
      codec->add_option("--json", f->json,
                        "Write the results as JSON (the simulator's calibration file)");
      CLI::Option* check =
          codec->add_option("--check", f->check,
                            "Thresholds file (bench/thresholds.json); exit 1 if a ratio misses it");
      f->elems_opt = codec->add_option("--elems", f->elems, "Elements of the BF16 tensor")
                         ->capture_default_str();
      f->reps_opt = codec->add_option("--reps", f->reps, "Repetitions (best is reported)")
                        ->capture_default_str()
                        ->check(CLI::PositiveNumber);
      codec->add_option("--seed", f->seed, "Data seed")->capture_default_str();
      codec->add_option("--rates", f->rates_pct, "Change rates in percent")
          ->delimiter(',')
          ->capture_default_str();
      codec
          ->add_option("--context-classes", f->context_classes,
                       "The most exponent classes per context-coded chunk (1-16; the "
                       "thresholds of --check are for the default)")
          ->check(CLI::Range(1, kContextClassesMax))
          ->excludes(check)
          ->capture_default_str();
      CLI::App* pipeline = app->add_subcommand(
          "pipeline",
          "The real sender and receiver paths (BuildDelta, delta and full receivers) timed on a "
          "scenario's checkpoints: a calibration file for `dcr sim --calibration`");
      pipeline->add_option("--scenario", f->scenario, "Scenario YAML (its model and rates)")
          ->required()
          ->check(CLI::ExistingFile);
      pipeline->add_option("--json", f->json, "Write the calibration JSON here (else stdout)");
      pipeline->add_option("--reps", f->pipeline_reps, "Repetitions (median is reported)")
          ->capture_default_str()
          ->check(CLI::PositiveNumber);
      CLI::App* diff = app->add_subcommand(
          "diff",
          "The whole `dcr diff` on one thread against a dd read of its target, same run, files "
          "in page cache, with a breakdown (content hashes, range hashes, scan, encode, write); "
          "run it under `taskset -c 0`");
      diff->add_option("--dir", f->diff.dir, "Directory for the two checkpoints and the delta")
          ->required()
          ->check(CLI::ExistingDirectory);
      diff->add_option("--elems", f->diff.elements, "BF16 elements per checkpoint")
          ->capture_default_str();
      diff->add_option("--rate", f->diff.rate, "Change rate (fraction)")->capture_default_str();
      diff->add_option("--reps", f->diff.reps, "Repetitions (best is reported)")
          ->capture_default_str()
          ->check(CLI::PositiveNumber);
      diff->add_option("--seed", f->diff.seed, "Data seed")->capture_default_str();
      return [f, codec, diff]() {
        if (diff->parsed()) return RunDiffBenchCommand(*f);
        return codec->parsed() ? RunCodec(*f) : RunPipeline(*f);
      };
    });

}  // namespace
}  // namespace dcr::cli
