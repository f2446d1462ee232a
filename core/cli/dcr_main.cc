// The `dcr` command-line tool: one binary, one subcommand per file in core/cli/.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <vector>

#include "command.h"

namespace dcr::cli {
namespace {
std::vector<CommandSpec>& Registry() {
  static std::vector<CommandSpec> registry;
  return registry;
}
}  // namespace

bool RegisterCommand(CommandSpec spec) {
  Registry().push_back(std::move(spec));
  return true;
}

}  // namespace dcr::cli

int main(int argc, char** argv) {
  CLI::App app{"dcr: bit-exact delta-compressed refit of model checkpoints"};
  app.require_subcommand(1);
  app.footer(
      "Exit codes: 0 success; 1 a check failed (verify found a difference); 2 usage error;\n"
      "10+code for errors: 11 invalid argument, 12 not found, 13 data loss (corrupt input),\n"
      "14 failed precondition (e.g. delta for another base), 15 unavailable (peer/transport),\n"
      "16 deadline exceeded, 17 unimplemented, 18 internal, 19 resource exhausted, 20 aborted.");
  auto& registry = dcr::cli::Registry();
  std::sort(registry.begin(), registry.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  std::function<int()> action;
  for (auto& spec : registry) {
    CLI::App* sub = app.add_subcommand(spec.name, spec.help);
    auto run = spec.setup(sub);
    sub->callback([&action, run]() { action = run; });
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (!action) return 2;
  try {
    return action();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dcr: internal error: %s\n", e.what());
    return 18;
  }
}
