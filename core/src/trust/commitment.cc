// Commitments: a Merkle tree of SHA-256 over fixed canonical ranges (dcr/commitment.h).
#include "dcr/commitment.h"

#include <openssl/evp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>

#include "dcr/device.h"
#include "dcr/receiver.h"
#include "dcr/signing.h"
#include "dcr/status_macros.h"
#include "internal/byte_io.h"
#include "internal/parallel.h"

namespace dcr {
namespace {

constexpr uint8_t kLeafTag = 0x00;
constexpr uint8_t kNodeTag = 0x01;
constexpr uint8_t kRootTag = 0x02;
constexpr char kRootLabel[] = "dcr-commitment-1";

const EVP_MD* Md() {
  static const EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  return md;
}

// The bytes a leaf's digest starts with: tag, tensor identity, leaf index.
std::vector<uint8_t> LeafPrefix(const TensorView& t, uint64_t index) {
  std::vector<uint8_t> out;
  internal::ByteWriter w(&out);
  w.U8(kLeafTag);
  w.U32(static_cast<uint32_t>(t.name.size()));
  w.Raw(t.name.data(), t.name.size());
  w.U32(static_cast<uint32_t>(t.dtype_name.size()));
  w.Raw(t.dtype_name.data(), t.dtype_name.size());
  w.U32(static_cast<uint32_t>(t.shape.size()));
  for (int64_t d : t.shape) w.U64(static_cast<uint64_t>(d));
  w.U64(t.nbytes);
  w.U64(index);
  return out;
}

Sha256Digest Node(const Sha256Digest& l, const Sha256Digest& r) {
  uint8_t buf[1 + 64];
  buf[0] = kNodeTag;
  std::memcpy(buf + 1, l.data(), 32);
  std::memcpy(buf + 33, r.data(), 32);
  return Sha256(buf, sizeof(buf));
}

std::string U(uint64_t v) { return std::to_string(v); }

// The layout's index of each tensor of `part`, checked against the layout.
StatusOr<std::vector<uint32_t>> PartTensors(const CommitmentLayout& layout,
                                            const std::vector<TensorView>& part) {
  std::vector<uint32_t> out;
  out.reserve(part.size());
  for (const TensorView& t : part) {
    std::optional<uint32_t> i = layout.Find(t.name);
    if (!i)
      return InvalidArgumentError("tensor \"" + t.name + "\" is not in the commitment layout");
    const TensorView& l = layout.tensors()[*i];
    if (l.dtype_name != t.dtype_name || l.shape != t.shape || l.nbytes != t.nbytes) {
      return InvalidArgumentError("tensor \"" + t.name +
                                  "\" differs from the commitment layout (dtype, shape or size)");
    }
    out.push_back(*i);
  }
  return out;
}

}  // namespace

StatusOr<CommitmentLayout> CommitmentLayout::Of(const std::vector<TensorView>& tensors) {
  if (tensors.size() >= (uint64_t{1} << 32)) {
    return InvalidArgumentError("more than 2^32 tensors in a commitment layout");
  }
  CommitmentLayout l;
  l.tensors_.reserve(tensors.size());
  for (const TensorView& t : tensors) {
    TensorView v = t;
    v.data = nullptr;
    l.tensors_.push_back(std::move(v));
  }
  std::sort(l.tensors_.begin(), l.tensors_.end(),
            [](const TensorView& a, const TensorView& b) { return a.name < b.name; });
  for (size_t i = 1; i < l.tensors_.size(); ++i) {
    if (l.tensors_[i].name == l.tensors_[i - 1].name) {
      return InvalidArgumentError("two tensors named \"" + l.tensors_[i].name + "\"");
    }
  }
  l.first_leaf_.reserve(l.tensors_.size() + 1);
  for (uint32_t t = 0; t < l.tensors_.size(); ++t) {
    l.first_leaf_.push_back(l.leaves_.size());
    const uint64_t n = l.tensors_[t].nbytes;
    const uint64_t count = n == 0 ? 1 : (n + kCommitmentLeafBytes - 1) / kCommitmentLeafBytes;
    for (uint64_t i = 0; i < count; ++i) {
      const uint64_t begin = i * kCommitmentLeafBytes;
      l.leaves_.push_back(CommitmentLeaf{t, i, begin, std::min(kCommitmentLeafBytes, n - begin)});
    }
  }
  l.first_leaf_.push_back(l.leaves_.size());
  return l;
}

std::optional<uint32_t> CommitmentLayout::Find(const std::string& name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorView& t, const std::string& n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name) return std::nullopt;
  return static_cast<uint32_t>(it - tensors_.begin());
}

