// A node plan's trust settings on its receiver.
#include "node/node_trust.h"

#include <ctime>

#include "dcr/status_macros.h"

namespace dcr::internal {

StatusOr<std::unique_ptr<Receiver>> WithPlanTrust(const NodePlan& plan,
                                                  std::unique_ptr<Receiver> receiver,
                                                  std::unique_ptr<VersionFloor>* floor) {
  TrustOptions o;
  if (!plan.trust_key.empty()) {
    auto key = TrustKey::Load(plan.trust_key);
    if (!key.ok()) return key.status().WithContext("plan.trust_key");
    o.key = *key;
    o.run_id = plan.run_id;
  }
  if (!plan.version_floor_path.empty()) {
    auto f = VersionFloor::Load(plan.version_floor_path);
    if (!f.ok()) return f.status().WithContext("plan.version_floor_path");
    *floor = std::make_unique<VersionFloor>(std::move(*f));
    o.floor = floor->get();
  }
  return std::unique_ptr<Receiver>(new TrustedReceiver(std::move(receiver), std::move(o)));
}

std::string PlanFreezeReport(const NodePlan& plan, const VersionFloor* floor,
                             double t_start_unix) {
  if (plan.freeze_after_s <= 0) return "";
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  const double now = static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  VersionFloor none;
  return (floor != nullptr ? *floor : none).FreezeReport(now, plan.freeze_after_s, t_start_unix);
}

}  // namespace dcr::internal
