// ApplyWanChoice (run_wan_choice.h).
#include "run_wan_choice.h"

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "dcr/checkpoint.h"
#include "dcr/context.h"
#include "dcr/status_macros.h"
#include "dcr/wan_choice.h"

namespace dcr::cli {
namespace {

// Grid cells encoded for the sample, and the least CPU time its transcoding is measured over.
constexpr uint64_t kSampleCells = 8;
constexpr double kMinTranscodeSeconds = 0.05;
constexpr int kMaxTranscodePasses = 20;

double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

std::string Num(double v) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.4g", v);
  return b;
}

}  // namespace

StatusOr<std::string> ApplyWanChoice(const Scenario& s, const std::string& base,
                                     const std::string& target, std::vector<NodePlan>* plans) {
  if (plans->empty()) return std::string();
  const NodePlan& sender = (*plans)[0];
  if (!sender.context_coding || sender.edge_relays.empty() || sender.method != "delta" ||
      sender.transport != "relay_tree") {
    return std::string();
  }
  const double link_Bps = s.network.long_link.bandwidth_Bps;
  if (link_Bps <= 0) {
    return std::string(
        "context form as configured: the long link has no rate (network.long_link.bandwidth "
        "unlimited), so no edge relay can be sized against it");
  }
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> b, Checkpoint::Open(base));
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> t, Checkpoint::Open(target));
  DeltaOptions o;
  o.chunk_elems = s.delta.chunk_elems;
  o.zstd_level = s.delta.zstd_level;
  o.context_coding = true;
  o.context_classes = sender.context_classes;
  o.threads = 1;
  std::vector<ContextSampleRecord> records;
  DCR_ASSIGN_OR_RETURN(ContextSizeSample sample,
                       SampleContextSize(*b, *t, o, kSampleCells, &records));
  const double dense = static_cast<double>(t->total_tensor_bytes());
  const std::string sampled = std::to_string(sample.sampled_cells) + " of " +
                              std::to_string(sample.cells) + " grid cells sampled";
  if (records.empty() || sample.dense_bytes == 0) {
    return "context form as configured: no sampled chunk is smaller context-coded (" + sampled +
           "), so the edge relay has nothing to transcode";
  }
  // The transcoding speed of one thread: the best of repeated passes over the sampled records.
  double covered = 0;
  for (const ContextSampleRecord& r : records) covered += static_cast<double>(r.base.size());
  double best = 0;
  double spent = 0;
  for (int pass = 0; pass < kMaxTranscodePasses && (pass < 2 || spent < kMinTranscodeSeconds);
       ++pass) {
    const double t0 = ThreadCpuSeconds();
    for (const ContextSampleRecord& r : records) {
      DCR_ASSIGN_OR_RETURN(std::vector<uint8_t> plain,
                           ContextChunkToPlain(r.record.data(), r.record.size(), r.base.data(),
                                               r.base.size(), o.zstd_level));
      (void)plain;
    }
    const double dt = std::max(ThreadCpuSeconds() - t0, 1e-9);
    spent += dt;
    best = std::max(best, covered / dt);
  }
  const double context_payload =
      static_cast<double>(sample.context_bytes) * dense / static_cast<double>(sample.dense_bytes);
  int edge_threads = 0;
  for (int e : sender.edge_relays) {
    if (e > 0 && e < static_cast<int>(plans->size())) {
      edge_threads = std::max(edge_threads, std::max(1, (*plans)[e].relay.max_parallel_applies));
    }
  }
  // A split's edge relays (a chain) get the chunks in canonical order, so one range at a time:
  // each must keep up alone, as one edge relay does.
  const WanChoice c = ChooseWanEncoding(link_Bps, dense, context_payload, edge_threads, best);
  std::string text = "context form about " + Num(context_payload) + " B for " + Num(dense) +
                     " dense B (" + sampled + "); edge relay: " + std::to_string(edge_threads) +
                     " transcoding threads at " + Num(best) + " dense B/s each (measured on the " +
                     "sample): " + Num(c.edge_dense_Bps) + " dense B/s against the " +
                     Num(c.link_dense_Bps) + " the long link delivers at " + Num(link_Bps) + " B/s";
  if (c.context) return text + ": it keeps up, the long link carries the context form";
  for (NodePlan& p : *plans) {
    p.context_coding = false;
    p.edge_relays.clear();
    p.edge_range_first = p.edge_range_end = 0;
    p.edge_lag_bytes = 0;
  }
  return text + ": it would lag, the long link carries the plain form";
}

}  // namespace dcr::cli
