// The fault proxy of one relay-tree edge (see fault_proxy.h).
#include "fault_proxy.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <thread>

#include "dcr/checkpoint.h"
#include "dcr/relay_policy.h"
#include "dcr/status_macros.h"
#include "transport/net.h"
#include "transport/tls.h"

namespace dcr::cli {

using internal::Conn;
using internal::FrameHeader;
using internal::FrameType;

const std::vector<std::string>& FrameFaultKinds() {
  static const std::vector<std::string> kinds = {"corrupt", "duplicate", "reorder",
                                                 "delay",   "drop",      "partition"};
  return kinds;
}

std::string FaultProxySpecToJson(const FaultProxySpec& spec) {
  nlohmann::json j;
  j["listen"] = spec.listen;
  j["target"] = spec.target;
  j["parent"] = spec.parent;
  j["child"] = spec.child;
  j["tls_ca"] = spec.tls_ca;
  j["accept_cert"] = spec.accept_cert;
  j["accept_key"] = spec.accept_key;
  j["connect_cert"] = spec.connect_cert;
  j["connect_key"] = spec.connect_key;
  j["seed"] = spec.seed;
  j["log"] = spec.log_path;
  j["faults"] = nlohmann::json::array();
  for (const ProxyFault& f : spec.faults) {
    j["faults"].push_back({{"kind", f.kind}, {"at_piece", f.at_piece}, {"seconds", f.seconds}});
  }
  return j.dump(2);
}

StatusOr<FaultProxySpec> FaultProxySpecFromJson(const std::string& json) {
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (!j.is_object()) return InvalidArgumentError("fault proxy spec: not a JSON object");
  FaultProxySpec s;
  try {
    s.listen = j.at("listen").get<std::string>();
    s.target = j.at("target").get<std::string>();
    s.parent = j.at("parent").get<int>();
    s.child = j.at("child").get<int>();
    s.tls_ca = j.value("tls_ca", std::string());
    s.accept_cert = j.value("accept_cert", std::string());
    s.accept_key = j.value("accept_key", std::string());
    s.connect_cert = j.value("connect_cert", std::string());
    s.connect_key = j.value("connect_key", std::string());
    s.seed = j.value("seed", uint64_t{1});
    s.log_path = j.at("log").get<std::string>();
    for (const auto& f : j.value("faults", nlohmann::json::array())) {
      ProxyFault pf;
      pf.kind = f.at("kind").get<std::string>();
      pf.at_piece = f.at("at_piece").get<uint64_t>();
      pf.seconds = f.value("seconds", 0.0);
      const auto& kinds = FrameFaultKinds();
      if (std::find(kinds.begin(), kinds.end(), pf.kind) == kinds.end()) {
        return InvalidArgumentError("fault proxy spec: unknown fault kind '" + pf.kind + "'");
      }
      s.faults.push_back(pf);
    }
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(std::string("fault proxy spec: ") + e.what());
  }
  return s;
}

namespace {

std::atomic<bool> g_stop{false};
void OnStopSignal(int) { g_stop = true; }

// Largest payload the proxy forwards: a piece is at most a relay chunk, a report or abort far
// less; anything above is not a frame of the protocol and ends the connection.
constexpr uint64_t kMaxFramePayload = uint64_t{1} << 30;

struct Frame {
  FrameHeader header;
  std::vector<uint8_t> payload;
};

// The two connections of one proxied tree connection.
struct Pair {
  std::unique_ptr<Conn> parent;  // accepted from the parent
  std::unique_ptr<Conn> child;   // dialled to the child
  std::atomic<bool> blackholed{false};
  void Close() {
    if (parent) parent->Shutdown();
    if (child) child->Shutdown();
  }
};

class Proxy {
 public:
  Proxy(const FaultProxySpec& spec, std::shared_ptr<const internal::TlsContext> accept_tls,
        std::shared_ptr<const internal::TlsContext> connect_tls)
      : spec_(spec),
        accept_tls_(std::move(accept_tls)),
        connect_tls_(std::move(connect_tls)),
        fired_(spec.faults.size(), false) {}

