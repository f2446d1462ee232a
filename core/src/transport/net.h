// Internal: POSIX TCP helpers, the relay wire frames, and the WAN emulation (token bucket + delay
// line) used by the node driver.
//
// Wire (little-endian), dcr wire protocol kWireProtocol; every frame starts with a 64-byte
// FrameHeader:
//   u32 magic "DCRF" | u8 type | u8 blob_kind | u16 protocol | u32 from_rank | u32 stream
//   | u64 run | u64 version | u64 blob (the record count for kReport) | u64 blob_size
//   | u64 offset | u64 length
// followed by `length` payload bytes for kPiece, kAbort and kReport (none for the others). A
// kReport payload is the per-receiver commit records of the sender's subtree
// (node/commit_reports.h), forwarded verbatim by relays. `protocol` is
// the wire protocol the writer speaks (kWireProtocol); `run` the run id of the refit
// (NodePlan::run_id) and `version` the version number it delivers (NodePlan::version), in every
// frame. The first frame on every connection is a kHello from the parent (stream = stream index,
// blob = number of streams); a node refuses a hello of another protocol, run or version (the
// connection is dropped and it keeps listening for its parent; a long-lived node keeps its
// parent's hello of a later version for that version, node/held_hellos.h) and treats any later
// frame of another protocol, run or version as malformed. kAbort travels down the tree on stream 0:
// the sender refused the refit before sending anything (e.g. checkpoints that cannot make a delta);
// its payload is the reason, at most kMaxAbortMessageBytes of text. A relay forwards it to its
// children; every node stops with it. kHeartbeat (no payload; stream = the stream it travels on)
// says the writer is alive: a parent sends one on each stream to a child, a child on stream 0 to
// its parent, whenever that stream has been given nothing to send for the heartbeat interval
// (heartbeat.h). A reader that gets no byte on a stream for the read deadline treats the link
// as lost (Conn::SetIdleTimeout).
// With mutual TLS (tls.h) the same frames travel inside each connection's TLS 1.3 stream, the
// handshake completing before the hello.
#ifndef DCR_CORE_SRC_TRANSPORT_NET_H_
#define DCR_CORE_SRC_TRANSPORT_NET_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dcr/status.h"
#include "dcr/statusor.h"
#include "transport/tls.h"

namespace dcr::internal {

enum class FrameType : uint8_t {
  kHello = 1,
  kPiece = 2,
  kAck = 3,
  kReport = 4,
  kAbort = 5,
  kHeartbeat = 6,
};
inline constexpr uint32_t kFrameMagic = 0x46524344;  // "DCRF"
inline constexpr uint64_t kMaxAbortMessageBytes = 4096;
// The wire protocol this build speaks: the FrameHeader layout and frame semantics above. Any
// change to either takes the next number.
inline constexpr uint16_t kWireProtocol = 2;

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint8_t type = 0;
  uint8_t blob_kind = 0;
  uint16_t protocol = kWireProtocol;
  uint32_t from_rank = 0;
  uint32_t stream = 0;
  uint64_t run = 0;
  uint64_t version = 0;
  uint64_t blob = 0;
  uint64_t blob_size = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};
static_assert(sizeof(FrameHeader) == 64, "wire frame header is 64 bytes");

// Why header `h` is not a frame of this node's wire protocol (kWireProtocol), run `run` and
// version `version`: "peer rank 3 speaks dcr wire protocol 2, this node 1", "peer rank 3 is of
// run 0x..., this node's run 0x...", "peer rank 3 sends version 4, this node waits for version
// 5". Empty when it is one.
std::string WireMismatch(const FrameHeader& h, uint64_t run, uint64_t version);

double WallNow();    // CLOCK_REALTIME seconds
double SteadyNow();  // CLOCK_MONOTONIC seconds

// "host:port" -> listening socket (SO_REUSEADDR). Errors name the address.
StatusOr<int> Listen(const std::string& address);
// Connects, retrying until `deadline` (steady seconds) while the peer is not yet listening.
StatusOr<int> Connect(const std::string& address, double deadline);
// Accept with a deadline (steady seconds). kDeadlineExceeded on timeout.
StatusOr<int> Accept(int listen_fd, double deadline);
// One connected TCP stream of a tree edge: plain, or TLS 1.3 once its handshake completed. One
// thread may Read while another Writes (the SSL object is used under a lock, the socket is
// non-blocking and waited on with poll outside it); Shutdown, from any thread, makes both return
// kUnavailable. Reads and writes go straight between the socket (through OpenSSL's record
// buffer under TLS) and the caller's memory: a piece lands in its blob buffer with no copy here.
// With an idle timeout set, a Read or Write that makes no progress (not one byte moved) for that
// long fails with kUnavailable naming the silence, so a peer that is gone without closing (a dead
// host, a partition, a frozen process) is noticed like a closed one.
class Conn {
 public:
  // Plain TCP on `fd` (closed by the destructor when `owns`).
  explicit Conn(int fd, bool owns = true);
  // TLS: `ssl` (handshake done) on non-blocking `fd`; takes ownership of both.
  Conn(int fd, ssl_st* ssl, TlsIdentity peer);
  ~Conn();
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  Status Write(const void* data, size_t size);
  // kUnavailable on EOF before `size` bytes ("peer closed").
  Status Read(void* data, size_t size);
  // Seconds without progress after which Read and Write fail ("no bytes from the peer for 10.0 s
  // (read deadline)"); 0 (the default) = wait as long as the connection is up. Set before the
  // connection is shared between threads.
  void SetIdleTimeout(double seconds) { idle_timeout_s_ = seconds; }
  void Shutdown();
  int fd() const { return fd_; }
  bool tls() const { return ssl_ != nullptr; }
  // The peer's certificate identity (TLS only).
  const TlsIdentity& peer() const { return peer_; }

