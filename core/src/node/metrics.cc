#include "node/metrics.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "transport/net.h"

namespace dcr::internal {

namespace {

constexpr size_t kMaxRequestBytes = 8 << 10;
constexpr double kRequestTimeoutS = 2.0;
constexpr size_t kMaxConnections = 64;

// A label value with \, " and newline escaped (the text format's rules).
std::string Escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string Number(double v) {
  char b[64];
  std::snprintf(b, sizeof(b), "%.17g", v);
  return b;
}

std::string Number(uint64_t v) { return std::to_string(v); }

void SendAll(int fd, const std::string& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t w = send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    off += static_cast<size_t>(w);
  }
}

void Respond(int fd, int code, const char* reason, const std::string& type,
             const std::string& body) {
  std::string head =
      "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + type +
      "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  SendAll(fd, head + body);
}

}  // namespace

std::string RenderMetrics(const NodeMetrics& m) {
  const std::string labels =
      "rank=\"" + std::to_string(m.rank) + "\",role=\"" + Escape(m.role) + "\"";
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, const std::string& value,
                    const std::string& extra = "") {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    out += std::string(name) + "{" + labels + extra + "} " + value + "\n";
  };
  metric("dcr_node_up", "gauge",
         "1 while the node runs (setting up, waiting for its parent, refitting) without an error.",
         m.up ? "1" : "0");
  metric("dcr_node_committed", "gauge",
         "1 once this receiver committed its version (the sender: its tree did).",
         m.committed ? "1" : "0");
  metric("dcr_version_target", "gauge", "The version number this node's refit delivers.",
         Number(m.version_target));
  if (m.holds_version) {
    metric("dcr_version_held", "gauge",
           "The version number the node's storage holds (label: its content hash).",
           Number(m.version_held), ",hash=\"" + m.hash_held.ToHex() + "\"");
  }
  const double lag = m.committed || m.started_at == 0 ? 0.0 : m.now - m.started_at;
  metric("dcr_lag_seconds", "gauge",
         "Seconds since the node started while its version is not committed; 0 after.",
         Number(lag < 0 ? 0.0 : lag));
  metric("dcr_bytes_received_total", "counter", "Blob bytes received from the parent or store.",
         Number(m.bytes_received));
  metric("dcr_bytes_sent_total", "counter", "Blob bytes sent to children or put to the store.",
         Number(m.bytes_sent));
  metric("dcr_bytes_sent_long_total", "counter",
         "Bytes sent over the emulated long link (frame headers and heartbeats included).",
         Number(m.bytes_sent_long));
  metric("dcr_chunks_applied_total", "counter", "Chunk records applied to the node's storage.",
         Number(m.chunks_applied));
  metric("dcr_apply_seconds_total", "counter", "Seconds spent inside receiver calls.",
         Number(m.apply_seconds));
  metric("dcr_start_time_seconds", "gauge", "Unix time the node started.", Number(m.started_at));
  metric("dcr_last_byte_time_seconds", "gauge",
         "Unix time of the last blob byte built or received (0: none yet).",
         Number(m.last_byte_at));
  metric("dcr_commit_time_seconds", "gauge", "Unix time of the commit (0: not yet).",
         Number(m.committed_at));
  metric("dcr_node_starts", "gauge",
         "Starts of this node counted in its state directory (1: never restarted).",
         Number(m.starts));
  metric("dcr_recoveries_total", "counter", "Recoveries the node's RecoveryPolicy spent.",
         Number(m.recoveries));
  metric("dcr_repairs_total", "counter",
         "Doubtful chunks (interrupted by a crash) repaired with their overwrite form.",
         Number(m.repairs));
  metric("dcr_fallbacks_total", "counter",
         "Times the node left its stream for the object store (a lost parent, a failed tree).",
         Number(m.fallbacks));
  metric("dcr_reloads_total", "counter",
         "Reloads of the committed version into storage lost with a process.", Number(m.reloads));
  metric("dcr_chunks_skipped_total", "counter",
         "Chunks the journal showed applied, not written again after a restart.",
         Number(m.chunks_skipped));
  metric("dcr_mirror_puts_total", "counter",
         "Blobs this long-link relay put into the in-region store.", Number(m.mirror_puts));
  if (m.gc_runs > 0) {
    metric("dcr_gc_runs_total", "counter", "Collections of the store's old versions run.",
           Number(m.gc_runs));
    metric("dcr_gc_removed_objects_total", "counter", "Store objects removed by collections.",
           Number(m.gc_removed_objects));
    metric("dcr_gc_removed_bytes_total", "counter", "Store bytes removed by collections.",
           Number(m.gc_removed_bytes));
    metric("dcr_gc_budget_errors_total", "counter",
           "Collections that could not meet the budget without removing what is needed.",
           Number(m.gc_budget_errors));
    metric("dcr_store_bytes", "gauge",
           "Bytes under the versions' prefix after the last collection.", Number(m.store_bytes));
  }
  metric("dcr_freeze_seconds", "gauge",
         "Seconds this receiver has gone without a new committed version, once past its freeze "
         "limit (network.signing.freeze_after_s); 0 while not frozen or without a limit.",
         Number(m.freeze_seconds));
  if (!m.dead_ranks.empty()) {
    metric("dcr_receivers_dead", "gauge",
           "Receivers this sender's joint commit holds dead (declared, not re-admitted).",
           Number(m.dead_ranks.size()));
    for (int r : m.dead_ranks) {
      metric("dcr_receiver_dead", "gauge", "A receiver this sender holds dead.", "1",
             ",dead_rank=\"" + std::to_string(r) + "\"");
    }
  }
  if (!m.lost_children.empty()) {
    metric("dcr_children_lost", "gauge",
           "Children this relay counted lost while connecting that are not back.",
           Number(m.lost_children.size()));
    for (int r : m.lost_children) {
      metric("dcr_child_lost", "gauge", "A child this relay counted lost while connecting.", "1",
             ",child_rank=\"" + std::to_string(r) + "\"");
    }
  }
  if (!m.last_error.empty()) {
    metric("dcr_last_error_info", "gauge", "The node's error, in the message label.", "1",
           ",message=\"" + Escape(m.last_error) + "\"");
  }
  return out;
}

