// Internal: mutual TLS 1.3 for relay-tree edges (OpenSSL 3), and the per-run credentials it uses.
//
// Trust model. Every run has its own certificate authority: an Ed25519 CA key and certificate,
// and one certificate per rank signed by it, whose subjectAltName is the URI
//   dcr://<run id>/<role>/<rank>        role: sender | relay | receiver
// (the role the rank has in the run's tree: rank 0 sends, a rank with children relays, the
// others receive). A node trusts only its run's CA certificate, and a peer only when
//   - the peer's certificate chains to that CA (so a certificate of another run fails), and
//   - it names the node's own run id (read from the node's own certificate), and
//   - its role is one the edge allows: a node accepts its parent's connection only from a sender
//     or a relay; a parent accepts a child only as a relay or a receiver; and
//   - its rank is the one the connection claims (the parent's hello, the child's plan address).
// Authorization is by role, not by a fixed edge list: any relay of the run may feed any node of
// the run, so a tree that is re-shaped (re-parenting, late joiners) needs no new certificates.
//
// A certificate authority per run rather than a pre-shared key: a PSK is one secret that every
// node holds, so any node (a receiver) could impersonate the sender; certificates give every rank
// its own key, bind its role, and let a cluster hand each host only its own key (the CA key never
// leaves the machine that ran `dcr keys`).
//
// Thread safety: TlsContext is immutable after Load and may be shared by every thread; a Conn
// (net.h) serialises its own use of its SSL object.
#ifndef DCR_CORE_SRC_TRANSPORT_TLS_H_
#define DCR_CORE_SRC_TRANSPORT_TLS_H_

#include <memory>
#include <string>
#include <vector>

#include "dcr/status.h"
#include "dcr/statusor.h"

struct ssl_st;
struct ssl_ctx_st;

namespace dcr::internal {

// What a node certificate says about its holder.
struct TlsIdentity {
  std::string run_id;
  std::string role;  // "sender" | "relay" | "receiver"
  int rank = -1;
};

// The roles a peer may have on each end of an edge.
enum class TlsPeer { kParent, kChild };

class TlsContext {
 public:
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  // Loads the run's CA certificate, this node's certificate and its private key (PEM files).
  // Errors: kNotFound (a file is missing), kFailedPrecondition (the key file is readable by group
  // or others, the key does not match the certificate, the certificate is not a dcr node
  // certificate or not signed by the CA), kInvalidArgument (unparsable PEM).
  static StatusOr<std::shared_ptr<const TlsContext>> Load(const std::string& ca_path,
                                                          const std::string& cert_path,
                                                          const std::string& key_path);

  const TlsIdentity& self() const { return self_; }

  // A new SSL object on `fd` (a non-blocking TCP socket), client (connecting) or server side.
  // The socket is written with MSG_NOSIGNAL. Null when OpenSSL cannot allocate it.
  ssl_st* NewSsl(int fd, bool server) const;

  // Commit-report signatures. A receiver signs its report's body with its node key; the tail field
  // this returns carries its certificate and the signature (u32 kind 1 | u32 size | u32 cert_size
  // | certificate DER | 64-byte Ed25519 signature), so the sender can check it against the run's
  // CA without holding every rank's certificate. kInternal only if OpenSSL fails.
  StatusOr<std::vector<uint8_t>> SignReport(const uint8_t* body, size_t size) const;
  // OK when `tail` holds a signature field whose certificate chains to this run's CA, names this
  // run, the role relay or receiver and rank `rank`, and whose key signed `body`. Other tail
  // fields are skipped. kFailedPrecondition naming what failed (no signature, a certificate of
  // another run or rank, a bad signature); kDataLoss for a malformed field.
  Status CheckReportSignature(const uint8_t* tail, size_t tail_size, const uint8_t* body,
                              size_t size, int rank) const;

