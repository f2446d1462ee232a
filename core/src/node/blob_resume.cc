#include "node/blob_resume.h"

#include <algorithm>
#include <cstring>
#include <iterator>

#include "dcr/statusor.h"

namespace dcr::internal {

void HeldRanges::Add(uint64_t offset, uint64_t length) {
  if (length == 0) return;
  uint64_t start = offset;
  uint64_t end = offset + length;
  // Merge with every range that overlaps or touches [start, end).
  auto it = ranges_.upper_bound(start);
  if (it != ranges_.begin()) {
    auto prev = std::prev(it);
    if (prev->second >= start) it = prev;
  }
  while (it != ranges_.end() && it->first <= end) {
    start = std::min(start, it->first);
    end = std::max(end, it->second);
    it = ranges_.erase(it);
  }
  ranges_[start] = end;
}

uint64_t HeldRanges::Prefix() const {
  auto it = ranges_.find(0);
  return it == ranges_.end() ? 0 : it->second;
}

uint64_t HeldRanges::Held() const {
  uint64_t n = 0;
  for (const auto& [start, end] : ranges_) n += end - start;
  return n;
}

Status FetchRemainder(ObjectStore& store, const std::string& key, uint64_t size,
                      uint64_t range_bytes, std::vector<uint8_t>* bytes, uint64_t* have,
                      uint64_t* fetched, bool* other_size) {
  *other_size = false;
  if (bytes->size() != size || *have > size || range_bytes == 0) {
    return InvalidArgumentError("resumed fetch of " + key + ": bad buffer or offset");
  }
  do {
    const uint64_t want = std::min(range_bytes, size - *have);
    const bool last = *have + want == size;
    StatusOr<std::vector<uint8_t>> got = store.GetRange(key, *have, last ? want + 1 : want);
    if (!got.ok() && got.status().IsInvalidArgument()) {  // the offset is past the object's end
      *other_size = true;
      return DataLossError("object " + key + " is shorter than the " + std::to_string(*have) +
                           " bytes held: " + got.status().message());
    }
    if (!got.ok()) return got.status();
    *fetched += got->size();
    if (got->size() != want) {
      *other_size = true;
      return DataLossError("object " + key + " is not the " + std::to_string(size) +
                           " bytes listed (" + std::to_string(got->size()) + " bytes at offset " +
                           std::to_string(*have) + ")");
    }
    if (want > 0) std::memcpy(bytes->data() + *have, got->data(), want);
    *have += want;
  } while (*have < size);
  return Status();
}

}  // namespace dcr::internal
