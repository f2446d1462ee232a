// The edge relay's transcoding: a relay-tree node in the rollout region that holds the canonical
// base of the delta (NodePlan::edge_relays) takes the context-coded stream the long link carries
// and hands its tree policy the plain stream, chunk by chunk (core/docs/transports.md, "Edge
// relays").
//
// The node's policy is the ordinary tree policy of its rank (relay_policy.h): what changes is the
// ingress. Pieces from the parent are collected per blob (PieceTracker); a whole chunk blob that
// holds a context-coded record is replaced by ContextChunkToPlain of it (byte for byte the plain
// encoder's record) and only then given to the policy, as the pieces of a blob of the plain size
// (DataReceived), which the policy acknowledges, applies and forwards cut-through like any blob.
// Header, trailer, manifest records and plain chunks are given to the policy unchanged once
// whole. The policy's Ack of a chunk therefore tells the parent that its transcoding is done.
//
// Thread safety: EdgeTranscoder is immutable after SetHeader (ToPlain is thread-safe);
// PieceTracker and EdgeIngress are thread-safe.
#ifndef DCR_CORE_SRC_NODE_EDGE_RELAY_H_
#define DCR_CORE_SRC_NODE_EDGE_RELAY_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dcr/apply.h"
#include "dcr/checkpoint.h"
#include "dcr/edge_split.h"
#include "dcr/relay_policy.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr::internal {

// The plain form of the records of one delta, against the canonical base it was built from.
//
// An edge relay of a split (dcr/edge_split.h) transcodes only the chunks of its range (chunk ids
// in canonical order) and holds only the base tensors that range covers: its base checkpoint may
// lack every other tensor of the delta's inventory. Context-coded chunks outside its range travel
// as they are, for the edge relay of their range further down the chain to transcode.
class EdgeTranscoder {
 public:
  // Opens the canonical base checkpoint at `base_path` (mapped read-only). `zstd_level`: the
  // sender's DeltaOptions::zstd_level (the plain form is the one BuildDelta writes at it).
  // `range`: the chunks this edge relay transcodes; nullopt = every chunk (the base holds every
  // tensor of the delta).
  static StatusOr<std::unique_ptr<EdgeTranscoder>> Open(
      const std::string& base_path, int zstd_level, std::optional<EdgeRange> range = std::nullopt);

  // The delta's header blob: binds every tensor of its inventory to the base's tensor of that
  // name. Errors: kDataLoss for a malformed header; kFailedPrecondition when the base holds a
  // tensor of the inventory with another size, or (without a range) lacks one: not the delta's
  // base. With a range a tensor the base lacks is refused only by a chunk of the range that
  // covers it (ToPlain).
  Status SetHeader(const uint8_t* header, size_t size);
  bool has_header() const { return header_set_; }

  // The plain record of chunk blob `blob` (size bytes) when it is a context-coded chunk record of
  // this transcoder's range; nullopt for anything else (a plain record, a manifest record, a
  // chunk of another range), which travels as it is. Errors: those of ContextChunkToPlain
  // (kDataLoss, kFailedPrecondition for a base that is not the chunk's), kFailedPrecondition
  // before SetHeader or for a chunk of the range covering a tensor the base lacks.
  StatusOr<std::optional<std::vector<uint8_t>>> ToPlain(const uint8_t* blob, size_t size) const;

 private:
  EdgeTranscoder(std::unique_ptr<Checkpoint> base, int zstd_level, std::optional<EdgeRange> range)
      : base_(std::move(base)), zstd_level_(zstd_level), range_(range) {}

  std::unique_ptr<Checkpoint> base_;
  int zstd_level_;
  std::optional<EdgeRange> range_;
  bool header_set_ = false;
  std::vector<TensorBuffer> tensors_;  // the base's bits per inventory tensor (null: not held)
  std::vector<std::string> names_;     // the inventory's tensor names
};

// Which pieces of each blob have arrived (pieces of `piece_bytes`, as the parent cuts them).
class PieceTracker {
 public:
  explicit PieceTracker(uint64_t piece_bytes) : piece_bytes_(piece_bytes) {}
  // Records bytes [offset, offset + length) of `blob`; true exactly once per blob: when this
  // piece makes it whole. Duplicate pieces and pieces of a blob already whole return false.
  bool Add(const BlobInfo& blob, uint64_t offset);
  // Whether `blob` was whole (its later pieces are duplicates).
  bool Whole(BlobId blob) const;
  // Forgets every blob (the stream was left for another source).
  void Clear();

 private:
  mutable std::mutex mu_;
  uint64_t piece_bytes_;
  std::map<BlobId, std::set<uint64_t>> partial_;  // offsets received of blobs not yet whole
  std::set<BlobId> whole_;
};

// Counters of an edge relay's transcoding (reported in the node's result).
struct EdgeStats {
  uint64_t chunks = 0;         // context-coded chunks transcoded
  uint64_t context_bytes = 0;  // their bytes as received
  uint64_t plain_bytes = 0;    // their plain records' bytes
  double cpu_seconds = 0;      // thread CPU time of the transcoding
};

// The edge relay's ingress: pieces from the parent in, whole plain blobs out to the policy.
class EdgeIngress {
 public:
  struct Callbacks {
    // Replaces the node's bytes of blob `info.id` with `bytes` (info.size == bytes.size()).
    std::function<void(const BlobInfo& info, std::vector<uint8_t> bytes)> replace;
    // An event for the policy (DataReceived of every piece of a whole blob).
    std::function<void(const Event& e)> post;
    // The relay cannot go on: a chunk did not transcode (wrong base, corrupt record).
    std::function<void(Status)> fatal;
  };
  // `threads` (>= 1) transcode chunks in parallel; `piece_bytes`: the policy's piece size.
  EdgeIngress(std::unique_ptr<EdgeTranscoder> transcoder, uint64_t piece_bytes, int threads,
              Callbacks callbacks);
  ~EdgeIngress();

  // Piece [offset, offset + length) of `info` arrived into the node's buffer of the blob;
  // `bytes` is that buffer (kept alive by the caller's shared pointer). Whole blobs are handed on
  // as the header above describes; chunks wait for the header. Called from reader threads.
  void Piece(const BlobInfo& info, uint64_t offset,
             std::shared_ptr<const std::vector<uint8_t>> bytes);
  // Whether blob `id` arrived whole (a later piece of it is a duplicate, dropped unread).
  bool Whole(BlobId id) const { return tracker_.Whole(id); }
  // Drops everything in flight (the stream is left for the object store): jobs that finish
  // afterwards hand nothing on.
  void Reset();
  EdgeStats stats() const;

 private:
  struct Job {
    BlobInfo info;
    std::shared_ptr<const std::vector<uint8_t>> bytes;
    uint64_t epoch = 0;
  };
  void Worker();
  void PostPieces(const BlobInfo& info);
  void Transcode(const Job& job);

  std::unique_ptr<EdgeTranscoder> transcoder_;
  uint64_t piece_bytes_;
  Callbacks cb_;
  PieceTracker tracker_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool header_ready_ = false;
  uint64_t epoch_ = 0;
  std::vector<Job> waiting_;  // chunks whole before the header
  std::vector<Job> queue_;    // chunks to transcode
  EdgeStats stats_;
  std::vector<std::thread> threads_;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_EDGE_RELAY_H_
