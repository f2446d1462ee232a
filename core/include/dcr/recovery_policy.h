// Recovery decisions of one node: a pure state machine (events in, actions out), the companion of
// the transport policies in relay_policy.h.
//
// A relay policy ends with Fail when its stream cannot go on (a send or apply failed, retries ran
// out). What the node does next -- fall back to the object store, re-parent, give up, resume after
// a restart, repair a doubtful chunk -- is decided here, and only here. Like relay_policy.h, the
// policy owns no threads, sockets, files, clocks or buffers: every event carries the driver's
// "now", deadlines are SetTimer actions reported back as TimerFired, and the driver does the work
// the actions name (closing links, creating a DownloaderPolicy, reloading storage, fetching an
// overwrite form) through a RecoveryEnvironment, one call per action (PerformRecovery). The same
// code is driven by the deterministic fault harness (dcr/testing/fault_injection.h), which
// injects the faults and implements the environment; a socket driver feeds the same events from
// its connections, timers and journal.
//
// Rules and their costs (RecoveryOptions names every parameter):
//
//   R1 Detection deadline. ParentLost is the driver's first evidence that the parent is gone (a
//      reset or closed connection, a missed keepalive; in the harness, the parent's death or its
//      departure from the tree). The node declares the parent dead detect_timeout_s later unless
//      ParentHeard arrives first (the parent answered after all). Cost: every recovery from a lost
//      parent starts detect_timeout_s late; a shorter deadline turns slow parents into false
//      alarms (each one a fallback).
//   R2 Where to go after a lost parent. Re-parent to the grandparent (Reparent) when the driver
//      named it in ParentLost::adopter (a live tree node that serves a child joining mid-stream)
//      and it is not the sender (node 0), and at most once per incarnation; otherwise fall back
//      to the object store. Why: the grandparent is one short-link hop away and already holds
//      the stream, so re-parenting costs one extra child's bandwidth there instead of a re-fetch
//      through the store; the sender is excluded because an orphan of a long-link relay would
//      open one more long-link stream per orphan, while the store already holds what the long
//      link delivered; a second loss within one incarnation means the tree path is not healthy,
//      and the store is the path that does not depend on it.
//   R3 Failed stream. A StreamFailed (the tree or download policy emitted Fail: corrupt piece,
//      apply error, send failure, retries exhausted) falls back to the object store, whatever the
//      stream was: the store holds every blob once the uploader has published it, and the
//      downloader retries and polls on its own.
//   R4 Fallback. FallBackToStore (the driver discards the node's stream policy and everything in
//      flight for it), then LeaveTree if the node was in the tree (its children see ParentLost),
//      then a backoff timer; when it fires, StartDownload (a fresh DownloaderPolicy on the
//      stream's prefix). The k-th recovery of a node waits
//      min(backoff_max_s, backoff_initial_s * 2^min(k, 10)) seconds (defaults: 10 ms, 20 ms, ...,
//      0.5 s), so a sender that is down or a partitioned store is not polled in a tight loop. The
//      download fetches the whole stream again: chunks the journal shows applied are fetched and
//      then skipped by the journaled receiver (their bytes cross the link again; nothing is
//      written twice).
//   R5 Restart. Restarted reports a process restart with the replayed journal. Storage that
//      survived is re-attached as it is; storage that was lost is reloaded from the journal's
//      committed version and the in-flight delta abandoned (ReloadCommitted: every chunk of it is
//      applied again). A node whose journal already shows the target committed has nothing to
//      fetch; any other node downloads from the store at once (a zero-delay timer, so the driver
//      finishes the restart before the download starts). A restarted node does not rejoin the
//      tree: its children were told it left when it died.
//   R6 Overwrite repair. Every refusal of a doubtful chunk's relative form (ChunkDoubtful: its
//      journal shows a Begin without an End) is answered with RequestOverwrite for that chunk's
//      overwrite form at OverwriteKey(prefix, chunk) (the sender builds it on demand). The
//      request is made when the relative form arrives, not at restart: the chunk can only be
//      applied once the delta's header has been applied again, and the relative form is what
//      the sender builds the overwrite form from. Cost: one store round trip on that chunk's
//      path per doubtful chunk. A request that fails fails that apply, and R3 follows.
//   R7 Budget. Each fallback, re-parent and restart spends one recovery; the one past
//      max_recoveries is refused with GiveUp (terminal: the node stays as it is, uncommitted).
//      Cost: a node that keeps failing stops consuming the store and the sender after
//      max_recoveries tries.
//   R8 Committed nodes do not recover: a committed node's failed stream only makes it leave
//      the tree (LeaveTree, so its children notice), and ParentLost is ignored.
//   R9 Sender (RecoveryRole::kSender). A failed tree policy leaves the tree (LeaveTree: the
//      receivers notice and fall back to the store, which the uploader still fills); a failed
//      uploader stops uploading (StopUpload; the stream stays unpublished until the sender
//      restarts); a restart re-publishes (Republish: rebuild the identical delta, restart the
//      tree and the uploader, rebuild the joint commit from the receivers' journals). The
//      sender's restarts are its supervisor's and spend no budget.
//
// Thread safety: not thread-safe; a driver calls Handle from one thread (or under one lock).
// Deterministic: the same events (with the same times) give the same actions.
#ifndef DCR_CORE_INCLUDE_DCR_RECOVERY_POLICY_H_
#define DCR_CORE_INCLUDE_DCR_RECOVERY_POLICY_H_

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "dcr/relay_policy.h"
#include "dcr/status.h"

