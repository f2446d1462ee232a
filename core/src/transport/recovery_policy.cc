// The recovery state machine (see dcr/recovery_policy.h for the rules R1-R9).
#include "dcr/recovery_policy.h"

#include <algorithm>

#include "internal/str_format.h"

namespace dcr {

namespace {

using internal::Fmt;
using internal::Overloaded;

using ULL = unsigned long long;

const char* StreamName(recovery::Stream s) {
  switch (s) {
    case recovery::Stream::kTree:
      return "tree";
    case recovery::Stream::kDownload:
      return "download";
    case recovery::Stream::kUpload:
      return "upload";
  }
  return "?";
}

}  // namespace

std::string OverwriteKey(const std::string& prefix, uint64_t chunk_id) {
  return "ow/" + prefix + "/" + std::to_string(chunk_id);
}

const char* RecoveryModeName(RecoveryPolicy::Mode mode) {
  switch (mode) {
    case RecoveryPolicy::Mode::kTree:
      return "tree";
    case RecoveryPolicy::Mode::kStore:
      return "store";
    case RecoveryPolicy::Mode::kCommitted:
      return "committed";
    case RecoveryPolicy::Mode::kGaveUp:
      return "gave-up";
  }
  return "?";
}

namespace recovery {

std::string ToString(const Event& e) {
  return std::visit(
      Overloaded{
          [](const ParentLost& x) { return Fmt("ParentLost{%d adopter %d}", x.parent, x.adopter); },
          [](const ParentHeard& x) { return Fmt("ParentHeard{%d}", x.parent); },
          [](const StreamFailed& x) {
            return Fmt("StreamFailed{%s %s: %s}", StreamName(x.stream),
                       std::string(StatusCodeName(x.code)).c_str(), x.message.c_str());
          },
          [](const Committed&) { return std::string("Committed"); },
          [](const Restarted& x) {
            return Fmt("Restarted{%s%s applied %llu doubtful %llu}",
                       x.storage_lost ? "storage lost" : "storage kept",
                       x.target_committed ? " target committed" : "", (ULL)x.applied,
                       (ULL)x.doubtful);
          },
          [](const ChunkDoubtful& x) { return Fmt("ChunkDoubtful{%llu}", (ULL)x.chunk_id); },
          [](const TimerFired&) { return std::string("TimerFired"); },
      },
      e);
}

std::string ToString(const Action& a) {
  return std::visit(
      Overloaded{
          [](const SetTimer& x) { return Fmt("SetTimer{%.4f}", x.at); },
          [](const FallBackToStore& x) { return Fmt("FallBackToStore{%s}", x.reason.c_str()); },
          [](const LeaveTree&) { return std::string("LeaveTree"); },
          [](const StartDownload&) { return std::string("StartDownload"); },
          [](const Reparent& x) { return Fmt("Reparent{%d}", x.to); },
          [](const ReloadCommitted&) { return std::string("ReloadCommitted"); },
          [](const RequestOverwrite& x) {
            return Fmt("RequestOverwrite{%llu %s}", (ULL)x.chunk_id, x.key.c_str());
          },
          [](const StopUpload&) { return std::string("StopUpload"); },
          [](const Republish&) { return std::string("Republish"); },
          [](const GiveUp& x) { return Fmt("GiveUp{%s}", x.message.c_str()); },
      },
      a);
}

}  // namespace recovery

using recovery::ChunkDoubtful;
using recovery::Committed;
using recovery::FallBackToStore;
using recovery::GiveUp;
using recovery::LeaveTree;
using recovery::ParentHeard;
using recovery::ParentLost;
using recovery::ReloadCommitted;
using recovery::Reparent;
using recovery::Republish;
using recovery::RequestOverwrite;
using recovery::Restarted;
using recovery::SetTimer;
using recovery::StartDownload;
using recovery::StopUpload;
using recovery::Stream;
using recovery::StreamFailed;
using recovery::TimerFired;
using Actions = std::vector<recovery::Action>;

RecoveryPolicy::RecoveryPolicy(RecoveryRole role, const RecoveryOptions& options, bool in_tree,
                               int recoveries_spent)
    : role_(role),
      options_(options),
      mode_(in_tree ? Mode::kTree : Mode::kStore),
      recoveries_(std::max(0, recoveries_spent)) {}

bool RecoveryPolicy::Spend(const std::string& what, Actions* out) {
  if (++recoveries_ <= options_.max_recoveries) return true;
  mode_ = Mode::kGaveUp;
  suspect_ = kNoNode;
  timer_ = TimerFor::kNone;
  out->push_back(
      GiveUp{Fmt("too many recoveries (%d allowed; %s)", options_.max_recoveries, what.c_str())});
  return false;
}

void RecoveryPolicy::FallBack(TimePoint now, const std::string& reason, Actions* out) {
  if (!Spend(reason, out)) return;
  const bool was_tree = mode_ == Mode::kTree;
  mode_ = Mode::kStore;
  suspect_ = kNoNode;
  out->push_back(FallBackToStore{reason});
  if (was_tree) out->push_back(LeaveTree{});
  const double backoff =
      std::min(options_.backoff_max_s,
               options_.backoff_initial_s * static_cast<double>(1u << std::min(recoveries_, 10)));
  timer_ = TimerFor::kDownload;
  out->push_back(SetTimer{now + backoff});
}

void RecoveryPolicy::HandleSender(const recovery::Event& event, Actions* out) {
  if (const auto* f = std::get_if<StreamFailed>(&event)) {
    if (f->stream == Stream::kTree) out->push_back(LeaveTree{});
    if (f->stream == Stream::kUpload) out->push_back(StopUpload{});
  } else if (std::holds_alternative<Restarted>(event)) {
    out->push_back(Republish{});
  }
}

void RecoveryPolicy::Handle(TimePoint now, const recovery::Event& event, Actions* out) {
  if (role_ == RecoveryRole::kSender) {
    HandleSender(event, out);
    return;
  }
  if (mode_ == Mode::kGaveUp) return;
  std::visit(
      Overloaded{
          [&](const ParentLost& x) {
            // R1, R8: only a node still fed by the tree watches its parent; a second report
            // keeps the first deadline.
            if (mode_ != Mode::kTree || suspect_ != kNoNode) return;
            suspect_ = x.parent;
            adopter_ = x.adopter;
            timer_ = TimerFor::kDetect;
            out->push_back(SetTimer{now + options_.detect_timeout_s});
          },
          [&](const ParentHeard& x) {
            if (suspect_ != kNoNode && x.parent == suspect_) {
              suspect_ = kNoNode;
              if (timer_ == TimerFor::kDetect) timer_ = TimerFor::kNone;
            }
          },
          [&](const StreamFailed& x) {
            if (mode_ == Mode::kCommitted) {  // R8
              if (x.stream == Stream::kTree) out->push_back(LeaveTree{});
              return;
            }
            FallBack(now, x.message, out);  // R3
          },
          [&](const Committed&) {
            mode_ = Mode::kCommitted;
            suspect_ = kNoNode;
            timer_ = TimerFor::kNone;
          },
          [&](const Restarted& x) {
            // R5: the process and its links are new; what it suspected died with it.
            suspect_ = kNoNode;
            adopter_ = kNoNode;
            reparented_ = false;
            timer_ = TimerFor::kNone;
            if (!Spend("restart", out)) return;
            if (x.storage_lost) out->push_back(ReloadCommitted{});
            if (x.target_committed) {
              mode_ = Mode::kCommitted;
              return;
            }
            mode_ = Mode::kStore;
            timer_ = TimerFor::kDownload;
            out->push_back(SetTimer{now});
          },
          [&](const ChunkDoubtful& x) {  // R6
            out->push_back(RequestOverwrite{x.chunk_id, OverwriteKey(options_.prefix, x.chunk_id)});
          },
          [&](const TimerFired&) {
            const TimerFor what = timer_;
            timer_ = TimerFor::kNone;
            if (what == TimerFor::kDownload && mode_ == Mode::kStore) {
              out->push_back(StartDownload{});
            } else if (what == TimerFor::kDetect && mode_ == Mode::kTree && suspect_ != kNoNode) {
              const NodeId adopter = adopter_;
              suspect_ = kNoNode;
              adopter_ = kNoNode;
              // R2: the grandparent when offered, not the sender, once.
              if (adopter != kNoNode && adopter != 0 && !reparented_) {
                if (!Spend("parent lost", out)) return;
                reparented_ = true;
                out->push_back(Reparent{adopter});
                return;
              }
              FallBack(now, "parent lost", out);
            }
          },
      },
      event);
}

void PerformRecovery(const std::vector<recovery::Action>& actions, RecoveryEnvironment* env) {
  for (const recovery::Action& a : actions) {
    std::visit(Overloaded{
                   [env](const SetTimer& x) { env->SetTimer(x.at); },
                   [env](const FallBackToStore& x) { env->FallBackToStore(x.reason); },
                   [env](const LeaveTree&) { env->LeaveTree(); },
                   [env](const StartDownload&) { env->StartDownload(); },
                   [env](const Reparent& x) { env->Reparent(x.to); },
                   [env](const ReloadCommitted&) { env->ReloadCommitted(); },
                   [env](const RequestOverwrite& x) { env->RequestOverwrite(x.chunk_id, x.key); },
                   [env](const StopUpload&) { env->StopUpload(); },
                   [env](const Republish&) { env->Republish(); },
                   [env](const GiveUp& x) { env->GiveUp(x.message); },
               },
               a);
  }
}

}  // namespace dcr
