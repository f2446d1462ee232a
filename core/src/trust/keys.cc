// SHA-256 and Ed25519 keys over OpenSSL 3's libcrypto.
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "dcr/signing.h"
#include "dcr/status_macros.h"
#include "internal/key_holder.h"

namespace dcr {
namespace {

std::string CryptoErrors() {
  std::string out;
  unsigned long e;
  while ((e = ERR_get_error()) != 0) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no OpenSSL error" : out;
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;

// The whole file at `path` (at most 64 KiB: a PEM key), and its mode.
StatusOr<std::string> ReadSmallFile(const std::string& path, mode_t* mode) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open " + path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError("stat " + path, err);
  }
  if (!S_ISREG(st.st_mode) || st.st_size > (64 << 10)) {
    ::close(fd);
    return InvalidArgumentError(path + ": not a key file (not a regular file of at most 64 KiB)");
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      return ErrnoError("read " + path, err);
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  if (mode != nullptr) *mode = st.st_mode;
  return out;
}

Status WriteExclusive(const std::string& path, const std::string& bytes, mode_t mode) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) {
    if (errno == EEXIST) {
      return FailedPreconditionError(path + " exists: a key file is never overwritten");
    }
    return ErrnoError("create " + path, errno);
  }
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(path.c_str());
      return ErrnoError("write " + path, err);
    }
    done += static_cast<size_t>(n);
  }
  if (::fchmod(fd, mode) != 0 || ::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(path.c_str());
    return ErrnoError("write " + path, err);
  }
  return Status();
}

Status RawPublic(EVP_PKEY* key, Ed25519PublicKey* out) {
  size_t n = out->size();
  if (EVP_PKEY_get_raw_public_key(key, out->data(), &n) != 1 || n != out->size()) {
    return InternalError("EVP_PKEY_get_raw_public_key: " + CryptoErrors());
  }
  return Status();
}

const EVP_MD* Sha256Md() {
  static const EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  return md;
}

}  // namespace

Sha256Digest Sha256(const uint8_t* data, size_t size) {
  Sha256Digest d{};
  unsigned int n = 0;
  EVP_Digest(data, size, d.data(), &n, Sha256Md(), nullptr);
  return d;
}

std::string Sha256Hex(const Sha256Digest& d) {
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (uint8_t b : d) {
    s += kHex[b >> 4];
    s += kHex[b & 15];
  }
  return s;
}

std::string KeyFingerprint(const Ed25519PublicKey& raw) {
  static const char* kHex = "0123456789abcdef";
  std::string s = "ed25519:";
  for (int i = 0; i < 8; ++i) {
    s += kHex[raw[i] >> 4];
    s += kHex[raw[i] & 15];
  }
  return s;
}

// ---- SigningKey ----

SigningKey::~SigningKey() { EVP_PKEY_free(static_cast<EVP_PKEY*>(pkey_)); }

StatusOr<std::unique_ptr<SigningKey>> SigningKey::Load(const std::string& path) {
  DCR_RETURN_IF_ERROR(internal::ProtectKeyHolder());
  mode_t mode = 0;
  auto pem = ReadSmallFile(path, &mode);
  if (!pem.ok()) return pem.status().WithContext("signing key");
  if ((mode & (S_IRWXG | S_IRWXO)) != 0) {
    return FailedPreconditionError("signing key " + path +
                                   " is accessible by group or others (chmod 600 it)");
  }
  BioPtr bio(BIO_new_mem_buf(pem->data(), static_cast<int>(pem->size())));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr);
  if (key == nullptr) {
    ERR_clear_error();
    return InvalidArgumentError("signing key " + path + ": not a PEM private key");
  }
  std::unique_ptr<SigningKey> out(new SigningKey());
  out->pkey_ = key;
  if (EVP_PKEY_get_id(key) != EVP_PKEY_ED25519) {
    return FailedPreconditionError("signing key " + path + " is not an Ed25519 key");
  }
  DCR_RETURN_IF_ERROR(RawPublic(key, &out->public_));
  return out;
}

StatusOr<std::unique_ptr<SigningKey>> SigningKey::Generate() {
  DCR_RETURN_IF_ERROR(internal::ProtectKeyHolder());
  EVP_PKEY* key = EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519");
  if (key == nullptr) return InternalError("Ed25519 key generation: " + CryptoErrors());
  std::unique_ptr<SigningKey> out(new SigningKey());
  out->pkey_ = key;
  DCR_RETURN_IF_ERROR(RawPublic(key, &out->public_));
  return out;
}

