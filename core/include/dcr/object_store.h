// Object stores: where senders publish delta blobs and receivers fetch them.
//
// Three implementations share one interface:
//   * DirectoryStore: a local (or shared-filesystem) directory, the embedded default. Keys are
//     relative paths; Put writes a fresh ".dcr-tmp.<name>.XXXXXX" beside the object (random
//     suffix, created exclusively), fsyncs and renames it, so a reader sees an object completely
//     or not at all. Objects stay inside the root: a key whose path crosses a symlink is refused
//     (kFailedPrecondition) and List skips symlinks.
//   * S3Store: any S3-compatible endpoint over libcurl with AWS SigV4 (path-style URLs
//     "<endpoint>/<bucket>/<key>", region, UNSIGNED-PAYLOAD, multipart upload for large objects,
//     ranged GET). Verified against OpenStack Swift s3api (scripts/start-s3-server.sh). Each call
//     is one attempt: a failure comes back as a Status (retry and backoff are the caller's
//     policy, relay_policy.h), and a response whose body is not what the server's headers
//     promise is refused, never returned: see S3Store.
//   * MemoryStore: an in-process map, the fake for unit tests and the simulator's bookkeeping.
//
// Keys: non-empty, '/'-separated, no "." or ".." components, no leading '/', no NUL; at most 1024
// bytes. Objects are immutable once put (a second Put replaces the whole object atomically).
//
// Thread safety: every implementation is thread-safe (concurrent calls on one store are allowed).
#ifndef DCR_CORE_INCLUDE_DCR_OBJECT_STORE_H_
#define DCR_CORE_INCLUDE_DCR_OBJECT_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dcr/status.h"
#include "dcr/statusor.h"

namespace dcr {

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
};

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;

  // Stores `size` bytes under `key`, atomically visible (all or nothing).
  // Errors: kInvalidArgument (bad key), kUnavailable (I/O or network; message names the
  // endpoint/path and the HTTP status or errno), kFailedPrecondition (access denied, e.g. 403).
  virtual Status Put(const std::string& key, const void* data, size_t size) = 0;
  // The whole object. Errors: kNotFound, kUnavailable, kFailedPrecondition (403).
  virtual StatusOr<std::vector<uint8_t>> Get(const std::string& key) = 0;
  // Bytes [offset, offset+length) of the object; shorter if the object ends earlier.
  // Errors: as Get; kInvalidArgument when offset > object size.
  virtual StatusOr<std::vector<uint8_t>> GetRange(const std::string& key, uint64_t offset,
                                                  uint64_t length) = 0;
  // Size of an object. kNotFound if absent.
  virtual StatusOr<ObjectInfo> Head(const std::string& key) = 0;
  // Every object whose key starts with `prefix`, sorted by key (all pages).
  virtual StatusOr<std::vector<ObjectInfo>> List(const std::string& prefix) = 0;
  // Removes an object; deleting an absent key is OK.
  virtual Status Delete(const std::string& key) = 0;
  // "dir:/path", "s3:http://host:port/bucket", "mem:" (for messages).
  virtual std::string Describe() const = 0;
};

// kInvalidArgument naming the problem if `key` is not a valid key (see top).
Status ValidateObjectKey(const std::string& key);

// ---- directory store ----

class DirectoryStore : public ObjectStore {
 public:
  // Creates `root` (and parents) if missing. Errors: kUnavailable if it cannot be created.
  static StatusOr<std::unique_ptr<DirectoryStore>> Open(const std::string& root);

  Status Put(const std::string& key, const void* data, size_t size) override;
  StatusOr<std::vector<uint8_t>> Get(const std::string& key) override;
  StatusOr<std::vector<uint8_t>> GetRange(const std::string& key, uint64_t offset,
                                          uint64_t length) override;
  StatusOr<ObjectInfo> Head(const std::string& key) override;
  // Temporary files of in-progress Puts are never listed.
  StatusOr<std::vector<ObjectInfo>> List(const std::string& prefix) override;
  Status Delete(const std::string& key) override;
  std::string Describe() const override { return "dir:" + root_; }

 private:
  explicit DirectoryStore(std::string root) : root_(std::move(root)) {}
  std::string root_;
};

// ---- S3 store ----

