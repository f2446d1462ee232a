#include "transport/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <unordered_set>

#include "dcr/status_macros.h"

namespace dcr::internal {

std::string WireMismatch(const FrameHeader& h, uint64_t run, uint64_t version) {
  const std::string peer = "peer rank " + std::to_string(h.from_rank);
  if (h.protocol != kWireProtocol) {
    return peer + " speaks dcr wire protocol " + std::to_string(h.protocol) + ", this node " +
           std::to_string(kWireProtocol);
  }
  char ids[80];
  if (h.run != run) {
    std::snprintf(ids, sizeof(ids), "run 0x%016llx, this node's run 0x%016llx",
                  static_cast<unsigned long long>(h.run), static_cast<unsigned long long>(run));
    return peer + " is of " + ids;
  }
  if (h.version != version) {
    return peer + " sends version " + std::to_string(h.version) + ", this node waits for version " +
           std::to_string(version);
  }
  return std::string();
}

double WallNow() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

double SteadyNow() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

namespace {

// The address of the peer of connected socket `fd`, without its port ("?" if unknown).
std::string PeerHost(int fd) {
  sockaddr_storage a{};
  socklen_t n = sizeof(a);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &n) != 0) return "?";
  char buf[INET6_ADDRSTRLEN] = "?";
  if (a.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&a)->sin_addr, buf, sizeof(buf));
  } else if (a.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&a)->sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

Status SplitAddress(const std::string& address, std::string* host, std::string* port) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return InvalidArgumentError("address '" + address + "': expected host:port");
  }
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  return Status();
}

StatusOr<addrinfo*> Resolve(const std::string& address, bool passive) {
  std::string host, port;
  DCR_RETURN_IF_ERROR(SplitAddress(address, &host, &port));
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    return UnavailableError("address '" + address + "': " + gai_strerror(rc));
  }
  return res;
}

void TuneSocket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  int buf = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
}

}  // namespace

StatusOr<int> Listen(const std::string& address) {
  DCR_ASSIGN_OR_RETURN(addrinfo * ai, Resolve(address, true));
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(ai);
    return UnavailableError(ErrnoError("socket for " + address, errno).message());
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
    int e = errno;
    freeaddrinfo(ai);
    close(fd);
    return UnavailableError(ErrnoError("listen on " + address, e).message());
  }
  freeaddrinfo(ai);
  return fd;
}

StatusOr<int> Connect(const std::string& address, double deadline) {
  DCR_ASSIGN_OR_RETURN(addrinfo * ai, Resolve(address, false));
  int last_errno = 0;
  while (true) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      freeaddrinfo(ai);
      return UnavailableError(ErrnoError("socket for " + address, errno).message());
    }
    TuneSocket(fd);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      freeaddrinfo(ai);
      return fd;
    }
    last_errno = errno;
    close(fd);
    if (SteadyNow() >= deadline) break;
    usleep(20000);
  }
  freeaddrinfo(ai);
  return UnavailableError("peer " + address + " unreachable: " + std::strerror(last_errno));
}

StatusOr<int> Accept(int listen_fd, double deadline) {
  while (true) {
    double left = deadline - SteadyNow();
    if (left <= 0)
      return DeadlineExceededError("no connection from the parent before the deadline");
    pollfd p{listen_fd, POLLIN, 0};
    int rc = poll(&p, 1, static_cast<int>(std::min(left, 1.0) * 1000) + 1);
    if (rc < 0 && errno != EINTR) return UnavailableError(ErrnoError("poll", errno).message());
    if (rc <= 0) continue;
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return UnavailableError(ErrnoError("accept", errno).message());
    }
    TuneSocket(fd);
    return fd;
  }
}

namespace {

void SetNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

}  // namespace

// ---- Conn ----

Conn::Conn(int fd, bool owns) : fd_(fd), owns_(owns) {}

Conn::Conn(int fd, ssl_st* ssl, TlsIdentity peer)
    : fd_(fd), owns_(true), ssl_(ssl), peer_(std::move(peer)) {}

Conn::~Conn() {
  if (ssl_ != nullptr) SSL_free(ssl_);
  if (owns_ && fd_ >= 0) close(fd_);
}

void Conn::Shutdown() {
  shut_ = true;
  shutdown(fd_, SHUT_RDWR);
}

double Conn::IdleUntil() const { return idle_timeout_s_ > 0 ? SteadyNow() + idle_timeout_s_ : 0; }

