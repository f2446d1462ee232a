// Process hardening for the holders of private keys (internal).
//
// Thread safety: ProtectKeyHolder may be called from any thread, any number of times.
#ifndef DCR_CORE_SRC_INTERNAL_KEY_HOLDER_H_
#define DCR_CORE_SRC_INTERNAL_KEY_HOLDER_H_

#include "dcr/status.h"

namespace dcr::internal {

// Keeps the private keys of this process out of core dumps and out of reach of other processes
// of the same user: prctl(PR_SET_DUMPABLE, 0) (no core dump; /proc/PID/mem, maps, environ and
// ptrace refused to anyone without CAP_SYS_PTRACE; /proc/PID owned by root) and RLIMIT_CORE 0,
// soft and hard. Called where a private key is read or made (SigningKey::Load, Generate and
// FromSeed; the TLS credentials of a node; the CA key of `dcr keys`), so that every process that
// holds one is protected from that moment and a process that never holds one keeps its core
// dumps. The first call does the work; later calls return its result. kInternal naming the call
// that failed (the caller then does not use the key).
Status ProtectKeyHolder();

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_INTERNAL_KEY_HOLDER_H_
