// dcr node ARGS: runs the dcr-node binary beside this one with the same arguments. The node
// process is dcr-node (core/cli/node/), which links the product libraries only; `dcr` itself also
// carries the fixtures behind synth, bench, train-delta and run's synthesis and fault runs.
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "node/node_exe.h"

namespace dcr::cli {
namespace {

int ExecNode(const std::vector<std::string>& args) {
  StatusOr<std::string> exe = NodeExe();
  if (!exe.ok()) return ReportStatus("node", exe.status());
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(exe->c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execv(exe->c_str(), argv.data());
  return ReportStatus("node", ErrnoError("exec " + *exe, errno));
}

}  // namespace

DCR_REGISTER_COMMAND(
    "node",
    "Run one node of a refit (started by `dcr run`, or one per host with --rank / RANK / "
    "SLURM_PROCID / OMPI_COMM_WORLD_RANK for multi-host runs); `dcr node --help` lists its "
    "options",
    [](CLI::App* app) {
      // Every argument goes to dcr-node unparsed, --help included.
      app->prefix_command();
      app->allow_extras();
      app->set_help_flag();
      return [app]() { return ExecNode(app->remaining()); };
    });

}  // namespace dcr::cli
