// Subcommand registry of the `dcr` CLI. Each subcommand lives in its own file under core/cli/ and
// registers itself with DCR_REGISTER_COMMAND; dcr_main.cc builds the CLI11 app from the registry.
// dcr-node (core/cli/node/) shares the exit codes and the error line.
//
// Exit codes (documented in `dcr --help`): 0 success; 1 a check failed (e.g. `dcr verify` found a
// difference); 2 usage error; 10 + StatusCode for errors (11 invalid argument, 12 not found,
// 13 data loss / corrupt input, 14 failed precondition such as a wrong base, 15 unavailable peer,
// 16 deadline exceeded, 17 unimplemented, 18 internal, 19 resource exhausted, 20 aborted).
#ifndef DCR_CORE_CLI_COMMAND_H_
#define DCR_CORE_CLI_COMMAND_H_

#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <string>

#include "dcr/status.h"

namespace dcr::cli {

// Configures options on `app` (the subcommand) and returns the action to run once parsed.
using CommandSetup = std::function<std::function<int()>(CLI::App* app)>;

struct CommandSpec {
  std::string name;
  std::string help;
  CommandSetup setup;
};

bool RegisterCommand(CommandSpec spec);

inline int ExitCodeFor(const Status& s) { return s.ok() ? 0 : 10 + static_cast<int>(s.code()); }
// Prints "dcr <cmd>: <status>" to stderr and returns the exit code for `status` (0 if OK).
inline int ReportStatus(const std::string& command, const Status& status) {
  if (status.ok()) return 0;
  std::fprintf(stderr, "dcr %s: %s\n", command.c_str(), status.ToString().c_str());
  return ExitCodeFor(status);
}

}  // namespace dcr::cli

#define DCR_CLI_CONCAT_INNER_(a, b) a##b
#define DCR_CLI_CONCAT_(a, b) DCR_CLI_CONCAT_INNER_(a, b)
// DCR_REGISTER_COMMAND("name", "help", setup-lambda): variadic so the lambda may contain commas.
#define DCR_REGISTER_COMMAND(name, help, ...)                        \
  static const bool DCR_CLI_CONCAT_(dcr_cli_registered_, __LINE__) = \
      ::dcr::cli::RegisterCommand(::dcr::cli::CommandSpec{name, help, __VA_ARGS__})

#endif  // DCR_CORE_CLI_COMMAND_H_
