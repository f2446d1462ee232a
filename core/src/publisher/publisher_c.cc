// dcr/publisher_c.h: the long-lived sender (RunNodeVersions) on its own thread, fed version by
// version through VersionHooks (node/versions.h). dcr_publisher_open_scenario, which reads a YAML
// scenario, is dcr::publisher_scenario's (sim/scenario/publisher_scenario.cc) over OpenPublisher.
#include "dcr/publisher_c.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/node.h"
#include "dcr/status_macros.h"
#include "node/metrics.h"
#include "node/version_state.h"
#include "node/versions.h"
#include "publisher/publisher_open.h"
#include "publisher/shard_feed.h"

struct dcr_publisher {
  dcr::NodePlan plan;
  std::string work_dir;
  std::string error;

  std::mutex mu;
  std::condition_variable cv;
  size_t next = 0;  // index in plan.versions of the next version to hand
  std::optional<dcr::internal::VersionContent> handed;  // until the sender takes it
  bool closing = false;
  size_t done = 0;     // versions the sender finished
  size_t skipped = 0;  // leading versions an earlier sender of the state finished
  dcr::Status last_status;
  dcr::NodeResult last_result;
  bool finished = false;  // the sender's thread returned
  dcr::Status run_status;
  std::thread thread;
  std::unique_ptr<dcr::internal::ShardFeed> feed;  // dcr_publisher_attach_shards
  // The files this publisher (or an earlier one on its work_dir) wrote per version: removed once
  // the sender releases the version (VersionHooks::released).
  std::map<uint64_t, std::vector<std::string>> written;
  uint64_t baseline = 0;  // the lowest version the sender may still build from
  // /metrics and /healthz of the sender (plan.metrics_address), as dcr-node serves them.
  std::unique_ptr<dcr::internal::MetricsServer> metrics;
};

namespace {

int Fail(dcr_publisher* p, const dcr::Status& s) {
  if (p != nullptr) p->error = s.ToString();
  return s.ok() ? 0 : static_cast<int>(s.code());
}

dcr::StatusOr<dcr::internal::VersionContent> TakeVersion(dcr_publisher* p,
                                                         const dcr::NodeVersion& v) {
  std::unique_lock<std::mutex> lock(p->mu);
  p->cv.wait(lock, [p] { return p->handed.has_value() || p->closing; });
  if (!p->handed) {
    // An open-ended run ends where the trainer stopped handing versions; a listed one is cut.
    if (p->plan.open_versions) return dcr::internal::VersionContent{"", "", true};
    return dcr::AbortedError("publisher closed before version " + std::to_string(v.version) +
                             " was handed");
  }
  dcr::internal::VersionContent content = std::move(*p->handed);
  p->handed.reset();
  return content;
}

// The versions below `below` are no longer read by the sender: their files in work_dir go.
void VersionsReleased(dcr_publisher* p, uint64_t below) {
  std::lock_guard<std::mutex> lock(p->mu);
  p->baseline = std::max(p->baseline, below);
  for (auto it = p->written.begin(); it != p->written.end() && it->first < below;) {
    for (const std::string& path : it->second) {
      if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
        std::fprintf(stderr, "publisher: cannot remove %s, which no version needs any more: %s\n",
                     path.c_str(), std::strerror(errno));
      }
    }
    it = p->written.erase(it);
  }
}

// The files an earlier publisher on `work_dir` wrote (version-<k>.safetensors, .dcr), by version:
// a resumed publisher removes them as the sender releases their versions.
std::map<uint64_t, std::vector<std::string>> EarlierFiles(const std::string& work_dir) {
  std::map<uint64_t, std::vector<std::string>> found;
  DIR* d = opendir(work_dir.c_str());
  if (d == nullptr) return found;
  while (const dirent* e = readdir(d)) {
    unsigned long long k = 0;
    char ext[16] = {0};
    int used = 0;
    if (std::sscanf(e->d_name, "version-%llu.%15[a-z]%n", &k, ext, &used) == 2 &&
        e->d_name[used] == '\0' &&
        (std::strcmp(ext, "safetensors") == 0 || std::strcmp(ext, "dcr") == 0)) {
      found[k].push_back(work_dir + "/" + e->d_name);
    }
  }
  closedir(d);
  return found;
}