namespace dcr {

struct RecoveryOptions {
  // R1: seconds from ParentLost to declaring the parent dead. Default 0.25. REQUIRES: >= 0.
  double detect_timeout_s = 0.25;
  // R7: recoveries (fallbacks, re-parents, restarts) a node may make; the next one gives up.
  // Default 12.
  int max_recoveries = 12;
  // R4: backoff before the k-th recovery's download starts:
  // min(backoff_max_s, backoff_initial_s * 2^min(k, 10)). Defaults 0.005 s and 0.5 s.
  double backoff_initial_s = 0.005;
  double backoff_max_s = 0.5;
  // R6: the stream's object-store prefix (RelayOptions::prefix); overwrite forms are stored at
  // OverwriteKey(prefix, chunk). Default "dcr".
  std::string prefix = "dcr";
};

// Object key of a chunk's overwrite form: "ow/<prefix>/<chunk id, decimal>", e.g. "ow/dcr/17".
std::string OverwriteKey(const std::string& prefix, uint64_t chunk_id);

enum class RecoveryRole : uint8_t { kSender, kReceiver };

namespace recovery {

// Which policy of a node failed (StreamFailed).
enum class Stream : uint8_t { kTree, kDownload, kUpload };

// ---- events (driver -> policy) ----

// First evidence that the parent is gone (R1). `adopter`: the grandparent when the driver can
// attach this node to it mid-stream (R2), else kNoNode.
struct ParentLost {
  NodeId parent = kNoNode;
  NodeId adopter = kNoNode;
};
// The parent answered after a ParentLost (a reconnect, a keepalive reply): the deadline is off.
struct ParentHeard {
  NodeId parent = kNoNode;
};
// The node's `stream` policy emitted Fail{code, message} (R3, R9).
struct StreamFailed {
  Stream stream = Stream::kTree;
  StatusCode code = StatusCode::kUnavailable;
  std::string message;
};
// This node's copy committed the target (R8).
struct Committed {};
// The node's process restarted (R5, R9). Receivers: `storage_lost` when the storage did not
// survive (host memory); `target_committed` when the replayed journal shows the target
// committed; `applied` / `doubtful` count the in-flight delta's chunks in the journal.
struct Restarted {
  bool storage_lost = false;
  bool target_committed = false;
  uint64_t applied = 0;
  uint64_t doubtful = 0;
};
// The journaled receiver refused the relative form of chunk `chunk_id`, which the journal shows
// doubtful (R6).
struct ChunkDoubtful {
  uint64_t chunk_id = 0;
};
// The timer set by the last SetTimer expired (a driver may deliver it late).
struct TimerFired {};

using Event = std::variant<ParentLost, ParentHeard, StreamFailed, Committed, Restarted,
                           ChunkDoubtful, TimerFired>;

// ---- actions (policy -> driver) ----

// Deliver TimerFired at `at` (replaces any earlier timer of this policy).
struct SetTimer {
  TimePoint at = 0;
};
// The node's data source becomes the object store: discard the stream policy (tree or download)
// and everything in flight for it. `reason` names the failure. The download starts with
// StartDownload.
struct FallBackToStore {
  std::string reason;
};
// Stop the tree policy and close the links to the parent and the children (each child's driver
// reports ParentLost to its policy).
struct LeaveTree {};
// Create a DownloaderPolicy on the stream's prefix and Start it.
struct StartDownload {};
// Join `to`'s tree as its child for the rest of the stream (R2).
struct Reparent {
  NodeId to = kNoNode;
};
// Storage was lost (R5): reload it from the journal's committed version and abandon the
// in-flight delta in the journal.
struct ReloadCommitted {};
// Fetch the overwrite form of chunk `chunk_id` from `key` and apply it in place of the refused
// relative form (R6).
struct RequestOverwrite {
  uint64_t chunk_id = 0;
  std::string key;
};
// Sender (R9): stop the uploader.
struct StopUpload {};
// Sender (R9): rebuild the delta, restart the tree and the uploader, rebuild the joint commit.
struct Republish {};
// The recovery budget is spent (R7). Terminal: every later event is ignored.
struct GiveUp {
  std::string message;
};

using Action = std::variant<SetTimer, FallBackToStore, LeaveTree, StartDownload, Reparent,
                            ReloadCommitted, RequestOverwrite, StopUpload, Republish, GiveUp>;

// One-liners for logs and traces, e.g. "ParentLost{2 adopter -1}", "SetTimer{0.2500}".
std::string ToString(const Event& e);
std::string ToString(const Action& a);

}  // namespace recovery

// The recovery state machine of one node. A receiver (or relay) starts in the tree (kTree); one
// that starts from the store (a late joiner) is constructed with in_tree = false. The object
// lives as long as the node's supervisor: a driver that restarts the node in place keeps it (the
// budget spans restarts); a driver whose policy dies with the process constructs a new one and
// passes the recoveries already spent.
class RecoveryPolicy {
 public:
  enum class Mode : uint8_t {
    kTree,       // receiving from its parent
    kStore,      // downloading from the object store (or waiting for the backoff)
    kCommitted,  // holds the target
    kGaveUp,     // budget spent
  };

