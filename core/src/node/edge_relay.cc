// The edge relay's transcoding (see edge_relay.h).
#include "node/edge_relay.h"

#include <time.h>

#include "dcr/context.h"
#include "dcr/delta.h"
#include "dcr/format.h"
#include "dcr/status_macros.h"
#include "internal/chunk_bounds.h"

namespace dcr::internal {

namespace {

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

// ---- EdgeTranscoder ----

StatusOr<std::unique_ptr<EdgeTranscoder>> EdgeTranscoder::Open(const std::string& base_path,
                                                               int zstd_level,
                                                               std::optional<EdgeRange> range) {
  if (range.has_value() && range->end <= range->first) {
    return InvalidArgumentError("edge relay: empty chunk range [" + std::to_string(range->first) +
                                ", " + std::to_string(range->end) + ")");
  }
  auto base = Checkpoint::Open(base_path);
  if (!base.ok()) return base.status().WithContext("edge relay: canonical base");
  return std::unique_ptr<EdgeTranscoder>(new EdgeTranscoder(std::move(*base), zstd_level, range));
}

Status EdgeTranscoder::SetHeader(const uint8_t* header, size_t size) {
  size_t consumed = 0;
  DCR_ASSIGN_OR_RETURN(FileHeader fh, ParseFileHeader(header, size, &consumed));
  DCR_ASSIGN_OR_RETURN(Inventory inv, Inventory::FromHeader(fh));
  std::vector<TensorBuffer> tensors;
  std::vector<std::string> names;
  tensors.reserve(inv.tensors.size());
  for (size_t i = 0; i < inv.tensors.size(); ++i) {
    const TensorInfo& want = inv.tensors[i];
    const TensorInfo* have = base_->Find(want.name);
    names.push_back(want.name);
    if (have == nullptr && range_.has_value()) {
      // Another range's tensor: a chunk of this range that covers it is refused (ToPlain).
      tensors.push_back(TensorBuffer{nullptr, want.num_elements(), want.width(), inv.salts[i]});
      continue;
    }
    if (have == nullptr || have->nbytes != want.nbytes || have->width() != want.width()) {
      return FailedPreconditionError(
          "edge relay: the canonical base " +
          std::string(have == nullptr ? "lacks tensor '" : "holds another size of '") + want.name +
          "' of the delta");
    }
    tensors.push_back(TensorBuffer{const_cast<uint8_t*>(base_->data(*have)), have->num_elements(),
                                   have->width(), inv.salts[i]});
  }
  tensors_ = std::move(tensors);
  names_ = std::move(names);
  header_set_ = true;
  return Status();
}

StatusOr<std::optional<std::vector<uint8_t>>> EdgeTranscoder::ToPlain(const uint8_t* blob,
                                                                      size_t size) const {
  size_t hsize = 0, rsize = 0;
  StatusOr<ChunkHeader> h = ParseChunkHeader(blob, size, &hsize, &rsize);
  // Not a chunk record (a manifest record), or one the receivers refuse themselves: as it is.
  if (!h.ok() || !IsContextCoded(*h)) return std::optional<std::vector<uint8_t>>();
  if (range_.has_value() && !range_->Contains(h->chunk_id)) {
    return std::optional<std::vector<uint8_t>>();  // another edge relay's range
  }
  if (!header_set_) return FailedPreconditionError("edge relay: chunk before the delta header");
  for (const Segment& sg : h->segments) {
    if (sg.tensor_index < tensors_.size() && tensors_[sg.tensor_index].data == nullptr) {
      return FailedPreconditionError("edge relay: chunk " + std::to_string(h->chunk_id) +
                                     " of its range [" + std::to_string(range_->first) + ", " +
                                     std::to_string(range_->end) + ") covers tensor '" +
                                     names_[sg.tensor_index] + "', which its base lacks");
    }
  }
  thread_local std::vector<uint8_t> bits;
  Status g = GatherCoveredBits(*h, tensors_, &bits);
  if (!g.ok()) return g.WithContext("edge relay: chunk " + std::to_string(h->chunk_id));
  auto plain = ContextChunkToPlain(blob, size, bits.data(), bits.size(), zstd_level_);
  if (!plain.ok()) {
    return plain.status().WithContext("edge relay: transcoding chunk " +
                                      std::to_string(h->chunk_id));
  }
  return std::optional<std::vector<uint8_t>>(std::move(*plain));
}

// ---- PieceTracker ----

bool PieceTracker::Add(const BlobInfo& blob, uint64_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  if (whole_.count(blob.id) != 0) return false;
  std::set<uint64_t>& got = partial_[blob.id];
  got.insert(offset);
  if (got.size() < NumPieces(blob.size, piece_bytes_)) return false;
  partial_.erase(blob.id);
  whole_.insert(blob.id);
  return true;
}

bool PieceTracker::Whole(BlobId blob) const {
  std::lock_guard<std::mutex> lock(mu_);
  return whole_.count(blob) != 0;
}

void PieceTracker::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  partial_.clear();
  whole_.clear();
}

// ---- EdgeIngress ----

EdgeIngress::EdgeIngress(std::unique_ptr<EdgeTranscoder> transcoder, uint64_t piece_bytes,
                         int threads, Callbacks callbacks)
    : transcoder_(std::move(transcoder)),
      piece_bytes_(piece_bytes),
      cb_(std::move(callbacks)),
      tracker_(piece_bytes) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Worker(); });
}

