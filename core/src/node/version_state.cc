// Durable state of a long-lived node across versions (see version_state.h).
#include "node/version_state.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "dcr/checkpoint.h"
#include "dcr/commitment.h"
#include "dcr/hash.h"
#include "dcr/signing.h"
#include "dcr/status_macros.h"
#include "internal/atomic_file.h"
#include "node/node_trust.h"
#include "node/state_dir.h"
#include "receivers/version_log.h"

namespace dcr::internal {

namespace {

std::string RankFile(const std::string& dir, int rank, const char* suffix) {
  return dir + "/rank-" + std::to_string(rank) + suffix;
}

// A receiver that joined without a base: the layout of its version log (Hold).
std::string LayoutLinkPath(const std::string& state_dir, int rank) {
  return RankFile(state_dir, rank, ".layout.safetensors");
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open " + dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoError("fsync " + dir, err);
  return Status();
}

std::optional<nlohmann::json> ReadJson(const std::string& path) {
  auto bytes = ReadFile(path);
  if (!bytes.ok()) return std::nullopt;
  nlohmann::json j = nlohmann::json::parse(bytes->begin(), bytes->end(), nullptr, false);
  if (!j.is_object()) return std::nullopt;
  return j;
}

Status WriteJson(const std::string& path, const nlohmann::json& j) {
  const std::string text = j.dump() + "\n";
  return WriteFileAtomic(path, text.data(), text.size());
}

// Gives the single-file storage `storage` (a base-layout image holding the target's tensors)
// the target header recorded beside it (StorageHeaderPath), if any: in place, when the header
// has the base header's length and every tensor keeps its offset (returns false); otherwise the
// target checkpoint is written whole at `out`, each tensor's bytes taken from the storage
// (returns true). No record: nothing done (false).
StatusOr<bool> GiveTargetHeader(const std::string& storage, const std::string& out) {
  const std::string record = StorageHeaderPath(storage);
  if (!Exists(record)) return false;
  DCR_ASSIGN_OR_RETURN(const std::vector<uint8_t> text, ReadFile(record));
  const std::string json(text.begin(), text.end());
  const nlohmann::json h = nlohmann::json::parse(json, nullptr, false);
  if (h.is_discarded() || !h.is_object()) {
    return DataLossError(record + ": not a safetensors JSON header");
  }
  DCR_ASSIGN_OR_RETURN(auto image, Checkpoint::Open(storage));
  const CheckpointFile& file = image->files()[0];
  const uint64_t data_start = 8 + json.size();
  struct Placed {
    const uint8_t* from;
    uint64_t at;
    uint64_t size;
  };
  std::vector<Placed> placed;
  bool in_place = file.data_section_offset == data_start;
  uint64_t end_of_file = data_start;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const nlohmann::json* offsets = it.value().is_object() && it.value().contains("data_offsets")
                                        ? &it.value()["data_offsets"]
                                        : nullptr;
    if (offsets == nullptr || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned() ||
        (*offsets)[1].get<uint64_t>() < (*offsets)[0].get<uint64_t>()) {
      return DataLossError(record + ": tensor '" + it.key() + "' has no valid data_offsets");
    }
    const uint64_t begin = (*offsets)[0].get<uint64_t>(), end = (*offsets)[1].get<uint64_t>();
    const TensorInfo* t = image->Find(it.key());
    if (t == nullptr || t->nbytes != end - begin) {
      return FailedPreconditionError(
          "receiver storage " + storage + ": the target's tensor '" + it.key() + "' (" +
          std::to_string(end - begin) + " bytes) " +
          (t == nullptr ? "is not in it" : "has " + std::to_string(t->nbytes) + " bytes there"));
    }
    placed.push_back({image->data(*t), data_start + begin, end - begin});
    if (file.data_section_offset + t->offset != data_start + begin) in_place = false;
    end_of_file = std::max(end_of_file, data_start + end);
  }
  if (placed.size() != image->tensors().size() || end_of_file != file.size) in_place = false;
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(json.size() >> (8 * i));
  if (in_place) {
    const int fd = ::open(storage.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoError("receiver storage " + storage, errno);
    const bool wrote =
        ::pwrite(fd, length, 8, 0) == 8 &&
        ::pwrite(fd, json.data(), json.size(), 8) == static_cast<ssize_t>(json.size()) &&
        ::fsync(fd) == 0;
    const int err = errno;
    ::close(fd);
    if (!wrote) return ErrnoError("receiver storage " + storage + ": header", err);
    return false;
  }
  DCR_ASSIGN_OR_RETURN(auto f, AtomicFile::Create(out));
  DCR_RETURN_IF_ERROR(f->Reserve(end_of_file));
  DCR_RETURN_IF_ERROR(f->PWrite(length, 8, 0));
  DCR_RETURN_IF_ERROR(f->PWrite(json.data(), json.size(), 8));
  for (const Placed& p : placed) DCR_RETURN_IF_ERROR(f->PWrite(p.from, p.size, p.at));
  DCR_RETURN_IF_ERROR(f->Commit());
  return true;
}

}  // namespace

std::string VersionStateDir(const std::string& state_dir, uint64_t version) {
  return state_dir + "/v" + std::to_string(version);
}

uint64_t VersionStarted(const std::string& state_dir, int rank) {
  uint64_t best = 0;
  DIR* d = ::opendir(state_dir.c_str());
  if (d == nullptr) return 0;
  while (const dirent* e = ::readdir(d)) {
    const char* name = e->d_name;
    if (name[0] != 'v' || name[1] < '0' || name[1] > '9') continue;
    char* end = nullptr;
    const uint64_t k = std::strtoull(name + 1, &end, 10);
    if (end == nullptr || *end != '\0' || k <= best) continue;
    if (Exists(RankFile(state_dir + "/" + name, rank, ".starts"))) best = k;
  }
  ::closedir(d);
  return best;
}

std::optional<VersionDone> ReadVersionDone(const std::string& state_dir, uint64_t version,
                                           int rank) {
  auto j = ReadJson(RankFile(VersionStateDir(state_dir, version), rank, ".done"));
  if (!j) return std::nullopt;
  const auto* n = j->contains("version") ? &(*j)["version"] : nullptr;
  if (n == nullptr || !n->is_number_unsigned() || n->get<uint64_t>() != version)
    return std::nullopt;
  VersionDone d;
  d.version = version;
  if (j->contains("checkpoint") && (*j)["checkpoint"].is_string()) {
    d.checkpoint = (*j)["checkpoint"].get<std::string>();
  }
  return d;
}

Status WriteVersionDone(const std::string& state_dir, int rank, const VersionDone& done) {
  nlohmann::json j;
  j["version"] = done.version;
  if (!done.checkpoint.empty()) j["checkpoint"] = done.checkpoint;
  return WriteJson(RankFile(VersionStateDir(state_dir, done.version), rank, ".done"), j);
}

StatusOr<std::string> CommitStorageAsCheckpoint(const std::string& state_dir, uint64_t version,
                                                int rank, const std::string& layout_path) {
  const std::string dir = VersionStateDir(state_dir, version);
  const std::string storage = RankFile(dir, rank, ".storage");
  DCR_ASSIGN_OR_RETURN(auto layout, Checkpoint::Open(layout_path));
  uint64_t total = 0;
  for (const CheckpointFile& f : layout->files()) total += f.size;
  if (!layout->sharded()) {
    // The storage of a single-file base is that file's image: it becomes the checkpoint.
    const std::string out = RankFile(dir, rank, ".committed.safetensors");
    if (!Exists(storage) && Exists(out)) return out;
    struct stat st;
    if (::stat(storage.c_str(), &st) != 0) return ErrnoError("receiver storage " + storage, errno);
    if (static_cast<uint64_t>(st.st_size) != total) {
      return FailedPreconditionError("receiver storage " + storage + ": " +
                                     std::to_string(st.st_size) + " bytes, its base has " +
                                     std::to_string(total));
    }
    // The storage has the base's header; the target's, when recorded, replaces it. Written in
    // place, the storage then moves to `out`; rewritten, `out` is written whole first. Either
    // way the record goes last, so a restart in between does the same again.
    DCR_ASSIGN_OR_RETURN(const bool rewritten, GiveTargetHeader(storage, out));
    if (rewritten) {
      if (::unlink(storage.c_str()) != 0) return ErrnoError("unlink " + storage, errno);
    } else if (::rename(storage.c_str(), out.c_str()) != 0) {
      return ErrnoError("rename " + storage, errno);
    }
    ::unlink((storage + ".meta").c_str());
    DCR_RETURN_IF_ERROR(SyncDir(dir));
    ::unlink(StorageHeaderPath(storage).c_str());
    return out;
  }
  // A sharded base: its files written out of the storage, in a directory renamed into place.
  const std::string out = RankFile(dir, rank, ".committed");
  if (Exists(out)) return out;
  DCR_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFile(storage));
  if (bytes.size() != total) {
    return FailedPreconditionError("receiver storage " + storage + ": " +
                                   std::to_string(bytes.size()) + " bytes, its base has " +
                                   std::to_string(total));
  }
  const std::string tmp = out + ".tmp";
  // A partial directory of an earlier attempt is rewritten file by file.
  if (::mkdir(tmp.c_str(), 0700) != 0 && errno != EEXIST) return ErrnoError("mkdir " + tmp, errno);
  uint64_t off = 0;
  for (const CheckpointFile& f : layout->files()) {
    DCR_RETURN_IF_ERROR(WriteFileAtomic(tmp + "/" + f.name, bytes.data() + off, f.size));
    off += f.size;
  }
  const std::string index = layout->path() + "/" + kIndexFileName;
  if (Exists(index)) {
    DCR_ASSIGN_OR_RETURN(std::vector<uint8_t> ix, ReadFile(index));
    DCR_RETURN_IF_ERROR(WriteFileAtomic(tmp + "/" + kIndexFileName, ix.data(), ix.size()));
  }
  DCR_RETURN_IF_ERROR(SyncDir(tmp));
  if (::rename(tmp.c_str(), out.c_str()) != 0) return ErrnoError("rename " + tmp, errno);
  DCR_RETURN_IF_ERROR(SyncDir(dir));
  ::unlink(storage.c_str());
  ::unlink((storage + ".meta").c_str());
  return out;
}

