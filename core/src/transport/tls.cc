#include "transport/tls.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "dcr/status_macros.h"
#include "internal/key_holder.h"
#include "internal/own_directory.h"
#include "transport/net.h"

namespace dcr::internal {

namespace {

constexpr char kUriPrefix[] = "dcr://";

struct Free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
  void operator()(BIGNUM* p) const { BN_free(p); }
  void operator()(GENERAL_NAMES* p) const { GENERAL_NAMES_free(p); }
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
};
template <class T>
using Owned = std::unique_ptr<T, Free>;

// ---- a socket BIO that never raises SIGPIPE ----
// OpenSSL's socket BIO writes with write(2): a peer that closed would kill the process with
// SIGPIPE. This one sends with MSG_NOSIGNAL and reports EAGAIN as a retry.

int SockWrite(BIO* b, const char* data, int len) {
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(b)));
  BIO_clear_retry_flags(b);
  ssize_t n = send(fd, data, static_cast<size_t>(len), MSG_NOSIGNAL);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    BIO_set_retry_write(b);
    return -1;
  }
  return static_cast<int>(n);
}

int SockRead(BIO* b, char* data, int len) {
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(b)));
  BIO_clear_retry_flags(b);
  ssize_t n = recv(fd, data, static_cast<size_t>(len), 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    BIO_set_retry_read(b);
    return -1;
  }
  return static_cast<int>(n);
}

long SockCtrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }

int SockCreate(BIO* b) {
  BIO_set_init(b, 1);
  return 1;
}

const BIO_METHOD* SocketMethod() {
  static BIO_METHOD* m = [] {
    BIO_METHOD* method = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "dcr socket");
    BIO_meth_set_write(method, SockWrite);
    BIO_meth_set_read(method, SockRead);
    BIO_meth_set_ctrl(method, SockCtrl);
    BIO_meth_set_create(method, SockCreate);
    return method;
  }();
  return m;
}

// The identity in a certificate's dcr:// subjectAltName URI.
StatusOr<TlsIdentity> IdentityOf(X509* cert) {
  Owned<GENERAL_NAMES> names(
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr)));
  if (names) {
    for (int i = 0; i < sk_GENERAL_NAME_num(names.get()); ++i) {
      const GENERAL_NAME* n = sk_GENERAL_NAME_value(names.get(), i);
      if (n->type != GEN_URI) continue;
      const ASN1_STRING* s = n->d.uniformResourceIdentifier;
      std::string uri(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                      static_cast<size_t>(ASN1_STRING_length(s)));
      if (uri.rfind(kUriPrefix, 0) != 0) continue;
      std::string rest = uri.substr(sizeof(kUriPrefix) - 1);
      size_t a = rest.find('/');
      size_t b = a == std::string::npos ? a : rest.find('/', a + 1);
      if (b == std::string::npos) continue;
      TlsIdentity id;
      id.run_id = rest.substr(0, a);
      id.role = rest.substr(a + 1, b - a - 1);
      const std::string rank = rest.substr(b + 1);
      char* end = nullptr;
      long r = std::strtol(rank.c_str(), &end, 10);
      if (id.run_id.empty() || rank.empty() || *end != '\0' || r < 0 || r > (1 << 30)) continue;
      if (id.role != "sender" && id.role != "relay" && id.role != "receiver") continue;
      id.rank = static_cast<int>(r);
      return id;
    }
  }
  return FailedPreconditionError("no dcr://<run>/<role>/<rank> subjectAltName");
}

StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& what) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    if (errno == ENOENT) return NotFoundError(what + " " + path + ": not found");
    return ErrnoError(what + " " + path, errno);
  }
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0 && text.size() < (1 << 20)) {
    text.append(buf, n);
  }
  std::fclose(f);
  return text;
}

StatusOr<Owned<X509>> ReadCert(const std::string& path, const std::string& what) {
  DCR_ASSIGN_OR_RETURN(std::string pem, ReadPemFile(path, what));
  Owned<BIO> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  Owned<X509> cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (!cert)
    return InvalidArgumentError(what + " " + path + ": not a PEM certificate: " + TlsErrors());
  return cert;
}

}  // namespace

std::string TlsErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no OpenSSL error" : out;
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

