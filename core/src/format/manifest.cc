// Manifest records: layout in core/FORMAT.md section 2.4.
#include "dcr/manifest.h"

#include <cstring>
#include <string>

#include "internal/byte_io.h"

namespace dcr {
namespace {

// magic, record_size, flags, sequence, run_id, base_version, base_hash, target_version,
// header_sha256, num_entries.
constexpr size_t kFixedBytes = 4 + 4 + 4 + 4 + 8 + 8 + 16 + 8 + 32 + 4;
constexpr size_t kFinalBytes = 8 + 16;
constexpr size_t kTailBytes = 32 + kManifestSignatureBytes;

}  // namespace

bool IsManifestRecord(const uint8_t* data, size_t size) {
  return size >= 4 && std::memcmp(data, kManifestMagic, 4) == 0;
}

std::vector<uint8_t> SerializeManifest(const Manifest& m) {
  const bool commitment = m.final && m.commitment.has_value();
  size_t size = kFixedBytes + kTailBytes + (m.final ? kFinalBytes : 0) +
                (commitment ? 32 + 4 + 32 * m.commitment_leaves.size() : 0);
  for (const ManifestEntry& e : m.entries) size += 8 + 1 + 32 + (e.has_context ? 32 : 0);
  std::vector<uint8_t> out;
  out.reserve(size);
  internal::ByteWriter w(&out);
  w.Raw(kManifestMagic, 4);
  w.U32(static_cast<uint32_t>(size));
  w.U32((m.final ? kManifestFlagFinal : 0) | (commitment ? kManifestFlagCommitment : 0));
  w.U32(m.sequence);
  w.U64(m.run_id);
  w.U64(m.base_version);
  w.H128(m.base_hash);
  w.U64(m.target_version);
  w.Raw(m.header_sha256.data(), 32);
  w.U32(static_cast<uint32_t>(m.entries.size()));
  for (const ManifestEntry& e : m.entries) {
    w.U64(e.chunk_id);
    w.U8(e.has_context ? 2 : 1);
    w.Raw(e.plain.data(), 32);
    if (e.has_context) w.Raw(e.context.data(), 32);
  }
  if (m.final) {
    w.U64(m.num_chunks);
    w.H128(m.target_hash);
    if (commitment) {
      w.Raw(m.commitment->data(), 32);
      w.U32(static_cast<uint32_t>(m.commitment_leaves.size()));
      for (const Sha256Digest& leaf : m.commitment_leaves) w.Raw(leaf.data(), 32);
    }
  }
  w.Raw(m.signer.data(), 32);
  w.Raw(m.signature.data(), 64);
  return out;
}

StatusOr<Manifest> ParseManifest(const uint8_t* data, size_t size, size_t* record_size) {
  internal::ByteReader r(data, size);
  char magic[4];
  r.Raw(magic, 4);
  if (r.failed() || std::memcmp(magic, kManifestMagic, 4) != 0) {
    return DataLossError("not a manifest record (bad magic)");
  }
  const uint32_t declared = r.U32();
  if (r.failed()) return DataLossError("truncated manifest record");
  if (declared < kFixedBytes + kTailBytes) {
    return DataLossError("manifest record size " + std::to_string(declared) + " is too small");
  }
  if (declared > size) {
    return DataLossError("truncated manifest record: " + std::to_string(declared) +
                         " bytes declared, " + std::to_string(size) + " present");
  }
  Manifest m;
  const uint32_t flags = r.U32();
  if ((flags & ~(kManifestFlagFinal | kManifestFlagCommitment)) != 0) {
    return DataLossError("unknown manifest record flags");
  }
  m.final = (flags & kManifestFlagFinal) != 0;
  const bool commitment = (flags & kManifestFlagCommitment) != 0;
  if (commitment && !m.final) {
    return DataLossError("manifest record: a commitment root in a manifest that is not final");
  }
  m.sequence = r.U32();
  m.run_id = r.U64();
  m.base_version = r.U64();
  m.base_hash = r.H128();
  m.target_version = r.U64();
  r.Raw(m.header_sha256.data(), 32);
  const uint32_t n = r.U32();
  if (r.failed()) return DataLossError("truncated manifest record");
  if (n > kMaxManifestEntries) {
    return DataLossError("manifest record lists " + std::to_string(n) + " chunks (at most " +
                         std::to_string(kMaxManifestEntries) + ")");
  }
  // Each entry is at least 41 bytes: a count the declared size cannot hold is refused before
  // the entries are allocated.
  const size_t min_size = kFixedBytes + kTailBytes + (m.final ? kFinalBytes : 0) +
                          (commitment ? 32 + 4 : 0) + size_t{n} * 41;
  if (min_size > declared) return DataLossError("manifest record: entry count exceeds its size");
  m.entries.resize(n);
  for (ManifestEntry& e : m.entries) {
    e.chunk_id = r.U64();
    const uint8_t forms = r.U8();
    if (forms != 1 && forms != 2) {
      return DataLossError("manifest record: chunk entry with " + std::to_string(forms) +
                           " forms (1 or 2)");
    }
    r.Raw(e.plain.data(), 32);
    e.has_context = forms == 2;
    if (e.has_context) r.Raw(e.context.data(), 32);
  }
  if (m.final) {
    m.num_chunks = r.U64();
    m.target_hash = r.H128();
    if (commitment) {
      Sha256Digest root{};
      r.Raw(root.data(), 32);
      m.commitment = root;
      const uint32_t num_leaves = r.U32();
      if (r.failed()) return DataLossError("truncated manifest record");
      // Checked against the declared size before the leaves are allocated.
      if (r.offset() > declared || uint64_t{num_leaves} * 32 > declared - r.offset()) {
        return DataLossError("manifest record: " + std::to_string(num_leaves) +
                             " commitment leaves exceed its size");
      }
      m.commitment_leaves.resize(num_leaves);
      for (Sha256Digest& leaf : m.commitment_leaves) r.Raw(leaf.data(), 32);
    }
  }
  r.Raw(m.signer.data(), 32);
  r.Raw(m.signature.data(), 64);
  if (r.failed()) return DataLossError("truncated manifest record");
  if (r.offset() != declared) {
    return DataLossError("manifest record size " + std::to_string(declared) +
                         " disagrees with its contents (" + std::to_string(r.offset()) + " bytes)");
  }
  if (record_size != nullptr) *record_size = declared;
  return m;
}

}  // namespace dcr
