// dcr s3-fault-proxy --spec FILE: the HTTP fault proxy in front of an S3 endpoint
// (s3_fault_proxy.h), started by `dcr run` for the faults block's S3 runs.
#include <fstream>
#include <sstream>

#include "command.h"
#include "s3_fault_proxy.h"

namespace dcr::cli {
namespace {

int RunS3FaultProxyCommand(const std::string& spec_path) {
  std::ifstream in(spec_path);
  if (!in) {
    return ReportStatus("s3-fault-proxy", NotFoundError("spec " + spec_path + ": cannot open"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  StatusOr<S3FaultProxySpec> spec = S3FaultProxySpecFromJson(ss.str());
  if (!spec.ok()) return ReportStatus("s3-fault-proxy", spec.status().WithContext(spec_path));
  return ReportStatus("s3-fault-proxy", RunS3FaultProxy(*spec));
}

}  // namespace

DCR_REGISTER_COMMAND(
    "s3-fault-proxy",
    "Serve as a faulty HTTP middle box in front of an S3 endpoint (started by `dcr run` for "
    "faults.s3_runs): forwards each request and injects the spec's HTTP faults (5xx, cut, "
    "stall, truncate, bad_etag) into uploads and downloads",
    [](CLI::App* app) {
      auto spec = std::make_shared<std::string>();
      app->add_option("--spec", *spec, "the proxy's spec (JSON, written by dcr run)")->required();
      return [spec]() { return RunS3FaultProxyCommand(*spec); };
    });

}  // namespace dcr::cli