 private:
  // Waits until the socket is ready for `events`; kUnavailable when it is shut down or, with an
  // idle timeout, when `until` (steady seconds) passes first (`what`: "no bytes from the peer").
  Status WaitFor(short events, double until = 0, const char* what = nullptr);
  // The steady time at which an operation starting now gives up (0: never).
  double IdleUntil() const;
  // Write (`write`) or Read of `size` bytes at `data`; `data` is only read when writing.
  Status Move(bool write, void* data, size_t size);
  int fd_;
  double idle_timeout_s_ = 0;
  bool owns_;
  ssl_st* ssl_ = nullptr;
  TlsIdentity peer_;
  std::mutex mu_;  // guards ssl_'s state
  std::atomic<bool> shut_{false};
};

// How far a handshake or hello that keeps moving may run past its silence limit: a peer that
// answers every flight within `handshake_timeout_s` / `hello_timeout_s` (below) has this many
// times that limit in all, so a host under load completes a slow handshake on the tree path,
// while a peer that dribbles bytes cannot hold a connection slot without end.
constexpr double kHandshakeProgressFactor = 12;

// Connects to a child at `address` (retrying until `deadline` while it is not yet listening).
// With `tls`: completes the handshake and requires the child's certificate to be a relay or
// receiver of this run with rank `child_rank`; the handshake fails when the child is silent for
// `handshake_timeout_s` while it is waited on, and takes at most kHandshakeProgressFactor x
// `handshake_timeout_s` (and never past `deadline`) while it keeps answering. Errors name the
// address: kUnavailable, kDeadlineExceeded, kFailedPrecondition (the child's certificate refused).
StatusOr<std::unique_ptr<Conn>> ConnectTo(const std::string& address, double deadline,
                                          const TlsContext* tls, int child_rank,
                                          double handshake_timeout_s);

// Accepts connections on `listen_fd` until `want` of them have sent a 64-byte FrameHeader that
// `accept_hello` takes (it may keep per-stream state; returns false to refuse), and returns them
// with their hellos in arrival order. With `tls`, each connection first completes a TLS 1.3
// handshake whose client certificate TlsContext::CheckPeer accepts as a parent (sender or relay
// of this run); `accept_hello` then gets the peer's identity (null without TLS). Every
// connection has `hello_timeout_s` (steady seconds from its accept) to finish its handshake and
// send its hello, extended to `hello_timeout_s` past each time it sends bytes, up to
// kHandshakeProgressFactor x `hello_timeout_s` from its accept (a parent on a loaded host that
// answers slowly but steadily gets through); one that stays silent, closes early, fails the
// handshake (a plain-TCP peer, a
// certificate of another run or of the wrong role) or sends a header `accept_hello` refuses is
// closed, `refused` (if set) is told why, and the loop keeps listening, so a stray or hostile
// connection never takes the place of the real peer. Connections are served concurrently: a
// silent one does not delay the others. At most 64 wait at once, at most 16 of one source
// address: past either a new connection takes the place of one that has not authenticated (of
// its own source when that share is full, else of the source holding the most), one that has
// sent nothing first, then the oldest; one whose TLS peer is accepted (an authenticated parent)
// is never dropped for a new one, and when only such are left the new one is closed. `refused`
// is told at most 10 refusals a second, the rest counted in the next one told (and at the end).
// `give_up` (if set) is asked about twice a second while no connection has been taken; once it
// returns true the wait ends (the caller knows the peer is not coming), once the connections
// already made (accepted or waiting to be) have sent their hellos or timed out. `hold` (if set) is
// offered each connection whose whole hello `accept_hello` refused, before it is dropped: when
// it returns true it has moved the connection out of the Hello (kept for a later wait, e.g. a
// hello of a version after the one waited for), and the connection is neither dropped nor
// counted.
// Errors: kDeadlineExceeded when `deadline` passes first (the message counts the connections
// dropped), kAborted when `give_up` ended the wait, kUnavailable when accept or poll fail.
struct Hello {
  std::unique_ptr<Conn> conn;
  FrameHeader header;
};
StatusOr<std::vector<Hello>> AcceptHellos(
    int listen_fd, int want, double deadline, double hello_timeout_s, const TlsContext* tls,
    const std::function<bool(const FrameHeader&, const TlsIdentity*)>& accept_hello,
    const std::function<void(const std::string&)>& refused = nullptr,
    const std::function<bool()>& give_up = nullptr,
    const std::function<bool(Hello*)>& hold = nullptr);
