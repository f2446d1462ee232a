// Mutual TLS on loopback: per-run credentials, the handshake between ConnectTo (parent) and
// AcceptHellos (child), bytes both ways through Conn, and the refusals: a certificate of another
// run, a certificate of the wrong role or rank, no certificate, a plain-TCP peer, a key that
// others can read.
#include "transport/tls.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/net.h"

namespace dcr::internal {
namespace {

// Parents {-1, 0, 1, 1}: rank 0 sender, rank 1 relay, ranks 2 and 3 receivers.
const std::vector<int> kParents = {-1, 0, 1, 1};

std::string TempDir() {
  char tmpl[] = "/tmp/dcr_tls_XXXXXX";
  return mkdtemp(tmpl);
}

struct RunKeys {
  std::string dir;
  std::shared_ptr<const TlsContext> Node(int rank) const {
    auto c = TlsContext::Load(dir + "/ca.crt", dir + "/node-" + std::to_string(rank) + ".crt",
                              dir + "/node-" + std::to_string(rank) + ".key");
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? *c : nullptr;
  }
};

RunKeys NewRun() {
  RunKeys r;
  r.dir = TempDir() + "/keys";
  auto id = NewRunId();
  EXPECT_TRUE(id.ok());
  Status s = WriteRunCredentials(r.dir, *id, TreeRoles(kParents), 1, false);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return r;
}

FrameHeader HelloFrom(int rank) {
  FrameHeader h;
  h.type = static_cast<uint8_t>(FrameType::kHello);
  h.from_rank = static_cast<uint32_t>(rank);
  h.blob = 1;
  return h;
}

// A child listening on a free loopback port.
struct Listener {
  std::string address;
  int fd = -1;
  Listener() {
    address = "127.0.0.1:" + std::to_string(FreePort().value());
    fd = Listen(address).value();
  }
  ~Listener() { close(fd); }
};

TEST(Tls, TreeRolesNameSenderRelaysAndReceivers) {
  EXPECT_EQ(TreeRoles(kParents),
            (std::vector<std::string>{"sender", "relay", "receiver", "receiver"}));
}

TEST(Tls, CredentialFilesArePrivateAndNeverOverwritten) {
  RunKeys run = NewRun();
  struct stat st;
  ASSERT_EQ(stat(run.dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  for (const char* f : {"/ca.key", "/node-0.key", "/node-3.key"}) {
    ASSERT_EQ(stat((run.dir + f).c_str(), &st), 0) << f;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << f;
  }
  Status again = WriteRunCredentials(run.dir, "other", TreeRoles(kParents), 1, false);
  EXPECT_TRUE(again.IsFailedPrecondition()) << again.ToString();
  auto c = run.Node(2);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->self().role, "receiver");
  EXPECT_EQ(c->self().rank, 2);
}

TEST(Tls, KeyReadableByOthersIsRefused) {
  RunKeys run = NewRun();
  ASSERT_EQ(chmod((run.dir + "/node-1.key").c_str(), 0644), 0);
  auto c = TlsContext::Load(run.dir + "/ca.crt", run.dir + "/node-1.crt", run.dir + "/node-1.key");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(c.status().IsFailedPrecondition()) << c.status().ToString();
  EXPECT_NE(c.status().message().find("chmod 600"), std::string::npos) << c.status().ToString();
}

TEST(Tls, KeyOfAnotherRankIsRefused) {
  RunKeys run = NewRun();
  auto c = TlsContext::Load(run.dir + "/ca.crt", run.dir + "/node-1.crt", run.dir + "/node-2.key");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(c.status().IsFailedPrecondition()) << c.status().ToString();
}

// The parent (rank 1, relay) connects to its child (rank 2) and both directions carry bytes.
TEST(Tls, HandshakeAndBytesBothWays) {
  RunKeys run = NewRun();
  auto parent = run.Node(1), child = run.Node(2);
  Listener l;
  std::vector<std::string> refusals;
  StatusOr<std::vector<Hello>> hellos = UnavailableError("not run");
  std::thread server([&] {
    hellos = AcceptHellos(
        l.fd, 1, SteadyNow() + 20, 5, child.get(),
        [](const FrameHeader& h, const TlsIdentity* peer) {
          return peer != nullptr && peer->rank == 1 && peer->role == "relay" && h.from_rank == 1;
        },
        [&](const std::string& why) { refusals.push_back(why); });
  });
  auto conn = ConnectTo(l.address, SteadyNow() + 20, parent.get(), 2, 5);
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  EXPECT_TRUE((*conn)->tls());
  EXPECT_EQ((*conn)->peer().role, "receiver");
  FrameHeader hello = HelloFrom(1);
  ASSERT_TRUE((*conn)->Write(&hello, sizeof(hello)).ok());
  server.join();
  ASSERT_TRUE(hellos.ok()) << hellos.status().ToString();
  ASSERT_EQ(hellos->size(), 1u);
  EXPECT_TRUE(refusals.empty());
  Conn* down = (*hellos)[0].conn.get();
  EXPECT_EQ(down->peer().rank, 1);

  // 8 MiB parent -> child while the child answers 4 KiB: a reader and a writer at once.
  std::vector<uint8_t> big(8 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 131 + 7);
  std::vector<uint8_t> got(big.size()), back(4096, 0x5a), back_got(4096);
  std::thread reader([&] { EXPECT_TRUE(down->Read(got.data(), got.size()).ok()); });
  std::thread answer([&] { EXPECT_TRUE(down->Write(back.data(), back.size()).ok()); });
  ASSERT_TRUE((*conn)->Write(big.data(), big.size()).ok());
  ASSERT_TRUE((*conn)->Read(back_got.data(), back_got.size()).ok());
  reader.join();
  answer.join();
  EXPECT_EQ(got, big);
  EXPECT_EQ(back_got, back);

  // Shutdown ends a blocked read.
  std::thread blocked([&] { EXPECT_FALSE(down->Read(got.data(), 1).ok()); });
  usleep(50000);
  down->Shutdown();
  blocked.join();
}

// Peers that must not feed rank 2 connect first; each is dropped with its reason and the real
// parent (rank 1) is still accepted after them.
TEST(Tls, RefusedPeersDoNotTakeTheParentsPlace) {
  RunKeys run = NewRun();
  RunKeys other = NewRun();
  auto child = run.Node(2);
  Listener l;
  std::vector<std::string> refusals;
  std::mutex mu;
  StatusOr<std::vector<Hello>> hellos = UnavailableError("not run");
  std::thread server([&] {
    hellos = AcceptHellos(
        l.fd, 1, SteadyNow() + 30, 5, child.get(),
        [](const FrameHeader& h, const TlsIdentity* peer) {
          return peer != nullptr && static_cast<int>(h.from_rank) == peer->rank;
        },
        [&](const std::string& why) {
          std::lock_guard<std::mutex> lock(mu);
          refusals.push_back(why);
        });
  });
  // Each hostile parent: its handshake may complete on its own side (TLS 1.3 checks the client
  // certificate after the client's Finished), but the child closes the connection.
  auto hostile = [&](const TlsContext* ctx, int rank) {
    auto c = ConnectTo(l.address, SteadyNow() + 10, ctx, 2, 5);
    if (!c.ok()) return;  // refused already
    FrameHeader h = HelloFrom(rank);
    (void)(*c)->Write(&h, sizeof(h));
    uint8_t b;
    EXPECT_FALSE((*c)->Read(&b, 1).ok());
  };
  hostile(other.Node(0).get(), 0);  // the sender of another run
  hostile(run.Node(3).get(), 3);    // a receiver of this run as a parent
  {
    // Plain TCP with a valid-looking hello.
    int fd = Connect(l.address, SteadyNow() + 10).value();
    FrameHeader h = HelloFrom(1);
    ASSERT_TRUE(WriteFull(fd, &h, sizeof(h)).ok());
    uint8_t b;
    EXPECT_FALSE(ReadFull(fd, &b, 1).ok());
    close(fd);
  }
  auto parent = run.Node(1);
  auto conn = ConnectTo(l.address, SteadyNow() + 10, parent.get(), 2, 5);
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  FrameHeader hello = HelloFrom(1);
  ASSERT_TRUE((*conn)->Write(&hello, sizeof(hello)).ok());
  server.join();
  ASSERT_TRUE(hellos.ok()) << hellos.status().ToString();
  ASSERT_EQ(hellos->size(), 1u);
  EXPECT_EQ((*hellos)[0].conn->peer().rank, 1);
  std::string all;
  for (const auto& r : refusals) all += r + "\n";
  EXPECT_EQ(refusals.size(), 3u) << all;
  // The other run's parent checks the child's certificate first and aborts: unknown CA.
  EXPECT_NE(all.find("unknown ca"), std::string::npos) << all;
  EXPECT_NE(all.find("is a receiver (rank 3), which may not act as a parent"), std::string::npos)
      << all;
  EXPECT_NE(all.find("TLS handshake failed"), std::string::npos) << all;
}

// Processes that spin on every core until destroyed: real CPU load on the host while a test runs.
struct BusyProcesses {
  std::vector<pid_t> pids;
  explicit BusyProcesses(int n) {
    for (int i = 0; i < n; ++i) {
      const pid_t pid = fork();
      if (pid == 0) {
        volatile uint64_t x = 0;
        for (;;) x = x * 6364136223846793005ULL + 1;
      }
      if (pid > 0) pids.push_back(pid);
    }
  }
  ~BusyProcesses() {
    for (pid_t pid : pids) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

// A TCP relay between a parent and the child's listener that hands the bytes of one direction
// on in pieces of `piece` bytes, one piece per `gap_s` (a peer that is slow, not silent), and
// the other direction as they come. Serves one connection; `address` is where to connect.
struct PacedRelay {
  Listener in;
  std::string address;
  std::thread thread;
  PacedRelay(const std::string& target, bool pace_to_child, size_t piece, double gap_s) {
    address = in.address;
    thread = std::thread([this, target, pace_to_child, piece, gap_s] {
      const int a = accept(in.fd, nullptr, nullptr);
      if (a < 0) return;
      const int b = Connect(target, SteadyNow() + 10).value();
      const int paced_from = pace_to_child ? a : b, paced_to = pace_to_child ? b : a;
      const int free_from = pace_to_child ? b : a, free_to = pace_to_child ? a : b;
      std::string backlog;
      double next = 0;
      for (bool open = true; open || !backlog.empty();) {
        pollfd fds[2] = {{paced_from, static_cast<short>(open ? POLLIN : 0), 0},
                         {free_from, static_cast<short>(open ? POLLIN : 0), 0}};
        poll(fds, 2, 10);
        char buf[65536];
        if (fds[0].revents != 0) {
          const ssize_t n = read(paced_from, buf, sizeof(buf));
          if (n <= 0)
            open = false;
          else
            backlog.append(buf, static_cast<size_t>(n));
        }
        if (fds[1].revents != 0) {
          const ssize_t n = read(free_from, buf, sizeof(buf));
          if (n <= 0 || !WriteFull(free_to, buf, static_cast<size_t>(n)).ok()) open = false;
        }
        if (!backlog.empty() && SteadyNow() >= next) {
          const size_t k = std::min(piece, backlog.size());
          if (!WriteFull(paced_to, backlog.data(), k).ok()) break;
          backlog.erase(0, k);
          next = SteadyNow() + gap_s;
        }
      }
      close(a);
      close(b);
    });
  }
  ~PacedRelay() {
    shutdown(in.fd, SHUT_RDWR);
    thread.join();
  }
};

// With two processes spinning on the cores, a parent whose handshake and hello reach the child
// 48 bytes every 0.1 s (the whole exchange takes several times the 1 s silence limit, as a
// handshake with a loaded host may take longer than any fixed deadline) is accepted: the
// child's limit is on silence, not on the handshake's length. A parent that goes silent for
// longer than the limit is still dropped.
TEST(Tls, SlowHandshakeThatKeepsMovingCompletesUnderLoad) {
  RunKeys run = NewRun();
  auto parent = run.Node(1), child = run.Node(2);
  BusyProcesses load(2);
  Listener l;
  constexpr double kLimitS = 1.0;
  PacedRelay relay(l.address, /*pace_to_child=*/true, 48, 0.1);
  std::vector<std::string> refusals;
  StatusOr<std::vector<Hello>> hellos = UnavailableError("not run");
  const double t0 = SteadyNow();
  double took = 0;
  std::thread server([&] {
    hellos = AcceptHellos(
        l.fd, 1, SteadyNow() + 60, kLimitS, child.get(),
        [](const FrameHeader& h, const TlsIdentity* peer) {
          return peer != nullptr && peer->rank == 1 && h.from_rank == 1;
        },
        [&](const std::string& why) { refusals.push_back(why); });
    took = SteadyNow() - t0;
  });
  auto conn = ConnectTo(relay.address, SteadyNow() + 60, parent.get(), 2, kLimitS);
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  FrameHeader hello = HelloFrom(1);
  ASSERT_TRUE((*conn)->Write(&hello, sizeof(hello)).ok());
  server.join();
  ASSERT_TRUE(hellos.ok()) << hellos.status().ToString();
  ASSERT_EQ(hellos->size(), 1u);
  EXPECT_EQ((*hellos)[0].conn->peer().rank, 1);
  EXPECT_TRUE(refusals.empty()) << refusals[0];
  EXPECT_GT(took, 2 * kLimitS) << "the handshake was not slower than the limit";
  std::printf(
      "handshake and hello through the paced link, 2 busy processes: %.2f s (limit on "
      "silence %.1f s)\n",
      took, kLimitS);
  conn->reset();

  // Silent past the limit: dropped, with its reason, while the wait goes on.
  int silent = Connect(l.address, SteadyNow() + 10).value();
  auto none = AcceptHellos(
      l.fd, 1, SteadyNow() + 2 * kLimitS, kLimitS, child.get(),
      [](const FrameHeader&, const TlsIdentity*) { return true; },
      [&](const std::string& why) { refusals.push_back(why); });
  EXPECT_TRUE(none.status().IsDeadlineExceeded()) << none.status().ToString();
  ASSERT_EQ(refusals.size(), 1u);
  EXPECT_EQ(refusals[0], "no hello within the deadline");
  close(silent);
}

// The parent's side: a child whose answers come 48 bytes every 0.1 s under the same load
// completes the handshake although it takes longer than ConnectTo's 1 s silence limit; a child
// that accepts and never answers fails it after the limit.
TEST(Tls, ParentWaitsForASlowChildThatKeepsAnswering) {
  RunKeys run = NewRun();
  auto parent = run.Node(1), child = run.Node(2);
  BusyProcesses load(2);
  Listener l;
  constexpr double kLimitS = 1.0;
  PacedRelay relay(l.address, /*pace_to_child=*/false, 48, 0.1);
  StatusOr<std::vector<Hello>> hellos = UnavailableError("not run");
  std::thread server([&] {
    hellos = AcceptHellos(l.fd, 1, SteadyNow() + 60, 30, child.get(),
                          [](const FrameHeader&, const TlsIdentity* peer) {
                            return peer != nullptr && peer->rank == 1;
                          });
  });
  const double t0 = SteadyNow();
  auto conn = ConnectTo(relay.address, SteadyNow() + 60, parent.get(), 2, kLimitS);
  const double took = SteadyNow() - t0;
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  EXPECT_GT(took, 2 * kLimitS) << "the handshake was not slower than the limit";
  FrameHeader hello = HelloFrom(1);
  ASSERT_TRUE((*conn)->Write(&hello, sizeof(hello)).ok());
  server.join();
  ASSERT_TRUE(hellos.ok()) << hellos.status().ToString();

  Listener mute;  // listens, never answers
  const double t1 = SteadyNow();
  auto refused = ConnectTo(mute.address, SteadyNow() + 60, parent.get(), 2, kLimitS);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(refused.status().IsDeadlineExceeded()) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("silent for 1.0 s"), std::string::npos)
      << refused.status().ToString();
  EXPECT_LT(SteadyNow() - t1, 3 * kLimitS);
}

// The parent refuses a child whose certificate is not the rank it dialled, or is the sender.
TEST(Tls, ParentRefusesAChildOfTheWrongRankOrRole) {
  RunKeys run = NewRun();
  for (int impostor : {3, 0}) {
    auto wrong = run.Node(impostor);
    Listener l;
    std::thread server([&] {
      auto h = AcceptHellos(l.fd, 1, SteadyNow() + 1, 1, wrong.get(),
                            [](const FrameHeader&, const TlsIdentity*) { return true; });
      EXPECT_FALSE(h.ok());
    });
    auto conn = ConnectTo(l.address, SteadyNow() + 10, run.Node(1).get(), 2, 5);
    ASSERT_FALSE(conn.ok());
    EXPECT_TRUE(conn.status().IsFailedPrecondition()) << conn.status().ToString();
    EXPECT_NE(conn.status().message().find(impostor == 3 ? "not rank 2" : "sender"),
              std::string::npos)
        << conn.status().ToString();
    server.join();
  }
}

// A TLS client without any certificate is refused.
TEST(Tls, ClientWithoutCertificateIsRefused) {
  RunKeys run = NewRun();
  auto child = run.Node(2);
  Listener l;
  std::vector<std::string> refusals;
  std::thread server([&] {
    auto h = AcceptHellos(
        l.fd, 1, SteadyNow() + 2, 1, child.get(),
        [](const FrameHeader&, const TlsIdentity*) { return true; },
        [&](const std::string& why) { refusals.push_back(why); });
    EXPECT_FALSE(h.ok());
  });
  // The openssl CLI as a client with no certificate.
  const std::string port = l.address.substr(l.address.rfind(':') + 1);
  const std::string cmd =
      "printf 'hello' | timeout 5 openssl s_client -quiet -tls1_3 -connect "
      "127.0.0.1:" +
      port + " >/dev/null 2>&1";
  EXPECT_NE(std::system(cmd.c_str()), -1);
  server.join();
  ASSERT_FALSE(refusals.empty());
  EXPECT_NE(refusals[0].find("peer did not return a certificate"), std::string::npos)
      << refusals[0];
}

// A commit report signed by its rank verifies at the sender; unsigned, altered, signed by another
// rank (a relay forging its child's report) or by another run's certificate does not.
TEST(Tls, CommitReportSignaturesAttributeReportsToTheirRank) {
  RunKeys run = NewRun();
  RunKeys other = NewRun();
  auto sender = run.Node(0);
  auto relay = run.Node(1);
  auto receiver = run.Node(2);
  auto stranger = other.Node(2);
  ASSERT_TRUE(sender && relay && receiver && stranger);
  const std::vector<uint8_t> body = {1, 2, 3, 4, 5, 6, 7, 8};
  auto tail = receiver->SignReport(body.data(), body.size());
  ASSERT_TRUE(tail.ok()) << tail.status().ToString();
  EXPECT_LE(tail->size(), 1024u);
  EXPECT_TRUE(
      sender->CheckReportSignature(tail->data(), tail->size(), body.data(), body.size(), 2).ok());
  // Unsigned.
  Status s = sender->CheckReportSignature(nullptr, 0, body.data(), body.size(), 2);
  EXPECT_TRUE(s.IsFailedPrecondition()) << s.ToString();
  // Another body (a relay changing the version or hash it reports).
  std::vector<uint8_t> altered = body;
  altered[0] ^= 1;
  s = sender->CheckReportSignature(tail->data(), tail->size(), altered.data(), altered.size(), 2);
  EXPECT_NE(s.message().find("bad signature"), std::string::npos) << s.ToString();
  // The relay signing a report for its child.
  auto forged = relay->SignReport(body.data(), body.size());
  ASSERT_TRUE(forged.ok());
  s = sender->CheckReportSignature(forged->data(), forged->size(), body.data(), body.size(), 2);
  EXPECT_NE(s.message().find("not by rank 2 itself"), std::string::npos) << s.ToString();
  // A certificate of another run's CA.
  auto foreign = stranger->SignReport(body.data(), body.size());
  ASSERT_TRUE(foreign.ok());
  s = sender->CheckReportSignature(foreign->data(), foreign->size(), body.data(), body.size(), 2);
  EXPECT_NE(s.message().find("did not issue"), std::string::npos) << s.ToString();
  // A truncated field.
  s = sender->CheckReportSignature(tail->data(), tail->size() - 1, body.data(), body.size(), 2);
  EXPECT_TRUE(s.IsDataLoss()) << s.ToString();
}

}  // namespace
}  // namespace dcr::internal
