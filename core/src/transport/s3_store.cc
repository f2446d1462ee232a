// S3Store: S3 over libcurl with AWS SigV4 (CURLOPT_AWS_SIGV4), path-style URLs.
//
// Signing pitfalls handled here: the query string is signed verbatim, so every query is built
// canonically (sorted names, RFC 3986 encoding, "name=" for empty values); x-amz-content-sha256
// is sent explicitly (UNSIGNED-PAYLOAD); Expect: 100-continue is left to curl's default (an empty
// Expect header would be signed but not sent).
#include <curl/curl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "dcr/object_store.h"
#include "dcr/status_macros.h"

namespace dcr {

namespace {

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string UriEncode(const std::string& s, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

// Canonical query: sorted by name, encoded, "name=" for empty values.
std::string CanonicalQuery(const std::map<std::string, std::string>& q) {
  std::string out;
  for (const auto& [k, v] : q) {
    if (!out.empty()) out += '&';
    out += UriEncode(k, false) + "=" + UriEncode(v, false);
  }
  return out;
}

std::string XmlUnescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out += s[i];
      continue;
    }
    size_t semi = s.find(';', i);
    if (semi == std::string::npos) {
      out += s[i];
      continue;
    }
    std::string ent = s.substr(i + 1, semi - i - 1);
    if (ent == "amp") {
      out += '&';
    } else if (ent == "lt") {
      out += '<';
    } else if (ent == "gt") {
      out += '>';
    } else if (ent == "quot") {
      out += '"';
    } else if (ent == "apos") {
      out += '\'';
    } else if (!ent.empty() && ent[0] == '#') {
      long c = ent.size() > 1 && ent[1] == 'x' ? std::strtol(ent.c_str() + 2, nullptr, 16)
                                               : std::strtol(ent.c_str() + 1, nullptr, 10);
      out += static_cast<char>(c);
    } else {
      out += s.substr(i, semi - i + 1);
    }
    i = semi;
  }
  return out;
}

// All values of <tag>...</tag> in document order (no nesting of the same tag assumed).
std::vector<std::string> XmlValues(const std::string& xml, const std::string& tag) {
  std::vector<std::string> out;
  std::string open = "<" + tag + ">", close = "</" + tag + ">";
  size_t pos = 0;
  while ((pos = xml.find(open, pos)) != std::string::npos) {
    size_t end = xml.find(close, pos);
    if (end == std::string::npos) break;
    out.push_back(XmlUnescape(xml.substr(pos + open.size(), end - pos - open.size())));
    pos = end + close.size();
  }
  return out;
}

std::string XmlValue(const std::string& xml, const std::string& tag) {
  auto v = XmlValues(xml, tag);
  return v.empty() ? "" : v.front();
}

struct Response {
  long http = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // lower-case names
  // Bounds, set by the request before it runs: the most body bytes it takes (a body or a
  // Content-Length above it aborts the transfer) and of header bytes (kMaxHeaderBytes).
  uint64_t max_body = 0;
  uint64_t max_partial_body = UINT64_MAX;  // the cap of a 206 answer (a ranged GET: the range)
  long status_line = 0;                    // the code of the last status line seen
  // A HEAD: its Content-Length is the object's size, and no body follows.
  bool no_body = false;
  uint64_t header_bytes = 0;
  bool body_over = false, headers_over = false;
};

// Header bytes of one response, all lines together: a server sending header after header is cut
// off here (S3 answers carry a few hundred bytes).
constexpr uint64_t kMaxHeaderBytes = 64 << 10;
// The body of an answer that carries no object (errors, PUT, POST, DELETE): S3's are < 1 KiB.
constexpr uint64_t kMaxSmallBody = 64 << 10;
// One page of a listing: S3 lists at most 1000 keys of at most 1024 bytes per page.
constexpr uint64_t kMaxListPageBytes = 16 << 20;

uint64_t BodyCap(const Response& r) {
  return r.status_line == 206 ? std::min(r.max_body, r.max_partial_body) : r.max_body;
}

