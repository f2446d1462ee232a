// The HTTP fault proxy in front of an S3 endpoint (see s3_fault_proxy.h).
#include "s3_fault_proxy.h"

#include <netdb.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "dcr/checkpoint.h"
#include "dcr/status_macros.h"
#include "transport/net.h"

namespace dcr::cli {

const std::vector<std::string>& S3FaultKinds() {
  static const std::vector<std::string> kinds = {"5xx", "cut", "stall", "truncate", "bad_etag"};
  return kinds;
}

std::string S3FaultProxySpecToJson(const S3FaultProxySpec& spec) {
  nlohmann::json j;
  j["listen"] = spec.listen;
  j["upstream"] = spec.upstream;
  j["ca_file"] = spec.ca_file;
  j["log"] = spec.log_path;
  j["faults"] = nlohmann::json::array();
  for (const S3ProxyFault& f : spec.faults) {
    j["faults"].push_back({{"kind", f.kind},
                           {"direction", f.direction},
                           {"at_request", f.at_request},
                           {"seconds", f.seconds}});
  }
  return j.dump(2);
}

StatusOr<S3FaultProxySpec> S3FaultProxySpecFromJson(const std::string& json) {
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (!j.is_object()) return InvalidArgumentError("s3 fault proxy spec: not a JSON object");
  S3FaultProxySpec s;
  try {
    s.listen = j.at("listen").get<std::string>();
    s.upstream = j.at("upstream").get<std::string>();
    s.ca_file = j.value("ca_file", std::string());
    s.log_path = j.at("log").get<std::string>();
    for (const auto& f : j.value("faults", nlohmann::json::array())) {
      S3ProxyFault pf;
      pf.kind = f.at("kind").get<std::string>();
      pf.direction = f.at("direction").get<std::string>();
      pf.at_request = f.value("at_request", uint64_t{1});
      pf.seconds = f.value("seconds", 0.0);
      const auto& kinds = S3FaultKinds();
      if (std::find(kinds.begin(), kinds.end(), pf.kind) == kinds.end()) {
        return InvalidArgumentError("s3 fault proxy spec: unknown fault kind '" + pf.kind + "'");
      }
      if (pf.direction != "upload" && pf.direction != "download") {
        return InvalidArgumentError("s3 fault proxy spec: direction '" + pf.direction +
                                    "' is neither upload nor download");
      }
      if (pf.at_request == 0 || !(pf.seconds >= 0)) {
        return InvalidArgumentError("s3 fault proxy spec: at_request must be >= 1, seconds >= 0");
      }
      s.faults.push_back(pf);
    }
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(std::string("s3 fault proxy spec: ") + e.what());
  }
  return s;
}

namespace {

std::atomic<bool> g_stop{false};
void OnStopSignal(int) { g_stop = true; }

// Bounds on what one request or response may hold in the proxy.
constexpr size_t kMaxHead = 64 << 10;
constexpr uint64_t kMaxBody = uint64_t{1} << 31;
// A peer that moves no byte for this long ends its connection (the proxy's own deadline, far
// beyond any client's read deadline).
constexpr int kIoTimeoutS = 120;

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), ::tolower);
  return s;
}

// A parsed HTTP head: the start line and the header lines, names lower-cased beside the lines.
struct Head {
  std::string start;
  std::vector<std::pair<std::string, std::string>> headers;  // (lower name, value)

  const std::string* Find(const std::string& name) const {
    for (const auto& [n, v] : headers) {
      if (n == name) return &v;
    }
    return nullptr;
  }
  void Set(const std::string& name, const std::string& value) {
    for (auto& [n, v] : headers) {
      if (n == name) {
        v = value;
        return;
      }
    }
    headers.emplace_back(name, value);
  }
  void Erase(const std::string& name) {
    headers.erase(std::remove_if(headers.begin(), headers.end(),
                                 [&](const auto& h) { return h.first == name; }),
                  headers.end());
  }
  // Content-Length, or -1 when absent or malformed.
  int64_t ContentLength() const {
    const std::string* v = Find("content-length");
    if (v == nullptr || v->empty()) return -1;
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v->c_str(), &end, 10);
    if (end == nullptr || *end != '\0' || n > kMaxBody) return -1;
    return static_cast<int64_t>(n);
  }
  std::string Serialize() const {
    std::string out = start + "\r\n";
    for (const auto& [n, v] : headers) out += n + ": " + v + "\r\n";
    return out + "\r\n";
  }
};

