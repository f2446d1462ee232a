// Kernels of dcr::cuda. The per-element logic is internal/element_ops.h (shared with the CPU).
#include <cub/device/device_scan.cuh>

#include "common.cuh"
#include "internal/element_ops.h"
#include "kernels.cuh"

namespace dcr {
namespace cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(uint64_t n) {
  uint64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b > 65535 * 16 ? 65535 * 16 : (b == 0 ? 1 : b));
}

__device__ inline uint64_t LoadAt(uint64_t addr, int width) {
  return internal::LoadElem(reinterpret_cast<const uint8_t*>(addr), width, 0);
}

__global__ void GatherKernel(const uint64_t* read_addr, const uint64_t* values, uint64_t* old_bits,
                             uint64_t* new_bits, uint64_t n, int width, uint8_t mode) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t o = LoadAt(read_addr[i], width);
    old_bits[i] = o;
    new_bits[i] = internal::ApplyOp(mode, width, o, values[i]);
  }
}

__global__ void ScatterKernel(const uint64_t* write_addr, const uint64_t* write_begin,
                              const uint64_t* new_bits, uint64_t n, int width) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    for (uint64_t k = write_begin[i]; k < write_begin[i + 1]; ++k) {
      internal::StoreElem(reinterpret_cast<uint8_t*>(write_addr[k]), width, 0, new_bits[i]);
    }
  }
}

__global__ void CompareKernel(const uint8_t* a, const uint8_t* b, uint64_t n, int width,
                              uint32_t* flags) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    flags[i] = internal::LoadElem(a, width, i) != internal::LoadElem(b, width, i);
  }
}

__global__ void CompactKernel(const uint8_t* a, const uint8_t* b, uint64_t n, int width,
                              uint8_t mode, const uint32_t* flags, const uint64_t* index,
                              uint64_t* pos, uint64_t* val, uint64_t* old_bits,
                              uint64_t* new_bits) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    if (!flags[i]) continue;
    const uint64_t o = internal::LoadElem(a, width, i), nb = internal::LoadElem(b, width, i);
    const uint64_t k = index[i];
    pos[k] = i;
    val[k] = internal::EncodeValue(mode, width, o, nb);
    old_bits[k] = o;
    new_bits[k] = nb;
  }
}

__global__ void RangeHashKernel(uint64_t salt, const uint8_t* data, int width, uint64_t begin,
                                uint64_t count, unsigned long long* acc) {
  __shared__ unsigned long long lo_s[kThreads], hi_s[kThreads];
  uint64_t lo = 0, hi = 0;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < count;
       i += uint64_t{gridDim.x} * blockDim.x) {
    uint64_t a, b;
    internal::ElementTermLanes(salt, begin + i, internal::LoadElem(data, width, begin + i), &a, &b);
    lo += a;
    hi += b;
  }
  lo_s[threadIdx.x] = lo;
  hi_s[threadIdx.x] = hi;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      lo_s[threadIdx.x] += lo_s[threadIdx.x + s];
      hi_s[threadIdx.x] += hi_s[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    atomicAdd(&acc[0], lo_s[0]);  // wraps mod 2^64 like the host sum
    atomicAdd(&acc[1], hi_s[0]);
  }
}

// 8-byte words where both ranges are 8-byte aligned (the first differing byte of a word is its
// lowest set byte of a ^ b: little-endian), single bytes otherwise and for the tail.
__global__ void FirstDifferenceKernel(const uint8_t* a, const uint8_t* b, uint64_t bytes,
                                      bool words, unsigned long long* first) {
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  const uint64_t start = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x;
  uint64_t tail = 0;
  if (words) {
    const uint64_t nw = bytes / 8;
    const auto* wa = reinterpret_cast<const unsigned long long*>(a);
    const auto* wb = reinterpret_cast<const unsigned long long*>(b);
    for (uint64_t i = start; i < nw; i += stride) {
      const unsigned long long x = wa[i] ^ wb[i];
      if (x != 0) atomicMin(first, i * 8 + static_cast<unsigned long long>((__ffsll(x) - 1) / 8));
    }
    tail = nw * 8;
  }
  for (uint64_t i = tail + start; i < bytes; i += stride) {
    if (a[i] != b[i]) atomicMin(first, static_cast<unsigned long long>(i));
  }
}

}  // namespace