StatusOr<std::shared_ptr<const TlsContext>> TlsContext::Load(const std::string& ca_path,
                                                             const std::string& cert_path,
                                                             const std::string& key_path) {
  struct stat st;
  if (stat(key_path.c_str(), &st) != 0) {
    if (errno == ENOENT) return NotFoundError("TLS key " + key_path + ": not found");
    return ErrnoError("TLS key " + key_path, errno);
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%03o", static_cast<unsigned>(st.st_mode & 0777));
    return FailedPreconditionError("TLS key " + key_path + ": mode " + mode +
                                   " lets group or others read it (chmod 600)");
  }
  DCR_ASSIGN_OR_RETURN(Owned<X509> ca, ReadCert(ca_path, "TLS CA certificate"));
  DCR_ASSIGN_OR_RETURN(Owned<X509> cert, ReadCert(cert_path, "TLS certificate"));
  DCR_RETURN_IF_ERROR(internal::ProtectKeyHolder());
  DCR_ASSIGN_OR_RETURN(std::string key_pem, ReadPemFile(key_path, "TLS key"));
  Owned<BIO> kbio(BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())));
  Owned<EVP_PKEY> key(PEM_read_bio_PrivateKey(kbio.get(), nullptr, nullptr, nullptr));
  OPENSSL_cleanse(key_pem.data(), key_pem.size());
  if (!key) return InvalidArgumentError("TLS key " + key_path + ": not a PEM private key");

  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return FailedPreconditionError("TLS key " + key_path + " does not match certificate " +
                                   cert_path);
  }
  auto id = IdentityOf(cert.get());
  if (!id.ok()) {
    return FailedPreconditionError("TLS certificate " + cert_path + ": " + id.status().message());
  }
  Owned<EVP_PKEY> ca_key(X509_get_pubkey(ca.get()));
  if (!ca_key || X509_verify(cert.get(), ca_key.get()) != 1) {
    ERR_clear_error();
    return FailedPreconditionError("TLS certificate " + cert_path + ": not signed by the CA " +
                                   ca_path);
  }

  std::shared_ptr<TlsContext> c(new TlsContext());
  c->self_ = *id;
  c->ctx_ = SSL_CTX_new(TLS_method());
  if (c->ctx_ == nullptr) return InternalError("SSL_CTX_new: " + TlsErrors());
  SSL_CTX* ctx = c->ctx_;
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  SSL_CTX_set_num_tickets(ctx, 0);  // no resumption: every edge is a full mutual handshake
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // AES-128-GCM first: with AES-NI the fastest suite per core (AES-256 runs ~14 rounds, not 10).
  SSL_CTX_set_ciphersuites(ctx,
                           "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:"
                           "TLS_CHACHA20_POLY1305_SHA256");
  X509_STORE* store = SSL_CTX_get_cert_store(ctx);
  if (X509_STORE_add_cert(store, ca.get()) != 1 || SSL_CTX_use_certificate(ctx, cert.get()) != 1 ||
      SSL_CTX_use_PrivateKey(ctx, key.get()) != 1) {
    return InvalidArgumentError("TLS credentials " + cert_path + ", " + key_path + ": " +
                                TlsErrors());
  }
  return std::shared_ptr<const TlsContext>(std::move(c));
}

ssl_st* TlsContext::NewSsl(int fd, bool server) const {
  SSL* ssl = SSL_new(ctx_);
  if (ssl == nullptr) return nullptr;
  BIO* bio = BIO_new(SocketMethod());
  if (bio == nullptr) {
    SSL_free(ssl);
    return nullptr;
  }
  BIO_set_data(bio, reinterpret_cast<void*>(static_cast<intptr_t>(fd)));
  SSL_set_bio(ssl, bio, bio);
  if (server) {
    SSL_set_accept_state(ssl);
  } else {
    SSL_set_connect_state(ssl);
  }
  return ssl;
}

StatusOr<TlsIdentity> TlsContext::CheckPeer(ssl_st* ssl, TlsPeer peer) const {
  X509* cert = SSL_get0_peer_certificate(ssl);
  if (cert == nullptr) return FailedPreconditionError("the peer presented no certificate");
  const long verify = SSL_get_verify_result(ssl);
  if (verify != X509_V_OK) {
    return FailedPreconditionError(std::string("the peer's certificate: ") +
                                   X509_verify_cert_error_string(verify));
  }
  auto id = IdentityOf(cert);
  if (!id.ok()) return FailedPreconditionError("the peer's certificate: " + id.status().message());
  if (id->run_id != self_.run_id) {
    return FailedPreconditionError("the peer's certificate is for run " + id->run_id +
                                   ", not this run " + self_.run_id);
  }
  const bool ok = peer == TlsPeer::kParent ? (id->role == "sender" || id->role == "relay")
                                           : (id->role == "relay" || id->role == "receiver");
  if (!ok) {
    return FailedPreconditionError("the peer's certificate is a " + id->role + " (rank " +
                                   std::to_string(id->rank) + "), which may not act as a " +
                                   (peer == TlsPeer::kParent ? "parent" : "child"));
  }
  return *id;
}