MetricsBoard& MetricsBoard::Process() {
  static MetricsBoard* board = new MetricsBoard();  // never destroyed: threads may outlive main
  return *board;
}

void MetricsBoard::Attach(std::function<NodeMetrics()> source) {
  std::lock_guard<std::mutex> lock(mu_);
  source_ = std::move(source);
}

void MetricsBoard::Detach() {
  std::lock_guard<std::mutex> lock(mu_);
  if (source_) last_ = source_();
  source_ = nullptr;
}

NodeMetrics MetricsBoard::Snapshot() {
  std::lock_guard<std::mutex> lock(mu_);
  NodeMetrics m;
  if (source_) {
    m = source_();
  } else {
    m = last_;
    m.now = WallNow();
  }
  m.gc_runs = gc_.gc_runs;
  m.gc_removed_objects = gc_.gc_removed_objects;
  m.gc_removed_bytes = gc_.gc_removed_bytes;
  m.gc_budget_errors = gc_.gc_budget_errors;
  m.store_bytes = gc_.store_bytes;
  m.dead_ranks = dead_ranks_;
  m.lost_children.assign(lost_children_.begin(), lost_children_.end());
  return m;
}

void MetricsBoard::SetDeadRanks(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::lock_guard<std::mutex> lock(mu_);
  dead_ranks_ = std::move(ranks);
}

void MetricsBoard::SetLostChild(int rank, bool lost) {
  std::lock_guard<std::mutex> lock(mu_);
  if (lost) {
    lost_children_.insert(rank);
  } else {
    lost_children_.erase(rank);
  }
}

void MetricsBoard::AddCollection(uint64_t removed_objects, uint64_t removed_bytes,
                                 bool budget_error, uint64_t store_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  ++gc_.gc_runs;
  gc_.gc_removed_objects += removed_objects;
  gc_.gc_removed_bytes += removed_bytes;
  if (budget_error) ++gc_.gc_budget_errors;
  gc_.store_bytes = store_bytes;
}