// Records that `path` holds version `version`'s content written by this publisher.
void Wrote(dcr_publisher* p, uint64_t version, const std::string& path) {
  std::lock_guard<std::mutex> lock(p->mu);
  std::vector<std::string>& files = p->written[version];
  if (std::find(files.begin(), files.end(), path) == files.end()) files.push_back(path);
}

void VersionDone(dcr_publisher* p, const dcr::NodeResult& r, const dcr::Status& s) {
  std::lock_guard<std::mutex> lock(p->mu);
  ++p->done;
  p->last_status = s;
  p->last_result = r;
  p->cv.notify_all();
}

// The number of the plan's version at index `i`: listed, or after the listed ones of an
// open-ended plan, counted on from the last.
uint64_t VersionAt(const dcr_publisher* p, size_t i) {
  if (i < p->plan.versions.size()) return p->plan.versions[i].version;
  return p->plan.versions.back().version + (i + 1 - p->plan.versions.size());
}

// Whether the plan has a version at index `i`.
bool HasVersion(const dcr_publisher* p, size_t i) {
  return p->plan.open_versions || i < p->plan.versions.size();
}

// Whether `version` may be handed now: the sender runs and it is the plan's next version.
// REQUIRES: p->mu held.
dcr::Status CheckNextLocked(dcr_publisher* p, uint64_t version) {
  if (p->finished) {
    return p->run_status.ok() ? dcr::FailedPreconditionError("the sender has ended")
                              : p->run_status;
  }
  if (!HasVersion(p, p->next)) {
    return dcr::InvalidArgumentError("version " + std::to_string(version) +
                                     ": the plan names no more versions");
  }
  const uint64_t expected = VersionAt(p, p->next);
  if (version < expected && p->skipped > 0 && version <= VersionAt(p, p->skipped - 1)) {
    return dcr::InvalidArgumentError(
        "version " + std::to_string(version) + " is already published (state " + p->plan.state_dir +
        " records versions up to " + std::to_string(VersionAt(p, p->skipped - 1)) +
        "); the plan's next version is " + std::to_string(expected));
  }
  if (version != expected) {
    return dcr::InvalidArgumentError("version " + std::to_string(version) +
                                     " handed; the plan's next version is " +
                                     std::to_string(expected));
  }
  return dcr::Status();
}

int Publish(dcr_publisher* p, uint64_t version, dcr::internal::VersionContent content) {
  size_t want = 0;
  {
    std::lock_guard<std::mutex> lock(p->mu);
    dcr::Status next = CheckNextLocked(p, version);
    if (!next.ok()) return Fail(p, next);
    p->handed = std::move(content);
    ++p->next;
    want = p->next;
    p->cv.notify_all();
  }
  std::unique_lock<std::mutex> lock(p->mu);
  p->cv.wait(lock, [&] { return p->done + p->skipped >= want || p->finished; });
  if (p->done + p->skipped >= want) return Fail(p, p->last_status);
  return Fail(p, p->run_status.ok() ? dcr::InternalError("the sender ended before the version")
                                    : p->run_status);
}