StatusOr<std::optional<JointCommitState>> ReadJointCommitState(const std::string& state_dir) {
  const std::string path = state_dir + "/rank-0.commit";
  if (!Exists(path)) return std::optional<JointCommitState>();
  auto j = ReadJson(path);
  auto u64 = [&](const nlohmann::json& o, const char* k, uint64_t* out) {
    if (!o.is_object() || !o.contains(k) || !o[k].is_number_unsigned()) return false;
    *out = o[k].get<uint64_t>();
    return true;
  };
  JointCommitState s;
  bool ok = j.has_value() && u64(*j, "done", &s.done) && j->contains("baseline") &&
            j->contains("live") && (*j)["live"].is_array();
  if (ok) {
    const nlohmann::json& b = (*j)["baseline"];
    ok = u64(b, "number", &s.baseline.number) && u64(b, "hash_lo", &s.baseline.hash.lo) &&
         u64(b, "hash_hi", &s.baseline.hash.hi);
    for (const auto& r : (*j)["live"]) {
      if (!r.is_number_integer())
        ok = false;
      else
        s.live.push_back(r.get<int>());
    }
    if (ok && j->contains("checkpoints")) {
      const nlohmann::json& c = (*j)["checkpoints"];
      ok = c.is_object();
      for (auto it = c.begin(); ok && it != c.end(); ++it) {
        char* end = nullptr;
        const unsigned long long k = std::strtoull(it.key().c_str(), &end, 10);
        ok = !it.key().empty() && *end == '\0' && it.value().is_string();
        if (ok) s.checkpoints[k] = it.value().get<std::string>();
      }
    }
  }
  if (!ok) return DataLossError(path + ": not a joint commit state; the sender cannot resume");
  return std::optional<JointCommitState>(std::move(s));
}

