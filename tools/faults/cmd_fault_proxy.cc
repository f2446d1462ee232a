// dcr fault-proxy --spec FILE: the fault proxy of one relay-tree edge (fault_proxy.h), started by
// `dcr run` for the faults block's proxy runs.
#include <fstream>
#include <sstream>

#include "command.h"
#include "fault_proxy.h"

namespace dcr::cli {
namespace {

int RunFaultProxyCommand(const std::string& spec_path) {
  std::ifstream in(spec_path);
  if (!in) return ReportStatus("fault-proxy", NotFoundError("spec " + spec_path + ": cannot open"));
  std::stringstream ss;
  ss << in.rdbuf();
  StatusOr<FaultProxySpec> spec = FaultProxySpecFromJson(ss.str());
  if (!spec.ok()) return ReportStatus("fault-proxy", spec.status().WithContext(spec_path));
  return ReportStatus("fault-proxy", RunFaultProxy(*spec));
}

}  // namespace

DCR_REGISTER_COMMAND(
    "fault-proxy",
    "Serve one relay-tree edge as a faulty middle box (started by `dcr run` for "
    "faults.proxy_runs): "
    "forwards the wire frames between parent and child, TLS terminated with the run's "
    "certificates, and injects the spec's frame faults",
    [](CLI::App* app) {
      auto spec = std::make_shared<std::string>();
      app->add_option("--spec", *spec, "the proxy's spec (JSON, written by dcr run)")->required();
      return [spec]() { return RunFaultProxyCommand(*spec); };
    });

}  // namespace dcr::cli
