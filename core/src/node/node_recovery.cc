// Durable parts of a dcr-node (see node_recovery.h).
#include "node/node_recovery.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>

#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/status_macros.h"
#include "dcr/versioning.h"
#include "node/version_state.h"
#include "receivers/device_image.h"

namespace dcr::internal {

namespace {

std::string RankFile(const std::string& state_dir, int rank, const char* suffix) {
  return state_dir + "/rank-" + std::to_string(rank) + suffix;
}

// This boot's id (empty when the kernel does not say).
std::string BootId() {
  auto b = ReadFile("/proc/sys/kernel/random/boot_id");
  if (!b.ok()) return "";
  std::string s(b->begin(), b->end());
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

Status MkdirOne(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return ErrnoError("mkdir " + dir, errno);
  return Status();
}

}  // namespace

StatusOr<int> CountNodeStart(const std::string& state_dir, int rank) {
  DCR_RETURN_IF_ERROR(MkdirOne(state_dir));
  const std::string path = RankFile(state_dir, rank, ".starts");
  int count = 0;
  auto old = ReadFile(path);
  if (old.ok()) count = std::atoi(std::string(old->begin(), old->end()).c_str());
  ++count;
  const std::string text = std::to_string(count) + "\n";
  DCR_RETURN_IF_ERROR(WriteFileAtomic(path, text.data(), text.size()));
  return count;
}

// A Receiver decorator: the steps that make a committed version durable before the journal
// records it (`on_commit`, run after the inner commit: the msync of a mapping, or the download
// of device storage into it; `on_applied`, run after each chunk record the inner receiver
// applied: the mapping's early writeback), and the fault points (fault_points.h) told of each
// chunk application of the inner receiver (its 0-based ordinal; `inside_layer`: this layer is
// under the journal).
class DurableReceiver::HookedReceiver : public Receiver {
 public:
  // `inventory` (may be null) is set to the inventory of every delta begun; `written` (may be
  // null) is set when a chunk record reaches the inner receiver; `faults` may be null (none).
  // `target_header` (may be null) is set to the target's safetensors JSON header of every
  // delta begun ("" for a sharded target).
  HookedReceiver(Receiver* inner, FaultPoints* faults, bool inside_layer,
                 std::function<Status()> on_commit, Inventory* inventory,
                 std::atomic<bool>* written = nullptr, std::function<void()> on_applied = {},
                 std::string* target_header = nullptr)
      : inner_(inner),
        faults_(faults),
        inside_layer_(inside_layer),
        on_commit_(std::move(on_commit)),
        on_applied_(std::move(on_applied)),
        inventory_(inventory),
        target_header_(target_header),
        written_(written) {}
  Status Begin(const uint8_t* h, size_t n) override {
    DCR_RETURN_IF_ERROR(inner_->Begin(h, n));
    if (inventory_ != nullptr || target_header_ != nullptr) {
      size_t consumed = 0;
      DCR_ASSIGN_OR_RETURN(FileHeader header, ParseFileHeader(h, n, &consumed));
      if (inventory_ != nullptr) {
        DCR_ASSIGN_OR_RETURN(*inventory_, Inventory::FromHeader(header));
      }
      if (target_header_ != nullptr) {
        *target_header_ = header.sharded() ? std::string() : header.files[0].header;
      }
    }
    return Status();
  }
  Status ApplyRecord(const uint8_t* r, size_t n) override {
    const int64_t ord = ordinal_.fetch_add(1);
    if (written_ != nullptr) written_->store(true);
    Status s = inner_->ApplyRecord(r, n);
    if (faults_ != nullptr) faults_->ChunkApplied(ord, inside_layer_);
    if (s.ok() && on_applied_) on_applied_();
    return s;
  }
  Status Commit(const uint8_t* t, size_t n) override {
    DCR_RETURN_IF_ERROR(inner_->Commit(t, n));
    if (on_commit_) DCR_RETURN_IF_ERROR(on_commit_());
    return Status();
  }
  void Abort() override { inner_->Abort(); }
  Status MarkApplied(uint64_t id, const Hash128& d) override { return inner_->MarkApplied(id, d); }
  Status Verify(const Checkpoint& target) const override { return inner_->Verify(target); }
  const Receiver* storage() const override {
    return storage_ != nullptr ? storage_ : inner_->storage();
  }
  // The storage this receiver's chain writes to, when the chain does not say (a journal).
  void set_storage(const Receiver* storage) { storage_ = storage; }
  VersionId held() const override { return inner_->held(); }
  bool in_delta() const override { return inner_->in_delta(); }
  std::vector<uint64_t> MissingChunks(const Trailer& t) const override {
    return inner_->MissingChunks(t);
  }

