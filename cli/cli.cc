#include "capsule/cli/cli.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <iostream>

#include "capsule/cli/command.h"
#include "capsule/cli/common.h"
#include "capsule/cli/diff_command.h"
#include "capsule/cli/extract_command.h"
#include "capsule/cli/gate_command.h"
#include "capsule/cli/inspect_command.h"
#include "capsule/cli/keygen_command.h"
#include "capsule/cli/minimize_command.h"
#include "capsule/cli/printable_stream.h"
#include "capsule/cli/redact_command.h"
#include "capsule/cli/replay_command.h"
#include "capsule/cli/report_command.h"
#include "capsule/cli/stress_command.h"
#include "capsule/cli/triage_command.h"
#include "capsule/cli/verify_command.h"
#include "capsule/format/version.h"
#ifdef CAPSULE_WITH_TORCH
#include "capsule/replay/model_registry.h"
#endif
#ifdef CAPSULE_CLI_FRONT
#include "capsule/cli/torch_forward.h"
#endif

namespace capsule::cli {
namespace {

// `registry` is null in a build without LibTorch (no replay subcommand).
int RunCommandLine(int argc, char** argv, ModelRegistry* registry) {
#ifdef CAPSULE_CLI_FRONT
  // The LibTorch-free `capsule` hands the commands that run a model to capsule-torch.
  if (argc > 1 && NeedsTorch(argv[1])) return ForwardToTorchCli(argc, argv);
#endif
  CLI::App app{"capsule: failure capsules for ML training — record, verify, inspect, replay"};
  app.name("capsule");  // usage lines say "capsule report", whatever path ran it
  app.set_version_flag("--version", std::string("capsule ") + CapsuleVersion());
  app.require_subcommand(1);
  // --help shows each option's default ("--format TEXT [md]"); subcommands inherit this.
  app.option_defaults()->always_capture_default();
  RunFn run;
  SetupKeygenCommand(app, &run);
  SetupInspectCommand(app, &run);
  SetupVerifyCommand(app, &run);
  SetupReportCommand(app, &run);
  SetupDiffCommand(app, &run);
  SetupTriageCommand(app, &run);
  SetupRedactCommand(app, &run);
#ifdef CAPSULE_WITH_TORCH
  SetupReplayCommand(app, &run, registry);
  SetupExtractCommand(app, &run, registry);
  SetupGateCommand(app, &run, registry);
  SetupMinimizeCommand(app, &run, registry);
  SetupStressCommand(app, &run, registry);
#else
  (void)registry;
#endif
#ifdef CAPSULE_CLI_FRONT
  // Listed for --help only: RunCommandLine forwarded them above.
  app.add_subcommand("replay", kReplayDescription);
  app.add_subcommand("extract", kExtractDescription);
  app.add_subcommand("gate", kGateDescription);
  app.add_subcommand("minimize", kMinimizeDescription);
  app.add_subcommand("stress", kStressDescription);
#endif
  // A repeatable option's default is "no value", not "[]"; and it takes one value each time it is
  // given (--pubkey A --pubkey B), so that `--pubkey K FILE` leaves FILE the positional it reads
  // as instead of a second key.
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    for (CLI::Option* opt : sub->get_options()) {
      if (opt->get_default_str() == "[]") opt->default_str("");
      if (!opt->get_positional() && opt->get_items_expected_max() > 1) {
        opt->allow_extra_args(false);
      }
    }
  }
  // CLI11 would answer "A subcommand is required" without naming what it did not know.
  if (argc > 1 && argv[1][0] != '-') {
    const std::string name = argv[1];
    bool found = false;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      found |= sub->get_name() == name;
    }
    if (!found) {
      PrintError(InvalidArgumentError("unknown command '" + name + "'"),
                 "capsule --help lists the commands");
      return kExitError;
    }
  }
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

// Set while a command runs. Exit status 1 says "a finding"; a library that ends the process
// itself in the middle of a command (OpenMP calls exit(1) when it cannot start the threads it
// was asked for) must not be read as one, so such an exit becomes exit status 2 with a reason.
std::atomic<bool> g_command_running{false};

void ExitDuringCommand() {
  if (!g_command_running.load()) return;
  static const char kMessage[] =
      "capsule: a library ended the process before the command finished (see the message above, "
      "if any); nothing was judged\n";
  std::cerr.flush();
  (void)!::write(2, kMessage, sizeof kMessage - 1);
  ::_exit(kExitError);
}

// Runs the command with ExitDuringCommand armed.
int GuardedCommandLine(int argc, char** argv, ModelRegistry* registry) {
  static const bool registered = std::atexit(ExitDuringCommand) == 0;
  (void)registered;
  g_command_running = true;
  const int rc = RunCommandLine(argc, argv, registry);
  g_command_running = false;
  return rc;
}

int MainImpl(int argc, char** argv, ModelRegistry* registry, const Invocation& invocation) {
  SetInvocation(invocation);
  PrintableStreams streams;
  const int rc = GuardedCommandLine(argc, argv, registry);
  // A report sent to a full disk or a closed pipe is not a success, whatever the command did.
  const Status written = streams.Finish();
  if (!written.ok()) {
    PrintError(written);
    return kExitError;
  }
  return rc;
}

}  // namespace

int Main(int argc, char** argv, ModelRegistry& registry) {
  return MainImpl(argc, argv, &registry, Invocation{});
}

int Main(int argc, char** argv, ModelRegistry& registry, const Invocation& invocation) {
  return MainImpl(argc, argv, &registry, invocation);
}

int Main(int argc, char** argv) {
#ifdef CAPSULE_WITH_TORCH
  ModelRegistry registry;
  return MainImpl(argc, argv, &registry, Invocation{});
#else
  return MainImpl(argc, argv, nullptr, Invocation{});
#endif
}

}  // namespace capsule::cli
