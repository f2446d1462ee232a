// safetensors header parsing shared by Checkpoint and Inventory (internal).
#ifndef DCR_CORE_SRC_INTERNAL_SAFETENSORS_H_
#define DCR_CORE_SRC_INTERNAL_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"

namespace dcr::internal {

// The largest safetensors JSON header read (the safetensors reference limit, 100 MiB); a delta
// header's inventory (the target's header, verbatim) has the same cap.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = uint64_t{100} << 20;

// Parses the JSON header `json[0..n)`. Offsets must lie within `data_size` bytes (pass
// UINT64_MAX when the data section is not present). Strict: refuses (kDataLoss, naming the
// tensor) duplicate keys in any object, a dimension above INT64_MAX, a shape whose elements
// overflow or do not match the bytes of a known dtype (or, for a dtype this build does not
// know, could not occupy them at 1 bit to 16 bytes each), and tensors that do not tile the data
// section from offset 0 without gap or overlap (with a data section: up to its end). Tensors
// come back sorted by data offset; `data_end` receives the largest end offset.
Status ParseSafetensorsJson(const char* json, size_t n, uint64_t data_size,
                            std::vector<TensorInfo>* tensors,
                            std::map<std::string, std::string>* metadata, uint64_t* data_end);

// A name a checkpoint directory may hold as a shard or index: not empty, at most 255 bytes, no '/'
// or NUL, not hidden (so also not "." or ".."). Shard names from an index or a delta header are
// checked with it, so that no name leads out of the directory.
bool IsPlainFileName(const std::string& name);

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_INTERNAL_SAFETENSORS_H_
