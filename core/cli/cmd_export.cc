// dcr export: writes the version a long-lived receiver holds (its version log under --state) as
// the target checkpoint file, proven against the trainer's signed commitment of that version
// before it is written (node/version_state.h ExportHeldVersion).
//   dcr export DEPLOYMENT.yaml --state DIR [--rank R] -o OUT   a deployment's host, as dcr-node
//                                                              runs it (same file, same --state)
//   dcr export --plan PLAN.json -o OUT                         a `dcr run` node (plan-<r>.json)
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "command.h"
#include "dcr/node.h"
#include "dcr/scenario.h"
#include "dcr/status_macros.h"
#include "node/version_state.h"
#include "node_plans.h"

namespace dcr::cli {
namespace {

struct ExportArgs {
  std::string scenario;
  std::string plan;
  std::string state;
  std::string transport = "relay_tree";
  std::string out;
  int rank = -1;
  int threads = 0;
  bool json = false;
  bool allow_unsigned = false;
};

// The long-lived plan of the node whose state is exported: the plan file, or the plan dcr-node
// makes from the deployment for the rank (its state directory resolved to the deployment's).
StatusOr<NodePlan> ExportPlan(const ExportArgs& a) {
  if (!a.plan.empty()) {
    std::ifstream in(a.plan);
    if (!in) return NotFoundError("plan file not found: " + a.plan);
    std::stringstream ss;
    ss << in.rdbuf();
    return NodePlanFromJson(ss.str());
  }
  if (a.scenario.empty()) {
    return InvalidArgumentError("give DEPLOYMENT.yaml --state DIR, or --plan PLAN.json");
  }
  if (a.state.empty()) {
    return InvalidArgumentError("--state: the receiver's state directory (as dcr-node's --state)");
  }
  DCR_ASSIGN_OR_RETURN(Scenario s, LoadScenario(a.scenario));
  const int rank = a.rank >= 0 ? a.rank : RankFromEnvironment();
  if (rank < 0) {
    return InvalidArgumentError(
        "--rank: not given and none of RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK is "
        "set");
  }
  HostPlanOptions o;
  o.transport =
      a.transport == "object_store" ? TransportKind::kObjectStore : TransportKind::kRelayTree;
  o.state_dir = a.state;
  return HostPlan(s, rank, o);
}

int RunExport(const ExportArgs& a) {
  auto plan = ExportPlan(a);
  if (!plan.ok()) return ReportStatus("export", plan.status());
  auto e = internal::ExportHeldVersion(*plan, a.out, a.threads, a.allow_unsigned);
  if (!e.ok()) return ReportStatus("export", e.status());
  const std::string proof =
      !e->commitment.empty()
          ? "commitment " + e->commitment + ", the trainer's signed root"
          : "content hash " + e->content_hash + ", as its version log recorded it (unsigned)";
  if (a.json) {
    std::printf(
        "{\"rank\": %d, \"version\": %llu, \"path\": \"%s\", \"commitment\": \"%s\", "
        "\"content_hash\": \"%s\", \"source\": \"%s\"}\n",
        plan->rank, static_cast<unsigned long long>(e->version), e->path.c_str(),
        e->commitment.c_str(), e->content_hash.c_str(), e->source.c_str());
  } else {
    std::printf("EXPORTED: rank %d, version %llu -> %s (%s; from its %s)\n", plan->rank,
                static_cast<unsigned long long>(e->version), e->path.c_str(), proof.c_str(),
                e->source.c_str());
  }
  return 0;
}

}  // namespace

DCR_REGISTER_COMMAND(
    "export",
    "Write the version a receiver holds (from its --state) as the exact target checkpoint, proven "
    "against the trainer's signed commitment before it is written",
    [](CLI::App* app) {
      auto a = std::make_shared<ExportArgs>();
      app->add_option("deployment", a->scenario,
                      "The deployment (scenario) YAML the node runs, with --state");
      app->add_option("--plan", a->plan,
                      "Instead: the node's plan JSON (a `dcr run` plan-<r>.json)");
      app->add_option("--state", a->state,
                      "The node's --state directory (the deployment's state inside it is found "
                      "as dcr-node finds it)");
      app->add_option("--transport", a->transport,
                      "relay_tree | object_store: as the node was started (dcr-node --transport)")
          ->check(CLI::IsMember({"relay_tree", "object_store"}));
      app->add_option("--rank", a->rank,
                      "The receiver's rank; default: the first set of RANK, SLURM_PROCID, "
                      "OMPI_COMM_WORLD_RANK, PMI_RANK");
      app->add_option("-o,--out", a->out,
                      "Checkpoint to write (atomically: a temporary beside it, renamed once "
                      "proven)")
          ->required();
      app->add_option("--threads", a->threads, "Hashing threads (0 = all cores)");
      app->add_flag("--json", a->json, "Print the result as one JSON line");
      app->add_flag("--unsigned", a->allow_unsigned,
                    "A deployment without network.signing: check the content hash the node's "
                    "version log recorded instead of a signed commitment (a checksum, not a "
                    "proof of origin); refused otherwise");
      return [a]() { return RunExport(*a); };
    });

}  // namespace dcr::cli