  // After a completed handshake: the peer's identity when its certificate chains to this run's
  // CA, names this run and has a role allowed for `peer`. Refusals are kFailedPrecondition
  // naming what was wrong (no certificate, verify result, run, role).
  StatusOr<TlsIdentity> CheckPeer(ssl_st* ssl, TlsPeer peer) const;

 private:
  TlsContext() = default;
  ssl_ctx_st* ctx_ = nullptr;
  TlsIdentity self_;
};

// Drives the handshake of `ssl` on non-blocking `fd` until it completes or `deadline` (steady
// seconds) passes. With `idle_s` > 0 it also ends when the socket stays not ready for `idle_s`
// seconds while the handshake waits on it: the limit is on silence, so a handshake whose peer
// answers every flight, however slowly in all (a host under load), completes within `deadline`.
// kUnavailable with OpenSSL's reason (e.g. "certificate verify failed"), kDeadlineExceeded
// saying which limit passed.
Status TlsHandshake(ssl_st* ssl, int fd, double deadline, double idle_s = 0);

// The last OpenSSL error queue entries as text (and clears the queue).
std::string TlsErrors();

// A deployment id: 16 lowercase hex digits (64 bits, never all zero) from the system's random
// source. One deployment (`dcr keys`, or one `dcr run` invocation) has one: its certificates
// name it (dcr://<id>/<role>/<rank>), its trainer signs it into every manifest
// (Manifest::run_id, RunIdValue), and its nodes keep their state and floors under it.
StatusOr<std::string> NewRunId();
// The manifest run id (NodePlan::run_id) of deployment id `id`: its 16 hex digits as a number.
// kInvalidArgument for anything but 16 hex digits, or all zero.
StatusOr<uint64_t> RunIdValue(const std::string& id);
// The deployment id of manifest run id `run_id` (16 lowercase hex digits).
std::string RunIdText(uint64_t run_id);
// The deployment id named by the certificate at `cert_path` (its dcr://<id>/... subjectAltName).
// Errors: kNotFound, kInvalidArgument (not a PEM certificate), kFailedPrecondition (no dcr://
// name).
StatusOr<std::string> CertificateRunId(const std::string& cert_path);

// The role of every rank of a tree (parents[0] == -1): "sender", "relay" or "receiver".
std::vector<std::string> TreeRoles(const std::vector<int>& parents);

// Creates `dir` (0700) if missing and checks that it is a directory owned by the caller and not
// writable by group or others (kFailedPrecondition otherwise): where credentials may be written.
Status PrepareCredentialDir(const std::string& dir);

// Writes a fresh run CA and one certificate per rank into `dir` (created 0700 if missing; it
// must be owned by the caller and not writable by others):
//   ca.crt, ca.key, node-<rank>.crt, node-<rank>.key      (keys 0600, certificates 0644)
// `roles[r]` is rank r's role. Files are created exclusively (O_EXCL | O_NOFOLLOW): an existing
// file is an error (kFailedPrecondition naming it) unless `replace` is set, in which case the
// old files of these names are removed first. Certificates are valid for `valid_days`.
Status WriteRunCredentials(const std::string& dir, const std::string& run_id,
                           const std::vector<std::string>& roles, int valid_days, bool replace);

// Mints one more certificate of the run whose credentials WriteRunCredentials wrote into `dir`
// (its ca.crt, ca.key and node-0.crt, whose run id it takes): an identity `role`/`rank` of that
// run, signed by its CA, written as <dir>/<name>.crt and <name>.key (0600; replaced if present).
// A fault proxy on a tree edge (`dcr fault-proxy`) presents such certificates: an authenticated
// middle box, trusted as the edge's ends are. Errors: those of reading the files (kNotFound,
// kInvalidArgument for unparsable PEM), kInternal if OpenSSL fails, errno codes.
Status WriteExtraCredential(const std::string& dir, const std::string& role, int rank,
                            const std::string& name, int valid_days);

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_TRANSPORT_TLS_H_