bool ParseHead(const std::string& text, Head* h) {
  size_t pos = text.find("\r\n");
  if (pos == std::string::npos) return false;
  h->start = text.substr(0, pos);
  pos += 2;
  while (pos < text.size()) {
    size_t end = text.find("\r\n", pos);
    if (end == std::string::npos || end == pos) break;
    const std::string line = text.substr(pos, end - pos);
    const size_t colon = line.find(':');
    if (colon == std::string::npos) return false;
    std::string value = line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.erase(value.begin());
    while (!value.empty() && value.back() == ' ') value.pop_back();
    h->headers.emplace_back(Lower(line.substr(0, colon)), value);
    pos = end + 2;
  }
  return true;
}

// One end of a proxied exchange: a socket, TLS-wrapped or not.
class Stream {
 public:
  explicit Stream(int fd, SSL* ssl = nullptr) : fd_(fd), ssl_(ssl) {
    timeval tv{kIoTimeoutS, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  }
  ~Stream() {
    if (ssl_ != nullptr) {
      SSL_shutdown(ssl_);
      SSL_free(ssl_);
    }
    if (fd_ >= 0) close(fd_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  int fd() const { return fd_; }
  // Bytes read (0: the peer closed or the read failed).
  size_t ReadSome(char* buf, size_t n) {
    if (ssl_ != nullptr) {
      const int r = SSL_read(ssl_, buf, static_cast<int>(std::min<size_t>(n, 1 << 20)));
      return r > 0 ? static_cast<size_t>(r) : 0;
    }
    const ssize_t r = recv(fd_, buf, n, 0);
    return r > 0 ? static_cast<size_t>(r) : 0;
  }
  bool WriteAll(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t w;
      if (ssl_ != nullptr) {
        w = SSL_write(ssl_, p, static_cast<int>(std::min<size_t>(n, 1 << 20)));
      } else {
        w = send(fd_, p, n, MSG_NOSIGNAL);
      }
      if (w <= 0) return false;
      p += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }
  bool WriteAll(const std::string& s) { return WriteAll(s.data(), s.size()); }

  // Reads up to and including the blank line that ends a head; the bytes read past it stay in
  // `*rest`. False on EOF, error or a head larger than kMaxHead.
  bool ReadHead(std::string* head, std::string* rest) {
    std::string buf = std::move(*rest);
    rest->clear();
    char tmp[16384];
    while (true) {
      const size_t end = buf.find("\r\n\r\n");
      if (end != std::string::npos) {
        *head = buf.substr(0, end + 4);
        *rest = buf.substr(end + 4);
        return true;
      }
      if (buf.size() > kMaxHead) return false;
      const size_t n = ReadSome(tmp, sizeof(tmp));
      if (n == 0) return false;
      buf.append(tmp, n);
    }
  }
  // Appends to `*body` until it holds `want` bytes (want < 0: until EOF). False when the peer
  // ended before `want` bytes.
  bool ReadBody(std::string* body, int64_t want) {
    char tmp[65536];
    while (want < 0 || static_cast<int64_t>(body->size()) < want) {
      size_t cap = sizeof(tmp);
      if (want >= 0) cap = std::min<size_t>(cap, static_cast<size_t>(want) - body->size());
      const size_t n = ReadSome(tmp, cap);
      if (n == 0) return want < 0;
      if (body->size() + n > kMaxBody) return false;
      body->append(tmp, n);
    }
    return true;
  }

 private:
  int fd_;
  SSL* ssl_;
};

struct Upstream {
  bool tls = false;
  std::string host, port;
};

StatusOr<Upstream> ParseUpstream(const std::string& url) {
  Upstream u;
  std::string rest;
  if (url.rfind("http://", 0) == 0) {
    rest = url.substr(7);
  } else if (url.rfind("https://", 0) == 0) {
    u.tls = true;
    rest = url.substr(8);
  } else {
    return InvalidArgumentError("s3 fault proxy: upstream '" + url +
                                "' is not http(s)://host:port");
  }
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  const size_t colon = rest.rfind(':');
  if (rest.empty() || rest.find('/') != std::string::npos) {
    return InvalidArgumentError("s3 fault proxy: upstream '" + url +
                                "' is not http(s)://host:port");
  }
  u.host = colon == std::string::npos ? rest : rest.substr(0, colon);
  u.port = colon == std::string::npos ? (u.tls ? "443" : "80") : rest.substr(colon + 1);
  return u;
}

// An MD5 ETag other than `etag`: its hex digits rotated by one place.
std::string OtherEtag(const std::string& etag) {
  std::string hex = etag;
  if (hex.size() >= 2 && hex.front() == '"' && hex.back() == '"')
    hex = hex.substr(1, hex.size() - 2);
  std::string other = hex.size() > 1 ? hex.substr(1) + hex[0] : "0";
  if (other == hex) other = std::string(32, hex.empty() || hex[0] != '0' ? '0' : 'f');
  return "\"" + other + "\"";
}

class S3Proxy {
 public:
  S3Proxy(const S3FaultProxySpec& spec, Upstream up, SSL_CTX* ctx)
      : spec_(spec), up_(std::move(up)), ctx_(ctx), fired_(spec.faults.size(), false) {}

  Status Serve(int listen_fd) {
    DCR_RETURN_IF_ERROR(WriteLog());
    while (!g_stop) {
      StatusOr<int> fd = internal::Accept(listen_fd, internal::SteadyNow() + 0.1);
      if (!fd.ok()) {
        if (fd.status().IsDeadlineExceeded()) continue;
        break;
      }
      std::lock_guard<std::mutex> l(mu_);
      ++connections_;
      open_fds_.insert(*fd);
      // Detached: a connection's thread ends with its exchange; Serve waits for the last one.
      std::thread([this, f = *fd] {
        {
          Stream client(f);
          Handle(&client);
        }
        // The last touch of the proxy: Serve may return once the set is empty.
        std::lock_guard<std::mutex> l2(mu_);
        open_fds_.erase(f);
        if (open_fds_.empty()) idle_.notify_all();
      }).detach();
    }
    std::unique_lock<std::mutex> l(mu_);
    for (int fd : open_fds_) shutdown(fd, SHUT_RDWR);
    idle_.wait(l, [this] { return open_fds_.empty(); });
    return WriteLogLocked();
  }

 private:
  StatusOr<std::unique_ptr<Stream>> Dial() {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (getaddrinfo(up_.host.c_str(), up_.port.c_str(), &hints, &res) != 0 || res == nullptr) {
      return UnavailableError("s3 fault proxy: cannot resolve " + up_.host);
    }
    int fd = -1;
    for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
      fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        close(fd);
        fd = -1;
      }
    }
    freeaddrinfo(res);
    if (fd < 0) return UnavailableError("s3 fault proxy: cannot connect to " + spec_.upstream);
    if (!up_.tls) return std::make_unique<Stream>(fd);
    SSL* ssl = SSL_new(ctx_);
    if (ssl == nullptr) {
      close(fd);
      return InternalError("s3 fault proxy: SSL_new failed");
    }
    SSL_set_fd(ssl, fd);
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
    if (X509_VERIFY_PARAM_set1_ip_asc(param, up_.host.c_str()) != 1) {
      SSL_set_tlsext_host_name(ssl, up_.host.c_str());
      SSL_set1_host(ssl, up_.host.c_str());
    }
    auto s = std::make_unique<Stream>(fd, ssl);
    if (SSL_connect(ssl) != 1 || SSL_get_verify_result(ssl) != X509_V_OK) {
      return UnavailableError("s3 fault proxy: TLS handshake with " + spec_.upstream + " failed");
    }
    return s;
  }

  // The planned fault of `direction` for its request `n`, claimed when `claim`; null when none.
  // A fault is due at the first request at or after its planned one.
  const S3ProxyFault* Due(const std::string& direction, uint64_t n, bool claim, size_t* index) {
    std::lock_guard<std::mutex> l(mu_);
    for (size_t i = 0; i < spec_.faults.size(); ++i) {
      const S3ProxyFault& f = spec_.faults[i];
      if (!fired_[i] && f.direction == direction && f.at_request <= n) {
        if (claim) fired_[i] = true;
        *index = i;
        return &f;
      }
    }
    return nullptr;
  }
  bool Claim(size_t i) {
    std::lock_guard<std::mutex> l(mu_);
    if (fired_[i]) return false;
    fired_[i] = true;
    return true;
  }

  void Record(const S3ProxyFault& f, uint64_t request, const std::string& method,
              const std::string& path) {
    std::lock_guard<std::mutex> l(mu_);
    injected_.push_back({{"kind", f.kind},
                         {"direction", f.direction},
                         {"request", request},
                         {"method", method},
                         {"path", path},
                         {"seconds", f.seconds},
                         {"at", internal::WallNow()}});
    Status s = WriteLogLocked();
    if (!s.ok()) std::fprintf(stderr, "dcr s3-fault-proxy: %s\n", s.ToString().c_str());
  }

  static void Hold(double seconds) {
    const double until = internal::SteadyNow() + seconds;
    while (!g_stop && internal::SteadyNow() < until) usleep(10000);
  }

  static bool Answer503(Stream* client) {
    const std::string body =
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code><Message>Please "
        "reduce your request rate.</Message></Error>";
    return client->WriteAll(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\n"
        "Content-Length: " +
        std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
  }

  void Handle(Stream* client) {
    std::string head_text, body;
    if (!client->ReadHead(&head_text, &body)) return;
    Head req;
    if (!ParseHead(head_text, &req)) return;
    const size_t sp1 = req.start.find(' ');
    const size_t sp2 = req.start.find(' ', sp1 + 1);
    if (sp1 == std::string::npos || sp2 == std::string::npos) return;
    const std::string method = req.start.substr(0, sp1);
    const std::string target = req.start.substr(sp1 + 1, sp2 - sp1 - 1);
    const std::string path = target.substr(0, target.find('?'));
    // "/<bucket>/<key>": an object request.
    const size_t slash = path.find('/', 1);
    const bool object = path.size() > 1 && slash != std::string::npos && slash + 1 < path.size();
    const int64_t length = req.ContentLength();
    if (length < 0 && (method == "PUT" || method == "POST")) return;  // no chunked bodies
    const bool upload = object && method == "PUT" && length > 0;
    const bool download = object && method == "GET";
    uint64_t n = 0;
    if (upload) n = ++uploads_;
    if (download) n = ++downloads_;
    size_t index = 0;
    const S3ProxyFault* fault = nullptr;
    if (upload) fault = Due("upload", n, /*claim=*/true, &index);
    if (download) {
      fault = Due("download", n, /*claim=*/false, &index);
      if (fault != nullptr && fault->kind == "5xx" && !Claim(index)) fault = nullptr;
    }
    const std::string kind = fault != nullptr ? fault->kind : "";

    const std::string* expect = req.Find("expect");
    if (expect != nullptr && Lower(*expect) == "100-continue") {
      if (!client->WriteAll(std::string("HTTP/1.1 100 Continue\r\n\r\n"))) return;
    }
    req.Erase("expect");
    const int64_t want = std::max<int64_t>(length, 0);
    if (upload && (kind == "cut" || kind == "stall")) {
      client->ReadBody(&body, want / 2);
      Record(*fault, n, method, path);
      if (kind == "stall") Hold(fault->seconds);
      return;  // the connection closes mid-body
    }
    if (static_cast<int64_t>(body.size()) > want) body.resize(static_cast<size_t>(want));
    if (!client->ReadBody(&body, want)) return;
    if (kind == "5xx" && (upload || download)) {
      Record(*fault, n, method, path);
      Answer503(client);
      return;
    }
    if (upload && kind == "truncate") {
      body.resize(body.size() / 2);
      req.Set("content-length", std::to_string(body.size()));
      Record(*fault, n, method, path);
    }
    req.Erase("connection");
    req.Erase("keep-alive");
    req.Set("connection", "close");

    auto up = Dial();
    if (!up.ok()) {
      std::fprintf(stderr, "dcr s3-fault-proxy: %s\n", up.status().ToString().c_str());
      return;
    }
    if (!(*up)->WriteAll(req.Serialize()) || !(*up)->WriteAll(body)) return;
    std::string resp_text, resp_body;
    Head resp;
    // Interim (1xx) answers are passed on; the final one follows.
    while (true) {
      if (!(*up)->ReadHead(&resp_text, &resp_body)) return;
      resp = Head();
      if (!ParseHead(resp_text, &resp)) return;
      if (resp.start.size() >= 10 && resp.start[9] == '1') {
        if (!client->WriteAll(resp_text)) return;
        continue;
      }
      break;
    }
    const int status = resp.start.size() >= 12 ? std::atoi(resp.start.c_str() + 9) : 0;
    const bool no_body = method == "HEAD" || status == 204 || status == 304;
    const int64_t resp_length = no_body ? 0 : resp.ContentLength();
    if (resp_length >= 0 && static_cast<int64_t>(resp_body.size()) > resp_length) {
      resp_body.resize(static_cast<size_t>(resp_length));
    }
    if (!(*up)->ReadBody(&resp_body, resp_length)) return;  // cut by the upstream: so is ours
    resp.Erase("connection");
    resp.Erase("keep-alive");
    resp.Set("connection", "close");
    const bool ok2xx = status >= 200 && status < 300;
    if (upload && kind == "bad_etag" && ok2xx && resp.Find("etag") != nullptr) {
      resp.Set("etag", OtherEtag(*resp.Find("etag")));
      Record(*fault, n, method, path);
    }
    if (download && fault != nullptr && kind != "5xx" && ok2xx && resp_length >= 2 &&
        (kind != "bad_etag" || resp.Find("etag") != nullptr) && Claim(index)) {
      Record(*fault, n, method, path);
      const size_t half = resp_body.size() / 2;
      if (kind == "cut" || kind == "stall") {
        client->WriteAll(resp.Serialize());
        client->WriteAll(resp_body.data(), half);
        if (kind == "stall") Hold(fault->seconds);
        return;
      }
      if (kind == "truncate") {
        resp.Set("content-length", std::to_string(half));
        resp_body.resize(half);
      } else if (kind == "bad_etag") {
        resp.Set("etag", OtherEtag(*resp.Find("etag")));
      }
    }
    if (!client->WriteAll(resp.Serialize())) return;
    client->WriteAll(resp_body);
  }

  Status WriteLog() {
    std::lock_guard<std::mutex> l(mu_);
    return WriteLogLocked();
  }

  Status WriteLogLocked() {
    nlohmann::json j;
    j["upstream"] = spec_.upstream;
    j["connections"] = connections_;
    j["uploads"] = uploads_.load();
    j["downloads"] = downloads_.load();
    j["injected"] = injected_;
    const std::string text = j.dump(2);
    return WriteFileAtomic(spec_.log_path, text.data(), text.size());
  }

  const S3FaultProxySpec spec_;
  const Upstream up_;
  SSL_CTX* ctx_;
  std::mutex mu_;
  std::vector<bool> fired_;
  std::set<int> open_fds_;        // connections being served
  std::condition_variable idle_;  // notified when open_fds_ empties
  std::atomic<uint64_t> uploads_{0}, downloads_{0};
  uint64_t connections_ = 0;
  nlohmann::json injected_ = nlohmann::json::array();
};

}  // namespace

Status RunS3FaultProxy(const S3FaultProxySpec& spec) {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  DCR_ASSIGN_OR_RETURN(Upstream up, ParseUpstream(spec.upstream));
  SSL_CTX* ctx = nullptr;
  if (up.tls) {
    ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == nullptr) return InternalError("s3 fault proxy: SSL_CTX_new failed");
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    const int loaded = spec.ca_file.empty()
                           ? SSL_CTX_set_default_verify_paths(ctx)
                           : SSL_CTX_load_verify_locations(ctx, spec.ca_file.c_str(), nullptr);
    if (loaded != 1) {
      SSL_CTX_free(ctx);
      return NotFoundError("s3 fault proxy: cannot load the CAs of '" +
                           (spec.ca_file.empty() ? std::string("the system") : spec.ca_file) + "'");
    }
  }
  StatusOr<int> listen_fd = internal::Listen(spec.listen);
  if (!listen_fd.ok()) {
    if (ctx != nullptr) SSL_CTX_free(ctx);
    return listen_fd.status();
  }
  Status s;
  {
    S3Proxy proxy(spec, up, ctx);
    s = proxy.Serve(*listen_fd);
  }
  close(*listen_fd);
  if (ctx != nullptr) SSL_CTX_free(ctx);
  return s;
}

}  // namespace dcr::cli
