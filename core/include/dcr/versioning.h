// Versioning: overwrite forms for repair, the joint commit between trainer and receivers, and
// catch-up of receivers that are several versions behind.
//
// The model: versions form a chain v0 -> v1 -> ... ; each delta turns one version into the next.
// The trainer builds the next delta from its *baseline*, and the joint commit keeps the baseline
// equal to a version every live receiver holds whole (CommitCoordinator). Receivers prove a version
// with the additive content hash (hash.h) and journal their progress (journal.h); an interrupted
// chunk is repaired with its overwrite form (OverwriteChunk*), never by replaying XOR. A receiver
// that fell behind gets one composed delta (ComposeDeltas) or, past a threshold, a full frame.
//
// Thread safety: free functions are thread-safe; CommitCoordinator is thread-compatible (a pure
// state machine: events in, decisions out; no I/O, threads or clocks).
#ifndef DCR_CORE_INCLUDE_DCR_VERSIONING_H_
#define DCR_CORE_INCLUDE_DCR_VERSIONING_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/format.h"
#include "dcr/journal.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {

// ---- overwrite forms ----

// The overwrite form of chunk `chunk_id` of the delta base -> target under `options` (the same
// grid options the delta was built with: chunk_elems, small_tensor_elems, zstd_level): the
// positions where base and target bits differ inside the chunk's cell, with absolute target values
// (ValueMode::kAbsolute). Its change hashes equal those of the relative chunk, so a receiver can
// check it against what it journaled. Returns an empty vector if the cell has no change.
// Errors: kNotFound (no such chunk id in the grid), kFailedPrecondition (inventories differ).
StatusOr<std::vector<uint8_t>> OverwriteChunkFromCheckpoints(const Checkpoint& base,
                                                             const Checkpoint& target,
                                                             const DeltaOptions& options,
                                                             uint64_t chunk_id);

// Converts one relative chunk record (XOR / ulp) of a delta whose target inventory is `inventory`
// into its overwrite form, reading the base bits from `base`. An absolute record is returned as
// is. Errors: kDataLoss (corrupt record), kFailedPrecondition (base lacks a tensor, or the base
// bits do not match the chunk's base_change_hash: wrong base).
StatusOr<std::vector<uint8_t>> OverwriteChunkFromRelative(const uint8_t* record, size_t size,
                                                          const Inventory& inventory,
                                                          const Checkpoint& base,
                                                          int zstd_level = 1);

// ---- catch-up ----

struct CatchUpOptions {
  // Compose at most this many consecutive deltas; a receiver further behind gets a full frame.
  // Default 8.
  int max_compose = 8;
  // Send a full frame instead when the deltas to compose hold more than this fraction of the
  // target's dense tensor bytes (their summed payload sizes, an upper bound of the composition).
  // Default 0.5.
  double full_frame_fraction = 0.5;
  // Options of the output (zstd level, threads). Grid options are taken from the deltas.
  DeltaOptions delta_options;
};

struct CatchUpStats {
  bool full_frame = false;  // true: a full frame was emitted instead of a composition
  int composed = 0;         // deltas composed
  uint64_t chunks = 0;
  uint64_t changes = 0;    // changed positions of the composed delta
  uint64_t cancelled = 0;  // positions changed by some delta but equal in base and target
  uint64_t payload_bytes = 0;
};

// Composes consecutive deltas d[0]: v_a -> v_b, d[1]: v_b -> v_c, ... into one delta v_a -> v_last
// written to `sink`. `target` is the last version (the sender holds it): the composed value at a
// position is the per-position composition of the deltas' values (XOR masks XOR; ulp differences
// add mod 2^(8w); an absolute value overrides what came before), obtained by walking back from the
// target bits; positions whose composition is the identity are dropped. A chunk that an absolute
// value makes non-invertible is emitted in absolute mode. Hashes in the output are exact, so the
// composed delta applies and proves like any other.
// Errors: kInvalidArgument (empty list, a gap in the chain, different grids or inventories),
// kFailedPrecondition (target hash differs from the last delta's target_hash), kDataLoss.
StatusOr<CatchUpStats> ComposeDeltas(const std::vector<const DeltaReader*>& deltas,
                                     const Checkpoint& target, const DeltaOptions& options,
                                     DeltaSink* sink);