struct S3Options {
  // "https://s3.us-east-1.amazonaws.com" or "https://127.0.0.1:8443" (no trailing path). The
  // server's certificate is verified (peer and host name) against `ca_file`, else the system's
  // CA store. A plain "http://" endpoint is refused unless `allow_http` is set.
  std::string endpoint;
  // PEM file of the CAs that may sign the endpoint's certificate ("" = the system's store).
  std::string ca_file;
  // Accept an http:// endpoint: requests, the SigV4-signed headers and every object then cross
  // the network in the clear. Only for a local test server. Default false.
  bool allow_http = false;
  std::string bucket;
  std::string region = "us-east-1";
  // Credentials. Empty: taken by S3Store::Open from the environment, first DCR_S3_ACCESS_KEY /
  // DCR_S3_SECRET_KEY, then AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, then the file named by
  // `credentials_file` (or DCR_S3_CREDENTIALS_FILE): lines "access_key = ..." and
  // "secret_key = ..." (aws_access_key_id / aws_secret_access_key also accepted).
  std::string access_key;
  std::string secret_key;
  std::string credentials_file;
  // Objects of at least this size are uploaded with multipart upload in parts of part_bytes.
  // Defaults 64 MiB and 16 MiB. REQUIRES: part_bytes >= 5 MiB (S3's minimum part size).
  uint64_t multipart_threshold = uint64_t{64} << 20;
  uint64_t part_bytes = uint64_t{16} << 20;
  // Per-request timeouts in seconds (connect, whole transfer). Defaults 10, 300.
  double connect_timeout_s = 10;
  double request_timeout_s = 300;
  // Read deadline: a request that moves no byte (either way) for this many seconds is aborted
  // (kDeadlineExceeded), so a stalled connection is noticed long before request_timeout_s.
  // Whole seconds (rounded up). Default 30.
  double read_deadline_s = 30;
  // Create the bucket in Open if it does not exist. Default false.
  bool create_bucket = false;
  // Bounds on what a server may send (a lying endpoint cannot exhaust the client's memory or
  // keep it listing): the largest object a whole-object Get takes (a larger Content-Length or
  // body fails kDataLoss before or while it arrives; default 16 GiB); a ranged GET takes at most
  // its range (a server that ignores Range: at most the object up to the range's end, within
  // max_get_bytes); a List takes pages of at most 16 MiB, at most max_list_keys keys in all
  // (default 10^6; more: kResourceExhausted) and at most list_deadline_s seconds (default 300;
  // kDeadlineExceeded), and keys must increase from page to page (kDataLoss otherwise). Other
  // answers (errors, PUT, HEAD) take 64 KiB of body and 64 KiB of headers.
  uint64_t max_get_bytes = uint64_t{16} << 30;
  uint64_t max_list_keys = 1000000;
  double list_deadline_s = 300;
};

// Integrity checks on every response (kDataLoss naming the request, so that the caller's retry
// policy fetches or puts again):
//   * a ranged GET must answer 206 with a Content-Range that starts at the requested offset and
//     covers exactly the body received (a body cut short or a range of other bytes is refused);
//   * a body that is the whole object (GET, or a range covering it) must have the MD5 that its
//     ETag names, where the ETag is a plain MD5 (not "<md5>-<parts>" of a multipart upload);
//   * a PUT (or an uploaded part) must be answered with the ETag of the MD5 of the bytes sent:
//     an object stored short or altered on its way is reported as not stored.
// A transfer cut mid-body fails (kUnavailable); a stall past read_deadline_s fails
// (kDeadlineExceeded); 5xx, 408 and 429 answers fail kUnavailable.
class S3Store : public ObjectStore {
 public:
  // Validates options, resolves credentials and (with create_bucket) creates the bucket.
  // Errors: kInvalidArgument naming the missing/bad field ("s3.endpoint: ..."), kUnavailable if
  // the endpoint cannot be reached, kFailedPrecondition on 403 (message includes the S3 error
  // code such as SignatureDoesNotMatch or InvalidAccessKeyId).
  static StatusOr<std::unique_ptr<S3Store>> Open(const S3Options& options);
  ~S3Store() override;

  Status Put(const std::string& key, const void* data, size_t size) override;
  StatusOr<std::vector<uint8_t>> Get(const std::string& key) override;
  StatusOr<std::vector<uint8_t>> GetRange(const std::string& key, uint64_t offset,
                                          uint64_t length) override;
  StatusOr<ObjectInfo> Head(const std::string& key) override;
  StatusOr<std::vector<ObjectInfo>> List(const std::string& prefix) override;
  Status Delete(const std::string& key) override;
  std::string Describe() const override;

  // Creates the bucket (OK if it already exists and is ours).
  Status CreateBucket();

 private:
  explicit S3Store(S3Options options) : options_(std::move(options)) {}
  S3Options options_;
};

// ---- in-memory fake ----

class MemoryStore : public ObjectStore {
 public:
  Status Put(const std::string& key, const void* data, size_t size) override;
  StatusOr<std::vector<uint8_t>> Get(const std::string& key) override;
  StatusOr<std::vector<uint8_t>> GetRange(const std::string& key, uint64_t offset,
                                          uint64_t length) override;
  StatusOr<ObjectInfo> Head(const std::string& key) override;
  StatusOr<std::vector<ObjectInfo>> List(const std::string& prefix) override;
  Status Delete(const std::string& key) override;
  std::string Describe() const override { return "mem:"; }

 private:
  std::mutex mu_;
  std::map<std::string, std::vector<uint8_t>> objects_;
};

// Opens a store from a spec string: "dir:/path" (or a plain path), "mem:", or
// "s3://bucket?endpoint=https://host:port&region=us-east-1" (credentials as in S3Options; also
// ca_file=PATH, allow_http=1, credentials_file=PATH, create_bucket=1, read_deadline_s=SECONDS,
// list_deadline_s=SECONDS, max_get_bytes=N, max_list_keys=N).
// kInvalidArgument for anything else.
StatusOr<std::unique_ptr<ObjectStore>> OpenObjectStore(const std::string& spec);

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_OBJECT_STORE_H_
