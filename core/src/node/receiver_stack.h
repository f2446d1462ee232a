// The receiver stack of a node: the receiver.h layers a record passes through, built in one
// place and handed around as one value that names each layer the node uses by its type, so
// that no layer is looked for again behind another.
//
// A delta receiver's stack, outermost first:
//   * trust: a TrustedReceiver (dcr/signing.h) with the plan's key, run and version floor
//     (node_trust.h WithPlanTrust); without a trust key it checks nothing;
//   * with plan.state_dir, the durable layers (node_recovery.h DurableReceiver): the target
//     header kept, the journal, the storage's durability hooks, the version log; the fault
//     points' chunk layers around the journal only in a process that installed fault points
//     (fault_points.h, the test build dcr-node-faults);
//   * storage: a BufferReceiver (host memory, device "cpu") or a DeviceReceiver.
// A full-stream receiver's stack is its trust layer (node_trust.h WithPlanFullTrust) over a
// full receiver (dcr/receiver.h MakeFullReceiver), which has no storage layer of its own.
//
// Thread safety: a ReceiverStack is moved and queried from one thread at a time (a node's event
// thread, then the next version's); its layers are called as receiver.h says.
#ifndef DCR_CORE_SRC_NODE_RECEIVER_STACK_H_
#define DCR_CORE_SRC_NODE_RECEIVER_STACK_H_

#include <cstdint>
#include <memory>

#include "dcr/checkpoint.h"
#include "dcr/device.h"
#include "dcr/node.h"
#include "dcr/receiver.h"
#include "dcr/signing.h"
#include "dcr/statusor.h"
#include "node/node_recovery.h"

namespace dcr::internal {

// The storage layer of a stack: host memory or a device's memory (both null: none, a full-stream
// receiver). Converts from either receiver, so a bare storage can stand for a stack's.
struct StorageLayer {
  StorageLayer() = default;
  StorageLayer(const BufferReceiver& h) : host(&h) {}    // NOLINT(google-explicit-constructor)
  StorageLayer(const DeviceReceiver& d) : device(&d) {}  // NOLINT(google-explicit-constructor)
  const BufferReceiver* host = nullptr;
  const DeviceReceiver* device = nullptr;
  // The storage as a receiver (null for none).
  const Receiver* receiver() const;
};

struct ReceiverStack {
  // The members are destroyed in reverse order: `outer` (and the layers it owns) before the
  // floor and the durable layers it points to.
  std::unique_ptr<VersionFloor> floor;       // the trust layer's version floor (null: none)
  std::unique_ptr<DurableReceiver> durable;  // the durable layers (null without a state dir)
  std::unique_ptr<Receiver> outer;           // the outermost layer: every blob goes in here
  TrustedReceiver* trust = nullptr;          // the delta trust layer in `outer` (null: full)
  StorageLayer storage;                      // the storage under every layer (none: full)
  // A durable storage between two versions of one process (DurableReceiver::TakeStorage), with
  // no layer over it: the next version's OpenReceiverStack builds them again.
  std::unique_ptr<HeldStorage> held;

  // Whether the stack holds nothing (no layer, no held storage).
  bool empty() const { return outer == nullptr && held == nullptr; }
};

// The receiver stack of `plan` (a receiver: plan.rank > 0), in host memory for device "cpu",
// else in the memory of OpenDevice(plan.device, plan.device_index):
//   * delta with plan.state_dir: trust over the durable layers at start number `starts` (fault
//     points where a fault build installed them), on `carried.held` when it holds the base
//     (DurableReceiver::Open), anything else of `carried` freed first;
//   * delta, `carried` a stack of the version before (not empty, no held storage): that stack,
//     its version floor loaded afresh from plan.version_floor_path and its signed state path
//     set for `plan` (AdoptPlanFloor), no device opened;
//   * delta otherwise: trust over plan.receiver_base_path loaded into the storage (a device
//     that cannot be opened or cannot hold the base fails here, before the node takes part);
//   * full: the full-stream trust layer over a full receiver (the file image, loaded onto the
//     device at commit).
// Errors: OpenPlanDevice's, DurableReceiver::Open's, the base's load (named with the device),
// WithPlanTrust's and WithPlanFullTrust's, AdoptPlanFloor's; kInvalidArgument without
// plan.receiver_base_path for a delta.
StatusOr<ReceiverStack> OpenReceiverStack(const NodePlan& plan, int starts, ReceiverStack carried);

// The stack of a receiver that loaded `frame` whole as version `version` (a full frame from the
// in-region store): its tensors copied into host memory on device "cpu", else loaded onto the
// plan's device; trust for the plan over them. Errors: the device's (named), WithPlanTrust's.
StatusOr<ReceiverStack> LoadedReceiverStack(const NodePlan& plan, const Checkpoint& frame,
                                            uint64_t version);

// What a stack hands to the next version of its process once nothing calls it: a durable
// stack's storage and version log when the storage holds the version the log committed
// (DurableReceiver::TakeStorage; an empty stack otherwise); any other stack as it is.
ReceiverStack ReleaseReceiverStack(ReceiverStack stack);

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_NODE_RECEIVER_STACK_H_
