// Edge relays split by chunk range (dcr/edge_split.h).
#include "dcr/edge_split.h"

#include <algorithm>
#include <string>

#include "dcr/wan_choice.h"

namespace dcr {

StatusOr<std::vector<EdgeRange>> SplitChunkRanges(const std::vector<uint64_t>& chunk_dense,
                                                  int count) {
  const uint64_t n = chunk_dense.size();
  if (count < 1 || static_cast<uint64_t>(count) > n) {
    return InvalidArgumentError("edge relays: " + std::to_string(count) +
                                " ranges asked of a delta of " + std::to_string(n) +
                                " chunks (need 1 .. the chunk count)");
  }
  long double total = 0;
  for (uint64_t b : chunk_dense) total += static_cast<long double>(b);
  std::vector<EdgeRange> ranges;
  ranges.reserve(static_cast<size_t>(count));
  uint64_t next = 0;
  long double before = 0;  // dense bytes of the chunks before `next`
  for (int k = 0; k < count; ++k) {
    EdgeRange r;
    r.first = next;
    const uint64_t last_end = n - static_cast<uint64_t>(count - 1 - k);  // leave one per range
    const long double goal = total * static_cast<long double>(k + 1) / count;
    uint64_t end = next + 1;  // never empty
    before += static_cast<long double>(chunk_dense[next]);
    r.dense_bytes = chunk_dense[next];
    while (end < last_end && (k == count - 1 || before < goal)) {
      before += static_cast<long double>(chunk_dense[end]);
      r.dense_bytes += chunk_dense[end];
      ++end;
    }
    r.end = end;
    next = end;
    ranges.push_back(r);
  }
  return ranges;
}

int EdgeRangeOf(const std::vector<EdgeRange>& ranges, uint64_t chunk) {
  for (size_t k = 0; k < ranges.size(); ++k) {
    if (ranges[k].Contains(chunk)) return static_cast<int>(k);
  }
  return -1;
}

std::vector<uint64_t> InterleavedChunkOrder(const std::vector<EdgeRange>& ranges) {
  std::vector<uint64_t> order;
  std::vector<uint64_t> at(ranges.size());
  std::vector<long double> done(ranges.size(), 0);  // chunks delivered, as a share of the range
  for (size_t k = 0; k < ranges.size(); ++k) at[k] = ranges[k].first;
  for (;;) {
    int pick = -1;
    for (size_t k = 0; k < ranges.size(); ++k) {
      if (at[k] >= ranges[k].end) continue;
      if (pick < 0 || done[k] < done[static_cast<size_t>(pick)]) pick = static_cast<int>(k);
    }
    if (pick < 0) return order;
    const EdgeRange& r = ranges[static_cast<size_t>(pick)];
    order.push_back(at[static_cast<size_t>(pick)]++);
    // Chunks without dense bytes (none in a real grid) still advance the range by count.
    done[static_cast<size_t>(pick)] =
        static_cast<long double>(at[static_cast<size_t>(pick)] - r.first) /
        static_cast<long double>(r.end - r.first);
  }
}

EdgeSplitChoice ChooseEdgeSplit(double link_Bps, double dense, double context_payload,
                                double transcode_Bps, int max_count, int max_cores,
                                double max_base_bytes) {
  EdgeSplitChoice last;
  for (int k = 1; k <= max_count; ++k) {
    const double share = dense / k;
    if (max_base_bytes > 0 && share > max_base_bytes) continue;
    for (int c = 1; c <= max_cores; ++c) {
      const WanChoice w = ChooseWanEncoding(link_Bps / k, dense, context_payload, c, transcode_Bps);
      last = EdgeSplitChoice{w.context, w.context ? k : 0, c,
                             share,     w.edge_dense_Bps,  w.link_dense_Bps};
      if (w.context) {
        last.count = k;
        return last;
      }
    }
  }
  return last;
}

}  // namespace dcr
