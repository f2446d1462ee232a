// `dcr s3-fault-proxy --spec FILE`: an HTTP-aware fault proxy in front of an S3 endpoint, a
// process of its own that `dcr run` (faults.s3_runs, run_s3_faults.h) puts between the nodes'
// S3 clients and the object store.
//
// The nodes' store spec names the proxy's plain-http address as the endpoint (allow_http: the
// proxy listens on loopback only); the proxy forwards each request to the upstream endpoint
// (http:// or https://, the upstream's certificate verified against `ca_file`) unchanged but
// for connection handling: the Host header, and so the request's SigV4 signature, is the
// client's. One request per connection: the proxy answers "Connection: close" and closes.
//
// Requests are counted per direction over all connections: an upload is a PUT of an object (or
// of a multipart part) with a body, a download a GET of an object. At the planned ones it
// injects, as a failing server, network or middle box would:
//   5xx       answers 503 SlowDown without forwarding the request (the body is read first)
//   cut       upload: reads half of the request body, then closes the connection;
//             download: forwards the response head and half of its body, then closes
//   stall     as cut, but holds the connection open, moving no byte, for `seconds` first (past
//             the client's read deadline), then closes
//   truncate  upload: forwards the request with its Content-Length halved and half of the body
//             (the server stores a short object and answers 200);
//             download: forwards the response with its Content-Length halved and half of the
//             body, a well-formed but short answer
//   bad_etag  forwards the request; the response's ETag is replaced by another MD5
// A download fault other than 5xx waits for a download whose response is a 2xx with a body of
// at least 2 bytes (the first at or after its planned request). Each injected fault is appended
// to the spec's log file (JSON, rewritten atomically at each injection), which `dcr run` reads
// to count the faults injected per kind.
//
// Thread safety: RunS3FaultProxy runs the whole process (one thread per connection); one call
// per process.
#ifndef DCR_TOOLS_FAULTS_S3_FAULT_PROXY_H_
#define DCR_TOOLS_FAULTS_S3_FAULT_PROXY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr::cli {

// One planned fault: `kind` (one of S3FaultKinds) on the `at_request`-th (1-based) request of
// `direction` ("upload" or "download"); `seconds` for stall.
struct S3ProxyFault {
  std::string kind;
  std::string direction;
  uint64_t at_request = 1;
  double seconds = 0;
};

struct S3FaultProxySpec {
  std::string listen;    // host:port the clients dial (plain http)
  std::string upstream;  // "http://host:port" or "https://host:port"
  std::string ca_file;   // https upstream: CAs of its certificate ("" = the system's)
  std::vector<S3ProxyFault> faults;
  std::string log_path;  // the injected faults (JSON)
};

// The HTTP fault kinds of the proxy: 5xx, cut, stall, truncate, bad_etag.
const std::vector<std::string>& S3FaultKinds();

std::string S3FaultProxySpecToJson(const S3FaultProxySpec& spec);
// kInvalidArgument for malformed JSON, a missing key, an unknown kind or direction.
StatusOr<S3FaultProxySpec> S3FaultProxySpecFromJson(const std::string& json);

// Serves until SIGTERM or SIGINT. Errors: the listen address cannot be bound, the upstream is
// not http(s)://host:port, the CA file cannot be loaded, the log cannot be written.
Status RunS3FaultProxy(const S3FaultProxySpec& spec);

}  // namespace dcr::cli

#endif  // DCR_TOOLS_FAULTS_S3_FAULT_PROXY_H_
