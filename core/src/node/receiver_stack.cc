// The receiver stack of a node (receiver_stack.h): every stack a node applies through is built
// here.
#include "node/receiver_stack.h"

#include <string>
#include <utility>

#include "dcr/status_macros.h"
#include "node/fault_points.h"
#include "node/node_state.h"
#include "node/node_trust.h"

namespace dcr::internal {

const Receiver* StorageLayer::receiver() const {
  if (host != nullptr) return host;
  return device;
}

namespace {

// Trust for `plan` over `storage` (a BufferReceiver or a DeviceReceiver, described by `layer`)
// as the whole stack.
StatusOr<ReceiverStack> TrustOverStorage(const NodePlan& plan, std::unique_ptr<Receiver> storage,
                                         StorageLayer layer) {
  ReceiverStack stack;
  stack.storage = layer;
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<TrustedReceiver> trusted,
                       WithPlanTrust(plan, std::move(storage), &stack.floor));
  stack.trust = trusted.get();
  stack.outer = std::move(trusted);
  return stack;
}

// A delta receiver's stack over the layers of a DurableReceiver.
StatusOr<ReceiverStack> DurableStack(const NodePlan& plan, std::shared_ptr<Device> device,
                                     int starts, std::unique_ptr<HeldStorage> carried) {
  ReceiverStack stack;
  DCR_ASSIGN_OR_RETURN(
      stack.durable, DurableReceiver::Open(plan, std::move(device), starts, InstalledFaultPoints(),
                                           std::move(carried)));
  if (stack.durable->host_storage() != nullptr) {
    stack.storage = StorageLayer(*stack.durable->host_storage());
  } else {
    stack.storage = StorageLayer(*stack.durable->device_storage());
  }
  // Only what the trainer's key signed, never below the version floor (node_trust.h), checked
  // before the journal records anything.
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<TrustedReceiver> trusted,
                       WithPlanTrust(plan, stack.durable->Handle(), &stack.floor));
  stack.trust = trusted.get();
  stack.outer = std::move(trusted);
  return stack;
}

// A delta receiver's stack over plan.receiver_base_path loaded into fresh storage.
StatusOr<ReceiverStack> LoadedBaseStack(const NodePlan& plan, std::shared_ptr<Device> device,
                                        const std::string& who) {
  if (plan.receiver_base_path.empty()) {
    return InvalidArgumentError("plan.receiver_base_path: required for a delta receiver");
  }
  if (device == nullptr) {
    DCR_ASSIGN_OR_RETURN(std::unique_ptr<BufferReceiver> host,
                         BufferReceiver::Load(plan.receiver_base_path));
    const StorageLayer layer(*host);
    return TrustOverStorage(plan, std::move(host), layer);
  }
  auto loaded = MakeDeviceReceiver(device, plan.receiver_base_path);
  if (!loaded.ok()) {
    return loaded.status().WithContext(who + " on device " + PlanDeviceName(plan) +
                                       ": loading the base");
  }
  const StorageLayer layer(**loaded);
  return TrustOverStorage(plan, std::move(*loaded), layer);
}

}  // namespace

StatusOr<ReceiverStack> OpenReceiverStack(const NodePlan& plan, int starts, ReceiverStack carried) {
  const bool delta = plan.method == "delta";
  const bool durable = delta && !plan.state_dir.empty();
  if (delta && !durable && carried.outer != nullptr && carried.held == nullptr) {
    // A stack kept from the version before: it stays up, with this version's floor.
    if (carried.trust != nullptr) {
      DCR_RETURN_IF_ERROR(AdoptPlanFloor(plan, carried.trust, &carried.floor));
    }
    return carried;
  }
  // Anything else kept from the version before is freed before the storage is loaded again.
  std::unique_ptr<HeldStorage> held = std::move(carried.held);
  carried = ReceiverStack();
  const std::string who = "receiver " + std::to_string(plan.rank);
  DCR_ASSIGN_OR_RETURN(std::shared_ptr<Device> device, OpenPlanDevice(plan, true, who));
  if (durable) return DurableStack(plan, std::move(device), starts, std::move(held));
  held.reset();
  if (delta) return LoadedBaseStack(plan, std::move(device), who);
  ReceiverStack stack;
  // Only slices the trainer's key signed (node_trust.h).
  DCR_ASSIGN_OR_RETURN(
      stack.outer,
      WithPlanFullTrust(plan, device == nullptr ? MakeFullReceiver() : MakeFullReceiver(device)));
  return stack;
}

StatusOr<ReceiverStack> LoadedReceiverStack(const NodePlan& plan, const Checkpoint& frame,
                                            uint64_t version) {
  const std::string who = "receiver " + std::to_string(plan.rank);
  DCR_ASSIGN_OR_RETURN(DeviceKind kind, ParseDeviceKind(plan.device));
  if (kind == DeviceKind::kCpu) {
    std::unique_ptr<BufferReceiver> host = BufferReceiver::Copy(frame, version);
    const StorageLayer layer(*host);
    return TrustOverStorage(plan, std::move(host), layer);
  }
  auto device = OpenDevice(kind, plan.device_index);
  if (!device.ok()) return device.status().WithContext(who + " on device " + plan.device);
  auto loaded = MakeDeviceReceiver(std::shared_ptr<Device>(std::move(*device)), frame, version);
  if (!loaded.ok()) {
    return loaded.status().WithContext(who + ": loading the full frame onto " + plan.device);
  }
  const StorageLayer layer(**loaded);
  return TrustOverStorage(plan, std::move(*loaded), layer);
}

ReceiverStack ReleaseReceiverStack(ReceiverStack stack) {
  if (stack.durable == nullptr) return stack;
  ReceiverStack kept;
  kept.held = stack.durable->TakeStorage();
  return kept;
}

}  // namespace dcr::internal