Status Conn::WaitFor(short events, double until, const char* what) {
  while (true) {
    if (shut_) return UnavailableError("connection shut down");
    int wait_ms = 1000;
    if (until > 0) {
      const double left = until - SteadyNow();
      if (left <= 0) {
        char text[128];
        std::snprintf(text, sizeof(text), "%s for %.1f s (read deadline)",
                      what != nullptr ? what : "no progress", idle_timeout_s_);
        return UnavailableError(text);
      }
      wait_ms = std::min(wait_ms, static_cast<int>(left * 1000) + 1);
    }
    pollfd p{fd_, events, 0};
    int rc = poll(&p, 1, wait_ms);
    if (rc < 0 && errno != EINTR) return UnavailableError(ErrnoError("poll", errno).message());
    if (rc > 0) return Status();
  }
}

Status Conn::Write(const void* data, size_t size) {
  return Move(true, const_cast<void*>(data), size);
}

Status Conn::Read(void* data, size_t size) { return Move(false, data, size); }

Status Conn::Move(bool write, void* data, size_t size) {
  const char* idle = write ? "the peer took no bytes" : "no bytes from the peer";
  auto* p = static_cast<uint8_t*>(data);
  double until = IdleUntil();
  while (size > 0) {
    ssize_t n;
    if (ssl_ == nullptr) {
      n = write ? send(fd_, p, size, MSG_NOSIGNAL | MSG_DONTWAIT)
                : recv(fd_, p, size, MSG_DONTWAIT);
      if (n == 0 && !write) return UnavailableError("peer closed the connection");
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN) {
          return UnavailableError(ErrnoError(write ? "send" : "recv", errno).message());
        }
        DCR_RETURN_IF_ERROR(WaitFor(write ? POLLOUT : POLLIN, until, idle));
        continue;
      }
    } else {
      int err = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ERR_clear_error();
        const int chunk = static_cast<int>(std::min<size_t>(size, 1 << 30));
        n = write ? SSL_write(ssl_, p, chunk) : SSL_read(ssl_, p, chunk);
        if (n <= 0) err = SSL_get_error(ssl_, static_cast<int>(n));
      }
      if (n <= 0) {
        // Either direction of TLS may need the socket readable or writable (a renegotiation,
        // a post-handshake message).
        if (err == SSL_ERROR_WANT_WRITE || err == SSL_ERROR_WANT_READ) {
          DCR_RETURN_IF_ERROR(WaitFor(err == SSL_ERROR_WANT_WRITE ? POLLOUT : POLLIN, until, idle));
          continue;
        }
        if (err == SSL_ERROR_SYSCALL || (!write && err == SSL_ERROR_ZERO_RETURN)) {
          ERR_clear_error();
          return UnavailableError(write ? "TLS send: peer closed the connection"
                                        : "peer closed the connection");
        }
        return UnavailableError((write ? "TLS send: " : "TLS receive: ") + TlsErrors());
      }
    }
    p += n;
    size -= static_cast<size_t>(n);
    until = IdleUntil();
  }
  return Status();
}

StatusOr<std::unique_ptr<Conn>> ConnectTo(const std::string& address, double deadline,
                                          const TlsContext* tls, int child_rank,
                                          double handshake_timeout_s) {
  DCR_ASSIGN_OR_RETURN(int fd, Connect(address, deadline));
  if (tls == nullptr) return std::make_unique<Conn>(fd);
  SetNonBlocking(fd);
  SSL* ssl = tls->NewSsl(fd, /*server=*/false);
  if (ssl == nullptr) {
    close(fd);
    return InternalError("SSL_new: " + TlsErrors());
  }
  Status s = TlsHandshake(
      ssl, fd, std::min(deadline, SteadyNow() + kHandshakeProgressFactor * handshake_timeout_s),
      handshake_timeout_s);
  StatusOr<TlsIdentity> id =
      s.ok() ? tls->CheckPeer(ssl, TlsPeer::kChild) : StatusOr<TlsIdentity>(s);
  if (id.ok() && id->rank != child_rank) {
    id = FailedPreconditionError("the peer's certificate is rank " + std::to_string(id->rank) +
                                 ", not rank " + std::to_string(child_rank));
  }
  if (!id.ok()) {
    SSL_free(ssl);
    close(fd);
    const Status& e = id.status();
    return Status(e.code(), "peer " + address + " refused: " + e.message());
  }
  return std::make_unique<Conn>(fd, ssl, *id);
}

