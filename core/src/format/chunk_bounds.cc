// Bounds of a chunk record against its tensors (see internal/chunk_bounds.h).
#include "internal/chunk_bounds.h"

#include <algorithm>
#include <string>
#include <utility>

#include "dcr/status_macros.h"

namespace dcr::internal {

namespace {

// Segment sg of chunk `h` against a tensor of n elements of width w: in bounds, or why not.
// The lowest and highest element reached are computed in 128 bits (count up to 2^34 times any
// 64-bit stride).
const char* SegmentFits(const ChunkHeader& h, const Segment& sg, uint64_t n, int w) {
  if (w != h.elem_width) return "has the chunk's element width, not its tensor's";
  if (sg.ndim < 1 || sg.ndim > kMaxSegmentDims) return "has a bad ndim";
  __int128 lo = sg.offset, hi = sg.offset;
  for (uint32_t d = 0; d < sg.ndim; ++d) {
    if (sg.count[d] == 0) return "has an empty dimension";
    const __int128 span = static_cast<__int128>(sg.count[d] - 1) * sg.stride[d];
    if (span < 0)
      lo += span;
    else
      hi += span;
  }
  if (lo < 0 || hi >= static_cast<__int128>(n)) return "lies outside its tensor's elements";
  return nullptr;
}

template <typename Bound>
Status Check(const ChunkHeader& h, size_t num_tensors, Bound&& bound) {
  auto fail = [&](size_t i, const std::string& why) {
    const Segment& sg = h.segments[i];
    std::string where = "chunk " + std::to_string(h.chunk_id) + ": segment " + std::to_string(i);
    if (sg.tensor_index < num_tensors) {
      where += " (tensor " + std::to_string(sg.tensor_index) + " of " +
               std::to_string(bound(sg.tensor_index).first) + " elements)";
    }
    return DataLossError(where + " " + why);
  };
  // Elements per tensor named, for the overlap bound: (tensor, elements), one entry per segment.
  thread_local std::vector<std::pair<uint32_t, unsigned __int128>> per_tensor;
  per_tensor.clear();
  unsigned __int128 total = 0;
  for (size_t i = 0; i < h.segments.size(); ++i) {
    const Segment& sg = h.segments[i];
    if (sg.tensor_index >= num_tensors) {
      return fail(i, "names tensor index " + std::to_string(sg.tensor_index) + ", out of range (" +
                         std::to_string(num_tensors) + " tensors)");
    }
    const auto [n, w] = bound(sg.tensor_index);
    if (const char* why = SegmentFits(h, sg, n, w)) return fail(i, why);
    unsigned __int128 m = 1;
    for (uint32_t d = 0; d < sg.ndim; ++d) m *= sg.count[d];  // <= (2^34)^4: fits 128 bits
    if (m > n) return fail(i, "covers more elements than its tensor has");
    total += m;
    per_tensor.push_back({sg.tensor_index, m});
  }
  if (total != h.num_elements) {
    return DataLossError("chunk " + std::to_string(h.chunk_id) +
                         ": segments do not cover num_elements");
  }
  if (per_tensor.size() > 1) {
    std::sort(per_tensor.begin(), per_tensor.end());
    for (size_t i = 0; i < per_tensor.size();) {
      const uint32_t t = per_tensor[i].first;
      unsigned __int128 sum = 0;
      for (; i < per_tensor.size() && per_tensor[i].first == t; ++i) sum += per_tensor[i].second;
      if (sum > bound(t).first) {
        return DataLossError("chunk " + std::to_string(h.chunk_id) +
                             ": its segments cover more "
                             "elements of tensor " +
                             std::to_string(t) +
                             " than it has "
                             "(segments overlap)");
      }
    }
  }
  return Status::OK();
}

}  // namespace

std::vector<TensorBound> TensorBounds(const Inventory& inventory) {
  std::vector<TensorBound> out;
  out.reserve(inventory.tensors.size());
  for (const TensorInfo& t : inventory.tensors) {
    const int w = std::max(1, t.width());
    out.push_back(TensorBound{t.nbytes / static_cast<uint64_t>(w), w});
  }
  return out;
}

Status CheckChunkBounds(const ChunkHeader& h, const TensorBound* tensors, size_t num_tensors) {
  return Check(h, num_tensors, [&](uint32_t i) {
    return std::pair<uint64_t, int>(tensors[i].num_elements, tensors[i].width);
  });
}

Status CheckChunkBounds(const ChunkHeader& h, const std::vector<TensorBuffer>& tensors) {
  return Check(h, tensors.size(), [&](uint32_t i) {
    return std::pair<uint64_t, int>(tensors[i].num_elements, tensors[i].width);
  });
}

Status CheckChunkBounds(const ChunkHeader& h, const Inventory& inventory) {
  return Check(h, inventory.tensors.size(), [&](uint32_t i) {
    const TensorInfo& t = inventory.tensors[i];
    const int w = std::max(1, t.width());
    return std::pair<uint64_t, int>(t.nbytes / static_cast<uint64_t>(w), w);
  });
}

StatusOr<ChunkHeader> ParseCheckedChunkHeader(const uint8_t* data, size_t size,
                                              const std::vector<TensorBound>& tensors,
                                              size_t* header_size, size_t* record_size) {
  DCR_ASSIGN_OR_RETURN(ChunkHeader h, ParseChunkHeader(data, size, header_size, record_size));
  DCR_RETURN_IF_ERROR(CheckChunkBounds(h, tensors));
  return h;
}

}  // namespace dcr::internal