StatusOr<std::unique_ptr<SigningKey>> SigningKey::FromSeed(const std::array<uint8_t, 32>& seed) {
  DCR_RETURN_IF_ERROR(internal::ProtectKeyHolder());
  EVP_PKEY* key = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr, seed.data(), seed.size());
  if (key == nullptr) return InternalError("Ed25519 key from seed: " + CryptoErrors());
  std::unique_ptr<SigningKey> out(new SigningKey());
  out->pkey_ = key;
  DCR_RETURN_IF_ERROR(RawPublic(key, &out->public_));
  return out;
}

StatusOr<Ed25519Signature> SigningKey::Sign(const uint8_t* data, size_t size) const {
  Ed25519Signature sig{};
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (ctx == nullptr) return InternalError("EVP_MD_CTX_new failed");
  size_t n = sig.size();
  const bool ok =
      EVP_DigestSignInit(ctx, nullptr, nullptr, nullptr, static_cast<EVP_PKEY*>(pkey_)) == 1 &&
      EVP_DigestSign(ctx, sig.data(), &n, data, size) == 1 && n == sig.size();
  EVP_MD_CTX_free(ctx);
  if (!ok) return InternalError("Ed25519 signing: " + CryptoErrors());
  return sig;
}

Status SigningKey::Write(const std::string& key_path, const std::string& public_path) const {
  EVP_PKEY* key = static_cast<EVP_PKEY*>(pkey_);
  BioPtr priv(BIO_new(BIO_s_mem()));
  BioPtr pub(BIO_new(BIO_s_mem()));
  if (PEM_write_bio_PrivateKey(priv.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1 ||
      PEM_write_bio_PUBKEY(pub.get(), key) != 1) {
    return InternalError("PEM encoding of the signing key: " + CryptoErrors());
  }
  auto text = [](BIO* b) {
    char* p = nullptr;
    long n = BIO_get_mem_data(b, &p);
    return std::string(p, static_cast<size_t>(n));
  };
  DCR_RETURN_IF_ERROR(WriteExclusive(key_path, text(priv.get()), 0600));
  Status s = WriteExclusive(public_path, text(pub.get()), 0644);
  if (!s.ok()) ::unlink(key_path.c_str());
  return s;
}

// ---- TrustKey ----

TrustKey::~TrustKey() { EVP_PKEY_free(static_cast<EVP_PKEY*>(pkey_)); }

StatusOr<std::shared_ptr<const TrustKey>> TrustKey::Load(const std::string& path) {
  auto pem = ReadSmallFile(path, nullptr);
  if (!pem.ok()) return pem.status().WithContext("trusted key");
  BioPtr bio(BIO_new_mem_buf(pem->data(), static_cast<int>(pem->size())));
  EVP_PKEY* key = PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr);
  if (key == nullptr) {
    ERR_clear_error();
    BioPtr again(BIO_new_mem_buf(pem->data(), static_cast<int>(pem->size())));
    key = PEM_read_bio_PrivateKey(again.get(), nullptr, nullptr, nullptr);
  }
  if (key == nullptr) {
    ERR_clear_error();
    return InvalidArgumentError("trusted key " + path + ": not a PEM public key");
  }
  std::shared_ptr<TrustKey> out(new TrustKey());
  out->pkey_ = key;
  if (EVP_PKEY_get_id(key) != EVP_PKEY_ED25519) {
    return FailedPreconditionError("trusted key " + path + " is not an Ed25519 key");
  }
  DCR_RETURN_IF_ERROR(RawPublic(key, &out->raw_));
  return std::shared_ptr<const TrustKey>(std::move(out));
}

StatusOr<std::shared_ptr<const TrustKey>> TrustKey::FromRaw(const Ed25519PublicKey& raw) {
  EVP_PKEY* key = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, raw.data(), raw.size());
  if (key == nullptr) return InvalidArgumentError("not an Ed25519 public key: " + CryptoErrors());
  std::shared_ptr<TrustKey> out(new TrustKey());
  out->pkey_ = key;
  out->raw_ = raw;
  return std::shared_ptr<const TrustKey>(std::move(out));
}

bool TrustKey::Verify(const uint8_t* data, size_t size, const Ed25519Signature& signature) const {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (ctx == nullptr) return false;
  const bool ok =
      EVP_DigestVerifyInit(ctx, nullptr, nullptr, nullptr, static_cast<EVP_PKEY*>(pkey_)) == 1 &&
      EVP_DigestVerify(ctx, signature.data(), signature.size(), data, size) == 1;
  EVP_MD_CTX_free(ctx);
  ERR_clear_error();
  return ok;
}

std::string TrustKey::Fingerprint() const { return KeyFingerprint(raw_); }

}  // namespace dcr
