// dcr inspect DELTA [--json] [--base BASE]: per-tensor and total statistics of a delta.
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "command.h"
#include "dcr/apply.h"
#include "dcr/delta.h"
#include "dcr/hash.h"

namespace dcr::cli {
namespace {

double BoundBits(uint64_t n, uint64_t k, const std::unordered_map<uint64_t, uint64_t>& hist) {
  if (n == 0) return 0;
  double bits = 0;
  if (k > 0 && k < n) {
    double p = static_cast<double>(k) / n;
    bits = n * -(p * std::log2(p) + (1 - p) * std::log2(1 - p));
  }
  for (const auto& [v, c] : hist) bits -= c * std::log2(static_cast<double>(c) / k);
  return bits;
}

struct TensorAcc {
  uint64_t changed = 0;
  double payload = 0;
  std::unordered_map<uint64_t, uint64_t> hist;
};

int RunInspect(const std::string& path, const std::string& base_path, bool json) {
  auto r = DeltaReader::Open(path);
  if (!r.ok()) return ReportStatus("inspect", r.status());
  const DeltaReader& d = **r;
  const Inventory& inv = d.inventory();
  std::unique_ptr<Checkpoint> base;
  std::string warning;
  if (!base_path.empty()) {
    auto b = Checkpoint::Open(base_path);
    if (!b.ok()) return ReportStatus("inspect", b.status());
    const bool full_frame = (d.header().flags & kFlagNoBase) != 0;
    const Hash128 have = (*b)->ContentHash();
    if (full_frame) {
      warning = "--base " + base_path + " ignored: the delta is a full frame (it has no base)";
    } else if (have != d.header().base_hash) {
      // Values XORed with another checkpoint's bits would give a meaningless bound.
      warning = "--base " + base_path + " has content hash " + have.ToHex() +
                " but the delta was built for base " + d.header().base_hash.ToHex() +
                "; it is ignored (the bound is of the coded values)";
    } else {
      base = std::move(*b);
    }
    if (!warning.empty()) std::fprintf(stderr, "dcr inspect: warning: %s\n", warning.c_str());
  }
  std::vector<TensorAcc> acc(inv.tensors.size());
  std::map<std::string, uint64_t> modes;
  for (size_t i = 0; i < d.num_chunks(); ++i) {
    auto dc = d.Decode(i);
    if (!dc.ok()) return ReportStatus("inspect", dc.status().WithContext("chunk table entry " + std::to_string(i)));
    const ChunkHeader& h = dc->header;
    modes[std::string(PositionModeName(h.position_mode)) + "+" + ValueModeName(h.value_mode)]++;
    SegmentCursor cur(h.segments);
    const bool dense = h.position_mode == PositionMode::kDense;
    const double per_change = h.num_changes ? static_cast<double>(d.chunk_size(i)) / h.num_changes : 0;
    if (h.num_changes == 0) acc[h.segments[0].tensor_index].payload += d.chunk_size(i);
    for (uint64_t k = 0; k < h.num_changes; ++k) {
      uint32_t s;
      uint64_t e;
      cur.Locate(dense ? k : dc->positions[k], &s, &e);
      uint32_t ti = h.segments[s].tensor_index;
      if (ti >= acc.size()) return ReportStatus("inspect", DataLossError("tensor index out of range"));
      TensorAcc& a = acc[ti];
      a.changed++;
      a.payload += per_change;
      uint64_t v = dc->values[k];
      if (base && h.value_mode != ValueMode::kXor) {
        const TensorInfo* bt = base->Find(inv.tensors[ti].name);
        if (bt && e < bt->num_elements()) {
          uint64_t old = LoadBits(base->data(*bt), h.elem_width, e);
          v = old ^ ApplyValue(h.value_mode, h.elem_width, old, v);
        }
      }
      a.hist[v]++;
    }
  }
  nlohmann::json out;
  out["delta"] = path;
  out["format_version"] = d.header().format_version;
  out["base_version"] = d.header().base_version;
  out["target_version"] = d.header().target_version;
  out["base_hash"] = d.header().base_hash.ToHex();
  out["target_hash"] = d.trailer().target_hash.ToHex();
  out["full_frame"] = (d.header().flags & kFlagNoBase) != 0;
  out["chunks"] = d.num_chunks();
  out["chunk_modes"] = modes;
  out["entropy_of"] = base ? "xor" : "payload values (xor or ulp delta as coded)";
  if (!warning.empty()) out["warning"] = warning;
  uint64_t te = 0, tc = 0, td = 0;
  double tb = 0;
  nlohmann::json tensors = nlohmann::json::array();
  for (size_t i = 0; i < inv.tensors.size(); ++i) {
    const TensorInfo& t = inv.tensors[i];
    const TensorAcc& a = acc[i];
    double bound = BoundBits(t.num_elements(), a.changed, a.hist) / 8;
    nlohmann::json j;
    j["name"] = t.name;
    j["dtype"] = t.dtype_name;
    j["elements"] = t.num_elements();
    j["changed"] = a.changed;
    j["change_rate"] = t.num_elements() ? static_cast<double>(a.changed) / t.num_elements() : 0.0;
    j["payload_bytes"] = static_cast<uint64_t>(std::llround(a.payload));
    j["dense_bytes"] = t.nbytes;
    j["ratio"] = a.payload > 0 ? t.nbytes / a.payload : 0.0;
    j["bound_bytes"] = bound;
    j["payload_vs_bound"] = bound > 0 ? a.payload / bound : 0.0;
    tensors.push_back(j);
    te += t.num_elements();
    tc += a.changed;
    td += t.nbytes;
    tb += bound;
  }
  out["tensors"] = tensors;
  nlohmann::json tot;
  tot["elements"] = te;
  tot["changed"] = tc;
  tot["change_rate"] = te ? static_cast<double>(tc) / te : 0.0;
  tot["payload_bytes"] = d.size();
  tot["dense_bytes"] = td;
  tot["ratio"] = d.size() ? static_cast<double>(td) / d.size() : 0.0;
  tot["bound_bytes"] = tb;
  tot["payload_vs_bound"] = tb > 0 ? d.size() / tb : 0.0;
  out["total"] = tot;
  if (json) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("delta %s: format v%u, version %llu -> %llu, %zu chunks%s\n", path.c_str(),
              d.header().format_version, static_cast<unsigned long long>(d.header().base_version),
              static_cast<unsigned long long>(d.header().target_version), d.num_chunks(),
              out["full_frame"].get<bool>() ? " (full frame)" : "");
  std::printf("%-60s %6s %12s %10s %8s %12s %9s %9s\n", "tensor", "dtype", "elements", "changed",
              "rate%", "payload", "ratio", "/bound");
  for (const auto& j : tensors) {
    std::printf("%-60s %6s %12llu %10llu %8.4f %12llu %9.1f %9.3f\n",
                j["name"].get<std::string>().substr(0, 60).c_str(), j["dtype"].get<std::string>().c_str(),
                static_cast<unsigned long long>(j["elements"].get<uint64_t>()),
                static_cast<unsigned long long>(j["changed"].get<uint64_t>()),
                100 * j["change_rate"].get<double>(),
                static_cast<unsigned long long>(j["payload_bytes"].get<uint64_t>()),
                j["ratio"].get<double>(), j["payload_vs_bound"].get<double>());
  }
  std::printf("%-60s %6s %12llu %10llu %8.4f %12llu %9.1f %9.3f\n", "TOTAL", "",
              static_cast<unsigned long long>(te), static_cast<unsigned long long>(tc),
              te ? 100.0 * tc / te : 0.0, static_cast<unsigned long long>(d.size()),
              tot["ratio"].get<double>(), tot["payload_vs_bound"].get<double>());
  std::printf("bound = order-0 entropy of positions + %s\n",
              base ? "XOR values" : "coded values (pass the delta's base as --base for the XOR bound)");
  return 0;
}

}  // namespace

DCR_REGISTER_COMMAND("inspect", "Per-tensor and total statistics of a delta (sizes, rates, entropy bound)",
                     [](CLI::App* app) {
                       struct Args { std::string path, base; bool json = false; };
                       auto a = std::make_shared<Args>();
                       app->add_option("delta", a->path, "Delta file")->required();
                       app->add_option("--base", a->base, "Base checkpoint: report the XOR-delta bound exactly");
                       app->add_flag("--json", a->json, "Machine-readable output");
                       return [a]() { return RunInspect(a->path, a->base, a->json); };
                     });

}  // namespace dcr::cli