namespace {

// The state of one AcceptHellos call: the connections accepted and not yet read to their hello,
// the hellos taken, and the rate limit of the refusals reported.
class HelloAcceptor {
 public:
  HelloAcceptor(int listen_fd, int want, double deadline, double hello_timeout_s,
                const TlsContext* tls,
                const std::function<bool(const FrameHeader&, const TlsIdentity*)>& accept_hello,
                const std::function<void(const std::string&)>& refused,
                const std::function<bool()>& give_up, const std::function<bool(Hello*)>& hold)
      : listen_fd_(listen_fd),
        want_(want),
        deadline_(deadline),
        hello_timeout_s_(hello_timeout_s),
        tls_(tls),
        accept_hello_(accept_hello),
        refused_(refused),
        give_up_(give_up),
        hold_(hold) {}

  StatusOr<std::vector<Hello>> Run();

 private:
  static constexpr size_t kMaxPendingHellos = 64;
  // One source address may hold at most this many of them (a flood from one host churns its own
  // share, not the others').
  static constexpr size_t kMaxPendingPerSource = 16;
  // Refusals passed to `refused`: at most this many per second, the rest counted and named in
  // the next one that is passed (a flood of connections writes a few lines, not one each).
  static constexpr int kRefusalsPerSecond = 10;

  struct Pending {
    int fd;
    double until;       // dropped when still pending then (extended while it sends)
    double latest = 0;  // the furthest `until` may be extended
    size_t got = 0;
    FrameHeader header;
    SSL* ssl = nullptr;       // TLS: the connection's SSL object
    bool handshaken = false;  // TLS: handshake done and peer accepted
    short events = POLLIN;
    TlsIdentity peer;
    std::string source;       // the peer's address, without the port
    bool progressed = false;  // it has sent a byte (a ClientHello, a hello) since its accept
  };

  // Passes `why` to `refused`, at most kRefusalsPerSecond a second (the rest counted and named in
  // the next one passed).
  void Report(const std::string& why);
  // Closes connection i (refused for `why`).
  void Drop(size_t i, const std::string& why);
  // Closes every connection and drops the hellos taken: the call fails with `s`.
  Status Fail(Status s);
  // Advances connection i as far as its bytes allow: handshake, peer check, hello. Returns
  // the reason to drop it ("" and *drop_it false to keep waiting, or when it is done);
  // *refused_hello when its whole hello was refused (the connection `hold` is offered).
  std::string Advance(size_t i, bool* drop_it, bool* done, bool* refused_hello);
  // Advances every connection `fds` (listener first) shows ready; takes, holds or drops those
  // whose hello is complete.
  void AdvanceReady(const std::vector<pollfd>& fds);
  // Accepts, when `listener` (the listening socket's poll entry) shows connections, every one
  // queued (up to the cap), making room by the eviction rule. Errors (every connection closed,
  // as Fail): accept or SSL_new fails.
  Status AcceptQueued(const pollfd& listener);

