#include "capsule/cli/minimize_command.h"

// capsule minimize FILE -o SMALL --key KEY: the smallest batch that still fails alike
// (replay/minimize.h), signed and written.
#include <unistd.h>

#include <iostream>
#include <memory>

#include "capsule/base/internal/printable.h"
#include "capsule/base/internal/printable_line.h"
#include "capsule/cli/cli.h"
#include "capsule/cli/common.h"
#include "capsule/cli/printable_stream.h"
#include "capsule/format/capsule_reader.h"
#include "capsule/format/capsule_writer.h"
#include "capsule/format/signing.h"
#include "capsule/proto/capsule.pb.h"
#include "capsule/replay/minimize.h"

namespace capsule::cli {

void SetupMinimizeCommand(CLI::App& app, RunFn* run, ModelRegistry* registry) {
  auto options = std::make_shared<MinimizeCliOptions>();
  CLI::App* cmd = app.add_subcommand("minimize", kMinimizeDescription);
  cmd->add_option("file", options->file, "Capsule file (with all weights embedded)")->required();
  cmd->add_option("--key", options->key, "Private key (PEM, mode 0600) to sign the result with")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("-o,--out", options->out, "Output capsule file")->required();
  AddForceOption(cmd, &options->force);
  AddPluginOption(cmd, &options->plugins);
  AddTrustOptions(cmd, &options->trust, CapsuleUse::kAct);
  cmd->add_option("--max-replays", options->max_replays, "Stop the search after this many replays")
      ->check(CLI::Range(2, 10000));
  cmd->callback([options, run, registry] {
    *run = [options, registry] { return RunMinimizeCommand(*options, *registry); };
  });
}

int RunMinimizeCommand(const MinimizeCliOptions& o, ModelRegistry& registry) {
  int rc = kExitError;
  std::optional<CommandInput> input =
      OpenCommandInput({o.file, o.trust, o.key, PluginModels(o.plugins, registry)}, &rc);
  if (!input) return rc;
  const LoadedCapsule* loaded = &input->capsule;
  MinimizeOptions options;
  options.max_replays = o.max_replays;
  options.replay.capsule_path = o.file;
  options.progress = ProgressLine("minimize");  // null unless standard error is a terminal
  auto result = MinimizeCapsule(*loaded->decoded.capsule, registry, options);
  if (options.progress) ClearProgressLine();
  if (!result.ok()) {
    PrintError(result.status(),
               RerunRemedy(result.status(), RerunFactsOf(*loaded->decoded.capsule, registry)));
    return kExitError;
  }
  auto bytes =
      EncodeDerived(*loaded, "minimize", *input->key, /*optional_flags=*/0, &*result->capsule);
  if (!bytes.ok()) {
    PrintError(bytes.status());
    return kExitError;
  }
  if (!WriteOutputFile(o.file, o.out, *bytes, o.force)) return kExitError;
  std::cout << "minimized: " << result->sequences_before << " -> " << result->sequences_after
            << " sequences, " << result->length_before << " -> " << result->length_after
            << " positions, " << loaded->bytes.size() << " -> " << bytes->size() << " bytes, in "
            << result->replays << " replays (at most " << o.max_replays << ")\n";
  // The verdict and what the failure needs name the capsule's layers.
  PrintableLine(std::cout) << "verdict kept: " << result->verdict;
  for (const std::string& n : result->needs) PrintableLine(std::cout) << "needs: " << n;
  std::cout << "wrote " << Printable(o.out) << "\n";
  return kExitOk;
}

}  // namespace capsule::cli
