// capsule triage: reads every rank's capsules of one data-parallel run.
// Internal to the CLI.
#ifndef CAPSULE_CLI_TRIAGE_COMMAND_H_
#define CAPSULE_CLI_TRIAGE_COMMAND_H_

#include <string>
#include <vector>

#include "capsule/cli/command.h"

namespace capsule::cli {

inline constexpr const char kTriageDescription[] =
    "Read every rank's capsules of one data-parallel run: which rank went bad first, who hung "
    "the run, desynced replicas, a gradient reduction that summed";

struct TriageCliOptions {
  std::string dir;
  std::string run_id;  // empty: the only run in DIR
  TrustOptions trust;
  bool json = false;
};
void SetupTriageCommand(CLI::App& app, RunFn* run);
int RunTriageCommand(const TriageCliOptions& options);

}  // namespace capsule::cli

#endif  // CAPSULE_CLI_TRIAGE_COMMAND_H_
