// PolicyHost: the one place where a node's policy (relay_policy.h) meets its driver.
//
// A driver -- `dcr node` over sockets and object stores, the SimGrid actors of sim/, the
// deterministic fault harness -- implements a NodeEnvironment: a clock and one timer, a
// transport (send a piece, acknowledge a blob, report a commit), an applier, a store (put, list,
// fetch) and the node's outcomes. The host owns the policy, feeds it the driver's events and turns
// every action into exactly one environment call, in the order the policy emitted them. The
// environment decides nothing: it moves the bytes the actions name and reports completions back
// through Handle (or Post, from inside an environment call). Every driver therefore runs the
// same decisions, which the conformance test (tests/conformance) checks by replaying one event
// trace through each driver's hosting.
//
// Thread safety: not thread-safe; call Handle and Post from the driver's event thread only.
#ifndef DCR_CORE_INCLUDE_DCR_POLICY_HOST_H_
#define DCR_CORE_INCLUDE_DCR_POLICY_HOST_H_

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dcr/relay_policy.h"
#include "dcr/status.h"

namespace dcr {

// What a driver provides. Each call starts the named work and returns; its completion comes back
// as the event named here (through PolicyHost::Handle, or Post when it completes at once).
class NodeEnvironment {
 public:
  virtual ~NodeEnvironment() = default;
  // ---- clock ----
  // Deliver TimerFired at `at` (replaces the node's earlier timer).
  virtual void SetTimer(TimePoint at) = 0;
  // ---- transport ----
  // Hand the piece to the transport of stream `send.stream` to `send.to`; report SendDone once the
  // transport accepted it (relay_policy.h: "SendDone means one thing"), SendFailed on error. The
  // peer gets DataReceived when the bytes arrive.
  virtual void Send(const action::Send& send) = 0;
  // Control messages to the parent (AckReceived / SubtreeCommitted there). No completion event.
  virtual void Ack(const action::Ack& ack) = 0;
  virtual void ReportCommit(const action::ReportCommit& report) = 0;
  // Sender with edge relays: make the plain form of `transcode.blob` for edge relay
  // `transcode.to` and report BlobReencoded{to, plain form} (or, when the blob has none,
  // BlobReencoded{to, blob, plain = false}); the Sends of the blob to it that follow name `plain`.
  virtual void Transcode(const action::Transcode& transcode) = 0;
  // ---- apply ----
  // Apply the complete blob; report ApplyDone.
  virtual void Apply(const action::Apply& apply) = 0;
  // The blob's bytes are no longer needed. No completion event.
  virtual void Release(BlobId blob) = 0;
  // ---- store ----
  virtual void Put(const action::Put& put) = 0;        // report PutDone
  virtual void List(const action::List& list) = 0;     // report ListDone
  virtual void Fetch(const action::Fetch& fetch) = 0;  // report FetchDone
  // ---- outcomes (no completion events) ----
  virtual void Committed() = 0;  // action::Commit
  virtual void TreeCommitted(int receivers) = 0;
  virtual void Published() = 0;
  // An edge relay passed its lag bound or caught up (action::EdgeLag).
  virtual void EdgeLag(const action::EdgeLag& lag) = 0;
  // The policy failed (action::Fail, terminal): `status` carries its code and message.
  virtual void Failed(const Status& status) = 0;
};

// A recorded step of a hosted policy: the event fed (with its time) and the actions it produced.
struct TraceStep {
  TimePoint now = 0;
  Event event;
  std::vector<Action> actions;
};

class PolicyHost {
 public:
  // REQUIRES: policy and env non-null; env outlives the host.
  PolicyHost(std::unique_ptr<NodePolicy> policy, NodeEnvironment* env);
  // Hosts a policy the caller owns (the fault harness replaces a node's policy when the node
  // restarts or falls back). REQUIRES: policy outlives every Handle call.
  PolicyHost(NodePolicy* policy, NodeEnvironment* env);

  // Feeds `event` at `now` and performs the resulting actions on the environment, in order.
  // Events the environment Posts meanwhile are fed afterwards, in the order posted, at `now`.
  void Handle(TimePoint now, const Event& event);
  // From inside an environment call: queue an event that completed at once (fed by the running
  // Handle). Outside a Handle it is fed immediately at `now`.
  void Post(TimePoint now, Event event);

  const NodePolicy& policy() const { return *policy_; }
  bool done() const { return policy_->done(); }
  bool failed() const { return policy_->failed(); }
  // Every tree edge to open (NodePolicy::links).
  std::vector<Link> links() const { return policy_->links(); }

  // Records every step into `trace` (not owned; nullptr stops recording).
  void set_trace(std::vector<TraceStep>* trace) { trace_ = trace; }
  // Calls `fn` with every step, after the policy decided and before its actions are performed.
  void set_observer(std::function<void(const TraceStep&)> fn) { observer_ = std::move(fn); }

 private:
  void Feed(TimePoint now, const Event& event);
  void Perform(const Action& action);

  std::unique_ptr<NodePolicy> owned_;
  NodePolicy* policy_;
  NodeEnvironment* env_;
  std::vector<TraceStep>* trace_ = nullptr;
  std::function<void(const TraceStep&)> observer_;
  std::deque<Event> posted_;
  bool handling_ = false;
};

// One line per action ("Send{to 1 s0 3 @0 +1048576}", relay_policy.h ToString), for comparing
// the actions of two hostings.
std::vector<std::string> ActionLines(const std::vector<TraceStep>& trace);

}  // namespace dcr

#endif  // DCR_CORE_INCLUDE_DCR_POLICY_HOST_H_