Status LaunchFirstDifference(const void* a, const void* b, uint64_t bytes,
                             unsigned long long* first, cudaStream_t s) {
  if (bytes == 0) return Status::OK();
  const bool words = ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) & 7) == 0;
  FirstDifferenceKernel<<<Blocks(words ? bytes / 8 + 1 : bytes), kThreads, 0, s>>>(
      static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(b), bytes, words, first);
  return CudaStatus(cudaGetLastError(), "first difference kernel");
}

Status LaunchGather(const uint64_t* read_addr, const uint64_t* values, uint64_t* old_bits,
                    uint64_t* new_bits, uint64_t n, int width, uint8_t mode, cudaStream_t s) {
  if (n == 0) return Status::OK();
  GatherKernel<<<Blocks(n), kThreads, 0, s>>>(read_addr, values, old_bits, new_bits, n, width,
                                              mode);
  return CudaStatus(cudaGetLastError(), "gather kernel");
}

Status LaunchScatter(const uint64_t* write_addr, const uint64_t* write_begin,
                     const uint64_t* new_bits, uint64_t n, int width, cudaStream_t s) {
  if (n == 0) return Status::OK();
  ScatterKernel<<<Blocks(n), kThreads, 0, s>>>(write_addr, write_begin, new_bits, n, width);
  return CudaStatus(cudaGetLastError(), "scatter kernel");
}

Status LaunchCompare(const void* a, const void* b, uint64_t n, int width, uint32_t* flags,
                     cudaStream_t s) {
  if (n == 0) return Status::OK();
  CompareKernel<<<Blocks(n), kThreads, 0, s>>>(static_cast<const uint8_t*>(a),
                                               static_cast<const uint8_t*>(b), n, width, flags);
  return CudaStatus(cudaGetLastError(), "compare kernel");
}

Status LaunchCompact(const void* a, const void* b, uint64_t n, int width, uint8_t mode,
                     const uint32_t* flags, const uint64_t* index, uint64_t* pos, uint64_t* val,
                     uint64_t* old_bits, uint64_t* new_bits, cudaStream_t s) {
  if (n == 0) return Status::OK();
  CompactKernel<<<Blocks(n), kThreads, 0, s>>>(static_cast<const uint8_t*>(a),
                                               static_cast<const uint8_t*>(b), n, width, mode,
                                               flags, index, pos, val, old_bits, new_bits);
  return CudaStatus(cudaGetLastError(), "compact kernel");
}

Status ExclusiveScan(const uint32_t* flags, uint64_t* index, uint64_t n, cudaStream_t s) {
  if (n == 0) return Status::OK();
  size_t temp = 0;
  DCR_CUDA_RETURN_IF_ERROR(cub::DeviceScan::ExclusiveSum(nullptr, temp, flags, index, n, s));
  void* d_temp = nullptr;
  DCR_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&d_temp, temp, s));
  cudaError_t e = cub::DeviceScan::ExclusiveSum(d_temp, temp, flags, index, n, s);
  cudaFreeAsync(d_temp, s);
  return CudaStatus(e, "exclusive scan");
}

Status LaunchRangeHash(uint64_t salt, const void* data, int width, uint64_t begin, uint64_t count,
                       unsigned long long* acc, cudaStream_t s) {
  if (count == 0) return Status::OK();
  RangeHashKernel<<<Blocks(count), kThreads, 0, s>>>(salt, static_cast<const uint8_t*>(data), width,
                                                     begin, count, acc);
  return CudaStatus(cudaGetLastError(), "range hash kernel");
}

}  // namespace cuda
}  // namespace dcr