std::string CommitmentLayout::Describe(uint64_t i) const {
  const CommitmentLeaf& leaf = leaves_[i];
  return "tensor " + tensors_[leaf.tensor].name + " bytes [" + U(leaf.begin) + ", " +
         U(leaf.begin + leaf.size) + ")";
}

LeafHasher::LeafHasher(const CommitmentLayout& layout, uint64_t leaf) {
  const CommitmentLeaf& l = layout.leaf(leaf);
  expected_ = l.size;
  auto* ctx = EVP_MD_CTX_new();
  ctx_ = ctx;
  if (ctx != nullptr && EVP_DigestInit_ex(ctx, Md(), nullptr) == 1) {
    const std::vector<uint8_t> prefix = LeafPrefix(layout.tensors()[l.tensor], l.index);
    EVP_DigestUpdate(ctx, prefix.data(), prefix.size());
  }
}

LeafHasher::~LeafHasher() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void LeafHasher::Update(const void* data, size_t size) {
  seen_ += size;
  if (ctx_ != nullptr && size > 0) EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, size);
}

StatusOr<Sha256Digest> LeafHasher::Finish() {
  if (seen_ != expected_) {
    return InvalidArgumentError("leaf of " + U(expected_) + " bytes hashed over " + U(seen_));
  }
  Sha256Digest d{};
  unsigned int n = 0;
  if (ctx_ == nullptr || EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), d.data(), &n) != 1 ||
      n != 32) {
    return InternalError("SHA-256 of a commitment leaf failed");
  }
  return d;
}

Sha256Digest LeafDigest(const CommitmentLayout& layout, uint64_t i, const uint8_t* bytes) {
  const CommitmentLeaf& l = layout.leaf(i);
  const std::vector<uint8_t> prefix = LeafPrefix(layout.tensors()[l.tensor], l.index);
  Sha256Digest d{};
  unsigned int n = 0;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, Md(), nullptr);
  EVP_DigestUpdate(ctx, prefix.data(), prefix.size());
  if (l.size > 0) EVP_DigestUpdate(ctx, bytes, l.size);
  EVP_DigestFinal_ex(ctx, d.data(), &n);
  EVP_MD_CTX_free(ctx);
  return d;
}

StatusOr<CommitmentLeaves> CommitmentLeavesOf(const CommitmentLayout& layout,
                                              const std::vector<TensorView>& part, int threads) {
  DCR_ASSIGN_OR_RETURN(std::vector<uint32_t> idx, PartTensors(layout, part));
  // (leaf, host bytes of its range) in leaf order.
  std::vector<std::pair<uint64_t, const uint8_t*>> work;
  std::vector<size_t> order(part.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return idx[a] < idx[b]; });
  for (size_t k : order) {
    const auto* base = static_cast<const uint8_t*>(part[k].data);
    for (uint64_t i = layout.first_leaf(idx[k]); i < layout.first_leaf(idx[k] + 1); ++i) {
      work.emplace_back(i, base == nullptr ? nullptr : base + layout.leaf(i).begin);
    }
  }
  CommitmentLeaves out(work.size());
  internal::ParallelFor(work.size(), threads, [&](uint64_t w) {
    out[w] = {work[w].first, LeafDigest(layout, work[w].first, work[w].second)};
    return true;
  });
  return out;
}

