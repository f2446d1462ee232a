// dcr inspect DELTA [--json] [--base BASE] [--sort KEY] [--top N]: per-tensor and total statistics
// of a delta: dense and payload bytes, their ratio, change rate, entropy bound.
#include <algorithm>
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

// Which tensor rows `dcr inspect` lists, in which order.
struct Listing {
  std::string sort = "name";  // name | payload | changed | ratio
  size_t top = 0;             // 0 = every tensor
};

// The order of the tensor rows: by name (canonical order), the largest payload or change count
// first, or the smallest ratio first (the tensors that compress worst; unchanged ones, which
// cost nothing, last). Ties keep name order.
std::vector<size_t> RowOrder(const nlohmann::json& tensors, const Listing& l) {
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto num = [&](size_t i, const char* k) { return tensors[i][k].get<double>(); };
  auto before = [&](size_t x, size_t y) {
    if (l.sort == "payload") return num(x, "payload_bytes") > num(y, "payload_bytes");
    if (l.sort == "changed") return num(x, "changed") > num(y, "changed");
    if (l.sort == "ratio") {
      const bool nx = tensors[x]["ratio"].is_null(), ny = tensors[y]["ratio"].is_null();
      if (nx || ny) return !nx && ny;
      return num(x, "ratio") < num(y, "ratio");
    }
    return false;  // name: the canonical order already is
  };
  std::stable_sort(order.begin(), order.end(), before);
  if (l.top > 0 && order.size() > l.top) order.resize(l.top);
  return order;
}

int RunInspect(const std::string& path, const std::string& base_path, bool json,
               const Listing& listing) {
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
  if (inv.sharded()) {
    nlohmann::json files = nlohmann::json::array();
    for (const InventoryFile& f : inv.files) files.push_back({{"name", f.name}, {"bytes", f.file_size()}});
    out["target_files"] = files;
    out["target_index"] = inv.index_name;
  }
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
    j["unchanged"] = a.changed == 0;
    j["payload_bytes"] = static_cast<uint64_t>(std::llround(a.payload));
    j["dense_bytes"] = t.nbytes;
    // Undefined (null) without payload or bound: an unchanged tensor costs no chunk bytes.
    j["ratio"] = a.payload > 0 ? nlohmann::json(t.nbytes / a.payload) : nlohmann::json();
    j["bound_bytes"] = bound;
    j["payload_vs_bound"] = bound > 0 ? nlohmann::json(a.payload / bound) : nlohmann::json();
    tensors.push_back(j);
    te += t.num_elements();
    tc += a.changed;
    td += t.nbytes;
    tb += bound;
  }
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i : RowOrder(tensors, listing)) rows.push_back(tensors[i]);
  out["sort"] = listing.sort;
  out["tensor_count"] = tensors.size();
  out["tensors"] = rows;
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
  if (inv.sharded()) {
    std::printf("target: a directory of %zu shards (%s ... %s)%s%s\n", inv.files.size(),
                inv.files.front().name.c_str(), inv.files.back().name.c_str(),
                inv.index_name.empty() ? ", no index" : " and ", inv.index_name.c_str());
  }
  // Unchanged tensors say so instead of zero rates and ratios.
  auto row = [](const std::string& name, const std::string& dtype, uint64_t elements,
                const std::string& changed, const std::string& rate, uint64_t dense,
                uint64_t payload, const std::string& ratio, const std::string& bound) {
    std::printf("%-60s %6s %12llu %10s %8s %12llu %12llu %9s %9s\n", name.substr(0, 60).c_str(),
                dtype.c_str(), static_cast<unsigned long long>(elements), changed.c_str(),
                rate.c_str(), static_cast<unsigned long long>(dense),
                static_cast<unsigned long long>(payload), ratio.c_str(), bound.c_str());
  };
  auto fixed = [](const nlohmann::json& v, const char* fmt, double scale = 1) {
    if (v.is_null()) return std::string("-");
    char buf[32];
    std::snprintf(buf, sizeof(buf), fmt, scale * v.get<double>());
    return std::string(buf);
  };
  std::printf("%-60s %6s %12s %10s %8s %12s %12s %9s %9s\n", "tensor", "dtype", "elements",
              "changed", "rate%", "dense", "payload", "ratio", "/bound");
  for (const auto& j : rows) {
    const bool unchanged = j["unchanged"].get<bool>();
    row(j["name"].get<std::string>(), j["dtype"].get<std::string>(), j["elements"].get<uint64_t>(),
        unchanged ? "unchanged" : std::to_string(j["changed"].get<uint64_t>()),
        unchanged ? "-" : fixed(j["change_rate"], "%.4f", 100), j["dense_bytes"].get<uint64_t>(),
        j["payload_bytes"].get<uint64_t>(), fixed(j["ratio"], "%.1f"),
        fixed(j["payload_vs_bound"], "%.3f"));
  }
  row("TOTAL", "", te, std::to_string(tc), fixed(tot["change_rate"], "%.4f", 100), td, d.size(),
      fixed(tot["ratio"], "%.1f"), fixed(tot["payload_vs_bound"], "%.3f"));
  if (rows.size() < tensors.size() || listing.sort != "name") {
    std::printf("%zu of %zu tensors shown, sorted by %s; TOTAL covers all of them (payload: the "
                "whole delta)\n",
                rows.size(), tensors.size(), listing.sort.c_str());
  }
  std::printf("bound = order-0 entropy of positions + %s\n",
              base ? "XOR values" : "coded values (pass the delta's base as --base for the XOR bound)");
  return 0;
}

}  // namespace

DCR_REGISTER_COMMAND("inspect", "Per-tensor and total statistics of a delta (sizes, rates, entropy bound)",
                     [](CLI::App* app) {
                       struct Args { std::string path, base; bool json = false; Listing listing; };
                       auto a = std::make_shared<Args>();
                       app->add_option("delta", a->path, "Delta file")->required();
                       app->add_option("--base", a->base, "Base checkpoint: report the XOR-delta bound exactly");
                       app->add_flag("--json", a->json, "Machine-readable output");
                       app->add_option("--sort", a->listing.sort,
                                       "Row order: name, payload or changed (largest first), ratio "
                                       "(smallest first: the tensors that compress worst)")
                           ->check(CLI::IsMember({"name", "payload", "changed", "ratio"}))
                           ->capture_default_str();
                       app->add_option("--top", a->listing.top,
                                       "Show only the first N tensors of that order (0 = all); the "
                                       "totals cover every tensor");
                       return [a]() { return RunInspect(a->path, a->base, a->json, a->listing); };
                     });

}  // namespace dcr::cli