  // REQUIRES: options.max_recoveries >= 0, recoveries_spent >= 0.
  RecoveryPolicy(RecoveryRole role, const RecoveryOptions& options, bool in_tree = true,
                 int recoveries_spent = 0);

  // Feeds one event at `now`; appends the resulting actions to `out`, in the order the driver
  // should carry them out. Events not meaningful for the role or the mode are ignored.
  void Handle(TimePoint now, const recovery::Event& event, std::vector<recovery::Action>* out);

  RecoveryRole role() const { return role_; }
  Mode mode() const { return mode_; }
  int recoveries() const { return recoveries_; }
  // A ParentLost is waiting for its deadline.
  bool parent_suspected() const { return suspect_ != kNoNode; }

 private:
  enum class TimerFor : uint8_t { kNone, kDetect, kDownload };
  void HandleSender(const recovery::Event& event, std::vector<recovery::Action>* out);
  void FallBack(TimePoint now, const std::string& reason, std::vector<recovery::Action>* out);
  // Spends one recovery; false (and GiveUp appended) when the budget is spent.
  bool Spend(const std::string& what, std::vector<recovery::Action>* out);

  RecoveryRole role_;
  RecoveryOptions options_;
  Mode mode_;
  int recoveries_;
  NodeId suspect_ = kNoNode;  // parent waiting for its deadline
  NodeId adopter_ = kNoNode;  // offered with the ParentLost
  bool reparented_ = false;   // R2: once per incarnation
  TimerFor timer_ = TimerFor::kNone;
};

const char* RecoveryModeName(RecoveryPolicy::Mode mode);

// What a driver provides to carry out recovery actions: one call per action, named and shaped as
// the action. Only SetTimer has a completion (TimerFired, fed back to RecoveryPolicy::Handle);
// the other calls start work whose progress belongs elsewhere (a download to its
// DownloaderPolicy, an overwrite form to the node's apply path).
class RecoveryEnvironment {
 public:
  virtual ~RecoveryEnvironment() = default;
  virtual void SetTimer(TimePoint at) = 0;
  virtual void FallBackToStore(const std::string& reason) = 0;
  virtual void LeaveTree() = 0;
  virtual void StartDownload() = 0;
  virtual void Reparent(NodeId to) = 0;
  virtual void ReloadCommitted() = 0;
  virtual void RequestOverwrite(uint64_t chunk_id, const std::string& key) = 0;
  virtual void StopUpload() = 0;
  virtual void Republish() = 0;
  virtual void GiveUp(const std::string& message) = 0;
};

// Carries out `actions` on `env`, in order, exactly one environment call per action.
// REQUIRES: env non-null.
void PerformRecovery(const std::vector<recovery::Action>& actions, RecoveryEnvironment* env);

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_RECOVERY_POLICY_H_