size_t WriteBody(char* p, size_t size, size_t n, void* ud) {
  auto* r = static_cast<Response*>(ud);
  const size_t k = size * n;
  const uint64_t cap = BodyCap(*r);
  if (k > cap - std::min<uint64_t>(cap, r->body.size())) {
    r->body_over = true;
    return 0;  // aborts the transfer (CURLE_WRITE_ERROR)
  }
  r->body.append(p, k);
  return k;
}

size_t WriteHeader(char* p, size_t size, size_t n, void* ud) {
  auto* r = static_cast<Response*>(ud);
  const size_t k = size * n;
  r->header_bytes += k;
  if (r->header_bytes > kMaxHeaderBytes) {
    r->headers_over = true;
    return 0;
  }
  std::string line(p, k);
  if (line.compare(0, 5, "HTTP/") == 0) {
    const size_t sp = line.find(' ');
    if (sp != std::string::npos) r->status_line = std::strtol(line.c_str() + sp + 1, nullptr, 10);
    return k;
  }
  size_t colon = line.find(':');
  if (colon != std::string::npos) {
    std::string name = line.substr(0, colon);
    std::transform(name.begin(), name.end(), name.begin(), ::tolower);
    std::string value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ')) value.erase(value.begin());
    while (!value.empty() &&
           (value.back() == '\r' || value.back() == '\n' || value.back() == ' ')) {
      value.pop_back();
    }
    if (name == "content-length" && !r->no_body &&
        std::strtoull(value.c_str(), nullptr, 10) > BodyCap(*r)) {
      r->headers[name] = value;
      r->body_over = true;
      return 0;  // refused before any byte of the body
    }
    r->headers[name] = value;
  }
  return k;
}

struct Upload {
  const uint8_t* data;
  size_t size;
  size_t pos;
};

size_t ReadBody(char* buf, size_t size, size_t n, void* ud) {
  auto* u = static_cast<Upload*>(ud);
  size_t k = std::min(size * n, u->size - u->pos);
  std::memcpy(buf, u->data + u->pos, k);
  u->pos += k;
  return k;
}

std::string Trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t b = 0;
  while (b < s.size() && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  return s.substr(b);
}

// Lower-case hex MD5 of `size` bytes at `data`.
std::string Md5Hex(const void* data, size_t size) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(data, size, md, &n, EVP_md5(), nullptr) != 1) return "";
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

// The MD5 an ETag names, lower case, when it is a plain MD5 ("\"<32 hex>\""); "" otherwise (a
// multipart ETag "<md5>-<parts>", or a store whose ETags are not MD5s).
std::string PlainMd5Etag(std::string etag) {
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') {
    etag = etag.substr(1, etag.size() - 2);
  }
  if (etag.size() != 32) return "";
  for (char& c : etag) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return "";
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return etag;
}

// One HTTP request; the whole class's network I/O goes through here.
class S3Request {
 public:
  S3Request(const S3Options& o, std::string method, std::string key,
            std::map<std::string, std::string> query)
      : o_(o), method_(std::move(method)), key_(std::move(key)), query_(std::move(query)) {}

  std::string Url() const {
    // Appended piecewise: "/" + a temporary string trips a g++ 12 -Wrestrict false positive.
    std::string url = o_.endpoint;
    url += '/';
    url += UriEncode(o_.bucket, false);
    if (!key_.empty()) {
      url += '/';
      url += UriEncode(key_, true);
    }
    const std::string q = CanonicalQuery(query_);
    if (!q.empty()) {
      url += '?';
      url += q;
    }
    return url;
  }

  void SetBody(const void* data, size_t size) {
    body_ = static_cast<const uint8_t*>(data);
    body_size_ = size;
    has_body_ = true;
  }
  void AddHeader(const std::string& h) { headers_.push_back(h); }
  // The most body bytes the answer may have (default kMaxSmallBody); more aborts it.
  void SetMaxBody(uint64_t n) { max_body_ = std::max(n, kMaxSmallBody); }
  // The most body bytes a 206 (partial) answer may have: the range asked for.
  void SetMaxPartialBody(uint64_t n) { max_partial_body_ = n; }

