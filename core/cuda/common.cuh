// Shared CUDA helpers of dcr::cuda: error handling that never aborts.
#ifndef DCR_CORE_CUDA_COMMON_CUH_
#define DCR_CORE_CUDA_COMMON_CUH_

#include <cuda_runtime.h>

#include <string>

#include "dcr/status.h"

namespace dcr {
namespace cuda {

// Turns a CUDA error into a Status (kUnavailable for "no device"/driver errors, kInternal
// otherwise) and clears the sticky error so the process can go on.
inline Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::OK();
  cudaGetLastError();
  std::string msg = std::string(what) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) return UnavailableError(msg);
  if (e == cudaErrorMemoryAllocation) return ResourceExhaustedError(msg);
  return InternalError(msg);
}

}  // namespace cuda
}  // namespace dcr

#define DCR_CUDA_RETURN_IF_ERROR(expr)                                       \
  do {                                                                       \
    ::dcr::Status dcr_cuda_status_ = ::dcr::cuda::CudaStatus((expr), #expr); \
    if (!dcr_cuda_status_.ok()) return dcr_cuda_status_;                     \
  } while (0)

#endif  // DCR_CORE_CUDA_COMMON_CUH_