StatusOr<CommitmentLeaves> DeviceCommitmentLeavesOf(Device* device, const CommitmentLayout& layout,
                                                    const std::vector<TensorView>& part,
                                                    int threads, uint64_t piece_bytes) {
  if (piece_bytes == 0) return InvalidArgumentError("piece_bytes must be at least 1");
  DCR_ASSIGN_OR_RETURN(std::vector<uint32_t> idx, PartTensors(layout, part));
  std::vector<std::pair<uint64_t, size_t>> work;  // (leaf, index into part)
  for (size_t k = 0; k < part.size(); ++k) {
    for (uint64_t i = layout.first_leaf(idx[k]); i < layout.first_leaf(idx[k] + 1); ++i) {
      work.emplace_back(i, k);
    }
  }
  std::sort(work.begin(), work.end());
  CommitmentLeaves out(work.size());
  std::mutex mu;
  Status first;
  const uint64_t piece = std::min(piece_bytes, kCommitmentLeafBytes);
  internal::ParallelFor(work.size(), threads, [&](uint64_t w) {
    thread_local std::vector<uint8_t> buf;
    buf.resize(piece);
    const auto [leaf_index, k] = work[w];
    const CommitmentLeaf& leaf = layout.leaf(leaf_index);
    LeafHasher h(layout, leaf_index);
    for (uint64_t off = 0; off < leaf.size; off += piece) {
      const uint64_t n = std::min(piece, leaf.size - off);
      Status s = device->Download(buf.data(),
                                  static_cast<const uint8_t*>(part[k].data) + leaf.begin + off, n);
      if (!s.ok()) {
        std::lock_guard<std::mutex> l(mu);
        if (first.ok()) first = s.WithContext("downloading tensor " + part[k].name);
        return false;
      }
      h.Update(buf.data(), n);
    }
    StatusOr<Sha256Digest> d = h.Finish();
    if (!d.ok()) {
      std::lock_guard<std::mutex> l(mu);
      if (first.ok()) first = d.status();
      return false;
    }
    out[w] = {leaf_index, *d};
    return true;
  });
  DCR_RETURN_IF_ERROR(first);
  return out;
}

StatusOr<std::vector<Sha256Digest>> AssembleLeaves(const CommitmentLayout& layout,
                                                   const std::vector<CommitmentLeaves>& parts) {
  std::vector<Sha256Digest> leaves(layout.num_leaves());
  std::vector<bool> have(layout.num_leaves(), false);
  for (const CommitmentLeaves& part : parts) {
    for (const auto& [i, d] : part) {
      if (i >= leaves.size()) {
        return InvalidArgumentError("commitment leaf " + U(i) + " is out of range (" +
                                    U(leaves.size()) + " leaves)");
      }
      if (have[i]) {
        return InvalidArgumentError("commitment leaf " + U(i) + " (" + layout.Describe(i) +
                                    ") is given by two parts");
      }
      have[i] = true;
      leaves[i] = d;
    }
  }
  for (uint64_t i = 0; i < have.size(); ++i) {
    if (!have[i]) {
      return InvalidArgumentError("commitment leaf " + U(i) + " (" + layout.Describe(i) +
                                  ") is given by no part");
    }
  }
  return leaves;
}

Sha256Digest CommitmentRoot(const std::vector<Sha256Digest>& leaves) {
  Sha256Digest tree{};
  if (!leaves.empty()) {
    std::vector<Sha256Digest> level = leaves;
    while (level.size() > 1) {
      std::vector<Sha256Digest> up;
      up.reserve((level.size() + 1) / 2);
      for (size_t i = 0; i + 1 < level.size(); i += 2) up.push_back(Node(level[i], level[i + 1]));
      if (level.size() % 2 == 1) up.push_back(level.back());
      level = std::move(up);
    }
    tree = level[0];
  }
  std::vector<uint8_t> buf;
  internal::ByteWriter w(&buf);
  w.U8(kRootTag);
  w.Raw(kRootLabel, sizeof(kRootLabel) - 1);
  w.U64(leaves.size());
  w.Raw(tree.data(), 32);
  return Sha256(buf.data(), buf.size());
}

StatusOr<Commitment> CommitmentOf(const std::vector<TensorView>& tensors, int threads) {
  DCR_ASSIGN_OR_RETURN(CommitmentLayout layout, CommitmentLayout::Of(tensors));
  DCR_ASSIGN_OR_RETURN(CommitmentLeaves part, CommitmentLeavesOf(layout, tensors, threads));
  Commitment c;
  c.leaves.reserve(part.size());
  for (auto& [i, d] : part) c.leaves.push_back(d);
  c.root = CommitmentRoot(c.leaves);
  c.layout = std::move(layout);
  return c;
}

StatusOr<Commitment> CheckpointCommitment(const Checkpoint& checkpoint, int threads) {
  std::vector<TensorView> views;
  views.reserve(checkpoint.tensors().size());
  for (const TensorInfo& t : checkpoint.tensors()) {
    views.push_back(TensorView{t.name, t.dtype_name, t.shape, checkpoint.data(t), t.nbytes});
  }
  return CommitmentOf(views, threads);
}

