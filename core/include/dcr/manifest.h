// Manifest records (format version 6, core/FORMAT.md section 2.4): the signed lists of chunk
// SHA-256s that a signed delta stream (kFlagSigned) carries before the chunks they list. A final
// manifest may also carry the commitment root of the target (flag kManifestFlagCommitment,
// dcr/commitment.h): what a receiver compares the version it holds after apply with.
//
// This header is the byte layer only: building and parsing records, no cryptography (the format
// library links no crypto). Signing and verification (Ed25519 over the record, SHA-256 of chunk
// records and of the header) are in dcr/signing.h.
//
// Thread safety: plain data and free functions.
#ifndef DCR_CORE_INCLUDE_DCR_MANIFEST_H_
#define DCR_CORE_INCLUDE_DCR_MANIFEST_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/format.h"
#include "dcr/statusor.h"

namespace dcr {

using Sha256Digest = std::array<uint8_t, 32>;
using Ed25519PublicKey = std::array<uint8_t, 32>;
using Ed25519Signature = std::array<uint8_t, 64>;

// Most entries one record lists, and the largest record (a decoder refuses more before it
// allocates anything).
inline constexpr uint32_t kMaxManifestEntries = 1u << 16;
inline constexpr uint32_t kManifestFlagFinal = 1u << 0;
// The final manifest carries the target's commitment root and its leaves (after target_hash).
// Only with kManifestFlagFinal.
inline constexpr uint32_t kManifestFlagCommitment = 1u << 1;
// Bytes at the end of a record that its signature does not cover: the signature itself.
inline constexpr size_t kManifestSignatureBytes = 64;

// One chunk a manifest vouches for.
struct ManifestEntry {
  uint64_t chunk_id = 0;
  Sha256Digest plain{};      // SHA-256 of the chunk record in its plain encoding
  bool has_context = false;  // the chunk also has a context-coded form
  Sha256Digest context{};    // SHA-256 of that form's record (has_context)
};

struct Manifest {
  bool final = false;     // the last manifest of the delta: num_chunks and target_hash are set
  uint32_t sequence = 0;  // 0, 1, 2, ... in stream order
  uint64_t run_id = 0;    // the run the signer meant the delta for (0 = none named)
  uint64_t base_version = 0;
  Hash128 base_hash;
  uint64_t target_version = 0;
  Sha256Digest header_sha256{};  // SHA-256 of the delta's file header bytes
  std::vector<ManifestEntry> entries;
  uint64_t num_chunks = 0;  // final: chunk records of the whole delta (its trailer's table)
  Hash128 target_hash;      // final: the trailer's target hash
  // final, optional: the commitment root of the target (dcr/commitment.h), the proof a receiver
  // checks what it holds against, and the tree's leaves (empty = not carried), which let a
  // receiver whose root differs name the first wrong range. Encoded with kManifestFlagCommitment.
  std::optional<Sha256Digest> commitment;
  std::vector<Sha256Digest> commitment_leaves;
  Ed25519PublicKey signer{};
  Ed25519Signature signature{};
};

// True when `data` starts with the manifest magic "DCRM" (a record of a signed stream that is not
// a chunk).
bool IsManifestRecord(const uint8_t* data, size_t size);

// The whole record of `m`, its signature field as `m` holds it. The signature covers the first
// size() - kManifestSignatureBytes bytes. REQUIRES: m.entries.size() <= kMaxManifestEntries;
// m.commitment only with m.final.
std::vector<uint8_t> SerializeManifest(const Manifest& m);

// Parses one record at `data` (the record may be followed by other bytes; `record_size` receives
// its size). Errors: kDataLoss for a wrong magic, truncation, a size field that disagrees with the
// contents, unknown flags or forms, kManifestFlagCommitment without kManifestFlagFinal, more than
// kMaxManifestEntries entries. The signature is not
// checked here.
StatusOr<Manifest> ParseManifest(const uint8_t* data, size_t size, size_t* record_size);

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_MANIFEST_H_