  StatusOr<Response> Run() {
    GlobalInit();
    CURL* c = curl_easy_init();
    if (c == nullptr) return InternalError("curl_easy_init failed");
    Response r;
    r.max_body = max_body_;
    r.max_partial_body = max_partial_body_;
    r.no_body = method_ == "HEAD";
    std::string url = Url();
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, o_.allow_http ? "http,https" : "https");
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L);
    if (!o_.ca_file.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, o_.ca_file.c_str());
    std::string sigv4 = "aws:amz:" + o_.region + ":s3";
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4.c_str());
    curl_easy_setopt(c, CURLOPT_USERNAME, o_.access_key.c_str());
    curl_easy_setopt(c, CURLOPT_PASSWORD, o_.secret_key.c_str());
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(o_.connect_timeout_s * 1000));
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(o_.request_timeout_s * 1000));
    // The read deadline: fewer than 1 byte/s for read_deadline_s aborts the request.
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME,
                     static_cast<long>(std::max(1.0, std::ceil(o_.read_deadline_s))));
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, WriteBody);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, WriteHeader);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &r);
    struct curl_slist* hl = nullptr;
    hl = curl_slist_append(hl, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    for (const auto& h : headers_) hl = curl_slist_append(hl, h.c_str());
    Upload up{body_, body_size_, 0};
    if (method_ == "PUT") {
      curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(c, CURLOPT_READFUNCTION, ReadBody);
      curl_easy_setopt(c, CURLOPT_READDATA, &up);
      curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(body_size_));
    } else if (method_ == "POST") {
      curl_easy_setopt(c, CURLOPT_POST, 1L);
      curl_easy_setopt(c, CURLOPT_POSTFIELDS,
                       has_body_ ? reinterpret_cast<const char*>(body_) : "");
      curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body_size_));
      hl = curl_slist_append(hl, "Content-Type: application/xml");
    } else if (method_ == "HEAD") {
      curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    } else if (method_ != "GET") {
      curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method_.c_str());
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    CURLcode rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.http);
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
    if (rc != CURLE_OK) {
      if (r.headers_over) {
        return DataLossError(What() + ": the answer's headers exceed " +
                             std::to_string(kMaxHeaderBytes) + " bytes");
      }
      if (r.body_over) {
        const auto cl = r.headers.find("content-length");
        return DataLossError(
            What() + ": the answer's body " +
            (cl != r.headers.end() ? "(Content-Length " + cl->second + ") " : std::string("")) +
            "exceeds the " + std::to_string(BodyCap(r)) + " bytes this request takes");
      }
      if (rc == CURLE_OPERATION_TIMEDOUT) {
        return DeadlineExceededError(What() + ": " + curl_easy_strerror(rc));
      }
      return UnavailableError(What() + ": " + curl_easy_strerror(rc));
    }
    return r;
  }

  // Maps a non-2xx response to a Status naming the request and the S3 error code.
  Status Error(const Response& r) const {
    std::string code = XmlValue(r.body, "Code");
    std::string msg = XmlValue(r.body, "Message");
    std::string text = What() + ": HTTP " + std::to_string(r.http) +
                       (code.empty() ? "" : " " + code) + (msg.empty() ? "" : ": " + msg);
    if (r.http == 404) return NotFoundError(text);
    if (r.http == 403 || r.http == 401) return FailedPreconditionError(text);
    if (r.http == 416) return InvalidArgumentError(text);
    if (r.http >= 400 && r.http < 500 && r.http != 408 && r.http != 429) {
      return InvalidArgumentError(text);
    }
    return UnavailableError(text);
  }

  std::string What() const {
    std::string url = o_.endpoint + "/" + o_.bucket + (key_.empty() ? "" : "/" + key_);
    return "s3 " + method_ + " " + url;
  }

 private:
  const S3Options& o_;
  std::string method_, key_;
  std::map<std::string, std::string> query_;
  std::vector<std::string> headers_;
  const uint8_t* body_ = nullptr;
  size_t body_size_ = 0;
  bool has_body_ = false;
  uint64_t max_body_ = kMaxSmallBody;
  uint64_t max_partial_body_ = UINT64_MAX;
};

