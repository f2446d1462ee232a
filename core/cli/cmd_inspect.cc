// dcr inspect DELTA [--json] [--base BASE] [--sort KEY] [--top N]: per-tensor and total statistics
// of a delta: dense and payload bytes, their ratio, change rate, entropy bounds (bound0 and, with
// the base, bound2: positions and ulp values conditioned on each element's base exponent).
// Context-coded chunks (format versions 6 to 8) decode only against the base: without --base they
// are counted from their headers.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "command.h"
#include "dcr/apply.h"
#include "dcr/context.h"
#include "dcr/delta.h"
#include "dcr/hash.h"
#include "dcr/status_macros.h"

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
  // bound2 (with the base): changes and zigzag ulp values per base exponent.
  uint64_t ke[256] = {};
  std::map<std::pair<int, uint64_t>, uint64_t> ulp;
};

// The 8 bits below the sign of an element (its exponent for BF16, FP32 and FP64's top bits): the
// context the bound2 conditions on; 0 for 1-byte elements.
int ContextBits(uint64_t bits, int w) {
  return w >= 2 ? static_cast<int>((bits >> (8 * w - 9)) & 0xFF) : 0;
}

// zigzag(ord(new) - ord(old)) in w bytes (core/FORMAT.md section 2.2).
uint64_t ZigZagUlp(uint64_t old_bits, uint64_t new_bits, int w) {
  const uint64_t mask = w >= 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * w)) - 1;
  const uint64_t sign = uint64_t{1} << (8 * w - 1);
  auto ord = [&](uint64_t b) { return (b & sign) ? (~b & mask) : (b | sign); };
  const uint64_t d = (ord(new_bits) - ord(old_bits)) & mask;
  return ((d << 1) ^ ((d & sign) ? mask : 0)) & mask;
}

// bound2 of one tensor in bits: n_e H(k_e / n_e) over the base exponents e, plus the conditional
// entropy of the zigzag ulp values given e.
double Bound2Bits(const uint8_t* base, int w, uint64_t n, const TensorAcc& a) {
  uint64_t ne[256] = {};
  for (uint64_t i = 0; i < n; ++i) ++ne[ContextBits(LoadBits(base, w, i), w)];
  double bits = 0;
  for (int e = 0; e < 256; ++e) {
    const uint64_t k = a.ke[e];
    if (k == 0 || k >= ne[e]) continue;
    const double p = static_cast<double>(k) / ne[e];
    bits += ne[e] * -(p * std::log2(p) + (1 - p) * std::log2(1 - p));
  }
  for (const auto& [key, c] : a.ulp)
    bits -= c * std::log2(static_cast<double>(c) / a.ke[key.first]);
  return bits;
}

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

// The base checkpoint at `base_path` when the delta was built on it; null, with `warning` set (and
// printed), when the delta is a full frame or has another base. Errors: the base cannot be opened.
StatusOr<std::unique_ptr<Checkpoint>> OpenMatchingBase(const DeltaReader& d,
                                                       const std::string& base_path,
                                                       std::string* warning) {
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> b, Checkpoint::Open(base_path));
  const bool full_frame = (d.header().flags & kFlagNoBase) != 0;
  const Hash128 have = b->ContentHash();
  if (full_frame) {
    *warning = "--base " + base_path + " ignored: the delta is a full frame (it has no base)";
  } else if (have != d.header().base_hash) {
    // Values XORed with another checkpoint's bits would give a meaningless bound.
    *warning = "--base " + base_path + " has content hash " + have.ToHex() +
               " but the delta was built for base " + d.header().base_hash.ToHex() +
               "; it is ignored (the bound is of the coded values)";
  }
  if (warning->empty()) return b;
  std::fprintf(stderr, "dcr inspect: warning: %s\n", warning->c_str());
  return std::unique_ptr<Checkpoint>();
}

// What the chunks of a delta add up to, per tensor (inventory order) and per chunk mode.
struct ChunkTally {
  std::vector<TensorAcc> acc;
  std::map<std::string, uint64_t> modes;
  uint64_t context_chunks = 0;
  uint64_t uncounted = 0;  // changes of context-coded chunks counted from their headers
};

// Adds the changes of decoded chunk `i` (header `h`) to `t`, their values XORed against `base`
// when given. Errors: kDataLoss for a tensor index out of range.
Status TallyDecodedChunk(const DeltaReader& d, size_t i, const DecodedChunk& dc,
                         const Checkpoint* base, ChunkTally* t) {
  const Inventory& inv = d.inventory();
  const ChunkHeader& h = dc.header;
  t->modes[std::string(PositionModeName(h.position_mode)) + "+" + ValueModeName(h.value_mode)]++;
  SegmentCursor cur(h.segments);
  const bool dense = h.position_mode == PositionMode::kDense;
  const double per_change =
      h.num_changes ? static_cast<double>(d.chunk_size(i)) / h.num_changes : 0;
  if (h.num_changes == 0) t->acc[h.segments[0].tensor_index].payload += d.chunk_size(i);
  for (uint64_t k = 0; k < h.num_changes; ++k) {
    uint32_t s;
    uint64_t e;
    cur.Locate(dense ? k : dc.positions[k], &s, &e);
    uint32_t ti = h.segments[s].tensor_index;
    if (ti >= t->acc.size()) return DataLossError("tensor index out of range");
    TensorAcc& a = t->acc[ti];
    a.changed++;
    a.payload += per_change;
    uint64_t v = dc.values[k];
    if (base) {
      const TensorInfo* bt = base->Find(inv.tensors[ti].name);
      if (bt && e < bt->num_elements()) {
        const uint64_t old = LoadBits(base->data(*bt), h.elem_width, e);
        const uint64_t nw = ApplyValue(h.value_mode, h.elem_width, old, v);
        v = old ^ nw;
        const int ctx = ContextBits(old, h.elem_width);
        a.ke[ctx]++;
        a.ulp[{ctx, ZigZagUlp(old, nw, h.elem_width)}]++;
      }
    }
    a.hist[v]++;
  }
  return Status();
}

