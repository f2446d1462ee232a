// The sender's side of a trainer-built delta (trainer_delta.h).
#include "node/trainer_delta.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "dcr/format.h"
#include "dcr/status_macros.h"

namespace dcr::internal {

bool TrainerDeltaFits(const std::string& path, const VersionId& base, uint64_t version,
                      bool context_coding, std::string* why) {
  if (context_coding) {
    *why =
        "the run context-codes its deltas (context_coding) and the trainer's delta is in the "
        "plain encoding";
    return false;
  }
  auto reader = DeltaReader::Open(path);
  if (!reader.ok()) {
    *why = "the trainer's delta " + path + " does not open: " + reader.status().ToString();
    return false;
  }
  const FileHeader& h = (*reader)->header();
  if ((h.flags & kFlagSigned) != 0) {
    *why = "the trainer's delta " + path + " is signed (the sender signs what it streams)";
    return false;
  }
  if (h.base_version != base.number || h.base_hash != base.hash || h.target_version != version) {
    *why = "the trainer's delta is version " + std::to_string(h.base_version) + " -> " +
           std::to_string(h.target_version) + " from base hash " + h.base_hash.ToHex() +
           "; version " + std::to_string(version) + " must be built from version " +
           std::to_string(base.number) + " (hash " + base.hash.ToHex() + ")";
    return false;
  }
  return true;
}

Status StreamDeltaFile(const std::string& path, DeltaSink* sink) {
  DCR_ASSIGN_OR_RETURN(auto reader, DeltaReader::Open(path));
  const uint8_t* data = reader->data();
  const size_t size = reader->size();
  if ((reader->header().flags & kFlagSigned) != 0) {
    return InvalidArgumentError(path + ": a signed delta (the sender signs what it streams)");
  }
  size_t header_size = 0;
  DCR_RETURN_IF_ERROR(ParseFileHeader(data, size, &header_size).status());
  uint64_t trailer_offset = 0;
  std::memcpy(&trailer_offset, data + size - 24, 8);  // DeltaReader checked it lies inside
  DCR_RETURN_IF_ERROR(sink->OnHeader(std::vector<uint8_t>(data, data + header_size)));
  std::vector<ChunkTableEntry> chunks = reader->trailer().chunks;
  std::sort(chunks.begin(), chunks.end(),
            [](const ChunkTableEntry& a, const ChunkTableEntry& b) { return a.offset < b.offset; });
  for (const ChunkTableEntry& e : chunks) {
    size_t hs = 0, rs = 0;
    auto ch = ParseChunkHeader(data + e.offset, e.size, &hs, &rs);
    if (!ch.ok() || rs != e.size) {
      return DataLossError(path + ": chunk " + std::to_string(e.chunk_id) +
                           " record does not parse" +
                           (ch.ok() ? std::string() : ": " + ch.status().ToString()));
    }
    DCR_RETURN_IF_ERROR(
        sink->OnChunk(*ch, std::vector<uint8_t>(data + e.offset, data + e.offset + e.size)));
  }
  return sink->OnTrailer(std::vector<uint8_t>(data + trailer_offset, data + size));
}

}  // namespace dcr::internal
