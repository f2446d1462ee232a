// dcr keys SCENARIO.yaml -o DIR: the credentials of one multi-host run (mutual TLS on the relay
// tree): a fresh CA and one certificate per rank, named by the run id and the rank's role in the
// scenario's tree. Hand each host its node-<rank>.crt / .key and ca.crt; ca.key stays here.
#include <cstdio>
#include <memory>
#include <string>

#include "command.h"
#include "dcr/relay_policy.h"
#include "dcr/scenario.h"
#include "dcr/status_macros.h"
#include "transport/tls.h"

namespace dcr::cli {
namespace {

struct KeysArgs {
  std::string scenario;
  std::string out;
  int days = 30;
};

Status KeysMain(const KeysArgs& a) {
  DCR_ASSIGN_OR_RETURN(Scenario s, LoadScenario(a.scenario));
  DCR_ASSIGN_OR_RETURN(Topology topo, TopologyFor(s));
  DCR_ASSIGN_OR_RETURN(const std::string run_id, internal::NewRunId());
  const std::vector<std::string> roles = internal::TreeRoles(topo.parent);
  DCR_RETURN_IF_ERROR(internal::WriteRunCredentials(a.out, run_id, roles, a.days,
                                                    /*replace=*/false));
  std::fprintf(stderr, "dcr keys: run %s: CA and %zu node certificates in %s (keys 0600)\n",
               run_id.c_str(), roles.size(), a.out.c_str());
  std::printf(
      "# Add to the scenario (network:); copy ca.crt and node-<rank>.crt/.key to host <rank>,\n"
      "# keep ca.key off the hosts.\n"
      "  tls:\n    ca: %s/ca.crt\n    cert: %s/node-{rank}.crt\n    key: %s/node-{rank}.key\n",
      a.out.c_str(), a.out.c_str(), a.out.c_str());
  return Status();
}

}  // namespace

DCR_REGISTER_COMMAND(
    "keys",
    "Make the TLS credentials of a multi-host run: a fresh CA and one certificate per rank of "
    "the scenario's relay tree (-o DIR: ca.crt, ca.key, node-<rank>.crt, node-<rank>.key; keys "
    "0600, never overwritten); prints the network.tls scenario keys",
    [](CLI::App* app) {
      auto a = std::make_shared<KeysArgs>();
      app->add_option("scenario", a->scenario, "Scenario YAML file (its tree shape)")->required();
      app->add_option("-o,--out", a->out, "Directory for the credentials (created 0700)")
          ->required();
      app->add_option("--days", a->days, "Validity of the certificates in days (default 30)")
          ->check(CLI::Range(1, 3650));
      return [a]() { return ReportStatus("keys", KeysMain(*a)); };
    });

}  // namespace dcr::cli