// Decodes (or, for a context-coded chunk without `base`, reads the header of) every chunk of `d`
// into a tally. Errors: a chunk that does not parse or decode (named by its table entry), a base
// without one of the delta's tensors.
StatusOr<ChunkTally> TallyChunks(const DeltaReader& d, const Checkpoint* base) {
  const Inventory& inv = d.inventory();
  ChunkTally t;
  t.acc.resize(inv.tensors.size());
  // The base's tensors as buffers (inventory order), for decoding context-coded chunks.
  std::vector<TensorBuffer> base_bufs;
  if (base) {
    for (size_t i = 0; i < inv.tensors.size(); ++i) {
      const TensorInfo* bt = base->Find(inv.tensors[i].name);
      if (bt == nullptr) return DataLossError("base lacks tensor " + inv.tensors[i].name);
      base_bufs.push_back(TensorBuffer{const_cast<uint8_t*>(base->data(*bt)), bt->num_elements(),
                                       bt->width(), inv.salts[i]});
    }
  }
  for (size_t i = 0; i < d.num_chunks(); ++i) {
    const std::string where = "chunk table entry " + std::to_string(i);
    auto ph = ParseChunkHeader(d.chunk_data(i), d.chunk_size(i), nullptr, nullptr);
    if (!ph.ok()) return ph.status().WithContext(where);
    StatusOr<DecodedChunk> dc = DecodedChunk{};
    if (IsContextCoded(*ph)) {
      ++t.context_chunks;
      if (!base) {
        // Counted from the header: changes and bytes shared over the segments by elements.
        t.modes["context+" + std::string(ValueModeName(ph->value_mode))]++;
        for (const Segment& sg : ph->segments) {
          if (sg.tensor_index >= t.acc.size()) return DataLossError("tensor index out of range");
          const double share = static_cast<double>(sg.num_elements()) / ph->num_elements;
          t.acc[sg.tensor_index].payload += share * d.chunk_size(i);
          t.acc[sg.tensor_index].changed +=
              static_cast<uint64_t>(std::llround(share * ph->num_changes));
        }
        t.uncounted += ph->num_changes;
        continue;
      }
      std::vector<uint8_t> covered;
      Status s = GatherCoveredBits(*ph, base_bufs, &covered);
      if (s.ok())
        s = DecodeContextChunkInto(d.chunk_data(i), d.chunk_size(i), covered.data(), covered.size(),
                                   &*dc);
      if (!s.ok()) return s.WithContext(where);
    } else {
      dc = d.Decode(i);
    }
    if (!dc.ok()) return dc.status().WithContext(where);
    DCR_RETURN_IF_ERROR(TallyDecodedChunk(d, i, *dc, base, &t));
  }
  return t;
}

