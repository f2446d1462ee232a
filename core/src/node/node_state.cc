// NodeState and the node's shared helpers (node_state.h).
#include "node/node_state.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dcr/delta.h"
#include "dcr/device.h"
#include "dcr/node.h"
#include "dcr/receiver.h"
#include "dcr/relay_policy.h"
#include "dcr/statusor.h"
#include "dcr/transport.h"
#include "internal/safetensors.h"
#include "node/blob_resume.h"
#include "node/blob_spool.h"
#include "node/metrics.h"
#include "transport/net.h"

namespace dcr::internal {

uint64_t MaxBlobBytes(const NodePlan& plan, BlobKind kind) {
  constexpr uint64_t kMetaCap = internal::kMaxSafetensorsHeaderBytes + (64 << 10);
  if (kind != BlobKind::kChunk) return kMetaCap;
  const uint64_t cap = std::numeric_limits<uint64_t>::max() / 2;
  if (plan.method == "full")
    return std::max<uint64_t>(std::min(cap, plan.full_slice_bytes), 4096) + 8;
  return std::min(cap / 96, plan.chunk_elems) * 96 + (1 << 20);
}

std::string PlanDeviceName(const NodePlan& plan) {
  return plan.device + ":" + std::to_string(plan.device_index);
}

StatusOr<std::shared_ptr<Device>> OpenPlanDevice(const NodePlan& plan, bool use,
                                                 const std::string& who) {
  auto kind = ParseDeviceKind(plan.device);
  if (!kind.ok()) return kind.status().WithContext("plan.device");
  if (!use || *kind == DeviceKind::kCpu) return std::shared_ptr<Device>();
  auto opened = OpenDevice(*kind, plan.device_index);
  if (!opened.ok()) return opened.status().WithContext(who + " on device " + PlanDeviceName(plan));
  return std::shared_ptr<Device>(std::move(*opened));
}

BlobPtr NodeState::GetOrCreate(const BlobInfo& info) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blobs_.find(info.id);
  if (it != blobs_.end()) return it->second;
  auto b = std::make_shared<BlobBuf>();
  b->info = info;
  try {
    b->bytes.resize(info.size);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
  blobs_[info.id] = b;
  return b;
}

void NodeState::Store(const BlobPtr& b) {
  std::lock_guard<std::mutex> lock(mu_);
  blobs_[b->info.id] = b;
  internal::HeldRanges whole;
  whole.Add(0, b->info.size);
  ranges_[b->info.id] = whole;
}

void NodeState::Restore(internal::BlobSpool::Restored r) {
  auto b = std::make_shared<BlobBuf>();
  b->info = r.info;
  b->bytes = std::move(r.bytes);
  std::lock_guard<std::mutex> lock(mu_);
  blobs_[b->info.id] = b;
  ranges_[b->info.id] = r.held;
}

std::vector<BlobPtr> NodeState::All() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<BlobPtr> out;
  for (auto& [id, b] : blobs_) out.push_back(b);
  return out;
}

internal::NodeMetrics NodeState::Metrics() {
  std::lock_guard<std::mutex> lock(mu_);
  internal::NodeMetrics m = metrics_;
  m.bytes_received = result_->bytes_received;
  m.bytes_sent = result_->bytes_sent;
  m.bytes_sent_long = result_->bytes_sent_long;
  m.apply_seconds = result_->apply_seconds;
  m.last_byte_at = result_->t_last_blob;
  m.starts = static_cast<uint64_t>(result_->starts);
  m.fallbacks = result_->fallbacks;
  m.reloads = result_->reloads;
  m.now = WallNow();
  return m;
}

}  // namespace dcr::internal