Status MetricsServer::Start(const std::string& address, std::function<NodeMetrics()> snapshot) {
  auto fd = Listen(address);
  if (!fd.ok()) return Status(fd.status().code(), "metrics endpoint: " + fd.status().message());
  if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    close(*fd);
    return UnavailableError(ErrnoError("metrics endpoint: pipe", errno).message());
  }
  listen_fd_ = *fd;
  snapshot_ = std::move(snapshot);
  thread_ = std::thread([this] { Loop(); });
  return Status();
}

void MetricsServer::Stop() {
  if (thread_.joinable()) {
    const char b = 1;
    while (write(wake_[1], &b, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  for (int* fd : {&listen_fd_, &wake_[0], &wake_[1]}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

void MetricsServer::Loop() {
  // Connections served together: each has its own deadline and buffer, so silent or slow clients
  // delay nobody; past kMaxConnections the oldest is closed for the new one.
  struct Conn {
    int fd;
    double until;
    std::string req;
  };
  std::vector<Conn> conns;
  auto drop = [&](size_t i) {
    close(conns[i].fd);
    conns.erase(conns.begin() + static_cast<std::ptrdiff_t>(i));
  };
  while (true) {
    std::vector<pollfd> fds = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    double next = -1;
    for (const Conn& c : conns) {
      fds.push_back({c.fd, POLLIN, 0});
      if (next < 0 || c.until < next) next = c.until;
    }
    const int timeout_ms =
        next < 0 ? -1 : static_cast<int>(std::max(0.0, next - SteadyNow()) * 1000) + 1;
    int rc = poll(fds.data(), fds.size(), timeout_ms);
    if (rc < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[1].revents != 0) break;
    // Clients first (from the last, so that erasing keeps the indices of those before).
    const double now = SteadyNow();
    for (size_t i = conns.size(); i-- > 0;) {
      const short ev = fds[2 + i].revents;
      if (ev == 0) {
        if (now >= conns[i].until) drop(i);
        continue;
      }
      char buf[1024];
      ssize_t r = recv(conns[i].fd, buf, sizeof(buf), 0);
      if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (r <= 0) {
        drop(i);
        continue;
      }
      conns[i].req.append(buf, static_cast<size_t>(r));
      const std::string& req = conns[i].req;
      if (req.find("\r\n\r\n") != std::string::npos || req.find("\n\n") != std::string::npos) {
        Serve(conns[i].fd, req);
        drop(i);
      } else if (req.size() > kMaxRequestBytes) {
        Respond(conns[i].fd, 431, "Request Header Fields Too Large", "text/plain",
                "request too large\n");
        drop(i);
      }
    }
    if (fds[0].revents != 0) {
      int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        if (conns.size() >= kMaxConnections) drop(0);
        conns.push_back(Conn{fd, SteadyNow() + kRequestTimeoutS, {}});
      }
    }
  }
  for (const Conn& c : conns) close(c.fd);
}

void MetricsServer::Serve(int fd, const std::string& req) {
  const std::string line = req.substr(0, req.find_first_of("\r\n"));
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? std::string::npos : line.find(' ', sp1 + 1);
  if (sp2 == std::string::npos) {
    Respond(fd, 400, "Bad Request", "text/plain", "bad request line\n");
    return;
  }
  const std::string method = line.substr(0, sp1);
  std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  if (method != "GET") {
    Respond(fd, 405, "Method Not Allowed", "text/plain", "only GET\n");
    return;
  }
  if (path == "/metrics") {
    Respond(fd, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", RenderMetrics(snapshot_()));
  } else if (path == "/healthz") {
    const NodeMetrics m = snapshot_();
    if (m.last_error.empty()) {
      std::string body = "ok\n";
      auto ranks = [](const std::vector<int>& v) {
        std::string out;
        for (int r : v) out += (out.empty() ? "" : ", ") + std::to_string(r);
        return out;
      };
      if (!m.dead_ranks.empty()) body += "receivers declared dead: " + ranks(m.dead_ranks) + "\n";
      if (!m.lost_children.empty()) {
        body += "children lost: " + ranks(m.lost_children) + "\n";
      }
      Respond(fd, 200, "OK", "text/plain", body);
    } else {
      Respond(fd, 503, "Service Unavailable", "text/plain", m.last_error + "\n");
    }
  } else {
    Respond(fd, 404, "Not Found", "text/plain", "try /metrics or /healthz\n");
  }
}

}  // namespace dcr::internal