// The report of `dcr inspect --json`: the delta's header, chunk modes, one row per tensor (in the
// listing's order and number) and the totals over every tensor.
nlohmann::json InspectReport(const std::string& path, const DeltaReader& d, const Checkpoint* base,
                             const std::string& warning, const ChunkTally& t,
                             const Listing& listing) {
  const Inventory& inv = d.inventory();
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
    for (const InventoryFile& f : inv.files)
      files.push_back({{"name", f.name}, {"bytes", f.file_size()}});
    out["target_files"] = files;
    out["target_index"] = inv.index_name;
  }
  out["chunk_modes"] = t.modes;
  out["context_chunks"] = t.context_chunks;
  if (t.uncounted > 0) out["changes_without_values"] = t.uncounted;
  out["entropy_of"] = base ? "xor" : "payload values (xor or ulp delta as coded)";
  if (!warning.empty()) out["warning"] = warning;
  uint64_t te = 0, tc = 0, td = 0;
  double tb = 0, tb2 = 0;
  nlohmann::json tensors = nlohmann::json::array();
  for (size_t i = 0; i < inv.tensors.size(); ++i) {
    const TensorInfo& ti = inv.tensors[i];
    const TensorAcc& a = t.acc[i];
    double bound = BoundBits(ti.num_elements(), a.changed, a.hist) / 8;
    nlohmann::json j;
    j["name"] = ti.name;
    j["dtype"] = ti.dtype_name;
    j["elements"] = ti.num_elements();
    j["changed"] = a.changed;
    j["change_rate"] = ti.num_elements() ? static_cast<double>(a.changed) / ti.num_elements() : 0.0;
    j["unchanged"] = a.changed == 0;
    j["payload_bytes"] = static_cast<uint64_t>(std::llround(a.payload));
    j["dense_bytes"] = ti.nbytes;
    // Undefined (null) without payload or bound: an unchanged tensor costs no chunk bytes.
    j["ratio"] = a.payload > 0 ? nlohmann::json(ti.nbytes / a.payload) : nlohmann::json();
    j["bound_bytes"] = bound;
    j["payload_vs_bound"] = bound > 0 ? nlohmann::json(a.payload / bound) : nlohmann::json();
    if (base) {
      const TensorInfo* bt = base->Find(ti.name);
      const double b2 = Bound2Bits(base->data(*bt), ti.width(), ti.num_elements(), a) / 8;
      j["bound2_bytes"] = b2;
      j["payload_vs_bound2"] = b2 > 0 ? nlohmann::json(a.payload / b2) : nlohmann::json();
      tb2 += b2;
    }
    tensors.push_back(j);
    te += ti.num_elements();
    tc += a.changed;
    td += ti.nbytes;
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
  if (base) {
    tot["bound2_bytes"] = tb2;
    tot["payload_vs_bound2"] = tb2 > 0 ? d.size() / tb2 : 0.0;
  }
  out["total"] = tot;
  return out;
}

// Prints the report `out` (InspectReport of `d`) as the human-readable table.
void PrintInspectTable(const std::string& path, const DeltaReader& d, const nlohmann::json& out,
                       bool have_base, const Listing& listing) {
  const Inventory& inv = d.inventory();
  const nlohmann::json& rows = out["tensors"];
  const nlohmann::json& tot = out["total"];
  const size_t tensor_count = out["tensor_count"].get<size_t>();
  const uint64_t context_chunks = out["context_chunks"].get<uint64_t>();
  const double tb = tot["bound_bytes"].get<double>();
  const double tb2 = have_base ? tot["bound2_bytes"].get<double>() : 0.0;
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
  row("TOTAL", "", tot["elements"].get<uint64_t>(), std::to_string(tot["changed"].get<uint64_t>()),
      fixed(tot["change_rate"], "%.4f", 100), tot["dense_bytes"].get<uint64_t>(), d.size(),
      fixed(tot["ratio"], "%.1f"), fixed(tot["payload_vs_bound"], "%.3f"));
  if (rows.size() < tensor_count || listing.sort != "name") {
    std::printf(
        "%zu of %zu tensors shown, sorted by %s; TOTAL covers all of them (payload: the "
        "whole delta)\n",
        rows.size(), tensor_count, listing.sort.c_str());
  }
  std::printf("bound = order-0 entropy of positions + %s\n",
              have_base ? "XOR values"
                        : "coded values (pass the delta's base as --base for the XOR bound)");
  if (have_base) {
    std::printf(
        "bound2 = positions and ulp values conditioned on the base exponent: %.0f bytes; "
        "delta %.3fx bound0, %.3fx bound2; %llu of %zu chunks context-coded\n",
        tb2, tb > 0 ? d.size() / tb : 0.0, tb2 > 0 ? d.size() / tb2 : 0.0,
        static_cast<unsigned long long>(context_chunks), d.num_chunks());
  } else if (context_chunks > 0) {
    std::printf(
        "%llu of %zu chunks context-coded: their changes are counted from the chunk "
        "headers (pass the delta's base as --base to decode them and for bound2)\n",
        static_cast<unsigned long long>(context_chunks), d.num_chunks());
  }
}

int RunInspect(const std::string& path, const std::string& base_path, bool json,
               const Listing& listing) {
  auto r = DeltaReader::Open(path);
  if (!r.ok()) return ReportStatus("inspect", r.status());
  const DeltaReader& d = **r;
  std::unique_ptr<Checkpoint> base;
  std::string warning;
  if (!base_path.empty()) {
    auto b = OpenMatchingBase(d, base_path, &warning);
    if (!b.ok()) return ReportStatus("inspect", b.status());
    base = std::move(*b);
  }
  auto t = TallyChunks(d, base.get());
  if (!t.ok()) return ReportStatus("inspect", t.status());
  const nlohmann::json out = InspectReport(path, d, base.get(), warning, *t, listing);
  if (json) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  PrintInspectTable(path, d, out, base != nullptr, listing);
  return 0;
}

}  // namespace

DCR_REGISTER_COMMAND("inspect",
                     "Per-tensor and total statistics of a delta (sizes, rates, entropy bound)",
                     [](CLI::App* app) {
                       struct Args {
                         std::string path, base;
                         bool json = false;
                         Listing listing;
                       };
                       auto a = std::make_shared<Args>();
                       app->add_option("delta", a->path, "Delta file")->required();
                       app->add_option(
                           "--base", a->base,
                           "Base checkpoint: report the XOR-delta bound exactly and "
                           "bound2 (exponent-conditioned), decode context-coded chunks");
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
