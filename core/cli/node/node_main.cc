// dcr-node: one node of a refit (sender, relay, receiver, uploader, downloader). The deployable
// node binary: it links the product libraries only (never the testing library). `dcr node ARGS`
// runs it with the same arguments.
//   dcr-node --plan PLAN.json              what `dcr run` starts on this machine
//   dcr-node SCENARIO.yaml --rank R ...    multi-host: one process per host; the rank comes from
//                                          --rank, SLURM_PROCID, OMPI_COMM_WORLD_RANK or PMI_RANK;
//                                          addresses from network.hosts; TLS credentials
//                                          from network.tls (`dcr keys` makes them); a cuda
//                                          node's GPU from LOCAL_RANK, SLURM_LOCALID or
//                                          OMPI_COMM_WORLD_LOCAL_RANK when set (through
//                                          receivers.devices), else its index on its host.
//                                          With --target: one refit. Without: long-lived, one
//                                          version per model.checkpoints entry after the base,
//                                          recovering with --state DIR (HostPlan, node_plans.h).
// Either form probes the plan's device first: one that cannot be used is refused (exit 15 for
// cuda without a usable GPU, naming CUDA and the reason) before the node connects or loads.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include <CLI/CLI.hpp>

#include "command.h"
#include "dcr/device.h"
#include "dcr/node.h"
#include "dcr/scenario.h"
#include "dcr/status_macros.h"
#include "node_plans.h"

namespace dcr::cli {
namespace {

struct NodeArgs {
  std::string plan;
  std::string scenario;
  int rank = -1;
  std::string method = "delta";
  std::string transport = "relay_tree";
  std::string base, target, out;
  // Run folder of the plans; every file the plans put there is overridden below (result, ready
  // and go paths), and the store path comes from the scenario.
  std::string work_dir = ".";
  std::string prefix;  // "" = refit/step-1 (one refit), refit (long-lived: refit/step-<k>)
  std::string state;   // recovery state of a long-lived node
  std::string store;   // its in-region store
};

StatusOr<NodePlan> PlanFromArgs(const NodeArgs& a) {
  if (!a.plan.empty()) {
    std::ifstream in(a.plan);
    if (!in) return NotFoundError("plan file not found: " + a.plan);
    std::stringstream ss;
    ss << in.rdbuf();
    return NodePlanFromJson(ss.str());
  }
  if (a.scenario.empty()) return InvalidArgumentError("give --plan FILE or a SCENARIO.yaml");
  DCR_ASSIGN_OR_RETURN(Scenario s, LoadScenario(a.scenario));
  int rank = a.rank >= 0 ? a.rank : RankFromEnvironment();
  if (rank < 0) {
    return InvalidArgumentError("--rank: not given and none of SLURM_PROCID, OMPI_COMM_WORLD_RANK, "
                                "PMI_RANK is set");
  }
  HostPlanOptions o;
  o.method = a.method == "full" ? Method::kFull : Method::kDelta;
  o.transport = a.transport == "object_store" ? TransportKind::kObjectStore
                                              : TransportKind::kRelayTree;
  o.base = a.base;
  o.target = a.target;
  o.work_dir = a.work_dir;
  o.prefix = a.prefix;
  o.state_dir = a.state;
  o.store = a.store;
  o.result_path = a.out;
  DCR_ASSIGN_OR_RETURN(NodePlan p, HostPlan(s, rank, o));
  if (p.rank == 0) {
    for (const NodeVersion& v : p.versions) {
      if (v.target_path.empty()) {
        return InvalidArgumentError(
            "version " + std::to_string(v.version) +
            ": no checkpoint for the sender (give model.checkpoints, one per version after the "
            "base, or publish from the training process through dcr/publisher_c.h)");
      }
    }
  }
  return p;
}

int NodeMain(const NodeArgs& a) {
  UseDataPlaneAllocator();
  auto plan = PlanFromArgs(a);
  if (!plan.ok()) return ReportStatus("node", plan.status());
  // A device that cannot be used is refused before the node connects or loads anything.
  Status probe = ProbePlanDevice(*plan);
  if (!probe.ok()) return ReportStatus("node", probe);
  NodeResult r;
  Status s = RunNode(*plan, &r);
  if (a.plan.empty()) std::printf("%s\n", NodeResultToJson(r).c_str());
  if (!r.freeze.empty()) std::fprintf(stderr, "dcr node: rank %d: %s\n", r.rank, r.freeze.c_str());
  if (!s.ok()) return ReportStatus("node", s);
  if (!plan->verify_path.empty() && plan->rank != 0 && !r.verified) {
    std::fprintf(stderr, "dcr node: %s\n", r.verify_message.c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace dcr::cli

int main(int argc, char** argv) {
  using dcr::cli::NodeArgs;
  CLI::App app{
      "dcr-node: run one node of a refit (started by `dcr run`, or one per host with --rank / "
      "SLURM_PROCID / OMPI_COMM_WORLD_RANK for multi-host runs)"};
  app.name("dcr node");
  NodeArgs a;
  app.add_option("scenario", a.scenario, "Scenario YAML (multi-host form)");
  app.add_option("--plan", a.plan, "Node plan JSON written by `dcr run`");
  app.add_option("--rank", a.rank, "Rank (0 = sender); default from the environment");
  app.add_option("--method", a.method, "delta | full")->check(CLI::IsMember({"delta", "full"}));
  app.add_option("--transport", a.transport, "relay_tree | object_store")
      ->check(CLI::IsMember({"relay_tree", "object_store"}));
  app.add_option("--base", a.base, "Base checkpoint (sender and delta receivers)");
  app.add_option("--target", a.target,
                 "Target checkpoint of a one-refit run (sender; receivers verify against it). "
                 "Without it the node is long-lived: one version per model.checkpoints entry "
                 "after the base");
  app.add_option("--prefix", a.prefix,
                 "Object-store prefix of this refit (default refit/step-1), or the root of the "
                 "versions' prefixes <prefix>/step-<k> (long-lived; default refit)");
  app.add_option("--state", a.state,
                 "Long-lived form: recovery state directory (kept across restarts of this rank)");
  app.add_option("--store", a.store,
                 "Long-lived form with --state: the in-region store (dir:PATH or s3://...) every "
                 "node of the region reaches");
  app.add_option("--result", a.out, "Write the node result JSON here");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    return dcr::cli::NodeMain(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dcr node: internal error: %s\n", e.what());
    return 18;
  }
}