namespace {

constexpr uint32_t kReportSignatureField = 1;

void PutU32Le(std::vector<uint8_t>* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}
uint32_t GetU32Le(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

}  // namespace

StatusOr<std::vector<uint8_t>> TlsContext::SignReport(const uint8_t* body, size_t size) const {
  X509* cert = SSL_CTX_get0_certificate(ctx_);
  EVP_PKEY* key = SSL_CTX_get0_privatekey(ctx_);
  if (cert == nullptr || key == nullptr) return InternalError("no node certificate or key loaded");
  unsigned char* der = nullptr;
  const int der_size = i2d_X509(cert, &der);
  if (der_size <= 0) return InternalError("i2d_X509: " + TlsErrors());
  std::vector<uint8_t> cert_der(der, der + der_size);
  OPENSSL_free(der);
  unsigned char sig[64];
  size_t sig_size = sizeof(sig);
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  const bool ok = md != nullptr && EVP_DigestSignInit(md, nullptr, nullptr, nullptr, key) == 1 &&
                  EVP_DigestSign(md, sig, &sig_size, body, size) == 1 && sig_size == 64;
  EVP_MD_CTX_free(md);
  if (!ok) return InternalError("signing the commit report: " + TlsErrors());
  std::vector<uint8_t> field;
  PutU32Le(&field, kReportSignatureField);
  PutU32Le(&field, static_cast<uint32_t>(4 + cert_der.size() + 64));
  PutU32Le(&field, static_cast<uint32_t>(cert_der.size()));
  field.insert(field.end(), cert_der.begin(), cert_der.end());
  field.insert(field.end(), sig, sig + 64);
  return field;
}

Status TlsContext::CheckReportSignature(const uint8_t* tail, size_t tail_size, const uint8_t* body,
                                        size_t size, int rank) const {
  const std::string who = "the commit report of rank " + std::to_string(rank);
  size_t off = 0;
  while (off < tail_size) {
    if (tail_size - off < 8) return DataLossError(who + ": truncated tail field");
    const uint32_t kind = GetU32Le(tail + off);
    const uint32_t field_size = GetU32Le(tail + off + 4);
    if (field_size > tail_size - off - 8) return DataLossError(who + ": truncated tail field");
    const uint8_t* f = tail + off + 8;
    off += 8 + static_cast<size_t>(field_size);
    if (kind != kReportSignatureField) continue;
    if (field_size < 4 + 64) return DataLossError(who + ": malformed signature field");
    const uint32_t cert_size = GetU32Le(f);
    if (cert_size != field_size - 4 - 64) return DataLossError(who + ": malformed signature field");
    const unsigned char* p = f + 4;
    Owned<X509> cert(d2i_X509(nullptr, &p, static_cast<long>(cert_size)));
    if (!cert) {
      ERR_clear_error();
      return FailedPreconditionError(who + ": its signature carries no readable certificate");
    }
    X509_STORE_CTX* sctx = X509_STORE_CTX_new();
    const bool chained =
        sctx != nullptr &&
        X509_STORE_CTX_init(sctx, SSL_CTX_get_cert_store(ctx_), cert.get(), nullptr) == 1 &&
        X509_verify_cert(sctx) == 1;
    const int verr = sctx != nullptr ? X509_STORE_CTX_get_error(sctx) : 0;
    X509_STORE_CTX_free(sctx);
    ERR_clear_error();
    if (!chained) {
      return FailedPreconditionError(who +
                                     " is signed with a certificate this run's CA did not "
                                     "issue (" +
                                     X509_verify_cert_error_string(verr) + ")");
    }
    auto id = IdentityOf(cert.get());
    if (!id.ok()) return FailedPreconditionError(who + ": " + id.status().message());
    if (id->run_id != self_.run_id || id->rank != rank ||
        (id->role != "relay" && id->role != "receiver")) {
      return FailedPreconditionError(who + " is signed by " + id->role + " " +
                                     std::to_string(id->rank) + " of run " + id->run_id +
                                     ", not by rank " + std::to_string(rank) + " itself");
    }
    EVP_PKEY* key = X509_get0_pubkey(cert.get());
    EVP_MD_CTX* md = EVP_MD_CTX_new();
    const bool ok = key != nullptr && md != nullptr &&
                    EVP_DigestVerifyInit(md, nullptr, nullptr, nullptr, key) == 1 &&
                    EVP_DigestVerify(md, f + 4 + cert_size, 64, body, size) == 1;
    EVP_MD_CTX_free(md);
    ERR_clear_error();
    if (!ok) return FailedPreconditionError(who + ": bad signature (forged or altered report)");
    return Status();
  }
  return FailedPreconditionError(who + " is not signed by the rank: a relay may have forged it");
}

Status TlsHandshake(ssl_st* ssl, int fd, double deadline, double idle_s) {
  double last_progress = SteadyNow();
  while (true) {
    ERR_clear_error();
    const int rc = SSL_do_handshake(ssl);
    if (rc == 1) return Status();
    const int err = SSL_get_error(ssl, rc);
    short events = 0;
    if (err == SSL_ERROR_WANT_READ) {
      events = POLLIN;
    } else if (err == SSL_ERROR_WANT_WRITE) {
      events = POLLOUT;
    } else {
      const long verify = SSL_get_verify_result(ssl);
      std::string why = TlsErrors();
      if (verify != X509_V_OK)
        why += std::string(" (") + X509_verify_cert_error_string(verify) + ")";
      if (err == SSL_ERROR_SYSCALL || err == SSL_ERROR_ZERO_RETURN) {
        why = "the peer closed the connection during the TLS handshake (" + why + ")";
      }
      return UnavailableError("TLS handshake: " + why);
    }
    const double now = SteadyNow();
    const double left = deadline - now;
    if (left <= 0) return DeadlineExceededError("TLS handshake: no answer before the deadline");
    if (idle_s > 0 && now - last_progress >= idle_s) {
      char why[96];
      std::snprintf(why, sizeof(why), "TLS handshake: the peer was silent for %.1f s", idle_s);
      return DeadlineExceededError(why);
    }
    double wait = std::min(left, 1.0);
    if (idle_s > 0) wait = std::min(wait, last_progress + idle_s - now);
    pollfd p{fd, events, 0};
    int pr = poll(&p, 1, static_cast<int>(wait * 1000) + 1);
    if (pr < 0 && errno != EINTR) return UnavailableError(ErrnoError("poll", errno).message());
    if (pr > 0 && p.revents != 0) last_progress = SteadyNow();
  }
}

StatusOr<std::string> NewRunId() {
  uint64_t v = 0;
  while (v == 0) {
    unsigned char b[8];
    if (RAND_bytes(b, sizeof(b)) != 1) return InternalError("RAND_bytes: " + TlsErrors());
    for (unsigned char c : b) v = (v << 8) | c;
  }
  return RunIdText(v);
}

StatusOr<uint64_t> RunIdValue(const std::string& id) {
  uint64_t v = 0;
  bool ok = id.size() == 16;
  for (size_t i = 0; ok && i < id.size(); ++i) {
    const char c = id[i];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    ok = d >= 0;
    v = (v << 4) | static_cast<uint64_t>(d < 0 ? 0 : d);
  }
  if (!ok || v == 0) {
    return InvalidArgumentError("deployment id '" + id.substr(0, 40) +
                                "': not 16 lowercase hex digits (made by `dcr keys`)");
  }
  return v;
}

std::string RunIdText(uint64_t run_id) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(run_id));
  return buf;
}