// Starts the sender of `plan` on p's thread. A plan with a state_dir resumes after the versions
// an earlier sender of that state finished (VersionRecovery::Finished, as RunNodeVersions skips
// them); a state that finished every version is refused, naming it and the last version.
dcr::Status Start(dcr_publisher* p, dcr::NodePlan plan, const std::string& work_dir) {
  if (plan.rank != 0 || plan.versions.empty()) {
    return dcr::InvalidArgumentError("not a sender plan with versions (rank 0, versions [...])");
  }
  size_t skipped = 0;
  if (!plan.state_dir.empty()) {
    auto recovery = dcr::internal::VersionRecovery::Open(plan);
    if (!recovery.ok()) return recovery.status();
    // An open-ended plan's versions after the listed ones follow the last (NextOpenVersion).
    dcr::NodeVersion v = plan.versions[0];
    while ((skipped < plan.versions.size() || plan.open_versions) && (*recovery)->Finished(v)) {
      ++skipped;
      v = skipped < plan.versions.size() ? plan.versions[skipped]
                                         : dcr::internal::NextOpenVersion(v);
    }
    if (!plan.open_versions && skipped == plan.versions.size()) {
      return dcr::FailedPreconditionError(
          "state " + plan.state_dir + ": version " + std::to_string(plan.versions.back().version) +
          ", the plan's last, is already published (a finished run): give a fresh state "
          "directory");
    }
  }
  if (mkdir(work_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return dcr::ErrnoError("work_dir " + work_dir, errno);
  }
  if (!plan.metrics_address.empty()) {
    p->metrics = std::make_unique<dcr::internal::MetricsServer>();
    DCR_RETURN_IF_ERROR(p->metrics->Start(
        plan.metrics_address, [] { return dcr::internal::MetricsBoard::Process().Snapshot(); }));
  }
  p->plan = std::move(plan);
  p->work_dir = work_dir;
  p->skipped = skipped;
  p->next = skipped;
  p->written = EarlierFiles(work_dir);
  dcr::internal::VersionHooks hooks;
  hooks.content = [p](const dcr::NodeVersion& v) { return TakeVersion(p, v); };
  hooks.released = [p](uint64_t below) { VersionsReleased(p, below); };
  hooks.done = [p](const dcr::NodeVersion&, const dcr::NodeResult& r, const dcr::Status& s) {
    VersionDone(p, r, s);
  };
  p->thread = std::thread([p, hooks] {
    dcr::NodeResult result;
    dcr::Status s = dcr::internal::RunNodeVersions(p->plan, &result, hooks);
    std::lock_guard<std::mutex> lock(p->mu);
    p->run_status = s;
    p->finished = true;
    p->cv.notify_all();
  });
  return dcr::Status();
}

// A fresh handle in *out (nullptr when the allocation failed).
int NewHandle(dcr_publisher** out) {
  if (out == nullptr) return Fail(nullptr, dcr::InvalidArgumentError("out is NULL"));
  *out = new (std::nothrow) dcr_publisher();
  return *out == nullptr ? static_cast<int>(dcr::StatusCode::kResourceExhausted) : 0;
}

}  // namespace

namespace dcr::internal {

int OpenPublisher(const std::function<StatusOr<NodePlan>()>& make_plan, const char* work_dir,
                  const char* api, dcr_publisher** out) {
  if (int rc = NewHandle(out); rc != 0) return rc;
  dcr_publisher* p = *out;
  try {
    StatusOr<NodePlan> plan = make_plan();
    if (!plan.ok()) return Fail(p, plan.status());
    return Fail(p, Start(p, std::move(*plan), work_dir));
  } catch (const std::exception& e) {
    return Fail(p, InternalError(std::string(api) + ": " + e.what()));
  }
}

}  // namespace dcr::internal

