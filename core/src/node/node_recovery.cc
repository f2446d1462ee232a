// Durable parts of a dcr-node (see node_recovery.h).
#include "node/node_recovery.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>

#include "dcr/checkpoint.h"
#include "dcr/delta.h"
#include "dcr/status_macros.h"
#include "dcr/versioning.h"
#include "internal/process_io.h"
#include "node/version_state.h"
#include "receivers/device_image.h"
#include "receivers/forwarding_receiver.h"

namespace dcr::internal {

namespace {

std::string RankFile(const std::string& state_dir, int rank, const char* suffix) {
  return state_dir + "/rank-" + std::to_string(rank) + suffix;
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

// The layers DurableReceiver builds over its storage. Each forwards what it does not name.

// Over the version log, under the journal: the durability bookkeeping of the storage. A chunk
// record that reaches the storage within a delta marks it written (ReloadCommitted then reloads
// the committed version; TakeStorage hands on only unwritten storage); a commit marks it clean
// again (the log below holds the version it now holds).
class DurableReceiver::StorageHooks : public ForwardingReceiver {
 public:
  // Neither pointer is owned; both must outlive this object.
  StorageHooks(Receiver* inner, std::atomic<bool>* written)
      : ForwardingReceiver(inner), written_(written) {}
  Status ApplyRecord(const uint8_t* r, size_t n) override {
    // Outside a delta (a chunk delivered again after the commit) the storage refuses it unwritten.
    if (inner()->in_delta()) written_->store(true);
    return inner()->ApplyRecord(r, n);
  }
  Status Commit(const uint8_t* t, size_t n) override {
    DCR_RETURN_IF_ERROR(inner()->Commit(t, n));
    written_->store(false);  // the storage holds the committed version again
    return Status();
  }

 private:
  std::atomic<bool>* written_;
};

// Over the journal: at each Begin, after the inner one, `*inventory` and `*target_header` set
// from the delta's header and `on_begin` run. Also the handle a decorator that owns what it
// wraps holds (DurableReceiver::Handle: no inventory, no target header, no on_begin).
class DurableReceiver::HeaderHooks : public ForwardingReceiver {
 public:
  // `inner` is not owned and must outlive this object; `inventory` and `target_header` (may be
  // null) get the inventory and the target's safetensors JSON header ("" for a sharded target)
  // of every delta begun.
  HeaderHooks(Receiver* inner, Inventory* inventory, std::string* target_header,
              std::function<Status()> on_begin)
      : ForwardingReceiver(inner),
        inventory_(inventory),
        target_header_(target_header),
        on_begin_(std::move(on_begin)) {}
  Status Begin(const uint8_t* h, size_t n) override {
    DCR_RETURN_IF_ERROR(inner()->Begin(h, n));
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
    if (on_begin_) DCR_RETURN_IF_ERROR(on_begin_());
    return Status();
  }

 private:
  Inventory* inventory_;
  std::string* target_header_;
  std::function<Status()> on_begin_;
};

HeldStorage::~HeldStorage() {
  storage_.reset();  // a BufferReceiver over image_ goes first
}

DurableReceiver::~DurableReceiver() {
  outer_.reset();
  fault_outside_.reset();
  journaled_.reset();
  fault_inside_.reset();
  hooks_.reset();
  logging_.reset();
  held_.reset();
}

Status DurableReceiver::StorageFromRecovered(const std::shared_ptr<Device>& device,
                                             RecoveredVersion* rec) {
  if (device == nullptr) {
    held_->image_ = std::move(rec->bytes);
    auto host = std::make_unique<BufferReceiver>(ImageTensors(*layout_, held_->image_.data()),
                                                 rec->version);
    held_->host_ = host.get();
    held_->storage_ = std::move(host);
    return Status();
  }
  std::vector<const uint8_t*> at;
  for (const ReceiverTensor& t : ImageTensors(*layout_, rec->bytes.data())) at.push_back(t.data);
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<DeviceReceiver> d,
                       MakeDeviceReceiverFromImage(device, *layout_, at, rec->version.number));
  if (d->held() != rec->version) {
    return DataLossError("version log " + held_->log_dir_ + ": the device holds " +
                         d->held().ToString() + " after loading " + rec->version.ToString());
  }
  held_->device_ = d.get();
  held_->storage_ = std::move(d);
  return Status();
}

Status DurableReceiver::WriteImage(VersionLog* log, const VersionId& v) {
  if (held_->device_ == nullptr) {
    return log->WriteImage(held_->image_.data(), held_->image_.size(), v);
  }
  // A device's image: the layout's files with every tensor downloaded into its place.
  std::vector<uint8_t> image;
  image.reserve(held_->layout_size_);
  for (const CheckpointFile& f : layout_->files()) {
    image.insert(image.end(), f.data, f.data + f.size);
  }
  const std::vector<ReceiverTensor> at = ImageTensors(*layout_, image.data());
  const auto& tensors = held_->device_->tensors();
  for (size_t k = 0; k < tensors.size() && k < at.size(); ++k) {
    if (tensors[k].info.nbytes == 0) continue;
    DCR_RETURN_IF_ERROR(
        held_->device_->device()
            ->Download(at[k].data, tensors[k].data, tensors[k].info.nbytes)
            .WithContext("version log image: tensor '" + tensors[k].info.name + "'"));
  }
  return log->WriteImage(image.data(), image.size(), v);
}

Status DurableReceiver::RecordTargetHeader() {
  if (target_header_.empty()) {
    if (::unlink(header_path_.c_str()) != 0 && errno != ENOENT) {
      return ErrnoError("unlink " + header_path_, errno);
    }
    return Status();
  }
  return WriteFileAtomic(header_path_, target_header_.data(), target_header_.size());
}

StatusOr<std::unique_ptr<DurableReceiver>> DurableReceiver::Open(
    const NodePlan& plan, std::shared_ptr<Device> device, int starts, FaultPoints* faults,
    std::unique_ptr<HeldStorage> carried) {
  if (plan.receiver_base_path.empty()) {
    return InvalidArgumentError("plan.receiver_base_path: required for a delta receiver");
  }
  const uint64_t write_bytes0 = internal::ProcessWriteBytes();
  std::unique_ptr<DurableReceiver> r(new DurableReceiver());
  DCR_ASSIGN_OR_RETURN(r->layout_, Checkpoint::Open(plan.receiver_base_path));
  r->base_number_ = plan.base_version > 0 ? static_cast<uint64_t>(plan.base_version) : 0;
  const uint64_t target_number = plan.version > 0 ? static_cast<uint64_t>(plan.version) : 1;
  const std::string log_dir = !plan.version_log_dir.empty()
                                  ? plan.version_log_dir
                                  : RankFile(plan.state_dir, plan.rank, ".vlog");
  r->header_path_ = StorageHeaderPath(RankFile(plan.state_dir, plan.rank, ".storage"));
  const uint64_t layout_size = ImageSize(*r->layout_);
  VersionLogOptions lo;
  if (faults != nullptr) lo.on_step = [faults](VersionLogStep st) { faults->LogStep(st); };
  if (plan.version_log_image_every > 0) lo.image_every_versions = plan.version_log_image_every;
  const bool restarted = starts > 1;
  const std::string who = "receiver " + std::to_string(plan.rank);

  // 1. The storage this process kept from the version before.
  if (carried != nullptr) {
    HeldStorage* h = carried.get();
    if (h->log_dir_ == log_dir && h->layout_size_ == layout_size &&
        (device == nullptr) == (h->device_ == nullptr) && !h->in_delta() &&
        h->held().number == r->base_number_ && h->log_->committed() == h->held()) {
      carried.release();
      r->held_.reset(h);
      r->carried_ = true;
    }
    carried.reset();  // anything else is freed before the storage is loaded again
  }
  // 2. The version the log committed last: the base, or on a restart the target.
  std::string log_refused;
  if (r->held_ == nullptr && std::filesystem::exists(log_dir + "/log")) {
    RecoveredVersion rec;
    auto log = VersionLog::Open(log_dir, *r->layout_, &rec, lo);
    if (!log.ok()) {
      log_refused = log.status().ToString();
    } else if (rec.version.number == r->base_number_ ||
               (restarted && rec.version.number == target_number)) {
      r->held_.reset(new HeldStorage());
      r->held_->log_ = std::move(*log);
      r->held_->log_dir_ = log_dir;
      r->held_->layout_size_ = layout_size;
      r->restore_s_ = rec.load_s + rec.replay_s;
      Status s = r->StorageFromRecovered(device, &rec);
      if (!s.ok()) return s.WithContext(who);
    } else {
      log_refused =
          "it holds " + rec.version.ToString() + ", not version " + std::to_string(r->base_number_);
    }
  }
  // 3. The base file, which starts a fresh log. Its bytes are held as the base version only
  // when nothing says otherwise: a log that cannot be recovered but names the base version
  // committed with other content (the file is the layout of a log that holds the version, not
  // the version) is an error, and the log is left as it is.
  if (r->held_ == nullptr) {
    const VersionId base{r->base_number_, r->layout_->ContentHash(plan.build_threads)};
    if (!log_refused.empty()) {
      auto named = VersionLog::NamedVersions(log_dir);
      if (named.ok()) {
        for (auto it = named->rbegin(); it != named->rend(); ++it) {
          if (it->number != base.number) continue;
          if (it->hash != base.hash) {
            return DataLossError(who + ": version log " + log_dir + " cannot recover version " +
                                 std::to_string(base.number) + " (" + log_refused + "), and " +
                                 plan.receiver_base_path + " is not that version (content " +
                                 base.hash.ToHex() + ", the log committed it as " +
                                 it->hash.ToHex() + "): refusing to hold other bytes as version " +
                                 std::to_string(base.number) + "; the log is left as it is");
          }
          break;
        }
      }
      std::fprintf(stderr, "%s: version log %s not used (%s): starting it over from %s\n",
                   who.c_str(), log_dir.c_str(), log_refused.c_str(),
                   plan.receiver_base_path.c_str());
    }
    r->held_.reset(new HeldStorage());
    r->held_->log_dir_ = log_dir;
    r->held_->layout_size_ = layout_size;
    std::vector<uint8_t> bytes;
    const uint8_t* image = nullptr;
    if (r->layout_->files().size() == 1) {
      image = r->layout_->files()[0].data;
    } else {
      bytes.reserve(layout_size);
      for (const CheckpointFile& f : r->layout_->files()) {
        bytes.insert(bytes.end(), f.data, f.data + f.size);
      }
      image = bytes.data();
    }
    DCR_ASSIGN_OR_RETURN(r->held_->log_, VersionLog::Create(log_dir, image, layout_size, base, lo));
    if (device == nullptr) {
      if (bytes.empty()) bytes.assign(image, image + layout_size);
      r->held_->image_ = std::move(bytes);
      auto host = std::make_unique<BufferReceiver>(
          ImageTensors(*r->layout_, r->held_->image_.data()), base);
      r->held_->host_ = host.get();
      r->held_->storage_ = std::move(host);
    } else {
      auto d = MakeDeviceReceiver(device, *r->layout_, base.number);
      if (!d.ok()) return d.status().WithContext(who);
      r->held_->device_ = d->get();
      r->held_->storage_ = std::move(*d);
    }
  }
  const VersionId held = r->held_->held();
  // The journal of this version starts at the version the storage holds: no storage survives
  // its process, so a chunk state of an earlier start describes nothing that is there.
  const std::string journal_path = RankFile(plan.state_dir, plan.rank, ".journal");
  ::unlink(journal_path.c_str());
  JournalOptions jo;
  jo.group_commit = true;
  DCR_ASSIGN_OR_RETURN(r->journal_, ReceiverJournal::Open(journal_path, jo));
  DCR_RETURN_IF_ERROR(r->journal_->RecordCommitted(held));
  r->restart_.storage_lost = restarted;
  r->restart_.target_committed = held.number != r->base_number_;
  r->log_ = r->held_->log_.get();
  r->stats_at_open_ = r->log_->stats();
  // Storage, version log, durability hooks, [fault points], journal, [fault points], header
  // hooks: the fault points' layers only where a fault build installed them (fault_points.h).
  r->logging_ = std::make_unique<VersionLoggingReceiver>(
      r->held_->storage_.get(), r->held_->log_.get(),
      [p = r.get()](VersionLog* log, const VersionId& v) { return p->WriteImage(log, v); });
  r->hooks_ = std::make_unique<StorageHooks>(r->logging_.get(), &r->written_);
  Receiver* under_journal = r->hooks_.get();
  if (faults != nullptr) {
    r->fault_inside_ = faults->ChunkLayer(under_journal, true);
    under_journal = r->fault_inside_.get();
  }
  r->journaled_ = std::make_unique<JournaledReceiver>(under_journal, r->journal_.get());
  Receiver* over_journal = r->journaled_.get();
  if (faults != nullptr) {
    r->fault_outside_ = faults->ChunkLayer(over_journal, false);
    over_journal = r->fault_outside_.get();
  }
  r->outer_ = std::make_unique<HeaderHooks>(over_journal, &r->inventory_, &r->target_header_,
                                            [p = r.get()] { return p->RecordTargetHeader(); });
  r->write_bytes0_ = write_bytes0;
  return r;
}

Receiver* DurableReceiver::receiver() { return outer_.get(); }

std::unique_ptr<HeldStorage> DurableReceiver::TakeStorage() {
  if (held_ == nullptr || written_.load() || held_->in_delta()) return nullptr;
  if (held_->log_->committed() != held_->held()) return nullptr;
  stats_taken_ = log_->stats();
  log_ = nullptr;
  return std::move(held_);
}

std::unique_ptr<Receiver> DurableReceiver::Handle() {
  return std::make_unique<HeaderHooks>(outer_.get(), nullptr, nullptr, nullptr);
}

Status DurableReceiver::ReloadCommitted() {
  if (written_.exchange(false)) {
    // Chunks of the abandoned delta reached the storage: the committed version recovered again.
    logging_->Abort();  // the storage's delta and the log's entries of it
    RecoveredVersion rec;
    DCR_RETURN_IF_ERROR(VersionLog::Recover(held_->log_dir_, *layout_, &rec));
    if (held_->device_ == nullptr) {
      std::memcpy(held_->image_.data(), rec.bytes.data(),
                  std::min(rec.bytes.size(), held_->image_.size()));
    } else {
      const std::vector<ReceiverTensor> at = ImageTensors(*layout_, rec.bytes.data());
      const auto& tensors = held_->device_->tensors();
      for (size_t k = 0; k < tensors.size() && k < at.size(); ++k) {
        DCR_RETURN_IF_ERROR(held_->device_->device()
                                ->Upload(tensors[k].data, at[k].data, tensors[k].info.nbytes)
                                .WithContext("reloading tensor '" + tensors[k].info.name + "'"));
      }
    }
  }
  return journal_->AbandonDelta();
}

StatusOr<std::vector<uint8_t>> DurableReceiver::OverwriteForm(const uint8_t* record,
                                                              size_t size) const {
  std::lock_guard<std::mutex> l(base_mu_);
  if (base_ == nullptr) {
    if (layout_->files().size() != 1) {
      return UnimplementedError("overwrite form: the base of a sharded layout is not kept");
    }
    RecoveredVersion rec;
    DCR_RETURN_IF_ERROR(VersionLog::Recover(held_->log_dir_, *layout_, &rec));
    if (rec.version.number != base_number_) {
      return FailedPreconditionError("overwrite form: the version log holds " +
                                     rec.version.ToString() + ", not the base v" +
                                     std::to_string(base_number_));
    }
    DCR_ASSIGN_OR_RETURN(base_, Checkpoint::FromBytes(std::move(rec.bytes)));
  }
  return OverwriteChunkFromRelative(record, size, inventory_, *base_);
}

bool DurableReceiver::TargetCommittedNow() const {
  return held_ != nullptr && held_->log_->committed().number != base_number_;
}

bool DurableReceiver::Doubtful(uint64_t chunk_id) const {
  return journal_->Lookup(chunk_id, nullptr) == JournalChunkState::kDoubtful;
}

JournaledApplyStats DurableReceiver::stats() const { return journaled_->stats(); }

uint64_t DurableReceiver::write_bytes() const {
  const uint64_t now = internal::ProcessWriteBytes();
  return now > write_bytes0_ ? now - write_bytes0_ : 0;
}

uint64_t DurableReceiver::log_bytes() const {
  const VersionLogStats now = log_ != nullptr ? log_->stats() : stats_taken_;
  return now.log_bytes - stats_at_open_.log_bytes;
}

uint64_t DurableReceiver::image_bytes() const {
  const VersionLogStats now = log_ != nullptr ? log_->stats() : stats_taken_;
  return now.image_bytes - stats_at_open_.image_bytes;
}

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
  cv_.wait(
      l, [&] { return queue_.empty() && !busy_ && !(have_trailer_ && put_ == trailer_.first.id); });
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
