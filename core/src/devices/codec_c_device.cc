// The *_device entry points of dcr/codec_c.h: the device a call names (OpenDevice for CUDA, kept
// open for the process per ordinal; a host backend over the call's own tensors, or a placement
// map's destination buffers, for "host"), then the work of receivers/codec_device.h over it.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dcr/codec_c.h"
#include "dcr/device.h"
#include "dcr/dtype.h"
#include "dcr/status_macros.h"
#include "receivers/c_error.h"
#include "receivers/codec_device.h"

namespace dcr {
namespace {

// The CUDA device `ordinal`, opened once per process and shared by every later call.
StatusOr<std::shared_ptr<Device>> CudaDevice(int ordinal) {
  static std::mutex mu;
  static std::map<int, std::shared_ptr<Device>>* open = new std::map<int, std::shared_ptr<Device>>;
  std::lock_guard<std::mutex> lock(mu);
  auto it = open->find(ordinal);
  if (it != open->end()) return it->second;
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<Device> d, OpenDevice(DeviceKind::kCuda, ordinal));
  std::shared_ptr<Device> shared(std::move(d));
  (*open)[ordinal] = shared;
  return shared;
}

using Ranges = std::vector<std::pair<const void*, uint64_t>>;

// The memory of the tensor sets `sets` (pointer, count): what a host backend adopts.
Ranges RangesOf(std::initializer_list<std::pair<const dcr_tensor*, size_t>> sets) {
  Ranges ranges;
  for (const auto& [t, n] : sets) {
    for (size_t i = 0; t != nullptr && i < n; ++i) ranges.emplace_back(t[i].data, t[i].nbytes);
  }
  return ranges;
}

// The device of a call whose device memory is `ranges`; null for DCR_DEVICE_CPU (or no device
// given): the host functions.
StatusOr<std::shared_ptr<Device>> DeviceOf(const dcr_device* device, Ranges ranges) {
  if (device == nullptr || device->kind == DCR_DEVICE_CPU) return std::shared_ptr<Device>();
  switch (device->kind) {
    case DCR_DEVICE_HOST: {
      if (device->ordinal != 0) {
        return InvalidArgumentError("device host has only ordinal 0, not " +
                                    std::to_string(device->ordinal));
      }
      return std::shared_ptr<Device>(internal::MakeHostDeviceOver(std::move(ranges)));
    }
    case DCR_DEVICE_CUDA:
      if (device->ordinal < 0) {
        return InvalidArgumentError("device cuda: negative ordinal " +
                                    std::to_string(device->ordinal));
      }
      return CudaDevice(device->ordinal);
    default:
      return InvalidArgumentError("unknown device kind " + std::to_string(device->kind) +
                                  " (DCR_DEVICE_CPU, DCR_DEVICE_HOST or DCR_DEVICE_CUDA)");
  }
}

dcr_codec_options Defaulted(const dcr_codec_options* options) {
  dcr_codec_options o;
  dcr_codec_options_init(&o);
  if (options != nullptr) o = *options;
  return o;
}

}  // namespace
}  // namespace dcr

