// Kernels of dcr::cuda: apply (gather/scatter), diff (compare + compact), range hash, byte compare.
#ifndef DCR_CORE_CUDA_KERNELS_CUH_
#define DCR_CORE_CUDA_KERNELS_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "dcr/status.h"

namespace dcr {
namespace cuda {

// new[i] = ApplyOp(mode, width, *read_addr[i], values[i]); old[i] = *read_addr[i].
Status LaunchGather(const uint64_t* read_addr, const uint64_t* values, uint64_t* old_bits,
                    uint64_t* new_bits, uint64_t n, int width, uint8_t mode, cudaStream_t s);
// For every change i, writes new_bits[i] at write_addr[write_begin[i] .. write_begin[i+1]).
Status LaunchScatter(const uint64_t* write_addr, const uint64_t* write_begin,
                     const uint64_t* new_bits, uint64_t n, int width, cudaStream_t s);
// flags[i] = old[i] != new[i] (elements of `width` bytes).
Status LaunchCompare(const void* a, const void* b, uint64_t n, int width, uint32_t* flags,
                     cudaStream_t s);
// For flagged i: out at index[i] (exclusive prefix of flags) gets position i, value, old, new.
Status LaunchCompact(const void* a, const void* b, uint64_t n, int width, uint8_t mode,
                     const uint32_t* flags, const uint64_t* index, uint64_t* pos, uint64_t* val,
                     uint64_t* old_bits, uint64_t* new_bits, cudaStream_t s);
// index[i] = sum of flags[0..i) (exclusive prefix sum; temporary storage allocated internally).
Status ExclusiveScan(const uint32_t* flags, uint64_t* index, uint64_t n, cudaStream_t s);
// acc[0..1] += sum of ElementTerm lanes over elements [begin, begin+count).
Status LaunchRangeHash(uint64_t salt, const void* data, int width, uint64_t begin, uint64_t count,
                       unsigned long long* acc, cudaStream_t s);

// *first = min(*first, index of the first byte where a[0, bytes) and b[0, bytes) differ); left as
// is when they are equal (the caller sets it to `bytes` first).
Status LaunchFirstDifference(const void* a, const void* b, uint64_t bytes,
                             unsigned long long* first, cudaStream_t s);

}  // namespace cuda
}  // namespace dcr

#endif  // DCR_CORE_CUDA_KERNELS_CUH_
