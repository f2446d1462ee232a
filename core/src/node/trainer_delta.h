// The sender's side of a delta the trainer built itself (from its per-rank shards,
// TrainDeltaBuilder; dcr/publisher_c.h): the check that decides whether it may go out as a
// version, and the stream of its blobs.
//
// Thread safety: both functions are self-contained.
#ifndef DCR_CORE_SRC_NODE_TRAINER_DELTA_H_
#define DCR_CORE_SRC_NODE_TRAINER_DELTA_H_

#include <string>

#include "dcr/delta.h"
#include "dcr/status.h"
#include "dcr/versioning.h"

namespace dcr::internal {

// Whether the delta file at `path` may go out as version `version` built from `base` (the
// version the sender must build it from: the joint commit's baseline, or the version before): an
// unsigned delta whose header names base.number, base.hash and `version`, in a run whose plan
// does not context-code its deltas (`context_coding`: the trainer's delta is in the plain
// encoding, and the long link is to carry the smaller context form the plan chose). False with
// *why (the header's base and target, the plan's encoding, or the file's error) otherwise; the
// sender then builds the delta from the checkpoints.
bool TrainerDeltaFits(const std::string& path, const VersionId& base, uint64_t version,
                      bool context_coding, std::string* why);

// Streams the delta file at `path` into `sink` as a builder would: its header bytes, each chunk
// record in file order, the trailer bytes, every byte as the file holds it. Errors:
// DeltaReader::Open's; kDataLoss for a chunk record that does not parse; kInvalidArgument for a
// signed file (the sender signs what it streams); the sink's.
Status StreamDeltaFile(const std::string& path, DeltaSink* sink);

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_TRAINER_DELTA_H_
