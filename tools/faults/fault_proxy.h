// `dcr fault-proxy --spec FILE`: a fault proxy on one relay-tree edge, a process of its own that
// `dcr run` (faults.proxy_runs, run_proxy_faults.h) puts between a parent and a child node.
//
// The parent dials the proxy instead of the child (its plan names the proxy's address for the
// child); for every connection the proxy accepts, it dials the child and forwards the dcr wire
// frames (transport/net.h: 64-byte header, then `length` payload bytes) both ways, parsing each
// one. Under mutual TLS (the default of `dcr run`) it terminates TLS on both sides with
// certificates minted for it from the run's CA (tls.h WriteExtraCredential): towards the parent
// it is the child (its role and rank), towards the child the parent. It is an authenticated but
// faulty middle box: what it alters is what a relay's bugs, a bad NIC or memory error behind the
// TLS endpoint would alter, so the product's own checks (chunk hashes, the signed manifest, the
// wire checks, read deadlines) are what must catch it.
//
// At seeded points -- the n-th chunk piece frame that goes from the parent to the child, counted
// over all of the edge's connections -- it injects:
//   corrupt    flips bytes of the piece's payload
//   duplicate  forwards the piece frame twice
//   reorder    holds the piece and forwards the next frame of that connection before it
//   delay      holds the frame for `seconds` before forwarding it (that connection stalls)
//   drop       closes that connection on both sides
//   partition  blackholes the edge for `seconds`: every byte of its connections, both ways, is
//              read and discarded (nothing closes, so only the nodes' read deadlines notice);
//              at the window's end those connections are closed, as a healed path resets them
// Each injected fault is appended to the spec's log file (JSON, rewritten atomically at each
// injection), which `dcr run` reads to count the faults injected per kind.
//
// Thread safety: RunFaultProxy runs the whole process (one thread per direction of each
// connection); one call per process.
#ifndef DCR_TOOLS_FAULTS_FAULT_PROXY_H_
#define DCR_TOOLS_FAULTS_FAULT_PROXY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr::cli {

// One fault of a proxy: `kind` (one of FrameFaultKinds) at the `at_piece`-th chunk piece frame
// (1-based) from the parent; `seconds` for delay and partition.
struct ProxyFault {
  std::string kind;
  uint64_t at_piece = 1;
  double seconds = 0;
};

struct FaultProxySpec {
  std::string listen;  // host:port the parent dials
  std::string target;  // host:port of the child
  int parent = 0;      // ranks of the edge's ends
  int child = 1;
  // Mutual TLS (all empty: plain TCP): the run's CA, the pair presented to the parent (the
  // child's role and rank) and the pair presented to the child (the parent's role and rank).
  std::string tls_ca, accept_cert, accept_key, connect_cert, connect_key;
  std::vector<ProxyFault> faults;
  uint64_t seed = 1;     // which bytes a corrupt fault flips
  std::string log_path;  // the injected faults (JSON)
};

// The frame-level fault kinds a proxy injects.
const std::vector<std::string>& FrameFaultKinds();

std::string FaultProxySpecToJson(const FaultProxySpec& spec);
// kInvalidArgument for malformed JSON, a missing key or an unknown fault kind.
StatusOr<FaultProxySpec> FaultProxySpecFromJson(const std::string& json);

// Serves the edge until SIGTERM or SIGINT, then closes every connection and writes the log.
// Errors: the listen address cannot be bound, the TLS files cannot be loaded, the log cannot be
// written.
Status RunFaultProxy(const FaultProxySpec& spec);

}  // namespace dcr::cli

#endif  // DCR_TOOLS_FAULTS_FAULT_PROXY_H_