  const int listen_fd_;
  const int want_;
  const double deadline_;
  const double hello_timeout_s_;
  const TlsContext* const tls_;
  const std::function<bool(const FrameHeader&, const TlsIdentity*)>& accept_hello_;
  const std::function<void(const std::string&)>& refused_;
  const std::function<bool()>& give_up_;
  const std::function<bool(Hello*)>& hold_;
  double next_give_up_check_ = 0;
  bool giving_up_ = false;  // give_up said so: only the connections already made are finished
  std::vector<Pending> pending_;
  std::vector<Hello> out_;
  int dropped_ = 0;
  double refusal_window_ = 0;
  int refusals_in_window_ = 0, refusals_unlogged_ = 0;
};

void HelloAcceptor::Report(const std::string& why) {
  if (!refused_ || why.empty()) return;
  const double now = SteadyNow();
  if (now - refusal_window_ >= 1.0) {
    refusal_window_ = now;
    refusals_in_window_ = 0;
  }
  if (++refusals_in_window_ > kRefusalsPerSecond) {
    ++refusals_unlogged_;
    return;
  }
  if (refusals_unlogged_ == 0) return refused_(why);
  refused_(why + " (and " + std::to_string(refusals_unlogged_) +
           " more connections refused, not logged)");
  refusals_unlogged_ = 0;
}

void HelloAcceptor::Drop(size_t i, const std::string& why) {
  Report(why);
  if (pending_[i].ssl != nullptr) SSL_free(pending_[i].ssl);
  close(pending_[i].fd);
  pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
  ++dropped_;
}

Status HelloAcceptor::Fail(Status s) {
  for (auto& p : pending_) {
    if (p.ssl != nullptr) SSL_free(p.ssl);
    close(p.fd);
  }
  out_.clear();
  return s;
}

std::string HelloAcceptor::Advance(size_t i, bool* drop_it, bool* done, bool* refused_hello) {
  Pending& p = pending_[i];
  *drop_it = false;
  *done = false;
  *refused_hello = false;
  if (p.ssl != nullptr && !p.handshaken) {
    ERR_clear_error();
    int rc = SSL_do_handshake(p.ssl);
    if (rc != 1) {
      int err = SSL_get_error(p.ssl, rc);
      if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        p.events = err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
        return std::string();
      }
      *drop_it = true;
      const long verify = SSL_get_verify_result(p.ssl);
      std::string why = err == SSL_ERROR_SYSCALL || err == SSL_ERROR_ZERO_RETURN
                            ? "closed during the TLS handshake"
                            : "TLS handshake failed: " + TlsErrors();
      if (verify != X509_V_OK)
        why += std::string(" (") + X509_verify_cert_error_string(verify) + ")";
      ERR_clear_error();
      return why;
    }
    auto id = tls_->CheckPeer(p.ssl, TlsPeer::kParent);
    if (!id.ok()) {
      *drop_it = true;
      return "refused: " + id.status().message();
    }
    p.peer = *id;
    p.handshaken = true;
  }
  while (p.got < sizeof(FrameHeader)) {
    auto* dst = reinterpret_cast<uint8_t*>(&p.header) + p.got;
    const size_t left = sizeof(FrameHeader) - p.got;
    if (p.ssl != nullptr) {
      ERR_clear_error();
      int n = SSL_read(p.ssl, dst, static_cast<int>(left));
      if (n <= 0) {
        int err = SSL_get_error(p.ssl, n);
        if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
          p.events = err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
          return std::string();
        }
        ERR_clear_error();
        *drop_it = true;
        return std::string("closed before its hello");
      }
      p.got += static_cast<size_t>(n);
    } else {
      ssize_t r = recv(p.fd, dst, left, MSG_DONTWAIT);
      if (r < 0 && (errno == EINTR || errno == EAGAIN)) return std::string();
      if (r <= 0) {
        *drop_it = true;
        return std::string("closed before its hello");
      }
      p.got += static_cast<size_t>(r);
    }
  }
  if (!accept_hello_(p.header, p.ssl != nullptr ? &p.peer : nullptr)) {
    *drop_it = true;
    *refused_hello = true;
    return std::string();  // accept_hello says why
  }
  *done = true;
  return std::string();
}

void HelloAcceptor::AdvanceReady(const std::vector<pollfd>& fds) {
  // Connections first (indices shift as they are dropped: walk backwards).
  for (size_t i = pending_.size(); i-- > 0;) {
    if (fds[i + 1].revents == 0) continue;
    pending_[i].progressed = true;
    if (fds[i + 1].revents & POLLIN) {
      // Bytes from the peer: it is slow, not silent; the silence limit starts again.
      pending_[i].until =
          std::max(pending_[i].until, std::min(pending_[i].latest, SteadyNow() + hello_timeout_s_));
    }
    bool drop_it = false, done = false, refused_hello = false;
    const std::string why = Advance(i, &drop_it, &done, &refused_hello);
    if (drop_it && !(refused_hello && hold_)) {
      Drop(i, why);
      continue;
    }
    if (!done && !drop_it) continue;
    Pending& p = pending_[i];
    std::unique_ptr<Conn> conn = p.ssl != nullptr ? std::make_unique<Conn>(p.fd, p.ssl, p.peer)
                                                  : std::make_unique<Conn>(p.fd);
    Hello h{std::move(conn), p.header};
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    if (!drop_it) {
      out_.push_back(std::move(h));
    } else if (!hold_(&h) || h.conn != nullptr) {
      ++dropped_;  // not taken: closed with its Conn
    }
  }
}

