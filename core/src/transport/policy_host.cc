// PolicyHost (see dcr/policy_host.h for the contract).
#include "dcr/policy_host.h"

#include <utility>

namespace dcr {

PolicyHost::PolicyHost(std::unique_ptr<NodePolicy> policy, NodeEnvironment* env)
    : owned_(std::move(policy)), policy_(owned_.get()), env_(env) {}

PolicyHost::PolicyHost(NodePolicy* policy, NodeEnvironment* env) : policy_(policy), env_(env) {}

void PolicyHost::Handle(TimePoint now, const Event& event) {
  if (handling_) {
    posted_.push_back(event);
    return;
  }
  handling_ = true;
  Feed(now, event);
  while (!posted_.empty()) {
    Event next = std::move(posted_.front());
    posted_.pop_front();
    Feed(now, next);
  }
  handling_ = false;
}

void PolicyHost::Post(TimePoint now, Event event) {
  if (handling_) {
    posted_.push_back(std::move(event));
    return;
  }
  Handle(now, event);
}

void PolicyHost::Feed(TimePoint now, const Event& event) {
  std::vector<Action> actions;
  policy_->Handle(now, event, &actions);
  if (trace_ != nullptr || observer_) {
    TraceStep step{now, event, actions};
    if (observer_) observer_(step);
    if (trace_ != nullptr) trace_->push_back(std::move(step));
  }
  for (const Action& a : actions) Perform(a);
}

void PolicyHost::Perform(const Action& a) {
  if (const auto* s = std::get_if<action::Send>(&a)) {
    env_->Send(*s);
  } else if (const auto* ack = std::get_if<action::Ack>(&a)) {
    env_->Ack(*ack);
  } else if (const auto* ap = std::get_if<action::Apply>(&a)) {
    env_->Apply(*ap);
  } else if (const auto* rel = std::get_if<action::Release>(&a)) {
    env_->Release(rel->blob);
  } else if (std::holds_alternative<action::Commit>(a)) {
    env_->Committed();
  } else if (const auto* rc = std::get_if<action::ReportCommit>(&a)) {
    env_->ReportCommit(*rc);
  } else if (const auto* tc = std::get_if<action::TreeCommitted>(&a)) {
    env_->TreeCommitted(tc->receivers);
  } else if (const auto* put = std::get_if<action::Put>(&a)) {
    env_->Put(*put);
  } else if (std::holds_alternative<action::Published>(a)) {
    env_->Published();
  } else if (const auto* list = std::get_if<action::List>(&a)) {
    env_->List(*list);
  } else if (const auto* f = std::get_if<action::Fetch>(&a)) {
    env_->Fetch(*f);
  } else if (const auto* t = std::get_if<action::SetTimer>(&a)) {
    env_->SetTimer(t->at);
  } else if (const auto* trc = std::get_if<action::Transcode>(&a)) {
    env_->Transcode(*trc);
  } else if (const auto* lag = std::get_if<action::EdgeLag>(&a)) {
    env_->EdgeLag(*lag);
  } else if (const auto* fail = std::get_if<action::Fail>(&a)) {
    env_->Failed(Status(fail->code, fail->message));
  }
}

std::vector<std::string> ActionLines(const std::vector<TraceStep>& trace) {
  std::vector<std::string> lines;
  for (const TraceStep& step : trace) {
    for (const Action& a : step.actions) lines.push_back(ToString(a));
  }
  return lines;
}

}  // namespace dcr
