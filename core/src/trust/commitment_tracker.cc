// CommitmentTracker (internal/commitment_tracker.h).
#include "internal/commitment_tracker.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "dcr/device.h"
#include "dcr/status_macros.h"
#include "internal/parallel.h"

namespace dcr::internal {
namespace {

// Runs of one segment listed one by one up to this many; beyond, its bounding range is announced.
constexpr uint64_t kMaxRuns = uint64_t{1} << 16;

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::unique_ptr<CommitmentTracker> CommitmentTracker::Start(const Receiver& storage,
                                                            const Inventory& inventory,
                                                            int threads) {
  const Receiver* r = storage.storage();
  std::vector<TensorView> views;
  Device* device = nullptr;
  if (const auto* host = dynamic_cast<const BufferReceiver*>(r)) {
    for (const ReceiverTensor& t : host->tensors()) {
      views.push_back(
          TensorView{t.info.name, t.info.dtype_name, t.info.shape, t.data, t.info.nbytes});
    }
  } else if (const auto* dev = dynamic_cast<const DeviceReceiver*>(r)) {
    for (const DeviceReceiverTensor& t : dev->tensors()) {
      views.push_back(
          TensorView{t.info.name, t.info.dtype_name, t.info.shape, t.data, t.info.nbytes});
    }
    device = dev->device();
  } else {
    return nullptr;
  }
  StatusOr<CommitmentLayout> layout = CommitmentLayout::Of(views);
  if (!layout.ok()) return nullptr;
  std::unique_ptr<CommitmentTracker> t(new CommitmentTracker());
  t->views_.resize(views.size());
  for (TensorView& v : views) {
    const uint32_t i = *layout->Find(v.name);
    t->views_[i] = std::move(v);
  }
  for (const TensorInfo& ti : inventory.tensors) {
    std::optional<uint32_t> i = layout->Find(ti.name);
    if (!i || layout->tensors()[*i].nbytes != ti.nbytes) return nullptr;
    t->inventory_to_layout_.push_back(*i);
  }
  t->layout_ = std::move(*layout);
  t->device_ = device;
  const uint64_t n = t->layout_.num_leaves();
  t->state_.assign(n, LeafState::kOpen);
  t->open_writes_.assign(n, 0);
  t->covered_.assign(n, 0);
  t->digest_.assign(n, Sha256Digest{});
  const int workers = internal::ResolveThreads(threads);
  for (int k = 0; k < workers; ++k) t->pool_.emplace_back([p = t.get()] { p->Work(); });
  return t;
}

CommitmentTracker::~CommitmentTracker() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : pool_) t.join();
}

void CommitmentTracker::Work() {
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    work_cv_.wait(l, [this] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const uint64_t i = queue_.front();
    queue_.pop_front();
    if (state_[i] != LeafState::kHashing) {  // written since it was queued: doubtful
      if (queue_.empty() && busy_ == 0) idle_cv_.notify_all();
      continue;
    }
    ++busy_;
    l.unlock();
    const double t0 = Seconds();
    StatusOr<Sha256Digest> d = Read(i);
    const double spent = Seconds() - t0;
    l.lock();
    --busy_;
    early_seconds_ += spent;
    if (state_[i] == LeafState::kHashing) {
      if (d.ok()) {
        digest_[i] = *d;
        state_[i] = LeafState::kHashed;
      } else {
        state_[i] = LeafState::kDoubtful;  // Finish reads it again and reports the error
      }
    }
    if (queue_.empty() && busy_ == 0) idle_cv_.notify_all();
  }
}

