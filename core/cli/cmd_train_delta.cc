// dcr train-delta: a training run held as Megatron-like rank shards; per-rank deltas built from a
// layout description, merged into one delta per step.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "command.h"
#include "dcr/apply.h"
#include "dcr/delta.h"
#include "dcr/status_macros.h"
#include "dcr/testing/reference_trainer.h"
#include "dcr/train.h"
#include "device_option.h"

namespace dcr::cli {
namespace {

struct TrainDeltaArgs {
  std::string preset = "tiny";
  int64_t depth_div = 1, width_div = 1, expert_div = 1;
  std::string layout, layout_file, out;
  int steps = 2;
  uint64_t seed = 1;
  double lr = 0, change_rate = 0.03;
  int warmup = 3;
  uint64_t chunk_elems = uint64_t{1} << 22;
  int level = 1, threads = 0;
  bool write_shards = false, verify = false, json = false;
  DeviceOption device;
  uint64_t shard_bytes = 0;  // > 0: checkpoints as Hugging Face shard directories
};

// A YAML map of layout keys (tp: 2, dist_opt: true, ...) as the "k=v,..." form.
StatusOr<std::string> LayoutFromYaml(const std::string& path) {
  YAML::Node n;
  try {
    n = YAML::LoadFile(path);
  } catch (const std::exception& e) {
    return InvalidArgumentError("layout file " + path + ": " + e.what());
  }
  if (n["layout"]) n = n["layout"];
  if (!n.IsMap()) return InvalidArgumentError("layout file " + path + ": expected a map of keys");
  std::string text;
  for (const auto& kv : n) {
    std::string v = kv.second.as<std::string>("");
    if (v == "true") v = "1";
    if (v == "false") v = "0";
    text += kv.first.as<std::string>("") + "=" + v + ",";
  }
  return text;
}

// Whether two checkpoints (files, or directories of files) hold the same bytes.
StatusOr<bool> SameFiles(const std::string& a, const std::string& b) {
  if (!std::filesystem::is_directory(a)) {
    DCR_ASSIGN_OR_RETURN(auto x, ReadFile(a));
    DCR_ASSIGN_OR_RETURN(auto y, ReadFile(b));
    return x == y;
  }
  std::vector<std::string> na, nb;
  for (const auto& e : std::filesystem::directory_iterator(a)) na.push_back(e.path().filename());
  for (const auto& e : std::filesystem::directory_iterator(b)) nb.push_back(e.path().filename());
  std::sort(na.begin(), na.end());
  std::sort(nb.begin(), nb.end());
  if (na != nb) return false;
  for (const std::string& n : na) {
    DCR_ASSIGN_OR_RETURN(bool same, SameFiles(a + "/" + n, b + "/" + n));
    if (!same) return false;
  }
  return true;
}

Status WriteRankShards(const TrainStructure& s, const ShardSet& set, const std::string& dir) {
  std::filesystem::create_directories(dir);
  for (size_t r = 0; r < s.ranks().size(); ++r) {
    const RankSpec& rk = s.ranks()[r];
    std::vector<TensorView> views;
    for (size_t b = 0; b < rk.buffers.size(); ++b) {
      views.push_back(TensorView{rk.buffers[b].name,
                                 std::string(DTypeName(rk.buffers[b].dtype)),
                                 {static_cast<int64_t>(rk.buffers[b].numel)},
                                 set.data(r, b),
                                 set.buffers[r][b].size()});
    }
    std::map<std::string, std::string> meta = {{"layout", s.layout().ToString()},
                                               {"pp", std::to_string(rk.pp)},
                                               {"ep", std::to_string(rk.ep)},
                                               {"tp", std::to_string(rk.tp)}};
    DCR_RETURN_IF_ERROR(
        WriteSafetensors(dir + "/rank" + std::to_string(r) + ".safetensors", views, meta));
  }
  return Status::OK();
}

Status Run(const TrainDeltaArgs& a) {
  // The device first: a refusal (no usable CUDA device) comes before anything is written.
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, a.device.Open());
  DCR_ASSIGN_OR_RETURN(ModelConfig cfg, GetPreset(a.preset));
  cfg = ScaleModel(cfg, a.depth_div, a.width_div, a.expert_div);
  std::string text = a.layout;
  if (!a.layout_file.empty()) {
    DCR_ASSIGN_OR_RETURN(std::string y, LayoutFromYaml(a.layout_file));
    text = y + text;
  }
  DCR_ASSIGN_OR_RETURN(TrainLayout layout, TrainLayout::Parse(text));
  if (a.steps < 1) return InvalidArgumentError("--steps must be >= 1");
  DCR_ASSIGN_OR_RETURN(auto s, TrainStructure::Create(cfg, layout));
  std::error_code ec;
  std::filesystem::create_directories(a.out, ec);
  if (ec) return InvalidArgumentError("cannot create " + a.out + ": " + ec.message());
  auto ex = std::make_shared<ReferenceExporter>(s);
  auto t0 = std::chrono::steady_clock::now();
  DCR_ASSIGN_OR_RETURN(auto map, LayoutMap::Discover(*ex, a.threads));
  const double discover_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  TrainOptions to;
  to.seed = a.seed;
  to.lr = a.lr;
  to.change_rate = a.change_rate;
  to.warmup_steps = a.warmup;
  to.threads = a.threads;
  DCR_ASSIGN_OR_RETURN(auto state, TrainState::Create(s, to));
  TrainDeltaOptions o;
  o.chunk_elems = a.chunk_elems;
  o.zstd_level = a.level;
  o.threads = a.threads;
  o.shard_bytes = a.shard_bytes;
  DCR_ASSIGN_OR_RETURN(auto builder, TrainDeltaBuilder::Create(s, map, ex, state->shards(), o));
  // The exporter's checkpoint: one file, or a shard directory with --shard-bytes.
  const bool sharded = a.shard_bytes > 0;
  auto ckpt_path = [&](const std::string& stem) {
    return a.out + "/" + stem + (sharded ? "" : ".safetensors");
  };
  auto export_to = [&](const std::string& path) {
    return sharded ? ex->ExportDirectory(ShardSetReader(*s, state->shards()), path, a.shard_bytes,
                                         a.threads)
                   : ex->ExportFile(ShardSetReader(*s, state->shards()), path, a.threads);
  };
  const std::string base_path = ckpt_path("step0");
  DCR_RETURN_IF_ERROR(export_to(base_path));
  if (a.write_shards)
    DCR_RETURN_IF_ERROR(WriteRankShards(*s, state->shards(), a.out + "/shards/step0"));
  const MapStats& ms = map->stats();
  if (!a.json) {
    std::printf("%s, layout %s: %zu model-parallel ranks x dp %d, %llu shard bytes\n",
                cfg.name.c_str(), layout.ToString().c_str(), s->ranks().size(), layout.dp,
                static_cast<unsigned long long>(s->total_shard_bytes()));
    std::printf(
        "map: %d exporter passes, %llu pieces, %llu of %llu canonical elements affine "
        "(%.2f%%), %zu residual tensors; discovered in %.2f s\n",
        ms.passes, static_cast<unsigned long long>(ms.pieces),
        static_cast<unsigned long long>(ms.affine_elements),
        static_cast<unsigned long long>(ms.canonical_elements), 100 * ms.affine_share(),
        map->residual().size(), discover_s);
  } else {
    std::printf(
        "{\"preset\":\"%s\",\"layout\":\"%s\",\"passes\":%d,\"pieces\":%llu,"
        "\"canonical_elements\":%llu,\"affine_elements\":%llu,\"steps\":[",
        cfg.name.c_str(), layout.ToString().c_str(), ms.passes,
        static_cast<unsigned long long>(ms.pieces),
        static_cast<unsigned long long>(ms.canonical_elements),
        static_cast<unsigned long long>(ms.affine_elements));
  }
  std::string prev_path = base_path;
  for (int k = 1; k <= a.steps; ++k) {
    ShardSet prev = state->shards();
    state->Step();
    const std::string delta_path = a.out + "/step" + std::to_string(k) + ".dcr";
    auto b0 = std::chrono::steady_clock::now();
    DeltaFileSink sink(delta_path);
    DCR_ASSIGN_OR_RETURN(
        TrainDeltaStats st,
        device ? builder->BuildStepOnDevice(prev, state->shards(), device.get(), &sink)
               : builder->BuildStep(prev, state->shards(), &sink));
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - b0).count();
    if (a.write_shards) {
      DCR_RETURN_IF_ERROR(
          WriteRankShards(*s, state->shards(), a.out + "/shards/step" + std::to_string(k)));
    }
    bool verified = false;
    if (a.verify) {
      const std::string want = ckpt_path("step" + std::to_string(k));
      const std::string got = ckpt_path("step" + std::to_string(k) + ".applied");
      DCR_RETURN_IF_ERROR(export_to(want));
      ApplyOptions ao;
      ao.threads = a.threads;
      DCR_RETURN_IF_ERROR(ApplyDeltaFile(prev_path, delta_path, got, ao).status());
      DCR_ASSIGN_OR_RETURN(bool same, SameFiles(want, got));
      std::filesystem::remove_all(got);
      if (!same) {
        return InternalError("step " + std::to_string(k) +
                             ": applied delta differs from the exporter's checkpoint");
      }
      verified = true;
      prev_path = want;
    }
    const uint64_t changes = st.affine_changes + st.residual_changes;
    if (!a.json) {
      std::printf(
          "step %d: %s %llu bytes, %llu chunks; changes %llu (%.3f%% of elements), affine "
          "%.2f%%, residual %llu in %llu re-exported tensors; scanned %llu shard bytes in "
          "%.3f s%s\n",
          k, delta_path.c_str(), static_cast<unsigned long long>(st.payload_bytes),
          static_cast<unsigned long long>(st.chunks), static_cast<unsigned long long>(changes),
          100.0 * changes / st.canonical_elements, 100 * st.affine_change_share(),
          static_cast<unsigned long long>(st.residual_changes),
          static_cast<unsigned long long>(st.residual_tensors_exported),
          static_cast<unsigned long long>(st.scanned_bytes), secs,
          verified ? "; verified bit-exact against the exporter" : "");
    } else {
      std::printf(
          "%s{\"step\":%d,\"payload_bytes\":%llu,\"chunks\":%llu,\"affine_changes\":%llu,"
          "\"residual_changes\":%llu,\"residual_tensors\":%llu,\"scanned_bytes\":%llu,"
          "\"seconds\":%.6f,\"verified\":%s,\"target_hash\":\"%s\"}",
          k > 1 ? "," : "", k, static_cast<unsigned long long>(st.payload_bytes),
          static_cast<unsigned long long>(st.chunks),
          static_cast<unsigned long long>(st.affine_changes),
          static_cast<unsigned long long>(st.residual_changes),
          static_cast<unsigned long long>(st.residual_tensors_exported),
          static_cast<unsigned long long>(st.scanned_bytes), secs, verified ? "true" : "false",
          st.target_hash.ToHex().c_str());
    }
  }
  if (a.json) std::printf("]}\n");
  return Status::OK();
}

}  // namespace