  Status Serve(int listen_fd) {
    DCR_RETURN_IF_ERROR(WriteLog());
    while (!g_stop) {
      EndPartitionIfDue();
      StatusOr<int> fd = internal::Accept(listen_fd, internal::SteadyNow() + 0.1);
      if (!fd.ok()) {
        if (fd.status().IsDeadlineExceeded()) continue;
        break;
      }
      std::lock_guard<std::mutex> l(mu_);
      ++connections_;
      threads_.emplace_back([this, f = *fd] { Handle(f); });
    }
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (auto& p : pairs_) p->Close();
      threads.swap(threads_);
    }
    for (auto& t : threads) t.join();
    std::lock_guard<std::mutex> l(mu_);
    return WriteLogLocked();
  }

 private:
  // One connection from the parent: TLS handshake (the proxy as the child), dial the child (the
  // proxy as the parent), then frames both ways until either side ends.
  void Handle(int fd) {
    auto pair = std::make_shared<Pair>();
    if (InPartition()) {  // a blackholed path takes no new connection
      close(fd);
      return;
    }
    if (accept_tls_ != nullptr) {
      int flags = fcntl(fd, F_GETFL, 0);
      if (flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
      ssl_st* ssl = accept_tls_->NewSsl(fd, /*server=*/true);
      if (ssl == nullptr) {
        close(fd);
        return;
      }
      Status s = internal::TlsHandshake(ssl, fd, internal::SteadyNow() + 5);
      StatusOr<internal::TlsIdentity> id =
          s.ok() ? accept_tls_->CheckPeer(ssl, internal::TlsPeer::kParent)
                 : StatusOr<internal::TlsIdentity>(s);
      if (!id.ok() || id->rank != spec_.parent) {
        std::fprintf(stderr, "dcr fault-proxy %d->%d: refused a connection: %s\n", spec_.parent,
                     spec_.child,
                     id.ok() ? ("rank " + std::to_string(id->rank)).c_str()
                             : id.status().ToString().c_str());
        internal::Conn refused(fd, ssl, internal::TlsIdentity{});
        return;
      }
      pair->parent = std::make_unique<Conn>(fd, ssl, *id);
    } else {
      pair->parent = std::make_unique<Conn>(fd);
    }
    auto child = internal::ConnectTo(spec_.target, internal::SteadyNow() + 10, connect_tls_.get(),
                                     spec_.child, 5.0);
    if (!child.ok()) {
      std::fprintf(stderr, "dcr fault-proxy %d->%d: child %s: %s\n", spec_.parent, spec_.child,
                   spec_.target.c_str(), child.status().ToString().c_str());
      return;  // the parent's connection closes with `pair`
    }
    pair->child = std::move(*child);
    {
      std::lock_guard<std::mutex> l(mu_);
      pairs_.push_back(pair);
      if (partition_until_ > 0) pair->blackholed = true;
    }
    std::thread down([this, pair] { Pump(pair.get(), /*from_parent=*/true); });
    Pump(pair.get(), /*from_parent=*/false);
    down.join();
  }

  static Status WriteFrame(Conn* to, const Frame& f) {
    DCR_RETURN_IF_ERROR(to->Write(&f.header, sizeof(f.header)));
    if (!f.payload.empty()) DCR_RETURN_IF_ERROR(to->Write(f.payload.data(), f.payload.size()));
    return Status();
  }

  // Forwards frames from one end to the other, injecting the spec's faults into the chunk
  // pieces that go from the parent to the child.
  void Pump(Pair* p, bool from_parent) {
    Conn* from = from_parent ? p->parent.get() : p->child.get();
    Conn* to = from_parent ? p->child.get() : p->parent.get();
    std::optional<Frame> held;  // reorder: the piece that goes after the next frame
    while (!g_stop) {
      Frame f;
      if (!from->Read(&f.header, sizeof(f.header)).ok()) break;
      if (f.header.magic != internal::kFrameMagic || f.header.length > kMaxFramePayload) break;
      f.payload.resize(f.header.length);
      if (f.header.length > 0 && !from->Read(f.payload.data(), f.payload.size()).ok()) break;
      if (p->blackholed) continue;  // partitioned: the bytes are lost
      const ProxyFault* fault = nullptr;
      if (from_parent && f.header.type == static_cast<uint8_t>(FrameType::kPiece) &&
          f.header.blob_kind == static_cast<uint8_t>(BlobKind::kChunk)) {
        fault = Take(++pieces_);
      }
      bool twice = false;
      if (fault != nullptr) {
        const std::string& k = fault->kind;
        Record(*fault, f.header);
        if (k == "corrupt") {
          std::mt19937_64 rng(spec_.seed * 1000003 + pieces_.load());
          for (int i = 0; i < 3 && !f.payload.empty(); ++i) {
            f.payload[rng() % f.payload.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
          }
        } else if (k == "duplicate") {
          twice = true;
        } else if (k == "reorder") {
          held = std::move(f);
          continue;
        } else if (k == "delay") {
          const double until = internal::SteadyNow() + fault->seconds;
          while (!g_stop && internal::SteadyNow() < until) usleep(5000);
        } else if (k == "drop") {
          break;
        } else if (k == "partition") {
          StartPartition(fault->seconds);
          continue;
        }
      }
      if (!WriteFrame(to, f).ok()) break;
      if (twice && !WriteFrame(to, f).ok()) break;
      if (held.has_value()) {
        if (!WriteFrame(to, *held).ok()) break;
        held.reset();
      }
    }
    if (held.has_value() && !p->blackholed) (void)WriteFrame(to, *held);
    p->Close();
  }

  // The fault planned at chunk piece `piece`, once; null when none.
  const ProxyFault* Take(uint64_t piece) {
    std::lock_guard<std::mutex> l(mu_);
    for (size_t i = 0; i < spec_.faults.size(); ++i) {
      if (!fired_[i] && spec_.faults[i].at_piece == piece) {
        fired_[i] = true;
        return &spec_.faults[i];
      }
    }
    return nullptr;
  }

  bool InPartition() {
    std::lock_guard<std::mutex> l(mu_);
    return partition_until_ > 0;
  }

  void StartPartition(double seconds) {
    std::lock_guard<std::mutex> l(mu_);
    partition_until_ = internal::SteadyNow() + seconds;
    for (auto& p : pairs_) p->blackholed = true;
  }

  // At the partition's end its connections are closed: their lost bytes cannot be resent.
  void EndPartitionIfDue() {
    std::lock_guard<std::mutex> l(mu_);
    if (partition_until_ == 0 || internal::SteadyNow() < partition_until_) return;
    partition_until_ = 0;
    for (auto& p : pairs_) {
      if (p->blackholed) p->Close();
    }
  }

  void Record(const ProxyFault& f, const FrameHeader& h) {
    std::lock_guard<std::mutex> l(mu_);
    injected_.push_back({{"kind", f.kind},
                         {"piece", f.at_piece},
                         {"stream", h.stream},
                         {"blob", h.blob},
                         {"offset", h.offset},
                         {"seconds", f.seconds},
                         {"at", internal::WallNow()}});
    Status s = WriteLogLocked();
    if (!s.ok()) std::fprintf(stderr, "dcr fault-proxy: %s\n", s.ToString().c_str());
  }

  Status WriteLog() {
    std::lock_guard<std::mutex> l(mu_);
    return WriteLogLocked();
  }

  Status WriteLogLocked() {
    nlohmann::json j;
    j["parent"] = spec_.parent;
    j["child"] = spec_.child;
    j["tls"] = accept_tls_ != nullptr;
    j["connections"] = connections_;
    j["chunk_pieces"] = pieces_.load();
    j["injected"] = injected_;
    const std::string text = j.dump(2);
    return WriteFileAtomic(spec_.log_path, text.data(), text.size());
  }

  const FaultProxySpec spec_;
  std::shared_ptr<const internal::TlsContext> accept_tls_, connect_tls_;
  std::mutex mu_;
  std::vector<bool> fired_;
  std::vector<std::shared_ptr<Pair>> pairs_;
  std::vector<std::thread> threads_;
  std::atomic<uint64_t> pieces_{0};
  uint64_t connections_ = 0;
  double partition_until_ = 0;
  nlohmann::json injected_ = nlohmann::json::array();
};

}  // namespace

Status RunFaultProxy(const FaultProxySpec& spec) {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  std::shared_ptr<const internal::TlsContext> accept_tls, connect_tls;
  if (!spec.tls_ca.empty()) {
    DCR_ASSIGN_OR_RETURN(
        accept_tls, internal::TlsContext::Load(spec.tls_ca, spec.accept_cert, spec.accept_key));
    DCR_ASSIGN_OR_RETURN(
        connect_tls, internal::TlsContext::Load(spec.tls_ca, spec.connect_cert, spec.connect_key));
  }
  DCR_ASSIGN_OR_RETURN(int listen_fd, internal::Listen(spec.listen));
  Proxy proxy(spec, accept_tls, connect_tls);
  Status s = proxy.Serve(listen_fd);
  close(listen_fd);
  return s;
}

}  // namespace dcr::cli