CommitmentTracker::Touch CommitmentTracker::Before(const ChunkHeader& h) {
  Touch touch;
  const uint64_t w = h.elem_width;
  // Bytes [b, e) of layout tensor `lt`: covered (credited) or only announced.
  auto add = [&](uint32_t lt, uint64_t b, uint64_t e, bool credit) {
    const uint64_t size = layout_.tensors()[lt].nbytes;
    e = std::min(e, size);
    if (b >= e) return;
    const uint64_t first = layout_.first_leaf(lt);
    for (uint64_t k = b / kCommitmentLeafBytes; k * kCommitmentLeafBytes < e; ++k) {
      const uint64_t lb = k * kCommitmentLeafBytes;
      const uint64_t n = std::min(e, lb + kCommitmentLeafBytes) - std::max(b, lb);
      touch.leaves.push_back(first + k);
      if (credit) touch.pieces.push_back({first + k, n});
    }
  };
  for (const Segment& sg : h.segments) {
    if (sg.tensor_index >= inventory_to_layout_.size() || sg.ndim < 1 ||
        sg.ndim > kMaxSegmentDims || w == 0) {
      continue;  // the inner receiver refuses the record before it writes
    }
    const uint32_t lt = inventory_to_layout_[sg.tensor_index];
    // Runs of the innermost dimension when it is contiguous, else single elements.
    const uint32_t inner = sg.ndim - 1;
    const bool contiguous = sg.stride[inner] == 1;
    uint64_t runs = 1;
    bool listable = true;
    for (uint32_t d = 0; d < (contiguous ? inner : sg.ndim); ++d) {
      if (sg.count[d] == 0 || runs > kMaxRuns / sg.count[d]) {
        listable = false;
        break;
      }
      runs *= sg.count[d];
    }
    if (!listable) {
      // The bounding range, announced without credit.
      __int128 lo = sg.offset, hi = sg.offset;
      for (uint32_t d = 0; d < sg.ndim; ++d) {
        const __int128 span =
            static_cast<__int128>(sg.count[d] == 0 ? 0 : sg.count[d] - 1) * sg.stride[d];
        if (span < 0)
          lo += span;
        else
          hi += span;
      }
      if (lo < 0) lo = 0;
      const __int128 limit = layout_.tensors()[lt].nbytes / w;
      if (hi >= limit) hi = limit - 1;
      if (lo <= hi) {
        add(lt, static_cast<uint64_t>(lo) * w, (static_cast<uint64_t>(hi) + 1) * w, false);
      }
      continue;
    }
    const uint64_t run_elems = contiguous ? sg.count[inner] : 1;
    const uint32_t outer = contiguous ? inner : sg.ndim;
    for (uint64_t r = 0; r < runs; ++r) {
      __int128 e = sg.offset;
      uint64_t rest = r;
      for (int d = static_cast<int>(outer) - 1; d >= 0; --d) {
        e += static_cast<__int128>(rest % sg.count[d]) * sg.stride[d];
        rest /= sg.count[d];
      }
      if (e < 0) continue;  // out of bounds: refused by the inner receiver
      const uint64_t b = static_cast<uint64_t>(e) * w;
      add(lt, b, b + run_elems * w, true);
    }
  }
  std::sort(touch.leaves.begin(), touch.leaves.end());
  touch.leaves.erase(std::unique(touch.leaves.begin(), touch.leaves.end()), touch.leaves.end());
  std::lock_guard<std::mutex> l(mu_);
  for (uint64_t i : touch.leaves) {
    ++open_writes_[i];
    if (state_[i] == LeafState::kHashing || state_[i] == LeafState::kHashed) {
      state_[i] = LeafState::kDoubtful;
      ++rehashed_;
    }
  }
  return touch;
}

void CommitmentTracker::After(const Touch& touch, bool applied) {
  bool queued = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (uint64_t i : touch.leaves) --open_writes_[i];
    if (applied) {
      for (const Touch::Piece& p : touch.pieces) covered_[p.leaf] += p.bytes;
    }
    for (uint64_t i : touch.leaves) {
      if (state_[i] == LeafState::kOpen && open_writes_[i] == 0 &&
          covered_[i] >= layout_.leaf(i).size) {
        state_[i] = LeafState::kHashing;
        queue_.push_back(i);
        queued = true;
      }
    }
  }
  if (queued) work_cv_.notify_all();
}

StatusOr<Sha256Digest> CommitmentTracker::Read(uint64_t i) const {
  const CommitmentLeaf& leaf = layout_.leaf(i);
  const TensorView& v = views_[leaf.tensor];
  if (device_ == nullptr) {
    const auto* base = static_cast<const uint8_t*>(v.data);
    return LeafDigest(layout_, i, base == nullptr ? nullptr : base + leaf.begin);
  }
  thread_local std::vector<uint8_t> buf;
  buf.resize(kCommitmentLeafBytes);
  LeafHasher h(layout_, i);
  if (leaf.size > 0) {
    DCR_RETURN_IF_ERROR(
        device_->Download(buf.data(), static_cast<const uint8_t*>(v.data) + leaf.begin, leaf.size)
            .WithContext("downloading tensor " + v.name));
    h.Update(buf.data(), leaf.size);
  }
  return h.Finish();
}

StatusOr<Commitment> CommitmentTracker::Finish(int threads) {
  const double t0 = Seconds();
  uint64_t waited = 0;  // leaves the pool had not hashed yet
  {
    std::unique_lock<std::mutex> l(mu_);
    waited = static_cast<uint64_t>(std::count(state_.begin(), state_.end(), LeafState::kHashing));
    idle_cv_.wait(l, [this] { return queue_.empty() && busy_ == 0; });
  }
  std::vector<uint64_t> left;
  for (uint64_t i = 0; i < state_.size(); ++i) {
    if (state_[i] != LeafState::kHashed) left.push_back(i);
  }
  std::vector<Sha256Digest> leaves = digest_;
  std::mutex mu;
  Status first;
  internal::ParallelFor(left.size(), threads, [&](uint64_t k) {
    StatusOr<Sha256Digest> d = Read(left[k]);
    if (!d.ok()) {
      std::lock_guard<std::mutex> l(mu);
      if (first.ok()) first = d.status();
      return false;
    }
    leaves[left[k]] = *d;
    return true;
  });
  DCR_RETURN_IF_ERROR(first);
  Commitment c;
  c.root = CommitmentRoot(leaves);
  c.leaves = std::move(leaves);
  c.layout = layout_;
  tail_leaves_ = left.size() + waited;
  commit_hashed_ = left.size();
  tail_seconds_ = Seconds() - t0;
  return c;
}

CommitmentPassStats CommitmentTracker::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  CommitmentPassStats c;
  c.leaves = state_.size();
  c.tail_leaves = tail_leaves_;
  c.early_leaves = c.leaves - tail_leaves_;
  c.rehashed_leaves = rehashed_;
  c.commit_hashed_leaves = commit_hashed_;
  c.early_seconds = early_seconds_;
  c.tail_seconds = tail_seconds_;
  return c;
}

}  // namespace dcr::internal