// Decides between composing `deltas` and a full frame (CatchUpOptions thresholds) and writes the
// result to `sink`: a composed delta, or BuildDelta(nullptr, target, full=true).
StatusOr<CatchUpStats> BuildCatchUp(const std::vector<const DeltaReader*>& deltas,
                                    const Checkpoint& target, const CatchUpOptions& options,
                                    DeltaSink* sink);

// ---- joint commit ----

// What a receiver must be sent to reach the trainer's latest version.
struct ReceiverPlan {
  enum Kind {
    kUpToDate,   // holds the latest version
    kDelta,      // holds the baseline: the ordinary delta baseline -> latest
    kCatchUp,    // holds an older retained version: compose deltas from `from` (or a full frame)
    kFullFrame,  // no version, or one outside the retained history: full frame of latest
  };
  Kind kind = kFullFrame;
  VersionId from;  // the receiver's committed version (kDelta, kCatchUp)
  VersionId to;    // the version it should end at
  int versions_behind = 0;
};

struct CommitOptions {
  // Published versions kept for catch-up (the trainer keeps their deltas). Default 8.
  int retained_versions = 8;
};

// The trainer side of the joint commit. Versions are published one at a time: the trainer may
// build the delta for version n+1 only from the baseline, and the baseline advances to a version
// only when every live receiver has reported committed(version) with the right hash. A receiver
// that dies is removed (declared dead by the transport); it rejoins with its journaled version and
// is planned a catch-up or a full frame. Reports for versions never published, or with a hash that
// differs from the published one, are refused and change nothing.
class CommitCoordinator {
 public:
  explicit CommitCoordinator(const VersionId& initial, const CommitOptions& options = {});

  // Adds a receiver. `committed` is its journaled version (none = a fresh receiver).
  // kInvalidArgument if the name is taken; kFailedPrecondition if `committed` names a version
  // number whose hash differs from the one published (a poisoned receiver: reload it).
  Status AddReceiver(const std::string& name, const std::optional<VersionId>& committed);
  // Declares a receiver dead (kNotFound if unknown). The baseline may then advance.
  Status RemoveReceiver(const std::string& name);
  // The trainer publishes version `v` built from `base`. Refused (kFailedPrecondition) unless
  // base == baseline() and the previous version is whole (baseline() == latest()), or if v.number
  // is not greater than latest().number.
  Status Publish(const VersionId& base, const VersionId& v);
  // A receiver reports a committed version. Refused if unknown receiver (kNotFound), a version
  // never published or with a different hash (kFailedPrecondition), or older than what it
  // reported before.
  Status OnCommitted(const std::string& name, const VersionId& v);

  // The version the next delta must be built from: the newest version every live receiver holds.
  // With no live receiver, latest().
  VersionId baseline() const;
  VersionId latest() const { return history_.back(); }
  // True when every live receiver holds latest() (the trainer may publish the next version).
  bool LatestWhole() const;
  // Checks that a delta header is built from the baseline: kFailedPrecondition otherwise (the
  // payload is refused, e.g. a stale sender after a restart).
  Status CheckDeltaBase(const FileHeader& header) const;
  ReceiverPlan PlanFor(const std::string& name) const;
  // Live receivers and their committed versions (none = no version yet).
  std::map<std::string, std::optional<VersionId>> receivers() const { return receivers_; }
  // Published versions still retained, oldest first (latest last).
  const std::vector<VersionId>& history() const { return history_; }

 private:
  int IndexOf(const VersionId& v) const;  // -1 if not retained / hash differs
  CommitOptions options_;
  std::vector<VersionId> history_;
  std::map<std::string, std::optional<VersionId>> receivers_;
};

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_VERSIONING_H_