Status WriteJointCommitState(const std::string& state_dir, const JointCommitState& s) {
  nlohmann::json j;
  j["done"] = s.done;
  j["baseline"] = {{"number", s.baseline.number},
                   {"hash_lo", s.baseline.hash.lo},
                   {"hash_hi", s.baseline.hash.hi}};
  j["live"] = s.live;
  if (!s.checkpoints.empty()) {
    nlohmann::json c = nlohmann::json::object();
    for (const auto& [k, path] : s.checkpoints) c[std::to_string(k)] = path;
    j["checkpoints"] = c;
  }
  return WriteJson(state_dir + "/rank-0.commit", j);
}

StatusOr<std::unique_ptr<VersionRecovery>> VersionRecovery::Open(const NodePlan& plan) {
  std::unique_ptr<VersionRecovery> r(new VersionRecovery());
  r->plan_ = plan;
  r->plan_.versions.clear();
  DCR_RETURN_IF_ERROR(OpenStateDir(plan.state_dir));
  const bool held_exists = Exists(RankFile(plan.state_dir, plan.rank, ".held"));
  if (auto held = ReadJson(RankFile(plan.state_dir, plan.rank, ".held"))) {
    if (held->contains("version") && (*held)["version"].is_number_unsigned()) {
      r->finished_before_ = (*held)["version"].get<uint64_t>();
    }
  }
  // A signed delta receiver keeps its version floor here, beside what it resumes from.
  r->state_floor_ = plan.rank != 0 && plan.method == "delta" && !plan.trust_key.empty();
  if (r->state_floor_) {
    const bool fresh = !held_exists && VersionStarted(plan.state_dir, plan.rank) == 0;
    DCR_RETURN_IF_ERROR(OpenStateFloor(plan.state_dir, plan.rank, fresh, plan.run_id));
  }
  for (const NodeVersion& v : plan.versions) {
    const std::string dir = VersionStateDir(plan.state_dir, v.version);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
      return ErrnoError("mkdir " + dir, errno);
  }
  for (const NodeVersion& v : plan.versions) r->versions_.push_back(v.version);
  r->held_path_ = plan.receiver_base_path;
  r->layout_path_ = plan.receiver_base_path;
  if (r->layout_path_.empty() && Exists(LayoutLinkPath(plan.state_dir, plan.rank))) {
    r->layout_path_ = LayoutLinkPath(plan.state_dir, plan.rank);  // a joiner's, kept by Hold
  }
  r->log_dir_ = !plan.version_log_dir.empty() ? plan.version_log_dir
                                              : RankFile(plan.state_dir, plan.rank, ".vlog");
  if (plan.rank == 0) {
    DCR_ASSIGN_OR_RETURN(r->commit_, ReadJointCommitState(plan.state_dir));
  }
  return r;
}