Status HelloAcceptor::AcceptQueued(const pollfd& listener) {
  // Every connection the listener has queued (up to the cap), not one per wakeup: a flood of
  // connections must not fill the backlog in front of the parent's.
  for (size_t k = 0; listener.revents != 0 && k < kMaxPendingHellos; ++k) {
    if (k > 0) {
      pollfd more{listen_fd_, POLLIN, 0};
      if (poll(&more, 1, 0) <= 0) break;
    }
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) break;
      return Fail(UnavailableError(ErrnoError("accept", errno).message()));
    }
    TuneSocket(fd);
    const std::string source = PeerHost(fd);
    // Full (in all, or for this source): the new connection takes the place of one that has
    // not authenticated, of this source when its share is full, else of the source holding
    // the most; among those one that has sent nothing first, then the oldest. A source with
    // few connections (a parent on its own host) keeps them while others flood. An
    // authenticated connection (TLS peer accepted) is never dropped for a new one; when only
    // such are left the new one is closed.
    auto held_by = [&](const std::string& s) {
      size_t n = 0;
      for (const auto& q : pending_) n += q.source == s;
      return n;
    };
    const bool source_full = held_by(source) >= kMaxPendingPerSource;
    if (source_full || pending_.size() >= kMaxPendingHellos) {
      size_t victim = pending_.size(), victim_share = 0;
      for (size_t i = 0; i < pending_.size(); ++i) {
        const Pending& q = pending_[i];
        if (q.handshaken || (source_full && q.source != source)) continue;
        const size_t share = held_by(q.source);
        if (victim == pending_.size() || share > victim_share ||
            (share == victim_share && !q.progressed && pending_[victim].progressed)) {
          victim = i;
          victim_share = share;
        }
      }
      if (victim == pending_.size()) {
        Report("too many connections waiting (" + source + ")");
        close(fd);
        ++dropped_;
        continue;
      }
      Drop(victim, "too many connections waiting (" + pending_[victim].source + ")");
    }
    const double accepted = SteadyNow();
    Pending p{fd, accepted + hello_timeout_s_,
              accepted + kHandshakeProgressFactor * hello_timeout_s_};
    p.source = source;
    if (tls_ != nullptr) {
      SetNonBlocking(fd);
      p.ssl = tls_->NewSsl(fd, /*server=*/true);
      if (p.ssl == nullptr) {
        close(fd);
        return Fail(InternalError("SSL_new: " + TlsErrors()));
      }
    }
    pending_.push_back(p);
  }
  return Status();
}

StatusOr<std::vector<Hello>> HelloAcceptor::Run() {
  while (static_cast<int>(out_.size()) < want_) {
    const double now = SteadyNow();
    if (now >= deadline_) {
      return Fail(DeadlineExceededError(
          "no connection from the parent before the deadline (" + std::to_string(out_.size()) +
          " of " + std::to_string(want_) + " streams, " + std::to_string(dropped_) +
          " connections without a valid hello dropped)"));
    }
    if (give_up_ && out_.empty() && (giving_up_ || now >= next_give_up_check_)) {
      next_give_up_check_ = now + 0.5;
      if (giving_up_ || give_up_()) {
        // Connections already made are read to their hello first (taken, kept or refused): one
        // closed unread looks to its peer like this node dying. Each is bounded by the hello
        // timeout.
        giving_up_ = true;
        pollfd waiting{listen_fd_, POLLIN, 0};
        if (pending_.empty() && poll(&waiting, 1, 0) <= 0) {
          return Fail(AbortedError("stopped waiting for the parent (" + std::to_string(dropped_) +
                                   " connections without a valid hello dropped)"));
        }
      }
    }
    for (size_t i = pending_.size(); i-- > 0;) {
      if (now >= pending_[i].until) Drop(i, "no hello within the deadline");
    }
    double wake = std::min(deadline_, now + (give_up_ ? 0.5 : 1.0));
    for (const auto& p : pending_) wake = std::min(wake, p.until);
    std::vector<pollfd> fds;
    fds.push_back(pollfd{listen_fd_, POLLIN, 0});
    for (const auto& p : pending_) fds.push_back(pollfd{p.fd, p.events, 0});
    int rc = poll(fds.data(), fds.size(), static_cast<int>((wake - now) * 1000) + 1);
    if (rc < 0) {
      if (errno == EINTR) continue;
      return Fail(UnavailableError(ErrnoError("poll", errno).message()));
    }
    if (rc == 0) continue;
    AdvanceReady(fds);
    DCR_RETURN_IF_ERROR(AcceptQueued(fds[0]));
  }
  for (auto& p : pending_) {
    if (p.ssl != nullptr) SSL_free(p.ssl);
    close(p.fd);
  }
  if (refused_ && refusals_unlogged_ > 0) {
    refused_(std::to_string(refusals_unlogged_) + " more connections refused, not logged");
  }
  return std::move(out_);
}

}  // namespace