 private:
  Receiver* inner_;
  const Receiver* storage_ = nullptr;
  FaultPoints* faults_;
  bool inside_layer_;
  std::function<Status()> on_commit_;
  std::function<void()> on_applied_;
  Inventory* inventory_;
  std::string* target_header_;
  std::atomic<bool>* written_;
  std::atomic<int64_t> ordinal_{0};
};

DurableReceiver::~DurableReceiver() {
  outer_.reset();
  journaled_.reset();
  durable_layer_.reset();
  backend_.reset();
  if (map_ != nullptr) ::munmap(map_, map_size_);
  if (storage_fd_ >= 0) ::close(storage_fd_);
}

Status DurableReceiver::OpenMapped(const NodePlan& plan, bool restarted) {
  (void)restarted;
  storage_path_ = RankFile(plan.state_dir, plan.rank, ".storage");
  for (const CheckpointFile& f : base_->files()) map_size_ += f.size;
  const std::string meta_path = storage_path_ + ".meta";
  const std::string boot = BootId();
  // Re-attach: the file is the right size and written under this boot, or the journal has no
  // delta in flight (the last commit msynced it).
  struct stat st;
  bool exists = ::stat(storage_path_.c_str(), &st) == 0 &&
                static_cast<uint64_t>(st.st_size) == map_size_;
  if (exists) {
    auto meta = ReadFile(meta_path);
    const std::string was = meta.ok() ? std::string(meta->begin(), meta->end()) : "";
    exists = meta.ok() && (was == boot || !journal_->in_flight());
  }
  const int fd = ::open(storage_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("receiver storage " + storage_path_, errno);
  if (::ftruncate(fd, static_cast<off_t>(map_size_)) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError("receiver storage " + storage_path_ + ": size", err);
  }
  void* m = map_size_ == 0 ? nullptr
                           : ::mmap(nullptr, map_size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  if (m == MAP_FAILED) {
    ::close(fd);
    return ErrnoError("receiver storage " + storage_path_ + ": mmap", err);
  }
  map_ = static_cast<uint8_t*>(m);
  storage_fd_ = fd;
  DCR_RETURN_IF_ERROR(WriteFileAtomic(meta_path, boot.data(), boot.size()));
  reattached_ = exists;
  return Status();
}

Status DurableReceiver::CopyBaseIntoMapping() {
  uint64_t off = 0;
  for (const CheckpointFile& f : base_->files()) {
    if (f.size > 0) std::memcpy(map_ + off, f.data, f.size);
    off += f.size;
  }
  return MsyncMapping();
}

std::vector<uint8_t*> DurableReceiver::MappedTensors() const {
  std::vector<uint8_t*> out;
  const auto& files = base_->files();
  std::vector<uint64_t> file_off;
  uint64_t off = 0;
  for (const CheckpointFile& f : files) {
    file_off.push_back(off);
    off += f.size;
  }
  for (const TensorInfo& t : base_->tensors()) {
    const uint8_t* p = base_->data(t);
    uint8_t* at = nullptr;
    for (size_t i = 0; i < files.size(); ++i) {
      if (p >= files[i].data && p < files[i].data + files[i].size) {
        at = map_ + file_off[i] + (p - files[i].data);
        break;
      }
    }
    out.push_back(at);
  }
  return out;
}

Status DurableReceiver::MsyncMapping() {
  if (map_size_ > 0 && ::msync(map_, map_size_, MS_SYNC) != 0) {
    return ErrnoError("receiver storage " + storage_path_ + ": msync", errno);
  }
  return Status();
}

Status DurableReceiver::RecordTargetHeader() {
  const std::string path = StorageHeaderPath(storage_path_);
  if (target_header_.empty()) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoError("unlink " + path, errno);
    return Status();
  }
  return WriteFileAtomic(path, target_header_.data(), target_header_.size());
}

void DurableReceiver::StartWriteback() {
  // Offset 0 and length 0: the whole file. Only starts the writes of pages dirty now; a page
  // written again later is dirty again and goes out with the commit's msync.
  if (storage_fd_ >= 0) (void)::sync_file_range(storage_fd_, 0, 0, SYNC_FILE_RANGE_WRITE);
}

Status DurableReceiver::DownloadIntoMapping() {
  const std::vector<uint8_t*> at = MappedTensors();
  const auto& tensors = device_rx_->tensors();
  for (size_t k = 0; k < tensors.size() && k < at.size(); ++k) {
    if (at[k] == nullptr || tensors[k].info.nbytes == 0) continue;
    DCR_RETURN_IF_ERROR(device_rx_->device()
                            ->Download(at[k], tensors[k].data, tensors[k].info.nbytes)
                            .WithContext("receiver storage: tensor '" + tensors[k].info.name + "'"));
  }
  return MsyncMapping();
}

StatusOr<std::unique_ptr<DurableReceiver>> DurableReceiver::Open(const NodePlan& plan,
                                                                 std::shared_ptr<Device> device,
                                                                 int starts, FaultPoints* faults,
                                                                 std::unique_ptr<Receiver> carried) {
  if (plan.receiver_base_path.empty()) {
    return InvalidArgumentError("plan.receiver_base_path: required for a delta receiver");
  }
  std::unique_ptr<DurableReceiver> r(new DurableReceiver());
  DCR_ASSIGN_OR_RETURN(r->base_, Checkpoint::Open(plan.receiver_base_path));
  // The base's version number: a long-lived receiver's base is the version it committed last.
  r->base_version_ = VersionId{plan.base_version > 0 ? static_cast<uint64_t>(plan.base_version) : 0,
                               r->base_->ContentHash(0)};
  // Device storage of the version before, kept by this process: used when it holds the base.
  std::unique_ptr<DeviceReceiver> carried_device;
  if (carried != nullptr) {
    auto* d = dynamic_cast<DeviceReceiver*>(carried.get());
    if (device != nullptr && d != nullptr && starts == 1 && !d->in_delta() &&
        d->held() == r->base_version_) {
      carried.release();
      carried_device.reset(d);
    }
    carried.reset();  // anything else is freed before the device is loaded again
  }
  const std::string journal_path = RankFile(plan.state_dir, plan.rank, ".journal");
  JournalOptions jo;
  jo.group_commit = true;
  DCR_ASSIGN_OR_RETURN(r->journal_, ReceiverJournal::Open(journal_path, jo));
  const bool restarted = starts > 1;
  std::optional<VersionId> committed = r->journal_->committed();
  const bool mapped = device == nullptr;
  // Both kinds keep the mapping: on "cpu" it is the storage; on a device it is the host image of
  // the last committed version (written at each commit), what a restart reloads the device from.
  DCR_RETURN_IF_ERROR(r->OpenMapped(plan, restarted));
  // The mapping holds whatever version the journal last committed; a lost one that is not the
  // base cannot be reloaded here: the node starts over from the base.
  if (committed && *committed != r->base_version_ && !r->reattached_) committed.reset();
  std::unique_ptr<DeviceReceiver> loaded;
  if (!mapped && committed && *committed != r->base_version_) {
    // The device lost its memory with the process: it reloads the committed target's image,
    // which is laid out as the base's files (one file or the shards, concatenated), so each
    // tensor's bytes sit where the base's mapping places them.
    const std::vector<uint8_t*> at = r->MappedTensors();
    const std::vector<const uint8_t*> image(at.begin(), at.end());
    auto d = MakeDeviceReceiverFromImage(device, *r->base_, image, committed->number);
    if (!d.ok()) return d.status().WithContext("receiver " + std::to_string(plan.rank));
    if ((*d)->held() == *committed) loaded = std::move(*d);
    if (loaded == nullptr) committed.reset();  // an image that is not that version: start over
  }
  if (!committed) {
    // First start (or a start over): the storage is the base, and the journal says so.
    r->journal_.reset();
    ::unlink(journal_path.c_str());
    DCR_ASSIGN_OR_RETURN(r->journal_, ReceiverJournal::Open(journal_path, jo));
    DCR_RETURN_IF_ERROR(r->CopyBaseIntoMapping());
    DCR_RETURN_IF_ERROR(r->journal_->RecordCommitted(r->base_version_));
    r->reattached_ = mapped;
    committed = r->base_version_;
  } else if (!mapped && *committed == r->base_version_) {
    // A device's image may hold a target whose commit the journal never recorded: the base again.
    DCR_RETURN_IF_ERROR(r->CopyBaseIntoMapping());
  }
  if (!mapped) r->reattached_ = false;  // device memory is loaded, never re-attached
  const JournalState js = r->journal_->state();
  r->restart_.storage_lost = mapped ? !r->reattached_ : restarted;
  r->restart_.target_committed = *committed != r->base_version_;
  r->restart_.applied = js.applied.size();
  r->restart_.doubtful = js.doubtful.size();
  std::function<Status()> on_commit;
  std::function<void()> on_applied;
  if (mapped) {
    std::vector<ReceiverTensor> tensors;
    const std::vector<uint8_t*> at = r->MappedTensors();
    for (size_t k = 0; k < at.size(); ++k) tensors.push_back({r->base_->tensors()[k], at[k]});
    r->backend_ = std::make_unique<BufferReceiver>(std::move(tensors), *committed);
    on_commit = [p = r.get()] {
      DCR_RETURN_IF_ERROR(p->MsyncMapping());
      return p->RecordTargetHeader();
    };
    on_applied = [p = r.get()] { p->StartWriteback(); };
  } else {
    if (loaded == nullptr && carried_device != nullptr) {
      loaded = std::move(carried_device);
      r->carried_ = true;
    }
    carried_device.reset();
    if (loaded == nullptr) {
      auto d = MakeDeviceReceiver(device, *r->base_, r->base_version_.number);
      if (!d.ok()) return d.status().WithContext("receiver " + std::to_string(plan.rank));
      loaded = std::move(*d);
    }
    r->device_rx_ = loaded.get();
    r->backend_ = std::move(loaded);
    on_commit = [p = r.get()] {
      DCR_RETURN_IF_ERROR(p->DownloadIntoMapping());
      p->written_ = false;  // the device holds the committed version again
      return p->RecordTargetHeader();
    };
  }
  r->durable_layer_ = std::make_unique<HookedReceiver>(r->backend_.get(), faults, true,
                                                      std::move(on_commit), nullptr, &r->written_,
                                                      std::move(on_applied));
  r->journaled_ = std::make_unique<JournaledReceiver>(r->durable_layer_.get(), r->journal_.get());
  r->outer_ = std::make_unique<HookedReceiver>(r->journaled_.get(), faults, false, nullptr,
                                              &r->inventory_, nullptr, std::function<void()>(),
                                              &r->target_header_);
  return r;
}

Receiver* DurableReceiver::receiver() { return outer_.get(); }

std::unique_ptr<Receiver> DurableReceiver::TakeDevice() {
  if (device_rx_ == nullptr || written_.load() || backend_->in_delta()) return nullptr;
  const std::optional<VersionId> c = journal_->committed();
  if (!c.has_value() || *c != backend_->held()) return nullptr;
  device_rx_ = nullptr;
  return std::move(backend_);
}

std::unique_ptr<Receiver> DurableReceiver::Handle() {
  auto handle = std::make_unique<HookedReceiver>(outer_.get(), nullptr, false, nullptr, nullptr);
  handle->set_storage(backend_.get());
  return handle;
}

Status DurableReceiver::ReloadCommitted() {
  DCR_RETURN_IF_ERROR(CopyBaseIntoMapping());
  if (device_rx_ != nullptr && written_.exchange(false)) {
    // Device memory written since its load: the base's tensors uploaded again.
    for (const DeviceReceiverTensor& t : device_rx_->tensors()) {
      const TensorInfo* info = base_->Find(t.info.name);
      if (info == nullptr) return InternalError("reload: tensor '" + t.info.name + "' not in the base");
      DCR_RETURN_IF_ERROR(device_rx_->device()
                              ->Upload(t.data, base_->data(*info), t.info.nbytes)
                              .WithContext("reloading tensor '" + t.info.name + "'"));
    }
  }
  return journal_->AbandonDelta();
}

StatusOr<std::vector<uint8_t>> DurableReceiver::OverwriteForm(const uint8_t* record,
                                                              size_t size) const {
  return OverwriteChunkFromRelative(record, size, inventory_, *base_);
}

bool DurableReceiver::TargetCommittedNow() const {
  const std::optional<VersionId> c = journal_->committed();
  return c.has_value() && *c != base_version_;
}

bool DurableReceiver::Doubtful(uint64_t chunk_id) const {
  return journal_->Lookup(chunk_id, nullptr) == JournalChunkState::kDoubtful;
}

JournaledApplyStats DurableReceiver::stats() const { return journaled_->stats(); }

// ---- StoreMirror ----

StoreMirror::StoreMirror(std::unique_ptr<ObjectStore> store, std::string prefix)
    : store_(std::move(store)), prefix_(std::move(prefix)) {
  thread_ = std::thread([this] { Loop(); });
}

StoreMirror::~StoreMirror() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  thread_.join();
}

void StoreMirror::Put(const BlobInfo& info, std::shared_ptr<const std::vector<uint8_t>> bytes) {
  std::lock_guard<std::mutex> l(mu_);
  if (info.kind == BlobKind::kTrailer) {
    trailer_ = {info, std::move(bytes)};
    have_trailer_ = true;
  } else {
    queue_.emplace_back(info, std::move(bytes));
  }
  cv_.notify_all();
}

void StoreMirror::Flush() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] {
    return queue_.empty() && !busy_ && !(have_trailer_ && put_ == trailer_.first.id);
  });
}