StatusOr<Response> Do(S3Request& req, std::initializer_list<long> ok_codes) {
  DCR_ASSIGN_OR_RETURN(Response r, req.Run());
  for (long c : ok_codes) {
    if (r.http == c) return r;
  }
  return req.Error(r);
}

// A PUT of `size` bytes at `data` (an object or a part) answered `r`: kDataLoss when the ETag is
// a plain MD5 other than that of the bytes sent (the server stored other bytes).
Status CheckPutEtag(const S3Request& req, const Response& r, const void* data, size_t size) {
  auto it = r.headers.find("etag");
  if (it == r.headers.end()) return Status();
  const std::string named = PlainMd5Etag(it->second);
  if (named.empty()) return Status();
  const std::string sent = Md5Hex(data, size);
  if (named == sent) return Status();
  return DataLossError(req.What() + ": stored with ETag " + it->second + ", not the MD5 " + sent +
                       " of the " + std::to_string(size) + " bytes sent");
}

// A body that is the whole object: kDataLoss when its MD5 is not the one its plain-MD5 ETag names.
Status CheckWholeBody(const S3Request& req, const Response& r) {
  auto it = r.headers.find("etag");
  if (it == r.headers.end()) return Status();
  const std::string named = PlainMd5Etag(it->second);
  if (named.empty()) return Status();
  const std::string got = Md5Hex(r.body.data(), r.body.size());
  if (named == got) return Status();
  return DataLossError(req.What() + ": body of " + std::to_string(r.body.size()) +
                       " bytes has MD5 " + got + ", not the ETag " + it->second);
}
}  // namespace

