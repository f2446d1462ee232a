// ParentFrameReader (frame_reader.h).
#include "transport/frame_reader.h"

#include <string>
#include <utility>

namespace dcr::internal {

ParentFrameReader::ParentFrameReader(Conn* conn, int parent, uint64_t run, uint64_t version,
                                     std::function<uint64_t(BlobKind)> max_blob_bytes)
    : conn_(conn),
      parent_(parent),
      run_(run),
      version_(version),
      max_blob_bytes_(std::move(max_blob_bytes)) {}

ParentFrameReader::Outcome ParentFrameReader::Next(ParentFrame* frame, Status* error) {
  const std::string from = "parent node " + std::to_string(parent_);
  while (true) {
    FrameHeader h;
    Status s = conn_->Read(&h, sizeof(h));
    if (!s.ok()) {
      *error = std::move(s);
      return Outcome::kLost;
    }
    if (h.magic == kFrameMagic) {
      const std::string why = WireMismatch(h, run_, version_);
      if (!why.empty()) {
        *error = DataLossError("frame from " + from + " refused: " + why);
        return Outcome::kRefused;
      }
      if (h.type == static_cast<uint8_t>(FrameType::kAbort) && h.length <= kMaxAbortMessageBytes) {
        std::string reason(h.length, '\0');
        s = conn_->Read(reason.data(), reason.size());
        if (!s.ok()) {
          *error = std::move(s);
          return Outcome::kRefused;
        }
        *frame = ParentFrame();
        frame->type = ParentFrame::Type::kAbort;
        frame->from_rank = h.from_rank;
        frame->reason = std::move(reason);
        return Outcome::kFrame;
      }
      if (h.type == static_cast<uint8_t>(FrameType::kHeartbeat) && h.length == 0) {
        continue;  // the parent is alive; the read deadline restarts
      }
    }
    if (h.magic != kFrameMagic || h.type != static_cast<uint8_t>(FrameType::kPiece) ||
        h.blob_kind > 2 || h.offset > h.blob_size || h.length > h.blob_size - h.offset) {
      *error = DataLossError("malformed frame from " + from);
      return Outcome::kRefused;
    }
    const BlobInfo info{h.blob, static_cast<BlobKind>(h.blob_kind), h.blob_size};
    const uint64_t limit = max_blob_bytes_(info.kind);
    if (h.blob_size > limit) {
      *error = DataLossError("sent a piece of blob " + std::to_string(h.blob) + " claiming " +
                             std::to_string(h.blob_size) + " bytes, more than the " +
                             std::to_string(limit) + " bytes the plan allows for a " +
                             BlobKindName(info.kind));
      return Outcome::kOversized;
    }
    *frame = ParentFrame();
    frame->type = ParentFrame::Type::kPiece;
    frame->from_rank = h.from_rank;
    frame->info = info;
    frame->offset = h.offset;
    frame->length = h.length;
    return Outcome::kFrame;
  }
}

}  // namespace dcr::internal
