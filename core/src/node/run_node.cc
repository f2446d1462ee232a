// RunNode and MakeNodePolicy (dcr/node.h): a node runs one SocketNode per version.

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <memory>

#include "dcr/delta.h"
#include "dcr/node.h"
#include "dcr/receiver.h"
#include "dcr/recovery_policy.h"
#include "dcr/relay_policy.h"
#include "dcr/status.h"
#include "dcr/status_macros.h"
#include "dcr/statusor.h"
#include "node/fault_points.h"
#include "node/metrics.h"
#include "node/socket_node.h"
#include "node/versions.h"

namespace dcr {
StatusOr<std::unique_ptr<NodePolicy>> MakeNodePolicy(const NodePlan& plan) {
  if (plan.transport == "object_store") {
    return plan.rank == 0 ? MakeUploaderPolicy(plan.relay) : MakeDownloaderPolicy(plan.relay);
  }
  if (plan.transport != "relay_tree") {
    return InvalidArgumentError("plan.transport: unknown '" + plan.transport + "'");
  }
  DCR_ASSIGN_OR_RETURN(Topology topo, Topology::FromParents(plan.parents));
  if (plan.rank < 0 || plan.rank >= topo.size()) {
    return InvalidArgumentError("plan.rank " + std::to_string(plan.rank) + " outside the topology");
  }
  RelayOptions relay = plan.relay;
  // The sender watches its edge relays for lag when the long link carries the context form.
  if (plan.rank == 0 && plan.method == "delta" && plan.context_coding &&
      !plan.edge_relays.empty() && plan.edge_lag_bytes > 0) {
    relay.edge_relays.assign(plan.edge_relays.begin(), plan.edge_relays.end());
    relay.edge_lag_bytes = plan.edge_lag_bytes;
  }
  return MakeTreePolicy(topo, plan.rank, relay);
}

std::unique_ptr<NodePolicy> MakeFillStorePolicy(const NodePlan& plan) {
  RelayOptions relay = plan.relay;
  relay.store_plain = !plan.edge_relays.empty() && plan.method == "delta";
  return MakeUploaderPolicy(relay);
}

namespace internal {

Status RunNodeVersion(const NodePlan& plan, NodeResult* result, ReceiverStack* storage) {
  *result = NodeResult();
  Status s;
  {
    SocketNode node(plan, result, storage);
    s = node.Run();
  }
  Status w = WriteResultFile(plan.result_path, *result);
  if (s.ok() && !w.ok()) s = w;
  return s;
}

}  // namespace internal

Status RunNode(const NodePlan& plan, NodeResult* result) {
  if (PlanAsksForFaults(plan) && internal::InstalledFaultPoints() == nullptr) {
    const Status refused = FailedPreconditionError(
        "node " + std::to_string(plan.rank) +
        ": the plan asks for fault points (fault_kill_chunk " +
        std::to_string(plan.fault_kill_chunk) + ", fault_kill_blob " +
        std::to_string(plan.fault_kill_blob) + ", fault_kill_log_step '" +
        plan.fault_kill_log_step +
        "'), which this dcr-node does not carry: run it with dcr-node-faults, the test build of "
        "the node");
    *result = NodeResult();
    result->rank = plan.rank;
    result->error = refused.ToString();
    return refused;
  }
  // One endpoint for the life of the process, whichever version runs (MetricsBoard).
  internal::MetricsServer metrics;
  if (!plan.metrics_address.empty()) {
    Status m = metrics.Start(plan.metrics_address,
                             [] { return internal::MetricsBoard::Process().Snapshot(); });
    if (!m.ok()) {
      *result = NodeResult();
      result->rank = plan.rank;
      result->error = m.WithContext("node " + std::to_string(plan.rank)).ToString();
      return m.WithContext("node " + std::to_string(plan.rank));
    }
  }
  if (!plan.versions.empty()) return internal::RunNodeVersions(plan, result);
  *result = NodeResult();
  Status s;
  {
    internal::SocketNode node(plan, result);
    s = node.Run();
  }
  Status w = internal::WriteResultFile(plan.result_path, *result);
  if (s.ok() && !w.ok()) s = w;
  return s;
}

int RankFromEnvironment() {
  // RANK first: a launcher started inside a Slurm or MPI allocation (torchrun under srun) sets it
  // per process, where SLURM_PROCID names the launcher's own task.
  for (const char* v : {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}) {
    const char* s = std::getenv(v);
    if (s != nullptr && *s != '\0') {
      char* end = nullptr;
      errno = 0;
      const long r = std::strtol(s, &end, 10);
      if (*end == '\0' && errno == 0 && r >= 0 && r <= INT_MAX) return static_cast<int>(r);
    }
  }
  return -1;
}

}  // namespace dcr
