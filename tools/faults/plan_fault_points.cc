// PlanFaultPoints (plan_fault_points.h).
#include "plan_fault_points.h"

#include <signal.h>

#include <atomic>
#include <vector>

#include "receivers/forwarding_receiver.h"

namespace dcr::faults {

namespace {

// PlanFaultPoints::ChunkLayer's layer: forwards every call, counts the ApplyRecord calls and
// tells the fault points of each after it returned.
class ChunkFaultLayer : public internal::ForwardingReceiver {
 public:
  ChunkFaultLayer(Receiver* inner, PlanFaultPoints* points, bool inside)
      : ForwardingReceiver(inner), points_(points), inside_(inside) {}
  Status ApplyRecord(const uint8_t* r, size_t n) override {
    const int64_t ordinal = ordinal_.fetch_add(1);
    Status s = inner()->ApplyRecord(r, n);
    points_->ChunkApplied(ordinal, inside_);
    return s;
  }

 private:
  PlanFaultPoints* points_;
  bool inside_;
  std::atomic<int64_t> ordinal_{0};
};

}  // namespace

std::unique_ptr<Receiver> PlanFaultPoints::ChunkLayer(Receiver* inner, bool inside) {
  return std::make_unique<ChunkFaultLayer>(inner, this, inside);
}

void PlanFaultPoints::Arm(const NodePlan& plan, int starts) {
  const bool first = starts == 1;
  kill_chunk_ = first ? plan.fault_kill_chunk : -1;
  kill_inside_ = first && plan.fault_kill_inside;
  kill_blob_ = first ? plan.fault_kill_blob : -1;
  std::lock_guard<std::mutex> l(mu_);
  kill_log_step_ = first ? plan.fault_kill_log_step : std::string();
}

void PlanFaultPoints::LogStep(internal::VersionLogStep step) {
  std::lock_guard<std::mutex> l(mu_);
  if (!kill_log_step_.empty() && kill_log_step_ == internal::VersionLogStepName(step)) {
    ::raise(SIGKILL);
  }
}

void PlanFaultPoints::ChunkApplied(int64_t ordinal, bool inside) {
  if (ordinal == kill_chunk_.load() && inside == kill_inside_.load()) ::raise(SIGKILL);
}

void PlanFaultPoints::BlobReached(uint64_t blob) {
  const int64_t at = kill_blob_.load();
  if (at >= 0 && blob >= static_cast<uint64_t>(at)) ::raise(SIGKILL);
}

void InstallPlanFaultPoints() {
  static PlanFaultPoints points;
  internal::InstallFaultPoints(&points);
}

}  // namespace dcr::faults