DCR_REGISTER_COMMAND(
    "train-delta",
    "Run the reference trainer as rank shards (TP/PP/EP/dist-opt layout) and build per-rank deltas "
    "into OUT/step{k}.dcr (base: OUT/step0.safetensors, the exporter's checkpoint)",
    [](CLI::App* app) {
      auto a = std::make_shared<TrainDeltaArgs>();
      app->add_option("--preset", a->preset, "Model preset (dcr synth --help lists them)")
          ->capture_default_str();
      app->add_option("--depth-div", a->depth_div, "Divide the preset's depth")
          ->capture_default_str();
      app->add_option("--width-div", a->width_div, "Divide the preset's width")
          ->capture_default_str();
      app->add_option("--expert-div", a->expert_div, "Divide the preset's expert count")
          ->capture_default_str();
      app->add_option("--layout", a->layout,
                      "Layout: tp=,pp=,ep=,dp=,dist_opt=,tied=,fp32_norms=,rope_permute=,"
                      "fold_layers=,vocab_pad=,bucket_align= (comma separated)");
      app->add_option(
          "--layout-file", a->layout_file,
          "YAML map with the same keys (optionally under 'layout:'); --layout overrides");
      app->add_option("-o,--out", a->out, "Output directory")->required();
      app->add_option("--steps", a->steps, "Deltas to build")->capture_default_str();
      app->add_option("--seed", a->seed, "Random seed")->capture_default_str();
      app->add_option("--lr", a->lr, "Learning rate (0: calibrate to --change-rate)")
          ->capture_default_str();
      app->add_option("--change-rate", a->change_rate, "Target BF16 change rate per step")
          ->capture_default_str();
      app->add_option("--warmup", a->warmup, "Optimizer steps before step0")->capture_default_str();
      app->add_option("--chunk-elems", a->chunk_elems, "Max covered elements per chunk")
          ->capture_default_str();
      app->add_option("--level", a->level, "zstd level per stream")->capture_default_str();
      app->add_option("--threads", a->threads, "Worker threads (0 = all cores)")
          ->capture_default_str();
      app->add_flag(
          "--write-shards", a->write_shards,
          "Also write every rank's buffers per step to OUT/shards/step{k}/rank{r}.safetensors");
      app->add_option(
          "--shard-bytes", a->shard_bytes,
          "Export every step as a Hugging Face shard directory OUT/step{k}/ (shards of at "
          "most N bytes, and the index); the deltas then name those files");
      app->add_flag(
          "--verify", a->verify,
          "Export step{k}.safetensors and check apply(step{k-1}, delta) equals it byte for byte");
      app->add_flag("--json", a->json, "One JSON object on stdout");
      a->device.AddTo(app);
      return [a]() { return ReportStatus("train-delta", Run(*a)); };
    });

}  // namespace dcr::cli