StatusOr<std::unique_ptr<S3Store>> S3Store::Open(const S3Options& options) {
  S3Options o = options;
  if (o.endpoint.empty()) {
    return InvalidArgumentError("s3.endpoint: required (e.g. https://s3.us-east-1.amazonaws.com)");
  }
  const bool http = o.endpoint.compare(0, 7, "http://") == 0;
  if (!http && o.endpoint.compare(0, 8, "https://") != 0) {
    return InvalidArgumentError("s3.endpoint: '" + o.endpoint +
                                "' must start with https:// (or "
                                "http:// with allow_http)");
  }
  if (http && !o.allow_http) {
    return InvalidArgumentError(
        "s3.endpoint: '" + o.endpoint +
        "' is plain http: requests, signatures and objects would "
        "cross the network unencrypted; use https://, or set allow_http (scenario key "
        "transport.object_store.allow_http: true) for a local test server");
  }
  if (!o.ca_file.empty() && access(o.ca_file.c_str(), R_OK) != 0) {
    return NotFoundError("s3.ca_file: cannot read '" + o.ca_file + "'");
  }
  while (!o.endpoint.empty() && o.endpoint.back() == '/') o.endpoint.pop_back();
  if (o.bucket.empty()) return InvalidArgumentError("s3.bucket: required");
  if (o.region.empty()) return InvalidArgumentError("s3.region: required");
  if (o.part_bytes < (uint64_t{5} << 20)) {
    return InvalidArgumentError("s3.part_bytes: must be >= 5 MiB (S3 minimum part size)");
  }
  auto env = [](const char* n) -> std::string {
    const char* v = std::getenv(n);
    return v ? v : "";
  };
  if (o.access_key.empty() || o.secret_key.empty()) {
    if (!env("DCR_S3_ACCESS_KEY").empty()) {
      o.access_key = env("DCR_S3_ACCESS_KEY");
      o.secret_key = env("DCR_S3_SECRET_KEY");
    } else if (!env("AWS_ACCESS_KEY_ID").empty()) {
      o.access_key = env("AWS_ACCESS_KEY_ID");
      o.secret_key = env("AWS_SECRET_ACCESS_KEY");
    } else {
      std::string file =
          !o.credentials_file.empty() ? o.credentials_file : env("DCR_S3_CREDENTIALS_FILE");
      if (!file.empty()) {
        // A secret key others can read is refused, as the node's TLS and signing keys are.
        struct stat st;
        if (stat(file.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
          char mode[8];
          std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
          return FailedPreconditionError("s3.credentials_file: '" + file +
                                         "' is readable by group "
                                         "or others (mode " +
                                         mode + "): chmod 600 it");
        }
        std::ifstream in(file);
        if (!in) return NotFoundError("s3.credentials_file: cannot read '" + file + "'");
        std::string line;
        while (std::getline(in, line)) {
          size_t eq = line.find('=');
          if (eq == std::string::npos) continue;
          std::string k = Trim(line.substr(0, eq)), v = Trim(line.substr(eq + 1));
          if (k == "access_key" || k == "aws_access_key_id") o.access_key = v;
          if (k == "secret_key" || k == "aws_secret_access_key") o.secret_key = v;
        }
      }
    }
  }
  if (o.access_key.empty() || o.secret_key.empty()) {
    return InvalidArgumentError(
        "s3 credentials: none found (set DCR_S3_ACCESS_KEY/DCR_S3_SECRET_KEY, "
        "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or a credentials_file)");
  }
  std::unique_ptr<S3Store> s(new S3Store(o));
  if (o.create_bucket) DCR_RETURN_IF_ERROR(s->CreateBucket());
  return s;
}

S3Store::~S3Store() = default;

std::string S3Store::Describe() const { return "s3:" + options_.endpoint + "/" + options_.bucket; }

Status S3Store::CreateBucket() {
  S3Request req(options_, "PUT", "", {});
  req.SetBody("", 0);
  DCR_ASSIGN_OR_RETURN(Response r, req.Run());
  if (r.http == 200) return Status();
  if (r.http == 409 && XmlValue(r.body, "Code") == "BucketAlreadyOwnedByYou") return Status();
  if (r.http == 409 && XmlValue(r.body, "Code") == "BucketAlreadyExists") return Status();
  return req.Error(r);
}

Status S3Store::Put(const std::string& key, const void* data, size_t size) {
  DCR_RETURN_IF_ERROR(ValidateObjectKey(key));
  if (size < options_.multipart_threshold) {
    S3Request req(options_, "PUT", key, {});
    req.SetBody(data, size);
    DCR_ASSIGN_OR_RETURN(Response r, Do(req, {200}));
    return CheckPutEtag(req, r, data, size);
  }
  // Multipart: initiate, upload parts, complete (abort on any error).
  S3Request init(options_, "POST", key, {{"uploads", ""}});
  DCR_ASSIGN_OR_RETURN(Response ir, Do(init, {200}));
  std::string upload_id = XmlValue(ir.body, "UploadId");
  if (upload_id.empty()) {
    return UnavailableError(init.What() + ": no UploadId in the response");
  }
  auto abort = [&](Status s) {
    S3Request ab(options_, "DELETE", key, {{"uploadId", upload_id}});
    ab.Run().status().IgnoreError();
    return s;
  };
  std::string complete = "<CompleteMultipartUpload>";
  const auto* p = static_cast<const uint8_t*>(data);
  int part = 0;
  for (size_t off = 0; off < size; off += options_.part_bytes) {
    ++part;
    size_t n = std::min<size_t>(options_.part_bytes, size - off);
    S3Request pr(options_, "PUT", key,
                 {{"partNumber", std::to_string(part)}, {"uploadId", upload_id}});
    pr.SetBody(p + off, n);
    auto r = Do(pr, {200});
    if (!r.ok()) return abort(r.status());
    std::string etag = r->headers["etag"];
    if (etag.empty()) return abort(UnavailableError(pr.What() + ": part without ETag"));
    if (Status st = CheckPutEtag(pr, *r, p + off, n); !st.ok()) return abort(st);
    complete += "<Part><PartNumber>" + std::to_string(part) + "</PartNumber><ETag>" + etag +
                "</ETag></Part>";
  }
  complete += "</CompleteMultipartUpload>";
  S3Request done(options_, "POST", key, {{"uploadId", upload_id}});
  done.SetBody(complete.data(), complete.size());
  auto r = Do(done, {200});
  if (!r.ok()) return abort(r.status());
  // S3 may answer 200 with an <Error> body for a failed completion.
  if (r->body.find("<Error>") != std::string::npos) {
    return abort(UnavailableError(done.What() + ": " + XmlValue(r->body, "Code") + " " +
                                  XmlValue(r->body, "Message")));
  }
  return Status();
}

StatusOr<std::vector<uint8_t>> S3Store::Get(const std::string& key) {
  DCR_RETURN_IF_ERROR(ValidateObjectKey(key));
  S3Request req(options_, "GET", key, {});
  req.SetMaxBody(options_.max_get_bytes);
  DCR_ASSIGN_OR_RETURN(Response r, Do(req, {200}));
  DCR_RETURN_IF_ERROR(CheckWholeBody(req, r));
  return std::vector<uint8_t>(r.body.begin(), r.body.end());
}

StatusOr<std::vector<uint8_t>> S3Store::GetRange(const std::string& key, uint64_t offset,
                                                 uint64_t length) {
  DCR_RETURN_IF_ERROR(ValidateObjectKey(key));
  if (length == 0) {
    DCR_ASSIGN_OR_RETURN(ObjectInfo info, Head(key));
    if (offset > info.size) {
      return InvalidArgumentError("s3 get " + key + ": offset beyond size");
    }
    return std::vector<uint8_t>();
  }
  S3Request req(options_, "GET", key, {});
  uint64_t last = length > UINT64_MAX - offset ? UINT64_MAX - 1 : offset + length - 1;
  req.AddHeader("Range: bytes=" + std::to_string(offset) + "-" + std::to_string(last));
  // The range's bytes, or a whole object up to its end from a server that ignores Range (cut
  // locally below); never more than a whole-object GET takes.
  req.SetMaxBody(std::min(last + 1, options_.max_get_bytes));
  req.SetMaxPartialBody(last - offset + 1);
  DCR_ASSIGN_OR_RETURN(Response r, req.Run());
  if (r.http == 416) {
    // Offset at or past the end: an empty range at exactly the end is valid.
    DCR_ASSIGN_OR_RETURN(ObjectInfo info, Head(key));
    if (offset == info.size) return std::vector<uint8_t>();
    return InvalidArgumentError("s3 get " + key + ": offset " + std::to_string(offset) +
                                " beyond size " + std::to_string(info.size));
  }
  if (r.http == 206) {
    // "bytes <first>-<last>/<total>": the body must be exactly that range, starting at `offset`.
    const std::string cr = r.headers.count("content-range") ? r.headers["content-range"] : "";
    unsigned long long first = 0, end = 0, total = 0;
    if (std::sscanf(cr.c_str(), "bytes %llu-%llu/%llu", &first, &end, &total) != 3 ||
        first != offset || end < first || end > last || end >= total ||
        r.body.size() != end - first + 1) {
      return DataLossError(req.What() + ": range response of " + std::to_string(r.body.size()) +
                           " bytes does not match Content-Range '" + cr + "' for bytes " +
                           std::to_string(offset) + "-" + std::to_string(last));
    }
    if (first == 0 && end + 1 == total) DCR_RETURN_IF_ERROR(CheckWholeBody(req, r));
    return std::vector<uint8_t>(r.body.begin(), r.body.end());
  }
  if (r.http == 200) {  // server ignored Range: cut locally
    DCR_RETURN_IF_ERROR(CheckWholeBody(req, r));
    if (offset > r.body.size())
      return InvalidArgumentError("s3 get " + key + ": offset beyond size");
    uint64_t n = std::min<uint64_t>(length, r.body.size() - offset);
    return std::vector<uint8_t>(r.body.begin() + static_cast<long>(offset),
                                r.body.begin() + static_cast<long>(offset + n));
  }
  return req.Error(r);
}

StatusOr<ObjectInfo> S3Store::Head(const std::string& key) {
  DCR_RETURN_IF_ERROR(ValidateObjectKey(key));
  S3Request req(options_, "HEAD", key, {});
  DCR_ASSIGN_OR_RETURN(Response r, Do(req, {200}));
  auto it = r.headers.find("content-length");
  if (it == r.headers.end()) return UnavailableError(req.What() + ": no Content-Length");
  return ObjectInfo{key, std::strtoull(it->second.c_str(), nullptr, 10)};
}

StatusOr<std::vector<ObjectInfo>> S3Store::List(const std::string& prefix) {
  // Bounded: pages of at most kMaxListPageBytes, at most max_list_keys keys in all, done within
  // list_deadline_s; and it must progress: S3 lists keys in increasing order, so a key that is
  // not above the previous one (a listing that loops) or a repeated token ends it.
  std::vector<ObjectInfo> out;
  std::string token, last_key;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(options_.list_deadline_s);
  for (;;) {
    std::map<std::string, std::string> q{{"list-type", "2"}, {"prefix", prefix}};
    if (!token.empty()) q["continuation-token"] = token;
    S3Request req(options_, "GET", "", q);
    req.SetMaxBody(kMaxListPageBytes);
    DCR_ASSIGN_OR_RETURN(Response r, Do(req, {200}));
    // Each <Contents> block has one <Key> and one <Size>.
    size_t pos = 0;
    while ((pos = r.body.find("<Contents>", pos)) != std::string::npos) {
      size_t end = r.body.find("</Contents>", pos);
      if (end == std::string::npos) break;
      std::string block = r.body.substr(pos, end - pos);
      ObjectInfo info{XmlValue(block, "Key"),
                      std::strtoull(XmlValue(block, "Size").c_str(), nullptr, 10)};
      if (!out.empty() && info.key <= last_key) {
        return DataLossError(req.What() + ": listing of '" + prefix + "' goes back from key '" +
                             last_key + "' to '" + info.key + "' (keys must increase)");
      }
      if (out.size() >= options_.max_list_keys) {
        return ResourceExhaustedError(req.What() + ": listing of '" + prefix + "' has more than " +
                                      std::to_string(options_.max_list_keys) +
                                      " keys (max_list_keys)");
      }
      last_key = info.key;
      out.push_back(std::move(info));
      pos = end;
    }
    if (XmlValue(r.body, "IsTruncated") != "true") break;
    std::string next = XmlValue(r.body, "NextContinuationToken");
    if (next.empty()) return UnavailableError(req.What() + ": truncated listing without token");
    if (next == token) {
      return DataLossError(req.What() + ": listing of '" + prefix +
                           "' answers the same continuation token again");
    }
    token = std::move(next);
    if (std::chrono::steady_clock::now() > deadline) {
      return DeadlineExceededError(req.What() + ": listing of '" + prefix + "' not done after " +
                                   std::to_string(options_.list_deadline_s) + " s (" +
                                   std::to_string(out.size()) + " keys; list_deadline_s)");
    }
  }
  std::sort(out.begin(), out.end(),
            [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
  return out;
}

Status S3Store::Delete(const std::string& key) {
  DCR_RETURN_IF_ERROR(ValidateObjectKey(key));
  S3Request req(options_, "DELETE", key, {});
  DCR_ASSIGN_OR_RETURN(Response r, Do(req, {200, 204, 404}));
  (void)r;
  return Status();
}

}  // namespace dcr