extern "C" {

int dcr_publisher_open(const char* plan_path, const char* work_dir, dcr_publisher** out) {
  if (int rc = NewHandle(out); rc != 0) return rc;
  dcr_publisher* p = *out;
  try {
    if (plan_path == nullptr || work_dir == nullptr) {
      return Fail(p, dcr::InvalidArgumentError("plan_path and work_dir are required"));
    }
    auto text = dcr::ReadFile(plan_path);
    if (!text.ok()) return Fail(p, text.status());
    auto plan = dcr::NodePlanFromJson(std::string(text->begin(), text->end()));
    if (!plan.ok()) return Fail(p, plan.status());
    dcr::Status s = Start(p, std::move(*plan), work_dir);
    return Fail(p, s.ok() ? s : s.WithContext(plan_path));
  } catch (const std::exception& e) {
    return Fail(p, dcr::InternalError(std::string("dcr_publisher_open: ") + e.what()));
  }
}

int dcr_publisher_publish_file(dcr_publisher* p, uint64_t version, const char* path) {
  if (p == nullptr || path == nullptr) {
    return Fail(p, dcr::InvalidArgumentError("publisher and path are required"));
  }
  try {
    return Publish(p, version, dcr::internal::VersionContent{path, ""});
  } catch (const std::exception& e) {
    return Fail(p, dcr::InternalError(std::string("dcr_publisher_publish_file: ") + e.what()));
  }
}

int dcr_publisher_publish_tensors(dcr_publisher* p, uint64_t version, const dcr_tensor* tensors,
                                  size_t n, const char* const* meta, size_t n_meta) {
  if (p == nullptr || (tensors == nullptr && n > 0)) {
    return Fail(p, dcr::InvalidArgumentError("publisher and tensors are required"));
  }
  try {
    std::vector<dcr::TensorView> views;
    for (size_t i = 0; i < n; ++i) {
      const dcr_tensor& t = tensors[i];
      if (t.name == nullptr || t.dtype == nullptr || (t.ndim > 0 && t.shape == nullptr) ||
          (t.nbytes > 0 && t.data == nullptr)) {
        return Fail(p, dcr::InvalidArgumentError("tensor " + std::to_string(i) +
                                                 ": name, dtype, shape and data are required"));
      }
      views.push_back(dcr::TensorView{
          t.name, t.dtype, std::vector<int64_t>(t.shape, t.shape + t.ndim), t.data, t.nbytes});
    }
    std::map<std::string, std::string> metadata;
    for (size_t i = 0; i < n_meta; ++i) {
      if (meta == nullptr || meta[2 * i] == nullptr || meta[2 * i + 1] == nullptr) {
        return Fail(p, dcr::InvalidArgumentError("metadata entry " + std::to_string(i) +
                                                 ": key and value are required"));
      }
      metadata[meta[2 * i]] = meta[2 * i + 1];
    }
    const std::string path = p->work_dir + "/version-" + std::to_string(version) + ".safetensors";
    dcr::Status w = dcr::WriteSafetensors(path, views, metadata);
    if (!w.ok()) return Fail(p, w.WithContext("version " + std::to_string(version)));
    Wrote(p, version, path);
    return Publish(p, version, dcr::internal::VersionContent{path, ""});
  } catch (const std::exception& e) {
    return Fail(p, dcr::InternalError(std::string("dcr_publisher_publish_tensors: ") + e.what()));
  }
}

int dcr_publisher_attach_shards(dcr_publisher* p, const dcr_train_layout* l, dcr_export_fn fn,
                                void* user, uint64_t base_version, const dcr_shard* shards,
                                size_t n) {
  if (p == nullptr || l == nullptr || l->s == nullptr || fn == nullptr) {
    return Fail(p, dcr::InvalidArgumentError("publisher, an opened layout and fn are required"));
  }
  try {
    auto set = dcr::internal::CopyShards(*l->s, shards, n);
    if (!set.ok()) return Fail(p, set.status().WithContext("base shards"));
    dcr::internal::ShardFeedOptions o;
    o.chunk_elems = p->plan.chunk_elems;
    o.zstd_level = p->plan.zstd_level;
    o.threads = p->plan.build_threads;
    auto feed = dcr::internal::ShardFeed::Create(l->s, dcr::internal::MakeCExporter(l->s, fn, user),
                                                 base_version, std::move(*set), o);
    if (!feed.ok()) return Fail(p, feed.status().WithContext("attaching shards"));
    // The receivers hold the plan's base: shards said to be version 0 must export to it.
    if (base_version == 0) {
      auto base = dcr::Checkpoint::Open(p->plan.base_path);
      if (!base.ok()) return Fail(p, base.status().WithContext("the plan's base"));
      const dcr::Hash128 want = (*base)->ContentHash(p->plan.build_threads);
      if ((*feed)->base_hash() != want) {
        return Fail(p, dcr::FailedPreconditionError(
                           "base shards: their canonical content hash " +
                           (*feed)->base_hash().ToHex() + " is not that of the base checkpoint " +
                           p->plan.base_path + " the receivers hold (" + want.ToHex() + ")"));
      }
    }
    p->feed = std::move(*feed);
    return 0;
  } catch (const std::exception& e) {
    return Fail(p, dcr::InternalError(std::string("dcr_publisher_attach_shards: ") + e.what()));
  }
}

int dcr_publisher_publish_shards(dcr_publisher* p, uint64_t version, const dcr_shard* shards,
                                 size_t n) {
  if (p == nullptr) return Fail(p, dcr::InvalidArgumentError("publisher is NULL"));
  try {
    if (p->feed == nullptr) {
      return Fail(p, dcr::FailedPreconditionError(
                         "no shards attached (dcr_publisher_attach_shards first)"));
    }
    {
      std::lock_guard<std::mutex> lock(p->mu);
      dcr::Status next = CheckNextLocked(p, version);
      if (!next.ok()) return Fail(p, next);
    }
    auto set = dcr::internal::CopyShards(p->feed->structure(), shards, n);
    if (!set.ok()) return Fail(p, set.status().WithContext("version " + std::to_string(version)));
    const std::string stem = p->work_dir + "/version-" + std::to_string(version);
    dcr::internal::VersionContent content{stem + ".safetensors", stem + ".dcr"};
    dcr::Status s = p->feed->Step(version, std::move(*set), content.checkpoint, content.delta_path);
    if (!s.ok()) return Fail(p, s);
    Wrote(p, version, content.checkpoint);
    Wrote(p, version, content.delta_path);
    return Publish(p, version, std::move(content));
  } catch (const std::exception& e) {
    return Fail(p, dcr::InternalError(std::string("dcr_publisher_publish_shards: ") + e.what()));
  }
}

int dcr_publisher_last_delta(const dcr_publisher* p, uint64_t* base_version, int* from_shards) {
  if (p == nullptr) return Fail(nullptr, dcr::InvalidArgumentError("publisher is NULL"));
  auto* q = const_cast<dcr_publisher*>(p);
  std::lock_guard<std::mutex> lock(q->mu);
  if (base_version != nullptr) {
    *base_version = static_cast<uint64_t>(std::max<int64_t>(0, q->last_result.delta_base_version));
  }
  if (from_shards != nullptr) *from_shards = q->last_result.trainer_delta ? 1 : 0;
  return 0;
}

int dcr_publisher_last(const dcr_publisher* p, uint64_t hash[2], int* receivers_committed) {
  if (p == nullptr) return Fail(nullptr, dcr::InvalidArgumentError("publisher is NULL"));
  auto* q = const_cast<dcr_publisher*>(p);
  std::lock_guard<std::mutex> lock(q->mu);
  if (hash != nullptr) {
    hash[0] = q->last_result.target_hash.lo;
    hash[1] = q->last_result.target_hash.hi;
  }
  if (receivers_committed != nullptr) *receivers_committed = q->last_result.receivers_committed;
  return 0;
}

int dcr_publisher_baseline(const dcr_publisher* p, uint64_t* version) {
  if (p == nullptr) return Fail(nullptr, dcr::InvalidArgumentError("publisher is NULL"));
  auto* q = const_cast<dcr_publisher*>(p);
  std::lock_guard<std::mutex> lock(q->mu);
  if (version != nullptr) *version = q->baseline;
  return 0;
}

int dcr_publisher_next_version(const dcr_publisher* p, uint64_t* version) {
  if (p == nullptr) return Fail(nullptr, dcr::InvalidArgumentError("publisher is NULL"));
  auto* q = const_cast<dcr_publisher*>(p);
  std::lock_guard<std::mutex> lock(q->mu);
  if (!HasVersion(q, q->next)) {
    return Fail(
        q, dcr::FailedPreconditionError("the plan names no more versions (its last is " +
                                        std::to_string(q->plan.versions.back().version) + ")"));
  }
  if (q->finished) {
    return Fail(q, q->run_status.ok() ? dcr::FailedPreconditionError("the sender has ended")
                                      : q->run_status);
  }
  if (version != nullptr) *version = VersionAt(q, q->next);
  return 0;
}

const char* dcr_publisher_error(const dcr_publisher* p) {
  return p == nullptr ? "" : p->error.c_str();
}

int dcr_publisher_close(dcr_publisher* p) {
  if (p == nullptr) return 0;
  int rc = 0;
  try {
    bool all = false;
    {
      std::lock_guard<std::mutex> lock(p->mu);
      p->closing = true;
      all = p->plan.open_versions || p->next >= p->plan.versions.size();
      p->cv.notify_all();
    }
    if (p->thread.joinable()) p->thread.join();
    if (!p->run_status.ok()) {
      rc = static_cast<int>(p->run_status.code());
    } else if (!all && !p->plan.versions.empty()) {
      rc = static_cast<int>(dcr::StatusCode::kAborted);
    }
  } catch (const std::exception&) {
    rc = static_cast<int>(dcr::StatusCode::kInternal);
  }
  delete p;
  return rc;
}

}  // extern "C"
