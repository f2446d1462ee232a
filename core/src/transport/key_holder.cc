// Process hardening for the holders of private keys (see internal/key_holder.h). In the
// transport library, the lowest one that loads keys (TLS credentials); the trust library's
// signing keys call it too.
#include "internal/key_holder.h"

#include <sys/prctl.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>

namespace dcr::internal {

Status ProtectKeyHolder() {
  static std::once_flag once;
  static Status* result = nullptr;
  std::call_once(once, [] {
    result = new Status();
    const rlimit none{0, 0};
    if (setrlimit(RLIMIT_CORE, &none) != 0) {
      *result = InternalError(std::string("setrlimit(RLIMIT_CORE, 0) for a process holding a "
                                          "private key: ") +
                              std::strerror(errno));
    } else if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) {
      *result = InternalError(std::string("prctl(PR_SET_DUMPABLE, 0) for a process holding a "
                                          "private key: ") +
                              std::strerror(errno));
    }
  });
  return *result;
}

}  // namespace dcr::internal