Status VersionRecovery::AddVersion(uint64_t version) {
  const std::string dir = VersionStateDir(plan_.state_dir, version);
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return ErrnoError("mkdir " + dir, errno);
  versions_.push_back(version);
  return Status();
}

Status VersionRecovery::CheckHeld() {
  if (held_checked_ || held_number_ == 0) return Status();
  if (plan_.rank == 0 || plan_.method != "delta" || plan_.trust_key.empty()) return Status();
  // The held version's tensors: its checkpoint file, or recovered from the version log.
  std::unique_ptr<Checkpoint> ckpt;
  RecoveredVersion rec;
  std::vector<TensorView> views;
  uint64_t number = held_number_;
  std::string what;
  if (!held_path_.empty()) {
    what = held_path_;
    DCR_ASSIGN_OR_RETURN(ckpt, Checkpoint::Open(held_path_));
    for (const TensorInfo& t : ckpt->tensors()) {
      views.push_back(TensorView{t.name, t.dtype_name, t.shape, ckpt->data(t), t.nbytes});
    }
  } else {
    what = "in the version log " + log_dir_;
    DCR_ASSIGN_OR_RETURN(ckpt, Checkpoint::Open(layout_path_));
    DCR_RETURN_IF_ERROR(
        VersionLog::Recover(log_dir_, *ckpt, &rec)
            .WithContext("rank " + std::to_string(plan_.rank) + ": the held version"));
    // A version committed after the last one recorded done (its process ended in between) is
    // proven as well: it is what the log holds.
    number = rec.version.number;
    for (const ReceiverTensor& t : ImageTensors(*ckpt, rec.bytes.data())) {
      views.push_back(
          TensorView{t.info.name, t.info.dtype_name, t.info.shape, t.data, t.info.nbytes});
    }
  }
  const std::string who = "rank " + std::to_string(plan_.rank) + ": the held checkpoint " + what +
                          " of version " + std::to_string(number);
  DCR_ASSIGN_OR_RETURN(std::shared_ptr<const TrustKey> key, TrustKey::Load(plan_.trust_key));
  NodePlan at = plan_;
  at.state_dir = VersionStateDir(plan_.state_dir, number);
  const std::string path = SignedStatePath(at);
  // The trust layer writes a version's signed state, durably, before the version log's commit
  // marker: a version the log holds has one, whenever its process ended.
  auto st = ReadSignedState(path, key, plan_.run_id);
  if (!st.ok() && st.status().code() == StatusCode::kNotFound) {
    return FailedPreconditionError(who +
                                   " cannot be proven by the trainer's signature: no "
                                   "signed state " +
                                   path);
  }
  if (!st.ok()) {
    return st.status().WithContext(who + " cannot be proven by the trainer's signature");
  }
  if (st->target_version != number) {
    return FailedPreconditionError(who + ": its signed state is of version " +
                                   std::to_string(st->target_version));
  }
  DCR_RETURN_IF_ERROR(
      CheckCommitment(views, *st->commitment.root, &st->commitment.leaves, plan_.build_threads)
          .WithContext(who + " refused before it is served or reported"));
  held_checked_ = true;
  return Status();
}