StatusOr<Commitment> HeldCommitment(const Receiver& storage, int threads) {
  const Receiver* r = storage.storage();
  std::vector<TensorView> views;
  std::vector<CommitmentLeaves> parts(1);
  if (const auto* host = dynamic_cast<const BufferReceiver*>(r)) {
    for (const ReceiverTensor& t : host->tensors()) {
      views.push_back(
          TensorView{t.info.name, t.info.dtype_name, t.info.shape, t.data, t.info.nbytes});
    }
    DCR_ASSIGN_OR_RETURN(CommitmentLayout layout, CommitmentLayout::Of(views));
    DCR_ASSIGN_OR_RETURN(parts[0], CommitmentLeavesOf(layout, views, threads));
  } else if (const auto* device = dynamic_cast<const DeviceReceiver*>(r)) {
    for (const DeviceReceiverTensor& t : device->tensors()) {
      views.push_back(
          TensorView{t.info.name, t.info.dtype_name, t.info.shape, t.data, t.info.nbytes});
    }
    DCR_ASSIGN_OR_RETURN(CommitmentLayout layout, CommitmentLayout::Of(views));
    DCR_ASSIGN_OR_RETURN(parts[0],
                         DeviceCommitmentLeavesOf(device->device(), layout, views, threads));
  } else {
    return UnimplementedError(
        "the commitment of this receiver's storage cannot be computed (it is "
        "neither host memory nor a device's)");
  }
  Commitment c;
  c.leaves.reserve(parts[0].size());
  for (auto& [i, d] : parts[0]) c.leaves.push_back(d);
  c.root = CommitmentRoot(c.leaves);
  DCR_ASSIGN_OR_RETURN(c.layout, CommitmentLayout::Of(views));
  return c;
}

std::optional<uint64_t> FirstWrongLeaf(const std::vector<Sha256Digest>& held,
                                       const std::vector<Sha256Digest>& expected) {
  const size_t n = std::min(held.size(), expected.size());
  for (size_t i = 0; i < n; ++i) {
    if (held[i] != expected[i]) return i;
  }
  if (held.size() != expected.size()) return n;
  return std::nullopt;
}

Status MatchCommitment(const Commitment& held, const Sha256Digest& signed_root,
                       const std::vector<Sha256Digest>* signed_leaves) {
  const bool leaves = signed_leaves != nullptr && !signed_leaves->empty();
  if (leaves && CommitmentRoot(*signed_leaves) != signed_root) {
    return DataLossError("the signed commitment leaves do not make the signed root " +
                         CommitmentPrefix(signed_root));
  }
  if (held.root == signed_root) return Status();
  std::string msg = "commitment " + CommitmentPrefix(held.root) +
                    " of the held version is not the signed " + CommitmentPrefix(signed_root);
  if (leaves) {
    std::optional<uint64_t> wrong = FirstWrongLeaf(held.leaves, *signed_leaves);
    if (wrong && *wrong < held.layout.num_leaves()) {
      msg += "; first wrong range: " + held.layout.Describe(*wrong) + " (leaf " + U(*wrong) + ")";
    } else {
      msg += "; the signed version has " + U(signed_leaves->size()) + " leaves, the held one " +
             U(held.leaves.size());
    }
  }
  return FailedPreconditionError(msg);
}

Status CheckCommitment(const std::vector<TensorView>& tensors, const Sha256Digest& signed_root,
                       const std::vector<Sha256Digest>* signed_leaves, int threads) {
  if (signed_leaves != nullptr && !signed_leaves->empty() &&
      CommitmentRoot(*signed_leaves) != signed_root) {
    return DataLossError("the signed commitment leaves do not make the signed root " +
                         CommitmentPrefix(signed_root));
  }
  DCR_ASSIGN_OR_RETURN(Commitment held, CommitmentOf(tensors, threads));
  return MatchCommitment(held, signed_root, signed_leaves);
}

std::string CommitmentHex(const Sha256Digest& root) { return Sha256Hex(root); }
std::string CommitmentPrefix(const Sha256Digest& root) { return Sha256Hex(root).substr(0, 16); }

}  // namespace dcr
