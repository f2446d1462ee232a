// TrainStructure::FromLayoutSpec: per-rank placement of any tensor set, described by data.
#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "dcr/dtype.h"
#include "dcr/train.h"

namespace dcr {
namespace {

using nlohmann::json;

Status SpecError(const std::string& where, const std::string& what) {
  return InvalidArgumentError("layout spec: " + where + (where.empty() ? "" : ": ") + what);
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string t = "[";
  for (size_t i = 0; i < shape.size(); ++i) t += (i ? ", " : "") + std::to_string(shape[i]);
  return t + "]";
}

}  // namespace

StatusOr<std::shared_ptr<const TrainStructure>> TrainStructure::FromLayoutSpec(
    const std::string& spec_json, const std::vector<TensorSpec>& tensors) {
  json spec = json::parse(spec_json, nullptr, /*allow_exceptions=*/false);
  if (spec.is_discarded() || !spec.is_object()) {
    return SpecError("", "not a JSON object");
  }
  for (const auto& [key, value] : spec.items()) {
    if (key != "ranks" && key != "tensors") return SpecError("", "unknown key '" + key + "'");
  }
  if (!spec.contains("ranks") || !spec["ranks"].is_number_integer() ||
      spec["ranks"].get<int64_t>() < 1 || spec["ranks"].get<int64_t>() > 65536) {
    return SpecError("ranks", "needs an integer from 1 to 65536");
  }
  const int n_ranks = spec["ranks"].get<int>();
  if (!spec.contains("tensors") || !spec["tensors"].is_array()) {
    return SpecError("tensors", "needs a list of placements");
  }
  std::map<std::string, size_t> known;  // canonical tensor name -> index in `sorted`
  std::vector<TensorSpec> sorted = tensors;
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorSpec& a, const TensorSpec& b) { return a.name < b.name; });
  for (size_t t = 0; t < sorted.size(); ++t) {
    if (!known.emplace(sorted[t].name, t).second) {
      return SpecError("", "the tensor set names '" + sorted[t].name + "' twice");
    }
  }
  std::vector<RankSpec> ranks(static_cast<size_t>(n_ranks));
  for (int r = 0; r < n_ranks; ++r) ranks[r].tp = r;
  std::map<std::string, size_t> placed;  // tensor -> entry that placed it
  const json& entries = spec["tensors"];
  for (size_t i = 0; i < entries.size(); ++i) {
    const json& e = entries[i];
    std::string where = "tensors[" + std::to_string(i) + "]";
    if (!e.is_object()) return SpecError(where, "not an object");
    for (const auto& [key, value] : e.items()) {
      if (key != "tensor" && key != "split" && key != "ranks") {
        return SpecError(where, "unknown key '" + key + "'");
      }
    }
    if (!e.contains("tensor") || !e["tensor"].is_string()) {
      return SpecError(where, "needs 'tensor', the tensor's name");
    }
    const std::string name = e["tensor"].get<std::string>();
    where += " (" + name + ")";
    const auto it = known.find(name);
    if (it == known.end()) {
      return SpecError(where, "unknown tensor: the tensor set has none so named");
    }
    const auto [prev, first] = placed.emplace(name, i);
    if (!first) {
      return SpecError(where, "overlapping coverage: already placed by tensors[" +
                                  std::to_string(prev->second) + "]");
    }
    const TensorSpec& t = sorted[it->second];
    const DType dt = DTypeFromName(t.dtype);
    if (DTypeWidth(dt) == 0) {
      return SpecError(where, "dtype '" + t.dtype + "' has no element width");
    }
    if (!e.contains("split") || !e["split"].is_string()) {
      return SpecError(where, "needs 'split': rows, columns or whole");
    }
    const std::string split = e["split"].get<std::string>();
    if (split != "rows" && split != "columns" && split != "whole") {
      return SpecError(where, "unknown split '" + split + "' (rows, columns or whole)");
    }
    if (!e.contains("ranks") || !e["ranks"].is_array() || e["ranks"].empty()) {
      return SpecError(where, "needs 'ranks', a non-empty list of ranks");
    }
    std::vector<int> on;
    for (const json& r : e["ranks"]) {
      if (!r.is_number_integer() || r.get<int64_t>() < 0 || r.get<int64_t>() >= n_ranks) {
        return SpecError(where,
                         "rank " + r.dump() + " is outside 0.." + std::to_string(n_ranks - 1));
      }
      if (std::find(on.begin(), on.end(), r.get<int>()) != on.end()) {
        return SpecError(where, "overlapping coverage: rank " + r.dump() + " listed twice");
      }
      on.push_back(r.get<int>());
    }
    const int64_t parts = static_cast<int64_t>(on.size());
    const size_t dim = split == "columns" ? 1 : 0;
    if (split != "whole") {
      if (t.shape.size() <= dim) {
        return SpecError(where, split + " split of shape " + ShapeText(t.shape) +
                                    ": the tensor has no dimension " + std::to_string(dim));
      }
      if (t.shape[dim] % parts != 0) {
        return SpecError(where, split + " split of dimension " + std::to_string(dim) + " (" +
                                    std::to_string(t.shape[dim]) + ") over " +
                                    std::to_string(parts) + " ranks leaves a remainder");
      }
    }
    for (int64_t k = 0; k < parts; ++k) {
      RankSpec& rk = ranks[static_cast<size_t>(on[k])];
      std::vector<int64_t> local = t.shape;
      if (split != "whole") local[dim] /= parts;
      uint64_t numel = 1;
      for (int64_t d : local) numel *= static_cast<uint64_t>(d);
      LocalParam p;
      p.name = name;
      p.buffer = static_cast<int>(rk.buffers.size());
      p.offset = 0;
      p.numel = numel;
      p.shape = local;
      p.key = it->second;
      p.replica = split == "whole" && k > 0;
      rk.index[name] = static_cast<int>(rk.params.size());
      rk.params.push_back(p);
      rk.buffers.push_back(BufferSpec{name, dt, numel});
    }
  }
  for (const TensorSpec& t : sorted) {
    if (!placed.count(t.name)) {
      return SpecError("", "missing coverage: tensor '" + t.name + "' has no entry");
    }
  }
  for (int r = 0; r < n_ranks; ++r) {
    if (ranks[r].params.empty()) {
      return SpecError("ranks", "missing coverage: rank " + std::to_string(r) + " holds no tensor");
    }
  }
  auto s = std::shared_ptr<TrainStructure>(new TrainStructure());
  s->cfg_.name = "layout-spec";
  s->layout_.tp = n_ranks;
  s->layout_.tied = 0;
  s->layout_.fp32_norms = false;
  s->layout_.rope_permute = false;
  s->canonical_ = std::move(sorted);
  s->ranks_ = std::move(ranks);
  s->stage_begin_ = {0};
  return std::shared_ptr<const TrainStructure>(std::move(s));
}

}  // namespace dcr