bool VersionRecovery::Finished(const NodeVersion& v) {
  if (plan_.rank == 0 && commit_.has_value() && commit_->done >= v.version) return true;
  const std::optional<VersionDone> d = ReadVersionDone(plan_.state_dir, v.version, plan_.rank);
  if (!d) return v.version < finished_before_;  // its files collected after a later version
  if (d->checkpoint == log_dir_ && (!held_path_.empty() || v.version != held_number_)) {
    held_path_.clear();  // the version is held in the log
    held_number_ = v.version;
    held_checked_ = false;
  } else if (!d->checkpoint.empty() && d->checkpoint != log_dir_ &&
             (d->checkpoint != held_path_ || v.version != held_number_)) {
    held_path_ = d->checkpoint;
    held_number_ = v.version;
    held_checked_ = false;
  }
  return true;
}

void VersionRecovery::Prepare(const NodeVersion& v, size_t index, NodePlan* p) const {
  p->state_dir = VersionStateDir(plan_.state_dir, v.version);
  if (state_floor_) p->version_floor_path = StateFloorPath(plan_.state_dir, plan_.rank);
  if (plan_.rank != 0 && plan_.method == "delta") {
    // The held version's checkpoint file when it has one (the log is started over from it when
    // it does not hold that version), else the layout: the log holds the version.
    p->receiver_base_path = held_path_.empty() ? layout_path_ : held_path_;
    p->base_version = static_cast<int64_t>(held_number_);
    p->version_log_dir = log_dir_;
  }
  const bool faulted = plan_.fault_version == 0 ? index == 0 : v.version == plan_.fault_version;
  if (!faulted) {
    p->fault_kill_chunk = -1;
    p->fault_kill_inside = false;
    p->fault_kill_blob = -1;
    p->fault_kill_log_step.clear();
  }
}

Status VersionRecovery::Done(const NodePlan& p) {
  VersionDone d;
  d.version = p.version;
  const bool receiver = plan_.rank != 0 && plan_.method == "delta";
  if (receiver) {
    d.checkpoint = log_dir_;  // held in the version log
    if (CommittedFilesAsked()) {
      DCR_ASSIGN_OR_RETURN(d.checkpoint, MaterializeHeld(p.version));
    }
  }
  DCR_RETURN_IF_ERROR(WriteVersionDone(plan_.state_dir, plan_.rank, d));
  if (receiver) Hold(d.version, d.checkpoint == log_dir_ ? std::string() : d.checkpoint);
  DCR_ASSIGN_OR_RETURN(const uint64_t removed, CollectBefore(d.version));
  collected_bytes_ += removed;
  return Status();
}

Status VersionRecovery::Adopt(uint64_t version, const std::string& image) {
  DCR_RETURN_IF_ERROR(WriteVersionDone(plan_.state_dir, plan_.rank, VersionDone{version, image}));
  Hold(version, image);
  DCR_ASSIGN_OR_RETURN(const uint64_t removed, CollectBefore(version));
  collected_bytes_ += removed;
  return Status();
}

