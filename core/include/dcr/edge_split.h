// Edge relays that split the canonical base and its decoding by chunk range: which edge relay
// transcodes which chunks, in what order the sender produces them, and how few edge relays keep
// up with the long link. One policy, used by the shipped nodes (EdgeTranscoder's range) and by
// the simulator (sim/, its edge-relay hosts).
//
// Ranges are contiguous in canonical chunk order (chunk ids) and balanced by the dense bytes the
// chunks cover, so each edge relay holds only the base tensors its range covers: about
// dense / count bytes. Contiguous ranges alone do not share the decoding: a sender that produces
// chunks in canonical order delivers range k only after range k - 1, each at the link's whole
// rate. The sender therefore produces them interleaved (InterleavedChunkOrder): at every point of
// the stream each range has delivered about the same share of its bytes, so each edge relay
// receives its range at about link rate / count and needs only that share of the transcoding
// throughput.
//
// Pure functions of their arguments. Thread safety: thread-safe.
#ifndef DCR_CORE_INCLUDE_DCR_EDGE_SPLIT_H_
#define DCR_CORE_INCLUDE_DCR_EDGE_SPLIT_H_

#include <cstdint>
#include <vector>

#include "dcr/statusor.h"

namespace dcr {

// Chunks [first, end) of the canonical order, held and transcoded by one edge relay.
struct EdgeRange {
  uint64_t first = 0;
  uint64_t end = 0;
  uint64_t dense_bytes = 0;  // the dense bytes its chunks cover (its share of the base)
  bool Contains(uint64_t chunk) const { return chunk >= first && chunk < end; }
  bool operator==(const EdgeRange& o) const {
    return first == o.first && end == o.end && dense_bytes == o.dense_bytes;
  }
};

// Splits chunks 0 .. n-1 (`chunk_dense[i]`: the dense bytes chunk i covers) into `count`
// contiguous, non-empty ranges in order, balanced by dense bytes: range k ends at the first chunk
// boundary where the bytes before it reach (k + 1) / count of the total, or earlier where the
// ranges after it would otherwise be empty. Errors: kInvalidArgument when count < 1 or
// count > n.
StatusOr<std::vector<EdgeRange>> SplitChunkRanges(const std::vector<uint64_t>& chunk_dense,
                                                  int count);

// The index of the range of `ranges` that holds `chunk`; -1 when none does.
int EdgeRangeOf(const std::vector<EdgeRange>& ranges, uint64_t chunk);

// Every chunk of `ranges` once, in the order a sender produces them for a split: each next chunk
// is the next one of the range that has delivered the smallest share of its dense bytes so far
// (ties: the lowest range), so the ranges advance together; within a range, canonical order.
// One range: canonical order.
std::vector<uint64_t> InterleavedChunkOrder(const std::vector<EdgeRange>& ranges);

// The smallest set of edge relays that keeps up with the long link.
struct EdgeSplitChoice {
  bool context = false;       // a split within the bounds keeps up: the long link is context-coded
  int count = 0;              // edge relays (0 when none keeps up)
  int cores = 0;              // transcoding cores of each
  double base_bytes = 0;      // base each holds: dense / count
  double edge_dense_Bps = 0;  // one edge relay's transcoding throughput (dense bytes/s)
  double link_dense_Bps = 0;  // dense bytes/s the link delivers to one edge relay's range
};

// Fewest edge relays first (1 .. max_count), then fewest cores each (1 .. max_cores), such that
// each holds at most `max_base_bytes` of the base (0: no bound) and keeps up with its share of
// the link: ChooseWanEncoding(link_Bps / count, dense, context_payload, cores, transcode_Bps)
// (dcr/wan_choice.h) chooses the context form. The share assumes balanced ranges produced
// interleaved (see the file comment) and context bytes in proportion to dense bytes. When no
// split within the bounds keeps up: context = false and the throughputs of the largest one.
EdgeSplitChoice ChooseEdgeSplit(double link_Bps, double dense, double context_payload,
                                double transcode_Bps, int max_count, int max_cores,
                                double max_base_bytes);

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_EDGE_SPLIT_H_