EdgeIngress::~EdgeIngress() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void EdgeIngress::PostPieces(const BlobInfo& info) {
  const uint64_t n = NumPieces(info.size, piece_bytes_);
  for (uint64_t k = 0; k < n; ++k) {
    const uint64_t off = k * piece_bytes_;
    cb_.post(event::DataReceived{info, off, std::min(piece_bytes_, info.size - off)});
  }
}

void EdgeIngress::Piece(const BlobInfo& info, uint64_t offset,
                        std::shared_ptr<const std::vector<uint8_t>> bytes) {
  if (!tracker_.Add(info, offset)) return;
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t epoch = epoch_;
  if (info.kind == BlobKind::kHeader) {
    if (!header_ready_) {
      Status s = transcoder_->SetHeader(bytes->data(), bytes->size());
      if (!s.ok()) {
        lock.unlock();
        return cb_.fatal(s);
      }
      header_ready_ = true;
      for (Job& j : waiting_) queue_.push_back(std::move(j));
      waiting_.clear();
      cv_.notify_all();
    }
    lock.unlock();
    return PostPieces(info);
  }
  if (info.kind == BlobKind::kChunk) {
    Job job{info, std::move(bytes), epoch};
    if (header_ready_) {
      queue_.push_back(std::move(job));
      cv_.notify_one();
    } else {
      waiting_.push_back(std::move(job));
    }
    return;
  }
  lock.unlock();
  PostPieces(info);  // the trailer
}

void EdgeIngress::Worker() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      job = std::move(queue_.front());
      queue_.erase(queue_.begin());
    }
    Transcode(job);
  }
}

void EdgeIngress::Transcode(const Job& job) {
  const double t0 = ThreadCpuSeconds();
  // A worker thread: an exception (an allocation the record asks for) becomes the stream's
  // fatal Status, never the end of the process.
  StatusOr<std::optional<std::vector<uint8_t>>> plain = InternalError("not run");
  Status thrown = NoThrow("edge relay: transcoding a chunk", [&] {
    plain = transcoder_->ToPlain(job.bytes->data(), job.bytes->size());
    return Status();
  });
  if (!thrown.ok()) plain = thrown;
  const double cpu = ThreadCpuSeconds() - t0;
  // Handed on under the lock, so that nothing of a stream left behind (Reset) comes after it.
  std::lock_guard<std::mutex> lock(mu_);
  if (job.epoch != epoch_) return;
  stats_.cpu_seconds += cpu;
  if (!plain.ok()) return cb_.fatal(plain.status());
  if (!plain->has_value()) return PostPieces(job.info);
  ++stats_.chunks;
  stats_.context_bytes += job.bytes->size();
  stats_.plain_bytes += (*plain)->size();
  const BlobInfo info{job.info.id, job.info.kind, (*plain)->size()};
  cb_.replace(info, std::move(**plain));
  PostPieces(info);
}

void EdgeIngress::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  ++epoch_;
  queue_.clear();
  waiting_.clear();
  tracker_.Clear();
}

EdgeStats EdgeIngress::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace dcr::internal
