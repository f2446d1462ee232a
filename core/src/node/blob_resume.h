// Internal: resume of an interrupted blob by (blob, offset) in the node driver. A node keeps the
// bytes of every blob it holds when its stream moves to the object store (a lost parent, a
// failed tree stream) or a fetch is cut; the store fetch of such a blob starts at the first byte
// the node does not hold and advances range by range, so nothing the node holds crosses a link
// again:
//   * pieces from the parent: the blob's contiguous prefix [0, Prefix()) is kept, and the fetch
//     continues at that byte offset (pieces held beyond a gap are fetched again);
//   * a store fetch cut midway (a connection lost, an error): the next attempt continues at the
//     end of the last whole range it read.
//
// Thread safety: HeldRanges is a value type (callers serialize access); FetchRemainder is
// reentrant for distinct buffers.
#ifndef DCR_CORE_SRC_NODE_BLOB_RESUME_H_
#define DCR_CORE_SRC_NODE_BLOB_RESUME_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dcr/object_store.h"
#include "dcr/status.h"

namespace dcr::internal {

// The byte ranges of one blob a node holds.
class HeldRanges {
 public:
  // Records bytes [offset, offset + length) as held (overlaps and duplicates are merged).
  void Add(uint64_t offset, uint64_t length);
  // Bytes [0, Prefix()) are held: the offset a resumed fetch starts at.
  uint64_t Prefix() const;
  // Bytes held in all.
  uint64_t Held() const;

 private:
  std::map<uint64_t, uint64_t> ranges_;  // start -> end, disjoint and not adjacent
};

// Smallest range a resumed fetch reads at a time: the granularity at which a cut store fetch
// resumes (a smaller piece_bytes would cost one store request per piece).
inline constexpr uint64_t kMinFetchRangeBytes = uint64_t{1} << 20;

// Reads bytes [*have, size) of object `key` of `store` into (*bytes)[*have, size), at most
// `range_bytes` per request, advancing *have after every range read whole and adding the
// bytes read to *fetched. A call after a failure continues at *have. The last request asks
// for one byte more, so that an object larger than `size` is told apart.
// REQUIRES: bytes->size() == size, *have <= size, range_bytes > 0.
// Errors: the store's (kNotFound, kUnavailable, ...); kDataLoss with *other_size set when the
// object is not `size` bytes long (shorter or longer: it is not the blob the held bytes belong
// to, and the caller fetches it whole instead).
Status FetchRemainder(ObjectStore& store, const std::string& key, uint64_t size,
                      uint64_t range_bytes, std::vector<uint8_t>* bytes, uint64_t* have,
                      uint64_t* fetched, bool* other_size);

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_BLOB_RESUME_H_