StatusOr<std::vector<Hello>> AcceptHellos(
    int listen_fd, int want, double deadline, double hello_timeout_s, const TlsContext* tls,
    const std::function<bool(const FrameHeader&, const TlsIdentity*)>& accept_hello,
    const std::function<void(const std::string&)>& refused, const std::function<bool()>& give_up,
    const std::function<bool(Hello*)>& hold) {
  return HelloAcceptor(listen_fd, want, deadline, hello_timeout_s, tls, accept_hello, refused,
                       give_up, hold)
      .Run();
}

Status WriteFull(int fd, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    ssize_t w = send(fd, p, size, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return UnavailableError(ErrnoError("send", errno).message());
    }
    p += w;
    size -= static_cast<size_t>(w);
  }
  return Status();
}

Status ReadFull(int fd, void* data, size_t size) {
  auto* p = static_cast<uint8_t*>(data);
  while (size > 0) {
    ssize_t r = recv(fd, p, size, 0);
    if (r == 0) return UnavailableError("peer closed the connection");
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return UnavailableError(ErrnoError("recv", errno).message());
    }
    p += r;
    size -= static_cast<size_t>(r);
  }
  return Status();
}

namespace {

// Binds a TCP socket to 127.0.0.1:port (0: the kernel picks) and returns the bound port, or -1
// with errno set.
int BindLoopback(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(a);
  int bound = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    bound = ntohs(a.sin_port);
  }
  int e = errno;
  close(fd);
  errno = e;
  return bound;
}

// The first port of the kernel's ephemeral range (32768 when it cannot be read).
int EphemeralLow() {
  int low = 32768, high = 60999;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &low, &high) != 2) low = 32768;
    std::fclose(f);
  }
  return low;
}

}  // namespace

StatusOr<int> FreePort() {
  constexpr int kFirst = 10000;  // below: well-known and registered services cluster
  // Ports this process handed out lately: a port is free when checked, but the node meant to
  // listen on it may not have bound it yet when the next one is drawn (a plan names every
  // node's address first), so a draw never returns one of them again.
  constexpr size_t kRemembered = 4096;
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  static std::deque<int> handed_out;
  static std::unordered_set<int> handed_set;
  auto hand_out = [&](int port) {  // REQUIRES: mu held
    handed_out.push_back(port);
    handed_set.insert(port);
    if (handed_out.size() > kRemembered) {
      handed_set.erase(handed_out.front());
      handed_out.pop_front();
    }
    return port;
  };
  std::lock_guard<std::mutex> lock(mu);
  const int low = EphemeralLow();
  if (low - kFirst >= 1024) {
    for (int attempt = 0; attempt < 64; ++attempt) {
      const int port = kFirst + static_cast<int>(rng() % static_cast<uint64_t>(low - kFirst));
      if (handed_set.count(port) == 0 && BindLoopback(port) == port) return hand_out(port);
    }
  }
  for (int attempt = 0; attempt < 64; ++attempt) {
    const int port = BindLoopback(0);
    if (port < 0) return UnavailableError(ErrnoError("bind 127.0.0.1:0", errno).message());
    if (handed_set.count(port) == 0) return hand_out(port);
  }
  return UnavailableError("no free loopback port that this process has not handed out lately");
}

// ---- TokenBucket ----

