// CommitCoordinator: the trainer side of the joint commit (a pure state machine).
#include <algorithm>

#include "dcr/status_macros.h"
#include "dcr/versioning.h"

namespace dcr {

CommitCoordinator::CommitCoordinator(const VersionId& initial, const CommitOptions& options)
    : options_(options) {
  if (options_.retained_versions < 1) options_.retained_versions = 1;
  history_.push_back(initial);
}

int CommitCoordinator::IndexOf(const VersionId& v) const {
  for (size_t i = 0; i < history_.size(); ++i) {
    if (history_[i] == v) return static_cast<int>(i);
  }
  return -1;
}

Status CommitCoordinator::AddReceiver(const std::string& name,
                                      const std::optional<VersionId>& committed) {
  if (receivers_.count(name)) {
    return InvalidArgumentError("receiver '" + name + "' is already registered");
  }
  if (committed) {
    for (const VersionId& h : history_) {
      if (h.number == committed->number && h.hash != committed->hash) {
        return FailedPreconditionError("receiver '" + name + "' reports " + committed->ToString() +
                                       " but the trainer published " + h.ToString() +
                                       ": it must reload");
      }
    }
  }
  receivers_[name] = committed;
  return Status::OK();
}

Status CommitCoordinator::RemoveReceiver(const std::string& name) {
  if (!receivers_.erase(name)) return NotFoundError("unknown receiver '" + name + "'");
  return Status::OK();
}

VersionId CommitCoordinator::baseline() const {
  // The oldest retained version held by a live receiver; receivers with no retained version
  // (fresh, or too far behind) rejoin through a full frame and do not hold the baseline back.
  int lowest = static_cast<int>(history_.size()) - 1;
  for (const auto& [name, v] : receivers_) {
    if (!v) continue;
    int i = IndexOf(*v);
    if (i >= 0) lowest = std::min(lowest, i);
  }
  return history_[static_cast<size_t>(lowest)];
}

bool CommitCoordinator::LatestWhole() const {
  for (const auto& [name, v] : receivers_) {
    if (!v || *v != latest()) return false;
  }
  return true;
}

Status CommitCoordinator::Publish(const VersionId& base, const VersionId& v) {
  if (v.number <= latest().number) {
    return FailedPreconditionError("cannot publish " + v.ToString() + ": not newer than " +
                                   latest().ToString());
  }
  VersionId b = baseline();
  if (base != b) {
    return FailedPreconditionError("cannot publish " + v.ToString() + " built from " +
                                   base.ToString() + ": the baseline is " + b.ToString() +
                                   " (the version every live receiver committed)");
  }
  if (b != latest()) {
    return FailedPreconditionError("cannot publish " + v.ToString() + ": " + latest().ToString() +
                                   " is not yet committed by every live receiver");
  }
  history_.push_back(v);
  // Prune, never past the baseline.
  while (static_cast<int>(history_.size()) > options_.retained_versions) {
    VersionId keep = baseline();
    if (history_.front() == keep) break;
    history_.erase(history_.begin());
  }
  return Status::OK();
}

Status CommitCoordinator::OnCommitted(const std::string& name, const VersionId& v) {
  auto it = receivers_.find(name);
  if (it == receivers_.end()) return NotFoundError("unknown receiver '" + name + "'");
  int i = IndexOf(v);
  if (i < 0) {
    return FailedPreconditionError("receiver '" + name + "' reports committed " + v.ToString() +
                                   ", which is not a retained published version");
  }
  if (it->second) {
    int old = IndexOf(*it->second);
    if (old > i) {
      return FailedPreconditionError("receiver '" + name + "' reports " + v.ToString() + " after " +
                                     it->second->ToString() + " (going back)");
    }
  }
  it->second = v;
  return Status::OK();
}

Status CommitCoordinator::CheckDeltaBase(const FileHeader& header) const {
  if (header.flags & kFlagNoBase) return Status::OK();
  VersionId b = baseline();
  VersionId hb{header.base_version, header.base_hash};
  if (hb != b) {
    return FailedPreconditionError("delta built from " + hb.ToString() +
                                   " refused: the baseline is " + b.ToString());
  }
  return Status::OK();
}

ReceiverPlan CommitCoordinator::PlanFor(const std::string& name) const {
  ReceiverPlan p;
  p.to = latest();
  auto it = receivers_.find(name);
  if (it == receivers_.end() || !it->second) {
    p.kind = ReceiverPlan::kFullFrame;
    return p;
  }
  int i = IndexOf(*it->second);
  if (i < 0) {
    p.kind = ReceiverPlan::kFullFrame;
    return p;
  }
  p.from = *it->second;
  p.versions_behind = static_cast<int>(history_.size()) - 1 - i;
  if (p.versions_behind == 0) {
    p.kind = ReceiverPlan::kUpToDate;
  } else if (p.versions_behind == 1) {
    p.kind = ReceiverPlan::kDelta;
  } else {
    p.kind = ReceiverPlan::kCatchUp;
  }
  return p;
}

}  // namespace dcr
