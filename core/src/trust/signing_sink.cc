// SigningSink: an unsigned delta stream in, the signed stream (format version 6) out.
#include <string>

#include "dcr/signing.h"
#include "dcr/status_macros.h"

namespace dcr {

SigningSink::SigningSink(const SigningKey* key, SignOptions options, DeltaSink* inner)
    : key_(key), options_(options), inner_(inner) {
  if (options_.chunks_per_manifest == 0) options_.chunks_per_manifest = 1;
  if (options_.chunks_per_manifest > kMaxManifestEntries) {
    options_.chunks_per_manifest = kMaxManifestEntries;
  }
}

Status SigningSink::OnHeader(const std::vector<uint8_t>& bytes) {
  size_t consumed = 0;
  DCR_ASSIGN_OR_RETURN(header_, ParseFileHeader(bytes.data(), bytes.size(), &consumed));
  if ((header_.flags & kFlagSigned) != 0) {
    return InvalidArgumentError("signing a delta stream that is signed already");
  }
  header_.flags |= kFlagSigned;
  std::vector<uint8_t> signed_header = SerializeFileHeader(header_);
  header_sha_ = Sha256(signed_header.data(), signed_header.size());
  sequence_ = 0;
  batch_.clear();
  placed_.clear();
  offset_ = signed_header.size();
  return inner_->OnHeader(signed_header);
}

Status SigningSink::OnChunk(const ChunkHeader& header, const std::vector<uint8_t>& bytes) {
  return Hold(Held{header, bytes, std::nullopt});
}

Status SigningSink::OnContextChunk(const ChunkHeader& header, const std::vector<uint8_t>& bytes,
                                   const std::vector<uint8_t>& plain) {
  return Hold(Held{header, bytes, Sha256(plain.data(), plain.size())});
}

Status SigningSink::Hold(Held held) {
  batch_.push_back(std::move(held));
  if (batch_.size() >= options_.chunks_per_manifest) return Flush(false, nullptr);
  return Status();
}

Status SigningSink::OnManifest(const std::vector<uint8_t>&) {
  return InvalidArgumentError("signing a delta stream that has manifest records already");
}

Status SigningSink::Flush(bool final, const Trailer* trailer) {
  Manifest m;
  m.final = final;
  m.sequence = sequence_++;
  m.run_id = options_.run_id;
  m.base_version = header_.base_version;
  m.base_hash = header_.base_hash;
  m.target_version = header_.target_version;
  m.header_sha256 = header_sha_;
  for (const Held& held : batch_) {
    ManifestEntry e;
    e.chunk_id = held.header.chunk_id;
    const Sha256Digest own = Sha256(held.bytes.data(), held.bytes.size());
    if (held.plain_sha.has_value()) {
      e.plain = *held.plain_sha;
      e.has_context = true;
      e.context = own;
    } else {
      e.plain = own;
    }
    m.entries.push_back(e);
  }
  if (final) {
    m.num_chunks = trailer->chunks.size();
    m.target_hash = trailer->target_hash;
    m.commitment = options_.commitment;
    if (m.commitment) m.commitment_leaves = options_.commitment_leaves;
  }
  m.signer = key_->public_key();
  std::vector<uint8_t> rec = SerializeManifest(m);
  DCR_ASSIGN_OR_RETURN(m.signature, key_->Sign(rec.data(), rec.size() - kManifestSignatureBytes));
  std::copy(m.signature.begin(), m.signature.end(), rec.end() - kManifestSignatureBytes);
  offset_ += rec.size();
  DCR_RETURN_IF_ERROR(inner_->OnManifest(rec));
  for (const Held& held : batch_) {
    const ChunkHeader& h = held.header;
    placed_[h.chunk_id] = ChunkTableEntry{h.chunk_id, offset_, held.bytes.size()};
    offset_ += held.bytes.size();
    DCR_RETURN_IF_ERROR(inner_->OnChunk(h, held.bytes));
  }
  batch_.clear();
  return Status();
}

Status SigningSink::OnTrailer(const std::vector<uint8_t>& bytes) {
  DCR_ASSIGN_OR_RETURN(Trailer t, ParseTrailer(bytes.data(), bytes.size()));
  DCR_RETURN_IF_ERROR(Flush(true, &t));
  if (placed_.size() != t.chunks.size()) {
    return InvalidArgumentError("delta trailer lists " + std::to_string(t.chunks.size()) +
                                " chunks but the stream had " + std::to_string(placed_.size()));
  }
  for (ChunkTableEntry& e : t.chunks) {
    auto it = placed_.find(e.chunk_id);
    if (it == placed_.end()) {
      return InvalidArgumentError("delta trailer lists chunk " + std::to_string(e.chunk_id) +
                                  " that the stream did not carry");
    }
    e = it->second;
  }
  return inner_->OnTrailer(SerializeTrailer(t, offset_));
}

}  // namespace dcr
