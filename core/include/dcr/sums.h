// Sums files: a checkpoint's content hash bound to its bytes by fast plain hashes.
//
// The content hash (dcr/hash.h) costs a multiply-based term per element; a build that starts from a
// checkpoint whose content hash is already known (the target of the previous build) need not
// recompute it, provided the checkpoint is still the one that hash describes. A sums file records
// the content hash together with the XXH3-128 of every region of `region_bytes` bytes of every file
// of the checkpoint (headers included). Checking a checkpoint against its sums reads each byte once
// through XXH3 (several GB/s per core, against ~1.9 GB/s for the element terms): when every file
// has the recorded size and every region its recorded hash, the recorded content hash is the
// checkpoint's.
//
// Who may write one: a sums file is exactly as trusted as the checkpoint beside it. `dcr sums`
// writes one from a full content hash; `dcr diff --target-sums` writes the target's from the
// delta's target hash, which is the base's (checked) hash updated by every element that differs. A
// forged content hash with matching regions makes a delta whose base hash no holder of the true
// base accepts (its held hash differs); it cannot make a receiver end with other bytes.
//
// Text format, one record per line (core/FORMAT.md section 4.1):
//   dcr-sums 1
//   content <32 hex digits, the content hash as Hash128::ToHex>
//   region-bytes <decimal>
//   files <decimal count>
//   file <decimal size> <JSON string: the file's name in the checkpoint, "" for a single file>
//   <32 hex digits: XXH3-128 of each region of that file, ceil(size / region-bytes) lines>
//   ... (one file line and its regions per file, in Checkpoint::files() order)
//   end <32 hex digits: BytesHash128 of every byte before this line>
//
// Thread safety: pure functions; the checkpoint is only read.
#ifndef DCR_CORE_INCLUDE_DCR_SUMS_H_
#define DCR_CORE_INCLUDE_DCR_SUMS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {

// The region size `dcr sums` and `dcr diff --target-sums` use: 64 MiB, so that a 2 TB checkpoint
// has ~30k regions (a ~1 MB sums file) and its check spreads over every core.
inline constexpr uint64_t kSumsRegionBytes = uint64_t{64} << 20;
// Region sizes a sums file may declare.
inline constexpr uint64_t kSumsMinRegionBytes = uint64_t{1} << 12;
inline constexpr uint64_t kSumsMaxRegionBytes = uint64_t{1} << 40;
// The largest sums file ReadSums accepts (a 64 TB checkpoint in 64 MiB regions is ~35 MB).
inline constexpr uint64_t kSumsMaxFileBytes = uint64_t{256} << 20;

struct CheckpointSums {
  struct File {
    std::string name;  // CheckpointFile::name: empty for a single-file checkpoint
    uint64_t size = 0;
    std::vector<Hash128> regions;  // XXH3-128 of bytes [r * region_bytes, (r + 1) * region_bytes)
  };
  Hash128 content_hash;
  uint64_t region_bytes = kSumsRegionBytes;
  std::vector<File> files;
};

// The sums of `ckpt` with the given content hash (the caller's: Checkpoint::ContentHash, or the
// target hash of a delta built to it), region hashes computed with `threads` workers (0 = all
// cores; the result never depends on it). REQUIRES: region_bytes in
// [kSumsMinRegionBytes, kSumsMaxRegionBytes].
CheckpointSums ComputeSums(const Checkpoint& ckpt, const Hash128& content_hash, int threads,
                           uint64_t region_bytes = kSumsRegionBytes);

// OK when `ckpt` has exactly the files of `sums` (same names, in order, same sizes) and every
// region hashes as recorded; `threads` workers. kFailedPrecondition otherwise, naming the first
// file that differs and, for a region, its byte range ("the checkpoint changed after its sums were
// written, or the sums are another checkpoint's").
Status CheckSums(const Checkpoint& ckpt, const CheckpointSums& sums, int threads);

// The text form (format above), and back. ParseSums: kDataLoss for anything but a whole,
// well-formed sums file whose end line matches (truncated, corrupted, a count or region list
// that disagrees with the sizes, names repeated); it allocates no more than the text's size.
std::string FormatSums(const CheckpointSums& sums);
StatusOr<CheckpointSums> ParseSums(std::string_view text);

// Reads and parses a sums file (kNotFound when absent; kDataLoss above kSumsMaxFileBytes or
// malformed, naming the path). WriteSums writes one atomically: the file appears whole or the old
// one stays.
StatusOr<CheckpointSums> ReadSums(const std::string& path);
Status WriteSums(const std::string& path, const CheckpointSums& sums);

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_SUMS_H_