namespace {

// Sleeps `seconds` (nothing when <= 0), through signals.
void SleepFor(double seconds) {
  if (seconds <= 0) return;
  timespec ts{static_cast<time_t>(seconds),
              static_cast<long>((seconds - static_cast<time_t>(seconds)) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

}  // namespace

void TokenBucket::Acquire(uint64_t n) {
  if (rate_ <= 0) return;
  // After idleness the link's clock may lag by burst bytes: they pass at once.
  const double now = SteadyNow();
  const double done = Reserve(n, now - burst_ / rate_);
  SleepFor(done - now);
}

double TokenBucket::Reserve(uint64_t n, double ready) {
  if (rate_ <= 0) return ready;
  std::lock_guard<std::mutex> lock(mu_);
  free_at_ = std::max(free_at_, ready) + static_cast<double>(n) / rate_;
  return free_at_;
}

// ---- FrameWriter ----

FrameWriter::FrameWriter(int fd, std::shared_ptr<TokenBucket> bucket, double latency_s,
                         uint64_t window_bytes)
    : FrameWriter(new Conn(fd, /*owns=*/false), std::move(bucket), latency_s, window_bytes) {
  own_conn_.reset(conn_);
}

FrameWriter::FrameWriter(Conn* conn, std::shared_ptr<TokenBucket> bucket, double latency_s,
                         uint64_t window_bytes)
    : conn_(conn), bucket_(std::move(bucket)), latency_s_(latency_s), window_bytes_(window_bytes) {
  last_send_ = SteadyNow();
  pacer_ = std::thread([this] { PaceLoop(); });
  delayer_ = std::thread([this] { DelayLoop(); });
}

FrameWriter::~FrameWriter() { Close(); }

void FrameWriter::Send(const FrameHeader& header, const uint8_t* payload,
                       std::shared_ptr<const void> keep, std::function<void(Status)> accepted) {
  const double now = SteadyNow();
  last_send_ = now;
  std::lock_guard<std::mutex> lock(mu_);
  items_.push_back(Item{header, payload, std::move(keep), std::move(accepted), now});
  cv_.notify_all();
}

void FrameWriter::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
    cv_.notify_all();
  }
  if (pacer_.joinable()) pacer_.join();
  if (delayer_.joinable()) delayer_.join();
}

void FrameWriter::PaceLoop() {
  constexpr size_t kSegment = 64 << 10;
  while (true) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !items_.empty() || closing_; });
      if (items_.empty()) break;
      item = std::move(items_.front());
      items_.pop_front();
    }
    const size_t total = sizeof(FrameHeader) + item.header.length;
    size_t pos = 0;  // over header + payload
    bool first = true;
    do {
      size_t n = std::min(kSegment, total - pos);
      double ready = item.sent_at;
      if (window_bytes_ > 0) {
        std::unique_lock<std::mutex> lock(mu_);
        auto open = [&] {
          return line_bytes_ == 0 || line_bytes_ + n <= window_bytes_ || !error_.ok();
        };
        if (!open()) {
          cv_.wait(lock, open);
          ready = std::max(ready, SteadyNow());
        }
      }
      // The segment leaves the link at the link's time; the pacer waits for it so the delay line
      // holds what a real link would have sent by now (and `accepted` runs then).
      const double left = bucket_ ? bucket_->Reserve(n, ready) : ready;
      SleepFor(left - SteadyNow());
      Segment seg;
      seg.deliver_at = left + latency_s_;
      seg.line_bytes = n;
      size_t payload_from = pos;
      if (first) {
        const auto* h = reinterpret_cast<const uint8_t*>(&item.header);
        seg.header_bytes.assign(h, h + sizeof(FrameHeader));
        payload_from = sizeof(FrameHeader);
        first = false;
      }
      size_t end = pos + n;
      if (end > payload_from) {
        seg.data = item.payload + (payload_from - sizeof(FrameHeader));
        seg.size = end - payload_from;
      }
      pos = end;
      if (pos == total) seg.keep = std::move(item.keep);
      std::lock_guard<std::mutex> lock(mu_);
      line_bytes_ += seg.line_bytes;
      segments_.push_back(std::move(seg));
      cv_.notify_all();
    } while (pos < total);
    Status s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      s = error_;
    }
    if (item.accepted) item.accepted(s);
  }
  std::lock_guard<std::mutex> lock(mu_);
  pacer_done_ = true;
  cv_.notify_all();
}

void FrameWriter::DelayLoop() {
  while (true) {
    Segment seg;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !segments_.empty() || pacer_done_; });
      if (segments_.empty()) break;
      seg = std::move(segments_.front());
      segments_.pop_front();
    }
    double wait = seg.deliver_at - SteadyNow();
    if (wait > 0) usleep(static_cast<useconds_t>(wait * 1e6));
    Status s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      s = error_;
    }
    if (s.ok() && !seg.header_bytes.empty()) {
      s = conn_->Write(seg.header_bytes.data(), seg.header_bytes.size());
    }
    if (s.ok() && seg.size > 0) s = conn_->Write(seg.data, seg.size);
    std::lock_guard<std::mutex> lock(mu_);
    if (!s.ok() && error_.ok()) error_ = s;
    line_bytes_ -= seg.line_bytes;
    cv_.notify_all();
  }
}

}  // namespace dcr::internal
