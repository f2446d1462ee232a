// Commitments of checkpoint versions: a Merkle tree of SHA-256 over fixed canonical byte ranges of
// the tensors, whose root the trainer signs (dcr/manifest.h, Manifest::commitment) and a receiver
// recomputes over what it holds. Unlike the additive content hash (dcr/hash.h, a checksum that a
// generalized birthday attack forges in seconds) the root is collision resistant: equal roots
// mean equal bytes, tensor names, dtypes and shapes.
//
// Construction (core/FORMAT.md section 4.2 is normative):
//  - Tensors are ordered by name (bytewise), so the tree does not depend on how files or ranks
//    split the checkpoint. Each tensor's bytes are cut into leaves of kCommitmentLeafBytes (the
//    last one shorter); a tensor of 0 bytes has one empty leaf. Leaves are numbered 0..n-1 in that
//    order.
//  - leaf = SHA-256(0x00 || identity || u64 leaf index within the tensor || bytes), identity =
//    u32 name length, name, u32 dtype length, dtype, u32 rank, i64 dims, u64 tensor bytes (all
//    little-endian): a leaf names its tensor and range, so equal bytes elsewhere do not match.
//  - node = SHA-256(0x01 || left || right), the tree shaped as RFC 6962's (the left subtree holds
//    the largest power of two below n leaves; computed level by level, an odd last node moves up
//    unchanged).
//  - root = SHA-256(0x02 || "dcr-commitment-1" || u64 n || tree root), tree root of 0 leaves = 32
//    zero bytes.
// Leaves are independent, so any holder of whole leaves (a trainer rank's tensors, a receiver's
// own storage, a device's tensors downloaded piece by piece) computes them in parallel and any
// set of parts that covers every leaf once gives the root (AssembleLeaves).
//
// Why a Merkle tree and not a homomorphic hash (LtHash): LtHash costs a hash expansion to its
// ~2 KB digest per item; per element that is far slower than SHA-256 of the bytes, and per range
// its incrementality buys nothing, since at 1-5% of elements changed per version every range of
// a few MiB changes anyway. A tree of SHA-256 (SHA-NI: ~1.5-1.8 GB/s per core) verifies any leaf
// alone, so a mismatch names the first wrong range.
//
// Leaf size 4 MiB: 2^21 BF16 elements, half of the default chunk grid cell; ~500k leaves (16 MB
// of leaf digests) for a 1T-parameter BF16 model, large enough that per-leaf overhead is nil and
// parallelism is plentiful, small enough to name a wrong range precisely.
//
// Thread safety: pure functions; CommitmentLayout is immutable after Of().
#ifndef DCR_CORE_INCLUDE_DCR_COMMITMENT_H_
#define DCR_CORE_INCLUDE_DCR_COMMITMENT_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/manifest.h"
#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {

class Device;    // dcr/device.h
class Receiver;  // dcr/receiver.h

inline constexpr uint64_t kCommitmentLeafBytes = uint64_t{1} << 22;

// One leaf: bytes [begin, begin + size) of tensor `tensor` (an index into the layout's tensors),
// its `index`-th leaf.
struct CommitmentLeaf {
  uint32_t tensor = 0;
  uint64_t index = 0;
  uint64_t begin = 0;
  uint64_t size = 0;
};

// The leaves of a checkpoint's tensors: from their metadata alone (names, dtypes, shapes, byte
// sizes), so every party that knows the inventory numbers the leaves the same way.
class CommitmentLayout {
 public:
  // Errors: kInvalidArgument for two tensors of one name or more than 2^32 tensors.
  static StatusOr<CommitmentLayout> Of(const std::vector<TensorView>& tensors);

  uint64_t num_leaves() const { return leaves_.size(); }
  const CommitmentLeaf& leaf(uint64_t i) const { return leaves_[i]; }
  // Tensors in leaf order (by name); their `data` is not used.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  // The tensor of that name's index, or nullopt.
  std::optional<uint32_t> Find(const std::string& name) const;
  // Its first leaf; its leaves are [first_leaf(t), first_leaf(t + 1)).
  uint64_t first_leaf(uint32_t t) const { return first_leaf_[t]; }
  // "tensor NAME bytes [B, E)" for leaf `i`.
  std::string Describe(uint64_t i) const;

 private:
  std::vector<TensorView> tensors_;
  std::vector<uint64_t> first_leaf_;  // tensors_.size() + 1 entries
  std::vector<CommitmentLeaf> leaves_;
};

