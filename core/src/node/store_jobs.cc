// StoreJobs (store_jobs.h).
#include "node/store_jobs.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "dcr/delta.h"
#include "dcr/node.h"
#include "dcr/receiver.h"
#include "dcr/recovery_policy.h"
#include "dcr/relay_policy.h"
#include "dcr/status.h"
#include "dcr/status_macros.h"
#include "node/blob_resume.h"
#include "node/node_state.h"
#include "transport/net.h"

namespace dcr::internal {

Status StoreJobs::SkipHeld(const std::string& prefix) {
  DCR_ASSIGN_OR_RETURN(auto listed, store_->List(prefix + "/"));
  std::lock_guard<std::mutex> l(held_mu_);
  for (const auto& o : listed) held_[o.key] = o.size;
  filling_ = true;
  return Status();
}

void StoreJobs::CountFailure(const Status& s) {
  state_->Update([&](NodeResult* r) {
    ++r->store_failures;
    if (s.IsDataLoss()) ++r->store_refused;
  });
}

void StoreJobs::PutJob(const BlobPtr& b, const std::string& key) {
  bool held = false;
  bool filling = false;
  {
    std::lock_guard<std::mutex> l(held_mu_);
    auto it = held_.find(key);
    held = it != held_.end() && it->second == b->bytes.size();
    filling = filling_;
  }
  if (!held && filling) {
    // The in-region copy may have gained the object since the listing (the mirror lags).
    auto head = store_->Head(key);
    held = head.ok() && head->size == b->bytes.size();
  }
  if (held) {
    ++skipped_;
    queue_->Post(event::PutDone{b->info.id, true, ""});
    return;
  }
  // The uploader sits in the training region: every put crosses the (emulated) long link.
  if (plan_.emulate_wan) {
    if (plan_.long_bandwidth_Bps > 0) long_bucket_.Acquire(b->bytes.size());
    if (plan_.long_latency_s > 0) {
      usleep(static_cast<useconds_t>(2 * plan_.long_latency_s * 1e6));
    }
  }
  Status s = store_->Put(key, b->bytes.data(), b->bytes.size());
  if (!s.ok()) CountFailure(s);
  if (s.ok()) {
    state_->Update([&](NodeResult* r) {
      r->bytes_sent += b->bytes.size();
      if (plan_.emulate_wan) r->bytes_sent_long += b->bytes.size();
      if (filling) r->fill_bytes += b->bytes.size();
    });
  }
  queue_->Post(event::PutDone{b->info.id, s.ok(), s.ToString()});
}

bool StoreJobs::FetchResumed(const BlobInfo& info, const std::string& key) {
  BlobPtr b = state_->Find(info.id);
  if (b != nullptr && (b->info.size != info.size || b->info.kind != info.kind)) {
    state_->Erase(info.id);  // held under another form: not this object's bytes
    b = nullptr;
  }
  if (b == nullptr) b = state_->GetOrCreate(info);
  if (b == nullptr) {
    queue_->Post(event::FetchDone{
        info.id, false,
        ResourceExhaustedError("out of memory for blob " + std::to_string(info.id)).ToString()});
    return true;
  }
  const uint64_t held = state_->HeldPrefix(info.id);
  uint64_t have = held, fetched = 0;
  bool other_size = false;
  Status s;
  if (have < info.size) {  // a blob held whole is not read again
    s = internal::FetchRemainder(*store_, key, info.size,
                                 std::max(plan_.relay.piece_bytes, internal::kMinFetchRangeBytes),
                                 &b->bytes, &have, &fetched, &other_size);
  }
  if (have > held) {
    state_->MarkHeld(info.id, held, have - held);
    state_->Persist(info, held, b->bytes.data() + held, have - held);
  }
  const double now = WallNow();
  state_->Update([&](NodeResult* r) {
    if (fetched > 0) NodeState::MarkBlob(r, now);
    r->bytes_received += fetched;
    r->fetched_bytes += fetched;
    if (s.ok() && held > 0) {
      ++r->resumed_blobs;
      r->resumed_bytes += held;
    }
    if (s.ok() && held > 0 && held < info.size) {
      r->recovery_log += "resumed blob " + std::to_string(info.id) + " at byte " +
                         std::to_string(held) + " of " + std::to_string(info.size) + "\n";
    }
  });
  if (other_size) {
    state_->Erase(info.id);
    return false;
  }
  if (!s.ok()) CountFailure(s);
  queue_->Post(event::FetchDone{info.id, s.ok(), s.ok() ? "" : s.ToString()});
  return true;
}

void StoreJobs::ListJob(const std::string& prefix) {
  auto l = store_->List(prefix + "/");
  event::ListDone done;
  done.ok = l.ok();
  if (!l.ok()) {
    CountFailure(l.status());
    done.message = l.status().ToString();
  } else {
    for (const auto& o : *l) {
      auto b = ParseObjectKey(prefix, o.key);
      if (!b.ok()) continue;  // foreign object under the prefix
      b->size = o.size;
      done.blobs.push_back(*b);
    }
  }
  queue_->Post(std::move(done));
}

void StoreJobs::FetchJob(const BlobInfo& info, const std::string& key) {
  const uint64_t limit = MaxBlobBytes(plan_, info.kind);
  // An object listed larger than the plan allows is refused unread (a sparse 1 TB file would
  // otherwise cost a read of the limit on every retry).
  if (info.size > limit) {
    queue_->Post(
        event::FetchDone{info.id, false,
                         DataLossError("object " + key + " is " + std::to_string(info.size) +
                                       " bytes, larger "
                                       "than the " +
                                       std::to_string(limit) + " bytes the plan allows for a " +
                                       BlobKindName(info.kind))
                             .ToString()});
    return;
  }
  if (resume_ && FetchResumed(info, key)) return;
  // One byte past the limit tells an oversized object from one of exactly the limit (the
  // listing may be older than the object).
  auto got = store_->GetRange(key, 0, limit + 1);
  if (got.ok() && got->size() > limit) {
    got = DataLossError("object " + key + " is larger than the " + std::to_string(limit) +
                        " bytes the plan allows for a " + BlobKindName(info.kind));
  }
  if (!got.ok()) {
    CountFailure(got.status());
    queue_->Post(event::FetchDone{info.id, false, got.status().ToString()});
    return;
  }
  auto b = std::make_shared<BlobBuf>();
  b->info = info;
  b->info.size = got->size();
  b->bytes = std::move(got).value();
  state_->Store(b);
  const double now = WallNow();
  state_->Update([&](NodeResult* r) {
    NodeState::MarkBlob(r, now);
    r->bytes_received += b->bytes.size();
    r->fetched_bytes += b->bytes.size();
  });
  queue_->Post(event::FetchDone{info.id, true, ""});
}

}  // namespace dcr::internal