extern "C" {

int dcr_encode_delta_device(const dcr_device* device, const dcr_tensor* base, size_t n_base,
                            const dcr_tensor* target, size_t n_target,
                            const dcr_codec_options* options, uint8_t** out, size_t* out_size) {
  if (out == nullptr || out_size == nullptr) {
    return dcr::internal::CFail(dcr::InvalidArgumentError("out and out_size are required"));
  }
  *out = nullptr;
  *out_size = 0;
  auto dev = dcr::DeviceOf(device, dcr::RangesOf({{base, n_base}, {target, n_target}}));
  if (!dev.ok()) return dcr::internal::CFail(dev.status().WithContext("encode"));
  if (*dev == nullptr) {
    return dcr_encode_delta(base, n_base, target, n_target, options, out, out_size);
  }
  auto bytes = dcr::internal::EncodeOnDevice(dev->get(), base, n_base, target, n_target,
                                             dcr::Defaulted(options));
  if (!bytes.ok()) return dcr::internal::CFail(bytes.status().WithContext("encode"));
  auto* p = static_cast<uint8_t*>(std::malloc(std::max<size_t>(bytes->size(), 1)));
  if (p == nullptr) {
    return dcr::internal::CFail(dcr::ResourceExhaustedError("encode: out of memory"));
  }
  std::memcpy(p, bytes->data(), bytes->size());
  *out = p;
  *out_size = bytes->size();
  return DCR_OK;
}

int dcr_apply_delta_device(const dcr_device* device, const dcr_tensor* tensors, size_t n,
                           const void* delta, size_t size, const dcr_codec_options* options,
                           dcr_apply_result* result) {
  auto dev = dcr::DeviceOf(device, dcr::RangesOf({{tensors, n}}));
  if (!dev.ok()) return dcr::internal::CFail(dev.status().WithContext("apply"));
  if (*dev == nullptr) return dcr_apply_delta(tensors, n, delta, size, options, result);
  dcr::Status s =
      dcr::internal::ApplyOnDevice(*dev, tensors, n, delta, size, dcr::Defaulted(options), result);
  if (!s.ok()) return dcr::internal::CFail(s.WithContext("apply on " + (*dev)->name()));
  return DCR_OK;
}

int dcr_tensors_hash_device(const dcr_device* device, const dcr_tensor* tensors, size_t n,
                            int32_t threads, uint64_t hash[2]) {
  if (hash == nullptr) return dcr::internal::CFail(dcr::InvalidArgumentError("hash is NULL"));
  auto dev = dcr::DeviceOf(device, dcr::RangesOf({{tensors, n}}));
  if (!dev.ok()) return dcr::internal::CFail(dev.status().WithContext("hash"));
  if (*dev == nullptr) return dcr_tensors_hash(tensors, n, threads, hash);
  auto h = dcr::internal::HashOnDevice(dev->get(), tensors, n, threads);
  if (!h.ok()) return dcr::internal::CFail(h.status().WithContext("hash"));
  hash[0] = h->lo;
  hash[1] = h->hi;
  return DCR_OK;
}

int dcr_placement_map_create_device(const dcr_device* device, const dcr_tensor* tensors, size_t n,
                                    const dcr_placement* placements, size_t n_placements,
                                    dcr_placement_map** out) {
  if (out == nullptr) return dcr::internal::CFail(dcr::InvalidArgumentError("out is NULL"));
  *out = nullptr;
  // The destination buffers, for the host backend (an unknown dtype or index is refused by the
  // map's own checks).
  dcr::Ranges ranges;
  for (size_t i = 0; placements != nullptr && i < n_placements; ++i) {
    const dcr_placement& p = placements[i];
    if (tensors == nullptr || p.tensor >= n || tensors[p.tensor].dtype == nullptr) continue;
    const int w = dcr::DTypeWidth(dcr::DTypeFromName(tensors[p.tensor].dtype));
    if (w > 0 && p.dst_elements <= (uint64_t{1} << 62) / static_cast<uint64_t>(w)) {
      ranges.emplace_back(p.dst, p.dst_elements * static_cast<uint64_t>(w));
    }
  }
  auto dev = dcr::DeviceOf(device, std::move(ranges));
  if (!dev.ok()) return dcr::internal::CFail(dev.status().WithContext("placement map"));
  if (*dev == nullptr) return dcr_placement_map_create(tensors, n, placements, n_placements, out);
  dcr::Status s =
      dcr::internal::CreatePlacementMapOnDevice(*dev, tensors, n, placements, n_placements, out);
  if (!s.ok()) return dcr::internal::CFail(s.WithContext("placement map"));
  return DCR_OK;
}

}  // extern "C"