StatusOr<std::string> CertificateRunId(const std::string& cert_path) {
  DCR_ASSIGN_OR_RETURN(Owned<X509> cert, ReadCert(cert_path, "TLS certificate"));
  auto id = IdentityOf(cert.get());
  if (!id.ok()) return id.status().WithContext("TLS certificate " + cert_path);
  return id->run_id;
}

std::vector<std::string> TreeRoles(const std::vector<int>& parents) {
  std::vector<std::string> roles(parents.size(), "receiver");
  for (size_t r = 0; r < parents.size(); ++r) {
    const int p = parents[r];
    if (p > 0 && static_cast<size_t>(p) < parents.size()) roles[p] = "relay";
  }
  if (!roles.empty()) roles[0] = "sender";
  return roles;
}

namespace {

Status AddExt(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX v3;
  X509V3_set_ctx(&v3, issuer, cert, nullptr, nullptr, 0);
  Owned<X509_EXTENSION> ext(X509V3_EXT_nconf_nid(nullptr, &v3, nid, value));
  if (!ext || X509_add_ext(cert, ext.get(), -1) != 1) {
    return InternalError(std::string("certificate extension ") + value + ": " + TlsErrors());
  }
  return Status();
}

// A certificate for `key` named `cn`, signed by `issuer_key` (issuer == null: self-signed CA).
StatusOr<Owned<X509>> MakeCert(EVP_PKEY* key, const std::string& org, const std::string& cn,
                               X509* issuer, EVP_PKEY* issuer_key, const std::string& uri,
                               int valid_days) {
  Owned<X509> cert(X509_new());
  if (!cert) return InternalError("X509_new: " + TlsErrors());
  X509_set_version(cert.get(), 2);
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof(serial)) != 1) return InternalError("RAND_bytes: " + TlsErrors());
  serial[0] &= 0x7f;
  Owned<BIGNUM> bn(BN_bin2bn(serial, sizeof(serial), nullptr));
  BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(cert.get()));
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(valid_days) * 86400);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(org.c_str()), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509* signer = issuer != nullptr ? issuer : cert.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(signer));
  if (issuer == nullptr) {
    DCR_RETURN_IF_ERROR(
        AddExt(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE,pathlen:0"));
    DCR_RETURN_IF_ERROR(AddExt(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign"));
    DCR_RETURN_IF_ERROR(AddExt(cert.get(), signer, NID_subject_key_identifier, "hash"));
  } else {
    DCR_RETURN_IF_ERROR(AddExt(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE"));
    DCR_RETURN_IF_ERROR(AddExt(cert.get(), signer, NID_key_usage, "critical,digitalSignature"));
    DCR_RETURN_IF_ERROR(AddExt(cert.get(), signer, NID_ext_key_usage, "serverAuth,clientAuth"));
    DCR_RETURN_IF_ERROR(AddExt(cert.get(), signer, NID_authority_key_identifier, "keyid"));
    DCR_RETURN_IF_ERROR(AddExt(cert.get(), signer, NID_subject_alt_name, ("URI:" + uri).c_str()));
  }
  if (X509_sign(cert.get(), issuer_key, nullptr) <= 0) {  // Ed25519: no separate digest
    return InternalError("X509_sign: " + TlsErrors());
  }
  return cert;
}

Status WriteExclusive(const std::string& path, const std::string& text, mode_t mode, bool replace) {
  if (replace && unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoError("remove " + path, errno);
  }
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) {
    if (errno == EEXIST) {
      return FailedPreconditionError(path +
                                     ": exists (credentials are never overwritten; "
                                     "remove it or choose another directory)");
    }
    return ErrnoError("create " + path, errno);
  }
  Status s;
  if (fchmod(fd, mode) != 0) s = ErrnoError("chmod " + path, errno);
  size_t done = 0;
  while (s.ok() && done < text.size()) {
    ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      s = ErrnoError("write " + path, errno);
    } else {
      done += static_cast<size_t>(w);
    }
  }
  if (s.ok() && fsync(fd) != 0) s = ErrnoError("fsync " + path, errno);
  ::close(fd);
  if (!s.ok()) unlink(path.c_str());
  return s;
}

StatusOr<std::string> KeyPem(EVP_PKEY* key) {
  Owned<BIO> bio(BIO_new(BIO_s_mem()));
  if (PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return InternalError("PEM_write_bio_PrivateKey: " + TlsErrors());
  }
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  std::string s(data, static_cast<size_t>(n));
  OPENSSL_cleanse(data, static_cast<size_t>(n));
  return s;
}

StatusOr<std::string> CertPem(X509* cert) {
  Owned<BIO> bio(BIO_new(BIO_s_mem()));
  if (PEM_write_bio_X509(bio.get(), cert) != 1)
    return InternalError("PEM_write_bio_X509: " + TlsErrors());
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

StatusOr<Owned<EVP_PKEY>> NewKey() {
  DCR_RETURN_IF_ERROR(ProtectKeyHolder());
  Owned<EVP_PKEY> key(EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519"));
  if (!key) return InternalError("Ed25519 key generation: " + TlsErrors());
  return key;
}

}  // namespace

Status PrepareCredentialDir(const std::string& dir) {
  return CheckOwnDirectory(dir, "key directory", OthersMay::kRead);
}

Status WriteRunCredentials(const std::string& dir, const std::string& run_id,
                           const std::vector<std::string>& roles, int valid_days, bool replace) {
  if (run_id.empty() || run_id.find('/') != std::string::npos) {
    return InvalidArgumentError("run id '" + run_id + "': must be non-empty, without '/'");
  }
  DCR_RETURN_IF_ERROR(PrepareCredentialDir(dir));
  const std::string org = "dcr run " + run_id;
  DCR_ASSIGN_OR_RETURN(Owned<EVP_PKEY> ca_key, NewKey());
  DCR_ASSIGN_OR_RETURN(Owned<X509> ca, MakeCert(ca_key.get(), org, "dcr run CA", nullptr,
                                                ca_key.get(), "", valid_days));
  DCR_ASSIGN_OR_RETURN(std::string ca_pem, CertPem(ca.get()));
  DCR_ASSIGN_OR_RETURN(std::string ca_key_pem, KeyPem(ca_key.get()));
  DCR_RETURN_IF_ERROR(WriteExclusive(dir + "/ca.key", ca_key_pem, 0600, replace));
  OPENSSL_cleanse(ca_key_pem.data(), ca_key_pem.size());
  DCR_RETURN_IF_ERROR(WriteExclusive(dir + "/ca.crt", ca_pem, 0644, replace));
  for (size_t r = 0; r < roles.size(); ++r) {
    const std::string rank = std::to_string(r);
    DCR_ASSIGN_OR_RETURN(Owned<EVP_PKEY> key, NewKey());
    DCR_ASSIGN_OR_RETURN(
        Owned<X509> cert,
        MakeCert(key.get(), org, "dcr " + roles[r] + " " + rank, ca.get(), ca_key.get(),
                 std::string(kUriPrefix) + run_id + "/" + roles[r] + "/" + rank, valid_days));
    DCR_ASSIGN_OR_RETURN(std::string key_pem, KeyPem(key.get()));
    DCR_ASSIGN_OR_RETURN(std::string cert_pem, CertPem(cert.get()));
    Status s = WriteExclusive(dir + "/node-" + rank + ".key", key_pem, 0600, replace);
    OPENSSL_cleanse(key_pem.data(), key_pem.size());
    DCR_RETURN_IF_ERROR(s);
    DCR_RETURN_IF_ERROR(WriteExclusive(dir + "/node-" + rank + ".crt", cert_pem, 0644, replace));
  }
  return Status();
}

Status WriteExtraCredential(const std::string& dir, const std::string& role, int rank,
                            const std::string& name, int valid_days) {
  DCR_ASSIGN_OR_RETURN(Owned<X509> ca, ReadCert(dir + "/ca.crt", "CA certificate"));
  DCR_ASSIGN_OR_RETURN(Owned<X509> node0, ReadCert(dir + "/node-0.crt", "node certificate"));
  DCR_ASSIGN_OR_RETURN(TlsIdentity id0, IdentityOf(node0.get()));
  DCR_RETURN_IF_ERROR(internal::ProtectKeyHolder());
  DCR_ASSIGN_OR_RETURN(std::string ca_key_pem, ReadPemFile(dir + "/ca.key", "CA key"));
  Owned<BIO> bio(BIO_new_mem_buf(ca_key_pem.data(), static_cast<int>(ca_key_pem.size())));
  Owned<EVP_PKEY> ca_key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  OPENSSL_cleanse(ca_key_pem.data(), ca_key_pem.size());
  if (!ca_key) return InvalidArgumentError(dir + "/ca.key: not a PEM private key: " + TlsErrors());
  const std::string r = std::to_string(rank);
  DCR_ASSIGN_OR_RETURN(Owned<EVP_PKEY> key, NewKey());
  DCR_ASSIGN_OR_RETURN(
      Owned<X509> cert,
      MakeCert(key.get(), "dcr run " + id0.run_id, "dcr " + role + " " + r + " (" + name + ")",
               ca.get(), ca_key.get(), std::string(kUriPrefix) + id0.run_id + "/" + role + "/" + r,
               valid_days));
  DCR_ASSIGN_OR_RETURN(std::string key_pem, KeyPem(key.get()));
  DCR_ASSIGN_OR_RETURN(std::string cert_pem, CertPem(cert.get()));
  Status s = WriteExclusive(dir + "/" + name + ".key", key_pem, 0600, /*replace=*/true);
  OPENSSL_cleanse(key_pem.data(), key_pem.size());
  DCR_RETURN_IF_ERROR(s);
  return WriteExclusive(dir + "/" + name + ".crt", cert_pem, 0644, /*replace=*/true);
}

}  // namespace dcr::internal