uint64_t StoreMirror::puts() const {
  std::lock_guard<std::mutex> l(mu_);
  return put_;
}

uint64_t StoreMirror::failures() const {
  std::lock_guard<std::mutex> l(mu_);
  return failed_;
}

void StoreMirror::Loop() {
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    // The trailer publishes the stream: it goes once every blob before it (ids 0 .. id-1) is in.
    cv_.wait(l, [&] {
      return stop_ || !queue_.empty() || (have_trailer_ && put_ == trailer_.first.id);
    });
    if (queue_.empty() && !(have_trailer_ && put_ == trailer_.first.id)) {
      if (stop_) return;
      continue;
    }
    std::pair<BlobInfo, std::shared_ptr<const std::vector<uint8_t>>> job;
    if (!queue_.empty()) {
      job = std::move(queue_.front());
      queue_.pop_front();
    } else {
      job = std::move(trailer_);
      have_trailer_ = false;
    }
    busy_ = true;
    l.unlock();
    Status s = store_->Put(ObjectKey(prefix_, job.first), job.second->data(), job.second->size());
    l.lock();
    busy_ = false;
    if (s.ok()) {
      ++put_;
    } else {
      ++failed_;
    }
    cv_.notify_all();
    if (stop_ && queue_.empty()) return;
  }
}

}  // namespace dcr::internal