Status WriteFull(int fd, const void* data, size_t size);
// kUnavailable on EOF before `size` bytes ("peer closed").
Status ReadFull(int fd, void* data, size_t size);
// Picks a TCP port on 127.0.0.1 that is free now, for a plan that names every node's address
// before the nodes start. The port is drawn at random below the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range), so that the source port of an outgoing connection --
// which the kernel takes from that range -- cannot claim it between this call and the node's
// listen; it is checked by binding it. A port this process handed out among its last 4096 is
// never returned again (its node may not listen yet). Falls back to a kernel-chosen port (bind
// to 0) when no port below the range binds in 64 draws. Thread-safe. Errors: kUnavailable
// (socket or bind failed).
StatusOr<int> FreePort();

// A shared emulated link of `rate` bytes/s: bytes cross one after another, in the order they are
// booked, at exactly the rate. The link keeps its own clock (the time its last booked byte
// leaves), so a caller that is scheduled late on a loaded machine does not slow it down: the
// next booking starts where the previous one ended, not when the caller got to it.
// rate <= 0: unlimited. Thread-safe.
class TokenBucket {
 public:
  TokenBucket(double rate, double burst) : rate_(rate), burst_(burst) {}
  // Blocks until n bytes may pass; after idleness up to `burst` bytes pass at once.
  void Acquire(uint64_t n);
  // Books n bytes that were ready to send at `ready` (SteadyNow seconds): they start when the
  // link has carried every byte booked before them, and no earlier than `ready`. Returns the
  // time their last byte has crossed (`ready` when unlimited). Does not block.
  double Reserve(uint64_t n, double ready);

 private:
  std::mutex mu_;
  double rate_, burst_;
  double free_at_ = 0;  // when the last booked byte has crossed (SteadyNow seconds)
};

// Writes frames to one socket from dedicated threads: the transport of one stream. Optional
// shaping: bytes are booked on the link (`bucket`, in segments of up to 64 KiB), then wait in a
// delay line for `latency_s` before they are written, so rate and latency compose like a real
// link. A segment's times come from the link's clock, not from when the writer's threads run: it
// is ready when its frame was sent (or, when the window held it, when the window opened), leaves
// the link at TokenBucket::Reserve's time and is written `latency_s` after that, so threads woken
// late on a loaded machine delay a write but neither the rate nor the following segments.
// The delay line holds at most `window_bytes` (0: no bound; a frame's first segment always
// enters an empty line), like a TCP window over the emulated path.
//
// A frame is *accepted* once its last byte entered the delay line: `accepted` runs then on the
// writer thread, with the stream's status so far (the first write error sticks). Without shaping
// that is at once, before the bytes are written; the writer keeps `keep` (and so the payload)
// alive until they are.
class FrameWriter {
 public:
  // Writes to `conn`, which must outlive the writer.
  FrameWriter(Conn* conn, std::shared_ptr<TokenBucket> bucket, double latency_s,
              uint64_t window_bytes = 0);
  // Writes to plain socket `fd` (not closed by the writer).
  FrameWriter(int fd, std::shared_ptr<TokenBucket> bucket, double latency_s,
              uint64_t window_bytes = 0);
  ~FrameWriter();  // Close()s
  // Queues a frame; `payload` (may be null when header.length == 0) must stay valid while `keep`
  // is held.
  void Send(const FrameHeader& header, const uint8_t* payload, std::shared_ptr<const void> keep,
            std::function<void(Status)> accepted);
  // Stops the threads after the queued frames (or at the first error) and joins them.
  void Close();
  int fd() const { return conn_->fd(); }
  // Steady time of the last Send (the writer's creation before any): heartbeat.h sends a
  // heartbeat on a writer given nothing for an interval.
  double last_send() const { return last_send_.load(); }

 private:
  struct Item {
    FrameHeader header;
    const uint8_t* payload = nullptr;
    std::shared_ptr<const void> keep;
    std::function<void(Status)> accepted;
    double sent_at = 0;  // SteadyNow at Send
  };
  struct Segment {
    double deliver_at = 0;
    std::vector<uint8_t> header_bytes;  // non-empty on the first segment of a frame
    const uint8_t* data = nullptr;
    size_t size = 0;
    size_t line_bytes = 0;             // header + data bytes counted in the delay line
    std::shared_ptr<const void> keep;  // on the last segment
  };
  void PaceLoop();
  void DelayLoop();

  std::unique_ptr<Conn> own_conn_;
  Conn* conn_;
  std::shared_ptr<TokenBucket> bucket_;
  double latency_s_;
  uint64_t window_bytes_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;
  std::deque<Segment> segments_;
  uint64_t line_bytes_ = 0;  // bytes in the delay line
  bool closing_ = false;
  bool pacer_done_ = false;
  std::atomic<double> last_send_{0};
  Status error_;
  std::thread pacer_, delayer_;
};

}  // namespace dcr::internal

#endif  // DCR_CORE_SRC_TRANSPORT_NET_H_
