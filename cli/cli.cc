#include "cli/cli.h"

#include <iostream>

#include "cli/commands.h"

namespace capsule::cli {

int Main(int argc, char** argv) {
  CLI::App app{"capsule: failure capsules for ML training — record, verify, inspect, replay"};
  app.set_version_flag("--version", std::string("capsule ") + CAPSULE_VERSION);
  app.require_subcommand(1);
  RunFn run;
  SetupKeygenCommand(app, &run);
  SetupInspectCommand(app, &run);
  SetupVerifyCommand(app, &run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints help/version with exit code 0 and usage errors with non-zero; usage errors are
    // our exit status 2.
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitError;
  }
  if (!run) return kExitError;
  return run();
}

}  // namespace capsule::cli