// SHA-256 of one leaf over pieces of its bytes, in order (a device download, a file read).
class LeafHasher {
 public:
  LeafHasher(const CommitmentLayout& layout, uint64_t leaf);
  ~LeafHasher();
  LeafHasher(const LeafHasher&) = delete;
  LeafHasher& operator=(const LeafHasher&) = delete;
  void Update(const void* data, size_t size);
  // The digest. kInvalidArgument when the pieces did not add up to the leaf's size; kInternal if
  // OpenSSL fails.
  StatusOr<Sha256Digest> Finish();

 private:
  void* ctx_ = nullptr;  // EVP_MD_CTX
  uint64_t expected_ = 0;
  uint64_t seen_ = 0;
};

// Leaf `i` over its bytes [bytes, bytes + layout.leaf(i).size).
Sha256Digest LeafDigest(const CommitmentLayout& layout, uint64_t i, const uint8_t* bytes);

// A part of a version's leaves: (leaf index, digest) pairs, in increasing index order.
using CommitmentLeaves = std::vector<std::pair<uint64_t, Sha256Digest>>;

// The leaves of the tensors in `part` (whole tensors of the layout, host memory at `data`; any
// subset: one rank's, one receiver's), hashed on `threads` workers (0 = hardware concurrency).
// The result does not depend on `threads`. Errors: kInvalidArgument for a tensor the layout does
// not have or whose dtype, shape or size differ from it.
StatusOr<CommitmentLeaves> CommitmentLeavesOf(const CommitmentLayout& layout,
                                              const std::vector<TensorView>& part, int threads);
// The same for tensors in the memory of `device` (each view's `data` a device address): each
// leaf is downloaded in pieces of at most `piece_bytes` (>= 1) into one host buffer per worker
// and hashed as it arrives, so host memory is threads x piece_bytes. Errors: the device's,
// naming the tensor.
StatusOr<CommitmentLeaves> DeviceCommitmentLeavesOf(Device* device, const CommitmentLayout& layout,
                                                    const std::vector<TensorView>& part,
                                                    int threads,
                                                    uint64_t piece_bytes = kCommitmentLeafBytes);

// Every leaf of the layout from parts that together cover each leaf exactly once.
// kInvalidArgument naming a leaf that no part or two parts give, or an index out of range.
StatusOr<std::vector<Sha256Digest>> AssembleLeaves(const CommitmentLayout& layout,
                                                   const std::vector<CommitmentLeaves>& parts);

// The root over all leaves, in order.
Sha256Digest CommitmentRoot(const std::vector<Sha256Digest>& leaves);

// A whole version's commitment.
struct Commitment {
  Sha256Digest root{};
  std::vector<Sha256Digest> leaves;
  CommitmentLayout layout;  // what the leaves cover
};
// The commitment of `tensors` (a whole version, host memory), on `threads` workers.
// Errors: CommitmentLayout::Of's.
StatusOr<Commitment> CommitmentOf(const std::vector<TensorView>& tensors, int threads);

// The commitment of an opened checkpoint (every tensor), on `threads` workers.
StatusOr<Commitment> CheckpointCommitment(const Checkpoint& checkpoint, int threads);

// The commitment of what `storage` holds now (Receiver::storage(): a BufferReceiver's host
// memory, or a DeviceReceiver's tensors downloaded in pieces of one leaf), on `threads`
// workers. kUnimplemented for storage of any other kind; the
// device's errors.
StatusOr<Commitment> HeldCommitment(const Receiver& storage, int threads);

// The first leaf at which `held` differs from `expected` (both a whole version's leaves in
// layout order); nullopt when they are equal. Lists of different lengths differ at the shorter's
// end.
std::optional<uint64_t> FirstWrongLeaf(const std::vector<Sha256Digest>& held,
                                       const std::vector<Sha256Digest>& expected);

// Checks that `held` is `signed_root`: kFailedPrecondition when it is not, as CheckCommitment
// says it; kDataLoss when `signed_leaves` are given but do not make `signed_root`.
Status MatchCommitment(const Commitment& held, const Sha256Digest& signed_root,
                       const std::vector<Sha256Digest>* signed_leaves);

// Checks that `tensors` (a whole version, host memory) commit to `signed_root`.
// kFailedPrecondition when they do not: "commitment <held prefix> is not the signed <signed
// prefix>", and, when `signed_leaves` (leaves the signed root authenticates) are given, the first
// wrong range ("first wrong range: tensor NAME bytes [B, E)"); kDataLoss when `signed_leaves`
// are given but do not make `signed_root`.
Status CheckCommitment(const std::vector<TensorView>& tensors, const Sha256Digest& signed_root,
                       const std::vector<Sha256Digest>* signed_leaves, int threads);

// 64 lowercase hex digits of a root; CommitmentPrefix: the first 16.
std::string CommitmentHex(const Sha256Digest& root);
std::string CommitmentPrefix(const Sha256Digest& root);

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_COMMITMENT_H_