StatusOr<uint64_t> VersionRecovery::CollectBefore(uint64_t version) {
  nlohmann::json j;
  j["version"] = version;
  DCR_RETURN_IF_ERROR(WriteJson(RankFile(plan_.state_dir, plan_.rank, ".held"), j));
  // Only after the record: a restart between the two finds the versions finished either way.
  const std::string mine = "rank-" + std::to_string(plan_.rank) + ".";
  uint64_t removed = 0;
  for (uint64_t k : versions_) {
    if (k >= version) continue;
    const std::string dir = VersionStateDir(plan_.state_dir, k);
    std::error_code ec;
    std::vector<std::filesystem::path> gone;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      if (e.path().filename().string().rfind(mine, 0) == 0) gone.push_back(e.path());
    }
    for (const auto& path : gone) {
      if (path.string() == layout_path_) continue;  // the version log's layout
      std::error_code size_ec;
      if (std::filesystem::is_regular_file(path, size_ec)) {
        const auto n = std::filesystem::file_size(path, size_ec);
        if (!size_ec) removed += n;
      } else {
        for (const auto& f : std::filesystem::recursive_directory_iterator(path, size_ec)) {
          std::error_code fe;
          if (f.is_regular_file(fe)) removed += f.file_size(fe);
        }
      }
      std::filesystem::remove_all(path, ec);
    }
    // The directory stays: a rank behind this one (a region receiver catching up) may still
    // work in it.
  }
  // Collected once: a rank's files of a version it has moved past do not come back.
  versions_.erase(std::remove_if(versions_.begin(), versions_.end(),
                                 [version](uint64_t k) { return k < version; }),
                  versions_.end());
  return removed;
}

void VersionRecovery::Hold(uint64_t version, const std::string& checkpoint) {
  // The committed checkpoint of the version before is no longer any version's base.
  const std::string old = held_path_;
  held_path_ = checkpoint;
  // A receiver that joined without a base takes the layout of its version log from the first
  // checkpoint it holds: a link to it beside the versions' directories (so that collecting
  // them keeps it), or that checkpoint itself for a sharded one (kept by CollectBefore).
  if (layout_path_.empty() && !checkpoint.empty()) {
    const std::string link = LayoutLinkPath(plan_.state_dir, plan_.rank);
    ::unlink(link.c_str());
    layout_path_ =
        !std::filesystem::is_directory(checkpoint) && ::link(checkpoint.c_str(), link.c_str()) == 0
            ? link
            : checkpoint;
  }
  held_number_ = version;
  held_checked_ = true;  // committed (or adopted) by this process, after its checks
  if (!old.empty() && old != checkpoint && old != layout_path_ &&
      old.rfind(plan_.state_dir + "/", 0) == 0) {
    std::error_code ec;
    std::filesystem::remove_all(old, ec);
  }
}

bool CommittedFilesAsked() {
  const char* v = std::getenv(kCommittedFilesEnv);
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

StatusOr<std::string> VersionRecovery::MaterializeHeld(uint64_t version) {
  const std::string out =
      RankFile(VersionStateDir(plan_.state_dir, version), plan_.rank, ".committed");
  if (Exists(out + ".safetensors")) return out + ".safetensors";
  if (Exists(out) && std::filesystem::is_directory(out)) return out;
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> layout, Checkpoint::Open(layout_path_));
  RecoveredVersion rec;
  DCR_RETURN_IF_ERROR(VersionLog::Recover(log_dir_, *layout, &rec)
                          .WithContext("rank " + std::to_string(plan_.rank) +
                                       ": the committed checkpoint of version " +
                                       std::to_string(version)));
  if (rec.version.number != version) {
    return FailedPreconditionError("rank " + std::to_string(plan_.rank) +
                                   ": the committed checkpoint of version " +
                                   std::to_string(version) + ": the version log " + log_dir_ +
                                   " holds " + rec.version.ToString());
  }
  const std::string storage =
      RankFile(VersionStateDir(plan_.state_dir, version), plan_.rank, ".storage");
  DCR_RETURN_IF_ERROR(WriteFileAtomic(storage, rec.bytes.data(), rec.bytes.size()));
  return CommitStorageAsCheckpoint(plan_.state_dir, version, plan_.rank, layout_path_);
}

StatusOr<std::string> VersionRecovery::HeldPath() {
  if (!held_path_.empty()) return held_path_;
  DCR_ASSIGN_OR_RETURN(std::string path, MaterializeHeld(held_number_));
  const bool checked = held_checked_;
  Hold(held_number_, path);
  held_checked_ = checked;
  return path;
}

