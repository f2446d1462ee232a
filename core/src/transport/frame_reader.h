// Internal: the reader of a child's parent stream (net.h's wire frames), which validates each
// frame once: its magic, its wire protocol, run and version (WireMismatch), its type (a parent
// sends kPiece, kHeartbeat and kAbort), a piece's blob kind and byte range, and the blob size a
// plan allows for the kind. Heartbeats are consumed (the connection's read deadline restarts with
// each); an abort frame's reason is read with it; a piece's payload is left for the caller to
// read straight into its blob buffer.
//
// Thread safety: one reader per connection, used by one thread.
#ifndef DCR_CORE_SRC_TRANSPORT_FRAME_READER_H_
#define DCR_CORE_SRC_TRANSPORT_FRAME_READER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "dcr/relay_policy.h"
#include "dcr/status.h"
#include "transport/net.h"

namespace dcr::internal {

// One frame from the parent, validated.
struct ParentFrame {
  enum class Type { kPiece, kAbort };
  Type type = Type::kPiece;
  uint32_t from_rank = 0;
  // kPiece: the blob, and the range [offset, offset + length) of it whose bytes follow on the
  // connection (REQUIRES of the caller: read them before the next Next).
  BlobInfo info;
  uint64_t offset = 0;
  uint64_t length = 0;
  // kAbort: why the sender refused the refit (at most kMaxAbortMessageBytes).
  std::string reason;
};

class ParentFrameReader {
 public:
  // How a Next call ended.
  enum class Outcome {
    kFrame,      // *frame holds a valid frame
    kLost,       // the connection failed at a frame boundary (closed, reset, read deadline)
    kRefused,    // a frame of another protocol, run or version, a malformed frame, or an abort
                 // frame whose reason could not be read
    kOversized,  // a piece of a blob larger than max_blob_bytes allows for its kind
  };

  // Reads frames of `parent` (its rank, as errors name it) on `conn`, for run `run` and version
  // `version`; `max_blob_bytes(kind)`: the largest blob of each kind the node accepts.
  // REQUIRES: conn outlives the reader.
  ParentFrameReader(Conn* conn, int parent, uint64_t run, uint64_t version,
                    std::function<uint64_t(BlobKind)> max_blob_bytes);

  // Reads up to the next frame that is not a heartbeat. kFrame: *frame is set. Otherwise
  // `*error` says why: kLost the connection's error (Conn::Read); kRefused kDataLoss ("frame
  // from parent node 2 refused: <WireMismatch>", "malformed frame from parent node 2") or the
  // connection's error while reading an abort reason; kOversized kDataLoss ("sent a piece of
  // blob 7 claiming N bytes, more than the L bytes the plan allows for a chunk").
  Outcome Next(ParentFrame* frame, Status* error);

 private:
  Conn* conn_;
  int parent_;
  uint64_t run_;
  uint64_t version_;
  std::function<uint64_t(BlobKind)> max_blob_bytes_;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_TRANSPORT_FRAME_READER_H_
