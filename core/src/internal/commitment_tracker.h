// CommitmentTracker (internal): the commitment leaves (dcr/commitment.h) of a receiver's storage
// hashed while a delta is applied, each as soon as its bytes are final, so that a commit hashes
// only the leaves that the last chunks completed, and those no chunk touched.
//
// How a chunk's byte ranges are known: its record header lists its segments (tensor index into
// the delta's inventory, element offset, counts and strides; core/FORMAT.md section 2), so the
// tracker maps each segment to the bytes it covers in the storage's tensors (by name), and from
// those to leaves. A leaf is hashed early once the chunks applied so far cover all of its bytes
// and no chunk touching it is being applied.
//
// Soundness does not rest on the chunk grid or on chunks being disjoint. It rests on one rule:
// every write to the storage while a delta is in progress is announced (Before) with a superset
// of the leaves it may write, and ends (After) before the storage is read for those leaves. Before
// turns every leaf it names that is hashed or being hashed into a doubtful one, whose early digest
// is dropped and which Finish hashes again: a later chunk overlapping a hashed leaf, a record
// delivered twice, a repair by overwrite form, all rehash. A leaf is read only while no announced
// write to it is open, and its digest kept only if no write was announced since the read began.
// Segments whose runs are too many to list (a strided box) are announced by their bounding range
// and credit no coverage. Writes to the storage around the receiver that owns the tracker (a reload
// of the committed version) must be followed by a new delta (Begin), which starts a new tracker.
//
// Thread safety: Before and After may run concurrently from any threads; Finish and stats must
// not run concurrently with them.
#ifndef DCR_CORE_SRC_INTERNAL_COMMITMENT_TRACKER_H_
#define DCR_CORE_SRC_INTERNAL_COMMITMENT_TRACKER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "dcr/commitment.h"
#include "dcr/delta.h"
#include "dcr/format.h"
#include "dcr/receiver.h"
#include "dcr/signing.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {
class Device;
}  // namespace dcr

namespace dcr::internal {

class CommitmentTracker {
 public:
  // A tracker over what `storage.storage()` holds (host memory of a BufferReceiver, or a
  // DeviceReceiver's tensors, read in pieces of one leaf), for the delta whose target is
  // `inventory`, hashing on a pool of `threads` workers (0 = hardware concurrency) that compete
  // with the receiver's apply threads for the cores. nullptr (no early hashing; the commit hashes
  // everything) when the storage is of another kind or the inventory names a tensor the storage
  // lacks or sizes differently.
  static std::unique_ptr<CommitmentTracker> Start(const Receiver& storage,
                                                  const Inventory& inventory, int threads);
  // Stops the pool (a leaf being read is finished first).
  ~CommitmentTracker();

  // The leaves a chunk record may write.
  struct Touch {
    struct Piece {
      uint64_t leaf = 0;
      uint64_t bytes = 0;  // of the leaf the chunk covers
    };
    std::vector<Piece> pieces;     // covered bytes per leaf (credited on success)
    std::vector<uint64_t> leaves;  // every leaf it may write, sorted, unique
  };
  // Announces a write of the chunk whose header is `h`. Call before the storage is written.
  Touch Before(const ChunkHeader& h);
  // Ends the write announced by `touch`; `applied`: the chunk's bytes are the target's (the
  // record applied), so its pieces count as covered. The leaves it completes go to the pool
  // (leaf numbers only: memory is one leaf buffer per worker for a device's storage).
  void After(const Touch& touch, bool applied);
  // The whole version's commitment: waits for the pool's queue, then hashes the remaining leaves
  // on `threads` workers (0 = hardware concurrency). REQUIRES: no write open. Errors: the
  // device's.
  StatusOr<Commitment> Finish(int threads);

  // The pass as of the last Finish.
  CommitmentPassStats stats() const;

 private:
  enum class LeafState : uint8_t { kOpen, kHashing, kHashed, kDoubtful };
  CommitmentTracker() = default;
  // The digest of leaf `i` as the storage holds it now.
  StatusOr<Sha256Digest> Read(uint64_t i) const;
  // A pool worker: hashes queued leaves until stopped.
  void Work();

  CommitmentLayout layout_;
  std::vector<TensorView> views_;              // layout order; data: host or device addresses
  Device* device_ = nullptr;                   // null: host memory
  std::vector<uint32_t> inventory_to_layout_;  // per inventory tensor index

  mutable std::mutex mu_;
  std::vector<LeafState> state_;
  std::vector<uint32_t> open_writes_;  // announced writes not ended, per leaf
  std::vector<uint64_t> covered_;      // bytes credited by applied chunks, per leaf
  std::vector<Sha256Digest> digest_;
  uint64_t rehashed_ = 0;
  double early_seconds_ = 0;
  double tail_seconds_ = 0;
  uint64_t tail_leaves_ = 0;    // queued or being hashed when Finish began, or hashed by it
  uint64_t commit_hashed_ = 0;  // hashed by Finish
  std::deque<uint64_t> queue_;  // leaves in state kHashing, not yet picked up
  int busy_ = 0;                // workers reading a leaf
  bool stop_ = false;
  std::condition_variable work_cv_;  // queue_ or stop_ changed
  std::condition_variable idle_cv_;  // queue_ empty and busy_ 0
  std::vector<std::thread> pool_;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_INTERNAL_COMMITMENT_TRACKER_H_