Status VersionRecovery::SaveCommit(uint64_t done, const VersionId& baseline,
                                   const std::vector<int>& live,
                                   const std::map<uint64_t, std::string>& checkpoints) {
  JointCommitState s{done, baseline, live, {}};
  for (auto it = checkpoints.lower_bound(baseline.number); it != checkpoints.end(); ++it) {
    if (it->first > 0 && it->first <= done) s.checkpoints.insert(*it);
  }
  DCR_RETURN_IF_ERROR(WriteJointCommitState(plan_.state_dir, s));
  commit_ = s;
  return Status();
}

namespace {

// Copies the file or directory `from` to `to` (absent), byte for byte.
Status CopyTree(const std::string& from, const std::string& to) {
  std::error_code ec;
  if (std::filesystem::is_directory(from, ec)) {
    std::filesystem::copy(from, to, std::filesystem::copy_options::recursive, ec);
  } else {
    std::filesystem::copy_file(from, to, ec);
  }
  if (ec) return InternalError("copy " + from + " to " + to + ": " + ec.message());
  return Status();
}

}  // namespace

StatusOr<ExportedVersion> ExportHeldVersion(const NodePlan& plan, const std::string& out,
                                            int threads, bool allow_unsigned) {
  const std::string who = "rank " + std::to_string(plan.rank);
  if (plan.rank == 0 || plan.method != "delta") {
    return InvalidArgumentError(who + ": export takes a delta receiver's held version (rank > 0)");
  }
  if (plan.state_dir.empty()) {
    return InvalidArgumentError(who + ": export needs the node's --state (its plan has none)");
  }
  if (out.empty()) return InvalidArgumentError("export: no output path");
  struct stat st;
  if (::stat(plan.state_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return NotFoundError(who + ": no node state " + plan.state_dir);
  }
  std::string layout = plan.receiver_base_path;
  if (layout.empty() && Exists(LayoutLinkPath(plan.state_dir, plan.rank))) {
    layout = LayoutLinkPath(plan.state_dir, plan.rank);
  }
  const std::string log_dir = !plan.version_log_dir.empty()
                                  ? plan.version_log_dir
                                  : RankFile(plan.state_dir, plan.rank, ".vlog");
  uint64_t held = 0;
  if (auto j = ReadJson(RankFile(plan.state_dir, plan.rank, ".held"))) {
    if (j->contains("version") && (*j)["version"].is_number_unsigned()) {
      held = (*j)["version"].get<uint64_t>();
    }
  }
  // The held version, as the node serves it: the checkpoint file its done record names (an
  // adopted full frame, a committed file made for the version), unless its version log
  // committed a later version since; else the version log's.
  ExportedVersion e;
  std::optional<RecoveredVersion> rec;
  if (!layout.empty() && Exists(log_dir)) {
    DCR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> layout_ckpt, Checkpoint::Open(layout));
    rec.emplace();
    DCR_RETURN_IF_ERROR(VersionLog::Recover(log_dir, *layout_ckpt, &*rec)
                            .WithContext(who + ": the version log " + log_dir));
    if (rec->version.number < held || rec->version.number == 0) rec.reset();
  }
  const std::optional<VersionDone> d =
      held == 0 ? std::nullopt : ReadVersionDone(plan.state_dir, held, plan.rank);
  std::string file;
  if (d && !d->checkpoint.empty() && d->checkpoint != log_dir && Exists(d->checkpoint) &&
      (!rec || rec->version.number == held)) {
    e.version = held;
    file = d->checkpoint;
    e.source = "checkpoint " + file;
  } else if (rec) {
    e.version = rec->version.number;
    e.source = "version log " + log_dir;
  } else {
    return FailedPreconditionError(who + ": the state " + plan.state_dir +
                                   " holds no committed version to export");
  }
  const std::string what = who + ": version " + std::to_string(e.version);
  // Nothing is written before the version is known to be provable.
  std::optional<SignedState> signed_state;
  std::optional<Hash128> recorded_hash;
  if (plan.trust_key.empty()) {
    if (!allow_unsigned) {
      return FailedPreconditionError(
          what +
          ": the node's plan has no trust key (an unsigned deployment): there is no "
          "signed commitment to prove the exported bytes against, so nothing is written "
          "(an unsigned export checks the content hash its version log recorded instead)");
    }
    if (!rec || rec->version.number != e.version) {
      return FailedPreconditionError(what + " is held as " + file +
                                     ", whose version log records no content hash of it: an "
                                     "unsigned export has nothing to check it against, so "
                                     "nothing is written");
    }
    recorded_hash = rec->version.hash;
  } else {
    DCR_ASSIGN_OR_RETURN(std::shared_ptr<const TrustKey> key, TrustKey::Load(plan.trust_key));
    NodePlan at = plan;
    at.state_dir = VersionStateDir(plan.state_dir, e.version);
    const std::string signed_path = SignedStatePath(at);
    auto st = ReadSignedState(signed_path, key, plan.run_id);
    if (!st.ok()) {
      return st.status().WithContext(what + ": its signed state " + signed_path +
                                     " (nothing written)");
    }
    if (st->target_version != e.version) {
      return FailedPreconditionError(what + ": its signed state " + signed_path +
                                     " is of version " + std::to_string(st->target_version) +
                                     " (nothing written)");
    }
    signed_state = std::move(*st);
  }

  // A private directory beside `out` (same file system: the rename is atomic), removed at the end
  // whatever happens.
  const std::filesystem::path outp(out);
  const std::string parent =
      outp.parent_path().empty() ? std::string(".") : outp.parent_path().string();
  std::string tmpl = parent + "/." + outp.filename().string() + ".export-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return ErrnoError("mkdtemp in " + parent, errno);
  const std::string tmp = tmpl;
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{tmp};
  std::string made;
  if (file.empty()) {
    // The committed checkpoint as the node makes it, in a state of the export's own: the
    // recovered storage and the target header the receiver recorded at the version's Begin.
    const std::string vdir = VersionStateDir(tmp, e.version);
    if (::mkdir(vdir.c_str(), 0700) != 0) return ErrnoError("mkdir " + vdir, errno);
    const std::string storage = RankFile(vdir, plan.rank, ".storage");
    DCR_RETURN_IF_ERROR(WriteFileAtomic(storage, rec->bytes.data(), rec->bytes.size()));
    rec.reset();  // the image is on disk now
    const std::string header = StorageHeaderPath(
        RankFile(VersionStateDir(plan.state_dir, e.version), plan.rank, ".storage"));
    if (Exists(header)) {
      DCR_ASSIGN_OR_RETURN(std::vector<uint8_t> h, ReadFile(header));
      DCR_RETURN_IF_ERROR(WriteFileAtomic(StorageHeaderPath(storage), h.data(), h.size()));
    }
    DCR_ASSIGN_OR_RETURN(made, CommitStorageAsCheckpoint(tmp, e.version, plan.rank, layout));
  } else {
    made = tmp + "/" + outp.filename().string();
    DCR_RETURN_IF_ERROR(CopyTree(file, made));
  }
  // Proven against the trainer's signature before it is put at `out`.
  {
    DCR_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(made));
    std::vector<TensorView> views;
    for (const TensorInfo& t : ckpt->tensors()) {
      views.push_back(TensorView{t.name, t.dtype_name, t.shape, ckpt->data(t), t.nbytes});
    }
    if (signed_state) {
      DCR_RETURN_IF_ERROR(CheckCommitment(views, *signed_state->commitment.root,
                                          &signed_state->commitment.leaves, threads)
                              .WithContext(what + " (" + e.source +
                                           ") is not what the trainer signed; nothing written"));
      e.commitment = CommitmentHex(*signed_state->commitment.root);
    } else {
      const Hash128 h = ContentHashOf(views, threads);
      if (h != *recorded_hash) {
        return FailedPreconditionError(what + " (" + e.source + "): content hash " + h.ToHex() +
                                       ", its version log recorded " + recorded_hash->ToHex() +
                                       "; nothing written");
      }
      e.content_hash = h.ToHex();
    }
  }
  if (::rename(made.c_str(), out.c_str()) != 0) {
    return ErrnoError("rename " + made + " to " + out, errno);
  }
  DCR_RETURN_IF_ERROR(SyncDir(parent));
  e.path = out;
  return e;
}

}  // namespace dcr::internal
