// The calling thread's last error of the C API (dcr_last_error, dcr/dcr_c.h), shared by the C
// entry points of dcr::receivers.
//
// Thread safety: the message is thread-local.
#ifndef DCR_CORE_SRC_RECEIVERS_C_ERROR_H_
#define DCR_CORE_SRC_RECEIVERS_C_ERROR_H_

#include "dcr/status.h"

namespace dcr::internal {

// Records `s` as the calling thread's last error and returns its code (a dcr_c.h status code).
// REQUIRES: !s.ok().
int CFail(const Status& s);

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_RECEIVERS_C_ERROR_H_
